"""The model's config as the optimizer leaves it: the new `variants` list planned around the
user's own entries, rendered into the TOML (comments kept, via tomlkit) or YAML file, validated,
and staged to be written atomically."""

from __future__ import annotations

import os
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomlkit
import yaml
from tomlkit.items import AoT, Comment, Table, Whitespace

from duetime.config import VariantConfig, find_config_file, parse_model_config, read_config_file
from duetime.errors import ConfigError
from duetime.tools.optimize.measure import ranking_keys
from duetime.tools.optimize.options import KINDS
from duetime.tools.optimize.report import VariantResult


def _entry(result: VariantResult) -> VariantConfig:
    return VariantConfig(
        name=result.kind, file=result.file, kind=result.kind, quality=result.quality,
        speed=result.speed,
    )  # fmt: skip


def plan_variants(
    existing: Sequence[VariantConfig],
    replaced: set[str],
    new: Sequence[VariantConfig],
    by_argmax: bool = True,
) -> list[int | VariantConfig]:
    """The new `variants` list: an int keeps that entry of `existing` as it is written.

    Entries of the `replaced` kinds go; the optimizer's kinds (new and kept) are sorted best
    first (`ranking_keys`, `by_argmax`) and take the place of the first such entry, or the
    front; other entries (kind "model") keep their order around them.
    """
    ours = set(KINDS)
    kept = [i for i, v in enumerate(existing) if v.kind not in replaced]
    block: list[int | VariantConfig] = [i for i in kept if existing[i].kind in ours]
    block += list(new)
    qualities = [existing[e].quality if isinstance(e, int) else e.quality for e in block]
    keys = ranking_keys(qualities, by_argmax)
    block = [e for _, e in sorted(zip(keys, block, strict=True), key=lambda pair: pair[0])]
    at = next((i for i, v in enumerate(existing) if v.kind in ours), -1)
    before: list[int | VariantConfig] = [i for i in kept if existing[i].kind not in ours and i < at]
    after: list[int | VariantConfig] = [i for i in kept if existing[i].kind not in ours and i > at]
    return before + block + after


def config_file(model_dir: Path) -> Path:
    """The config file the optimizer will write; ConfigError for Triton's config.pbtxt, which it
    does not write."""
    found = find_config_file(model_dir)
    if found is not None and found.suffix == ".pbtxt":
        raise ConfigError(
            f"{found}: the optimizer records variants in duetime's config.toml; move this "
            "model's settings from Triton's config.pbtxt to config.toml first"
        )
    return found or model_dir / "config.toml"


def _trimmed(item: Any) -> Any:
    """A kept `[[variants]]` table without the blank lines that ended it in the file.

    NOTE: tomlkit parses the blank line before the next table into this one's body, and the
    array of tables it is appended to adds its own: each rerun grew the file by a blank line
    per kept entry."""
    if isinstance(item, tomlkit.items.Table):
        body = item.value.body
        while body and body[-1][0] is None and isinstance(body[-1][1], tomlkit.items.Whitespace):
            body.pop()
    return item


Lead = list[Any]
"""The comment lines (tomlkit `Comment` items) right above a `[[variants]]` header; after the
last entry, with the blank lines among and after them (`Whitespace` items)."""


def _innermost(body: list[tuple[Any, Any]], end: int) -> tuple[list[tuple[Any, Any]], int]:
    """The body, and the place in it, that the text right before `body[end]` belongs to:
    `body` itself, or the end of the table just before that place (of the last table of an
    array of tables), and so on in."""
    while end and body[end - 1][0] is not None and isinstance(body[end - 1][1], Table | AoT):
        last = body[end - 1][1]
        body = (last[-1] if isinstance(last, AoT) else last).value.body
        end = len(body)
    return body, end


def _take(body: list[tuple[Any, Any]], end: int, kinds: tuple[type, ...] = (Comment,)) -> Lead:
    """Take the run of items of `kinds` (comment lines) that ends right before `body[end]` out
    of `body`."""
    start = end
    while start and body[start - 1][0] is None and isinstance(body[start - 1][1], kinds):
        start -= 1
    run = [item for _, item in body[start:end]]
    # (blanked, not removed, before a key: the body's index of its keys counts their places)
    body[start:end] = [(None, Whitespace("")) for _ in run] if end < len(body) else []
    return run


def _detach_leads(doc: Any, tables: Any) -> list[Lead]:
    """The comment lines right above each of the `tables` (`doc`'s `[[variants]]`), and last
    those that follow the last one (with the blank lines), taken out of the places tomlkit
    parsed them into; none where `tables` is not an item of `doc`'s own body.

    NOTE: tomlkit parses the comments that introduce an entry into what comes before its header
    (the document's body or the table above, for the first; the entry before, for the others),
    so they stayed in place as the entries moved: a user's "# my own smaller net" above their
    own entry ended up heading the optimizer's one, put in front of it (found by a tester)."""
    at = next((i for i, (_, item) in enumerate(doc.body) if item is tables), None)
    if at is None:
        return [[] for _ in range(len(tables) + 1)]
    leads = [_take(*_innermost(doc.body, at))]
    leads += [_take(*_innermost(t.value.body, len(t.value.body))) for t in tables[:-1]]
    rest, end = _innermost(tables[-1].value.body, len(tables[-1].value.body))
    return [*leads, _take(rest, end, (Comment, Whitespace))]


def _new_entry(entry: VariantConfig, inline: bool) -> Any:
    table: Any = tomlkit.inline_table() if inline else tomlkit.table()
    for key, value in entry.model_dump(exclude_none=True).items():
        if isinstance(value, dict):
            sub = tomlkit.inline_table()
            sub.update(value)
            value = sub
        table[key] = value
    return table


def _render_toml(text: str, plan: list[int | VariantConfig]) -> str:
    doc = tomlkit.parse(text)
    old = doc.get("variants")
    items = list(old) if old is not None else []
    inline = isinstance(old, tomlkit.items.Array)
    container: Any = tomlkit.array() if inline else tomlkit.aot()
    if inline:
        container.multiline(True)
    leads: list[Lead] = [[] for _ in range(len(items) + 1)]
    if plan and isinstance(old, tomlkit.items.AoT):
        leads = _detach_leads(doc, old)
    # An entry the optimizer replaces (its kind, measured again) keeps the lines above it; those
    # above one it drops go with it.
    named = {str(table.get("name")): i for i, table in enumerate(items)}
    for entry in plan:
        if isinstance(entry, int):
            table, lead = _trimmed(items[entry]), leads[entry]
        else:
            replaced = named.get(entry.name)
            table, lead = _new_entry(entry, inline), [] if replaced is None else leads[replaced]
        if lead:
            # (the "\n": AoT.append puts the blank line between entries only before a header
            # with no line break in its indent, and the comment lines end in one)
            above = "".join(line.as_string() for line in lead)
            table.trivia.indent = ("\n" if len(container) else "") + above + table.trivia.indent
        container.append(table)
    for line in leads[-1] if len(container) else []:
        container[-1].value.append(None, line)
    if plan:
        doc["variants"] = container
    elif "variants" in doc:
        del doc["variants"]
    return tomlkit.dumps(doc)


def _render_yaml(data: dict[str, Any], plan: list[int | VariantConfig]) -> str:
    old = data.get("variants") or []
    entries = [old[e] if isinstance(e, int) else e.model_dump(exclude_none=True) for e in plan]
    data = dict(data)  # "variants" keeps its place among the keys
    if entries:
        data["variants"] = entries
    else:
        data.pop("variants", None)
    text: str = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return text


def update_config(
    model_dir: Path, results: Sequence[VariantResult], by_argmax: bool = True
) -> tuple[Path, str] | None:
    """Rewrite the `variants` of the model's config for the kinds measured in `results`, ranked
    `by_argmax` (see `ranking_keys`).

    Returns the path and the new text, validated but not yet written (see `stage`); None when
    the variants stay as they are listed (none kept, and none listed to remove or re-rank).

    NOTE: None rather than the same text: a config created with nothing in it (a folder with no
    config file, every kind dropped) was reported as "updated", and a server polling the
    repository reloaded the model for it (found by a tester); a YAML config rewritten to the
    same variants lost its comments.
    """
    path = config_file(model_dir)
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    data = read_config_file(path) if text else {}
    existing = parse_model_config(data, source=str(path), model_name=model_dir.name).variants
    replaced: set[str] = {r.kind for r in results if r.status != "failed"}
    new = [_entry(r) for r in results if r.status == "kept"]
    plan = plan_variants(existing, replaced, new, by_argmax)
    if plan == list(range(len(existing))):
        return None
    if path.suffix == ".toml":
        new_text = _render_toml(text, plan)
        check = tomllib.loads(new_text)
    else:
        new_text = _render_yaml(data, plan)
        check = yaml.safe_load(new_text) or {}
    parse_model_config(
        check, source=f"{path} (as optimize would write it)", model_name=model_dir.name
    )
    return path, new_text


def stage(path: Path, data: bytes) -> Path:
    """`data` in a hidden temp file beside `path`, with `path`'s mode, for `os.replace` onto it
    (readers then see the old file or the new one). Raises OSError where the folder is not
    writable: before anything else has changed, when staged first."""
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temp, mode)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return Path(temp)
