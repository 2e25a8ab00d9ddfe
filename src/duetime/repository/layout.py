"""The on-disk format: `<repo>/<model>/config.toml` and `<repo>/<model>/<version>/model.onnx`."""

from __future__ import annotations

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

    @property
    def latest(self) -> int:
        return max(self.versions)


@dataclass(frozen=True, slots=True)
class Scan:
    """What a repository holds: the models found, and why other folders are not models."""

    models: list[ModelSource]
    errors: dict[str, str]


def scan_repository(root: Path) -> Scan:
    """List the models under `root`; a folder that is not a valid model is reported, not fatal."""
    if not root.is_dir():
        raise ConfigError(f"model repository {root} is not a folder")
    models: list[ModelSource] = []
    errors: dict[str, str] = {}
    for directory in sorted(p for p in root.iterdir() if p.is_dir()):
        if directory.name.startswith((".", "_")):
            continue
        try:
            models.append(scan_model(directory))
        except ConfigError as exc:
            errors[directory.name] = exc.message
    return Scan(models, errors)


def scan_model(directory: Path) -> ModelSource:
    versions: dict[int, Path] = {}
    for child in directory.iterdir():
        if child.is_dir() and _is_version(child.name) and (child / MODEL_FILENAME).is_file():
            versions[int(child.name)] = child / MODEL_FILENAME
    if not versions:
        raise ConfigError(
            f"{directory}: no version folder holds a {MODEL_FILENAME}; expected "
            f"{directory}/<version>/{MODEL_FILENAME} with an integer version such as 1"
        )
    return ModelSource(directory.name, directory, versions)


def _is_version(name: str) -> bool:
    # NOTE: str.isdigit() alone also accepts digits such as '²' that int() rejects.
    return name.isascii() and name.isdigit()
