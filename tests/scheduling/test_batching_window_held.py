"""BatchPolicy: a request held for batchmates (`QueuedRequest.held`) is not failed unrun for the
time it spent waiting, and FIFO's window ends in time for a due time. Plain ints for the time.

Probe repro_edf_window_late: an idle EDF model with `max_queue_delay_us` 300 ms held a lone
request (due in 50 ms, a 2.7 ms run) until its last on-time instant less the wake slack; a
wake-up later than that, or margins grown meanwhile, found it hopeless and failed it unrun
("2215 µs left: a run needs 2676 µs (+1639 µs kept for margins and delivery)"): 3 of 40.
"""

from __future__ import annotations

from collections.abc import Callable

from factories import buckets_up_to, enqueue, linear_estimate, names
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.scheduling.batching import Run, Wait, drop_hopeless, plan_batch, sweep_hopeless
from duetime.scheduling.edf import EDFQueue

BUCKET_OF = buckets_up_to(4, (1, 2, 3, 4))
BARE = linear_estimate(1000, 100, BUCKET_OF)  # the profile's own: 1 row 1100 ns, 4 rows 1400
MARGIN = 1000
SLACK = 500
WINDOW = 1_000_000  # far longer than any due time here


def with_margin(margin: int) -> Callable[[int], int]:
    return lambda rows: BARE(rows) + margin


def plan(queue: EDFQueue, now: int, estimate: Callable[[int], int] | None) -> Run | Wait | None:
    return plan_batch(
        queue,
        now_ns=now,
        max_rows=4,
        max_delay_ns=WINDOW,
        estimate=estimate,
        bucket_of=BUCKET_OF,
        wake_slack_ns=SLACK,
        bare=BARE if estimate is not None else None,
        window_estimate=with_margin(MARGIN) if estimate is None else None,
    )


def held_wait(queue: EDFQueue, now: int, estimate: Callable[[int], int] | None) -> int:
    """Plan at `now`, expect a wait, and mark its requests held as the scheduler does."""
    decision = plan(queue, now, estimate)
    assert isinstance(decision, Wait), decision
    for item in decision.held:
        item.held = True
    return decision.until_ns


def wake(queue: EDFQueue, now: int, estimate: Callable[[int], int]) -> tuple[list[str], Run]:
    """What the scheduler does as its timer fires: drop the hopeless, then plan."""
    dropped = drop_hopeless(queue, now_ns=now, estimate=estimate, bare=BARE)
    decision = plan(queue, now, estimate)
    assert isinstance(decision, Run), decision
    return names(dropped), decision


def test_a_held_request_runs_after_a_wake_up_later_than_the_wake_slack() -> None:
    queue = EDFQueue(8)
    enqueue(queue, name="a", due=10_000)
    until = held_wait(queue, 0, with_margin(MARGIN))
    assert until == 10_000 - 2100 - SLACK
    # the timer comes 1500 ns late: 1100 ns of run fits in the 2000 left, its margin no longer
    late = until + 1500
    assert sweep_hopeless(queue, now_ns=late, estimate=with_margin(MARGIN), bare=BARE) == []
    dropped, run = wake(queue, late, with_margin(MARGIN))
    assert (dropped, names(run.requests)) == ([], ["a"])
    assert late + BARE(run.rows) <= 10_000


def test_a_held_request_runs_though_its_margins_grew_while_it_waited() -> None:
    queue = EDFQueue(8)
    enqueue(queue, name="a", due=10_000)
    until = held_wait(queue, 0, with_margin(MARGIN))
    dropped, run = wake(queue, until, with_margin(4 * MARGIN))  # on time, margins 4x
    assert (dropped, names(run.requests)) == ([], ["a"])


def test_held_requests_still_run_together_after_a_late_wake_up() -> None:
    """Two requests held in one batch: late, they would fit together on the bare prediction
    but not with margins; split into batches of one, the second would wait for the first."""
    queue = EDFQueue(8)
    enqueue(queue, name="a", due=10_000)
    enqueue(queue, name="b", due=10_000)
    until = held_wait(queue, 0, with_margin(MARGIN))
    assert until == 10_000 - 2200 - SLACK
    dropped, run = wake(queue, until + 1500, with_margin(MARGIN))
    assert (dropped, names(run.requests)) == ([], ["a", "b"])


def test_a_held_request_whose_bare_run_no_longer_fits_is_hopeless() -> None:
    queue = EDFQueue(8)
    enqueue(queue, name="a", due=10_000)
    held_wait(queue, 0, with_margin(MARGIN))
    assert names(drop_hopeless(queue, now_ns=8901, estimate=with_margin(MARGIN), bare=BARE)) == [
        "a"
    ]


def test_a_request_never_held_keeps_its_margins() -> None:
    """Only the wait the policy chose is forgiven: a request that waited behind a busy
    instance is hopeless once its margins no longer fit, as before."""
    queue = EDFQueue(8)
    enqueue(queue, name="a", due=10_000)
    dropped = drop_hopeless(queue, now_ns=8000, estimate=with_margin(MARGIN), bare=BARE)
    assert names(dropped) == ["a"]


def test_fifo_s_window_ends_in_time_for_a_due_time() -> None:
    """Probe repro_fifo_window_past_due: FIFO held a request due in 50 ms for its whole 300 ms
    window, then failed it 504. The window now ends the batch's run, its margins and the wake
    slack before the due time."""
    queue = EDFQueue(8, "fifo")
    enqueue(queue, name="a", arrival=0, due=50_000)
    assert plan(queue, 0, None) == Wait(50_000 - 1100 - MARGIN - SLACK)
    enqueue(queue, name="b", arrival=10, due=None)
    assert plan(queue, 10, None) == Wait(50_000 - 1200 - MARGIN - SLACK)
    decision = plan(queue, 50_000 - 1200 - MARGIN - SLACK, None)
    assert isinstance(decision, Run)
    assert names(decision.requests) == ["a", "b"]
    # without a due time the window is the whole `max_queue_delay_us`, as Triton's
    queue = EDFQueue(8, "fifo")
    enqueue(queue, name="c", arrival=0)
    assert plan(queue, 0, None) == Wait(WINDOW)


# -- property: late timers and grown margins ---------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    dues=st.lists(st.integers(0, 40_000), min_size=1, max_size=12),
    gaps=st.lists(st.integers(0, 3000), min_size=12, max_size=12),
    lateness=st.lists(st.integers(0, 4000), min_size=40, max_size=40),
    margins=st.lists(st.integers(0, 3000), min_size=40, max_size=40),
)
def test_no_batch_starts_predicted_late_and_no_held_request_fails_while_its_run_fits(
    dues: list[int], gaps: list[int], lateness: list[int], margins: list[int]
) -> None:
    """One instance, runs exactly as the bare prediction; every wake-up comes late by up to
    4 µs (8x the wake slack), and the margins change at every event. Then: no batch starts
    that the bare prediction has finish after a due time in it, and a request the policy held
    is failed unrun only where even its bare run would finish after its due time."""
    queue = EDFQueue(64)
    arrivals = []
    at = 0
    for index, due in enumerate(dues):
        at += gaps[index]
        arrivals.append((at, at + due, f"r{index}"))
    free_at, timer, now, step = 0, None, 0, 0
    pending = list(arrivals)
    started: list[str] = []
    dropped: list[str] = []
    while pending or timer is not None or len(queue):
        busy = free_at if len(queue) and free_at > now else None
        events = [t for t in (timer, busy) if t is not None]
        if pending:
            events.append(pending[0][0])
        if not events:
            break
        now = max(now, min(events))
        if timer is not None and timer <= now:
            timer = None
        while pending and pending[0][0] <= now:
            arrival, due, name = pending.pop(0)
            enqueue(queue, name=name, arrival=arrival, due=due)
        step += 1
        assert step < 1000, "the simulation did not settle"
        estimate = with_margin(margins[step % len(margins)])
        if free_at > now:
            continue
        hopeless = drop_hopeless(queue, now_ns=now, estimate=estimate, bare=BARE)
        for item in hopeless:
            assert item.due_ns is not None
            if item.held:
                assert now + BARE(item.rows) > item.due_ns, "held, failed while its run fitted"
        dropped += names(hopeless)
        decision = plan(queue, now, estimate)
        if decision is None:
            continue
        if isinstance(decision, Wait):
            for item in decision.held:
                item.held = True
            timer = decision.until_ns + lateness[step % len(lateness)]
            continue
        queue.take(decision.taken)
        finish = now + BARE(decision.rows)
        dues_in: list[int] = [i.due_ns for i in decision.requests if i.due_ns is not None]
        assert all(finish <= due for due in dues_in), (now, finish, dues_in)
        started += names(decision.requests)
        free_at = finish
    assert sorted(started + dropped) == sorted(name for _, _, name in arrivals)
