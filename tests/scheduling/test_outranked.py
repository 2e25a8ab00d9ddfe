"""A request that higher-priority work admitted after it has made hopeless fails when the sweeper
finds so, not when its turn comes.

A tester's repro (session 47's note): lower-priority requests hopeless from 3 ms, behind a flood
of higher-priority ones, heard so at 42-45 ms, when the flood had run. The sweeper asked each
request only whether its own run still fitted if started now, blind to the levels ahead of it.
"""

from __future__ import annotations

from factories import OTHER_SHAPE, FakeFuture, enqueue, names
from test_scheduler import MS, US, failure, harness, run

from duetime.errors import DeadlineExceeded
from duetime.scheduling.batching import sweep_outranked
from duetime.scheduling.edf import EDFQueue

# make_profile(): 1 row takes 100 µs, 4 rows 250 µs (62.5 µs a row, saturated)


def test_a_request_outranked_past_its_due_time_fails_at_the_next_sweep_unrun() -> None:
    async def body() -> None:
        h = harness(max_batch_size=4, priority_levels=2, default_priority_level=2)
        h.submit("running")  # busy for 100 µs
        low = h.submit("low", due_in=1 * MS)  # admitted: it would end at 200 µs
        roomy = h.submit("roomy", due_in=50 * MS)
        highs = [h.submit(f"high{i}", due_in=50 * MS, priority=1) for i in range(40)]
        # 40 rows of level 1 ahead of it now: 2.5 ms of runs at the best per-row cost
        assert not low.done()
        h.scheduler._sweep()  # (its timer's callback)
        error = failure(low)
        assert isinstance(error, DeadlineExceeded)
        assert "(requests of a higher priority level go first)" in error.message, error.message
        assert "it was not run" in error.message
        assert not roomy.done(), "one that can wait for the work ahead keeps its place"
        assert h.scheduler.statistics().expired == 1
        index = 0
        while len(h.executor.jobs) > index:
            h.executor.complete(index)
            index += 1
        assert "low" not in h.started()
        assert all(failure(f) is None for f in [*highs, roomy])

    run(body)


def test_a_request_with_room_for_the_work_ahead_is_kept() -> None:
    async def body() -> None:
        h = harness(max_batch_size=4, priority_levels=2, default_priority_level=2)
        h.submit("running")
        low = h.submit("low", due_in=3 * MS)
        for i in range(20):  # 1.25 ms of runs ahead of it at the best per-row cost
            h.submit(f"high{i}", due_in=50 * MS, priority=1)
        h.scheduler._sweep()
        assert not low.done()
        index = 0
        while len(h.executor.jobs) > index:
            h.clock.advance(250 * US)
            h.executor.complete(index)
            index += 1
        assert failure(low) is None
        assert "low" in h.started()

    run(body)


def test_one_level_queues_are_judged_as_before() -> None:
    """With every request at one level, the work ahead is the same-level requests due sooner,
    which admission counted already: nothing more is failed."""

    async def body() -> None:
        h = harness(max_batch_size=4)
        h.submit("running")
        late = h.submit("late", due_in=20 * MS)
        for i in range(40):
            h.submit(f"early{i}", due_in=10 * MS)
        h.scheduler._sweep()
        assert not late.done()

    run(body)


def test_fifo_fails_only_what_is_due() -> None:
    """FIFO mode keeps Triton's rule: a queued request times out when its due time passes."""

    async def body() -> None:
        h = harness(policy="fifo", max_batch_size=4, priority_levels=2, default_priority_level=2)
        h.submit("running")
        low = h.submit("low", due_in=1 * MS)
        for i in range(40):
            h.submit(f"high{i}", due_in=50 * MS, priority=1)
        h.scheduler._sweep()
        assert not low.done()

    run(body)


def test_a_shadow_copy_outranked_by_real_requests_is_dropped_uncounted() -> None:
    """Shadow copies queue behind every real request (a level of their own): one that real
    requests admitted after it leave no time for is dropped as a hopeless copy is, counted
    nowhere (see `ModelScheduler.submit_shadow`)."""

    async def body() -> None:
        h = harness(max_batch_size=4)
        h.submit("running")
        copy = h.shadow("copy", due_in=1 * MS)
        assert copy is not None
        reals = [h.submit(f"real{i}", due_in=50 * MS) for i in range(40)]
        h.scheduler._sweep()
        assert isinstance(failure(copy), DeadlineExceeded)
        index = 0
        while len(h.executor.jobs) > index:
            h.executor.complete(index)
            index += 1
        assert all(failure(f) is None for f in reals)
        stats = h.scheduler.statistics()
        assert (stats.succeeded, stats.rejected, stats.expired, stats.failed) == (41, 0, 0, 0)
        assert h.scheduler.outcomes() == (0, 41)

    run(body)


# -- the pure sweep: 1 ms a row, one instance, runs without margins ------------------------------


def sweep(
    queue: EDFQueue, walk: int = 128, free: tuple[int, ...] = (0,), max_rows: int = 0
) -> list[tuple[str, float]]:
    """The requests `sweep_outranked` removes, with their predicted starts in ms (`free`: when
    each instance frees up; `max_rows`: a batch's, 0 for a model that does not batch)."""
    removed = sweep_outranked(
        queue,
        free_ns=free,
        per_row_ns=MS,
        bare=lambda rows: rows * MS,
        max_rows=max_rows,
        walk=walk,
    )
    return [(names([item])[0], start / MS) for item, start in removed]


def test_requests_of_lower_levels_behind_a_request_are_not_work_ahead_of_it() -> None:
    """A tester's repro: six 32-row requests of level 3 queued behind a 1-row request of level 2
    (due in 20 ms, 1 ms of level 1 ahead) had it failed, "the earliest an instance can start it
    is in 24 ms", the whole queue's average rows counted ahead of it."""
    queue = EDFQueue(100)
    enqueue(queue, name="p1", level=1, due=1000 * MS)
    enqueue(queue, name="p2", level=2, due=20 * MS)
    for i in range(6):
        enqueue(queue, name=f"p3-{i}", level=3, rows=32, due=5000 * MS)
    assert sweep(queue) == []
    assert len(queue) == 8


def test_withdrawn_requests_ahead_take_no_time() -> None:
    queue = EDFQueue(100)
    for i in range(30):
        item = enqueue(queue, name=f"gone{i}", level=1, due=1000 * MS)
        assert isinstance(item.future, FakeFuture)
        item.future.cancel()
    enqueue(queue, name="p2", level=2, due=20 * MS)
    assert sweep(queue) == []


def test_requests_ahead_that_will_be_dropped_unrun_take_no_time() -> None:
    """Level-1 requests that cannot make their own due times at their place in the queue will
    be dropped unrun: they push nothing back (a tester found requests failed for them that the
    server answered on time before)."""
    queue = EDFQueue(100)
    enqueue(queue, name="p1", level=1, due=1 * MS)  # runs 0-1 ms
    for i in range(20):
        enqueue(queue, name=f"doomed{i}", level=1, due=int(1.5 * MS))  # each starts at 1 ms+
    enqueue(queue, name="p2", level=2, due=5 * MS)
    assert sweep(queue) == []
    enqueue(queue, name="p2-tight", level=2, due=int(1.5 * MS))
    assert sweep(queue) == [("p2-tight", 1.0)]


def test_the_tail_of_a_level_is_judged_behind_its_head() -> None:
    """A tester's repro: behind 10 ms of level 1, level 2's requests due at 15 ms start 1 ms
    apart: the first five fit, the last five cannot. Asked at the head only (which fits), none
    was failed, and all heard at their due time."""
    queue = EDFQueue(100)
    for i in range(10):
        enqueue(queue, name=f"p1-{i}", level=1, due=1000 * MS)
    for i in range(10):
        enqueue(queue, name=f"p2-{i}", level=2, due=15 * MS)
    assert sweep(queue) == [(f"p2-{i}", 15.0) for i in range(5, 10)]
    assert names(list(queue)) == [f"p1-{i}" for i in range(10)] + [f"p2-{i}" for i in range(5)]


def test_a_level_with_only_its_own_ahead_is_left_to_the_hopeless_sweep() -> None:
    """The first level's requests, and a later level's with no live request of a higher one
    ahead, are judged as before: whether their own run still fits (`sweep_hopeless`)."""
    queue = EDFQueue(100)
    for i in range(10):
        enqueue(queue, name=f"p1-{i}", level=1, due=5 * MS)  # the last five cannot make it
    gone = enqueue(queue, name="gone", level=2, due=1000 * MS)
    assert isinstance(gone.future, FakeFuture)
    gone.future.cancel()
    assert sweep(queue) == []
    queue = EDFQueue(100)
    enqueue(queue, name="gone", level=1, due=1000 * MS).future.cancel()  # type: ignore[attr-defined]
    for i in range(10):
        enqueue(queue, name=f"p2-{i}", level=2, due=5 * MS)
    assert sweep(queue) == []


def test_the_walk_stops_at_its_bound() -> None:
    queue = EDFQueue(100)
    for i in range(10):
        enqueue(queue, name=f"p1-{i}", level=1, due=1000 * MS)
    for i in range(10):
        enqueue(queue, name=f"p2-{i}", level=2, due=15 * MS)
    assert sweep(queue, walk=17) == [("p2-5", 15.0), ("p2-6", 15.0)]


def test_a_request_ahead_runs_on_one_instance_while_another_takes_the_next() -> None:
    """A tester's repro: two instances free at 30 ms, 32 rows of level 1 ahead (32 ms on one
    instance), a request of level 2 due at 40 ms: the other instance can start it at 30 ms. The
    rows ahead spread over both instances (start at 46 ms) failed it."""
    queue = EDFQueue(100)
    enqueue(queue, name="p1", level=1, rows=32, due=2000 * MS)
    enqueue(queue, name="p2", level=2, due=40 * MS)
    assert sweep(queue, free=(30 * MS, 30 * MS)) == []
    enqueue(queue, name="p1-more", level=1, rows=32, due=2000 * MS)  # the other instance's
    assert sweep(queue, free=(30 * MS, 30 * MS)) == [("p2", 62.0)]


def test_requests_ahead_that_run_as_one_batch_take_one_instance() -> None:
    """A tester's repro: two instances free at 30 ms, two requests of 16 rows ahead (the batch
    former runs them as one batch of 32 on one instance), a request of level 2 due at 40 ms:
    the other instance can start it at 30 ms. Each put on an instance of its own, it was
    failed ("the earliest an instance can start it is in 16 ms")."""
    queue = EDFQueue(100)
    enqueue(queue, name="p1-a", level=1, rows=16, due=2000 * MS)
    enqueue(queue, name="p1-b", level=1, rows=16, due=2000 * MS)
    enqueue(queue, name="p2", level=2, due=40 * MS)
    assert sweep(queue, free=(30 * MS, 30 * MS), max_rows=32) == []
    assert sweep(queue, free=(30 * MS, 30 * MS), max_rows=16) == [("p2", 46.0)]  # (two batches)


def test_a_request_may_join_the_batch_forming_ahead_of_it() -> None:
    """One instance: a request of level 2 of the shape of the batch forming ahead of it (with
    room) starts with it; one of another shape waits for it. Failing the latter does not close
    the batch for the former."""
    queue = EDFQueue(100)
    enqueue(queue, name="p1", level=1, rows=16, due=2000 * MS)
    enqueue(queue, name="other-shape", level=2, shape=OTHER_SHAPE, due=10 * MS)
    enqueue(queue, name="same-shape", level=2, due=20 * MS)  # (the 17 rows end at 17 ms)
    assert sweep(queue, max_rows=32) == [("other-shape", 16.0)]
    assert names(list(queue)) == ["p1", "same-shape"]


def test_a_request_joins_no_batch_the_batch_former_would_cut() -> None:
    """A tester's repro: the batch former cuts a batch that would end past a due time in it,
    and forms none across a request still queued: a doomed request of level 2 joining level 1's
    batch took time in the sweep (and failed one of level 3 the server answered on time)."""
    queue = EDFQueue(100)
    enqueue(queue, name="a", level=1, rows=16, due=2000 * MS)  # runs 0-16 ms
    enqueue(queue, name="b", level=2, rows=16, due=20 * MS)  # joined: 32 rows end past 20 ms
    enqueue(queue, name="c", level=3, due=25 * MS)  # after a alone: 16-17 ms
    assert sweep(queue, max_rows=32) == [("b", 16.0)]
    assert names(list(queue)) == ["a", "c"]
