"""A request that higher-priority work admitted after it has made hopeless fails when the sweeper
finds so, not when its turn comes.

A tester's repro (session 47's note): lower-priority requests hopeless from 3 ms, behind a flood
of higher-priority ones, heard so at 42-45 ms, when the flood had run. The sweeper asked each
request only whether its own run still fitted if started now, blind to the levels ahead of it.
"""

from __future__ import annotations

from test_scheduler import MS, US, failure, harness, run

from duetime.errors import DeadlineExceeded

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
