"""The on-disk format: `<repo>/<model>/config.toml` and `<repo>/<model>/<version>/model.onnx`
(or Triton's `<version>/model.onnx/model.onnx`, a folder holding the model and its external
data)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from duetime.errors import ConfigError

MODEL_FILENAME = "model.onnx"


@dataclass(frozen=True, slots=True)
class ModelSource:
    """One model folder: its name and the model file of each integer version found."""

    name: str
    directory: Path
    versions: dict[int, Path]
    """The model file of each version: `<version>/model.onnx`, or `<version>/model.onnx/model.onnx`
    (see `model_file`)."""
    ignored: tuple[str, ...] = ()
    """The folders that hold the model file but are no version, and the version folders that
    hold none, each said with why (`folder 003/ holds a model.onnx but is not served: not a
    version: ...`, `folder 2/ is not served: 2/: holds no model.onnx`): warned of (see
    `ignored_warning`)."""

    @property
    def latest(self) -> int:
        return max(self.versions)


@dataclass(frozen=True, slots=True)
class Scan:
    """What a repository holds: the models found, and why other folders are not models."""

    models: list[ModelSource]
    errors: dict[str, str]


def model_file(version: Path, filename: str = MODEL_FILENAME) -> Path | None:
    """The model file of the version folder `version`: its `filename` (the config's
    `default_model_filename`, as Triton's), or, where that is a folder, the `model.onnx` in it
    (Triton's layout for a model with external data: the onnxruntime backend loads
    `<dir>/model.onnx` of a model path that is a folder); None when it holds neither.

    NOTE: that layout was refused ("1/model.onnx: a folder, not a file") though a Triton ONNX
    repository is to serve as it is. ORT reads the external data relative to the model file,
    so from that folder, and refuses a location that leaves it.

    NOTE: a version folder the server may not read (its mode) gives `<version>/<filename>`: its
    load fails on it, and says why, as for an unreadable model file. `is_file` raised the
    PermissionError, which ended every poll of the model with a traceback and answered an
    explicit load 500 (found by a tester)."""
    path = version / filename
    try:
        if path.is_file():
            return path
        if path.is_dir() and (path / MODEL_FILENAME).is_file():
            return path / MODEL_FILENAME
    except OSError:
        return path
    return None


def version_folder(model: Path, filename: str = MODEL_FILENAME) -> Path:
    """The version folder of a model file `model_file(..., filename)` gave (or a variant's
    file beside it)."""
    inside = model.name == MODEL_FILENAME and model.parent.name == filename
    return model.parent.parent if inside else model.parent


def is_hidden(name: str) -> bool:
    """Whether a folder directly under the repository is left alone: hidden ones (`.git`, a copy
    in progress `.tmp-m`) are never models.

    NOTE: names starting with `_` are models, as in Triton (`_preprocess`); they used to be
    skipped too, though nothing of the server's own lives in the repository under such a name
    (uploads go to a temporary directory, the ORT cache is `<version>/.duetime-cache`)."""
    return name.startswith(".")


def model_folders(root: Path) -> list[Path]:
    """The folders directly under `root` that hold (or should hold) a model, sorted by name;
    not those whose name is no model name (see `misnamed_folders`)."""
    return sorted(
        p for p in root.iterdir() if p.is_dir() and not is_hidden(p.name) and _is_utf8(p.name)
    )


def misnamed_folders(root: Path) -> dict[str, str]:
    """The folders directly under `root` whose name is not UTF-8, so names no model: its name
    as it can be shown (undecodable bytes as `\\xff`) -> why it is refused.

    NOTE: an archive made on another system can leave such a name (`bad\\xffname`, Latin-1):
    Python reads it with lone surrogates, which no JSON encoder takes: the repository index
    answered 500 for every model, and its load died in ONNX Runtime with a TypeError."""
    refused: dict[str, str] = {}
    for path in root.iterdir():
        if not _is_utf8(path.name) and path.is_dir() and not is_hidden(path.name):
            name = shown_name(path.name)
            refused[name] = (
                f"{root / name}: the folder's name is not valid UTF-8, so it names no model "
                "(model names are Unicode, as requests give them); rename the folder"
            )
    return refused


def broken_link(path: Path) -> str | None:
    """What is wrong with `path` when it is a symbolic link to nothing (its target gone, or
    out of reach): `a symbolic link to /mnt/x, which does not exist`; None otherwise.

    NOTE: such a `model.onnx` was refused as 'the file must be named model.onnx', and such
    a model folder was skipped without a word."""
    try:
        if not path.is_symlink() or path.exists():
            return None
        target = shown_name(os.readlink(path))
    except OSError:
        return None
    return f"a symbolic link to {target}, which does not exist"


def broken_links(root: Path) -> dict[str, str]:
    """The entries directly under `root` that are symbolic links to nothing, as shown ->
    `broken_link`'s words (not hidden ones): each may be a model folder on a mount gone."""
    found: dict[str, str] = {}
    for path in root.iterdir():
        if not is_hidden(path.name) and (broken := broken_link(path)) is not None:
            found[shown_name(path.name)] = broken
    return found


def shown_name(name: str) -> str:
    """A file name as it can be shown and sent in JSON: the bytes that are not UTF-8 written
    as `\\xff`."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _is_utf8(name: str) -> bool:
    """Whether `name` (from the file system: undecodable bytes as lone surrogates) is UTF-8."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def scan_repository(
    root: Path, filename_of: Callable[[Path], str] = lambda _: MODEL_FILENAME
) -> Scan:
    """List the models under `root`; a folder that is not a valid model is reported, not fatal.
    `filename_of`: the model file name a model folder's config gives its versions.

    ConfigError when `root` is no folder, or holds no model but is one (a model's folder, or
    one of its version folders, given in place of the repository)."""
    if not root.exists():
        raise ConfigError(f"model repository {root} does not exist")
    if not root.is_dir():
        raise ConfigError(f"model repository {root} is not a folder")
    models: list[ModelSource] = []
    try:
        errors = misnamed_folders(root)
        folders = model_folders(root)
    except OSError as exc:  # (one it may not read: a traceback, as a bug's)
        raise ConfigError(
            f"model repository {root} cannot be read: {exc.strerror or exc}"
        ) from None
    for directory in folders:
        try:
            models.append(scan_model(directory, filename=filename_of(directory)))
        except ConfigError as exc:
            errors[directory.name] = exc.message
    if not models:
        _refuse_a_model_given_as_repository(root)
    return Scan(models, errors)


def _refuse_a_model_given_as_repository(root: Path) -> None:
    layout = f"a repository holds <model>/<version>/{MODEL_FILENAME}"
    if model_file(root) is not None:
        if folder_version(root.absolute().name) is None:
            # NOTE: "serve the repository two levels up" sent `my_models/model.onnx` to the
            # folder above my_models (/tmp, say), which is no repository either
            raise ConfigError(
                f"model repository {root} holds a {MODEL_FILENAME} directly; {layout}: move "
                f"it to {root / '<model>' / '1' / MODEL_FILENAME} (the folder <model> names "
                "the model)"
            )
        raise ConfigError(
            f"model repository {root} holds a {MODEL_FILENAME}: it looks like a version folder "
            f"of a model; serve the repository two levels up, {root.absolute().parent.parent} "
            f"({layout})"
        )
    versions = [
        p.name
        for p in model_folders(root)
        if folder_version(p.name) is not None and model_file(p) is not None
    ]
    if versions:
        raise ConfigError(
            f"model repository {root} looks like a model folder (its folder '{versions[0]}' "
            f"is a version holding {MODEL_FILENAME}); serve its parent folder, "
            f"{root.absolute().parent} ({layout})"
        )


def no_models_warning(root: Path, scan: Scan) -> str | None:
    """What to warn of when `root` holds no model folder at all: requests would all fail
    ("served models: none") after a start without a word. None when it holds models, or
    folders that fail to be models (each is reported as such)."""
    if scan.models or scan.errors:
        return None
    layout = f"expected <model>/<version>/{MODEL_FILENAME}, such as {root / 'mymodel' / '1'}"
    loose = sorted(p.name for p in root.glob("*.onnx") if p.is_file())
    if loose:
        files = f"file {loose[0]} is" if len(loose) == 1 else f"files {', '.join(loose)} are"
        return (
            f"model repository {root} holds no model: its {files} not in a model folder "
            f"({layout}/{MODEL_FILENAME}); move each to <model>/1/{MODEL_FILENAME}"
        )
    return f"model repository {root} holds no model ({layout}/{MODEL_FILENAME})"


UPLOADED = "the uploaded files ('file:' load parameters)"
"""How an upload's folder is named in its refusals: not by the temporary folder the files were
written to, which the client never named (and which is gone by the time it reads them)."""


def scan_model(
    directory: Path, *, filename: str = MODEL_FILENAME, uploaded: bool = False
) -> ModelSource:
    """The versions of one model folder, each holding the model file `filename`; ConfigError if
    it holds none. `uploaded`: the folder holds a load request's files (named so in the errors,
    and their paths as its `file:` keys).

    A folder holding the model file whose name is no version (`003`, `v1`) is not served, as
    Triton serves none: listed in `ModelSource.ignored`, for the caller to warn of."""
    where, under = (UPLOADED, "file:") if uploaded else (str(directory), f"{directory}/")
    versions: dict[int, Path] = {}
    ignored: list[str] = []
    empty: list[Path] = []
    """Version folders holding no model file: named where some other version serves."""
    try:
        children = sorted(directory.iterdir())
    except OSError as exc:  # (a folder the server may not read: its model's error)
        raise ConfigError(f"{where}: cannot be read: {exc.strerror or exc}") from None
    for child in children:
        if is_hidden(child.name) or not child.is_dir():
            continue
        number = folder_version(child.name)
        if number is not None:  # (names without leading zeros: one folder per number)
            model = model_file(child, filename)
            if model is not None:
                versions[number] = model
            else:
                empty.append(child)
        elif _holds(child, filename) and (why := not_a_version(child.name)) is not None:
            ignored.append(
                f"folder {shown_name(child.name)}/ holds a {shown_name(filename)} but is not "
                f"served: {why}"
            )
    if not versions:
        found = _not_versions(directory, filename)
        shown = "; ".join(found[:_SHOWN_MAX])
        if len(found) > _SHOWN_MAX:
            shown += f"; and {len(found) - _SHOWN_MAX} more"
        named = (
            ""
            if filename == MODEL_FILENAME
            else f" (its config's field 'default_model_filename' names {shown_name(filename)!r})"
        )
        raise ConfigError(
            f"{where}: no version folder holds a {shown_name(filename)}"
            + (f" ({shown})" if shown else "")
            + f"; expected {under}<version>/{shown_name(filename)} with an integer version such "
            + "as 1"
            + named
        )
    # NOTE: Triton counts each such folder a version, whose load fails and says why; duetime
    # serves the others, and said nothing of it: a version 2 copied without its model.onnx, or
    # with it misnamed (`2/net.onnx`), was passed over without a word (found by a tester)
    for child in empty:
        held = "; ".join(_empty_version(child, filename))
        ignored.append(f"folder {shown_name(child.name)}/ is not served: {held}")
    return ModelSource(directory.name, directory, versions, tuple(ignored))


def _holds(folder: Path, filename: str) -> bool:
    """Whether `folder` holds the model file `filename` as `model_file` finds it (not: where
    it cannot be read, a folder of anything but versions, `labels/` say, being no concern)."""
    path = folder / filename
    try:
        return path.is_file() or (path / MODEL_FILENAME).is_file()
    except OSError:
        return False


def ignored_warning(source: ModelSource, *, uploaded: bool = False) -> str:
    """What to warn of (once) for the folders of `source` that hold its model file but are no
    version (`ModelSource.ignored`), and what the index says of the versions served; '' where
    there are none. `uploaded`: as `scan_model`'s."""
    if not source.ignored:
        return ""
    where = UPLOADED if uploaded else str(source.directory)
    # NOTE: every folder named, 200 folders `01`..`0200` made each served version's index
    # reason (and the log line) 31 KB (found by a tester)
    shown = "; ".join(source.ignored[:_SHOWN_MAX])
    more = len(source.ignored) - _SHOWN_MAX
    return f"{where}: {shown}" + (f"; and {more} more such folders" if more > 0 else "")


_SHOWN_MAX = 5
"""The most of what a model folder holds that its refusal names."""


def _not_versions(directory: Path, filename: str) -> list[str]:
    """What in `directory` (a model folder holding no version of model file `filename`) looks
    meant as a version, each with why it is not one: `1/Model.onnx: the file must be named
    model.onnx`.

    NOTE: the refusal said only that no version folder holds a model.onnx, whatever the folder
    held: a version beyond int64 (which `folder_version` drops), `1/model.onnx` a folder,
    `1/Model.onnx`, a Triton user's `1/resnet.onnx`, `v1/`."""
    found: list[str] = []
    wanted = shown_name(filename)
    for child in sorted(directory.iterdir()):
        name = shown_name(child.name)
        if is_hidden(child.name):
            continue
        broken = broken_link(child)
        if broken is not None:  # (a version, or a model file, on a mount that is gone)
            found.append(f"{name}: {broken}")
            continue
        if not child.is_dir():
            if child.suffix.lower() == ".onnx":
                found.append(
                    f"{name}: a model file directly in the model folder; it goes in a version "
                    f"folder, {directory.name}/1/{wanted}"
                )
            continue
        if folder_version(child.name) is None:
            why = not_a_version(child.name)
            # (any other folder, `labels/` say, is no version, as meant: named only where it
            # holds a model; a name of digits is always meant as a version)
            if why is not None and (_onnx_files(child) or _digits(child.name)):
                found.append(f"{name}/: {why}")
        else:
            found += _empty_version(child, filename)
    return found


def _empty_version(child: Path, filename: str) -> list[str]:
    """What the version folder `child` holds in place of its model file `filename`: `1/:
    holds no model.onnx`, `1/Model.onnx: the file must be named model.onnx ...`."""
    name, wanted = shown_name(child.name), shown_name(filename)
    if (broken := broken_link(child / filename)) is not None:
        return [f"{name}/{wanted}: {broken}"]
    if (child / filename).is_dir():
        return [f"{name}/{wanted}: a folder holding no {MODEL_FILENAME} (as Triton's layout, "
                f"{name}/{wanted}/{MODEL_FILENAME}, beside its external data)"]  # fmt: skip
    models = _onnx_files(child)
    if models:
        return [f"{name}/{shown_name(file)}: the file must be named {wanted} (or named by the "
                "config's field 'default_model_filename')" for file in models]  # fmt: skip
    return [f"{name}/: holds no {wanted}"]


def _onnx_files(folder: Path) -> list[str]:
    """The names of the `.onnx` files (any case) in `folder`, sorted."""
    try:
        return sorted(p.name for p in folder.iterdir() if p.suffix.lower() == ".onnx")
    except OSError:
        return []


VERSION_MAX = 2**63 - 1
"""The highest version: versions are int64s, as Triton's."""


def folder_version(name: str) -> int | None:
    """The version a folder named `name` holds (None: it holds none, see `not_a_version`).

    NOTE: as Triton (VersionsToLoad, which logs "ignore version directory '003' which contains
    leading zeros in its directory name"): a name of more than one digit starting with 0 is
    no version. `003` was served as version 3 beside `1` (another model than Triton serves,
    without a word), and `01` beside `1` refused the whole model, which serves in Triton (found
    by a tester). A request's version string "01" still names version 1 (`version_of`)."""
    if _digits(name) and len(name) > 1 and name.startswith("0"):
        return None
    return version_of(name)


def not_a_version(name: str) -> str | None:
    """Why a folder named `name` holds no version (`not a version: ...`); None where it does."""
    if folder_version(name) is not None:
        return None
    if not _digits(name):
        return "not a version: a version folder's name is an integer, such as 1"
    if len(name) > 1 and name.startswith("0"):
        # NOTE: before the length: `000000000000000000000001` was said to be beyond the
        # highest version (found by a tester)
        return (
            "not a version: a version folder's name has no leading zeros (Triton ignores such "
            f"a folder); name it '{int(name)}'"
        )
    return f"beyond the highest version (versions are int64s: at most {VERSION_MAX})"


def _digits(name: str) -> bool:
    """Whether `name` is ASCII digits alone (str.isdigit() alone also takes '²')."""
    return name.isascii() and name.isdigit()


def version_of(name: str) -> int | None:
    """The version a request's version string names, or a number of digits (None: not a
    version: not all ASCII digits, or beyond `VERSION_MAX`); a folder's: `folder_version`.

    NOTE: str.isdigit() alone also accepts digits such as '²' that int() rejects; and a version
    is an int64, as Triton's (int() refuses thousands of digits with an error). A 20-digit
    number above 2**63 - 1 was taken: a request naming one was told "not found" (404) where
    Triton refuses the version string (400), and a folder so named served a version no client
    could name in Triton's int64 fields."""
    if not (_digits(name) and len(name) <= 20):
        return None
    number = int(name)
    return number if number <= VERSION_MAX else None
