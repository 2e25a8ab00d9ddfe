"""A late sweeper raises the wake slack, and only waits that end early for a due time end
earlier for it (`Wait.due_bound`): a window bounded by `max_queue_delay_us` alone, and a batch
held for another scheduler's turn, keep their end.

Review of 5fec864: `_on_sweep_timer` pulled any armed timer earlier by the raise. One request
with no due time, max_queue_delay_us 5000, one sweep 3 ms late: the window was set to end at
2.3 ms instead of 5 ms (EDF and FIFO alike). A busy loop makes sweeps late, so the window's
wake-ups went off early exactly under load, and a timer pulled into the past counted the pull
as its own lateness.
"""

from __future__ import annotations

import pytest
from factories import buckets_up_to, enqueue, linear_estimate
from test_ledger_turn_order import heavy_and_light
from test_scheduler import MS, US, Harness, failure, harness, run

from duetime.clock import FakeClock
from duetime.scheduling.batching import Wait, plan_batch
from duetime.scheduling.edf import EDFQueue

BUCKET_OF = buckets_up_to(4, (1, 2, 3, 4))
ESTIMATE = linear_estimate(1000, 100, BUCKET_OF)  # 1 row 1100 ns
WINDOW = 100_000


def plan(queue: EDFQueue, edf: bool, slack: int) -> object:
    return plan_batch(
        queue,
        now_ns=0,
        max_rows=4,
        max_delay_ns=WINDOW,
        estimate=ESTIMATE if edf else None,
        bucket_of=BUCKET_OF,
        wake_slack_ns=slack,
        window_estimate=None if edf else ESTIMATE,
    )


@pytest.mark.parametrize("edf", [True, False], ids=["edf", "fifo"])
def test_a_window_without_a_due_time_is_not_bound_by_one(edf: bool) -> None:
    queue = EDFQueue(8, "edf" if edf else "fifo")
    enqueue(queue, name="a", arrival=0, due=None)
    for slack in (0, 500, 50_000):
        decision = plan(queue, edf, slack)
        assert isinstance(decision, Wait)
        assert (decision.until_ns, decision.due_bound) == (WINDOW, False)


@pytest.mark.parametrize("edf", [True, False], ids=["edf", "fifo"])
def test_a_window_a_due_time_ends_early_is_due_bound(edf: bool) -> None:
    queue = EDFQueue(8, "edf" if edf else "fifo")
    enqueue(queue, name="a", arrival=0, due=50_000)
    decision = plan(queue, edf, 500)
    assert isinstance(decision, Wait)
    assert decision.until_ns == 50_000 - 1100 - 500
    assert decision.due_bound


@pytest.mark.parametrize("edf", [True, False], ids=["edf", "fifo"])
def test_a_due_time_beyond_the_window_leaves_it_bound_by_the_window(edf: bool) -> None:
    queue = EDFQueue(8, "edf" if edf else "fifo")
    enqueue(queue, name="a", arrival=0, due=WINDOW + 10_000)
    decision = plan(queue, edf, 500)
    assert isinstance(decision, Wait)
    assert (decision.until_ns, decision.due_bound) == (WINDOW, False)


# -- the scheduler (FakeClock; a late sweep is the test calling the sweeper's callback) --------


def sweep_late_by(h: Harness, late_ns: int) -> None:
    """The sweeper's timer fires now, `late_ns` after it was asked to."""
    scheduler = h.scheduler
    if scheduler._sweeper is not None:
        scheduler._sweeper.cancel()  # (the loop's own must not fire as well)
    scheduler._sweep_at = h.clock.now_ns() - late_ns
    scheduler._on_sweep_timer()


@pytest.mark.parametrize("policy", ["edf", "fifo"])
def test_late_sweeps_leave_a_window_without_a_due_time_its_whole_max_queue_delay(
    policy: str,
) -> None:
    async def body() -> None:
        h = harness(
            policy=policy, max_batch_size=8, max_queue_delay_us=5000, wake_slack_ns=300 * US
        )
        start = h.clock.now_ns()
        h.submit("a")  # no due time: the window is max_queue_delay_us alone
        assert h.scheduler._timer_at == start + 5 * MS
        h.clock.advance(4 * MS)
        sweep_late_by(h, 3 * MS)  # a busy loop: asked for in 1 ms, it came 3 ms late
        assert h.scheduler._wake_slack_ns == 3 * MS
        assert h.scheduler._timer_at == start + 5 * MS, "the window ends when it ends"
        h.clock.advance(500 * US)
        sweep_late_by(h, 4 * MS)
        assert h.scheduler._timer_at == start + 5 * MS
        h.submit("b")  # still within the window: it joins
        h.clock.advance(500 * US)
        h.scheduler._on_timer()
        assert h.started() == ["a", "b"]
        await h.scheduler.aclose(0)

    run(body)


@pytest.mark.parametrize("policy", ["edf", "fifo"])
def test_a_late_sweep_ends_a_window_a_due_time_bounds_earlier(policy: str) -> None:
    """1 row runs 100 µs, 500 µs kept for margins: the window ends 600 µs and the wake slack
    before the due time (10 ms)."""

    async def body() -> None:
        h = harness(
            policy=policy, max_batch_size=4, max_queue_delay_us=300_000, wake_slack_ns=300 * US,
            delivery_margin_us=500,
        )  # fmt: skip
        request = h.submit("a", due_in=10 * MS)
        due = h.clock.now_ns() + 10 * MS
        assert h.scheduler._timer_at == due - 900 * US
        h.clock.advance(5 * MS)
        sweep_late_by(h, 4 * MS)
        assert h.scheduler._timer_at == due - 600 * US - 4 * MS
        assert h.started() == []
        h.clock.advance(2 * MS)  # the loop comes late again, before the window's old end
        h.scheduler._on_timer()
        assert h.started() == ["a"]
        h.clock.advance(100 * US)
        h.executor.complete(0)
        assert failure(request) is None
        await h.scheduler.aclose(0)

    run(body)


def test_a_sweep_so_late_that_a_due_bound_window_has_passed_starts_its_batch_at_once() -> None:
    """Pulled into the past, the window's timer fired a loop turn later still and counted the
    pull as its own lateness; planned again, the batch starts within the sweep."""

    async def body() -> None:
        h = harness(
            max_batch_size=4, max_queue_delay_us=300_000, wake_slack_ns=300 * US,
            delivery_margin_us=500,
        )  # fmt: skip
        request = h.submit("a", due_in=10 * MS)
        h.clock.advance(6500 * US)
        sweep_late_by(h, 5 * MS)  # the window now ends at 10 - 0.6 - 5 = 4.4 ms: passed
        assert h.started() == ["a"]
        assert h.scheduler._wake_slack_ns == 5 * MS
        h.clock.advance(100 * US)
        h.executor.complete(0)
        assert failure(request) is None
        await h.scheduler.aclose(0)

    run(body)


def heavy_at_its_next_batch() -> tuple[FakeClock, Harness, Harness]:
    """The heavy scheduler 1 ms before its running batch ends (see test_ledger_turn_order): the
    light one's batch is booked on the CPU behind it, and its urgent request queued."""
    clock, heavy, light = heavy_and_light()
    for index in range(3):
        heavy.submit(f"h{index}")
    clock.advance(20 * MS)
    light.submit("first", due_in=40 * MS)
    light.submit("urgent", due_in=40 * MS)
    clock.advance(29 * MS)
    heavy.scheduler._on_timer()  # the CPU is booked 1.1 ms more: back 100 µs before it frees
    assert heavy.scheduler._timer_at == clock.now_ns() + 100 * US
    return clock, heavy, light


def test_a_late_sweep_leaves_a_lookahead_wake_up_as_it_is() -> None:
    async def body() -> None:
        _, heavy, light = heavy_at_its_next_batch()
        lookahead = heavy.scheduler._timer_at
        sweep_late_by(heavy, 3 * MS)
        assert heavy.scheduler._timer_at == lookahead
        for h in (heavy, light):
            await h.scheduler.aclose(0)

    run(body)


def test_a_late_sweep_leaves_a_batch_held_for_another_scheduler_s_turn_as_it_is() -> None:
    async def body() -> None:
        clock, heavy, light = heavy_at_its_next_batch()
        clock.advance(100 * US)
        heavy.scheduler._on_timer()
        assert heavy.started() == ["h0"], "held back for the urgent request (`_turn_held`)"
        held_until = heavy.scheduler._timer_at
        assert held_until > clock.now_ns() + 1 * MS
        sweep_late_by(heavy, 4 * MS)
        assert heavy.scheduler._timer_at == held_until, "the hold ends when it ends"
        assert heavy.started() == ["h0"]
        for h in (heavy, light):
            await h.scheduler.aclose(0)

    run(body)
