"""Load requests as wholes: a failed load changes nothing served, folders never asked for and
files still being written do not make the server unready, and polling follows the folders.

Each test runs its scenario under `asyncio.run` against a repository written into tmp_path.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from repo_models import age, factor_of, scale_model, write_version
from repo_models import run_on_engine as run

from duetime.config import ModelConfig
from duetime.engine import Engine
from duetime.errors import InvalidInput
from duetime.repository import manager as manager_module

ALL = ModelConfig.model_validate({"version_policy": {"all": {}}})


def served(engine: Engine, model: str = "m") -> list[str]:
    return sorted(engine.registry.snapshot.models[model].versions, key=int)


def versions_listed(engine: Engine, model: str = "m") -> list[str]:
    return [e.get("version", "") for e in engine.repository_index() if e["name"] == model]


# -- a failed load changes nothing -------------------------------------------------------------


def test_a_failed_upload_serves_none_of_its_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Uploaded versions 5 (good) and 6 (broken): the load answered 400, yet version 5 served
    as the default, from an upload the model kept."""
    write_version(tmp_path, "m", 1, scale_model(1))
    written: list[Path] = []
    real = manager_module._write_upload

    def recording(name: str, files: dict[str, bytes]) -> Path:
        written.append(real(name, files))
        return written[-1]

    monkeypatch.setattr(manager_module, "_write_upload", recording)

    async def scenario(engine: Engine) -> None:
        files = {"5/model.onnx": scale_model(5), "6/model.onnx": b"not an onnx model"}
        with pytest.raises(InvalidInput, match=r"version 6: .*ONNX Runtime cannot load it"):
            await engine.load_model("m", ALL, files=files)
        assert served(engine) == ["1"]
        assert await factor_of(engine) == 1.0
        assert versions_listed(engine) == ["1"]
        assert not written[0].exists()  # (the upload is dropped)
        await engine.load_model("m")  # (the model's folder again)
        assert served(engine) == ["1"]

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def test_a_load_whose_folder_holds_no_version_changes_nothing_served(tmp_path: Path) -> None:
    """Found by a tester: an upload holding no version folder (a README, a model.onnx at the
    top), or the model's folder after `1/` was renamed `v1/`, failed the load (400) and
    unloaded the model that served: every request then got 503 until a good load."""
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        for files in ({"README": b"hi"}, {"model.onnx": scale_model(3)}):
            with pytest.raises(InvalidInput, match=r"no version folder holds a model\.onnx"):
                await engine.load_model("m", ALL, files=files)
            assert served(engine) == ["1"]
            assert await factor_of(engine) == 1.0
            assert versions_listed(engine) == ["1"]
            (row,) = [r for r in engine.repository_index() if r["name"] == "m"]
            assert row["state"] == "READY", row
            assert "duetime-upload" not in row["reason"], row  # (its folder, gone)
            assert "the uploaded files ('file:' load parameters): no version" in row["reason"]
        (tmp_path / "m" / "1").rename(tmp_path / "m" / "v1")
        with pytest.raises(InvalidInput, match=r"no version folder holds a model\.onnx"):
            await engine.load_model("m")
        assert served(engine) == ["1"]
        assert await factor_of(engine) == 1.0
        (tmp_path / "m" / "v1").rename(tmp_path / "m" / "1")
        await engine.load_model("m")
        assert served(engine) == ["1"]

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def test_a_failed_override_serves_none_of_its_versions_and_is_dropped(tmp_path: Path) -> None:
    """An override serving every version, version 3 broken: the load answered 400, yet version
    1 served, and the override stuck (every later plain load failed on version 3)."""
    for version in (1, 2):
        write_version(tmp_path, "m", version, scale_model(version))
    write_version(tmp_path, "m", 3, b"not an onnx model")
    config = tmp_path / "m" / "config.toml"
    config.write_text("[version_policy.specific]\nversions = [2]\n")
    age(config)

    async def scenario(engine: Engine) -> None:
        assert served(engine) == ["2"]
        with pytest.raises(InvalidInput, match="version 3"):
            await engine.load_model("m", ALL)
        assert served(engine) == ["2"]
        await engine.load_model("m")  # (config.toml, not the failed override)
        assert served(engine) == ["2"]

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def test_a_failed_plain_load_serves_none_of_its_new_versions(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    config = tmp_path / "m" / "config.toml"
    config.write_text("[version_policy]\nall = {}\n")
    age(config)

    async def scenario(engine: Engine) -> None:
        write_version(tmp_path, "m", 2, scale_model(2))
        write_version(tmp_path, "m", 3, b"not an onnx model")
        with pytest.raises(InvalidInput, match="version 3"):
            await engine.load_model("m")
        assert served(engine) == ["1"]
        assert versions_listed(engine) == ["1", "3"]  # (3 says why it failed)
        (tmp_path / "m" / "3" / "model.onnx").unlink()
        await engine.load_model("m")
        assert served(engine) == ["1", "2"]

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


# -- readiness -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "startup", "ready"),
    [
        ("explicit", ("m",), True),  # (nobody asked for 'staging': it has no state)
        ("explicit", ("*",), False),
        ("none", (), False),  # (every folder is meant to load)
        ("poll", (), False),
    ],
)
def test_only_a_model_asked_for_that_fails_makes_the_server_unready(
    tmp_path: Path, mode: str, startup: tuple[str, ...], ready: bool
) -> None:
    """Explicit mode: an empty `staging/` folder nobody asked to load made the server unready
    while the model asked for served."""
    write_version(tmp_path, "m", 1, scale_model(1))
    (tmp_path / "staging").mkdir()

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 1.0
        assert engine.ready is ready
        if mode == "explicit" and ready:
            assert {"name": "staging"} in engine.repository_index()
            with pytest.raises(InvalidInput, match="no version folder holds a model"):
                await engine.load_model("staging")  # (asked for now: it counts)
            assert engine.ready is False

    run(tmp_path, scenario, control_mode=mode, startup_models=startup, poll_s=3600)


def test_a_new_model_whose_files_are_settling_has_not_failed(tmp_path: Path) -> None:
    """Polling: a new model copied in (even by renaming a hidden folder) made the server unready
    for --repository-stable-secs: files still changing were recorded as a failure."""
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        fresh = write_version(tmp_path, ".tmp", 1, scale_model(2), aged=False)
        (tmp_path / ".tmp").rename(tmp_path / "n")
        await manager.poll()
        assert list(engine.registry.snapshot.models) == ["m"]
        assert engine.ready
        age(tmp_path / "n" / fresh.relative_to(tmp_path / ".tmp"))
        await manager.poll()
        assert await factor_of(engine, "n") == 2.0

    run(tmp_path, scenario, control_mode="poll", poll_s=3600, stable_s=30.0)


# -- polling -------------------------------------------------------------------------------------


def test_polling_unloads_an_upload_whose_folder_was_removed(tmp_path: Path) -> None:
    """An upload counted as a folder on disk: removing the model's folder never unloaded it,
    and polling refuses unloads. (The engine refuses such loads; the manager takes them.)"""
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        await manager.load("m", config=ModelConfig(), files={"1/model.onnx": scale_model(9)})
        assert await factor_of(engine) == 9.0
        shutil.rmtree(tmp_path / "m")
        await manager.poll()
        assert "m" not in engine.registry.snapshot.models
        assert not manager._uploads

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


def test_a_version_of_an_earlier_upload_is_not_called_the_folders(tmp_path: Path) -> None:
    """After a second upload, the first upload's version was listed as the repository's
    folder's, whose place the upload took."""
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        await engine.load_model("m", ModelConfig(), files={"7/model.onnx": scale_model(7)})
        await engine.load_model("m", ModelConfig(), files={"8/model.onnx": scale_model(8)})
        assert await factor_of(engine) == 8.0
        listed = {e.get("version"): e.get("reason") for e in engine.repository_index()}
        assert listed["1"] == manager_module.UPLOADED
        assert listed.get("7") != manager_module.UPLOADED
        assert engine.manager is not None
        await asyncio.gather(*engine.manager._retiring)  # version 7 drains; its files are gone
        assert versions_listed(engine) == ["1", "8"]

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


# -- a version installed by a rename -------------------------------------------------------------


def test_a_renamed_version_waits_until_its_files_are_stable_s_old(tmp_path: Path) -> None:
    """The docs said a hidden folder renamed to the version number "needs no wait"; it waits as
    any version does, counted from the files' modification times, which a rename keeps."""
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        write_version(tmp_path / "m", ".tmp", 2, scale_model(2), aged=False)
        (tmp_path / "m" / ".tmp" / "2").rename(tmp_path / "m" / "2")
        await manager.poll()
        assert served(engine) == ["1"]  # (just written: not yet)
        write_version(tmp_path / "m", ".tmp", 3, scale_model(3))  # (written long before)
        (tmp_path / "m" / ".tmp" / "3").rename(tmp_path / "m" / "3")
        await manager.poll()  # (no wait: stable_s is an hour)
        assert served(engine) == ["3"]

    run(tmp_path, scenario, control_mode="poll", poll_s=3600, stable_s=3600.0)


def test_an_upload_may_key_its_files_as_triton_s_load_parameters(tmp_path: Path) -> None:
    """Found by a tester: `files={"file:1/model.onnx": data}` (tritonclient's keys, the README's
    example) was refused in process as a folder 'file:1' holding no version."""
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        await engine.load_model("m", ALL, files={"file:5/model.onnx": scale_model(5)})
        assert served(engine) == ["5"]
        assert await factor_of(engine) == 5.0

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))
