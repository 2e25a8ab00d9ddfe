"""Tracing: the request span and its stage spans, W3C traceparent in, x-trace-id out, and the
trace id in error messages, over HTTP and gRPC."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import RunningServer, serving, start_server, stop_server
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from repo_models import scale_model, write_version
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from duetime import server as server_module
from duetime.config import ServerSettings
from duetime.errors import ConfigError
from duetime.observability import tracing as tracing_module
from duetime.observability.tracesettings import TraceSettings
from duetime.observability.tracing import Tracing, parse_traceparent, tracing_from_env
from duetime.types import RequestTiming

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
STAGES = {"decode", "queue", "batch", "execute", "encode"}


@pytest.fixture(scope="module")
def traced(mlp_repo: Path) -> Iterator[tuple[RunningServer, InMemorySpanExporter, Tracing]]:
    exporter = InMemorySpanExporter()
    tracing = tracing_from_env({}, exporter=exporter)
    assert tracing is not None
    # (no load shedder: on a busy CI machine its loop read as saturated now and then, and the
    # request due in 1 µs was refused unread, 429 with no span, not 504 with one)
    settings = ServerSettings(
        model_repository=mlp_repo, http_port=0, grpc_port=0, overload_utilization=0
    )
    running, thread = start_server(settings, tracing=tracing)
    yield running, exporter, tracing
    stop_server(running, thread)


def infer_http(
    server: RunningServer, headers: dict[str, str], rows: int = 1
) -> tuple[int, dict[str, str], dict[str, object]]:
    host, port = server.http.split(":")
    connection = http.client.HTTPConnection(host, int(port))
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 40],
                        "data": [0.5] * (40 * rows)}]}  # fmt: skip
    connection.request("POST", "/v2/models/mlp/infer", json.dumps(body), headers)
    response = connection.getresponse()
    doc = json.loads(response.read())
    connection.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, doc


def failed_with(root: ReadableSpan) -> str:
    """The message of the failure a server span records (its exception event)."""
    [event] = [e for e in root.events if e.name == "exception"]
    return str(event.attributes["exception.message"])  # type: ignore[index]


def client_fault(root: ReadableSpan, error_type: str) -> bool:
    """Whether `root` is a client's failure as OpenTelemetry's conventions have it: status
    unset (a 4xx, or INVALID_ARGUMENT and the like), `error.type` set."""
    return (
        root.status.status_code == StatusCode.UNSET and root.attributes["error.type"] == error_type
    )


def spans_of(exporter: InMemorySpanExporter, tracing: Tracing, trace_id: str) -> list:
    tracing.provider.force_flush()
    return [s for s in exporter.get_finished_spans() if f"{s.context.trace_id:032x}" == trace_id]


def test_http_request_span_has_stage_children_under_the_callers_span(traced) -> None:
    server, exporter, tracing = traced
    status, headers, _ = infer_http(server, {"traceparent": TRACEPARENT})
    assert status == 200
    assert headers["x-trace-id"] == TRACE_ID
    spans = spans_of(exporter, tracing, TRACE_ID)
    root = next(s for s in spans if s.kind == SpanKind.SERVER)
    assert f"{root.parent.span_id:016x}" == PARENT_ID
    assert root.attributes["duetime.model"] == "mlp"
    assert root.attributes["duetime.variant"] == "default"
    children = [
        s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id
    ]
    assert {s.name for s in children} == STAGES
    for child in children:
        assert root.start_time <= child.start_time <= child.end_time <= root.end_time
    execute = next(s for s in children if s.name == "execute")
    assert execute.attributes["duetime.compute_ns"] > 0


def test_the_callers_tracestate_is_carried_over_http_and_grpc(traced) -> None:
    """W3C Trace Context: a participant receiving `tracestate` propagates it."""
    server, exporter, tracing = traced
    state = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    trace_ids = {"http": "5" * 31 + "a", "grpc": "5" * 31 + "b", "refused": "5" * 31 + "c"}
    for kind, trace_id in trace_ids.items():
        headers = {"traceparent": f"00-{trace_id}-{PARENT_ID}-01", "tracestate": state}
        if kind == "grpc":
            with grpcclient.InferenceServerClient(server.grpc) as client:
                tensor = grpcclient.InferInput("x", [1, 40], "FP32")
                tensor.set_data_from_numpy(np.zeros((1, 40), dtype=np.float32))
                client.infer("mlp", [tensor], headers=headers)
        elif kind == "http":
            assert infer_http(server, headers)[0] == 200
        else:  # (refused before it was queued: a model that does not exist)
            host, port = server.http.split(":")
            connection = http.client.HTTPConnection(host, int(port))
            connection.request("POST", "/v2/models/nosuch/infer", '{"inputs": []}', headers)
            assert connection.getresponse().status == 404
            connection.close()
        [root] = [s for s in spans_of(exporter, tracing, trace_id) if s.kind == SpanKind.SERVER]
        assert root.parent.trace_state.to_header() == state, kind
        assert root.context.trace_state.to_header() == state, kind


def test_a_request_without_traceparent_gets_a_fresh_trace(traced) -> None:
    server, exporter, tracing = traced
    status, headers, _ = infer_http(server, {})
    assert status == 200
    trace_id = headers["x-trace-id"]
    assert len(trace_id) == 32
    assert trace_id != TRACE_ID
    assert {s.name for s in spans_of(exporter, tracing, trace_id)} >= STAGES


def test_errors_carry_the_trace_id(traced) -> None:
    server, _, _ = traced
    host, port = server.http.split(":")
    connection = http.client.HTTPConnection(host, int(port))
    connection.request("POST", "/v2/models/mlp/infer", b"{bad json", {"traceparent": TRACEPARENT})
    response = connection.getresponse()
    doc = json.loads(response.read())
    assert response.status == 400
    assert response.getheader("x-trace-id") == TRACE_ID
    assert doc["error"].endswith(f"(trace {TRACE_ID})")
    connection.request("GET", "/v2/models/nope")
    response = connection.getresponse()
    doc = json.loads(response.read())
    connection.close()
    assert response.status == 404
    assert "(trace " in doc["error"]  # a fresh one when the caller sent none


def test_grpc_traceparent_metadata_and_trailing_trace_id(traced) -> None:
    server, exporter, tracing = traced
    client = grpcclient.InferenceServerClient(server.grpc)
    tensor = grpcclient.InferInput("x", [1, 40], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 40), dtype=np.float32))
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    client.infer("mlp", [tensor], headers={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"})
    spans = spans_of(exporter, tracing, trace_id)
    assert {s.name for s in spans} >= STAGES | {"inference.GRPCInferenceService/ModelInfer"}
    bad = grpcclient.InferInput("x", [1, 3], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
    with pytest.raises(InferenceServerException, match=f"trace {trace_id}"):
        client.infer("mlp", [bad], headers={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"})


def test_http_requests_refused_get_their_span(traced) -> None:
    """Only answered requests had a span: an invalid one and one refused for its due time had
    none, with a sampled traceparent."""
    server, exporter, tracing = traced
    host, port = server.http.split(":")
    cases = {
        "1" * 31 + "c": ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3],
                                       "data": [0.5] * 3}]}, 400, "shape"),
        "1" * 31 + "d": ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 40],
                                       "data": [0.5] * 40}], "parameters": {"timeout": 1}},
                         504, "due"),
    }  # fmt: skip
    for trace_id, (body, status, needle) in cases.items():
        connection = http.client.HTTPConnection(host, int(port))
        traceparent = {"traceparent": f"00-{trace_id}-{PARENT_ID}-01"}
        connection.request("POST", "/v2/models/mlp/infer", json.dumps(body), traceparent)
        response = connection.getresponse()
        response.read()
        connection.close()
        assert (response.status, response.getheader("x-trace-id")) == (status, trace_id)
        [root] = [s for s in spans_of(exporter, tracing, trace_id) if s.kind == SpanKind.SERVER]
        assert needle in failed_with(root)
        if status < 500:  # (the client's doing: no error status, as the conventions say)
            assert client_fault(root, str(status))
        else:
            assert root.status.status_code == StatusCode.ERROR
            assert needle in root.status.description
        assert f"{root.parent.span_id:016x}" == PARENT_ID
        if needle == "due":  # (decoded, then due before it reached the scheduler)
            children = {s.name for s in spans_of(exporter, tracing, trace_id) if s is not root}
            assert children == {"decode", "encode"}


def test_grpc_requests_refused_or_streamed_get_their_span(traced) -> None:
    """Only answered unary calls had a span: an invalid request, one refused for its due time,
    and every request of a stream had none (with a sampled traceparent)."""
    server, exporter, tracing = traced
    client = grpcclient.InferenceServerClient(server.grpc)
    bad = grpcclient.InferInput("x", [1, 3], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
    good = grpcclient.InferInput("x", [1, 40], "FP32")
    good.set_data_from_numpy(np.zeros((1, 40), dtype=np.float32))

    def traceparent(trace_id: str) -> dict[str, str]:
        return {"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"}

    invalid, late = "1" * 31 + "a", "1" * 31 + "b"
    with pytest.raises(InferenceServerException):
        client.infer("mlp", [bad], headers=traceparent(invalid))
    with pytest.raises(InferenceServerException, match="due"):
        client.infer("mlp", [good], headers=traceparent(late), timeout=1)  # (1 µs)
    for trace_id, needle in ((invalid, "shape"), (late, "due")):
        [root] = [s for s in spans_of(exporter, tracing, trace_id) if s.kind == SpanKind.SERVER]
        assert needle in failed_with(root)
        if trace_id == invalid:  # (INVALID_ARGUMENT: the client's doing)
            assert client_fault(root, "INVALID_ARGUMENT")
        else:  # (DEADLINE_EXCEEDED: an error status, as the conventions say)
            assert root.status.status_code == StatusCode.ERROR
            assert needle in root.status.description
        assert root.attributes["rpc.system"] == "grpc"

    streamed = "2" * 31 + "c"
    answers: list[object] = []
    client.start_stream(callback=lambda result, error: answers.append(error or result),
                        headers=traceparent(streamed))  # fmt: skip
    client.async_stream_infer("mlp", [good], request_id="ok")
    client.async_stream_infer("mlp", [bad], request_id="bad")
    client.stop_stream()
    assert len(answers) == 2
    roots = [s for s in spans_of(exporter, tracing, streamed) if s.kind == SpanKind.SERVER]
    assert sorted("error.type" in s.attributes for s in roots) == [False, True]
    assert {s.attributes["rpc.method"] for s in roots} == {"ModelStreamInfer"}
    answered = next(s for s in roots if "error.type" not in s.attributes)
    children = {
        s.name for s in spans_of(exporter, tracing, streamed)
        if s.parent is not None and s.parent.span_id == answered.context.span_id
    }  # fmt: skip
    assert children == STAGES


def test_unsampled_callers_are_not_recorded(traced) -> None:
    server, exporter, tracing = traced
    trace_id = "11111111111111111111111111111111"
    status, headers, _ = infer_http(server, {"traceparent": f"00-{trace_id}-1111111111111111-00"})
    assert status == 200
    assert headers["x-trace-id"] == trace_id
    assert spans_of(exporter, tracing, trace_id) == []


@pytest.mark.parametrize(
    "value",
    [None, "", "garbage", f"ff-{TRACE_ID}-{PARENT_ID}-01", f"00-{'0' * 32}-{PARENT_ID}-01",
     f"00-{TRACE_ID}-{'0' * 16}-01", f"00-{TRACE_ID[:-1]}-{PARENT_ID}-01",
     f"00-{TRACE_ID.upper()}-{PARENT_ID}-01", f"00-{TRACE_ID}-{PARENT_ID}-01-extra",
     f"00-{TRACE_ID}-{PARENT_ID}-01.", f"cc-{TRACE_ID}-{PARENT_ID}-01.what"],
)  # fmt: skip
def test_malformed_traceparent_is_ignored(value: str | None) -> None:
    """As W3C Trace Context (and OpenTelemetry's propagator): lowercase hex only; version 00
    is exactly 55 characters; a later version may only add '-' separated fields."""
    assert parse_traceparent(value) is None


def test_a_later_traceparent_version_may_carry_more_fields() -> None:
    parent = parse_traceparent(f" cc-{TRACE_ID}-{PARENT_ID}-01-what-follows ")
    assert parent is not None
    assert parent.trace_id_hex == TRACE_ID


def test_tracing_is_off_without_otel_variables() -> None:
    assert tracing_from_env({}) is None
    assert tracing_from_env({"OTEL_TRACES_EXPORTER": "none"}) is None
    assert (
        tracing_from_env({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}) is None
    )
    console = tracing_from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert console is not None
    console.shutdown()


def test_every_exporter_the_list_names_gets_the_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_TRACES_EXPORTER is a comma-separated list: `console,otlp` read only its first name,
    and the OTLP collector got nothing."""
    from opentelemetry.exporter.otlp.proto.http import trace_exporter

    made: dict[str, InMemorySpanExporter] = {}

    def recording(name: str) -> type[InMemorySpanExporter]:
        class Recording(InMemorySpanExporter):
            def __init__(self) -> None:
                super().__init__()
                made[name] = self

        return Recording

    monkeypatch.setattr(tracing_module, "ConsoleSpanExporter", recording("console"))
    monkeypatch.setattr(trace_exporter, "OTLPSpanExporter", recording("otlp"))
    tracing = tracing_from_env({"OTEL_TRACES_EXPORTER": " console , otlp,console"})
    assert tracing is not None
    timing = RequestTiming(1_000, decoded_ns=2_000)
    record = {"protocol": "http", "model": "m", "version": "1", "variant": "default"}
    trace_id = tracing.record(timing, None, **record, error=None, done_ns=3_000)
    tracing.provider.force_flush()
    tracing.shutdown()
    assert sorted(made) == ["console", "otlp"]  # (each once)
    for exporter in made.values():
        assert {f"{s.context.trace_id:032x}" for s in exporter.get_finished_spans()} == {trace_id}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("jaeger,otlp", "'jaeger' is not supported"),
        ("console,zipkin", "'zipkin' is not supported"),
        ("none,console", "'none' cannot be listed with other exporters"),
    ],
)
def test_a_list_naming_what_cannot_be_done_is_refused(value: str, message: str) -> None:
    """As the Python SDK (no exporter named so) and Java's autoconfigure refuse them."""
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER") as caught:
        tracing_from_env({"OTEL_TRACES_EXPORTER": value})
    assert message in caught.value.message


def test_http_spans_name_their_route_and_path(traced) -> None:
    """OpenTelemetry's HTTP server spans need `url.path` and `url.scheme`, and `http.route`
    where known (it names the span): an answered, a refused and an unknown model's request,
    with and without a version in the path (they had only the method)."""
    server, exporter, tracing = traced
    host, port = server.http.split(":")
    version_route = "/v2/models/{model_name}/versions/{model_version}/infer"
    cases = [
        ("7" * 31 + "a", "/v2/models/mlp/infer?x=1", 40, 200, "/v2/models/{model_name}/infer"),
        ("7" * 31 + "b", "/v2/models/mlp/versions/1/infer", 3, 400, version_route),
        ("7" * 31 + "c", "/v2/models/no%20such/infer", 40, 404, "/v2/models/{model_name}/infer"),
    ]
    for trace_id, target, width, status, route in cases:
        connection = http.client.HTTPConnection(host, int(port))
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, width],
                            "data": [0.5] * width}]}  # fmt: skip
        traceparent = {"traceparent": f"00-{trace_id}-{PARENT_ID}-01"}
        connection.request("POST", target, json.dumps(body), traceparent)
        response = connection.getresponse()
        response.read()
        connection.close()
        assert response.status == status, target
        [root] = [s for s in spans_of(exporter, tracing, trace_id) if s.kind == SpanKind.SERVER]
        assert root.name == f"POST {route}"
        assert dict(root.attributes).items() >= {
            "http.request.method": "POST", "http.response.status_code": status,
            "url.scheme": "http", "url.path": target.partition("?")[0], "http.route": route,
        }.items(), target  # fmt: skip


def test_kserve_v1_predicts_get_their_span_and_trace_id(traced) -> None:
    """V1 `:predict` had no span (answered or refused) and no `x-trace-id` on success, even
    with a traceparent: it gets what a v2 inference gets."""
    server, exporter, tracing = traced
    host, port = server.http.split(":")
    cases = {
        "3" * 31 + "a": ([[0.5] * 40], 200, None),
        "3" * 31 + "b": ([[0.5] * 3], 400, "shape"),
    }
    for trace_id, (instances, status, needle) in cases.items():
        connection = http.client.HTTPConnection(host, int(port))
        traceparent = {"traceparent": f"00-{trace_id}-{PARENT_ID}-01"}
        body = json.dumps({"instances": instances})
        connection.request("POST", "/v1/models/mlp:predict", body, traceparent)
        response = connection.getresponse()
        response.read()
        connection.close()
        assert (response.status, response.getheader("x-trace-id")) == (status, trace_id)
        [root] = [s for s in spans_of(exporter, tracing, trace_id) if s.kind == SpanKind.SERVER]
        assert f"{root.parent.span_id:016x}" == PARENT_ID
        assert root.name == "POST /v1/models/{model_name}:predict"
        assert root.attributes["url.path"] == "/v1/models/mlp:predict"
        if needle is None:
            assert root.status.is_ok
            children = {
                s.name for s in spans_of(exporter, tracing, trace_id)
                if s.parent is not None and s.parent.span_id == root.context.span_id
            }  # fmt: skip
            assert children == STAGES
        else:
            assert needle in failed_with(root)


class HungExporter(SpanExporter):
    """An exporter whose collector never answers: `export` blocks until `release`."""

    def __init__(self) -> None:
        self.exporting = threading.Event()
        self.release = threading.Event()
        self.stopped = threading.Event()
        self.batches = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.batches += 1
        self.exporting.set()
        self.release.wait(30)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.stopped.set()


def test_shutdown_drops_what_a_hung_exporter_holds_instead_of_waiting(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shutdown waited for the exporter without a bound (an OTLP collector down or not
    answering: 10 s a batch, plus retries; SIGTERM took 5-19 s): it stops the exporter once its
    deadline passes, drops the spans it holds, with one warning, and returns."""
    hung = HungExporter()
    tracing = tracing_from_env({}, exporter=hung)
    assert tracing is not None
    timing = RequestTiming(1_000, decoded_ns=2_000)
    record = {"protocol": "http", "model": "m", "version": "1", "variant": "default"}
    tracing.record(timing, None, **record, error=None, done_ns=3_000)
    # (flushed on a thread of its own: it blocks in the export)
    flushing = threading.Thread(target=tracing.provider.force_flush, daemon=True)
    flushing.start()
    try:
        assert hung.exporting.wait(10)
        tracing.record(timing, None, **record, error=None, done_ns=3_000)  # (left queued)
        monkeypatch.setattr(tracing_module, "SHUTDOWN_EXPORT_S", 0.05, raising=False)
        stopping = threading.Thread(target=tracing.shutdown, daemon=True)
        with caplog.at_level(logging.WARNING, logger="duetime.tracing"):
            stopping.start()
            stopping.join(10)
            assert not stopping.is_alive()
        assert hung.stopped.is_set()
        [warning] = [r for r in caplog.records if r.name == "duetime.tracing"]
        assert "dropped" in warning.getMessage()
    finally:
        hung.release.set()
    flushing.join(10)
    assert hung.batches == 1  # (the queued span is dropped, never handed to the exporter)


def test_server_stop_waits_for_a_hung_exporter_no_longer_than_its_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM took 5-19 s to end a server whose OTLP collector was down or not answering:
    `Server.stop` waited on the exporter without a bound. It waits at most the shutdown grace
    (here 0.1 s; the usual bound made long), drops the spans left and returns."""
    monkeypatch.setattr(server_module, "SHUTDOWN_EXPORT_S", 60.0, raising=False)
    write_version(tmp_path, "m", 1, scale_model(2.0))
    hung = HungExporter()
    tracing = tracing_from_env({}, exporter=hung)
    settings = ServerSettings(
        model_repository=tmp_path, http_port=0, grpc_port=0, shutdown_grace_s=0.1
    )
    running, thread = start_server(settings, tracing=tracing)
    try:
        host, port = running.http.split(":")
        connection = http.client.HTTPConnection(host, int(port))
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]}
        connection.request("POST", "/v2/models/m/infer", json.dumps(body))
        assert connection.getresponse().status == 200
        connection.close()
        started = time.monotonic()
        stop = asyncio.run_coroutine_threadsafe(running.server.stop(), running.loop)
        stop.result(timeout=30)
        assert time.monotonic() - started < 5  # (it waited for the export: 30 s here)
        assert hung.exporting.is_set()
        assert hung.stopped.is_set()
    finally:
        hung.release.set()
        running.loop.call_soon_threadsafe(running.loop.stop)
        thread.join(timeout=60)
        running.loop.close()


def test_an_otlp_protocol_is_honoured_or_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a tester: OTEL_EXPORTER_OTLP_PROTOCOL=grpc was not read, and http/protobuf went
    to the collector's gRPC port: every span lost without a word."""
    from opentelemetry.exporter.otlp.proto.grpc import trace_exporter as grpc_exporter
    from opentelemetry.exporter.otlp.proto.http import trace_exporter as http_exporter

    made: list[str] = []

    def recording(name: str) -> type[InMemorySpanExporter]:
        class Recording(InMemorySpanExporter):
            def __init__(self) -> None:
                super().__init__()
                made.append(name)

        return Recording

    monkeypatch.setattr(grpc_exporter, "OTLPSpanExporter", recording("grpc"))
    monkeypatch.setattr(http_exporter, "OTLPSpanExporter", recording("http"))
    for env, kind in (
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
          "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, "http"),
        ({}, "http"),
    ):  # fmt: skip
        tracing = tracing_from_env({"OTEL_TRACES_EXPORTER": "otlp", **env})
        assert tracing is not None
        tracing.shutdown()
        assert made.pop() == kind
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL='http/json': not supp"):
        tracing_from_env(
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}
        )


def test_requests_for_unknown_model_names_grow_no_counters() -> None:
    """Found by a tester: each finished request's model name was counted for good, so requests
    for ever new (unknown) names grew the server without bound while tracing was on."""
    settings = TraceSettings(exporting=True)
    settings.update({"trace_rate": "3"}, "known")
    for index in range(1000):
        settings.sample(f"no-such-model-{index}")
    assert [settings.sample("known") for _ in range(4)] == [True, False, False, True]
    assert len(settings._seen) == 2  # (the global counter and the model with its own rate)


def test_requests_the_sampler_drops_do_not_use_up_the_trace_count() -> None:
    """Found by a tester: two requests under an unsampled traceparent used up trace_count 2,
    and no trace was ever exported."""
    exporter = InMemorySpanExporter()
    tracing = tracing_from_env({}, exporter=exporter)
    assert tracing is not None
    tracing.settings.update({"trace_count": "2"})
    unsampled = parse_traceparent(f"00-{TRACE_ID}-{PARENT_ID}-00")
    record = {"protocol": "http", "model": "m", "version": "1", "variant": "default"}
    for parent in (unsampled, unsampled, None, None, None):
        timing = RequestTiming(1_000, decoded_ns=2_000)
        tracing.record(timing, parent, **record, error=None, done_ns=3_000)
    tracing.provider.force_flush()
    roots = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert len(roots) == 2
    assert tracing.settings.current()["trace_count"] == "0"
    tracing.shutdown()


@pytest.mark.parametrize(
    "sampler", [{"OTEL_TRACES_SAMPLER": "always_off"},
                {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}],
)  # fmt: skip
def test_a_request_the_sampler_drops_has_no_trace_id_but_its_callers(
    monkeypatch: pytest.MonkeyPatch, sampler: dict[str, str]
) -> None:
    """Found by a tester: the trace id of the span the sampler dropped was returned (and sent
    in `x-trace-id`), a trace never exported, where a request `trace_rate` skips has none."""
    for name, value in sampler.items():
        monkeypatch.setenv(name, value)  # (the SDK's provider reads them)
    exporter = InMemorySpanExporter()
    tracing = tracing_from_env({}, exporter=exporter)
    assert tracing is not None
    record = {"protocol": "http", "model": "m", "version": "1", "variant": "default"}
    found = [
        tracing.record(RequestTiming(1_000, decoded_ns=2_000), parent, **record, error=None,
                       done_ns=3_000)
        for parent in (None, parse_traceparent(TRACEPARENT))
    ]  # fmt: skip
    assert found == [None, TRACE_ID]
    tracing.provider.force_flush()
    assert not exporter.get_finished_spans()
    tracing.shutdown()


def test_answers_of_requests_the_sampler_drops_carry_no_trace_id(
    monkeypatch: pytest.MonkeyPatch, mlp_repo: Path
) -> None:
    """Over HTTP and gRPC, with `OTEL_TRACES_SAMPLER=always_off`: no `x-trace-id` (it named a
    trace never recorded: found by a tester), but the caller's where it sent a traceparent,
    and an error still ends with a trace id."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    tracing = tracing_from_env({}, exporter=InMemorySpanExporter())
    settings = ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0)
    request = service_pb2.ModelInferRequest(model_name="mlp")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 40])
    request.raw_input_contents.append(np.zeros((1, 40), np.float32).tobytes())
    with serving(settings, tracing=tracing) as server:
        status, headers, _ = infer_http(server, {})
        assert (status, headers.get("x-trace-id")) == (200, None)
        assert infer_http(server, {"traceparent": TRACEPARENT})[1]["x-trace-id"] == TRACE_ID
        with grpc.insecure_channel(server.grpc) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            _, call = stub.ModelInfer.with_call(request)
            assert "x-trace-id" not in dict(call.trailing_metadata())
            _, call = stub.ModelInfer.with_call(request, metadata=[("traceparent", TRACEPARENT)])
            assert dict(call.trailing_metadata())["x-trace-id"] == TRACE_ID
            tensor.shape[:] = [1, 3]  # (invalid: its error names a fresh trace id)
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(request)
            assert "(trace " in refused.value.details()


def test_the_service_name_of_otel_resource_attributes_is_kept() -> None:
    """Found by a tester: duetime's default overrode it; only OTEL_SERVICE_NAME may."""
    for env, name in (
        ({"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=x,service.name=from%20attrs"},
         "from attrs"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=a", "OTEL_SERVICE_NAME": "b"}, "b"),
        ({}, "duetime"),
    ):  # fmt: skip
        tracing = tracing_from_env({"OTEL_TRACES_EXPORTER": "console", **env})
        assert tracing is not None
        assert tracing.provider.resource.attributes["service.name"] == name
        tracing.shutdown()


def test_tracestate_given_twice_over_grpc_is_combined(traced) -> None:
    """W3C Trace Context 3.3: several tracestate fields are one list (HTTP joined its header
    lines; gRPC kept the last entry alone: found by a tester)."""
    import grpc

    from duetime.frontend.proto import grpc_service_pb2 as pb
    from duetime.frontend.proto import grpc_service_pb2_grpc as pb_grpc

    server, exporter, tracing = traced
    trace_id = "6" * 31 + "d"
    request = pb.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 40])
    request.raw_input_contents.append(np.zeros((1, 40), np.float32).tobytes())
    metadata = [("traceparent", f"00-{trace_id}-{PARENT_ID}-01"), ("tracestate", "a=1"),
                ("tracestate", "b=2")]  # fmt: skip
    with grpc.insecure_channel(server.grpc) as channel:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, metadata=metadata, timeout=10)
    [root] = [s for s in spans_of(exporter, tracing, trace_id) if s.kind == SpanKind.SERVER]
    assert root.context.trace_state.to_header() == "a=1,b=2"


def test_a_malformed_tracestate_is_dropped_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """W3C: discarded. It logged OpenTelemetry's warning once per request (found by a tester)."""
    with caplog.at_level(logging.WARNING):
        for index in range(3):
            parent = parse_traceparent(TRACEPARENT, f"=x{index}")
            assert parent is not None
            assert parent.state.to_header() == ""
    assert not [r for r in caplog.records if "w3c" in r.getMessage()]
