"""The Engine across loops and lifecycles: which loop a call runs on (its own, another one, one
that is not running), loads on demand, control modes, and what in-process callers are told."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import start_server, stop_server
from repo_models import heavy_model, inputs, scale_model, write_version
from repo_models import run_on_engine as run_started
from tritonclient.utils import InferenceServerException

from duetime import Engine
from duetime.config import ServerSettings
from duetime.errors import DeadlineExceeded, ModelNotFound, ModelUnavailable, NotAllowed
from duetime.repository.manager import RepositoryOptions

pytestmark = pytest.mark.timeout(120)

WAIT_S = 30.0
"""The longest a test waits for something that takes a second at most (a load)."""


async def eventually(check: Callable[[], bool]) -> None:
    """Wait until `check()` holds (a load ends), failing after WAIT_S."""
    end = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < end, "still not so after 30 s"
        await asyncio.sleep(0.01)


# -- loads on demand -------------------------------------------------------------------------------


def test_a_request_refused_for_a_lazy_load_starts_it(tmp_path: Path) -> None:
    """A request due sooner than the load estimate (1 s before any load) was refused with "it
    is loading now, retry shortly", but no load started: a client that always sends a 50 ms
    budget was refused for ever."""
    write_version(tmp_path, "m", 1, scale_model(2))

    async def scenario(engine: Engine) -> None:
        with pytest.raises(
            ModelUnavailable, match=r"has no available versions: it is loading .* retry shortly"
        ):
            await engine.infer_async("m", inputs(), timeout=0.05)
        await eventually(lambda: "m" in engine.registry.snapshot.models)  # no other request
        answer = await engine.infer_async("m", inputs(), timeout=0.05)
        np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])

    run_started(tmp_path, scenario, lazy=True)


def test_requests_arriving_during_a_lazy_load_share_it(tmp_path: Path) -> None:
    """Refused or waiting, the requests that find the model loading start no load of their own;
    those that can wait for it are answered once it ends."""
    write_version(tmp_path, "m", 1, scale_model(3))

    async def scenario(engine: Engine) -> None:
        assert engine.manager is not None
        loads: list[str] = []
        real = engine.manager.load

        async def counted(name: str, **kwargs: object) -> None:
            loads.append(name)
            await real(name, **kwargs)  # type: ignore[arg-type]

        engine.manager.load = counted  # type: ignore[method-assign]
        refused = 0
        for _ in range(5):
            try:
                await engine.infer_async("m", inputs(), timeout=0.001)
            except ModelUnavailable:
                refused += 1
        waiting = [engine.infer_async("m", inputs(), timeout=WAIT_S) for _ in range(3)]
        for answer in await asyncio.gather(*waiting):
            np.testing.assert_array_equal(answer["y"], 3 * inputs()["x"])
        assert refused >= 1
        assert loads == ["m"]

    run_started(tmp_path, scenario, lazy=True)


def test_a_lazy_load_refused_over_http_starts_too(tmp_path: Path) -> None:
    """The same over HTTP: a `timeout` shorter than the load got 503 for ever."""
    write_version(tmp_path, "m", 1, scale_model(2))
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0, lazy_load=True)
    running, thread = start_server(settings)
    client = httpclient.InferenceServerClient(running.http)
    try:
        tensor = httpclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(inputs()["x"])
        with pytest.raises(
            InferenceServerException, match="has no available versions: it is loading"
        ):
            client.infer("m", [tensor], timeout=50_000)  # due in 50 ms (µs, as Triton)
        end = time.monotonic() + WAIT_S
        while not client.is_model_ready("m"):  # (readiness starts no load)
            assert time.monotonic() < end, "the model never loaded"
            time.sleep(0.01)
        result = client.infer("m", [tensor], timeout=50_000)
        np.testing.assert_array_equal(result.as_numpy("y"), 2 * inputs()["x"])
    finally:
        client.close()
        stop_server(running, thread)


# -- the loop a call runs on -----------------------------------------------------------------------


def test_load_and_unload_awaited_on_a_loop_of_the_callers_run_on_the_engines(
    tmp_path: Path,
) -> None:
    """`asyncio.run(engine.load_model(...))` on an `open()` engine deployed the model on that
    short-lived loop: every infer after it raised "Event loop is closed", and an unload's drain
    failed "The future belongs to a different loop"."""
    write_version(tmp_path, "m", 1, scale_model(2))
    with Engine.open(tmp_path, options=RepositoryOptions(control_mode="explicit")) as engine:
        for _ in range(2):  # (loaded again after its unload)
            asyncio.run(engine.load_model("m"))
            answer = engine.infer("m", inputs(), timeout=WAIT_S)
            np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])
            asyncio.run(engine.unload_model("m"))
            with pytest.raises(ModelNotFound):
                engine.infer("m", inputs(), timeout=WAIT_S)


def test_load_awaited_off_the_loop_of_a_started_engine_is_refused(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(2))

    async def scenario(engine: Engine) -> None:
        for call in (engine.load_model, engine.unload_model):
            with pytest.raises(RuntimeError, match="runs on the loop that started it"):
                await asyncio.to_thread(asyncio.run, call("m"))  # type: ignore[operator]
        assert engine.repository_index() == [{"name": "m"}]  # (nothing loaded elsewhere)
        await engine.load_model("m")  # (on its own loop: loaded)
        answer = await engine.infer_async("m", inputs(), timeout=WAIT_S)
        np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])

    run_started(tmp_path, scenario, control_mode="explicit")


def call_in_thread(call: Callable[[], object]) -> object:
    """What `call()` returns or raises, run on a thread of its own; a call that never ends
    fails the test instead of hanging it."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert outcome, "the call still had not ended after 30 s"
    return outcome[0]


def test_blocking_infer_on_a_started_engine_is_refused_whether_its_loop_runs_or_not(
    tmp_path: Path,
) -> None:
    """Handed to a `start()` engine's loop while it was not running, `infer(timeout=0.05)`
    waited forever; after `asyncio.run(Engine.start(...))` it said "the engine is closed" though
    nothing had closed it. Such an engine answers only on its loop (README)."""
    write_version(tmp_path, "m", 1, scale_model(2))
    loop = asyncio.new_event_loop()
    engine = loop.run_until_complete(Engine.start(tmp_path))
    try:
        outcome = call_in_thread(lambda: engine.infer("m", inputs(), timeout=0.05))
        assert isinstance(outcome, RuntimeError), outcome
        assert "Engine.infer is for engines made by Engine.open()" in str(outcome)

        async def on_its_loop() -> None:
            with pytest.raises(RuntimeError, match="await infer_async there"):
                engine.infer("m", inputs())
            answer = await engine.infer_async("m", inputs(), timeout=WAIT_S)
            np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])

        loop.run_until_complete(on_its_loop())
    finally:
        loop.run_until_complete(engine.aclose())
        loop.close()

    ended = asyncio.run(Engine.start(tmp_path))  # (its loop is closed: the engine is not)
    try:
        with pytest.raises(RuntimeError, match=r"Engine\.infer is for engines made by"):
            ended.infer("m", inputs(), timeout=0.05)
    finally:
        for deployment in ended.registry.clear():
            deployment.model.executor.close()


# -- control modes ---------------------------------------------------------------------------------


def test_a_polled_repository_refuses_loads_as_it_refuses_unloads(tmp_path: Path) -> None:
    """As Triton's ("explicit model load / unload is not allowed if polling is enabled"): a
    load with uploaded files was taken while every unload was refused, so the upload could
    never be dropped, not even by removing the model's folder."""
    write_version(tmp_path, "m", 1, scale_model(1))
    settings = ServerSettings(
        model_repository=tmp_path, http_port=0, grpc_port=0, model_control_mode="poll",
        repository_poll_secs=3600,
    )  # fmt: skip
    running, thread = start_server(settings)
    made = [
        httpclient.InferenceServerClient(running.http),
        grpcclient.InferenceServerClient(running.grpc),
    ]
    try:
        for client in made:
            upload = {"file:1/model.onnx": scale_model(9)}
            for asked in ({"config": "{}", "files": upload}, {}):
                with pytest.raises(InferenceServerException, match="polled") as refused:
                    client.load_model("m", **asked)
                assert "cannot load model 'm'" in str(refused.value)
                assert str(refused.value.status()) in ("503", "StatusCode.UNAVAILABLE")
            with pytest.raises(InferenceServerException, match="cannot unload model 'm'"):
                client.unload_model("m")
            module = httpclient if client is made[0] else grpcclient
            tensor = module.InferInput("x", [1, 4], "FP32")
            tensor.set_data_from_numpy(inputs()["x"])
            answer = client.infer("m", [tensor]).as_numpy("y")
            np.testing.assert_array_equal(answer, inputs()["x"])  # the folder's, not the upload's
    finally:
        for client in made:
            client.close()
        stop_server(running, thread)

    async def scenario(engine: Engine) -> None:
        with pytest.raises(
            NotAllowed, match="cannot load model 'm' while the repository is polled"
        ):
            await engine.load_model("m")

    run_started(tmp_path, scenario, control_mode="poll", poll_s=3600)


# -- what in-process callers are told --------------------------------------------------------------


def test_in_process_calls_are_not_told_of_a_server(tmp_path: Path) -> None:
    """After `aclose()` a call was told "the server is shutting down; retry on another
    replica", and `timeout=0` "... it waited that long to be read: the server is overloaded".

    (A request due at once is `timeout=1e-9` now: `timeout=0` sets no due time, as over HTTP and
    gRPC; see test_engine_due_parameters.py. Its due time, 1 ns after the clock's read, has
    passed by the scheduler's next read, hundreds of ns of Python later.)"""
    write_version(tmp_path, "m", 1, scale_model(2))

    async def main() -> None:
        engine = await Engine.start(tmp_path)
        with pytest.raises(DeadlineExceeded) as late:
            await engine.infer_async("m", inputs(), timeout=1e-9)
        assert "due before the engine could queue it" in late.value.message
        assert late.value.message.startswith("Request timeout expired: ")  # (Triton's words)
        await engine.aclose()
        with pytest.raises(ModelUnavailable) as closed:
            await engine.infer_async("m", inputs())
        assert closed.value.message == "model 'm': the engine is closed; start a new one"
        for said in (late.value.message, closed.value.message):
            assert "server" not in said
            assert "replica" not in said

    asyncio.run(main())
    with Engine.open(tmp_path) as opened:
        with pytest.raises(DeadlineExceeded) as late:
            opened.infer("m", inputs(), timeout=1e-9)
        assert "due before the engine could queue it" in late.value.message
        assert "server" not in late.value.message


def test_a_request_waiting_for_a_lazy_load_is_told_when_the_engine_closes(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, heavy_model(2))

    async def main() -> None:
        engine = await Engine.start(tmp_path, options=RepositoryOptions(lazy=True))
        waiting = asyncio.ensure_future(engine.infer_async("m", inputs(), timeout=WAIT_S))
        await asyncio.sleep(0)  # (submitted: its load has started)
        await engine.aclose()
        with pytest.raises(ModelUnavailable) as closed:
            await asyncio.wait_for(waiting, WAIT_S)
        assert (
            closed.value.message == "model 'm': the engine closed before answering; start a new one"
        )

    asyncio.run(main())
