"""A stand-in v2 gRPC server for the feed's remote predictor: it describes an order-book model
and answers `ModelInfer` as a test wants (at once, never, turned away), and can go away."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
import numpy as np

from duetime.feeds.itch.features import FEATURE_NAMES
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.frontend.proto import grpc_service_pb2_grpc as pb_grpc

Infer = Callable[[Any, Any], Awaitable[Any]]
"""How `ModelInfer` answers: (request, context) -> response."""


async def answer_at_once(request: Any, context: Any) -> Any:
    """Three zero outputs per row, as the demo order-book model's shape."""
    rows = int(request.inputs[0].shape[0])
    response = pb.ModelInferResponse(model_name=request.model_name)
    response.outputs.add(name="probabilities", datatype="FP32", shape=[rows, 3])
    response.raw_output_contents.append(np.zeros((rows, 3), np.float32).tobytes())
    return response


async def never_answer(request: Any, context: Any) -> Any:
    await asyncio.Event().wait()  # a stalled host: the call stays open, nothing comes back
    raise AssertionError("unreachable")


async def unavailable(request: Any, context: Any) -> Any:
    """The server itself turns the request away (a model still loading, a shutdown)."""
    await context.abort(grpc.StatusCode.UNAVAILABLE, "model 'orderbook' is loading")


class _Service(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, infer: Infer, stop_after: int | None) -> None:
        self.infer = infer
        self.calls = 0
        self.stop_after = stop_after
        self.server: Any = None
        self._stopping: asyncio.Task[None] | None = None

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        response = pb.ModelMetadataResponse(name=request.name, platform="onnxruntime_onnx")
        response.inputs.add(name="features", datatype="FP32", shape=[-1, len(FEATURE_NAMES)])
        response.outputs.add(name="probabilities", datatype="FP32", shape=[-1, 3])
        return response

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        response = pb.ModelConfigResponse()
        response.config.name = request.name
        response.config.max_batch_size = 8
        return response

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if self.calls == self.stop_after:  # the process goes away: from a task of its own
            self._stopping = asyncio.get_running_loop().create_task(self.server.stop(0))
        return await self.infer(request, context)


class FakeServer:
    """A running fake server: `target` to connect to, `calls` so far, `stop()` to go away."""

    def __init__(self, server: Any, service: _Service, port: int) -> None:
        self._server = server
        self._service = service
        self.target = f"127.0.0.1:{port}"

    @property
    def calls(self) -> int:
        return self._service.calls

    async def stop(self) -> None:
        await self._server.stop(0)


@contextlib.asynccontextmanager
async def fake_server(
    infer: Infer = answer_at_once, *, stop_after: int | None = None
) -> AsyncIterator[FakeServer]:
    """Serve on 127.0.0.1 (a free port) on the running loop until the block ends, or until the
    `stop_after`-th inference request (answered as the others, then the server is gone)."""
    server = grpc.aio.server()
    service = _Service(infer, stop_after)
    service.server = server
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield FakeServer(server, service, port)
    finally:
        await server.stop(0)


@contextlib.contextmanager
def fake_server_in_thread(
    infer: Infer = answer_at_once, *, stop_after: int | None = None
) -> Iterator[FakeServer]:
    """`fake_server` on a loop thread of its own, for a client that runs its own loop (the
    command line)."""
    loop = asyncio.new_event_loop()
    started: concurrent.futures.Future[FakeServer] = concurrent.futures.Future()
    stop = asyncio.Event()

    async def serve() -> None:
        async with fake_server(infer, stop_after=stop_after) as server:
            started.set_result(server)
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield started.result(timeout=30)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()
