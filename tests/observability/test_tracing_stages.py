"""Tracing.record: the stage spans of a request, from the stamps its timing collected, for
requests that failed in the scheduler as for those answered."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from duetime.observability.tracing import Tracing, tracing_from_env
from duetime.types import RequestTiming

US = 1_000
MS = 1_000_000
RECORD = {"protocol": "http", "model": "m", "version": "1", "variant": "default"}


def stages(timing: RequestTiming, done_ns: int) -> dict[str, tuple[int, int]]:
    """Each child span of the request's span: (start, duration) in ns, from its reception."""
    exporter = InMemorySpanExporter()
    tracing: Tracing | None = tracing_from_env({}, exporter=exporter)
    assert tracing is not None
    tracing.record(timing, None, **RECORD, error="failed", done_ns=done_ns)
    tracing.provider.force_flush()
    spans = exporter.get_finished_spans()
    tracing.shutdown()
    (root,) = [s for s in spans if s.parent is None]
    assert root.start_time is not None
    return {
        s.name: (s.start_time - root.start_time, s.end_time - s.start_time)  # type: ignore[operator]
        for s in spans
        if s.parent is not None
    }


def test_a_request_expired_in_the_queue_shows_its_wait_as_queue_not_encode() -> None:
    """Probe repro_span_stages: a 504 after ~57 ms in the queue had no `queue` child, and its
    `encode` covered the wait (56.5 ms)."""
    timing = RequestTiming(1 * MS, decoded_ns=1 * MS + 50 * US, queued_ns=1 * MS + 60 * US)
    timing.finished_ns = 58 * MS  # failed unrun (the scheduler's stamp)
    spans = stages(timing, done_ns=58 * MS + 20 * US)
    assert spans == {
        "decode": (0, 50 * US),
        "queue": (60 * US, 57 * MS - 60 * US),
        "encode": (57 * MS, 20 * US),
    }


def test_a_request_whose_run_failed_shows_its_run_as_execute() -> None:
    timing = RequestTiming(1 * MS, decoded_ns=1 * MS + 50 * US, queued_ns=1 * MS + 60 * US)
    timing.dispatched_ns, timing.started_ns = 2 * MS, 2 * MS + 100 * US
    timing.finished_ns, timing.compute_ns = 7 * MS, 4 * MS
    spans = stages(timing, done_ns=7 * MS + 20 * US)
    assert spans == {
        "decode": (0, 50 * US),
        "queue": (60 * US, 940 * US),
        "batch": (1 * MS, 100 * US),
        "execute": (1 * MS + 100 * US, 4_900 * US),
        "encode": (6 * MS, 20 * US),
    }


def test_a_request_failed_in_a_batch_that_never_started_has_no_execute() -> None:
    timing = RequestTiming(1 * MS, decoded_ns=1 * MS + 50 * US, queued_ns=1 * MS + 60 * US)
    timing.dispatched_ns, timing.finished_ns = 2 * MS, 9 * MS  # (started_ns: none)
    spans = stages(timing, done_ns=9 * MS + 20 * US)
    assert set(spans) == {"decode", "queue", "batch", "encode"}
    assert spans["batch"] == (1 * MS, 7 * MS)
    assert spans["encode"] == (8 * MS, 20 * US)
