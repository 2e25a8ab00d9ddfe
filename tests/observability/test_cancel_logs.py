"""A request its client cancels (an HTTP connection closed, a gRPC call cancelled) before its
answer gets its line on `duetime.requests`, and its span, as every failed request does."""

from __future__ import annotations

import json
import logging
import socket
import struct
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import RunningServer, start_server, stop_server
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from repo_models import heavy_model, write_version

from duetime.config import ServerSettings
from duetime.observability.tracing import Tracing, tracing_from_env

pytestmark = pytest.mark.timeout(60)

TRACE_ID = "5bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunningServer, InMemorySpanExporter, Tracing]]:
    """A model whose runs take tens of ms, on a thread: an answer is still coming when the
    client goes; traced, its spans kept in memory.

    NOTE: at depth 64 a run took 3.6 ms on the 2-core VM, and a gRPC cancel sent as soon as the
    model was seen busy reached the server after the answer in 1 run of 4 (no 499 line); at
    1,024 a run takes ~50 ms."""
    repo = tmp_path_factory.mktemp("repo")
    write_version(repo, "slow", 1, heavy_model(2.0, depth=1024))
    (repo / "slow" / "config.toml").write_text('execution = "thread"\nmax_batch_size = 0\n')
    exporter = InMemorySpanExporter()
    tracing = tracing_from_env({}, exporter=exporter)
    assert tracing is not None
    settings = ServerSettings(model_repository=repo, http_port=0, grpc_port=0)
    running, thread = start_server(settings, tracing=tracing)
    yield running, exporter, tracing
    stop_server(running, thread)


@pytest.fixture(scope="module")
def slow(traced: tuple[RunningServer, InMemorySpanExporter, Tracing]) -> RunningServer:
    return traced[0]


def cancelled_lines(caplog: pytest.LogCaptureFixture, protocol: str) -> list[logging.LogRecord]:
    deadline = time.monotonic() + 20
    while True:
        lines = [
            r for r in caplog.records
            if r.name == "duetime.requests" and getattr(r, "protocol", "") == protocol
        ]  # fmt: skip
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.01)


def running(server: RunningServer, busy: bool = True) -> None:
    """Wait until the model runs a request (`busy`), or runs none."""
    scheduler = server.server.engine.registry.resolve("slow", None).scheduler
    deadline = time.monotonic() + 20
    while bool(scheduler.statistics().busy_instances) != busy:
        assert time.monotonic() < deadline, f"the model never got {'busy' if busy else 'idle'}"
        time.sleep(0.001)


def test_an_http_request_whose_client_closes_the_connection_is_logged(
    slow: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    """It was counted cancelled (stats `fail`, CANCELED), with no log line."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                   "data": [1.0] * 4}]}).encode()  # fmt: skip
    host, port = slow.http.split(":")
    head = (
        f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        f"traceparent: {TRACEPARENT}\r\n\r\n"
    )
    running(slow, busy=False)
    with caplog.at_level(logging.INFO, logger="duetime.requests"):
        client = socket.create_connection((host, int(port)))
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.sendall(head.encode() + body)
        running(slow)  # (closed while it runs: the server has it)
        client.close()  # (a reset: the server hears at once that the client is gone)
        [line] = cancelled_lines(caplog, "http")
    assert line.levelno == logging.INFO
    assert (line.model, line.status, line.trace_id) == ("slow", 499, TRACE_ID)  # type: ignore[attr-defined]
    assert "cancelled" in line.getMessage()


def test_a_grpc_call_its_client_cancels_is_logged(
    slow: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    tensor = grpcclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    running(slow, busy=False)  # (the request before, if any, has ended)
    with caplog.at_level(logging.INFO, logger="duetime.requests"):
        with grpcclient.InferenceServerClient(slow.grpc) as client:
            call = client.async_infer(
                "slow",
                [tensor],
                callback=lambda *_, **__: None,
                headers={"traceparent": TRACEPARENT},
            )
            running(slow)  # (cancelled while it runs: the server has it)
            call.cancel()
        lines = cancelled_lines(caplog, "grpc")
    statuses = {(r.model, r.status, r.trace_id) for r in lines}  # type: ignore[attr-defined]
    assert statuses == {("slow", 499, TRACE_ID)}
    # (its own status code, which its line names: it named HTTP's 499)
    assert {r.grpc_code for r in lines} == {"CANCELLED"}  # type: ignore[attr-defined]
    assert all(r.getMessage().startswith("grpc slow CANCELLED: ") for r in lines)


def cancel_a_stream(
    slow: RunningServer, caplog: pytest.LogCaptureFixture, traceparent: str
) -> list[logging.LogRecord]:
    """Stream one request (under `traceparent`) to 'slow', cancel the stream while it runs:
    the log lines of its cancelled requests."""
    tensor = grpcclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    running(slow, busy=False)
    with caplog.at_level(logging.INFO, logger="duetime.requests"):
        with grpcclient.InferenceServerClient(slow.grpc) as client:
            client.start_stream(
                callback=lambda *_, **__: None, headers={"traceparent": traceparent}
            )
            client.async_stream_infer("slow", [tensor], request_id="only")
            running(slow)  # (its answer is awaited: the stream's loop holds it)
            client.stop_stream(cancel_requests=True)
        return cancelled_lines(caplog, "grpc-stream")


def test_a_streamed_request_awaiting_its_answer_when_the_stream_ends_is_logged(
    slow: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The request whose answer the stream was waiting for had left the window, and only the
    window's were logged: a cancelled stream lost that request's line (counted failed)."""
    lines = cancel_a_stream(slow, caplog, TRACEPARENT)
    statuses = {(r.model, r.status, r.trace_id) for r in lines}  # type: ignore[attr-defined]
    assert statuses == {("slow", 499, TRACE_ID)}


def server_span(
    traced: tuple[RunningServer, InMemorySpanExporter, Tracing], trace_id: str
) -> ReadableSpan:
    """The one server span of `trace_id` exported."""
    _, exporter, tracing = traced
    tracing.provider.force_flush()
    [span] = [
        s for s in exporter.get_finished_spans()
        if f"{s.context.trace_id:032x}" == trace_id and s.kind == SpanKind.SERVER
    ]  # fmt: skip
    return span


@pytest.mark.parametrize("caller", [True, False])
def test_a_grpc_call_its_client_cancels_gets_its_span(
    traced: tuple[RunningServer, InMemorySpanExporter, Tracing],
    caplog: pytest.LogCaptureFixture,
    caller: bool,
) -> None:
    """Found by a tester: it was counted cancelled and logged 499 but had no span (its trace
    lost), where an HTTP request withdrawn so has one; gRPC's conventions give it CANCELLED.
    Its line has the span's trace id, also where the caller sent no traceparent (it had none)."""
    slow = traced[0]
    tensor = grpcclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    caller_id = "7" * 32  # (its own: the tests above trace theirs as TRACE_ID)
    headers = {"traceparent": f"00-{caller_id}-00f067aa0ba902b7-01"} if caller else {}
    running(slow, busy=False)
    with caplog.at_level(logging.INFO, logger="duetime.requests"):
        with grpcclient.InferenceServerClient(slow.grpc) as client:
            call = client.async_infer(
                "slow", [tensor], callback=lambda *_, **__: None, headers=headers
            )
            running(slow)  # (cancelled while it runs: the server has it)
            call.cancel()
        [line] = cancelled_lines(caplog, "grpc")
    trace_id = line.trace_id  # type: ignore[attr-defined]
    if caller:
        assert trace_id == caller_id
    span = server_span(traced, trace_id)
    assert span.name == "inference.GRPCInferenceService/ModelInfer"
    assert span.attributes["rpc.grpc.status_code"] == 1  # CANCELLED
    assert span.attributes["error.type"] == "CANCELLED"
    assert span.status.status_code == StatusCode.UNSET  # (the client's doing)
    children = {
        s.name for s in traced[1].get_finished_spans()
        if s.parent is not None and s.parent.span_id == span.context.span_id
    }  # fmt: skip
    assert {"decode", "queue", "batch", "execute"} <= children


def test_a_streamed_request_cancelled_with_its_stream_gets_its_span(
    traced: tuple[RunningServer, InMemorySpanExporter, Tracing],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found by a tester: as a unary call, it was logged 499 with no span."""
    slow = traced[0]
    trace_id = "6" * 32
    [line] = cancel_a_stream(slow, caplog, f"00-{trace_id}-00f067aa0ba902b7-01")
    assert line.trace_id == trace_id  # type: ignore[attr-defined]
    span = server_span(traced, trace_id)
    assert span.name == "inference.GRPCInferenceService/ModelStreamInfer"
    assert span.attributes["error.type"] == "CANCELLED"
    # (a stream's requests share its call's status: none has `rpc.grpc.status_code`)
    assert "rpc.grpc.status_code" not in span.attributes
