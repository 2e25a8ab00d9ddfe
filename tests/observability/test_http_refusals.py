"""The HTTP front end's accounting of requests that fail before or instead of an answer: a
request its client withdrew while it was queued gets its span (it had none, though counted
cancelled and logged 499); the span of a request refused after its model was resolved names the
version (and variant) the metrics count it under (it said version ''); and every inference
request answered with an error before any model ran it counts in
`duetime_requests_refused_total` (a malformed body, a bad 'timeout' or 'priority' moved no
metric), with no label a client chooses."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import RunningServer, serving
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from repo_models import scale_model, write_version
from tritonclient.utils import InferenceServerException

from duetime.config import ServerSettings
from duetime.observability.tracing import Tracing, tracing_from_env

pytestmark = pytest.mark.timeout(60)

PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunningServer, InMemorySpanExporter, Tracing]]:
    """Model 'waits' (y = 2x, FP32 [b, 4]), fifo: a lone request waits 0.3 s in its queue for a
    batch of 4, still queued when its client leaves."""
    repo = tmp_path_factory.mktemp("repo")
    write_version(repo, "waits", 1, scale_model(2.0))
    (repo / "waits" / "config.toml").write_text(
        'max_batch_size = 16\n[scheduling]\npolicy = "fifo"\n'
        "max_queue_delay_us = 300000\npreferred_batch_size = [4]\n"
    )
    exporter = InMemorySpanExporter()
    tracing = tracing_from_env({}, exporter=exporter)
    assert tracing is not None
    with serving(
        ServerSettings(model_repository=repo, http_port=0, grpc_port=0), tracing=tracing
    ) as running:
        yield running, exporter, tracing


def server_spans(exporter: InMemorySpanExporter, tracing: Tracing, trace_id: str) -> list[Any]:
    """The finished server spans of trace `trace_id`."""
    tracing.provider.force_flush()
    return [
        s
        for s in exporter.get_finished_spans()
        if f"{s.context.trace_id:032x}" == trace_id and s.kind == SpanKind.SERVER
    ]


def server_span(exporter: InMemorySpanExporter, tracing: Tracing, trace_id: str) -> Any:
    [root] = server_spans(exporter, tracing, trace_id)
    return root


def post(server: RunningServer, body: bytes, trace_id: str, model: str = "waits") -> int:
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        headers = {"traceparent": f"00-{trace_id}-{PARENT_ID}-01"}
        connection.request("POST", f"/v2/models/{model}/infer", body, headers)
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def waits_body(shape: tuple[int, ...] = (1, 4), parameters: dict[str, Any] | None = None) -> bytes:
    tensor = {"name": "x", "datatype": "FP32", "shape": list(shape),
              "data": np.ones(shape, np.float32).ravel().tolist()}  # fmt: skip
    return json.dumps({"inputs": [tensor], "parameters": parameters or {}}).encode()


def test_a_request_its_client_withdrew_gets_its_span(traced: Any) -> None:
    server, exporter, tracing = traced
    trace_id = "2" * 31 + "a"
    before = server.statistics("waits").cancelled
    host, port = server.http.rsplit(":", 1)
    body = waits_body()
    with socket.create_connection((host, int(port)), timeout=20) as client:
        client.sendall(
            f"POST /v2/models/waits/infer HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n"
            f"traceparent: 00-{trace_id}-{PARENT_ID}-01\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 20
        while not server.statistics("waits").queued:
            assert time.monotonic() < deadline, "the request was never queued"
            time.sleep(0.005)
    deadline = time.monotonic() + 20
    while server.statistics("waits").cancelled == before:
        assert time.monotonic() < deadline, "the request was never withdrawn"
        time.sleep(0.005)
    # (the span ends as the connection settles the request, which may come a loop turn after
    # the model counted the withdrawal: a loaded CI machine once looked in between)
    while not server_spans(exporter, tracing, trace_id):
        assert time.monotonic() < deadline, "the withdrawn request's span never ended"
        time.sleep(0.005)
    root = server_span(exporter, tracing, trace_id)
    assert root.attributes["error.type"] == "499"  # (the client's doing: no error status)
    assert root.attributes["http.response.status_code"] == 499
    assert root.attributes["duetime.version"] == "1"
    assert f"{root.parent.span_id:016x}" == PARENT_ID


def test_spans_of_refused_requests_name_the_version_counted(traced: Any) -> None:
    server, exporter, tracing = traced
    cases = {
        "3" * 31 + "a": (waits_body((1, 3)), 400, ""),  # (invalid: counted under no variant)
        "3" * 31 + "b": (waits_body(parameters={"timeout": 1}), 504, "default"),
    }
    for trace_id, (body, status, variant) in cases.items():
        assert post(server, body, trace_id) == status
        root = server_span(exporter, tracing, trace_id)
        assert root.attributes["duetime.version"] == "1"
        assert root.attributes["duetime.variant"] == variant


def test_spans_of_refused_grpc_calls_name_the_version_counted_too(traced: Any) -> None:
    """gRPC's spans said version '' and variant '' for the same refusals (found by a tester)."""
    server, exporter, tracing = traced
    client = grpcclient.InferenceServerClient(server.grpc)
    cases = {
        "4" * 31 + "a": ((1, 3), {}, ""),  # (invalid: counted under no variant)
        "4" * 31 + "b": ((1, 4), {"timeout": 1}, "default"),
    }
    try:
        for trace_id, (shape, parameters, variant) in cases.items():
            x = grpcclient.InferInput("x", list(shape), "FP32")
            x.set_data_from_numpy(np.ones(shape, np.float32))
            headers = {"traceparent": f"00-{trace_id}-{PARENT_ID}-01"}
            with pytest.raises(InferenceServerException):
                client.infer("waits", [x], headers=headers, **parameters)
            root = server_span(exporter, tracing, trace_id)
            assert root.attributes["duetime.version"] == "1"
            assert root.attributes["duetime.variant"] == variant
    finally:
        client.close()


def refused(server: RunningServer) -> dict[tuple[str, ...], float]:
    counts = server.samples("duetime_requests_refused_total", "protocol", "status", "reason")
    assert not any("made-up-model" in "".join(key) for key in counts)  # (no client's label)
    return {
        (status, reason): n
        for (protocol, status, reason), n in counts.items()
        if protocol == "http"
    }


def test_requests_refused_before_any_model_ran_them_are_counted(traced: Any) -> None:
    server, _, _ = traced
    before = refused(server)
    trace_id = "4" * 32
    assert post(server, b'{"inputs": [', trace_id) == 400
    assert post(server, waits_body(parameters={"timeout": -5}), trace_id) == 400
    assert post(server, waits_body(parameters={"priority": "high"}), trace_id) == 400
    assert post(server, waits_body(), trace_id, model="made-up-model") == 404
    after = refused(server)

    def more(key: tuple[str, str]) -> float:
        return after.get(key, 0) - before.get(key, 0)

    assert more(("400", "InvalidInput")) == 3
    assert more(("404", "ModelNotFound")) == 1


def test_untraced_refusals_are_counted_too(mlp_repo: Path) -> None:
    """(Without tracing, a refusal takes `RestApi.handle`'s way to its reply.)"""
    settings = ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0)
    with serving(settings) as server:
        assert post(server, b'{"inputs": [', "5" * 32, model="mlp") == 400
        assert refused(server) == {("400", "InvalidInput"): 1}
