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


def stat_locked(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """As `locked`, and a `stat` of anything in `folder` raises PermissionError too (as in a
    version folder of mode 000: `is_file` and `is_dir` stat)."""
    locked(monkeypatch, folder)
    stat = Path.stat

    def checked_stat(path: Path, *args: object, **kwargs: object) -> object:
        if folder in path.parents:
            raise PermissionError(13, "Permission denied", str(path))
        return stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "stat", checked_stat)


@pytest.mark.parametrize("locked_folder", ["m/1", "m"])
def test_a_served_model_whose_folder_turns_unreadable_serves_on_and_polls_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    locked_folder: str,
) -> None:  # fmt: skip
    """A version folder (or model folder) made unreadable under a served model: `is_file`'s
    PermissionError ended every poll with a traceback ("repository poll: model m failed"),
    a load request answered 500, and the model folder's case went to unload what served. The
    poll and the load now go on: what serves serves on, and the model's folder error is its
    reason in the index."""
    write_version(tmp_path, "m", 1, scale_model(2))

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 2
        stat_locked(monkeypatch, tmp_path / locked_folder)
        manager = engine.manager
        assert manager is not None
        for _ in range(3):
            await manager.poll()
        monkeypatch.undo()
        assert await factor_of(engine) == 2
        if locked_folder == "m":
            (row,) = [e for e in engine.repository_index() if e["name"] == "m"]
            assert "cannot be read: Permission denied" in str(row.get("reason"))

    with caplog.at_level("ERROR"):
        run_on_engine(tmp_path, scenario, control_mode="poll", poll_s=3600.0)
    assert "Traceback" not in caplog.text
    assert "repository poll: model m failed" not in caplog.text
