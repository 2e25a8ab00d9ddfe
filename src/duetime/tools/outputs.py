"""The files the tools write (--json, --record, --report, --out): checked before a run, so a bad
path costs nothing but a one-line error, and written with a one-line error if that still fails
(a full disk, /proc) instead of a traceback after the whole run."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from duetime.errors import ConfigError


class OutputError(Exception):
    """An output file could not be written; `message` names the flag and the file."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def check_output(
    path: Path | None, flag: str, *, new: bool = False, reads: Iterable[Path | None] = ()
) -> None:
    """ConfigError naming `flag` unless `path` can be written: not a directory, not one of the
    files the command `reads` (nor a link to one), and its closest existing folder writable
    (missing folders are created when writing). `new`: the file must not exist yet (a capture
    is never overwritten). Nothing to check for None.

    NOTE: `itch run FILE --predictions FILE` emptied its input before reading it (and exited
    0, having read nothing); `--json FILE` replaced it with the report (found by a tester)."""
    if path is None:
        return
    try:
        _check_output(path, flag, new, reads)
    except OSError as exc:  # (a name too long, a loop of links: pathlib's questions raise)
        raise ConfigError(f"{flag} {path}: {exc.strerror or exc}") from None


def _check_output(path: Path, flag: str, new: bool, reads: Iterable[Path | None]) -> None:
    if str(path) == "-":  # (a file named '-' was written: a tester took it for stdout)
        raise ConfigError(
            f"{flag} -: standard output is not taken here (the table goes there); give a "
            "file name (./- for a file of that name)"
        )
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; give a file name")
    for read in reads:
        if read is not None and _same_file(path, read):
            raise ConfigError(
                f"{flag} {path}: is the file read ({read}), which writing it would destroy; "
                "give another file name"
            )
    if new and (path.exists() or path.is_symlink()):
        raise ConfigError(f"{flag} {path}: exists, and a capture is never overwritten")
    folder = path.parent
    while not folder.exists():
        if folder.is_symlink() or folder == folder.parent:
            break
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: cannot write in {folder}")


def check_apart(path: Path | None, flag: str, other: Path | None, other_flag: str) -> None:
    """ConfigError unless the outputs `path` and `other` are two files (or a device, such as
    /dev/null, that takes both). Nothing to check where either is None."""
    if path is None or other is None:
        return
    if path.resolve() == other.resolve() and (other.is_file() or not other.exists()):
        raise ConfigError(
            f"{flag} {path}: is the {other_flag} file too; give each its own file name"
        )


def _same_file(path: Path, other: Path) -> bool:
    """Whether `path` is the regular file `other` (a device such as /dev/null, or a pipe, may
    well be read and written at once)."""
    try:
        return other.is_file() and path.samefile(other)
    except OSError:  # (one does not exist: not the same file)
        return False


def make_parents(path: Path, flag: str) -> None:
    """Create the missing folders of `path`; OutputError naming `flag` if they cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{flag} {path}: cannot create its folder: {_reason(exc)}") from None


def write_output(path: Path, text: str, flag: str) -> None:
    """Write `text` to `path` (folders created); OutputError naming `flag` if it fails."""
    make_parents(path, flag)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"{flag} {path}: cannot write it: {_reason(exc)}") from None


def failed_write(path: Path, flag: str, exc: OSError) -> OutputError:
    """The OutputError for `exc`, raised writing `path` (given by `flag`) some other way."""
    return OutputError(f"{flag} {path}: cannot write it: {_reason(exc)}")


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def strict_json(doc: Any) -> str:
    """`doc` as standard JSON (RFC 8259), indented: a float that is not finite (inf, NaN) is
    written null.

    NOTE: json.dumps writes them as Infinity and NaN, which no strict parser reads (node's
    JSON.parse, Go, serde): `replay --compare-outputs` wrote "max_abs_error": Infinity for an
    answer of another shape, and the whole result file did not parse."""
    return json.dumps(_finite(doc), indent=2, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
