"""A closing scheduler's queued requests run promptly though the CPU it shares stays busy.

A reload swaps a new version in while the old one drains (`ModelScheduler.aclose`); both run on
one CPU (one `CoreLedger`). Probe repro_swap_stall / repro_swap_deadline: a request queued on
the old version at the swap waited 2.5-6.2 s against a median of 45 ms, and with a 1 s deadline
one request per swap ended DEADLINE_EXCEEDED. Its scheduler waited for the new version's booked
batch to end before handing it over; the new version, whose fresh profile overestimated its
runs, ended each batch early and started the next at once (the old one had booked nothing), so
the old one's wake-up always found the CPU booked again.
"""

from __future__ import annotations

import asyncio

from test_scheduler import MS, failure, harness, run

from duetime.clock import FakeClock
from duetime.scheduling.ledger import CoreLedger
from duetime.scheduling.profile import LatencyProfile, profile_from_samples


def slow_profile() -> LatencyProfile:
    """50 ms a run (as the probe's model), 60 ms for two rows: long enough to pipeline."""
    return profile_from_samples({1: [50 * MS] * 5, 2: [60 * MS] * 5})


def test_a_closing_scheduler_hands_its_queue_over_at_once_on_a_busy_shared_cpu() -> None:
    async def body() -> None:
        ledger, clock = CoreLedger(), FakeClock(1_000 * MS)
        old = harness(ledger=ledger, clock=clock, profile=slow_profile(), max_batch_size=1)
        new = harness(ledger=ledger, clock=clock, profile=slow_profile(), max_batch_size=1)
        old.executor.depth = new.executor.depth = 2
        old.submit("old-running")
        stranded = old.submit("old-queued")  # far from its end: no lookahead batch yet
        assert old.started() == ["old-running"]
        closing = asyncio.create_task(old.scheduler.aclose(60))
        await asyncio.sleep(0)  # the swap: the old version drains
        new.submit("new-1")  # handed over at once, to wait its turn behind the old batch
        clock.advance(50 * MS)
        old.executor.complete(0)
        # the old instance is free, the CPU booked 50 ms ahead by the new version: with no
        # request to come that could join it, the old version hands its last one over now
        assert old.started() == ["old-running", "old-queued"]
        clock.advance(10 * MS)
        new.executor.complete(0)  # the new version's run ended early ...
        new.submit("new-2")  # ... and its next request is handed over behind the old one
        (_, queued_job), (_, next_new) = old.executor.jobs[1], new.executor.jobs[1]
        assert queued_job.turn is not None
        assert next_new.turn is not None
        assert queued_job.turn[1] < next_new.turn[1], "the old request runs first"
        old.executor.complete(1)
        await closing
        assert failure(stranded) is None

    run(body)
