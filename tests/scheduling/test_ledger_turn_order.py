"""Schedulers sharing a CPU: work queued with no due time (or one far off) never goes ahead of
another scheduler's request due sooner, at admission or in the CPU's turns; work that cannot
wait still does.

Probe repro_ledger_starve: resnet (8-row requests at ~1.8x its capacity, no timeout) and deeplob
(20 ms timeouts) on one CPU. Admission put all of resnet's queued work ahead of every deeplob
request, whatever their due times: 305 of 355 were refused "predicted to finish in 2,417,714 µs
... but due in 19,756 µs (0 requests ahead)", none answered on time (47% with no ledger).
"""

from __future__ import annotations

import asyncio

import pytest
from test_scheduler import MS, US, Harness, failure, harness, run

from duetime.clock import FakeClock
from duetime.errors import Overloaded
from duetime.scheduling.ledger import CoreLedger
from duetime.scheduling.profile import LatencyProfile, profile_from_samples


def heavy_profile() -> LatencyProfile:
    """50 ms a run (a resnet batch, long enough to pipeline a second batch behind it)."""
    return profile_from_samples({1: [50 * MS] * 5})


def heavy_and_light() -> tuple[FakeClock, Harness, Harness]:
    """Two schedulers on one CoreLedger: a heavy one (`heavy_profile`, one row a batch, a second
    batch pipelined behind its running one) and a light one (100 µs a run, one at a time)."""
    ledger, clock = CoreLedger(), FakeClock(1_000 * MS)
    heavy = harness(ledger=ledger, clock=clock, profile=heavy_profile(), max_batch_size=1)
    light = harness(ledger=ledger, clock=clock)
    heavy.executor.depth = 2
    return clock, heavy, light


def turn(h: object, index: int) -> int:
    _, job = h.executor.jobs[index]  # type: ignore[attr-defined]
    assert job.turn is not None
    return int(job.turn[1])


def test_a_backlog_due_whenever_lets_a_request_due_behind_the_running_batch_go_first() -> None:
    async def body() -> None:
        clock, heavy, light = heavy_and_light()
        for index in range(6):
            heavy.submit(f"h{index}")  # no due time: 250 ms queued behind the running one
        assert heavy.started() == ["h0"]  # runs until 50 ms
        clock.advance(20 * MS)
        light.submit("first", due_in=40 * MS)  # handed over: its turn comes at h0's end
        # behind h0 and `first` alone (30.2 ms), not behind the heavy backlog (280 ms)
        urgent = light.submit("urgent", due_in=40 * MS)
        assert light.started() == ["first"]
        clock.advance(29 * MS)  # 1 ms before h0 ends, the heavy one plans its next batch
        heavy.scheduler._on_timer()
        assert heavy.started() == ["h0"], "held back for the urgent request"
        clock.advance(1 * MS)
        heavy.executor.complete(0)  # h0 ends: its next batch would still go first
        assert heavy.started() == ["h0"]
        clock.advance(100 * US)
        light.executor.complete(0)  # `first` ends: `urgent` is handed over ...
        assert light.started() == ["first", "urgent"]
        await asyncio.sleep(0)  # ... and the heavy one, woken, hands its batch over behind it
        assert heavy.started() == ["h0", "h1"]
        assert turn(light, 1) < turn(heavy, 1)
        clock.advance(100 * US)
        light.executor.complete(1)
        assert failure(urgent) is None

    run(body)


def test_work_the_others_queued_that_cannot_wait_still_goes_ahead() -> None:
    async def body() -> None:
        clock, heavy, light = heavy_and_light()
        heavy.submit("h0")
        # due 50 µs after h0 and its own run: a 100 µs run before it would make it late
        tight = heavy.submit("tight", due_in=100 * MS + 50 * US)
        now = clock.now_ns()
        assert not light.scheduler.fits(now, now + 90 * MS, 1, 0)
        with pytest.raises(Overloaded, match=r"predicted to finish in 100100 µs .*\(0 requests"):
            light.submit("refused", due_in=90 * MS)  # behind h0, tight and its own run
        assert light.scheduler.fits(now, now + 110 * MS, 1, 0)
        late = light.submit("later", due_in=110 * MS)
        clock.advance(49 * MS)  # 1 ms before h0 ends, both plan their next batch
        light.scheduler._on_timer()  # the request due later first: the worst order
        assert light.started() == [], "held back for the tight request"
        heavy.scheduler._on_timer()
        assert heavy.started() == ["h0", "tight"]
        clock.advance(1 * MS)
        heavy.executor.complete(0)
        clock.advance(50 * MS)
        heavy.executor.complete(1)
        assert failure(tight) is None
        light.scheduler._on_timer()
        assert light.started() == ["later"]
        assert turn(heavy, 1) < turn(light, 0)
        light.executor.complete(0)
        assert failure(late) is None

    run(body)


def test_no_due_time_queued_elsewhere_leaves_admission_behind_the_running_batch() -> None:
    """The same heavy backlog, without a due time: it is no reason to refuse or to hold."""

    async def body() -> None:
        clock, heavy, light = heavy_and_light()
        heavy.submit("h0")
        heavy.submit("whenever")
        now = clock.now_ns()
        assert light.scheduler.fits(now, now + 50 * MS + 100 * US, 1, 0)
        assert not light.scheduler.fits(now, now + 50 * MS + 99 * US, 1, 0)

    run(body)


def test_a_batch_on_a_shared_cpu_holds_its_turn_for_its_prediction_with_a_margin() -> None:
    """Past twice its predicted run (or 10 ms more, if longer) the next batch of the CPU runs
    beside it (the hold its turn is taken with: see execution/turns.py)."""

    async def body() -> None:
        _, heavy, light = heavy_and_light()
        heavy.submit("h0")
        light.submit("l0")
        _, heavy_job = heavy.executor.jobs[0]
        _, light_job = light.executor.jobs[0]
        assert 2 * 0.050 <= heavy_job.hold_s < 2 * 0.051  # (50 ms a run, its overhead)
        assert 0.010 <= light_job.hold_s < 0.0102  # (100 µs a run: the 10 ms margin)

    run(body)
