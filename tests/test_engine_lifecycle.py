"""An engine's life: opened or started, closed (or not), and the interpreter's exit."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from duetime import ConfigError, Engine, ModelUnavailable
from duetime.repository.manager import ModelManager, RepositoryOptions
from tests.unit.test_executor_close import FOREVER, loop_model

pytestmark = pytest.mark.timeout(120)


def loop_repo(root: Path) -> Path:
    """A repository of 'loop' (see `loop_model`), run on an instance thread."""
    version = root / "loop" / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(loop_model())
    (version.parent / "config.toml").write_text('max_batch_size = 0\nexecution = "thread"\n')
    return root


def test_a_started_engine_left_open_with_a_run_in_flight_exits_with_the_programs_status(
    tmp_path: Path,
) -> None:
    """An `Engine.start` engine never aclose()d, its run still in ONNX Runtime (its infer_async
    given up): the interpreter aborted at exit (SIGABRT, "terminate called without an active
    exception"), its instance thread a daemon inside ORT."""
    repo = loop_repo(tmp_path)
    program = textwrap.dedent(f"""
        import asyncio, sys
        import numpy as np
        from duetime import ConfigError, Engine, ModelUnavailable

        async def main():
            engine = await Engine.start({str(repo)!r})
            inputs = {{"n": np.array([{FOREVER}], np.int64), "x": np.zeros(1, np.float32)}}
            try:
                await asyncio.wait_for(engine.infer_async("loop", inputs), 0.3)
            except asyncio.TimeoutError:
                pass

        asyncio.run(main())
        sys.exit(7)
    """)
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=90
    )
    assert "terminate called" not in done.stderr
    assert done.returncode == 7, done.stderr


def interrupt_main_after(seconds: float) -> threading.Thread:
    """A thread that raises KeyboardInterrupt in the main thread after `seconds` (as Ctrl-C)."""
    main = threading.main_thread().ident
    assert main is not None
    # (a real signal, to the main thread: `_thread.interrupt_main` wakes no blocked wait)
    thread = threading.Thread(
        target=lambda: (time.sleep(seconds), signal.pthread_kill(main, signal.SIGINT))
    )
    thread.start()
    return thread


def test_a_blocking_infer_interrupted_by_ctrl_c_withdraws_its_request(tmp_path: Path) -> None:
    """The interrupted infer's run went on to its end: the next 1 ms infer waited 8.4 s behind
    it (here, forever: its run never ends unless stopped; the next is due in 10 s)."""
    repo = loop_repo(tmp_path)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Engine.open(repo) as engine:
            interrupter = interrupt_main_after(0.3)
            with pytest.raises(KeyboardInterrupt):
                engine.infer(
                    "loop", {"n": np.array([FOREVER]), "x": np.zeros(1, np.float32)}, timeout=None
                )
            interrupter.join()
            answer = engine.infer(
                "loop", {"n": np.array([10]), "x": np.zeros(1, np.float32)}, timeout=10
            )
            assert answer["y"].tolist() == [10.0]
    finally:
        signal.signal(signal.SIGINT, handler)


@pytest.mark.parametrize(
    "options",
    [
        None,
        RepositoryOptions(control_mode="explicit", startup_models=("*",)),
        RepositoryOptions(lazy=True),
    ],
    ids=["none", "explicit", "lazy"],
)
def test_a_closed_engine_is_not_ready_and_lists_no_version_ready(
    mlp_repo: Path, options: RepositoryOptions | None
) -> None:
    """After close() it was still `ready`, its index said READY, and every infer raised
    ModelUnavailable."""
    engine = Engine.open(mlp_repo, options=options)
    assert engine.ready
    engine.close()
    assert not engine.ready
    assert engine.repository_index(ready_only=True) == []
    states = [entry.get("state") for entry in engine.repository_index()]
    assert "READY" not in states
    if options is None:  # (loaded at open: listed, closed)
        assert [e["reason"] for e in engine.repository_index()] == ["the engine is closed"]


def test_an_aclosed_engine_is_not_ready(mlp_repo: Path) -> None:
    async def body() -> tuple[bool, list[str]]:
        engine = await Engine.start(mlp_repo)
        await engine.aclose()
        return engine.ready, [e.get("state", "") for e in engine.repository_index()]

    ready, states = asyncio.run(body())
    assert not ready
    assert states == ["UNAVAILABLE"]


def test_load_repository_awaited_on_another_loop_is_handed_to_an_open_engines_loop(
    mlp_repo: Path, tmp_path: Path
) -> None:
    """It made the awaiting loop (asyncio.run's, closed after) the engine's: infer then said
    "the engine is closed", close() raised "Event loop is closed", and its threads ran on."""
    engine = Engine.open(tmp_path)  # (an empty repository)
    try:
        asyncio.run(engine.load_repository(mlp_repo))
        answer = engine.infer("mlp", {"x": np.zeros((1, 40), np.float32)}, timeout=30)
        assert answer["y"].shape[0] == 1
    finally:
        engine.close()
    assert engine._thread is not None
    assert not engine._thread.is_alive()


def test_load_repository_awaited_on_another_loop_than_a_started_engines_is_refused(
    mlp_repo: Path, tmp_path: Path
) -> None:
    loop = asyncio.new_event_loop()
    try:
        engine = loop.run_until_complete(Engine.start(mlp_repo))
        with pytest.raises(RuntimeError, match="runs on the loop that started it"):
            asyncio.run(engine.load_repository(tmp_path))
        assert engine.repository == mlp_repo
        loop.run_until_complete(engine.aclose())
    finally:
        loop.close()


def test_load_and_unload_after_aclose_say_the_engine_is_closed(mlp_repo: Path) -> None:
    """load_model after aclose() reached the closed loader: InvalidInput "internal error while
    loading: RuntimeError: cannot schedule new futures after shutdown", a traceback logged."""

    async def body() -> list[str]:
        engine = await Engine.start(mlp_repo, options=RepositoryOptions(control_mode="explicit"))
        await engine.aclose()
        refusals = []
        for call in (engine.load_model, engine.unload_model):
            with pytest.raises(ModelUnavailable) as refused:
                await call("mlp")
            refusals.append(refused.value.message)
        assert engine.repository_index(ready_only=True) == []
        return refusals

    assert asyncio.run(body()) == [
        "cannot load model 'mlp': the engine is closed; start a new one",
        "cannot unload model 'mlp': the engine is closed; start a new one",
    ]


def duetime_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("duetime") and t.is_alive()}


def test_ctrl_c_while_open_loads_closes_what_it_started(
    mlp_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It left an engine nobody could close: its loop and instance threads ran on, loading the
    repository's remaining models. Here the load serves mlp, then waits for ever."""
    loading = threading.Event()
    start = ModelManager.start

    async def start_then_wait(manager: ModelManager) -> None:
        await start(manager)
        loading.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(ModelManager, "start", start_then_wait)
    before = duetime_threads()
    main = threading.main_thread().ident
    assert main is not None

    def interrupt() -> None:
        loading.wait(60)
        signal.pthread_kill(main, signal.SIGINT)

    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupter = threading.Thread(target=interrupt)
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            Engine.open(mlp_repo)
        interrupter.join()
    finally:
        signal.signal(signal.SIGINT, handler)
    assert loading.is_set()
    left = {t.name for t in duetime_threads() - before if t.name != "duetime-loader_0"}
    assert left == set()


def test_a_close_while_another_thread_closes_waits_until_closed(tmp_path: Path) -> None:
    """It returned at once, the first close() still draining (its loop thread alive). Here the
    drain lasts its grace (5 s): a run in flight never ends unless stopped."""
    engine = Engine.open(loop_repo(tmp_path))
    inputs = {"n": np.array([FOREVER]), "x": np.zeros(1, np.float32)}
    failures: list[BaseException] = []

    def never_answered() -> None:
        try:
            engine.infer("loop", inputs)
        except ModelUnavailable as exc:
            failures.append(exc)

    client = threading.Thread(target=never_answered)
    client.start()
    while not engine._waiting:  # (handed to the engine's loop)
        time.sleep(0.001)
    first = threading.Thread(target=engine.close)
    first.start()
    while not engine._closed:
        time.sleep(0.001)
    engine.close()
    assert engine._thread is not None
    assert not engine._thread.is_alive()
    first.join()
    client.join()
    assert len(failures) == 1


def test_an_empty_repository_path_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Engine.open("") served the current directory, each folder there a model UNAVAILABLE."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    with pytest.raises(ConfigError, match="the path is empty"):
        Engine.open("")
    with pytest.raises(ConfigError, match="the path is empty"):
        asyncio.run(Engine.start(""))


def _duetime_threads() -> set[threading.Thread]:
    """(Threads, not names: other tests' engines in this process name theirs alike.)"""
    return {t for t in threading.enumerate() if t.name.startswith("duetime")}


@pytest.mark.parametrize("closing", ["close()", "aclose() on another loop"])
def test_a_started_engine_whose_loop_ended_without_aclose_can_be_closed(
    mlp_repo: Path, closing: str
) -> None:
    """Found by a tester: its loop gone, nothing could close it (`close()` was for `open()`
    engines, `aclose()` for its loop), and its model threads and sessions stayed."""
    before = _duetime_threads()

    async def forgot_aclose() -> Engine:
        engine = await Engine.start(mlp_repo)
        await engine.infer_async("mlp", {"x": np.zeros((1, 40), np.float32)})
        return engine

    engine = asyncio.run(forgot_aclose())
    assert _duetime_threads() - before
    if closing == "close()":
        engine.close()
    else:
        asyncio.run(engine.aclose())
    engine.close()  # (again: nothing)
    deadline = time.monotonic() + 10
    while _duetime_threads() - before and time.monotonic() < deadline:
        time.sleep(0.05)  # (the loader thread ends on its own, as at aclose)
    assert _duetime_threads() - before == set()
    assert not engine.ready
    assert not list(engine.registry.snapshot.deployments())


def test_with_refuses_a_started_engine_before_its_block_runs(mlp_repo: Path) -> None:
    """Found by a tester: the block ran, and its end raised "close() is for engines made by
    Engine.open()" in place of the block's own exception, the engine left open."""

    async def body() -> None:
        engine = await Engine.start(mlp_repo)
        ran = False
        with (
            pytest.raises(RuntimeError, match=r"`with` is for engines made by Engine\.open"),
            engine,
        ):
            ran = True
        assert not ran
        async with engine:  # (what the error says to do)
            assert engine.ready
        assert not engine.ready

    asyncio.run(body())


def test_an_engine_that_serves_nothing_says_so_and_closes(mlp_repo: Path) -> None:
    """A bare `Engine()` was told it "runs on the loop that started it (Engine.start)"."""
    engine = Engine()

    async def infer() -> None:
        await engine.infer_async("mlp", {"x": np.zeros((1, 40), np.float32)})

    with pytest.raises(RuntimeError, match="this engine serves no repository yet"):
        asyncio.run(infer())
    calls = {
        "infer": lambda: engine.infer("mlp", {"x": np.zeros((1, 40), np.float32)}),
        "load_model_blocking": lambda: engine.load_model_blocking("mlp"),
        "unload_model_blocking": lambda: engine.unload_model_blocking("mlp"),
        "load_model": lambda: asyncio.run(engine.load_model("mlp")),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match="this engine serves no repository yet"):
            call()
        assert name
    with engine:  # (nothing to close)
        pass
    engine.close()


def test_a_start_cancelled_as_it_loads_leaves_no_thread_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start cancelled while it loads (`wait_for(Engine.start(repo), 30)` timing out) closes
    what it started: it left the instance threads and sessions of the models loaded so far
    running, with no engine returned to close them (found by a tester)."""
    repo = loop_repo(tmp_path)
    start = ModelManager.start
    loading = asyncio.Event()

    async def start_then_wait(manager: ModelManager) -> None:
        await start(manager)  # ('loop' is served: its instance thread runs)
        loading.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(ModelManager, "start", start_then_wait)
    before = _duetime_threads()

    async def cancelled() -> None:
        task = asyncio.ensure_future(Engine.start(repo))
        await loading.wait()
        assert any(t.name.startswith("duetime-loop") for t in _duetime_threads() - before)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    deadline = time.monotonic() + 10
    while _duetime_threads() - before and time.monotonic() < deadline:
        time.sleep(0.05)  # (the loader thread ends on its own, as at aclose)
    assert _duetime_threads() - before == set()


def test_a_started_engine_collected_unclosed_stops_its_threads_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A program that failed between its start and its aclose: its instance threads and
    sessions ran for the life of the process, and nothing said why (found by a tester)."""
    repo = loop_repo(tmp_path)
    before = _duetime_threads()

    async def failed_before_aclose() -> None:
        engine = await Engine.start(repo)
        assert any(t.name.startswith("duetime-loop") for t in _duetime_threads() - before)
        raise LookupError(engine)

    with caplog.at_level(logging.WARNING, logger="duetime.engine"):
        with pytest.raises(LookupError) as failed:
            asyncio.run(failed_before_aclose())
        del failed  # (its traceback holds the engine)
        gc.collect()
    assert "an Engine was collected without aclose()" in caplog.text
    deadline = time.monotonic() + 10
    while _duetime_threads() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _duetime_threads() - before == set()


def test_a_start_cancelled_twice_as_it_loads_leaves_no_thread_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second cancel (the caller's own task cancelled after a `wait_for` timeout, or
    `asyncio.run` ending) cut the close short, and the models' threads ran on (found by a
    tester): they are told to stop before the close is awaited."""
    repo = loop_repo(tmp_path)
    start = ModelManager.start
    loading = asyncio.Event()

    async def start_then_wait(manager: ModelManager) -> None:
        await start(manager)
        loading.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(ModelManager, "start", start_then_wait)
    before = _duetime_threads()

    async def cancelled_twice() -> None:
        task = asyncio.ensure_future(Engine.start(repo))
        await loading.wait()
        task.cancel()
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled_twice())
    deadline = time.monotonic() + 10
    while _duetime_threads() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _duetime_threads() - before == set()
