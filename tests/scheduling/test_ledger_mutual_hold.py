"""Schedulers sharing a CPU never hold each other back, and count the part of each other's queued
work that cannot wait at admission.

Review of 5b91e04: `_turn_held` compared the others' whole-queue slack (0 when overloaded) with
this batch's own slack, so two overloaded schedulers each held for the other; neither booked
anything to wake the other, and the CPU stood idle while all their queued requests expired
(both left in the ledger's held entries). `_predict` counted the others' backlog all or nothing,
so each found the other's slack roomy: 38 requests due in 25 ms were admitted on a CPU that
runs ~25.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from test_scheduler import MS, Harness, harness, run

from duetime.clock import FakeClock
from duetime.errors import DuetimeError, Overloaded
from duetime.scheduling.ledger import CoreLedger
from duetime.scheduling.profile import LatencyProfile, profile_from_samples


def one_ms() -> LatencyProfile:
    return profile_from_samples({1: [1 * MS] * 5})


def pair() -> tuple[CoreLedger, FakeClock, Harness, Harness]:
    ledger, clock = CoreLedger(), FakeClock(1_000 * MS)
    a = harness(ledger=ledger, clock=clock, profile=one_ms(), max_batch_size=1)
    b = harness(ledger=ledger, clock=clock, profile=one_ms(), max_batch_size=1)
    a.executor.depth = 2
    b.executor.depth = 2
    return ledger, clock, a, b


def pending(h: Harness) -> list[int]:
    return [i for i in range(len(h.executor.jobs)) if i not in h.executor.finished]


def turn_of(h: Harness, index: int) -> int:
    _, job = h.executor.jobs[index]
    return int(job.turn[1]) if job.turn is not None else 0


def test_two_overloaded_schedulers_never_leave_the_cpu_idle() -> None:
    async def body() -> None:
        ledger, clock, a, b = pair()
        a.submit("a-run")  # no due time: runs now, 1 ms
        futures: list[asyncio.Future[object]] = []
        for index in range(20):
            for h, tag in ((a, "a"), (b, "b")):
                with contextlib.suppress(DuetimeError):
                    futures.append(h.submit(f"{tag}{index}", due_in=25 * MS))  # type: ignore[arg-type]
        admitted = len(futures)
        for _ in range(45):
            clock.advance(1 * MS)
            # the CPU runs one batch a millisecond, in turn order
            running = [(turn_of(h, i), h, i) for h in (a, b) for i in pending(h)[:1]]
            if running:
                _, h, index = min(running, key=lambda r: r[0])
                h.executor.complete(index)
            for _ in range(3):
                await asyncio.sleep(0)
            for h in (a, b):
                scheduler = h.scheduler
                if scheduler._timer is not None and scheduler._timer_at <= clock.now_ns():
                    scheduler._on_timer()
            for _ in range(3):
                await asyncio.sleep(0)
            queued = len(a.scheduler._queue) + len(b.scheduler._queue)
            if queued:
                assert pending(a) or pending(b), (
                    f"CPU idle with {queued} queued, held {ledger._held}"
                )
        assert not len(a.scheduler._queue)
        assert not len(b.scheduler._queue)
        expired = sum(1 for f in futures if f.done() and f.exception() is not None)
        # (about 25 fit by their due time: the rest expire, not all of them)
        assert expired < admitted // 2, f"{expired} of {admitted} expired"
        assert not ledger._held, "stale held entries"

    run(body)


def test_the_others_work_that_cannot_wait_is_counted_ahead_at_admission() -> None:
    async def body() -> None:
        _, clock, a, b = pair()
        for index in range(20):
            b.submit(f"b{index}", due_in=25 * MS)  # ~20 ms queued, a few ms of slack
        work = b.scheduler._queued_work(clock.now_ns())
        assert work.slack_ns > 0
        assert work.slack_ns < work.backlog_ns - 10 * MS
        # a 1 ms run fits the others' slack, but their work beyond it goes ahead
        with pytest.raises(Overloaded):
            a.submit("late", due_in=10 * MS)
        assert not a.scheduler.fits(clock.now_ns(), clock.now_ns() + 10 * MS, 1, 0)
        a.submit("after", due_in=work.backlog_ns - work.slack_ns + 5 * MS)

    run(body)


def test_two_schedulers_admit_no_more_than_the_cpu_runs_by_far() -> None:
    async def body() -> None:
        _, _, a, b = pair()
        a.submit("a-run")
        admitted = 0
        for index in range(20):
            for h, tag in ((a, "a"), (b, "b")):
                try:
                    h.submit(f"{tag}{index}", due_in=25 * MS)
                    admitted += 1
                except DuetimeError:
                    pass
        assert admitted <= 34, admitted  # 38-40 when each counted the other's slack as its own

    run(body)


def test_one_scheduler_of_a_cpu_holds_at_a_time() -> None:
    from duetime.scheduling.ledger import Queued

    ledger = CoreLedger()
    work = {1: Queued(5 * MS, 0), 2: Queued(5 * MS, 0)}
    for scheduler in (1, 2):
        ledger.join((scheduler, 0), lambda now, s=scheduler: work[s])  # type: ignore[misc]
    woken: list[int] = []
    assert ledger.hold(1, lambda: woken.append(1), 0)
    assert not ledger.hold(2, lambda: woken.append(2), 0), "1 holds for 2's work"
    work[1] = Queued(0, 1 << 62)  # 1's queue emptied: its entry is stale
    assert ledger.hold(2, lambda: woken.append(2), 0)
    assert list(ledger._held) == [2]
    ledger.settled(1)  # 1's work shrank without a booking: 2 looks again
    assert woken == [2]
    assert not ledger._held
