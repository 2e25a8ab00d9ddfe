"""MetricsCollector: every duetime Prometheus metric, defined once, read at scrape time from the
components' `statistics()` snapshots; nothing on the request path touches a metric object.

Per-deployment counters and histograms (a deployment is one variant of one model version) go on
across a reload: the replaced deployment's counts, while it drains and once closed, add to its
replacement's series. A version that is unloaded stays in the scrape until it has drained, then
disappears, and one loaded again starts from zero, which Prometheus's `rate()` reads as a
counter reset. No counter ever goes down otherwise. Invalid inputs and shadow comparisons are
counted by the router and kept across reloads.

Scrapes run on the metrics server's threads, not on the event loop: they read plain ints and
lists, copy any dict the loop may change before iterating it, and touch no asyncio object.
"""

from __future__ import annotations

import functools
import gzip
import re
import weakref
import zlib
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from prometheus_client import make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from duetime.errors import Shed
from duetime.frontend.rest import response_coding
from duetime.observability.scrapegate import ScrapeGate
from duetime.scheduling.scheduler import HistogramSnapshot, SchedulerStatistics

if TYPE_CHECKING:
    from duetime.engine import Engine
    from duetime.observability.gc_pauses import GcPauses
    from duetime.overload import LoadShedder
    from duetime.repository.loader import LoadedModel
    from duetime.repository.registry import Deployment
    from duetime.tools.capture.recorder import Recorder

DEPLOYMENT_LABELS = ("model", "version", "variant")
OUTCOMES = (
    "success", "late", "rejected", "expired", "failed", "cancelled", "unavailable", "invalid",
)  # fmt: skip
"""The `outcome` label of `duetime_requests_total`; every request the schedulers or the router's
validation saw ends in exactly one."""


@dataclass(frozen=True, slots=True)
class _Row:
    labels: tuple[str, str, str]
    deployment: Deployment
    stats: SchedulerStatistics


class MetricsCollector:
    """A prometheus_client collector over an engine's deployments, its router, the load shedder
    (if any) and the GC pause recorder; register it with a `CollectorRegistry`."""

    def __init__(
        self, engine: Engine, shedder: LoadShedder | None = None, gc_pauses: GcPauses | None = None
    ) -> None:
        self._engine = engine
        self._shedder = shedder
        self._gc_pauses = gc_pauses
        self._file_bytes: weakref.WeakKeyDictionary[LoadedModel, int] = weakref.WeakKeyDictionary()

    def describe(self) -> list[Metric]:
        """The families `collect` yields, without their samples (see `described`)."""
        return described(self)

    def collect(self) -> Iterator[Metric]:
        snapshot = self._engine.registry.snapshot  # immutable: safe to walk from this thread
        # NOTE: a deployment a reload replaced (or an unload took out) answered what it held
        # while it drained after the swap, and counted it where no scrape looked (21 of 281
        # successes missing across a reload under load; found by a tester): its counts go on
        # in the series of its replacement, or in its own while it drains unreplaced
        rows = [
            _Row((d.model.name, d.model.version, d.variant), d, snapshot.statistics(d))
            for d in (*snapshot.deployments(), *snapshot.draining_only())
        ]
        yield self._requests(rows)
        yield _counter(
            "duetime_inferences_total",
            "Rows inferred (a request of batch n counts n), per deployment.",
            ((r.labels, r.stats.inferences) for r in rows),
        )
        yield _latency(
            "duetime_request_duration_seconds",
            "End to end: from a request's arrival at the scheduler to its result on the event "
            "loop, of each request answered (late ones too).",
            ((r.labels, r.stats.request_time) for r in rows),
        )
        yield _latency(
            "duetime_queue_duration_seconds",
            "From a request's arrival at the scheduler to the start of its batch (for a batch "
            "queued behind a running one, that one's predicted end), of each request started, "
            "whatever became of it (nv_inference_queue_duration_us, as Triton's, sums the "
            "successful requests' only).",
            ((r.labels, r.stats.queue_time) for r in rows),
        )
        yield _latency(
            "duetime_compute_duration_seconds",
            "Time inside ONNX Runtime, of each batch executed (those in which every request "
            "failed too).",
            ((r.labels, r.stats.compute_time) for r in rows),
        )
        yield _counter(
            "duetime_admission_probes_total",
            "Requests admitted though predicted to miss their due time, to measure the model "
            "again (an idle model that has refused everything for 100 ms admits one; counted "
            "in their outcome too).",
            ((r.labels, r.stats.probes) for r in rows),
        )
        yield self._answers_failed(rows)
        yield self._late_answers(rows)
        yield self._batch_sizes(rows)
        yield from self._gauges(rows)
        yield from _triton_families(rows)
        yield from self._shadows()
        if self._gc_pauses is not None:
            yield self._gc(self._gc_pauses)
        if self._shedder is not None:
            yield from self._loop(self._shedder)

    def _requests(self, rows: Sequence[_Row]) -> Metric:
        family = CounterMetricFamily(
            "duetime_requests",
            "Requests by outcome. success: answered by its due time (or it had none); late: "
            "answered after it; rejected: refused at admission (queue full or predicted to miss "
            "its due time); expired: failed without running (due before it reached the "
            "scheduler, or could no longer make it while queued); failed: the model failed; "
            "cancelled: the client gave up (while it waited or ran); unavailable: failed unrun "
            "while queued, no instance taking work any more (every breaker open, or shut "
            "down); invalid: refused as invalid (inputs that do not fit the model's signature, "
            "a body, tensor or parameter that could not be read; variant is empty: no variant "
            "was chosen yet). A request the model answered whose answer "
            "its front end could not deliver is a success here, as Triton counts it: see "
            "duetime_answers_failed_total.",
            labels=(*DEPLOYMENT_LABELS, "outcome"),
        )
        for row in rows:
            stats = row.stats
            counts = (
                ("success", stats.on_time),
                ("late", stats.late),
                ("rejected", stats.rejected),
                ("expired", stats.expired),
                ("failed", stats.failed),
                ("cancelled", stats.cancelled),
                ("unavailable", stats.unavailable),
            )
            for outcome, value in counts:
                family.add_metric((*row.labels, outcome), value)
        for (model, version), value in list(self._engine.router.invalid.items()):
            family.add_metric((model, version, "", "invalid"), value)
        return family

    def _answers_failed(self, rows: Sequence[_Row]) -> Metric:
        return _counted_by(
            "duetime_answers_failed",
            "Requests the model ran and answered (counted successes in "
            "duetime_requests_total and nv_inference_*, as Triton's statistics count an "
            "inference as it ran) whose answer the front end could not deliver, by reason. "
            "unmade: the answer could not be made, its client answered 400 or "
            "RESOURCE_EXHAUSTED (a shared-memory output window too small, a JSON answer over "
            "--max-json-answer-bytes, a gRPC message over its limit); held_late: a gRPC stream "
            "held it behind earlier answers past its due time.",
            "reason", rows, lambda stats: stats.answers_failed,
        )  # fmt: skip

    def _late_answers(self, rows: Sequence[_Row]) -> Metric:
        return _counted_by(
            "duetime_late_answers",
            "Answers that came after their due time (duetime_requests_total's late), by what "
            "made them late, as the scheduler measured their batch: start, it started later "
            "than planned (the batch ahead overran, or the loop was late to start it); run, "
            "the model's run took longer than the latency profile predicts; delivery, its "
            "result reached the event loop later than hand-offs usually take (a busy or "
            "preempted loop); plan, none of these (it was planned to finish past its due "
            "time: a probe).",
            "cause", rows, lambda stats: stats.late_by_cause,
        )  # fmt: skip

    def _batch_sizes(self, rows: Sequence[_Row]) -> Metric:
        family = HistogramMetricFamily(
            "duetime_batch_size",
            "Rows per execution that answered some request (the requests' rows, before any "
            "padding up to the model's batch bucket; an execution in which every request failed "
            "is counted in duetime_compute_duration_seconds only, as Triton's "
            "nv_inference_exec_count leaves it out); the histogram's bounds are the batch "
            "sizes the model runs at (its buckets, up to its max_batch_size), fixed.",
            labels=DEPLOYMENT_LABELS,
        )
        for row in rows:
            # NOTE: the bounds were the buckets and every size seen, so a 5-row request added
            # le="5.0" at run time: a histogram's bounds must stay fixed per series (a sum over
            # replicas or restarts that saw different sizes is not cumulative otherwise; found
            # by a tester). The model's batch buckets reach its max_batch_size (a model that
            # does not batch: 1); a size counts in the first bound at or above it
            counts = row.stats.histogram_sizes
            bounds = row.stats.batch_bounds
            per_bound = [0] * len(bounds)
            for size, count in counts.items():
                at = bisect_left(bounds, size)
                if at < len(bounds):
                    per_bound[at] += count
            cumulative = list(accumulate(per_bound))
            buckets = [(_le(b), c) for b, c in zip(bounds, cumulative, strict=True)]
            buckets.append(("+Inf", sum(counts.values())))
            total = sum(size * count for size, count in counts.items())
            family.add_metric(row.labels, buckets, total)
        return family

    def _gauges(self, rows: Sequence[_Row]) -> Iterator[Metric]:
        yield _gauge(
            "duetime_queue_depth",
            "Requests waiting in the scheduler's queue.",
            ((r.labels, r.stats.queued) for r in rows),
        )
        yield _gauge(
            "duetime_inflight_batches",
            "Instances running a batch now.",
            ((r.labels, r.stats.busy_instances) for r in rows),
        )
        yield _gauge(
            "duetime_instances",
            "ONNX Runtime sessions (instance threads) of the deployment.",
            ((r.labels, r.stats.instances) for r in rows),
        )
        yield _gauge(
            "duetime_handoff_overhead_seconds",
            "Average time from a batch's start to its result on the event loop beyond the time "
            "inside ONNX Runtime (thread hand-offs, loop lag); the scheduler plans with it.",
            ((r.labels, r.stats.overhead_ns / 1e9) for r in rows),
        )
        yield _gauge(
            "duetime_model_loaded",
            "1 for every model version variant being served.",
            ((r.labels, 1) for r in rows),
        )
        yield _gauge(
            "duetime_model_bytes",
            "Size of the deployment's model file times its instances (each ONNX Runtime session "
            "holds its own copy of the weights).",
            ((r.labels, self._model_bytes(r.deployment)) for r in rows),
        )
        breakers = GaugeMetricFamily(
            "duetime_breaker_state",
            "Circuit breaker of each instance: 0 closed, 1 half-open (letting a probe through), "
            "2 open (taking no work).",
            labels=(*DEPLOYMENT_LABELS, "instance"),
        )
        for row in rows:
            for instance, state in enumerate(row.stats.breaker_states):
                breakers.add_metric((*row.labels, str(instance)), state)
        yield breakers
        yield _counter(
            "duetime_breaker_openings_total",
            "Times any of the deployment's instance breakers opened.",
            ((r.labels, r.stats.breakers_opened) for r in rows),
        )

    def _model_bytes(self, deployment: Deployment) -> int:
        model = deployment.model
        size = self._file_bytes.get(model)
        if size is None:
            try:
                size = model.path.stat().st_size
            except OSError:  # removed from the repository while still served: try again later
                return 0
            self._file_bytes[model] = size
        return size * model.config.instances

    def _shadows(self) -> Iterator[Metric]:
        shadows = list(self._engine.router.shadows.items())
        labels = ("model", "version")
        fields = (
            ("mirrored", "Requests copied to the shadow version."),
            ("compared", "Shadow answers compared with the answering version's."),
            ("skipped", "Copies refused, failed or cancelled, or whose primary failed."),
            ("dropped", "Skipped copies dropped unrun to leave real requests room and time."),
            ("mismatched", "Copies whose outputs differ from the answer's in names or shapes."),
            ("argmax_disagreements", "Compared answers whose argmax differs."),
        )
        for field, help_text in fields:
            family = CounterMetricFamily(f"duetime_shadow_{field}", help_text, labels=labels)
            for key, stats in shadows:
                family.add_metric(key, getattr(stats, field))
            yield family
        worst = GaugeMetricFamily(
            "duetime_shadow_max_abs_diff",
            "Largest absolute difference of any output element between a shadow version's "
            "answers and the answering version's, so far.",
            labels=labels,
        )
        for key, stats in shadows:
            worst.add_metric(key, stats.max_abs_diff)
        yield worst

    def _gc(self, gc_pauses: GcPauses) -> Metric:
        return _latency(
            "duetime_gc_pause_seconds",
            "Pauses of Python's cyclic garbage collector, per generation.",
            (((str(g),), h) for g, h in enumerate(gc_pauses.statistics())),
            labels=("generation",),
        )

    def _loop(self, shedder: LoadShedder) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "duetime_event_loop_utilization",
            "Share of the event loop thread's time spent on the CPU over the last few ms.",
            value=shedder.utilization,
        )
        yield GaugeMetricFamily(
            "duetime_shed_share",
            "Share of new requests the load shedder refuses now.",
            value=shedder.share,
        )
        yield CounterMetricFamily(
            "duetime_requests_shed",
            "Requests refused by the load shedder before they were decoded.",
            value=shedder.refused,
        )
        by_model = CounterMetricFamily(
            "duetime_requests_shed_by_model",
            "Requests refused by the load shedder before they were decoded, by model (empty: "
            "not known, or a model not served); a request of a served model counts as rejected "
            "in its statistics and duetime_requests_total too, over HTTP and gRPC alike.",
            labels=("model",),
        )
        # (copied: the loop may add a model while this thread iterates)
        for model, count in sorted(list(shedder.refused_by_model.items())):
            by_model.add_metric((model,), count)
        yield by_model


TRITON_LABELS = ("model", "version")
TRITON_FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


_TRITON_CUMULATIVE = (
    ("nv_inference_request_success", "Successful inference requests"),
    ("nv_inference_count", "Inferences performed, a batch of n counting n"),
    ("nv_inference_exec_count", "Batch executions that answered some request"),
    ("nv_inference_request_duration_us", "Cumulative end-to-end time of successful requests, µs"),
    ("nv_inference_queue_duration_us",
     "Cumulative queue time of successful requests, µs: from arrival at the scheduler to the "
     "start planned for their batch (behind a running batch: that one's predicted end)"),
    ("nv_inference_compute_input_duration_us",
     "Cumulative time of successful requests gathering their batch's inputs, µs"),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative time of successful requests inside ONNX Runtime, µs"),
    ("nv_inference_compute_output_duration_us",
     "Cumulative time of successful requests splitting their batch's outputs, µs"),
)  # fmt: skip


def _triton_families(rows: Sequence[_Row]) -> Iterator[Metric]:
    """Triton's own metric names (`nv_inference_*`, per model and version, variants summed), so
    that dashboards and alerts written for a Triton fleet read duetime unchanged. Durations are
    cumulative microseconds, as Triton's are; a request refused at admission or expired in the
    queue is a REJECTED failure (Triton's queue-timeout rejections are too).

    NOTE: the cumulative ones are families of type `unknown` here: prometheus_client names a
    counter family's series `<name>_total`, and Triton's carry no suffix. `metrics_app` serves
    them as Triton does, typed `counter` in the Prometheus text format; in OpenMetrics, whose
    counters must end in `_total`, they stay `unknown` under their exact names."""
    cumulative: dict[tuple[str, str], list[int]] = {}
    failures: dict[tuple[str, str], list[int]] = {}
    pending: dict[tuple[str, str], int] = {}
    for row in rows:
        s, key = row.stats, (row.labels[0], row.labels[1])
        values = (s.succeeded, s.inferences, s.executions, s.success_ns // 1000,
                  s.queue_ns // 1000, s.request_input_ns // 1000,
                  s.request_compute_ns // 1000, s.request_output_ns // 1000)  # fmt: skip
        summed = cumulative.setdefault(key, [0] * len(values))
        for index, value in enumerate(values):
            summed[index] += value
        failed = failures.setdefault(key, [0, 0, 0, 0])
        reasons = (s.rejected + s.expired, s.cancelled, s.failed, s.unavailable)
        for index, value in enumerate(reasons):
            failed[index] += value
        # (as Triton's: until a backend is about to run them, a lookahead batch's too)
        pending[key] = pending.get(key, 0) + s.queued + s.committed
    for index, (name, help_text) in enumerate(_TRITON_CUMULATIVE):
        family = Metric(name, f"{help_text} (Triton's name).", "untyped")
        for (model, version), summed in cumulative.items():
            family.add_sample(name, {"model": model, "version": version}, summed[index])
        yield family
    name = "nv_inference_request_failure"
    help_text = ("Failed inference requests by reason: REJECTED refused or expired for time, "
                 "CANCELED by the client, BACKEND the model failed, OTHER failed unrun when no "
                 "instance would take work any more (Triton's name; requests refused by input "
                 "validation are not counted, as Triton's are not).")  # fmt: skip
    family = Metric(name, help_text, "untyped")
    for (model, version), failed in failures.items():
        for reason, value in zip(TRITON_FAILURE_REASONS, failed, strict=True):
            family.add_sample(name, {"model": model, "version": version, "reason": reason}, value)
    yield family
    gauge = GaugeMetricFamily(
        "nv_inference_pending_request_count",
        "Requests awaiting execution: queued, or in a batch waiting for its instance to finish "
        "the one before (Triton's name).",
        labels=TRITON_LABELS,
    )
    for labels, value in pending.items():
        gauge.add_metric(labels, value)
    yield gauge


TRITON_COUNTERS = (*(name for name, _ in _TRITON_CUMULATIVE), "nv_inference_request_failure")
_UNTYPED_TRITON_COUNTER = re.compile(
    rb"^(# TYPE (?:" + b"|".join(n.encode() for n in TRITON_COUNTERS) + rb") )untyped$", re.M
)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


METRICS_PATHS = ("/metrics", "/metrics/")
"""The paths that serve the metrics, as Triton's (HTTPMetricsServer: `/metrics/?`); any other
is answered 400, as Triton answers it."""


_Answer = tuple[str, list[tuple[str, str]], bytes]
"""A rendered scrape: its status line, headers and body."""


def metrics_app(registry: Collector, gate: ScrapeGate[_Answer] | None = None) -> WsgiApp:
    """prometheus_client's WSGI app for `registry` at `METRICS_PATHS`, with Triton's cumulative
    series typed as Triton types them: `# TYPE nv_inference_request_success counter` over
    samples of that exact name, in the Prometheus text format (prometheus_client can only write
    them untyped there: it renames a counter family `<name>_total`). An OpenMetrics scrape gets
    them as `unknown` (OpenMetrics counters must end in `_total`; these keep Triton's names).
    HEAD is answered as GET without the body (RFC 9110 9.3.2); a scrape is compressed as
    `Accept-Encoding` asks, as an inference answer is (`rest.response_coding`). Renders go
    through a `ScrapeGate` (`gate`): one at a time, spaced, shared by scrapes asking the same
    at once."""
    served = make_wsgi_app(registry, disable_compression=True)
    renders: ScrapeGate[_Answer] = gate if gate is not None else ScrapeGate()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        # NOTE: prometheus_client serves the metrics at any path (/, /foo, /v2/models...)
        if environ.get("PATH_INFO") not in METRICS_PATHS:
            start_response("400 Bad Request", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"the metrics are at /metrics\n"]
        head = environ.get("REQUEST_METHOD") == "HEAD"
        if head:
            environ = {**environ, "REQUEST_METHOD": "GET"}
        # NOTE: prometheus_client's `gzip_accepted` took any mention of gzip, `gzip;q=0` (not
        # acceptable, RFC 9110 12.5.3) too, and its answers had no Vary (found by a tester):
        # a scrape is compressed as an inference answer is, by the same reading of the field
        coding = response_coding(environ.get("HTTP_ACCEPT_ENCODING", ""))

        def render() -> _Answer:
            answer: list[Any] = []
            body = b"".join(served(environ, lambda *head: answer.extend(head[:2])))
            status, headers = answer
            kind = next((v for k, v in headers if k == "Content-Type"), None)
            if kind is not None:  # (a scrape, not OPTIONS or another method)
                if kind.startswith("text/plain"):
                    body = _UNTYPED_TRITON_COUNTER.sub(rb"\1counter", body)
                # (the answer varies by both: Accept picks the format, RFC 9110 12.5.5)
                headers = [*headers, ("Vary", "Accept, Accept-Encoding")]
                if coding is not None:
                    body = gzip.compress(body) if coding == "gzip" else zlib.compress(body)
                    headers.append(("Content-Encoding", coding))
            return status, headers, body

        # (what prometheus_client's answer depends on: the format asked, the names filtered)
        key = (
            environ.get("REQUEST_METHOD"), environ.get("QUERY_STRING", ""),
            environ.get("HTTP_ACCEPT", ""), coding,
        )  # fmt: skip
        if environ.get("REQUEST_METHOD") == "GET":
            status, headers, body = renders.fetch(key, render)
        else:  # (OPTIONS and the methods refused: nothing to render)
            status, headers, body = render()
        start_response(status, [*headers, ("Content-Length", str(len(body)))])
        return [] if head else [body]

    return app


def _counter(
    name: str, help_text: str, samples: Iterable[tuple[Sequence[str], float]]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text, labels=DEPLOYMENT_LABELS)
    for labels, value in samples:
        family.add_metric(labels, value)
    return family


def _gauge(
    name: str, help_text: str, samples: Iterable[tuple[Sequence[str], float]]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=DEPLOYMENT_LABELS)
    for labels, value in samples:
        family.add_metric(labels, value)
    return family


def _counted_by(
    name: str,
    documentation: str,
    label: str,
    rows: Sequence[_Row],
    counts: Callable[[SchedulerStatistics], Mapping[str, int]],
) -> Metric:
    """A counter family of each deployment's `counts`, by `label` (the counts' keys)."""
    family = CounterMetricFamily(name, documentation, labels=(*DEPLOYMENT_LABELS, label))
    for row in rows:
        for key, count in sorted(counts(row.stats).items()):
            family.add_metric((*row.labels, key), count)
    return family


def _latency(
    name: str,
    help_text: str,
    samples: Iterable[tuple[Sequence[str], HistogramSnapshot]],
    labels: Sequence[str] = DEPLOYMENT_LABELS,
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, help_text, labels=labels)
    for values, histogram in samples:
        cumulative = list(accumulate(histogram.counts))  # the last count: above every bound
        buckets = [*zip(_seconds(histogram.bounds_ns), cumulative[:-1], strict=True)]
        buckets.append(("+Inf", cumulative[-1]))
        family.add_metric(values, buckets, histogram.sum_ns / 1e9)
    return family


@functools.cache
def _seconds(bounds_ns: tuple[int, ...]) -> tuple[str, ...]:
    """Bucket bounds in ns as Prometheus `le` labels in seconds."""
    return tuple(_le(bound / 1e9) for bound in bounds_ns)


def _le(bound: float) -> str:
    """A bucket bound as prometheus_client writes it (`1.0`, `0.0025`, `5e-06`), so series of
    this collector and of other Python processes line up in `histogram_quantile`."""
    return repr(float(bound))


def described(collector: Any) -> list[Metric]:
    """`collector`'s families, without samples, for a registry's `describe()`: the registry
    maps the names to the collector, which `/metrics?name[]=<name>` looks up (without it, that
    filter found no duetime family and answered an empty body). A collector's families are the
    same at every scrape; only their samples change."""
    return [
        Metric(family.name, family.documentation, family.type) for family in collector.collect()
    ]


class CaptureCollector:
    """The traffic capture's counts (`duetime serve --record`), read from its statistics()."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def describe(self) -> list[Metric]:
        return described(self)

    def collect(self) -> Iterator[Metric]:
        stats = self._recorder.statistics()
        family = CounterMetricFamily(
            "duetime_capture_records",
            "Sampled requests by what became of them. written: in the capture file; dropped: "
            "left out because the writer fell behind (the buffer was full), or, refused by the "
            "load shedder, while the writer was busy; failed: could not "
            "be encoded, or not written: a write error (disk full...) stops the capture, and "
            "what it held and every sample after it count here.",
            labels=("outcome",),
        )
        for outcome, count in (
            ("written", stats.written), ("dropped", stats.dropped), ("failed", stats.failed)
        ):  # fmt: skip
            family.add_metric((outcome,), count)
        yield family
        yield GaugeMetricFamily(
            "duetime_capture_buffered", "Sampled requests waiting for the capture writer.",
            value=stats.buffered,
        )  # fmt: skip


class RefusedCollector:
    """Inference requests the front ends refused before any model ran them: HTTP's
    (frontend/rest.py `RestApi.refused`, by HTTP status) and gRPC's (frontend/grpc.py
    `InferenceService.refused`, by status code name)."""

    def __init__(self, rest: Any, grpc: Any) -> None:
        self._rest = rest
        self._grpc = grpc

    def describe(self) -> list[Metric]:
        return described(self)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "duetime_requests_refused",
            "Inference requests the front end answered with an error before any model ran "
            "them, by protocol, status (HTTP's status, gRPC's code name) and error class "
            "(reason): malformed, a bad parameter, a model not served, those the load shedder "
            "refused unread (Shed), and those a model's scheduler refused (at admission, or "
            "later: expired in its queue unrun, pushed out of a full queue, its model "
            "unavailable) or validation failed (counted per model too, in "
            "duetime_requests_total). No label comes from the request.",
            labels=("protocol", "status", "reason"),
        )
        for protocol, source, shed_status in (
            ("http", self._rest, Shed.http_status),
            ("grpc", self._grpc, Shed.grpc_code),
        ):
            counts = dict(source.refused)  # (copied: the loop may add one meanwhile)
            if source.shed:
                counts[shed_status, Shed.__name__] = source.shed
            for (status, reason), count in sorted(counts.items()):
                family.add_metric((protocol, str(status), reason), count)
        yield family


class GrpcCollector:
    """The gRPC front end's own counts (frontend/grpc.py `InferenceService`)."""

    def __init__(self, service: Any) -> None:
        self._service = service

    def describe(self) -> list[Metric]:
        return described(self)

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "duetime_grpc_calls_gone",
            "ModelInfer calls whose client had gone (cancelled, or past its deadline) before "
            "their handler ran: neither decoded nor run. Many mean calls wait in gRPC's own "
            "queue: the server is past its gRPC capacity. Calls gRPC's core ended while they "
            "waited there, before any handler took them, are not seen, so not counted.",
            value=self._service.gone_calls,
        )
