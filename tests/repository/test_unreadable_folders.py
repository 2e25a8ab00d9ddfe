"""Folders the server may not read (chmod 000, a mount it has no rights on) are refused as
configuration errors naming the folder: a model's fails that model alone, the repository's
fails the start with one line. PermissionError came through as a traceback: at start (no model
served), from a load request (500) and from every poll (found by a tester)."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_models import factor_of, run_on_engine, scale_model, write_version

from duetime.engine import Engine
from duetime.errors import ConfigError, DuetimeError
from duetime.repository.layout import scan_repository


def locked(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Reading in `folder` raises PermissionError, as for a folder of mode 000 (tests run as
    root, whom file modes do not stop)."""
    exists, iterdir = Path.exists, Path.iterdir

    def denied(path: Path) -> None:
        if path == folder or folder in path.parents:
            raise PermissionError(13, "Permission denied", str(path))

    def checked_exists(path: Path, *args: object, **kwargs: object) -> bool:
        if path != folder:
            denied(path)
        return exists(path, *args, **kwargs)  # type: ignore[arg-type]

    def checked_iterdir(path: Path) -> object:
        denied(path)
        return iterdir(path)

    monkeypatch.setattr(Path, "exists", checked_exists)
    monkeypatch.setattr(Path, "iterdir", checked_iterdir)


def test_an_unreadable_model_folder_fails_that_model_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_version(tmp_path, "m", 1, scale_model(2))
    write_version(tmp_path, "locked", 1, scale_model(3))
    locked(monkeypatch, tmp_path / "locked")
    scan = scan_repository(tmp_path)
    assert [source.name for source in scan.models] == ["m"]
    assert scan.errors == {"locked": f"{tmp_path / 'locked'}: cannot be read: Permission denied"}

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 2
        (row,) = [e for e in engine.repository_index() if e["name"] == "locked"]
        assert row.get("reason") == f"{tmp_path / 'locked'}: cannot be read: Permission denied"

    for mode in ("none", "poll"):
        run_on_engine(tmp_path, scenario, control_mode=mode)

    async def explicitly(engine: Engine) -> None:
        with pytest.raises(DuetimeError, match="cannot be read: Permission denied") as caught:
            await engine.load_model("locked")
        assert caught.value.http_status == 400  # (it was a 500)

    run_on_engine(tmp_path, explicitly, control_mode="explicit")


def test_an_unreadable_repository_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_version(tmp_path, "m", 1, scale_model(2))
    locked(monkeypatch, tmp_path)
    with pytest.raises(ConfigError, match=r"cannot be read: Permission denied$"):
        scan_repository(tmp_path)
