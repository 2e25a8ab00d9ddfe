"""Runs stopped on their instance thread (`Executor.terminate`, armed by the scheduler's
`_watch`): every request of the run past its due time, or withdrawn by its client.

A real ONNX Runtime session of a Loop whose trip count is an input (`loop_model`): n = FOREVER
runs for minutes unless stopped."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from duetime.engine import Engine
from duetime.errors import DeadlineExceeded, ModelUnavailable
from duetime.execution.executor import BatchJob, BatchResult, Executor
from duetime.repository.manager import RepositoryOptions
from tests.unit.test_executor_close import FOREVER, Announcing, loop_model

pytestmark = pytest.mark.timeout(120)


def feeds(n: int) -> dict[str, np.ndarray]:
    return {"n": np.array([n], np.int64), "x": np.zeros(1, np.float32)}


def test_terminate_stops_the_current_run_and_the_instance_runs_the_next() -> None:
    """ORT keeps `terminate` set on the instance's shared RunOptions: the thread resets it, or
    every later run of the instance would fail at once."""
    started = threading.Event()
    session = Announcing(ort.InferenceSession(loop_model()), started)
    executor = Executor([session], output_names=["y"], string_outputs=frozenset(),
                        batched=False, label="'loop'")  # fmt: skip

    async def main() -> None:
        loop = asyncio.get_running_loop()
        executor.start(loop)
        results: asyncio.Queue[BatchResult] = asyncio.Queue()
        long = BatchJob([feeds(FOREVER)], [1], 0, results.put_nowait)
        other = BatchJob([feeds(3)], [1], 0, results.put_nowait)
        assert not executor.terminate(0, other), "not running: nothing to stop"
        executor.submit(0, long)
        await asyncio.to_thread(started.wait, 30)
        for _ in range(1000):  # (its thread marks it current just before the run)
            if executor.terminate(0, long):
                break
            await asyncio.sleep(0.001)
        stopped = await asyncio.wait_for(results.get(), 30)
        assert stopped.terminated
        assert isinstance(stopped.outputs[0], ModelUnavailable)
        executor.submit(0, other)
        answered = await asyncio.wait_for(results.get(), 30)
        assert not answered.terminated
        np.testing.assert_array_equal(answered.outputs[0]["y"], [3.0])  # type: ignore[index]

    try:
        asyncio.run(main())
    finally:
        executor.close()


def repo(tmp_path: Path) -> Path:
    version = tmp_path / "loop" / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(loop_model())
    (tmp_path / "loop" / "config.toml").write_text('max_batch_size = 0\nexecution = "thread"\n')
    return tmp_path


def run(tmp_path: Path, scenario: object) -> None:
    async def main() -> None:
        engine = await Engine.start(repo(tmp_path), options=RepositoryOptions())
        try:
            await scenario(engine)  # type: ignore[operator]
        finally:
            await engine.aclose()

    asyncio.run(main())


def scheduler_of(engine: Engine):  # type: ignore[no-untyped-def]
    return engine.registry.snapshot.models["loop"].versions["1"].primary.scheduler


def test_a_run_past_its_due_time_is_stopped_answered_504_and_frees_the_instance(
    tmp_path: Path,
) -> None:
    """Probe repro_slow_hold: a Loop run for a request with a 1 s timeout went on for 16 s and
    was answered 200; every other request waited behind it."""

    async def scenario(engine: Engine) -> None:
        with pytest.raises(DeadlineExceeded, match="its run was still going"):
            await asyncio.wait_for(engine.infer_async("loop", feeds(FOREVER), timeout=0.2), 60)
        answer = await asyncio.wait_for(engine.infer_async("loop", feeds(2)), 60)
        np.testing.assert_array_equal(answer["y"], [2.0])
        stats = scheduler_of(engine).statistics()
        assert stats.expired == 1
        assert stats.failed == 0, "a stopped run is no failure of the model"
        assert all(state == 0 for state in stats.breaker_states)

    run(tmp_path, scenario)


def test_a_run_whose_client_withdrew_is_stopped_and_counted_cancelled(tmp_path: Path) -> None:
    """Probe repro_slow_hold: a client that hung up 1 s into a long run left it running, and the
    next small request waited 35 s."""

    async def scenario(engine: Engine) -> None:
        scheduler = scheduler_of(engine)
        gone = asyncio.ensure_future(engine.infer_async("loop", feeds(FOREVER)))
        for _ in range(3000):  # (until its run starts)
            if scheduler.statistics().busy_instances:
                break
            await asyncio.sleep(0.01)
        gone.cancel()
        answer = await asyncio.wait_for(engine.infer_async("loop", feeds(2)), 60)
        np.testing.assert_array_equal(answer["y"], [2.0])
        stats = scheduler.statistics()
        assert stats.cancelled == 1
        assert stats.failed == 0

    run(tmp_path, scenario)


def one_node_model() -> bytes:
    """y = sum(E @ E) for E = ones(s): one MatMul node as big as the input `s` says, which ONNX
    Runtime cannot stop inside (it looks at `terminate` between nodes)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Expand", ["one", "s"], ["e"]),
         helper.make_node("MatMul", ["e", "e"], ["p"]),
         helper.make_node("ReduceSum", ["p"], ["y"], keepdims=0)],
        "one_node", [helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_run_past_its_due_time_is_answered_504_before_its_node_ends(tmp_path: Path) -> None:
    """NOTE: a run was answered once ORT returned, which it does between nodes: a request due in
    200 ms whose one MatMul ran 2.6 s got its 504 after 2.8 s, saying the run was stopped (found
    by a tester). It is answered as it is given up; its instance stays busy till the node ends."""
    version = tmp_path / "mm" / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(one_node_model())
    (tmp_path / "mm" / "config.toml").write_text('max_batch_size = 0\nexecution = "thread"\n')

    async def scenario(engine: Engine) -> None:
        scheduler = engine.registry.snapshot.models["mm"].versions["1"].primary.scheduler
        big = {"s": np.array([5000, 5000], np.int64)}  # (250 GFLOP: seconds on one thread)
        loop = asyncio.get_running_loop()
        sent = loop.time()
        with pytest.raises(DeadlineExceeded, match="given up") as late:
            await asyncio.wait_for(engine.infer_async("mm", big, timeout=0.2), 60)
        took = loop.time() - sent
        assert scheduler.statistics().busy_instances == 1, "answered once its node had ended"
        assert took < 2.0, late.value
        for _ in range(6000):  # (the node ends; then the instance takes the next request)
            if not scheduler.statistics().busy_instances:
                break
            await asyncio.sleep(0.01)
        answer = await engine.infer_async("mm", {"s": np.array([2, 2], np.int64)})
        assert float(answer["y"]) == 8.0  # (ones(2, 2) @ ones(2, 2): four 2s)
        stats = scheduler.statistics()
        assert (stats.expired, stats.failed, stats.cancelled) == (1, 0, 0)

    async def main() -> None:
        engine = await Engine.start(tmp_path, options=RepositoryOptions())
        try:
            await scenario(engine)
        finally:
            await engine.aclose()

    asyncio.run(main())
