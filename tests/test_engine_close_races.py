"""An engine's close meeting other work: awaited on another loop, awaited twice, during a load,
and with a version still draining after an unload.

The requests in flight run a Loop that never ends unless stopped (`loop_model`, FOREVER
iterations); the close stops it. No test waits on a clock: each waits on the engine's calls
(or a load held on a `Gate`), with generous limits only so that a hang fails."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from repo_models import scale_model, write_version

from duetime import Engine, ModelUnavailable
from duetime.repository.manager import RepositoryOptions
from tests.repository.test_load_ends import Gate, opened
from tests.test_engine_lifecycle import loop_repo
from tests.unit.test_executor_close import FOREVER

pytestmark = pytest.mark.timeout(120)

HANG_S = 60.0
"""How long a test waits for what should come at once before it fails as hung."""

CLOSED_WORDS = "the engine closed before answering"


def endless() -> dict[str, np.ndarray]:
    """The inputs of a run of 'loop' that ends only when the close stops it."""
    return {"n": np.array([FOREVER], np.int64), "x": np.zeros(1, np.float32)}


def instance_threads(model: str) -> list[str]:
    """The instance threads of `model` still alive (`duetime-<model>-<version>-i<n>`)."""
    prefix = f"duetime-{model}-"
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


def outcomes(requests: list[asyncio.Task[Any]]) -> list[str]:
    """How each request ended: its error's message, or "answered"."""
    said = []
    for request in requests:
        error = request.exception()
        said.append("answered" if error is None else str(error))
    return said


def test_aclose_on_another_loop_than_a_started_engines_is_refused_and_changes_nothing(
    mlp_repo: Path,
) -> None:
    """It closed what was idle on the wrong loop and, with requests in flight, failed half-way
    ("The future belongs to a different loop") with the registry cleared: the close on the
    engine's own loop then found nothing to close, and the instances ran on."""
    loop = asyncio.new_event_loop()
    try:
        engine = loop.run_until_complete(Engine.start(mlp_repo))
        with pytest.raises(RuntimeError, match="runs on the loop that started it"):
            asyncio.run(engine.aclose())
        assert engine.ready
        x = {"x": np.zeros((1, 40), np.float32)}
        assert loop.run_until_complete(engine.infer_async("mlp", x))["y"].shape[0] == 1
        loop.run_until_complete(engine.aclose())
        assert not engine.ready
    finally:
        loop.close()


def test_aclose_on_another_loop_closes_an_open_engine(tmp_path: Path) -> None:
    """With a request in flight it raised "The future belongs to a different loop" after the
    registry was cleared; close() then found nothing, and the instance threads ran on. It is
    handed over as close() (with its grace): the request is answered, the engine closed."""
    engine = Engine.open(loop_repo(tmp_path))

    async def close_from_here() -> list[str]:
        request = asyncio.ensure_future(engine.infer_async("loop", endless(), timeout=None))
        await asyncio.sleep(0)  # (its first step hands it to the engine's loop, ahead of the close)
        await asyncio.wait_for(engine.aclose(grace_s=0.0), HANG_S)
        await asyncio.wait_for(asyncio.wait([request]), HANG_S)
        return outcomes([request])

    said = asyncio.run(close_from_here())
    assert said == [f"model 'loop': {CLOSED_WORDS}; open a new one"]
    assert engine._thread is not None
    assert not engine._thread.is_alive()
    assert instance_threads("loop") == []
    with pytest.raises(ModelUnavailable, match="the engine is closed"):
        engine.infer("loop", endless())
    engine.close()  # (closed: does nothing)


def test_a_second_aclose_waits_until_the_engine_is_closed(tmp_path: Path) -> None:
    """The second returned at once, the first still draining: its request unanswered and the
    model's instance thread running, as close() once did (a second close() waits now)."""
    ended: list[str] = []

    async def main() -> None:
        engine = await Engine.start(loop_repo(tmp_path))
        request = asyncio.ensure_future(engine.infer_async("loop", endless(), timeout=None))
        await asyncio.sleep(0)  # (queued, and running on its instance)
        assert instance_threads("loop") != []

        async def closer(name: str) -> None:
            await engine.aclose(grace_s=0.0)
            ended.append(name)
            assert instance_threads("loop") == [], f"the {name} aclose returned before the end"

        await asyncio.wait_for(asyncio.gather(closer("first"), closer("second")), HANG_S)
        await asyncio.wait_for(asyncio.wait([request]), HANG_S)
        assert outcomes([request]) == [f"model 'loop': {CLOSED_WORDS}; start a new one"]
        await engine.aclose()  # (closed: returns at once)

    asyncio.run(main())
    assert ended == ["first", "second"]


def test_aclose_bounds_the_drain_of_an_unloaded_version_by_its_grace(tmp_path: Path) -> None:
    """After unload_model, aclose(grace_s) waited for the unloaded version's whole drain,
    bounded by drain_s alone (here an hour: it hung); requests still queued at the end of the
    grace fail as they do without the unload, and the instances stop."""
    options = RepositoryOptions(control_mode="explicit", startup_models=("loop",), drain_s=3600.0)

    async def main() -> list[str]:
        engine = await Engine.start(loop_repo(tmp_path), options=options)
        requests = [
            asyncio.ensure_future(engine.infer_async("loop", endless(), timeout=None))
            for _ in range(3)
        ]
        await asyncio.sleep(0)  # (one runs, two wait behind it)
        await engine.unload_model("loop")
        await asyncio.wait_for(engine.aclose(grace_s=0.0), HANG_S)
        assert instance_threads("loop") == []
        await asyncio.wait_for(asyncio.wait(requests), HANG_S)
        return outcomes(requests)

    said = asyncio.run(main())
    assert said == [f"model 'loop': {CLOSED_WORDS}; start a new one"] * 3


@contextlib.asynccontextmanager
async def load_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Engine, asyncio.Future[None]]]:
    """An `Engine.start()` engine (explicit mode) and its load of model 'm', held in the
    loader (the gate entered) until the block ends."""
    write_version(tmp_path, "m", 1, scale_model(2.0))
    gate = Gate("m")
    gate.patch(monkeypatch)
    options = RepositoryOptions(control_mode="explicit", stable_s=0.0)
    engine = await Engine.start(tmp_path, options=options)
    with opened(gate):
        load = asyncio.ensure_future(engine.load_model("m"))
        await gate.wait_entered()
        yield engine, load


def test_a_load_aclose_ends_is_refused_as_the_engine_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its caller, whose task nobody cancelled, got a bare CancelledError (an open() engine's
    load_model_blocking got ModelUnavailable)."""

    async def main() -> None:
        async with load_held(tmp_path, monkeypatch) as (engine, load):
            await asyncio.wait_for(engine.aclose(), HANG_S)
            with pytest.raises(ModelUnavailable) as refused:
                await asyncio.wait_for(load, HANG_S)
        assert refused.value.message == (
            f"the load of model 'm' did not finish: {CLOSED_WORDS}; start a new one"
        )

    asyncio.run(main())


def test_a_load_whose_caller_is_cancelled_as_aclose_begins_ends_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller's own cancellation is not taken for the close's: it goes on up as it came."""

    async def main() -> None:
        async with load_held(tmp_path, monkeypatch) as (engine, load):
            closing = asyncio.ensure_future(engine.aclose())
            load.cancel()  # (its task sees the close begun as it is cancelled)
            await asyncio.wait_for(asyncio.wait([load, closing]), HANG_S)
        assert load.cancelled()
        assert closing.exception() is None

    asyncio.run(main())


def test_a_load_aclose_ends_on_an_open_engine_is_refused_as_the_engine_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load_model` awaited on another loop than an open() engine's, which the close ends."""
    write_version(tmp_path, "m", 1, scale_model(2.0))
    gate = Gate("m")
    gate.patch(monkeypatch)
    engine = Engine.open(tmp_path, options=RepositoryOptions(control_mode="explicit", stable_s=0.0))

    async def main() -> None:
        with opened(gate):
            load = asyncio.ensure_future(engine.load_model("m"))
            await gate.wait_entered()
            await asyncio.wait_for(engine.aclose(), HANG_S)
            with pytest.raises(ModelUnavailable, match=CLOSED_WORDS):
                await asyncio.wait_for(load, HANG_S)

    asyncio.run(main())


def test_a_load_the_close_abandons_stops_at_its_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a tester: close() returned, but the load it cancelled went on warming up and
    profiling for seconds (a model nobody would serve), and held the process's exit as long."""
    from repo_models import heavy_model

    from duetime.repository import loader as loader_module

    real = loader_module.measure_profile
    profiling = threading.Event()

    def long_profile(*args: Any, **kwargs: Any) -> Any:
        profiling.set()
        return real(*args[:3], 60.0, **kwargs)  # (a minute of runs, unless abandoned)

    monkeypatch.setattr(loader_module, "measure_profile", long_profile)
    write_version(tmp_path, "m", 1, heavy_model(1.0))  # (~5 s of profiling on the 2-core VM)

    async def main() -> None:
        engine = await Engine.start(tmp_path, options=RepositoryOptions(control_mode="explicit"))
        load = asyncio.ensure_future(engine.load_model("m"))
        assert await asyncio.to_thread(profiling.wait, 30), "the load never profiled"
        await engine.aclose()
        with contextlib.suppress(BaseException):
            await load

    before = set(threading.enumerate())  # (other tests' servers have loader threads too)
    asyncio.run(main())
    loaders = [
        t for t in threading.enumerate() if t.name.startswith("duetime-loader") and t not in before
    ]
    for thread in loaders:
        thread.join(timeout=2)
    assert not any(t.is_alive() for t in loaders), "the abandoned load went on profiling"
