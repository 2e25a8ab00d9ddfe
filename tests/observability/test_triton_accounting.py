"""What the statistics extension and the nv_inference_* metrics count, checked against Triton's
own accounting (core `InferenceStatsAggregator`, the ONNX Runtime backend's reports): a fake
executor and a fake clock drive one scheduler; its statistics go through `/stats`'s builder
and the metrics collector, the same snapshot read both ways."""

from __future__ import annotations

import asyncio
import gzip
import wsgiref.util
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from held_executor import HeldExecutor
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from duetime.clock import FakeClock
from duetime.config import SchedulingConfig
from duetime.errors import QUEUE_FULL, TIMEOUT_EXPIRED, DuetimeError, InvalidInput, ModelUnavailable
from duetime.execution import executor as executor_module
from duetime.execution.executor import BatchJob, Executor, Feeds
from duetime.observability.metrics import TRITON_COUNTERS, MetricsCollector, WsgiApp, metrics_app
from duetime.scheduling.profile import profile_from_samples
from duetime.scheduling.scheduler import ModelScheduler
from duetime.statistics import model_statistics_json

US = 1_000
_MODELS: dict[int, object] = {}


@dataclass
class Harness:
    clock: FakeClock
    executor: HeldExecutor
    scheduler: ModelScheduler

    def submit(self, due_in: int | None = None) -> asyncio.Future[Feeds]:
        due = None if due_in is None else self.clock.now_ns() + due_in
        return self.scheduler.submit_nowait(
            {"x": np.zeros((1, 4), np.float32)}, rows=1, shape_key=("f",), due_ns=due, priority=0
        )

    def stats(self) -> dict[str, Any]:
        """The `/stats` entry of the model (one version, this scheduler its only variant)."""
        return model_statistics_json("m", _served(self.scheduler))

    def metrics(self) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        """The nv_inference_* and duetime_requests samples: name -> sorted labels -> value."""
        registry = CollectorRegistry()
        registry.register(MetricsCollector(_engine(self.scheduler)))  # type: ignore[arg-type]
        text = generate_latest(registry).decode()
        samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.startswith(("nv_inference", "duetime_requests")):
                    labels = tuple(sorted(sample.labels.items()))
                    samples.setdefault(sample.name, {})[labels] = sample.value
        return samples


def harness(clock: FakeClock | None = None, batch_us: int = 100, **scheduling: Any) -> Harness:
    """A scheduler of batches up to 4 rows, each predicted to take `batch_us`."""
    clock = clock or FakeClock(1_000_000_000)
    executor = HeldExecutor()
    scheduler = ModelScheduler(
        executor=executor,  # type: ignore[arg-type]
        config=SchedulingConfig(delivery_margin_us=0, exec_margin=0.0, **scheduling),
        max_batch_size=4,
        profile=profile_from_samples({b: [batch_us * US] * 5 for b in (1, 2, 3, 4)}),
        default_timeout_ns=None,
        clock=clock,
        label="'m' version 1",
    )
    return Harness(clock, executor, scheduler)


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


def triton(samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str) -> float:
    (value,) = samples[name].values()
    return value


class _Model:
    """What the statistics and the collector read of a loaded model (weakly referenced)."""

    name, version = "m", "1"
    path = Path("/nonexistent/model.onnx")
    config = SimpleNamespace(scheduling=SchedulingConfig(), instances=1)
    executor = SimpleNamespace(inline=False)


def _served(scheduler: ModelScheduler) -> Any:
    model = _MODELS.setdefault(id(scheduler), _Model())
    deployment = SimpleNamespace(model=model, variant="default", scheduler=scheduler)
    return SimpleNamespace(version="1", variants=(deployment,))


def _engine(scheduler: ModelScheduler) -> Any:
    deployments = _served(scheduler).variants
    return SimpleNamespace(
        registry=SimpleNamespace(
            snapshot=SimpleNamespace(
                deployments=lambda: deployments,
                draining_only=list,
                statistics=lambda d: d.scheduler.statistics(),
            )
        ),
        router=SimpleNamespace(invalid={}, shadows={}),
    )


# -- queue: the successful requests' only ----------------------------------------------------------


def test_queue_counts_and_times_the_successful_requests_only() -> None:
    """Triton adds a request's queue time in UpdateSuccess, never in UpdateFailure: `queue` has
    the successes' count, and its ns covers those same requests. Here one request failed in the
    model and one was cancelled by its client while it ran, after 100 µs in the queue each; they
    showed in queue's ns (and a failure in its count) while success counted neither."""

    async def body() -> None:
        h = harness()
        h.submit()  # starts at once, alone: 0 µs queued
        queued = [h.submit() for _ in range(3)]
        h.clock.advance(100 * US)
        h.executor.finish(0)  # the three start now, after 100 µs each
        queued[2].cancel()
        h.executor.finish(1, outputs=[{"y": np.zeros(1)}, InvalidInput("index 9"), {}])
        assert isinstance(queued[1].exception(), InvalidInput)
        stats = h.stats()["inference_stats"]
        assert stats["success"]["count"] == 2
        assert stats["fail"]["count"] == 2
        assert stats["queue"] == {"count": 2, "ns": 100 * US}
        assert stats["compute_infer"] == {"count": 2, "ns": 2 * 100 * US}
        nv = h.metrics()
        assert triton(nv, "nv_inference_request_success") == 2
        assert triton(nv, "nv_inference_queue_duration_us") == 100
        assert triton(nv, "nv_inference_compute_infer_duration_us") == 200

    run(body)


# -- executions: those that answered some request --------------------------------------------------


def test_an_execution_in_which_every_request_failed_is_no_execution() -> None:
    """Triton's execution_count is "the number of successful inference executions": its ONNX
    Runtime backend reports batch statistics only when not all the responses failed. A model
    whose 3 requests of 5 failed alone showed execution_count 5 (and nv_inference_exec_count 5)
    for 2 successes."""

    async def body() -> None:
        h = harness(max_queue_size=8)
        answers = [h.submit() for _ in range(3)]
        h.executor.finish(0)  # the first alone: answered
        h.executor.finish(1, outputs=[InvalidInput("index 50"), InvalidInput("index 60")])
        answers += [h.submit(), h.submit()]
        h.executor.finish(2, outputs=[InvalidInput("index 70")])
        h.executor.finish(3, outputs=[{"y": np.zeros(1)}])
        assert [type(a.exception()) for a in answers[1:4]] == [InvalidInput] * 3
        entry = h.stats()
        assert entry["execution_count"] == 2
        assert entry["inference_count"] == 2
        assert [(b["batch_size"], b["compute_infer"]["count"]) for b in entry["batch_stats"]] == [
            (1, 2)
        ]
        assert entry["inference_stats"]["fail"]["count"] == 3
        nv = h.metrics()
        assert triton(nv, "nv_inference_exec_count") == 2
        assert triton(nv, "nv_inference_count") == 2

    run(body)


def test_a_batch_whose_requests_ran_alone_counts_each_run_that_answered() -> None:
    """A batch that failed runs each request alone, so that only the one at fault fails: each
    run that answered is an execution of its own rows. The batch counted as one execution of
    all its rows, the failed request's too: batch_stats' rows exceeded inference_count, which
    Triton's equal (a tester's Gather with an index out of range beside a good one)."""

    async def body() -> None:
        h = harness()
        h.submit()
        queued = [h.submit(), h.submit(), h.submit()]
        h.executor.finish(0)
        h.executor.finish(
            1,
            compute_ns=100 * US,  # the failed batch's run and the three alone
            outputs=[{"y": np.zeros(1)}, InvalidInput("index 99"), {"y": np.zeros(1)}],
            alone=[(10 * US, 1 * US), (5 * US, 0), (20 * US, 2 * US)],
        )
        assert isinstance(queued[1].exception(), InvalidInput)
        entry = h.stats()
        assert entry["inference_count"] == 3
        assert entry["execution_count"] == 3
        (stats,) = entry["batch_stats"]
        assert stats["batch_size"] == 1
        assert stats["compute_infer"] == {"count": 3, "ns": (100 + 10 + 20) * US}
        assert stats["compute_output"] == {"count": 3, "ns": 3 * US}
        rows = sum(b["batch_size"] * b["compute_infer"]["count"] for b in entry["batch_stats"])
        assert rows == entry["inference_count"]
        nv = h.metrics()
        assert triton(nv, "nv_inference_exec_count") == 3

    run(body)


# -- fail: every failure with its time -------------------------------------------------------------


class TickingClock(FakeClock):
    """A fake clock that moves 1 µs at every read: admission takes some time on it."""

    def now_ns(self) -> int:
        self.advance(1 * US)
        return super().now_ns()


def test_requests_their_clients_cancelled_fail_with_their_time() -> None:
    """Triton's `fail` adds end - start for every failed request; a cancelled one counted in
    fail.count with no ns. One withdrawn while queued counts until the scheduler drops it (still
    queued: until now); one cancelled while it ran, until its batch ends."""

    async def body() -> None:
        h = harness()
        h.submit()  # runs
        withdrawn, cancelled = h.submit(), h.submit()
        h.clock.advance(30 * US)
        withdrawn.cancel()
        assert h.stats()["inference_stats"]["fail"] == {"count": 1, "ns": 30 * US}
        h.clock.advance(20 * US)
        h.executor.finish(0)  # the queue drops `withdrawn` now, 50 µs after it came
        assert h.stats()["inference_stats"]["fail"] == {"count": 1, "ns": 50 * US}
        cancelled.cancel()  # while its batch runs
        h.clock.advance(10 * US)
        h.executor.finish(1)
        fail = h.stats()["inference_stats"]["fail"]
        assert fail == {"count": 2, "ns": 50 * US + 60 * US}

    run(body)


def test_requests_refused_at_admission_fail_with_the_time_admission_took() -> None:
    """Predicted to miss its due time, due before it came, queue full: each one a failure whose
    ns is its time in the scheduler (a clock that moves at every read shows it; it was 0)."""

    async def body() -> None:
        h = harness(TickingClock(1_000_000_000), max_queue_size=2)
        h.submit()  # runs
        h.submit()  # queued
        refusals = []
        for due_in in (50 * US, -5 * US, None, None):
            try:
                h.submit(due_in=due_in)
            except DuetimeError as exc:
                # (after Triton's words for the two that have them: see `errors`)
                said = exc.message.removeprefix(f"{TIMEOUT_EXPIRED}: ")
                said = said.removeprefix(f"{QUEUE_FULL}: ")
                refusals.append(said.split(":")[1].split()[0:2])
            fail = h.stats()["inference_stats"]["fail"]
            assert fail["count"] == len(refusals)
            assert fail["ns"] >= len(refusals) * US
        assert refusals == [["predicted", "to"], ["the", "request"], ["queue", "full"]]

    run(body)


# -- compute_input and compute_output: the batch's gathering and splitting -------------------------


class DoublingSession:
    """A stand-in ORT session of y = 2x."""

    def run(self, names: Sequence[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [feeds["x"] * 2]


def test_the_executor_times_gathering_running_and_splitting_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Triton's backends report compute_input (the inputs copied into the batch), compute_infer
    (the run) and compute_output (the outputs taken out per request) apart; duetime reported
    only the run. A clock read between stages gives each its own time."""
    ticks = iter([1_000, 1_300, 9_300, 9_350])  # gathered 300 ns later, ran 8 µs, split 50 ns
    monkeypatch.setattr(executor_module, "time", SimpleNamespace(perf_counter_ns=ticks.__next__))
    executor = Executor(
        [DoublingSession()], output_names=["y"], string_outputs=frozenset(), batched=True,
        label="t", inline=True,
    )  # fmt: skip
    a, b = np.ones((1, 3), np.float32), np.full((2, 3), 5, np.float32)
    job = BatchJob([{"x": a}, {"x": b}], [1, 2], 4, lambda result: None)
    result = executor.run_now(0, job)
    assert (result.input_ns, result.compute_ns, result.output_ns) == (300, 8_000, 50)
    first, second = result.outputs
    assert isinstance(first, dict)
    assert isinstance(second, dict)
    np.testing.assert_array_equal(second["y"], b * 2)


def test_compute_input_and_output_are_reported_as_triton_reports_them() -> None:
    """Per successful request, its batch's times (each request sat through the whole batch, as
    with compute_infer); per batch size, each execution's. They were always 0 (the metrics had
    no nv_inference_compute_input_duration_us or _output_ at all)."""

    async def body() -> None:
        h = harness()
        h.submit()
        queued = [h.submit(), h.submit()]
        h.executor.finish(0, input_ns=1 * US, output_ns=2 * US)
        h.executor.finish(1, input_ns=5 * US, output_ns=7 * US)
        assert all(f.done() for f in queued)
        entry = h.stats()
        stats = entry["inference_stats"]
        assert stats["compute_input"] == {"count": 3, "ns": (1 + 2 * 5) * US}
        assert stats["compute_output"] == {"count": 3, "ns": (2 + 2 * 7) * US}
        by_size = {b["batch_size"]: b for b in entry["batch_stats"]}
        assert by_size[1]["compute_input"] == {"count": 1, "ns": 1 * US}
        assert by_size[2]["compute_input"] == {"count": 1, "ns": 5 * US}
        assert by_size[2]["compute_output"] == {"count": 1, "ns": 7 * US}
        nv = h.metrics()
        assert triton(nv, "nv_inference_compute_input_duration_us") == 11
        assert triton(nv, "nv_inference_compute_output_duration_us") == 16

    run(body)


# -- failure reasons: OTHER, and what is no failure ------------------------------------------------


def test_queued_requests_no_instance_will_take_fail_as_other() -> None:
    """Triton's nv_inference_request_failure has four reasons, OTHER among them. Requests failed
    unrun because the model shut down under them (or every breaker opened) were counted
    nowhere: not in /stats, not in any failure series, not in duetime_requests_total."""

    async def body() -> None:
        h = harness()
        h.submit()  # runs, and never finishes
        queued = [h.submit(), h.submit()]
        h.clock.advance(40 * US)
        await h.scheduler.aclose(0)
        assert all(isinstance(f.exception(), ModelUnavailable) for f in queued)
        assert h.stats()["inference_stats"]["fail"] == {"count": 2, "ns": 2 * 40 * US}
        assert h.stats()["duetime"]["variants"][0]["unavailable"] == 2
        nv = h.metrics()
        reasons = {
            dict(labels)["reason"]: v for labels, v in nv["nv_inference_request_failure"].items()
        }
        assert reasons == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 2}
        outcomes = {
            dict(labels)["outcome"]: v for labels, v in nv["duetime_requests_total"].items()
        }
        assert outcomes["unavailable"] == 2

    run(body)


# -- exposition: counters, as Triton's -------------------------------------------------------------


def scrape(app: WsgiApp, accept: str = "", encoding: str = "") -> tuple[str, dict[str, str]]:
    environ: dict[str, Any] = {
        "HTTP_ACCEPT": accept, "HTTP_ACCEPT_ENCODING": encoding, "PATH_INFO": "/metrics"
    }  # fmt: skip
    wsgiref.util.setup_testing_defaults(environ)
    answer: list[Any] = []
    body = b"".join(app(environ, lambda status, headers: answer.extend((status, headers))))
    assert answer[0] == "200 OK"
    headers = dict(answer[1])
    if headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return body.decode(), headers


def test_triton_counters_are_typed_counter_under_their_own_names() -> None:
    """Triton writes `# TYPE nv_inference_request_success counter` over series of that exact
    name; duetime wrote them `untyped` (prometheus_client renames a counter `<name>_total`).
    The Prometheus text format now types them as Triton does; OpenMetrics, whose counters must
    end in `_total`, gets them as `unknown` under the same names, and parses."""

    async def body() -> None:
        h = harness()
        h.submit()
        h.executor.finish(0)
        registry = CollectorRegistry()
        registry.register(MetricsCollector(_engine(h.scheduler)))  # type: ignore[arg-type]
        app = metrics_app(registry)

        text, headers = scrape(app)
        assert headers["Content-Type"].startswith("text/plain")
        for name in TRITON_COUNTERS:
            assert f"\n# TYPE {name} counter\n" in text
        assert '\nnv_inference_request_success{model="m",version="1"} 1.0\n' in text
        assert "nv_inference_request_success_total" not in text
        assert "\n# TYPE duetime_requests_total counter\n" in text, "duetime's own: unchanged"
        families = {f.name: f.type for f in text_string_to_metric_families(text)}
        assert {families[name] for name in TRITON_COUNTERS} == {"counter"}

        zipped, headers = scrape(app, encoding="gzip")
        assert headers["Content-Encoding"] == "gzip"
        assert zipped == text

        openmetrics, headers = scrape(app, accept="application/openmetrics-text; version=1.0.0")
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        parsed = {f.name: f for f in openmetrics_families(openmetrics)}
        success = parsed["nv_inference_request_success"]
        assert success.type == "unknown"
        assert [s.name for s in success.samples] == ["nv_inference_request_success"]

    run(body)


# -- pending: until a backend is about to run them -------------------------------------------------


def test_requests_of_a_lookahead_batch_are_still_pending() -> None:
    """Triton's nv_inference_pending_request_count counts a request until a backend is about to
    execute it. A batch handed to a busy instance (to start when the running one ends) left the
    queue and counted nowhere."""

    async def body() -> None:
        h = harness(batch_us=5_000)  # (batches this long are handed over before they are due)
        h.submit()  # runs for 5 ms
        h.submit(), h.submit()
        h.clock.advance(4_500 * US)  # within a millisecond of its end: the next batch is handed
        h.scheduler._on_timer()
        assert [len(job.rows) for _, job in h.executor.jobs] == [1, 2]
        assert h.scheduler.statistics().queued == 0
        assert triton(h.metrics(), "nv_inference_pending_request_count") == 2
        h.executor.finish(0)  # the lookahead batch starts
        assert triton(h.metrics(), "nv_inference_pending_request_count") == 0

    run(body)
