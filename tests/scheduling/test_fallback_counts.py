"""A request one variant refuses at admission and `Engine._queue` passes on to a cheaper variant
counts once: where it ran, or, refused by every variant, at the one whose refusal its client gets
(the last); in each variant's statistics, the model's Triton-style ones and the metrics alike.
`Engine._queue` itself on schedulers with a FakeClock and FakeExecutors: nothing waits on real
time.

Found by a tester: the variant that refused it counted it too (rejected, the failures' time, a
miss for the load shedder), so a request counted once per variant it passed through: the model's
`inference_stats.fail.count` rose for requests answered 200, and under plain load 1500 requests
sent were counted 1501.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from factories import FakeExecutor
from prometheus_client import CollectorRegistry, generate_latest

from duetime.clock import FakeClock
from duetime.config import ModelConfig, SchedulingConfig
from duetime.engine import Engine, Ticket
from duetime.errors import Overloaded
from duetime.observability.metrics import MetricsCollector
from duetime.repository.registry import Deployment, Registry, ServedVersion
from duetime.routing.router import Routed
from duetime.scheduling.profile import profile_from_samples
from duetime.scheduling.scheduler import ModelScheduler
from duetime.statistics import statistics_json
from duetime.types import InferRequest
from duetime.validation import Prepared

US = 1_000
MS = 1_000_000
DUE_NS = 20 * MS
"""Every request's time: a variant predicting `SLOW_NS` a run refuses it, one predicting
`FAST_NS` admits it, and one predicting `BUSY_NS` admits it only with nothing ahead of it."""
SLOW_NS = 50 * MS
BUSY_NS = 15 * MS
FAST_NS = 10 * US


class _Model:
    """What `Engine._queue`, the registry, the statistics and the collector read of a loaded
    model: no optional inputs (any variant may take a request)."""

    name, version = "m", "1"
    path = Path("/nonexistent/model.onnx")
    config = SimpleNamespace(scheduling=SchedulingConfig(), instances=1)
    executor = SimpleNamespace(inline=False)
    validator = SimpleNamespace(overrides=lambda prepared: False)


class Version:
    """Variants of 'm' version 1, best first, named by what a run of each is predicted to take
    (`runs`), served from a registry, on one clock; requests queued by `Engine._queue` on the
    primary, as the router sends them where the primary `fits` (admission a moment later can
    still refuse: the clock moved, the request's size)."""

    def __init__(self, runs: dict[str, int], max_queue_size: int = 1024) -> None:
        self.clock = FakeClock(1_000 * MS)
        self.executors = {name: FakeExecutor(1) for name in runs}
        self.deployments = tuple(
            Deployment(_Model(), self._scheduler(name, run_ns, max_queue_size), name)  # type: ignore[arg-type]
            for name, run_ns in runs.items()
        )
        self.registry = Registry()
        self.version = ServedVersion("1", self.deployments)
        self.registry.publish("m", {"1": self.version}, ModelConfig().traffic)
        self.engine = Engine(clock=self.clock)

    def _scheduler(self, name: str, run_ns: int, max_queue_size: int) -> ModelScheduler:
        """No margins: predictions are the profile's alone."""
        return ModelScheduler(
            executor=self.executors[name],  # type: ignore[arg-type]
            config=SchedulingConfig(
                delivery_margin_us=0,
                exec_margin=0.0,
                policy="edf",
                max_queue_size=max_queue_size,
            ),
            max_batch_size=0,
            profile=profile_from_samples({1: [run_ns] * 5}),
            default_timeout_ns=None,
            clock=self.clock,
            label=f"'m' version 1 ({name})",
        )

    def queue(self) -> Ticket:
        """A request due in `DUE_NS`, routed to the primary, queued as the engine queues it."""
        prepared = Prepared({"x": np.zeros((1, 4), np.float32)}, 1, (), ("y",))
        request = InferRequest("m", dict(prepared.feeds), arrival_ns=self.clock.now_ns())
        served = self.registry.snapshot.models["m"]
        due = self.clock.now_ns() + DUE_NS
        routed = Routed(served, self.version, self.deployments[0], prepared, due)
        return self.engine._queue(routed, request, False)

    def load_primary(self, requests: int) -> None:
        """`requests` without a due time on the primary: the first runs on its one instance,
        the others wait."""
        for _ in range(requests):
            self.deployments[0].scheduler.submit_nowait(
                {"x": np.zeros((1, 4), np.float32)}, rows=1, shape_key=(), due_ns=None, priority=0
            )

    def answer(self, name: str) -> None:
        self.executors[name].complete(0, outputs=[{"y": np.zeros((1, 1), np.float32)}])

    def counts(self) -> dict[str, tuple[int, int, int, int]]:
        """Each variant's (succeeded, rejected, expired, missed for the load shedder)."""
        found = {}
        for d in self.deployments:
            s = d.scheduler.statistics()
            found[d.variant] = (s.succeeded, s.rejected, s.expired, d.scheduler.outcomes()[0])
        return found

    def model_counts(self) -> tuple[int, int]:
        """The model's Triton-style `inference_stats` (success, fail) counts."""
        [entry] = statistics_json(self.registry.snapshot, "m", None)["model_stats"]
        stats = entry["inference_stats"]
        return stats["success"]["count"], stats["fail"]["count"]

    def metrics(self) -> dict[str, float]:
        """The scrape's nonzero duetime_requests_total (`variant/outcome`) and Triton's request
        counts (`nv_inference_request_success`, `nv_inference_request_failure/REASON`)."""
        collector = MetricsCollector(SimpleNamespace(  # type: ignore[arg-type]
            registry=self.registry, router=SimpleNamespace(invalid={}, shadows={})
        ))  # fmt: skip
        prometheus = CollectorRegistry()
        prometheus.register(collector)
        found: dict[str, float] = {}
        for family in prometheus.collect():
            for sample in family.samples:
                labels = sample.labels
                if sample.name == "duetime_requests_total":
                    key = f"{labels['variant']}/{labels['outcome']}"
                elif sample.name == "nv_inference_request_success":
                    key = sample.name
                elif sample.name == "nv_inference_request_failure":
                    key = f"{sample.name}/{labels['reason']}"
                else:
                    continue
                if sample.value:
                    found[key] = sample.value
        assert generate_latest(prometheus)  # (the scrape renders)
        return found


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


def test_a_request_the_primary_refuses_and_a_cheaper_variant_answers_counts_there_alone() -> None:
    async def body() -> None:
        v = Version({"default": BUSY_NS, "fast": FAST_NS})
        v.load_primary(1)  # (15 + 15 ms predicted: the primary refuses it for the work ahead)
        ticket = v.queue()
        assert ticket.variant == "fast", "refused by the primary, taken by its variant"
        v.answer("fast")
        assert ticket.response().variant == "fast"
        # (the primary counted it rejected, and a miss for the load shedder: (0, 1, 0, 1))
        assert v.counts() == {"default": (0, 0, 0, 0), "fast": (1, 0, 0, 0)}
        assert v.model_counts() == (1, 0), "answered 200: no failure of the model"
        assert v.metrics() == {"fast/success": 1, "nv_inference_request_success": 1}

    run(body)


def test_a_request_every_variant_refuses_counts_once_where_its_refusal_came_from() -> None:
    async def body() -> None:
        v = Version({"default": SLOW_NS, "int8-dynamic": SLOW_NS, "int8-static": SLOW_NS})
        with pytest.raises(Overloaded, match=r"\(int8-static\)"):
            v.queue()
        assert v.counts() == {
            "default": (0, 0, 0, 0),
            "int8-dynamic": (0, 0, 0, 0),
            # (due in less than a run: the client's timeout, not a miss of a busy server)
            "int8-static": (0, 1, 0, 0),
        }
        assert v.model_counts() == (0, 1), "one request, one failure (was 3)"
        assert v.metrics() == {
            "int8-static/rejected": 1,
            "nv_inference_request_failure/REJECTED": 1,
        }

    run(body)


def test_a_request_the_primarys_full_queue_refuses_counts_where_it_ran() -> None:
    async def body() -> None:
        v = Version({"default": FAST_NS, "fast": FAST_NS}, max_queue_size=1)
        v.load_primary(2)
        ticket = v.queue()
        assert ticket.variant == "fast", "the primary's queue is full"
        v.answer("fast")
        assert ticket.response().variant == "fast"
        # (the primary counted it rejected: (0, 1, 0, 0), a full queue being no miss)
        assert v.counts() == {"default": (0, 0, 0, 0), "fast": (1, 0, 0, 0)}
        assert v.model_counts() == (1, 0)
        assert v.metrics() == {"fast/success": 1, "nv_inference_request_success": 1}

    run(body)


def test_a_refusal_with_no_cheaper_variant_left_is_counted() -> None:
    """The last variant (and a model with one) counts its refusals as before."""

    async def body() -> None:
        v = Version({"default": SLOW_NS})
        with pytest.raises(Overloaded, match=r"\(default\)"):
            v.queue()
        assert v.counts() == {"default": (0, 1, 0, 0)}
        assert v.model_counts() == (0, 1)

    run(body)
