"""A stand-in v2 gRPC server for the feed's remote predictor: it describes an order-book model
and answers `ModelInfer` as a test wants (at once, never, or not at all once stopped)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import numpy as np

from duetime.feeds.itch.features import FEATURE_NAMES
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.frontend.proto import grpc_service_pb2_grpc as pb_grpc

Infer = Callable[[Any], Awaitable[Any]]


async def answer_at_once(request: Any) -> Any:
    """Three zero outputs per row, as the demo order-book model's shape."""
    rows = int(request.inputs[0].shape[0])
    response = pb.ModelInferResponse(model_name=request.model_name)
    response.outputs.add(name="probabilities", datatype="FP32", shape=[rows, 3])
    response.raw_output_contents.append(np.zeros((rows, 3), np.float32).tobytes())
    return response


async def never_answer(request: Any) -> Any:
    await asyncio.Event().wait()  # a stalled host: the call stays open, nothing comes back
    raise AssertionError("unreachable")


class _Service(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, infer: Infer) -> None:
        self.infer = infer
        self.calls = 0

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
        return await self.infer(request)


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
async def fake_server(infer: Infer = answer_at_once) -> AsyncIterator[FakeServer]:
    """Serve on 127.0.0.1 (a free port) on the running loop until the block ends."""
    server = grpc.aio.server()
    service = _Service(infer)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield FakeServer(server, service, port)
    finally:
        await server.stop(0)
