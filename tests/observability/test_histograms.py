"""The scheduler's latency histograms: fixed buckets, inclusive upper bounds, and which of the
scheduler's timestamps each histogram measures (with a fake executor and a fake clock)."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest
from held_executor import HeldExecutor

from duetime.clock import FakeClock
from duetime.config import SchedulingConfig
from duetime.scheduling.profile import profile_from_samples
from duetime.scheduling.scheduler import (
    LATENCY_BOUNDS_NS,
    HistogramSnapshot,
    LatencyHistogram,
    ModelScheduler,
)

US = 1_000


def bucket_of(ns: int) -> int:
    histogram = LatencyHistogram()
    histogram.observe(ns)
    (index,) = [i for i, count in enumerate(histogram.snapshot().counts) if count]
    return index


def test_bounds_run_from_microseconds_to_seconds() -> None:
    assert LATENCY_BOUNDS_NS[0] == 5 * US
    assert LATENCY_BOUNDS_NS[-1] == 10_000_000_000
    assert list(LATENCY_BOUNDS_NS) == sorted(set(LATENCY_BOUNDS_NS))
    assert all(b / a <= 2.5 for a, b in itertools.pairwise(LATENCY_BOUNDS_NS))


@pytest.mark.parametrize(
    ("ns", "bucket"),
    [
        (0, 0),
        (5 * US, 0),  # an upper bound is inclusive, as Prometheus's `le`
        (5 * US + 1, 1),
        (10 * US, 1),
        (47 * US, 3),
        (1_000_000, 7),
        (10_000_000_000, len(LATENCY_BOUNDS_NS) - 1),
        (10_000_000_001, len(LATENCY_BOUNDS_NS)),  # the overflow bucket
    ],
)
def test_a_duration_lands_in_the_first_bucket_whose_bound_it_does_not_exceed(
    ns: int, bucket: int
) -> None:
    assert bucket_of(ns) == bucket


def test_snapshot_counts_and_sums() -> None:
    histogram = LatencyHistogram()
    for ns in (1 * US, 7 * US, 7 * US, 20_000_000_000):
        histogram.observe(ns)
    snapshot = histogram.snapshot()
    assert snapshot.bounds_ns == LATENCY_BOUNDS_NS
    assert len(snapshot.counts) == len(LATENCY_BOUNDS_NS) + 1
    assert (snapshot.counts[0], snapshot.counts[1], snapshot.counts[-1]) == (1, 2, 1)
    assert snapshot.total == 4
    assert snapshot.sum_ns == 15 * US + 20_000_000_000
    histogram.observe(1 * US)
    assert snapshot.total == 4, "a snapshot does not move"


# -- what the scheduler records ------------------------------------------------------------------


def nonzero(snapshot: HistogramSnapshot) -> dict[int, int]:
    """Bucket bound (ns; -1 for the overflow) -> count, for the buckets counted."""
    bounds = [*snapshot.bounds_ns, -1]
    return {bounds[i]: count for i, count in enumerate(snapshot.counts) if count}


def test_scheduler_times_queue_compute_and_end_to_end() -> None:
    async def body() -> None:
        clock = FakeClock(1_000_000_000)
        executor = HeldExecutor()
        scheduler = ModelScheduler(
            executor=executor,  # type: ignore[arg-type]
            config=SchedulingConfig(delivery_margin_us=0, exec_margin=0.0),
            max_batch_size=4,
            profile=profile_from_samples({1: [100 * US] * 5, 2: [150 * US] * 5}),
            default_timeout_ns=None,
            clock=clock,
            label="'m' version 1",
        )
        feeds = {"x": np.zeros((1, 2), np.float32)}
        submit = {"rows": 1, "shape_key": ("f",), "due_ns": None, "priority": 0}
        first = scheduler.submit_nowait(feeds, **submit)  # type: ignore[arg-type]
        clock.advance(40 * US)
        second = scheduler.submit_nowait(feeds, **submit)  # type: ignore[arg-type]
        clock.advance(60 * US)
        executor.finish(0, compute_ns=80 * US)  # `second` starts now, 60 µs after it came
        clock.advance(200 * US)
        executor.finish(1, compute_ns=190 * US)
        assert first.done()
        assert second.done()

        stats = scheduler.statistics()
        assert nonzero(stats.queue_time) == {5 * US: 1, 100 * US: 1}  # 0 µs and 60 µs
        assert stats.queue_time.sum_ns == stats.queue_ns == 60 * US
        assert nonzero(stats.compute_time) == {100 * US: 1, 250 * US: 1}  # 80 and 190 µs
        assert stats.compute_time.sum_ns == stats.compute_ns == 270 * US
        assert nonzero(stats.request_time) == {100 * US: 1, 500 * US: 1}  # 100 and 260 µs
        assert stats.request_time.sum_ns == stats.success_ns == 360 * US
        assert stats.request_time.total == stats.succeeded == stats.on_time == 2

    asyncio.run(body())
