"""A traced HTTP request its client withdraws while it is queued gets its span from the
connection that cancels it, with no callback on its ticket's future (one on every traced
request ran on the loop at each settle, for the rare cancellation); a request held back keeps
its body's size as read, which the load shedder weighs (as a request sent at once)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from memory_fakes import Transport
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from repo_models import scale_model, write_version

from duetime.config import ServerSettings
from duetime.frontend.http import HttpConnection
from duetime.frontend.rest import HeldInfer
from duetime.observability.tracing import Tracing, tracing_from_env
from duetime.server import Server

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def waits_repo(root: Path) -> Path:
    """Model 'waits' (y = 2x), fifo: a lone request waits 0.3 s in its queue for a batch of 4."""
    write_version(root, "waits", 1, scale_model(2.0))
    (root / "waits" / "config.toml").write_text(
        'max_batch_size = 16\n[scheduling]\npolicy = "fifo"\n'
        "max_queue_delay_us = 300000\npreferred_batch_size = [4]\n"
    )
    return root


async def waits_server(root: Path, tracing: Tracing) -> tuple[Server, HttpConnection]:
    """A started server of model 'waits' (see `waits_repo`), traced, and an HTTP connection to
    it with no transport yet."""
    settings = ServerSettings(
        model_repository=waits_repo(root), http_port=0, grpc_port=0, metrics=False,
        tune_runtime=False, cpus="none",
    )  # fmt: skip
    server = Server(settings, tracing=tracing)
    await server.start()
    return server, HttpConnection(server._rest, settings, server._connections)


BODY = json.dumps(
    {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [1, 4],
                "data": np.ones(4, np.float32).tolist(),
            }
        ]
    }
).encode()


def test_a_withdrawn_traced_request_gets_its_span_without_a_callback(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    tracing = tracing_from_env({}, exporter=exporter)
    assert tracing is not None

    async def body() -> dict[str, Any]:
        server, connection = await waits_server(tmp_path, tracing)
        transport = Transport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        try:
            held = server._rest.hold_back("POST", b"/v2/models/waits/infer", {}, BODY)
            assert isinstance(held, HeldInfer)
            connection.data_received(
                b"POST /v2/models/waits/infer HTTP/1.1\r\nHost: x\r\n"
                + f"traceparent: 00-{TRACE_ID}-00f067aa0ba902b7-01\r\n".encode()
                + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
                + BODY
            )
            await asyncio.sleep(0.05)  # (queued: its batch waits 0.3 s)
            [pending] = [slot.pending for slot in connection._slots if slot.pending is not None]
            callbacks = list(getattr(pending.ticket.future, "_callbacks", None) or [])
            connection.connection_lost(None)
            await asyncio.sleep(0.01)
            return {
                "held_bytes": getattr(held, "body_bytes", None),
                "callbacks": callbacks,
                "written": transport.written,
            }
        finally:
            await server.stop()

    found = asyncio.run(body())
    assert found["callbacks"] == [], "no callback on a traced request's future"
    assert found["written"] == [], "withdrawn while queued: never answered"
    tracing.provider.force_flush()
    [span] = [
        s
        for s in exporter.get_finished_spans()
        if f"{s.context.trace_id:032x}" == TRACE_ID and s.kind == SpanKind.SERVER
    ]
    assert span.attributes["error.type"] == "499"  # (the client's doing: no error status)
    assert span.attributes["http.response.status_code"] == 499
    assert found["held_bytes"] == len(BODY)


def test_a_withdrawn_request_without_a_traceparent_logs_its_spans_trace_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its 499 line had no trace id, though its span was exported (found by a tester): the
    line could not be joined to the span."""
    exporter = InMemorySpanExporter()
    tracing = tracing_from_env({}, exporter=exporter)
    assert tracing is not None

    async def body() -> None:
        server, connection = await waits_server(tmp_path, tracing)
        connection.connection_made(Transport())  # type: ignore[arg-type]
        try:
            connection.data_received(
                b"POST /v2/models/waits/infer HTTP/1.1\r\nHost: x\r\n"
                + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
                + BODY
            )
            await asyncio.sleep(0.05)  # (queued: its batch waits 0.3 s)
            connection.connection_lost(None)
            await asyncio.sleep(0.01)
        finally:
            await server.stop()

    with caplog.at_level(logging.INFO, logger="duetime.requests"):
        asyncio.run(body())
    tracing.provider.force_flush()
    [span] = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    [line] = [r for r in caplog.records if getattr(r, "status", None) == 499]
    assert line.trace_id == f"{span.context.trace_id:032x}"  # type: ignore[attr-defined]
