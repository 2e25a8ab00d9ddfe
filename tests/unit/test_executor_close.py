"""Executor.close: a run still going when the server stops is terminated, and its requests told.

A real ONNX Runtime session of a Loop of n additions: n is what makes it run for minutes."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from duetime.errors import ModelUnavailable
from duetime.execution.executor import BatchJob, BatchResult, Executor

FOREVER = 10**12
"""Loop iterations no test waits for (about 3 µs each)."""


def loop_model() -> bytes:
    """y = x + n, one addition per iteration of a Loop (FP32 x [1], INT64 n [1])."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "one"], ["acc_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")],
    )  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["n", "scalar"], ["n0"]),
         helper.make_node("Loop", ["n0", "true", "x"], ["y"], body=body)], "loop",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.array(True), "true"),
         numpy_helper.from_array(np.zeros(0, np.int64), "scalar")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


class Announcing:
    """An ORT session whose runs set `started` as they enter ONNX Runtime."""

    def __init__(self, session: ort.InferenceSession, started: threading.Event) -> None:
        inner = session._sess

        class Inner:
            def run(self, names: list[str], feeds: dict[str, np.ndarray], options: Any) -> Any:
                started.set()
                return inner.run(names, feeds, options)

        self._sess = Inner()


def feeds(n: int) -> dict[str, np.ndarray]:
    return {"n": np.array([n], np.int64), "x": np.zeros(1, np.float32)}


def test_close_terminates_a_run_in_progress_and_its_requests_get_unavailable() -> None:
    """A run that outlasted the shutdown grace kept its thread in ONNX Runtime past close: the
    process exited under it (SIGABRT) and its client got no answer."""
    started = threading.Event()
    session = Announcing(ort.InferenceSession(loop_model()), started)
    executor = Executor(
        [session], output_names=["y"], string_outputs=frozenset(), batched=False, label="loop-1"
    )

    async def body() -> tuple[BatchResult, BatchResult]:
        loop = asyncio.get_running_loop()
        executor.start(loop)
        running: asyncio.Future[BatchResult] = loop.create_future()
        queued: asyncio.Future[BatchResult] = loop.create_future()
        executor.submit(0, BatchJob([feeds(FOREVER)], [1], 0, running.set_result))
        executor.submit(0, BatchJob([feeds(1)], [1], 0, queued.set_result))  # behind it
        assert await asyncio.to_thread(started.wait, 30), "the run never started"
        await asyncio.to_thread(executor.close, 30.0)
        return await asyncio.wait_for(running, 30), await asyncio.wait_for(queued, 30)

    running, queued = asyncio.run(body())
    assert not any(thread.is_alive() for thread in executor._threads)
    for result in (running, queued):
        (outcome,) = result.outputs
        assert isinstance(outcome, ModelUnavailable), outcome
        assert "model loop-1: the server is shutting down" in outcome.message
        assert outcome.http_status == 503


def test_runs_before_close_are_not_terminated() -> None:
    executor = Executor(
        [ort.InferenceSession(loop_model())], output_names=["y"], string_outputs=frozenset(),
        batched=False, label="loop-1",
    )  # fmt: skip

    async def body() -> BatchResult:
        loop = asyncio.get_running_loop()
        executor.start(loop)
        done: asyncio.Future[BatchResult] = loop.create_future()
        executor.submit(0, BatchJob([feeds(3)], [1], 0, done.set_result))
        return await asyncio.wait_for(done, 30)

    try:
        (outcome,) = asyncio.run(body()).outputs
    finally:
        executor.close()
    assert isinstance(outcome, dict)
    np.testing.assert_array_equal(outcome["y"], [3.0])
