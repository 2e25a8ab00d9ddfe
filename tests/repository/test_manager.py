"""The model lifecycle through the Engine: version policies, explicit and polled loading, reloads
that drain, failures that never replace a working version, the settle rule, the optimised-graph
cache, variants picked by due time, lazy loading and the loaded-model budget.

Each test runs its scenario under `asyncio.run` against a repository written into tmp_path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from repo_models import (
    age,
    factor_of,
    heavy_model,
    inputs,
    mixing_model,
    scale_model,
    stacking_model,
    write_version,
)
from repo_models import run_on_engine as run

from duetime.config import ModelConfig
from duetime.engine import Engine
from duetime.errors import (
    ConfigError,
    DuetimeError,
    InvalidInput,
    ModelNotFound,
    ModelUnavailable,
    NotAllowed,
)
from duetime.repository import manager as manager_module
from duetime.scheduling.scheduler import REFUSALS_SEEN_NS


def config(repo: Path, model: str, text: str) -> None:
    path = repo / model / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    age(path)


def states(engine: Engine, model: str = "m") -> dict[str, tuple[str, str]]:
    return {
        e.get("version", ""): (e.get("state", ""), e.get("reason", ""))
        for e in engine.repository_index()
        if e["name"] == model
    }


# -- version policies ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        ("", ["3"]),
        ("[version_policy.latest]\nnum_versions = 2\n", ["2", "3"]),
        ("[version_policy]\nall = {}\n", ["1", "2", "3"]),
        ("[version_policy.specific]\nversions = [1, 3, 7]\n", ["1", "3"]),
    ],
)
def test_version_policy_chooses_the_served_versions(
    tmp_path: Path, policy: str, served: list[str]
) -> None:
    for version in (1, 2, 3):
        write_version(tmp_path, "m", version, scale_model(version))
    config(tmp_path, "m", policy)

    async def scenario(engine: Engine) -> None:
        assert sorted(engine.registry.snapshot.models["m"].versions, key=int) == served
        assert await factor_of(engine) == float(served[-1])  # the highest by default
        for version in served:
            assert await factor_of(engine, version=version) == float(version)
        missing = next(v for v in ("1", "2", "3") if v not in served) if len(served) < 3 else None
        if missing:
            with pytest.raises(ModelNotFound, match=f"'m' version {missing} is not found"):
                await factor_of(engine, version=missing)

    run(tmp_path, scenario)


def test_a_policy_selecting_nothing_is_reported(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    config(tmp_path, "m", "[version_policy.specific]\nversions = [5]\n")

    async def scenario(engine: Engine) -> None:
        with pytest.raises(ModelUnavailable, match="selects none of the versions found"):
            await factor_of(engine)
        assert states(engine)[""][0] == "UNAVAILABLE"

    run(tmp_path, scenario)


# -- control modes ---------------------------------------------------------------------------------


def test_mode_none_refuses_load_and_unload(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        with pytest.raises(NotAllowed, match="--model-control-mode none"):
            await engine.load_model("m")
        with pytest.raises(NotAllowed):
            await engine.unload_model("m")
        assert await factor_of(engine) == 1.0

    run(tmp_path, scenario)


@pytest.mark.parametrize("strict", [True, False])
def test_a_model_that_failed_to_load_makes_the_server_unready(tmp_path: Path, strict: bool) -> None:
    """The v2 protocol's server ready means "all the models are ready" (Triton's strict
    readiness): it said ready while one model of the repository had failed to load."""
    write_version(tmp_path, "m", 1, scale_model(1))
    write_version(tmp_path, "broken", 1, b"not an onnx model")

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 1.0
        assert engine.ready is not strict
        await engine.unload_model("broken")  # (no longer a model that failed: ready)
        assert engine.ready
        with pytest.raises(InvalidInput):
            await engine.load_model("broken")
        assert engine.ready is not strict
        write_version(tmp_path, "broken", 1, scale_model(2))
        await engine.load_model("broken")
        assert engine.ready

    run(tmp_path, scenario, control_mode="explicit", startup_models=("*",), strict_readiness=strict)


def test_explicit_mode_loads_and_unloads_on_request(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    write_version(tmp_path, "n", 1, scale_model(5))

    async def scenario(engine: Engine) -> None:
        assert engine.ready
        assert engine.repository_index() == [{"name": "m"}, {"name": "n"}]
        with pytest.raises(ModelNotFound):
            await factor_of(engine)
        await engine.load_model("m")
        assert await factor_of(engine) == 1.0
        assert states(engine) == {"1": ("READY", "")}
        assert engine.repository_index(ready_only=True) == [
            {"name": "m", "version": "1", "state": "READY", "reason": ""}
        ]
        await engine.unload_model("m")
        with pytest.raises(ModelNotFound):
            await factor_of(engine)
        await asyncio.sleep(0.2)  # the version drains in the background
        assert states(engine)["1"] == ("UNAVAILABLE", "unloaded by request")
        await engine.load_model("m")
        assert await factor_of(engine) == 1.0

    run(tmp_path, scenario, control_mode="explicit")


def test_explicit_mode_loads_startup_models(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    write_version(tmp_path, "n", 1, scale_model(5))

    async def scenario(engine: Engine) -> None:
        assert list(engine.registry.snapshot.models) == ["n"]

    run(tmp_path, scenario, control_mode="explicit", startup_models=("n",))


@pytest.mark.parametrize("name", ["..", "../m", "a/b", ".hidden", ""])
def test_model_names_never_leave_the_repository(tmp_path: Path, name: str) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        with pytest.raises(InvalidInput, match="is not valid"):
            await engine.load_model(name)
        with pytest.raises(InvalidInput, match="is not valid"):
            await engine.unload_model(name)

    run(tmp_path, scenario, control_mode="explicit")


def test_a_model_named_with_a_leading_underscore_is_served(tmp_path: Path) -> None:
    """Triton accepts `_preprocess`; it was skipped without a word and its name refused."""
    write_version(tmp_path, "_pre", 1, scale_model(3))

    async def at_start(engine: Engine) -> None:
        assert await factor_of(engine, "_pre") == 3.0
        assert states(engine, "_pre") == {"1": ("READY", "")}

    run(tmp_path, at_start)

    async def explicitly(engine: Engine) -> None:
        assert engine.repository_index() == [{"name": "_pre"}]
        await engine.load_model("_pre")
        assert await factor_of(engine, "_pre") == 3.0
        await engine.unload_model("_pre")

    run(tmp_path, explicitly, control_mode="explicit")


def test_a_model_named_with_a_backslash_is_served(tmp_path: Path) -> None:
    """A backslash separates nothing on POSIX (Triton serves such a folder); it was skipped
    without a word, and the index listed it with no state."""
    write_version(tmp_path, "back\\slash", 1, scale_model(3))

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine, "back\\slash") == 3.0
        assert states(engine, "back\\slash") == {"1": ("READY", "")}

    run(tmp_path, scenario)


@pytest.mark.parametrize("name", ["../m", ".m", "a/b"])
def test_an_invalid_startup_model_fails_the_start_naming_the_setting(
    tmp_path: Path, name: str
) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    with pytest.raises(ConfigError, match=r"field 'startup_models' \('.*'\): model na"):
        run(tmp_path, _nothing, control_mode="explicit", startup_models=(name,))


def test_a_startup_model_not_in_the_repository_fails_the_start(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    write_version(tmp_path, "n", 1, scale_model(2))
    with pytest.raises(ConfigError, match=r"'typo'.*no model folder of that name.*'m', 'n'"):
        run(tmp_path, _nothing, control_mode="explicit", startup_models=("n", "typo"))


def test_a_startup_model_that_fails_to_load_is_reported_and_the_rest_serve(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    write_version(tmp_path, "broken", 1, b"not an onnx model")
    (tmp_path / "empty").mkdir()

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 1.0
        state, reason = states(engine, "broken")["1"]
        assert state == "UNAVAILABLE"
        assert "ONNX Runtime cannot load it" in reason
        assert "no version folder" in states(engine, "empty")[""][1]

    startup = ("m", "broken", "empty")
    with caplog.at_level("ERROR", logger="duetime.manager"):
        run(tmp_path, scenario, control_mode="explicit", startup_models=startup)
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "model broken version 1 not loaded" in logged
    assert "model empty not loaded" in logged


def test_startup_models_outside_explicit_mode_are_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As Triton: `--load-model` only takes effect in explicit mode (it was ignored silently)."""
    write_version(tmp_path, "m", 1, scale_model(1))
    write_version(tmp_path, "n", 1, scale_model(2))

    async def scenario(engine: Engine) -> None:
        assert sorted(engine.registry.snapshot.models) == ["m", "n"]

    with caplog.at_level("WARNING", logger="duetime.manager"):
        run(tmp_path, scenario, startup_models=("n",))
    assert any(
        "startup_models=('n',) is ignored" in r.getMessage() and "explicit" in r.getMessage()
        for r in caplog.records
    )


async def _nothing(engine: Engine) -> None:
    pass


def test_load_of_a_model_not_in_the_repository(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        with pytest.raises(ModelNotFound, match="'nope' is not in the repository"):
            await engine.load_model("nope")

    run(tmp_path, scenario, control_mode="explicit")


def test_a_load_of_a_served_model_whose_folder_is_gone_fails_and_it_serves_on(
    tmp_path: Path,
) -> None:
    """A load is all or nothing, as Triton's: one for a model whose folder was moved away
    answered 404 yet unloaded the model, every request after it told "served models: none".
    It fails and changes nothing: the version serves on, the index saying why."""
    repo = tmp_path / "repo"
    write_version(repo, "m", 1, scale_model(3))

    async def scenario(engine: Engine) -> None:
        (repo / "m").rename(tmp_path / "moved")
        with pytest.raises(ModelNotFound, match=r"not in the repository .*serve on"):
            await engine.load_model("m")
        assert await factor_of(engine) == 3.0
        ((state, reason),) = states(engine).values()
        assert state == "READY"
        assert reason.startswith(manager_module.STILL_SERVES)
        await engine.unload_model("m")  # (an unload still unloads it)
        with pytest.raises(ModelNotFound):
            await factor_of(engine)

    run(repo, scenario, control_mode="explicit", startup_models=("m",))


def test_the_index_forgets_a_failed_version_whose_folder_was_removed(tmp_path: Path) -> None:
    """A broken version 2, its load failed (400), then its folder removed: the index listed it
    UNAVAILABLE with its parse error until a load of the model succeeded."""
    import shutil

    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        write_version(tmp_path, "m", 2, b"not an onnx model")
        with pytest.raises(InvalidInput):
            await engine.load_model("m")
        assert states(engine)["2"][0] == "UNAVAILABLE"
        shutil.rmtree(tmp_path / "m" / "2")
        assert list(states(engine)) == ["1"]
        assert await factor_of(engine) == 1.0

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


# -- reloads ---------------------------------------------------------------------------------------


def test_reload_swaps_a_changed_file_and_drains_the_old_one(tmp_path: Path) -> None:
    path = write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        old = engine.registry.resolve("m", None)
        await engine.load_model("m")  # nothing changed: the same deployment stays
        assert engine.registry.resolve("m", None) is old
        path.write_bytes(scale_model(7))
        age(path)
        await engine.load_model("m")
        assert engine.registry.resolve("m", None) is not old
        assert await factor_of(engine) == 7.0
        await asyncio.sleep(0.2)
        with pytest.raises(ModelUnavailable, match="shutting down"):
            old.scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=0)

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def test_poll_picks_up_new_versions_and_retires_old_ones(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 1.0
        write_version(tmp_path, "m", 2, scale_model(2))
        write_version(tmp_path, "n", 1, scale_model(9))
        await engine.manager.poll()  # type: ignore[union-attr]
        assert await factor_of(engine) == 2.0
        assert await factor_of(engine, "n") == 9.0
        await asyncio.sleep(0.2)
        assert states(engine)["1"] == ("UNAVAILABLE", "not in policy")
        assert states(engine)["2"] == ("READY", "")

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


def test_poll_unloads_a_removed_model(tmp_path: Path) -> None:
    import shutil

    write_version(tmp_path, "m", 1, scale_model(1))
    write_version(tmp_path, "n", 1, scale_model(2))

    async def scenario(engine: Engine) -> None:
        shutil.rmtree(tmp_path / "n")
        await engine.manager.poll()  # type: ignore[union-attr]
        assert list(engine.registry.snapshot.models) == ["m"]
        with pytest.raises(ModelNotFound):
            await factor_of(engine, "n")
        with pytest.raises(NotAllowed, match="polled"):
            await engine.unload_model("m")

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


def test_a_broken_version_never_replaces_a_working_one(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        write_version(tmp_path, "m", 2, b"not an onnx model")
        with pytest.raises(InvalidInput, match="version 2"):  # (Triton: a failed load is 400)
            await engine.load_model("m")
        assert await factor_of(engine) == 1.0
        state, reason = states(engine)["2"]
        assert state == "UNAVAILABLE"
        assert "ONNX Runtime cannot load it" in reason
        state, reason = states(engine)["1"]  # (serves on, and says why: the latest failure)
        assert state == "READY"
        assert reason.startswith("a new load failed, the previous one still serves: ")
        assert "version 2" in reason
        # a working version 2 then replaces version 1
        write_version(tmp_path, "m", 2, scale_model(2))
        await engine.load_model("m")
        assert await factor_of(engine) == 2.0

    run(tmp_path, scenario, control_mode="explicit", startup_models=("*",))


def test_a_version_serving_on_for_a_broken_new_one_is_reloaded_when_its_files_change(
    tmp_path: Path,
) -> None:
    """Version 1, serving on while a broken version 2 did not load, kept its old weights for
    good after its file changed (polls checked only the versions the policy selects), and the
    index said nothing of why a version out of the policy still served."""
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        write_version(tmp_path, "m", 2, b"not an onnx model")
        await manager.poll()
        assert await factor_of(engine) == 1.0
        state, reason = states(engine)["1"]
        assert state == "READY"
        assert "not selected by version_policy, served on while the load of version 2" in reason
        write_version(tmp_path, "m", 1, scale_model(5))
        await manager.poll()
        assert await factor_of(engine) == 5.0
        assert states(engine)["1"] == ("READY", reason)
        write_version(tmp_path, "m", 1, b"\x08\x01garbage")  # (broken: the one serving stays)
        await manager.poll()
        assert await factor_of(engine) == 5.0
        assert "previous one still serves" in states(engine)["1"][1]
        write_version(tmp_path, "m", 2, scale_model(2))  # fixed: replaces version 1
        await manager.poll()
        assert await factor_of(engine) == 2.0
        assert states(engine)["2"] == ("READY", "")

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


def test_a_broken_rewrite_of_a_served_version_keeps_the_old_one(tmp_path: Path) -> None:
    path = write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        path.write_bytes(b"\x08\x01garbage")
        age(path)
        await engine.manager.poll()  # type: ignore[union-attr]
        assert await factor_of(engine) == 1.0
        state, reason = states(engine)["1"]
        assert state == "READY"
        assert "previous one still serves" in reason

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


def test_a_bad_config_keeps_the_served_versions(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        config(tmp_path, "m", "max_batch_size = 'lots'\n")
        with pytest.raises(InvalidInput, match="max_batch_size"):
            await engine.load_model("m")
        assert await factor_of(engine) == 1.0
        # (its serving version's row says why, as a failed load's does: a row of the model's
        # own said UNAVAILABLE beside it, a serving model read as down; found by a tester)
        ((version, (state, reason)),) = states(engine).items()
        assert (version, state) == ("1", "READY")
        assert reason.startswith("a new load failed, the previous one still serves: ")
        assert "max_batch_size" in reason

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def test_poll_reloads_a_version_whose_external_data_alone_changed(tmp_path: Path) -> None:
    folder = write_version(tmp_path, "m", 1, scale_model(1)).parent
    with_external_data(scale_model(1), folder)
    age(folder / "model.onnx")
    age(folder / "weights.bin")

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 1.0
        graph = folder / "model.onnx"
        before = graph.stat()
        with_external_data(scale_model(4), folder)  # the same model.onnx, new weights
        os.utime(graph, ns=(before.st_atime_ns, before.st_mtime_ns))  # (unchanged, to the ns)
        assert graph.stat().st_size == before.st_size
        age(folder / "weights.bin", seconds=30)
        await engine.manager.poll()  # type: ignore[union-attr]
        assert await factor_of(engine) == 4.0

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


NORMALISED_NS = 315_532_800 * 10**9
"""1980-01-01, a normalised time stamp (`cp -p` or `rsync -a` of archived files keep it)."""


@pytest.mark.parametrize("mode", ["poll", "explicit"])
@pytest.mark.parametrize("how", ["renamed onto it", "written over it"])
def test_a_file_replaced_by_one_of_the_same_size_and_time_is_reloaded(
    tmp_path: Path, mode: str, how: str
) -> None:
    """Size and modification time were all that was compared: polls served the old weights for
    good, and a load request answered 200 with them."""
    path = write_version(tmp_path, "m", 1, scale_model(1))
    os.utime(path, ns=(NORMALISED_NS, NORMALISED_NS))

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 1.0
        new = scale_model(2)
        assert len(new) == path.stat().st_size
        target = path.with_name(".model.onnx.tmp") if how == "renamed onto it" else path
        target.write_bytes(new)
        os.utime(target, ns=(NORMALISED_NS, NORMALISED_NS))
        os.replace(target, path)  # (onto itself: nothing, for the overwrite in place)
        if mode == "poll":
            await engine.manager.poll()  # type: ignore[union-attr]
        else:
            await engine.load_model("m")
        assert await factor_of(engine) == 2.0

    options: dict[str, Any] = {"poll_s": 3600} if mode == "poll" else {"startup_models": ("m",)}
    run(tmp_path, scenario, control_mode=mode, **options)


def loads_counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The models ONNX Runtime is asked to load from now on (their folder names)."""
    seen: list[str] = []
    real = manager_module.load_version

    def counting(source: Any, version: int, *args: Any, **kwargs: Any) -> Any:
        seen.append(f"{source.name}/{version}")
        return real(source, version, *args, **kwargs)

    monkeypatch.setattr(manager_module, "load_version", counting)
    return seen


def test_a_fault_loading_one_model_leaves_the_others_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only a ConfigError: whatever goes wrong loading one version stays with it."""
    for name in ("good", "faulty"):
        write_version(tmp_path, name, 1, scale_model(1))
    real = manager_module.load_version

    def faulty(source: Any, version: int, *args: Any, **kwargs: Any) -> Any:
        if source.name == "faulty":
            raise IndexError("list assignment index out of range")
        return real(source, version, *args, **kwargs)

    monkeypatch.setattr(manager_module, "load_version", faulty)

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine, "good") == 1.0
        state, reason = states(engine, "faulty")["1"]
        assert state == "UNAVAILABLE"
        assert "internal error while loading: IndexError: list assignment" in reason

    run(tmp_path, scenario)


def test_poll_tries_a_failed_version_again_only_once_its_files_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A broken, unchanged file was loaded (and logged) again at every poll."""
    write_version(tmp_path, "m", 1, scale_model(1))
    write_version(tmp_path, "broken", 1, b"not an onnx model")
    write_version(tmp_path, "bad_config", 1, scale_model(1))
    config(tmp_path, "bad_config", "max_batch_size = 'lots'\n")
    loads = loads_counted(monkeypatch)

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        assert sorted(loads) == ["broken/1", "m/1"]
        loads.clear()
        caplog.clear()
        with caplog.at_level("ERROR", logger="duetime.manager"):
            for _ in range(3):
                await manager.poll()
        assert loads == []  # the start tried it; nothing changed since
        assert [r.getMessage() for r in caplog.records] == []
        assert "ONNX Runtime cannot load it" in states(engine, "broken")["1"][1]
        assert "max_batch_size" in states(engine, "bad_config")[""][1]
        write_version(tmp_path, "broken", 1, b"still not an onnx model")  # changed, still bad
        await manager.poll()
        await manager.poll()
        assert loads == ["broken/1"]
        write_version(tmp_path, "broken", 1, scale_model(5))
        await manager.poll()
        assert await factor_of(engine, "broken") == 5.0
        assert states(engine, "broken") == {"1": ("READY", "")}
        assert loads == ["broken/1", "broken/1"]

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


def test_an_explicit_load_retries_a_failed_version_even_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_version(tmp_path, "m", 1, b"not an onnx model")
    loads = loads_counted(monkeypatch)

    async def scenario(engine: Engine) -> None:
        for _ in range(2):
            with pytest.raises(InvalidInput, match="ONNX Runtime cannot load it"):
                await engine.load_model("m")
        assert loads == ["m/1", "m/1"]

    run(tmp_path, scenario, control_mode="explicit")


def test_the_index_forgets_folders_removed_from_the_repository(tmp_path: Path) -> None:
    """Removed broken models stayed listed UNAVAILABLE with their old reasons, and so did
    removed versions."""
    import shutil

    for version in (1, 2):
        write_version(tmp_path, "m", version, scale_model(version))
    write_version(tmp_path, "m", 3, b"not an onnx model")
    config(tmp_path, "m", "[version_policy]\nall = {}\n")
    write_version(tmp_path, "broken", 1, b"not an onnx model")
    (tmp_path / "empty").mkdir()
    write_version(tmp_path, "gone", 1, scale_model(9))

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        assert {"broken", "empty", "gone"} <= {e["name"] for e in engine.repository_index()}
        assert states(engine)["3"][0] == "UNAVAILABLE"
        for folder in ("broken", "empty", "gone", "m/3", "m/2"):
            shutil.rmtree(tmp_path / folder)
        await manager.poll()
        await asyncio.sleep(0.2)  # removed versions drain
        index = engine.repository_index()
        assert {e["name"] for e in index} == {"m", "gone"}
        removed = ("UNAVAILABLE", "its folder was removed from the repository")
        assert states(engine) == {"1": ("READY", ""), "2": removed}
        assert states(engine, "gone") == {"1": removed}  # served: the index says it went
        with pytest.raises(ModelNotFound):  # not 'unavailable' with its old failure
            await factor_of(engine, "broken")
        await manager.poll()
        assert engine.repository_index() == index

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


def test_a_version_whose_model_file_alone_was_removed_says_so(tmp_path: Path) -> None:
    """It said its folder was removed, though the folder was still there (found by a tester)."""
    for version in (1, 2):
        write_version(tmp_path, "m", version, scale_model(version))
    config(tmp_path, "m", "[version_policy]\nall = {}\n")

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        (tmp_path / "m" / "2" / "model.onnx").unlink()
        await manager.poll()
        await asyncio.sleep(0.2)  # the version drains
        assert states(engine) == {
            "1": ("READY", f"{tmp_path / 'm'}: folder 2/ is not served: 2/: holds no model.onnx"),
            "2": ("UNAVAILABLE", "its model file was removed from its version folder"),
        }

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


def test_unloading_an_upload_leaves_only_the_repositorys_versions_listed(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        policy = ModelConfig.model_validate({"version_policy": {"all": {}}})
        files = {f"{v}/model.onnx": scale_model(10 + v) for v in (1, 2, 3)}
        await engine.load_model("m", config=policy, files=files)
        assert sorted(states(engine)) == ["1", "2", "3"]
        await engine.unload_model("m")
        await asyncio.sleep(0.2)  # the versions drain
        assert states(engine) == {"1": ("UNAVAILABLE", "unloaded by request")}

    run(tmp_path, scenario, control_mode="explicit")


def test_the_index_says_what_last_happened_to_a_version_whose_drains_overlap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Load, reload, unload: the instance the reload replaced, drained after the unload, wrote
    'replaced by a new load' over 'unloaded by request' (9 of 10 tries over HTTP)."""
    write_version(tmp_path, "m", 1, scale_model(1))
    close = manager_module._close
    gates: list[asyncio.Event] = []
    draining: asyncio.Queue[asyncio.Event] = asyncio.Queue()
    drained: asyncio.Queue[None] = asyncio.Queue()
    ended = asyncio.Event()  # (then no drain waits: the engine's close waits for them all)

    async def held_close(version: Any, drain_s: float = 0.0) -> None:
        gate = asyncio.Event()
        gates.append(gate)
        draining.put_nowait(gate)
        if not ended.is_set():
            await gate.wait()
        await close(version, drain_s)
        drained.put_nowait(None)

    monkeypatch.setattr(manager_module, "_close", held_close)

    async def scenario(engine: Engine) -> None:
        try:
            await steps(engine)
        finally:
            ended.set()
            for gate in gates:
                gate.set()

    async def steps(engine: Engine) -> None:
        await engine.load_model("m", config=ModelConfig.model_validate({"max_batch_size": 4}))
        await engine.load_model("m", config=ModelConfig.model_validate({"max_batch_size": 8}))
        replaced = await draining.get()
        assert states(engine) == {"1": ("READY", "")}
        await engine.unload_model("m")
        unloaded = await draining.get()
        assert states(engine) == {"1": ("UNLOADING", "unloaded by request")}
        replaced.set()  # the replaced instance has drained, the unloaded one not yet
        await drained.get()
        assert states(engine) == {"1": ("UNLOADING", "unloaded by request")}
        unloaded.set()
        await drained.get()
        assert states(engine) == {"1": ("UNAVAILABLE", "unloaded by request")}

    run(tmp_path, scenario, control_mode="explicit", limit_s=30)


def test_files_still_being_written_wait_for_the_next_poll(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        fresh = write_version(tmp_path, "m", 2, scale_model(2), aged=False)
        await engine.manager.poll()  # type: ignore[union-attr]
        assert await factor_of(engine) == 1.0  # version 2's file changed too recently
        age(fresh)
        await engine.manager.poll()  # type: ignore[union-attr]
        assert await factor_of(engine) == 2.0

    run(tmp_path, scenario, control_mode="poll", poll_s=3600, stable_s=30.0)


def test_an_explicit_load_waits_for_files_to_settle(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        write_version(tmp_path, "m", 2, scale_model(2), aged=False)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await engine.load_model("m")
        assert loop.time() - started >= 0.25
        assert await factor_of(engine) == 2.0

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",), stable_s=0.3)


def test_config_override_replaces_the_config_file(tmp_path: Path) -> None:
    for version in (1, 2):
        write_version(tmp_path, "m", version, scale_model(version))

    async def scenario(engine: Engine) -> None:
        assert list(engine.registry.snapshot.models["m"].versions) == ["2"]
        override = engine.manager.options  # type: ignore[union-attr]
        assert override.control_mode == "explicit"
        from duetime.frontend.rest import parse_config_override

        text = json.dumps({"name": "m", "version_policy": {"all": {}}, "max_batch_size": 4})
        await engine.load_model("m", parse_config_override(text, "m"))
        served = engine.registry.snapshot.models["m"]
        assert sorted(served.versions) == ["1", "2"]
        assert served.versions["1"].primary.model.signature.max_batch_size == 4
        with pytest.raises(InvalidInput, match="name 'other' is not the model 'm'"):
            parse_config_override(json.dumps({"name": "other"}), "m")
        with pytest.raises(InvalidInput, match="max_batch_size"):
            parse_config_override(json.dumps({"max_batch_size": -1}), "m")

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def test_a_failed_override_leaves_no_trace(tmp_path: Path) -> None:
    """A refused config override stayed the model's config: every later plain load failed the
    same way, and the index called the version that still served UNAVAILABLE."""
    write_version(tmp_path, "m", 1, scale_model(1))
    config(tmp_path, "m", "max_batch_size = 8\n")

    async def scenario(engine: Engine) -> None:
        bad = ModelConfig.model_validate({"inputs": [{"name": "zz"}]})
        with pytest.raises(InvalidInput, match="'zz' is not in the graph"):
            await engine.load_model("m", bad)
        assert await factor_of(engine) == 1.0
        state, reason = states(engine)["1"]
        assert state == "READY"
        assert reason.startswith("a new load failed, the previous one still serves: ")
        await engine.load_model("m")  # (the config file, not the refused override)
        assert states(engine)["1"] == ("READY", "")  # (a failure since past)
        served = engine.registry.snapshot.models["m"].versions["1"]
        assert served.primary.model.signature.max_batch_size == 8

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def batch_size(engine: Engine, version: str = "1") -> int:
    served = engine.registry.snapshot.models["m"].versions[version]
    return served.primary.model.signature.max_batch_size


def test_a_plain_load_after_an_override_reads_the_config_file_again(tmp_path: Path) -> None:
    """An override stayed the model's config: a later plain load, even after an edit of the
    config file, served it until an unload. Triton's load without a config reads the file
    (lifecycle_test.py test_config_override)."""
    write_version(tmp_path, "m", 1, scale_model(1))
    config(tmp_path, "m", "max_batch_size = 8\n")

    async def scenario(engine: Engine) -> None:
        await engine.load_model("m", ModelConfig(max_batch_size=4))
        assert batch_size(engine) == 4
        await engine.load_model("m")
        assert batch_size(engine) == 8
        await engine.load_model("m", ModelConfig(max_batch_size=4))
        config(tmp_path, "m", "max_batch_size = 16\n")
        await engine.load_model("m")
        assert batch_size(engine) == 16

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def test_an_uploads_config_stays_with_its_files(tmp_path: Path) -> None:
    """Uploaded files serve until an unload, and so does the config they came with (their
    folder has none of its own); a later load's config replaces it."""
    write_version(tmp_path, "m", 1, scale_model(1))
    config(tmp_path, "m", "max_batch_size = 8\n")

    async def scenario(engine: Engine) -> None:
        upload = {"7/model.onnx": scale_model(7)}
        await engine.load_model("m", ModelConfig(max_batch_size=4), files=upload)
        await engine.load_model("m")
        assert (await factor_of(engine), batch_size(engine, "7")) == (7.0, 4)
        await engine.load_model("m", ModelConfig(max_batch_size=2))
        await engine.load_model("m")
        assert (await factor_of(engine), batch_size(engine, "7")) == (7.0, 2)
        await engine.unload_model("m")
        await engine.load_model("m")
        assert (await factor_of(engine), batch_size(engine)) == (1.0, 8)

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


TRITON_INPUT = {"name": "wrong", "data_type": "TYPE_FP32", "dims": ["4"]}
TRITON_INPUT_PBTXT = '{ name: "wrong" data_type: TYPE_FP32 dims: [4] }'


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (  # duetime's form
            {"inputs": [{"name": "wrong"}]},
            "load parameter 'config': field 'inputs.0.name': 'wrong' is not in the graph",
        ),
        (  # Triton's, as get_model_config gives it
            {"max_batch_size": 8, "input": [TRITON_INPUT]},
            "load parameter 'config': field 'input[0].name': 'wrong' is not in the graph",
        ),
        (
            {"version_policy": {"specific": {"versions": [9]}}},
            "load parameter 'config': field 'version_policy' selects none of the versions",
        ),
    ],
)
def test_an_override_the_model_refuses_is_named_as_the_request_gave_it(
    tmp_path: Path, override: dict[str, Any], message: str
) -> None:
    """The error named the model's folder, whose config is fine, and duetime's own field path
    (`inputs.0.name`) for a field the client wrote in Triton's form (`input[0].name`)."""
    write_version(tmp_path, "m", 1, scale_model(1))
    from duetime.frontend.rest import parse_config_override

    async def scenario(engine: Engine) -> None:
        with pytest.raises(InvalidInput) as caught:
            await engine.load_model("m", parse_config_override(json.dumps(override), "m"))
        assert message in caught.value.message
        assert f"{tmp_path / 'm'}: " not in caught.value.message
        assert await factor_of(engine) == 1.0

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def test_a_pbtxt_the_model_refuses_is_named_in_its_own_fields(tmp_path: Path) -> None:
    """A config.pbtxt naming an input the graph lacks was reported as "<folder>: field
    'inputs.0.name'": not the file, and duetime's field path, which the file has not (the
    same config as a load override said "field 'input[0].name'")."""
    write_version(tmp_path, "m", 1, scale_model(1))
    pbtxt = tmp_path / "m" / "config.pbtxt"
    pbtxt.write_text(f"max_batch_size: 8\ninput [{TRITON_INPUT_PBTXT}]\n")
    age(pbtxt)

    async def scenario(engine: Engine) -> None:
        with pytest.raises(InvalidInput) as caught:
            await engine.load_model("m")
        assert f"{pbtxt}: field 'input[0].name': 'wrong' is not in the graph" in (
            caught.value.message
        )
        assert "inputs.0" not in caught.value.message

    run(tmp_path, scenario, control_mode="explicit")


def test_a_failed_upload_leaves_the_index_as_it_was(tmp_path: Path) -> None:
    for version in (1, 2):
        write_version(tmp_path, "m", version, scale_model(version))

    async def scenario(engine: Engine) -> None:
        before = states(engine)
        junk = {"1/model.onnx": b"not an onnx model"}
        with pytest.raises(InvalidInput, match="ONNX Runtime cannot load it"):
            await engine.load_model("m", ModelConfig(), files=junk)
        assert await factor_of(engine) == 2.0
        after = states(engine)
        assert after.keys() == before.keys()  # (version 2 was gone from the index)
        assert after["2"][0] == "READY"
        assert "previous one still serves" in after["2"][1]

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def test_versions_an_upload_replaces_say_so(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        await engine.load_model("m", ModelConfig(), files={"7/model.onnx": scale_model(7)})
        await asyncio.sleep(0.2)  # version 1 drains
        listed = states(engine)
        assert listed["7"] == ("READY", "")
        assert listed["1"] == ("UNAVAILABLE", manager_module.UPLOADED)  # (not "removed")
        await engine.unload_model("m")
        await asyncio.sleep(0.2)
        assert states(engine) == {"": ("", "")}  # (its folder's again, and none loaded)

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def test_the_optimised_graph_is_cached_and_reused(tmp_path: Path) -> None:
    path = write_version(tmp_path, "m", 1, scale_model(3))

    async def scenario(engine: Engine) -> None:
        cache = path.parent / ".duetime-cache"
        cached = list(cache.glob("model.*.onnx"))
        assert len(cached) == 1
        stamp = cached[0].stat().st_mtime_ns
        await engine.unload_model("m")
        await engine.load_model("m")
        assert await factor_of(engine) == 3.0
        assert [p.stat().st_mtime_ns for p in cache.glob("model.*.onnx")] == [stamp]

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def with_external_data(data: bytes, folder: Path) -> None:
    """Write the model `data` into `folder` as model.onnx with its tensors in weights.bin."""
    model = onnx.load_from_string(data)
    (folder / "weights.bin").unlink(missing_ok=True)  # (onnx appends to a file already there)
    onnx.save_model(
        model, str(folder / "model.onnx"), save_as_external_data=True,
        all_tensors_to_one_file=True, location="weights.bin", size_threshold=0,
    )  # fmt: skip


def test_a_model_with_external_data_is_served_from_its_files_not_a_cache(tmp_path: Path) -> None:
    """ORT's optimised copy of such a model refers to its weights by relative paths that do not
    resolve from the cache folder; and the model file alone would not key the weights."""
    folder = write_version(tmp_path, "m", 1, scale_model(3)).parent
    with_external_data(scale_model(3), folder)
    graph = (folder / "model.onnx").read_bytes()

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 3.0
        await engine.unload_model("m")
        with_external_data(scale_model(5), folder)  # new weights, the same model file
        assert (folder / "model.onnx").read_bytes() == graph
        await engine.load_model("m")
        assert await factor_of(engine) == 5.0
        assert not list((folder / ".duetime-cache").glob("*.onnx"))

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def test_a_graph_whose_free_first_dim_is_not_the_batch_is_never_batched(tmp_path: Path) -> None:
    """Its answers would be split by rows it does not have: loaded unbatched when the config is
    silent, refused when the config asks for batches."""
    write_version(tmp_path, "m", 1, stacking_model())
    write_version(tmp_path, "n", 1, stacking_model())
    config(tmp_path, "n", "max_batch_size = 4\n")

    async def scenario(engine: Engine) -> None:
        snapshot = engine.registry.snapshot
        assert snapshot.models["m"].versions["1"].primary.model.signature.max_batch_size == 0
        answers = await asyncio.gather(*(engine.infer_async("m", inputs()) for _ in range(3)))
        for answer in answers:
            np.testing.assert_array_equal(answer["y"], np.concatenate([inputs()["x"]] * 2))
        assert "n" not in snapshot.models
        assert (
            "field 'max_batch_size' = 4 needs outputs whose first dim is the batch, but "
            "output 'y' has shape [2, 4] for a batch of 1" in snapshot.failures["n"]
        )

    run(tmp_path, scenario)


def test_a_graph_that_mixes_its_rows_is_batched_only_if_its_config_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_version(tmp_path, "m", 1, mixing_model())
    write_version(tmp_path, "n", 1, mixing_model())
    config(tmp_path, "n", "max_batch_size = 4\n")

    async def scenario(engine: Engine) -> None:
        models = engine.registry.snapshot.models
        assert models["m"].versions["1"].primary.model.signature.max_batch_size == 0
        assert models["n"].versions["1"].primary.model.signature.max_batch_size == 4
        rows = np.arange(8, dtype=np.float32).reshape(2, 4)
        answer = await engine.infer_async("m", {"x": rows})
        np.testing.assert_array_equal(answer["y"], np.cumsum(rows, axis=0))

    with caplog.at_level("WARNING", logger="duetime.loader"):
        run(tmp_path, scenario)
    warned = [r.getMessage() for r in caplog.records]
    assert any(
        "/m: output 'y' of a batch of 2 rows differs" in w and "unbatched" in w for w in warned
    )
    assert any("/n: output 'y'" in w and "batched anyway, as its config asks" in w for w in warned)


# -- variants --------------------------------------------------------------------------------------


def test_variants_batch_as_their_primary_and_dynamic_int8_rows_run_alone(
    tmp_path: Path, demo_repo: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An int8 variant quantized dynamically mixes its rows (each batch's scale): batched as
    its float primary, each request run on its own; served as a model of its own, unbatched
    (see test_quantized_rows_alone); a variant of a primary served unbatched is unbatched too."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    mlp = (demo_repo / "mlp" / "1" / "model.onnx").read_bytes()
    primary = write_version(tmp_path, "m", 1, mlp)
    quantize_dynamic(primary, primary.with_name("model.int8.onnx"), weight_type=QuantType.QInt8)
    config(tmp_path, "m", '[[variants]]\nname = "int8"\nfile = "model.int8.onnx"\n')
    write_version(tmp_path, "q", 1, primary.with_name("model.int8.onnx").read_bytes())
    write_version(tmp_path, "n", 1, mixing_model())
    write_version(tmp_path, "n", 1, mixing_model(), name="model.small.onnx")
    config(tmp_path, "n", '[[variants]]\nname = "small"\nfile = "model.small.onnx"\n')

    async def scenario(engine: Engine) -> None:
        models = engine.registry.snapshot.models
        m = [d.model.signature.max_batch_size for d in models["m"].versions["1"].variants]
        n = [d.model.signature.max_batch_size for d in models["n"].versions["1"].variants]
        q = models["q"].versions["1"].primary.model.signature.max_batch_size
        assert (m, n, q) == ([32, 32], [0, 0], 0)
        alone = [d.model.executor.splits_batches for d in models["m"].versions["1"].variants]
        assert alone == [False, True]
        x = np.ones((1, 40), np.float32)  # the int8 variant answers too
        assert (await engine.infer_async("m", {"x": x}, timeout=1.0))["y"].shape == (1, 3)

    with caplog.at_level("WARNING"):
        run(tmp_path, scenario)
    assert not any("variant" in r.getMessage() and "not loaded" in r.getMessage()
                   for r in caplog.records)  # fmt: skip


def test_a_tight_due_time_goes_to_the_cheaper_variant(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, heavy_model(1))
    write_version(tmp_path, "m", 1, scale_model(2), name="model.small.onnx")
    config(tmp_path, "m", '[[variants]]\nname = "small"\nfile = "model.small.onnx"\n')

    async def scenario(engine: Engine) -> None:
        version = engine.registry.snapshot.models["m"].versions["1"]
        assert [d.variant for d in version.variants] == ["default", "small"]
        assert await factor_of(engine) == 1.0  # no due time: the primary
        assert await factor_of(engine, timeout=1.0) == 1.0  # a second is plenty
        # the longest of these timeouts only the small one fits (1 ms was too tight for it
        # too, once, on a loaded machine)
        primary, small = (d.scheduler for d in version.variants)
        now = engine.clock.now_ns()
        tight = max(
            t
            for t in (0.001, 0.0015, 0.002, 0.003, 0.004)
            if small.fits(now, now + int(t * 1e9), 1, 0)
            and not primary.fits(now, now + int(t * 1e9), 1, 0)
        )
        assert await factor_of(engine, timeout=tight) == 2.0
        ticket = engine.submit(engine._request("m", inputs(), None, tight, 0, None))
        await ticket.future
        assert ticket.response().variant == "small"

    run(tmp_path, scenario)


@pytest.mark.parametrize("timeout", [None, 1.0])
def test_a_request_the_primarys_full_queue_has_no_room_for_goes_to_the_variant(
    tmp_path: Path, timeout: float | None
) -> None:
    """Probe: 12 clients sending no timeout to a 7 ms model with max_queue_size = 2 got 5,860
    429 'queue full' and no answer from its idle 0.05 ms variant."""
    write_version(tmp_path, "m", 1, heavy_model(1))
    write_version(tmp_path, "m", 1, scale_model(2), name="model.small.onnx")
    variant = '[[variants]]\nname = "small"\nfile = "model.small.onnx"\n'
    config(tmp_path, "m", "[scheduling]\nmax_queue_size = 1\n" + variant)

    async def scenario(engine: Engine) -> None:
        # (submitted in one turn of the loop: the first runs, the second waits, and no answer
        # can free the primary's queue before the third comes; the second may go to the
        # instance as its lookahead batch instead (a loaded machine's hand-off cost has the
        # scheduler take one early), and then the fourth is the one with no room)
        tickets = []
        for _ in range(4):
            tickets.append(engine.submit(engine._request("m", inputs(), None, timeout, 0, None)))
            if tickets[-1].variant == "small":
                break
        await asyncio.gather(*(t.future for t in tickets))
        variants = [t.response().variant for t in tickets]
        assert variants[-1] == "small", variants
        assert set(variants[:-1]) == {"default"}, variants
        assert len(variants) in (3, 4), variants

    run(tmp_path, scenario)


def test_while_the_cheaper_variant_turns_requests_away_the_primary_takes_none(
    tmp_path: Path,
) -> None:
    write_version(tmp_path, "m", 1, heavy_model(1))
    write_version(tmp_path, "m", 1, scale_model(2), name="model.small.onnx")
    config(tmp_path, "m", '[[variants]]\nname = "small"\nfile = "model.small.onnx"\n')

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine, timeout=1.0) == 1.0  # idle: the primary
        with pytest.raises(DuetimeError):  # due in 1 µs: nothing could meet it
            await factor_of(engine, timeout=1e-6)
        # (that refusal was the request's own doing: a client's impossible due times sent every
        # other client's requests to the cheaper variant)
        assert await factor_of(engine, timeout=1.0) == 1.0
        small = engine.registry.snapshot.models["m"].versions["1"].variants[1].scheduler
        small._refused_ns = engine.clock.now_ns()  # (as a refusal for the work ahead marks it)
        # the primary would fit, but the CPU they share is backlogged: the small one answers
        assert await factor_of(engine, timeout=1.0) == 2.0
        await asyncio.sleep(REFUSALS_SEEN_NS / 1e9 + 0.01)
        assert await factor_of(engine, timeout=1.0) == 1.0

    run(tmp_path, scenario)


def test_a_variant_with_another_signature_is_left_out(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    write_version(tmp_path, "m", 1, scale_model(1))
    x = helper.make_tensor_value_info("other", TensorProto.FLOAT, ["b", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])
    graph = helper.make_graph([helper.make_node("Identity", ["other"], ["y"])], "g", [x], [y])
    odd = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    odd.ir_version = 8
    write_version(tmp_path, "m", 1, odd.SerializeToString(), name="odd.onnx")
    config(tmp_path, "m", '[[variants]]\nname = "odd"\nfile = "odd.onnx"\n')

    async def scenario(engine: Engine) -> None:
        version = engine.registry.snapshot.models["m"].versions["1"]
        assert [d.variant for d in version.variants] == ["default"]
        assert await factor_of(engine) == 1.0
        ((state, reason),) = states(engine).values()  # (served, and the index says what not)
        assert state == "READY"
        assert "variant 'odd' not loaded" in reason

    run(tmp_path, scenario)


def test_a_variant_whose_file_is_missing_is_warned_of_by_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    write_version(tmp_path, "m", 1, scale_model(2), name="model.int8_static.onnx")  # (misspelt)
    config(tmp_path, "m", '[[variants]]\nname = "int8-static"\nfile = "model.int8-static.onnx"\n')

    async def scenario(engine: Engine) -> None:
        version = engine.registry.snapshot.models["m"].versions["1"]
        assert [d.variant for d in version.variants] == ["default"]
        assert await factor_of(engine) == 1.0
        ((state, reason),) = states(engine).values()  # (the index says so, not only the log)
        assert state == "READY"
        assert "variant 'int8-static': no file model.int8-static.onnx" in reason

    with caplog.at_level(logging.WARNING, logger="duetime.manager"):
        run(tmp_path, scenario)
    (warned,) = [r for r in caplog.records if "int8-static" in r.getMessage()]
    assert warned.levelno == logging.WARNING
    message = warned.getMessage()
    assert "variant 'int8-static'" in message
    assert f"no file model.int8-static.onnx in {tmp_path / 'm' / '1'}" in message
    assert "model.int8_static.onnx" in message  # (the files it does hold)


def test_a_load_adding_a_variant_whose_file_is_missing_serves_without_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A load request adding a variant whose file was missing failed (400) saying 'version 1
    serves without it', and the version served on as before; the same config at a first load
    served without the variant. Now such a load succeeds as a first load does: served without
    it, with a warning, the index saying so. Taking the file of a variant served now away is
    followed too (it failed the load, and the variant served from memory until a restart)."""
    path = write_version(tmp_path, "m", 1, scale_model(1))
    fast = path.with_name("model.fast.onnx")
    with_fast = ModelConfig.model_validate(
        {"variants": [{"name": "fast", "file": "model.fast.onnx"}]}
    )

    def variants(engine: Engine) -> list[str]:
        return [d.variant for d in engine.registry.snapshot.models["m"].versions["1"].variants]

    async def scenario(engine: Engine) -> None:
        with caplog.at_level(logging.WARNING, logger="duetime.manager"):
            await engine.load_model("m", config=with_fast)
        assert variants(engine) == ["default"]
        assert await factor_of(engine) == 1.0
        (state, reason) = states(engine)["1"]
        assert state == "READY"
        assert reason.startswith(f"variant 'fast': no file model.fast.onnx in {path.parent}")
        assert reason.endswith("; version 1 serves without it")
        (warned,) = [r for r in caplog.records if "'fast'" in r.getMessage()]
        assert warned.levelno == logging.WARNING
        assert warned.getMessage() == f"model m version 1: {reason}"
        write_version(tmp_path, "m", 1, scale_model(2), name=fast.name)
        await engine.load_model("m", config=with_fast)  # (the file is there now: served with)
        served = engine.registry.snapshot.models["m"].versions["1"]
        assert variants(engine) == ["default", "fast"]
        assert states(engine)["1"] == ("READY", "")
        fast.unlink()
        await engine.load_model("m", config=with_fast)
        assert engine.registry.snapshot.models["m"].versions["1"] is not served
        assert variants(engine) == ["default"]
        assert states(engine)["1"] == ("READY", reason)

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def test_a_broken_variant_file_never_replaces_a_working_version(tmp_path: Path) -> None:
    """A new file that breaks a variant would take the cheaper answers away from tight due
    times: the version served with it stays, as a version that fails to load does."""
    write_version(tmp_path, "m", 1, scale_model(1))
    small = write_version(tmp_path, "m", 1, scale_model(2), name="model.small.onnx")
    config(tmp_path, "m", '[[variants]]\nname = "small"\nfile = "model.small.onnx"\n')

    async def scenario(engine: Engine) -> None:
        served = engine.registry.snapshot.models["m"].versions["1"]
        small.write_bytes(b"not onnx")
        age(small)
        await engine.manager.poll()  # type: ignore[union-attr]
        assert engine.registry.snapshot.models["m"].versions["1"] is served
        assert [d.variant for d in served.variants] == ["default", "small"]
        (state, reason) = states(engine)["1"]
        assert state == "READY"
        assert "previous one still serves: variant 'small' not loaded" in reason

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


def test_a_variant_file_taken_away_is_followed_by_a_poll(tmp_path: Path) -> None:
    """A variant whose file is deleted is served without, as a first load of those files
    would (a broken file is not: above); before, it served from memory until a restart."""
    write_version(tmp_path, "m", 1, scale_model(1))
    small = write_version(tmp_path, "m", 1, scale_model(2), name="model.small.onnx")
    config(tmp_path, "m", '[[variants]]\nname = "small"\nfile = "model.small.onnx"\n')

    async def scenario(engine: Engine) -> None:
        served = engine.registry.snapshot.models["m"].versions["1"]
        assert [d.variant for d in served.variants] == ["default", "small"]
        small.unlink()
        await engine.manager.poll()  # type: ignore[union-attr]
        now = engine.registry.snapshot.models["m"].versions["1"]
        assert [d.variant for d in now.variants] == ["default"]
        assert await factor_of(engine) == 1.0
        (state, reason) = states(engine)["1"]
        assert state == "READY"
        assert reason.startswith("variant 'small': no file model.small.onnx in ")
        assert reason.endswith("(model files there: model.onnx); version 1 serves without it")
        write_version(tmp_path, "m", 1, scale_model(2), name=small.name)  # (back: served again)
        age(small)
        await engine.manager.poll()  # type: ignore[union-attr]
        now = engine.registry.snapshot.models["m"].versions["1"]
        assert [d.variant for d in now.variants] == ["default", "small"]
        assert states(engine)["1"] == ("READY", "")

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


def test_a_config_still_being_written_is_not_applied(tmp_path: Path) -> None:
    """Read half written, a config would be applied as it is (its traffic plan at once)."""
    two_versions(tmp_path, 'weights = { "1" = 100 }\n')

    async def scenario(engine: Engine) -> None:
        assert {await factor_of(engine) for _ in range(5)} == {1.0}
        (tmp_path / "m" / "config.toml").write_text("[version_policy]\nall = {}\n")  # (fresh)
        await engine.manager.poll()  # type: ignore[union-attr]
        assert {await factor_of(engine) for _ in range(20)} == {1.0}  # still the old plan
        age(tmp_path / "m" / "config.toml")
        await engine.manager.poll()  # type: ignore[union-attr]
        assert {await factor_of(engine) for _ in range(5)} == {2.0}  # settled: no weights

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


# -- traffic policy --------------------------------------------------------------------------------


def two_versions(repo: Path, traffic: str) -> None:
    """Model 'm' with versions 1 and 2 (answering x and 2x), both served, with this traffic."""
    for version in (1, 2):
        write_version(repo, "m", version, scale_model(version))
    config(repo, "m", f"[version_policy]\nall = {{}}\n[traffic]\n{traffic}")


def test_weights_and_sticky_keys_split_unversioned_requests(tmp_path: Path) -> None:
    two_versions(tmp_path, 'weights = { "1" = 70, "2" = 30 }\nsticky_key = "x-routing-key"\n')

    async def scenario(engine: Engine) -> None:
        seen = [await factor_of(engine) for _ in range(400)]
        share = seen.count(1.0) / len(seen)
        assert 0.6 < share < 0.8, share
        for key in ("alice", "bob", "carol", "dave"):
            first = await engine_with_key(engine, key)
            assert all([await engine_with_key(engine, key) == first for _ in range(10)])

    run(tmp_path, scenario)


async def engine_with_key(engine: Engine, key: str) -> float:
    request = engine._request("m", inputs(), None, None, 0, None)
    request.headers = {"x-routing-key": key}
    ticket = engine.submit(request)
    out = (await ticket.future)["y"]
    return float(out[0, 0] / inputs()["x"][0, 0])


def test_shadow_copies_are_compared_but_never_answer(tmp_path: Path) -> None:
    two_versions(tmp_path, 'weights = { "1" = 1 }\nshadow = { "2" = 1.0 }\n')

    async def scenario(engine: Engine) -> None:
        for _ in range(20):
            assert await factor_of(engine) == 1.0
        await asyncio.sleep(0.1)
        stats = engine.router.shadows[("m", "2")]
        assert stats.mirrored == 20
        assert stats.compared + stats.skipped == 20
        assert stats.compared > 0
        assert stats.max_abs_diff == pytest.approx(4.0)  # x = 1..4, y differs by x
        assert stats.argmax_disagreements == 0  # scaling keeps the argmax
        # a tiny model may run inline (execution "auto", when the machine measured it fast), but
        # a shadow runs only on a background thread
        versions = engine.registry.snapshot.models["m"].versions
        assert not versions["2"].primary.model.executor.inline

    run(tmp_path, scenario)


def test_a_shadow_copy_owns_its_inputs_when_the_caller_owns_the_arrays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, the caller's arrays are theirs again once the answer is back; a shadow copy
    still queued then ran on whatever the caller had written into them since."""
    two_versions(tmp_path, 'weights = { "1" = 1 }\nshadow = { "2" = 1.0 }\n')

    async def scenario(engine: Engine) -> None:
        shadow = engine.registry.snapshot.models["m"].versions["2"].primary.scheduler
        taken: list[np.ndarray] = []
        submit = shadow.submit_shadow

        def capture(feeds: dict[str, np.ndarray], **kwargs: Any) -> Any:
            taken.extend(feeds.values())
            return submit(feeds, **kwargs)

        monkeypatch.setattr(shadow, "submit_shadow", capture)
        x = inputs()["x"]
        await engine.infer_async("m", {"x": x})
        assert taken
        assert not any(np.shares_memory(feed, x) for feed in taken)

    run(tmp_path, scenario)


def test_a_shadow_answering_other_outputs_is_counted_mismatched_not_in_agreement(
    tmp_path: Path,
) -> None:
    from onnx import TensorProto, helper

    write_version(tmp_path, "m", 1, scale_model(1))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["b", 4])
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["z"])], "g", [x], [z])
    renamed = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    renamed.ir_version = 8
    write_version(tmp_path, "m", 2, renamed.SerializeToString())
    config(tmp_path, "m", '[version_policy]\nall = {}\n[traffic]\nweights = { "1" = 1 }\n'
           'shadow = { "2" = 1.0 }\n')  # fmt: skip

    async def scenario(engine: Engine) -> None:
        for _ in range(10):
            assert await factor_of(engine) == 1.0
        await asyncio.sleep(0.1)
        stats = engine.router.shadows[("m", "2")]
        assert stats.mismatched + stats.skipped == 10
        assert stats.mismatched > 0
        assert (stats.compared, stats.max_abs_diff) == (0, 0.0)

    run(tmp_path, scenario)


def test_traffic_naming_versions_not_served_is_warned_of_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    config(tmp_path, "m", '[traffic]\nweights = { "01" = 50, "7" = 50 }\n')

    async def scenario(engine: Engine) -> None:
        assert {await factor_of(engine) for _ in range(5)} == {1.0}  # ("01" is version 1)
        await engine.manager.poll()  # type: ignore[union-attr]
        await engine.manager.poll()  # type: ignore[union-attr]

    with caplog.at_level(logging.WARNING, logger="duetime.manager"):
        run(tmp_path, scenario, control_mode="poll", poll_s=3600)
    warned = [r.getMessage() for r in caplog.records if "[traffic] weights" in r.getMessage()]
    assert len(warned) == 1
    assert "names version(s) 7, not served (version_policy serves 1)" in warned[0]


def test_a_configs_warnings_are_said_once_per_content_not_at_every_poll(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    pbtxt = tmp_path / "m" / "config.pbtxt"
    pbtxt.write_text('backend: "onnxruntime"\nmodel_warmup { name: "w" }\n')
    age(pbtxt)

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if "Triton-only" in r.getMessage()]

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        for _ in range(3):
            await manager.poll()
        assert len(warned()) == 1
        assert "model_warmup" in warned()[0]
        pbtxt.write_text('backend: "onnxruntime"\nmodel_warmup { name: "w2" }\n')  # (changed)
        age(pbtxt)
        for _ in range(3):
            await manager.poll()
        assert len(warned()) == 2

    with caplog.at_level(logging.WARNING, logger="duetime.config"):
        run(tmp_path, scenario, control_mode="poll", poll_s=3600)


# -- lazy loading and the budget -------------------------------------------------------------------


@pytest.mark.usefixtures("evict_at_once")
def test_lazy_loading_and_the_loaded_model_budget(tmp_path: Path) -> None:
    for name, factor in (("a", 1), ("b", 2)):
        write_version(tmp_path, name, 1, scale_model(factor))

    async def scenario(engine: Engine) -> None:
        assert list(engine.registry.snapshot.models) == []
        assert await factor_of(engine, "a") == 1.0
        assert await factor_of(engine, "b") == 2.0  # 'a' is idle: unloaded to make room
        assert list(engine.registry.snapshot.models) == ["b"]
        await asyncio.sleep(0.1)
        state, reason = states(engine, "a")["1"]
        assert state == "UNAVAILABLE"
        assert "make room for 'b' (max_loaded_models)" in reason
        with pytest.raises(ModelUnavailable) as loading:
            await factor_of(engine, "a", timeout=1e-6)
        # (Triton's words and a Retry-After, as a first load's refusal; "due in -0 ms" before)
        assert loading.value.message.startswith(
            "Request for unknown model: 'a' has no available versions: it is loading (a load "
            "takes about "
        )
        assert "the request is already due; retry shortly" in loading.value.message
        assert loading.value.retry_after_s is not None
        assert loading.value.retry_after_s >= 1
        await asyncio.sleep(0.5)
        with pytest.raises(ModelNotFound):
            await factor_of(engine, "missing")

    run(tmp_path, scenario, lazy=True, max_loaded_models=1)


def test_first_requests_for_several_models_at_once_keep_to_the_budget(tmp_path: Path) -> None:
    """Each load counts from its start: four first requests at once, under a budget of two,
    loaded all four (each load saw no model loaded yet). Two load; the others are refused."""
    for factor in range(1, 5):
        write_version(tmp_path, f"m{factor}", 1, scale_model(factor))

    async def scenario(engine: Engine) -> None:
        results = await asyncio.gather(
            *(factor_of(engine, f"m{factor}") for factor in range(1, 5)), return_exceptions=True
        )
        answered = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, ModelUnavailable)]
        assert len(answered) + len(refused) == 4, results
        assert 1 <= len(answered) <= 2, results
        assert all("max_loaded_models budget is full" in str(r) for r in refused)
        # (in Triton's words for a request, with a Retry-After: it passes; found by a tester)
        for error in refused:
            assert error.message.startswith(  # type: ignore[attr-defined]
                "Request for unknown model: 'm"
            )
            assert " has no available versions: failed to load 'm" in str(error)
            assert error.retry_after_s == 1.0  # type: ignore[attr-defined]
        assert len(engine.registry.snapshot.models) <= 2

    run(tmp_path, scenario, lazy=True, max_loaded_models=2)


@pytest.mark.parametrize("lazy", [False, True])
def test_a_model_bigger_than_the_whole_byte_budget_is_refused_for_good(
    tmp_path: Path, lazy: bool
) -> None:
    """Found by a tester: with nothing loaded, it was refused 503 "the budget is full and
    every loaded model is busy ... retry later", and clients retried forever."""
    write_version(tmp_path, "big", 1, heavy_model(1))
    write_version(tmp_path, "small", 1, scale_model(2))
    size = (tmp_path / "big" / "1" / "model.onnx").stat().st_size

    async def scenario(engine: Engine) -> None:
        refused: pytest.ExceptionInfo[DuetimeError]
        if lazy:
            with pytest.raises(ModelUnavailable) as refused:
                await factor_of(engine, "big")
        else:  # (400 to a load request, as Triton's for a load its files rule out)
            with pytest.raises(InvalidInput) as refused:
                await engine.load_model("big")
        message = refused.value.message
        assert f"its files take {size} bytes" in message
        assert f"more than the whole max_loaded_bytes budget ({size // 2}): it can never " in (
            message
        )
        assert "busy" not in message
        rows = [row for row in engine.repository_index() if row["name"] == "big"]
        assert any("can never load" in row.get("reason", "") for row in rows), rows
        if not lazy:
            await engine.load_model("small")
        assert await factor_of(engine, "small") == 2.0

    options = {"lazy": True} if lazy else {"control_mode": "explicit"}
    run(tmp_path, scenario, max_loaded_bytes=size // 2, **options)  # type: ignore[arg-type]


def test_a_reload_past_the_whole_byte_budget_is_refused_and_the_model_serves_on(
    tmp_path: Path,
) -> None:
    """Found by a tester: a reload to two instances (its bytes counted twice) took the model
    past the budget for good, where a load of the same files is refused."""
    write_version(tmp_path, "m", 1, heavy_model(1))
    size = (tmp_path / "m" / "1" / "model.onnx").stat().st_size

    async def scenario(engine: Engine) -> None:
        await engine.load_model("m")
        config(tmp_path, "m", 'instances = 2\nexecution = "thread"\n')
        with pytest.raises(InvalidInput, match=r"can never load; raise the budget"):
            await engine.load_model("m")
        assert await factor_of(engine, "m") == 1.0
        served = engine.registry.snapshot.models["m"].versions["1"].primary.model
        assert served.config.instances == 1  # (the old load serves on)

    run(tmp_path, scenario, control_mode="explicit", max_loaded_bytes=int(size * 1.5))


def test_lazy_loading_in_explicit_mode_is_said_to_be_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        with pytest.raises(ModelNotFound):
            await factor_of(engine)

    with caplog.at_level(logging.WARNING, logger="duetime"):
        run(tmp_path, scenario, lazy=True, control_mode="explicit")
    assert "lazy=True is ignored: with control_mode='explicit'" in caplog.text


def test_a_failed_lazy_load_is_retried_by_a_later_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lazy load that failed (files still being written, a broken file since fixed) refused
    the model until a restart."""
    monkeypatch.setattr(manager_module, "LAZY_RETRY_S", 0.3)
    loads = loads_counted(monkeypatch)

    async def scenario(engine: Engine) -> None:
        fresh = write_version(tmp_path, "m", 1, scale_model(1), aged=False)  # after the start
        with pytest.raises(ModelUnavailable, match="files are still changing"):
            await factor_of(engine)
        age(fresh)  # (files still changing are no failure: the next request loads them)
        assert await factor_of(engine) == 1.0
        broken = write_version(tmp_path, "n", 1, b"not an onnx model")
        for _ in range(3):
            with pytest.raises(ModelUnavailable, match="ONNX Runtime cannot load it"):
                await factor_of(engine, "n")
        await asyncio.sleep(0.35)
        with pytest.raises(ModelUnavailable, match="ONNX Runtime cannot load it"):
            await factor_of(engine, "n")  # a retry, but the file is unchanged: no new load
        assert loads == ["m/1", "n/1"]
        write_version(tmp_path, "n", 1, scale_model(2))
        age(broken, seconds=30)
        await asyncio.sleep(0.35)
        assert await factor_of(engine, "n") == 2.0

    run(tmp_path, scenario, lazy=True, stable_s=30.0)


def test_lazy_files_present_at_start_are_taken_as_they_are(tmp_path: Path) -> None:
    """As at start in the other modes; a first request waited for them to settle."""
    age(write_version(tmp_path, "m", 1, scale_model(1), aged=False), seconds=1.0)

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 1.0

    run(tmp_path, scenario, lazy=True, stable_s=30.0)


def test_lazy_poll_loads_a_failed_model_once_its_file_is_fixed(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, b"not an onnx model")

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        with pytest.raises(ModelUnavailable, match="ONNX Runtime cannot load it"):
            await factor_of(engine)
        write_version(tmp_path, "m", 1, scale_model(4))
        write_version(tmp_path, "idle", 1, scale_model(5))
        await manager.poll()
        assert list(engine.registry.snapshot.models) == ["m"]  # no request: 'idle' waits
        assert await factor_of(engine) == 4.0

    run(tmp_path, scenario, lazy=True, control_mode="poll", poll_s=3600)


def test_a_lazy_request_for_a_version_not_served_fails_at_once(tmp_path: Path) -> None:
    for version in (1, 2):
        write_version(tmp_path, "m", version, scale_model(version))

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 2.0
        with pytest.raises(ModelNotFound, match="'m' version 1 is not found"):
            await asyncio.wait_for(factor_of(engine, version="1"), 5.0)

    run(tmp_path, scenario, lazy=True)


def test_byte_budget_refuses_a_model_when_all_are_busy(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_version(tmp_path, name, 1, heavy_model(1))
    size = (tmp_path / "a" / "1" / "model.onnx").stat().st_size

    async def scenario(engine: Engine) -> None:
        busy = [asyncio.ensure_future(factor_of(engine, "a")) for _ in range(1)]
        await asyncio.sleep(0)
        assert await busy[0] == 1.0
        assert list(engine.registry.snapshot.models) == ["a"]
        results = await asyncio.gather(
            *[factor_of(engine, "a") for _ in range(20)], factor_of(engine, "b"),
            return_exceptions=True,
        )  # fmt: skip
        last = results[-1]
        assert last == 1.0 or isinstance(last, ModelUnavailable), last

    run(tmp_path, scenario, lazy=True, max_loaded_bytes=int(size * 1.5))


def test_engine_answers_are_arrays(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(2))

    async def scenario(engine: Engine) -> None:
        out = await engine.infer_async("m", inputs(3))
        np.testing.assert_array_equal(out["y"], 2 * inputs(3)["x"])

    run(tmp_path, scenario)


def test_shadow_statistics_sit_on_the_shadow_version(tmp_path: Path) -> None:
    from duetime.statistics import statistics_json

    two_versions(tmp_path, 'weights = { "1" = 1 }\nshadow = { "2" = 1.0 }\n')

    async def scenario(engine: Engine) -> None:
        for _ in range(5):
            await factor_of(engine)
        await asyncio.sleep(0.1)
        doc = statistics_json(engine.registry.snapshot, "m", None, engine.router.shadows)
        by_version = {e["version"]: e for e in doc["model_stats"]}
        assert "shadow" not in by_version["1"]["duetime"]
        assert by_version["2"]["duetime"]["shadow"]["mirrored"] == 5
        assert by_version["1"]["inference_count"] == 5

    run(tmp_path, scenario)


def test_poll_unloads_a_model_whose_last_version_folder_is_removed(tmp_path: Path) -> None:
    """Version 2 removed, then version 1: version 1 answered from memory for good (READY in the
    index beside a model row saying no version folder is left), though what serves follows the
    folders, as when one version among others goes."""
    import shutil

    write_version(tmp_path, "m", 1, scale_model(1))
    write_version(tmp_path, "m", 2, scale_model(2))
    config(tmp_path, "m", "[version_policy]\nall = {}\n")

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        shutil.rmtree(tmp_path / "m" / "2")
        await manager.poll()
        assert await factor_of(engine) == 1.0
        shutil.rmtree(tmp_path / "m" / "1")
        await manager.poll()
        with pytest.raises(DuetimeError):
            await factor_of(engine)
        rows = [e for e in engine.repository_index() if e["name"] == "m"]
        assert not [r for r in rows if r.get("state") == "READY"], rows
        assert any("no version folder holds a model.onnx" in r.get("reason", "") for r in rows)
        write_version(tmp_path, "m", 3, scale_model(3))  # a version again: served again
        await manager.poll()
        assert await factor_of(engine) == 3.0

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


def test_poll_of_a_repository_that_cannot_be_read_keeps_serving_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The repository folder removed (a network mount gone): every poll logged a traceback.
    Now one error, what serves goes on serving, and polling resumes once it is back."""
    repo = tmp_path / "repo"
    write_version(repo, "m", 1, scale_model(1))
    moved = tmp_path / "moved"

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        repo.rename(moved)
        with caplog.at_level(logging.INFO, logger="duetime.manager"):
            for _ in range(3):
                await manager.poll()
            assert await factor_of(engine) == 1.0
            errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert len(errors) == 1, errors
            assert "cannot be read" in errors[0].getMessage()
            assert str(repo) in errors[0].getMessage()
            assert errors[0].exc_info is None  # (no traceback)
            moved.rename(repo)
            write_version(repo, "m", 2, scale_model(2))
            await manager.poll()
            assert await factor_of(engine) == 2.0
            assert any("can be read again" in r.getMessage() for r in caplog.records)

    run(repo, scenario, control_mode="poll", poll_s=3600)


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_without_lazy_loading_the_budget_loads_what_fits_and_unloads_none(
    tmp_path: Path, mode: str
) -> None:
    """Mode none with --max-loaded-models 1 loaded all three models and unloaded two to make
    room: they answered 404 for good, without a word, as nothing loads them again (and each
    poll would load one back, unloading another). Now the first fits; the others are refused,
    the index saying why."""
    for name, factor in (("a", 1), ("b", 2), ("c", 3)):
        write_version(tmp_path, name, 1, scale_model(factor))

    async def scenario(engine: Engine) -> None:
        if mode == "poll":
            await engine.manager.poll()  # type: ignore[union-attr]
        assert list(engine.registry.snapshot.models) == ["a"]
        assert await factor_of(engine, "a") == 1.0
        for name in ("b", "c"):
            with pytest.raises(DuetimeError):
                await factor_of(engine, name)
            reasons = [e.get("reason", "") for e in engine.repository_index() if e["name"] == name]
            assert any("max_loaded_models budget is full" in r for r in reasons), reasons
            assert any("add --lazy-load" in r for r in reasons), reasons

    run(tmp_path, scenario, control_mode=mode, poll_s=3600, max_loaded_models=1)


@pytest.mark.parametrize(
    ("variable", "named"), [(None, "--load-model n"), ("n", "(DUETIME_LOAD_MODEL) n")]
)
def test_a_server_s_startup_models_outside_explicit_mode_are_named_as_given(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    variable: str | None,
    named: str,
) -> None:
    """A server's warning named the flag alone for models DUETIME_LOAD_MODEL gave (found by a
    tester)."""
    write_version(tmp_path, "n", 1, scale_model(2))
    if variable is not None:
        monkeypatch.setenv("DUETIME_LOAD_MODEL", variable)
    else:
        monkeypatch.delenv("DUETIME_LOAD_MODEL", raising=False)

    async def main() -> None:
        engine = Engine(options=manager_module.RepositoryOptions(startup_models=("n",)))
        try:
            await engine.load_repository(tmp_path)
        finally:
            await engine.aclose()

    with caplog.at_level("WARNING", logger="duetime.manager"):
        asyncio.run(main())
    assert any(f"{named} is ignored" in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]
