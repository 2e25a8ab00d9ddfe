"""Loads end consistently: a load whose caller gives up runs to its end, a failed load unloads
no model to make room, and a request waiting for an on-demand load is failed at its due time.

Each test runs its scenario under `asyncio.run` against a repository written into tmp_path; a
load is held in the loader thread on a `threading.Event`, so no test depends on how long a real
load takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from repo_models import (
    Scenario,
    factor_of,
    heavy_model,
    inputs,
    run_on_engine,
    scale_model,
    write_version,
)

from duetime.config import ModelConfig
from duetime.engine import Engine
from duetime.errors import DeadlineExceeded, InvalidInput, ModelUnavailable
from duetime.repository import manager as manager_module
from duetime.repository.manager import RepositoryOptions


def run(repo: Path, scenario: Scenario, **options: Any) -> None:
    run_on_engine(repo, scenario, limit_s=20, **options)


class Gate:
    """Holds the loads of one model in the loader thread until `open()`."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.entered = threading.Event()
        self._open = threading.Event()

    def patch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        load = manager_module._load_with_variants

        def held(source: Any, version: int, config: ModelConfig) -> Any:
            if source.name == self.model:
                self.entered.set()
                assert self._open.wait(10), "the test never opened the gate"
            return load(source, version, config)

        monkeypatch.setattr(manager_module, "_load_with_variants", held)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 10), "the load never started"

    def open(self) -> None:
        self._open.set()


@contextlib.contextmanager
def opened(gate: Gate) -> Iterator[Gate]:
    try:
        yield gate
    finally:
        gate.open()  # (a failing test must not leave the loader thread waiting)


def states(engine: Engine, model: str = "m") -> dict[str, str]:
    return {
        e["version"]: e["state"]
        for e in engine.repository_index()
        if e["name"] == model and "version" in e
    }


async def loads_ended(engine: Engine) -> None:
    assert engine.manager is not None
    loads = getattr(engine.manager, "_loads", ())  # (none before loads had tasks of their own)
    await asyncio.gather(*loads, return_exceptions=True)


def test_a_load_whose_caller_gives_up_runs_to_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gRPC client's deadline cancelled its load half-way: the index said LOADING for good
    and hid version 2, still serving, and the next plain load served the cancelled upload."""
    write_version(tmp_path, "m", 1, scale_model(1.0))
    write_version(tmp_path, "m", 2, scale_model(2.0))
    gate = Gate("m")
    config = ModelConfig.model_validate({"version_policy": {"specific": {"versions": [3]}}})

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 2.0
        gate.patch(monkeypatch)
        with opened(gate):
            upload = {"3/model.onnx": scale_model(3.0)}
            caller = asyncio.ensure_future(engine.load_model("m", config, upload))
            await gate.wait_entered()
            caller.cancel()  # (the caller gives up while the version loads)
            with contextlib.suppress(asyncio.CancelledError):
                await caller
            assert await factor_of(engine) == 2.0  # (what served serves on meanwhile)
        await loads_ended(engine)
        assert "LOADING" not in states(engine).values()
        assert states(engine)["3"] == "READY"
        assert await factor_of(engine) == 3.0  # (the load ended as asked)

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",), stable_s=0.0)


def test_a_load_under_way_at_close_is_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`aclose` ends a load its caller left running; its upload's folder is removed."""
    write_version(tmp_path, "m", 1, scale_model(1.0))
    gate = Gate("m")
    config = ModelConfig.model_validate({"version_policy": {"specific": {"versions": [3]}}})
    uploads: list[Path] = []

    async def main() -> None:
        engine = await Engine.start(
            tmp_path, options=RepositoryOptions(control_mode="explicit", stable_s=0.0)
        )
        assert engine.manager is not None
        gate.patch(monkeypatch)
        with opened(gate):
            caller = asyncio.ensure_future(
                engine.load_model("m", config, {"3/model.onnx": scale_model(3.0)})
            )
            await gate.wait_entered()
            uploads.append(engine.manager._uploads["m"])
            caller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await caller
            closing = asyncio.ensure_future(engine.aclose())
            await asyncio.sleep(0)  # (aclose cancels the load before the loader lets it go)
        await closing
        assert "m" not in engine.manager._uploads
        assert "LOADING" not in states(engine).values()

    asyncio.run(main())
    # (a load ORT was still running when it ended may save its graph into the folder: it is
    # removed again once the loader thread ends)
    deadline = time.monotonic() + 10
    while uploads[0].exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not uploads[0].exists()


def test_a_model_under_steady_traffic_is_not_unloaded_to_make_room(tmp_path: Path) -> None:
    """Found by a tester: idle meant nothing queued or running at that instant, so a model
    answering thousands of requests a second was unloaded between two of them (its clients
    got 404s by the thousand), where a load a second before had been refused."""
    write_version(tmp_path, "a", 1, scale_model(1.0))
    write_version(tmp_path, "b", 1, scale_model(2.0))

    async def scenario(engine: Engine) -> None:
        stop = asyncio.Event()

        async def traffic() -> None:
            while not stop.is_set():
                assert await factor_of(engine, "a") == 1.0
                await asyncio.sleep(0.002)

        sending = asyncio.ensure_future(traffic())
        try:
            for _ in range(5):
                await asyncio.sleep(0.01)
                with pytest.raises(ModelUnavailable, match="every loaded model is busy"):
                    await engine.load_model("b")
                assert set(engine.registry.snapshot.models) == {"a"}
        finally:
            stop.set()
            await sending
        await asyncio.sleep(manager_module.EVICT_QUIET_S + 0.05)
        await engine.load_model("b")  # (quiet long enough: a goes)
        assert set(engine.registry.snapshot.models) == {"b"}

    run(
        tmp_path, scenario, control_mode="explicit", startup_models=("a",),
        max_loaded_models=1, stable_s=0.0,
    )  # fmt: skip


@pytest.mark.usefixtures("evict_at_once")
def test_a_failed_load_unloads_no_model_to_make_room(tmp_path: Path) -> None:
    """Under a budget of one model, an explicit load of a broken model answered 400 yet first
    unloaded the model that served, which stayed unloaded."""
    write_version(tmp_path, "a", 1, scale_model(1.0))
    write_version(tmp_path, "b", 1, b"this is not an onnx model")
    write_version(tmp_path, "c", 1, scale_model(3.0))

    async def scenario(engine: Engine) -> None:
        with pytest.raises(InvalidInput):
            await engine.load_model("b")
        assert await factor_of(engine, "a") == 1.0  # (the failed load changed nothing served)
        assert set(engine.registry.snapshot.models) == {"a"}
        await engine.load_model("c")  # (a load that succeeds still makes room)
        assert set(engine.registry.snapshot.models) == {"c"}
        reasons = [e.get("reason", "") for e in engine.repository_index() if e["name"] == "a"]
        assert any("make room for 'c' (max_loaded_models)" in r for r in reasons)

    run(
        tmp_path, scenario, control_mode="explicit", startup_models=("a",),
        max_loaded_models=1, stable_s=0.0,
    )  # fmt: skip


@pytest.mark.usefixtures("evict_at_once")
def test_the_model_unloaded_to_make_room_is_chosen_when_the_new_one_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chosen when the load began, the least recently used model was unloaded when it ended
    though it had taken traffic meanwhile (404s), while one idle all along stayed."""
    write_version(tmp_path, "a", 1, scale_model(1.0))
    write_version(tmp_path, "b", 1, scale_model(2.0))
    write_version(tmp_path, "c", 1, scale_model(3.0))
    gate = Gate("c")
    gate.patch(monkeypatch)

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine, "a") == 1.0
        assert await factor_of(engine, "b") == 2.0  # (a is the least recently used now)
        with opened(gate):
            load = asyncio.ensure_future(engine.load_model("c"))
            await gate.wait_entered()
            assert await factor_of(engine, "a") == 1.0  # (b is, from here on)
        await load
        assert set(engine.registry.snapshot.models) == {"a", "c"}

    run(
        tmp_path, scenario, control_mode="explicit", startup_models=("a", "b"),
        max_loaded_models=2, stable_s=0.0,
    )  # fmt: skip


@pytest.mark.usefixtures("evict_at_once")
def test_a_model_unloaded_during_the_load_leaves_room_unloading_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The choice made when the new model served took as many models as planned: with the one
    planned already unloaded, another went too (404s), though two fit a budget of two."""
    for name, factor in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
        write_version(tmp_path, name, 1, scale_model(factor))
    gate = Gate("c")
    gate.patch(monkeypatch)

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine, "a") == 1.0
        assert await factor_of(engine, "b") == 2.0
        with opened(gate):
            load = asyncio.ensure_future(engine.load_model("c"))
            await gate.wait_entered()
            await engine.unload_model("a")
            assert await factor_of(engine, "b") == 2.0
        await load
        assert set(engine.registry.snapshot.models) == {"b", "c"}

    run(
        tmp_path, scenario, control_mode="explicit", startup_models=("a", "b"),
        max_loaded_models=2, stable_s=0.0,
    )  # fmt: skip


@pytest.mark.usefixtures("evict_at_once")
def test_a_byte_budget_holds_once_the_new_model_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chosen again by count, a small model went for a big one's room: the models loaded then
    stayed over the byte budget (208,400 bytes in 150,000)."""
    write_version(tmp_path, "big", 1, heavy_model(1.0, width=128, depth=4))
    write_version(tmp_path, "small", 1, scale_model(2.0))
    write_version(tmp_path, "new", 1, heavy_model(3.0, width=128, depth=4))
    big = (tmp_path / "big" / "1" / "model.onnx").stat().st_size
    gate = Gate("new")
    gate.patch(monkeypatch)

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        await engine.infer_async("big", inputs())
        assert await factor_of(engine, "small") == 2.0  # (big is the least recently used)
        with opened(gate):
            load = asyncio.ensure_future(engine.load_model("new"))
            await gate.wait_entered()
            await engine.infer_async("big", inputs())  # (small is, from here on)
        await load
        loaded = set(engine.registry.snapshot.models)
        assert "new" in loaded
        assert sum(manager._bytes[n] for n in loaded) <= big * 3 // 2

    run(
        tmp_path, scenario, control_mode="explicit", startup_models=("big", "small"),
        max_loaded_bytes=big * 3 // 2, stable_s=0.0,
    )  # fmt: skip


def test_a_request_waiting_for_a_lazy_load_fails_at_its_due_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request due before a lazy load ended was answered 504 only once the load ended
    (due in 1.2 s, answered at 2.95 s; 33 s under load). It fails at its due time; the load
    goes on, for the requests after it."""
    write_version(tmp_path, "m", 1, scale_model(2.0))
    gate = Gate("m")
    gate.patch(monkeypatch)

    async def scenario(engine: Engine) -> None:
        assert engine.manager is not None
        engine.manager._load_s["m"] = 0.001  # (the estimate lets a 0.2 s request wait)
        with opened(gate):
            with pytest.raises(DeadlineExceeded, match="still loading"):
                await engine.infer_async("m", inputs(), timeout=0.2)
            assert not gate._open.is_set()  # (failed while the load was still held)
        await loads_ended(engine)
        assert await factor_of(engine) == 2.0

    run(tmp_path, scenario, lazy=True, stable_s=0.0)
