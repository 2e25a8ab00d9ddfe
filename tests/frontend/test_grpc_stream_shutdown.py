"""At shutdown an open ModelStreamInfer stream reads no more requests, sends the answers of
those it has, and ends UNAVAILABLE: an idle one holds the server's stop no longer than that."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import RunningServer, start_server, stop_server
from repo_models import heavy_model, scale_model, write_version
from tritonclient.grpc import service_pb2

from duetime.config import ServerSettings
from duetime.engine import SHUTTING_DOWN

pytestmark = pytest.mark.timeout(120)

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
GRACE_S = 30.0
"""The server's shutdown grace: far longer than the stop these tests wait for."""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stream-shutdown")
    write_version(root, "scale", 1, scale_model(2.0))
    write_version(root, "slow", 1, heavy_model(2.0, depth=64))  # (64 rows: ~0.4 s a run)
    (root / "slow" / "config.toml").write_text("max_batch_size = 64\n")
    return root


@pytest.fixture
def server(repo: Path) -> Iterator[tuple[RunningServer, threading.Thread]]:
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, shutdown_grace_s=GRACE_S
    )
    running, thread = start_server(settings)
    yield running, thread
    if running.server._grpc_service.accepting:  # (the test failed before its stop)
        stop_server(running, thread)
    elif thread.is_alive():  # (stopped by the test: its loop ends here)
        running.loop.call_soon_threadsafe(running.loop.stop)
        thread.join(timeout=60)
        running.loop.close()


def request(model: str, request_id: str, rows: int = 1) -> Any:
    message = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    message.inputs.add(name="x", datatype="FP32", shape=[rows, 4])
    message.raw_input_contents.append(np.ones((rows, 4), np.float32).tobytes())
    return message


class Stream:
    """A ModelStreamInfer call fed from a queue; its answers read one at a time."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.sent: queue.Queue[Any] = queue.Queue()
        call = self.channel.stream_stream(
            STREAM,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        # (a deadline within the grace: a stream left open by the stop ends DEADLINE_EXCEEDED)
        self.answers = call(iter(self.sent.get, None), timeout=GRACE_S / 2)

    def close(self) -> None:
        self.sent.put(None)
        self.channel.close()


def stopping(running: RunningServer) -> concurrent.futures.Future[None]:
    """The server's stop, started on its loop; once it stops accepting."""
    stop = asyncio.run_coroutine_threadsafe(running.server.stop(), running.loop)
    deadline = time.monotonic() + 20
    while running.server._grpc_service.accepting:
        assert time.monotonic() < deadline, "the server never stopped accepting"
        time.sleep(0.001)
    return stop


def busy(running: RunningServer, model: str) -> None:
    scheduler = running.server.engine.registry.resolve(model, None).scheduler
    deadline = time.monotonic() + 20
    while not scheduler.statistics().busy_instances:
        assert time.monotonic() < deadline, f"{model} never ran"
        time.sleep(0.001)


def test_an_idle_stream_ends_unavailable_and_holds_no_stop(
    server: tuple[RunningServer, threading.Thread], caplog: pytest.LogCaptureFixture
) -> None:
    running, _ = server
    stream = Stream(running.grpc)
    try:
        stream.sent.put(request("scale", "a"))
        assert next(stream.answers).infer_response.id == "a"
        stop = stopping(running)
        with caplog.at_level(logging.INFO, logger="duetime.requests"):
            with pytest.raises(grpc.RpcError) as ended:
                next(stream.answers)
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert SHUTTING_DOWN in ended.value.details()
            stop.result(timeout=GRACE_S / 2)  # (not the grace: nothing was left to do)
    finally:
        stream.close()


def test_a_stream_sends_the_answers_in_flight_then_ends_taking_no_more(
    server: tuple[RunningServer, threading.Thread], caplog: pytest.LogCaptureFixture
) -> None:
    running, _ = server
    stream = Stream(running.grpc)
    try:
        with caplog.at_level(logging.INFO, logger="duetime.requests"):
            stream.sent.put(request("slow", "running", rows=64))
            busy(running, "slow")
            stop = stopping(running)
            for index in range(20):  # (sent after the stop began: never read)
                stream.sent.put(request("scale", f"late{index}"))
            answer = next(stream.answers)
            assert answer.infer_response.id == "running"
            assert not answer.error_message
            with pytest.raises(grpc.RpcError) as ended:
                next(stream.answers)
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            stop.result(timeout=GRACE_S / 2)
        lines = [r for r in caplog.records if r.name == "duetime.requests"]
        # (the stream's end, one line, at INFO as 503s are now: none for the requests unread)
        assert len([r for r in lines if getattr(r, "status", None) == 503]) == 1
    finally:
        stream.close()
