"""What a traced request's stage spans show of its run (with a fake executor and a fake clock),
its span's name and semantic-convention attributes, and the caller's `tracestate`."""

from __future__ import annotations

import asyncio

import pytest
from held_executor import HeldExecutor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from duetime.clock import FakeClock
from duetime.config import SchedulingConfig
from duetime.errors import DeadlineExceeded, ModelNotFound
from duetime.observability.tracing import (
    RequestTiming,
    Tracing,
    _server_span,
    http_target,
    parse_traceparent,
)
from duetime.scheduling.profile import profile_from_samples
from duetime.scheduling.scheduler import ModelScheduler

US = 1_000
MS = 1_000_000
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def recorder() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider), exporter


def run_behind_a_batch_that_ends_early(ahead_ns: int, compute_ns: int) -> RequestTiming:
    """A traced request taken into the batch planned behind a running one (predicted to run
    5 ms), which ends `ahead_ns` after it started; the request's batch then runs `compute_ns`
    (with 3 µs of gathering inputs and splitting outputs), its result reaching the loop as its
    run ends. Its timing, as the scheduler stamped it."""
    timing = RequestTiming(0)

    async def body() -> None:
        clock = FakeClock(1_000_000_000)
        executor = HeldExecutor()
        scheduler = ModelScheduler(
            executor=executor,  # type: ignore[arg-type]
            config=SchedulingConfig(delivery_margin_us=0, exec_margin=0.0),
            max_batch_size=4,
            profile=profile_from_samples({1: [5 * MS] * 5, 2: [9 * MS] * 5}),
            default_timeout_ns=None,
            clock=clock,
            label="'m' version 1",
        )
        submit = {"rows": 1, "shape_key": (), "due_ns": None, "priority": 0}
        began = clock.now_ns()
        first = scheduler.submit_nowait({}, **submit)  # type: ignore[arg-type]
        timing.received_ns = timing.decoded_ns = clock.now_ns()
        second = scheduler.submit_nowait({}, timing=timing, **submit)  # type: ignore[arg-type]
        clock.advance(4_500 * US)  # within a millisecond of the first's predicted end
        scheduler._on_timer()
        assert len(executor.jobs) == 2, "taken into a batch behind the running one"
        assert timing.started_ns >= began + 5 * MS, "planned at the first's predicted end"
        clock.advance(began + ahead_ns - clock.now_ns())
        executor.finish(0, compute_ns=ahead_ns)
        clock.advance(compute_ns + 3 * US)
        executor.finish(1, compute_ns=compute_ns, input_ns=2 * US, output_ns=1 * US)
        assert first.done()
        assert second.done()

    asyncio.run(body())
    return timing


@pytest.mark.parametrize(
    ("ahead_ns", "compute_ns"),
    [(4_600 * US, 600 * US), (4_600 * US, 200 * US)],  # (ends after its planned start; before)
)
def test_execute_spans_the_run_when_the_batch_ahead_ends_early(
    ahead_ns: int, compute_ns: int
) -> None:
    timing = run_behind_a_batch_that_ends_early(ahead_ns, compute_ns)
    assert timing.compute_ns == compute_ns
    assert timing.dispatched_ns <= timing.started_ns <= timing.finished_ns
    # (its run: inputs gathered, computed, outputs split, as its thread measured them)
    assert timing.finished_ns - timing.started_ns == compute_ns + 3 * US
    tracing, exporter = recorder()
    tracing.record(
        timing, None, protocol="grpc", model="m", version="1", variant="default", error=None,
        done_ns=timing.finished_ns + 5 * US,
    )  # fmt: skip
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert {"decode", "queue", "batch", "execute", "encode"} <= set(spans)
    execute = spans["execute"]
    assert execute.end_time - execute.start_time >= compute_ns
    assert spans["batch"].end_time == execute.start_time
    assert spans["queue"].end_time == spans["batch"].start_time


def recorded(protocol: str, model: str, error: object = None, parent: object = None) -> object:
    tracing, exporter = recorder()
    timing = RequestTiming(1_000, decoded_ns=2_000)
    tracing.record(
        timing, parent, protocol=protocol, model=model, version="", variant="",  # type: ignore[arg-type]
        error=error, done_ns=3_000,  # type: ignore[arg-type]
    )  # fmt: skip
    [root] = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    return root


def test_span_names_do_not_carry_the_model_the_client_named() -> None:
    """OpenTelemetry span names are low-cardinality: the model is an attribute."""
    for protocol in ("http", "grpc", "grpc-stream"):
        names = {recorded(protocol, f"nosuch{i}", ModelNotFound("no")).name for i in range(5)}  # type: ignore[attr-defined]
        assert len(names) == 1, protocol
    root = recorded("http", "nosuch", ModelNotFound("model 'nosuch' not found"))
    assert root.attributes["duetime.model"] == "nosuch"  # type: ignore[attr-defined]


def test_server_spans_have_the_semantic_conventions_attributes() -> None:
    http = recorded("http", "mlp")
    assert http.name == "POST"  # type: ignore[attr-defined]
    assert dict(http.attributes).items() >= {  # type: ignore[attr-defined]
        "http.request.method": "POST", "http.response.status_code": 200,
    }.items()  # fmt: skip
    assert "rpc.system" not in http.attributes  # type: ignore[attr-defined]
    failed = recorded("http", "mlp", DeadlineExceeded("too late"))
    assert failed.attributes["http.response.status_code"] == 504  # type: ignore[attr-defined]
    assert failed.status.description == "too late"  # type: ignore[attr-defined]
    grpc = recorded("grpc", "mlp", DeadlineExceeded("too late"))
    assert grpc.name == "inference.GRPCInferenceService/ModelInfer"  # type: ignore[attr-defined]
    assert dict(grpc.attributes).items() >= {  # type: ignore[attr-defined]
        "rpc.system": "grpc", "rpc.service": "inference.GRPCInferenceService",
        "rpc.method": "ModelInfer", "rpc.grpc.status_code": 4,
    }.items()  # fmt: skip
    target = http_target("a/b", "2")
    assert (target.path, target.route) == (
        "/v2/models/a%2Fb/versions/2/infer",
        "/v2/models/{model_name}/versions/{model_version}/infer",
    )
    routed = _server_span("http", None, target)
    assert routed[0] == "POST /v2/models/{model_name}/versions/{model_version}/infer"
    assert routed[1]["url.path"] == "/v2/models/a%2Fb/versions/2/infer"
    assert routed[1]["url.scheme"] == "http"
    stream = recorded("grpc-stream", "mlp")
    assert stream.attributes["rpc.method"] == "ModelStreamInfer"  # type: ignore[attr-defined]


def test_the_callers_tracestate_rides_on_the_remote_parent() -> None:
    parent = parse_traceparent(TRACEPARENT, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
    assert parent is not None
    assert list(parent.state.items()) == [("congo", "t61rcWkgMzE"), ("rojo", "00f067aa0ba902b7")]
    root = recorded("http", "mlp", parent=parent)
    assert root.parent.trace_state.to_header() == "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"  # type: ignore[attr-defined]
    assert root.context.trace_state.get("congo") == "t61rcWkgMzE"  # type: ignore[attr-defined]
    # (a malformed tracestate is dropped alone; none is empty)
    for state in (None, "", "not a list member"):
        parent = parse_traceparent(TRACEPARENT, state)
        assert parent is not None
        assert not parent.state
