"""A request its scheduler admitted but can no longer answer in time, taken over by a cheaper
variant of its version that still can (`QueuedRequest.fallback`, `ModelScheduler.take_over`),
with a FakeClock and FakeExecutors: nothing waits on real time.

Found by a tester: at 40 req/s, 0.5-3% of the requests with a tight due time were admitted by
the primary, became hopeless in its queue (a run ahead of them overran) and failed 504 "it was
not run", while the cheaper variant sat idle and could still have answered them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
from factories import FakeExecutor

from duetime.clock import FakeClock
from duetime.config import SchedulingConfig
from duetime.errors import DeadlineExceeded
from duetime.execution.executor import BatchResult, Feeds
from duetime.scheduling.edf import QueuedRequest
from duetime.scheduling.profile import LatencyProfile, profile_from_samples
from duetime.scheduling.scheduler import ModelScheduler

US = 1_000
MS = 1_000_000


def scheduler(
    clock: FakeClock, executor: FakeExecutor, profile: LatencyProfile, policy: str = "edf"
) -> ModelScheduler:
    """No margins: predictions are the profile's alone."""
    return ModelScheduler(
        executor=executor,  # type: ignore[arg-type]
        config=SchedulingConfig(
            delivery_margin_us=0,
            exec_margin=0.0,
            policy=policy,  # type: ignore[arg-type]
        ),
        max_batch_size=0,
        profile=profile,
        default_timeout_ns=None,
        clock=clock,
        label="'m' version 1",
    )


class Version:
    """A primary (`primary_ns` a run) and a cheaper variant (10 µs a run) on one clock, and the
    fallback the engine gives a request: the variant takes it over if it `fits`."""

    def __init__(self, primary_ns: int = 250 * US, depth: int = 1, policy: str = "edf") -> None:
        self.clock = FakeClock(1_000 * MS)
        self.primary_executor = FakeExecutor(1, depth=depth)
        self.variant_executor = FakeExecutor(1)
        self.primary = scheduler(
            self.clock,
            self.primary_executor,
            profile_from_samples({1: [primary_ns] * 5}),
            policy,
        )
        self.variant = scheduler(
            self.clock, self.variant_executor, profile_from_samples({1: [10 * US] * 5})
        )
        self.offered: list[QueuedRequest] = []

    def fallback(self, item: QueuedRequest, now: int) -> bool:
        self.offered.append(item)
        return self.variant.take_over(item, 0, now)

    def submit(self, name: str, due_in: int | None) -> asyncio.Future[Feeds]:
        due = None if due_in is None else self.clock.now_ns() + due_in
        return self.primary.submit_nowait(
            {name: np.zeros(1)},
            rows=1,
            shape_key=(),
            due_ns=due,
            priority=0,
            fallback=self.fallback,
        )


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


def names(executor: FakeExecutor) -> list[list[str]]:
    return [[next(iter(feeds)) for feeds in job.feeds] for _, job in executor.jobs]


def test_a_request_hopeless_in_the_primarys_queue_is_answered_by_a_cheaper_variant() -> None:
    async def body() -> None:
        v = Version()
        running = v.submit("running", None)  # the primary's one instance: 250 µs predicted
        tight = v.submit("tight", 600 * US)  # predicted done at 500 µs: admitted, queued
        assert names(v.primary_executor) == [["running"]]
        v.clock.advance(400 * US)  # the run overran: 400 + 250 µs would miss 600
        v.primary._sweep()
        assert not tight.done(), "taken over, not failed"
        assert names(v.variant_executor) == [["tight"]]
        v.variant_executor.complete(0, compute_ns=10 * US)
        assert tight.exception() is None
        np.testing.assert_array_equal(tight.result()["y"], [1.0])
        v.primary_executor.complete(0, compute_ns=400 * US)
        assert running.exception() is None
        assert names(v.primary_executor) == [["running"]], "the primary never runs it"
        primary, variant = v.primary.statistics(), v.variant.statistics()
        # counted once, where it ran: not also a failure (or anything else) of the primary's
        assert (primary.succeeded, primary.expired, primary.rejected) == (1, 0, 0)
        assert (primary.handed_over, primary.fail_ns, primary.queued) == (1, 0, 0)
        assert (variant.succeeded, variant.on_time, variant.rejected) == (1, 1, 0)
        assert variant.request_time.total == 1
        assert v.primary.outcomes() == (0, 1)
        assert v.variant.outcomes() == (0, 1)

    run(body)


def test_a_request_no_cheaper_variant_can_answer_in_time_fails_as_before() -> None:
    async def body() -> None:
        v = Version()
        busy = v.variant.submit_nowait({"busy": np.zeros(1)}, rows=1, shape_key=(), due_ns=None,
                                       priority=0)  # fmt: skip
        v.submit("running", None)
        tight = v.submit("tight", 600 * US)
        v.clock.advance(595 * US)  # 5 µs left: the variant's 10 µs run would miss it too
        v.primary._sweep()
        assert len(v.offered) == 1, "offered to the variant first"
        error = tight.exception()
        assert isinstance(error, DeadlineExceeded)
        assert "it was not run" in str(error)
        primary, variant = v.primary.statistics(), v.variant.statistics()
        assert (primary.expired, primary.handed_over) == (1, 0)
        # the variant's refusal of the hand-over is no refusal of a client's request
        assert (variant.rejected, variant.expired, variant.queued) == (0, 0, 0)
        assert v.variant.outcomes() == (0, 0)
        v.variant_executor.complete(0)
        assert busy.exception() is None

    run(body)


def test_a_hopeless_request_of_a_lookahead_batch_is_taken_over_and_never_run_twice() -> None:
    """The batch ahead overran, and the batch committed behind it can no longer answer its
    request in time (`_sweep_committed`): the variant takes the request over; the primary's
    thread skips the revoked batch, and the request is not planned again there."""

    async def body() -> None:
        v = Version(primary_ns=5 * MS, depth=2)
        v.submit("running", None)
        tight = v.submit("tight", 12 * MS)  # 5 + 5 ms predicted: admitted
        v.clock.advance(4_500 * US)
        v.primary._on_timer()
        instance, committed = v.primary_executor.jobs[1]
        assert names(v.primary_executor) == [["running"], ["tight"]]
        assert committed.start_by is not None  # (the premise: it waits for the running one)
        v.clock.advance(3 * MS)  # the running batch overruns: 7.5 + 5 ms would miss 12
        v.primary._sweep()
        assert committed.revoked
        assert names(v.variant_executor) == [["tight"]]
        v.variant_executor.complete(0, compute_ns=10 * US)
        assert tight.exception() is None
        v.primary_executor.complete(0, compute_ns=8 * MS)
        v.primary_executor.finished.add(1)
        committed.on_done(BatchResult(committed, instance, skipped=True))
        assert len(v.primary_executor.jobs) == 2, "not planned again on the primary"
        primary = v.primary.statistics()
        assert (primary.succeeded, primary.expired, primary.cancelled) == (1, 0, 0)
        assert (primary.handed_over, primary.queued) == (1, 0)
        assert v.variant.statistics().succeeded == 1

    run(body)


def test_a_primary_thread_that_ran_a_request_taken_over_leaves_its_answer_to_the_variant() -> None:
    """The thread may take the revoked batch just as the loop takes its request over (see
    `_sweep_committed`): the variant answers it, and says so; the primary settles nothing."""

    async def body() -> None:
        v = Version(primary_ns=5 * MS, depth=2)
        v.submit("running", None)
        tight = v.submit("tight", 12 * MS)
        v.clock.advance(4_500 * US)
        v.primary._on_timer()
        v.clock.advance(3 * MS)
        v.primary._sweep()
        v.primary_executor.complete(0, compute_ns=8 * MS)
        v.primary_executor.complete(1, outputs=[{"y": np.array([-1.0])}])  # it ran anyway
        assert not tight.done(), "the variant answers it"
        v.variant_executor.complete(0, compute_ns=10 * US)
        np.testing.assert_array_equal(tight.result()["y"], [1.0])
        primary = v.primary.statistics()
        assert (primary.succeeded, primary.cancelled, primary.handed_over) == (1, 0, 1)

    run(body)


def test_fifo_and_requests_without_a_due_time_are_never_offered_to_a_variant() -> None:
    async def body() -> None:
        fifo = Version(policy="fifo")
        fifo.submit("running", None)
        late = fifo.submit("late", 600 * US)
        fifo.clock.advance(700 * US)  # past its due time: FIFO fails it as Triton does
        fifo.primary._sweep()
        assert isinstance(late.exception(), DeadlineExceeded)
        assert fifo.offered == []
        assert fifo.primary.statistics().expired == 1

        v = Version()
        v.submit("running", None)
        undue = v.submit("undue", None)
        v.clock.advance(10 * MS)
        v.primary._sweep()
        assert not undue.done()
        assert v.offered == []

    run(body)
