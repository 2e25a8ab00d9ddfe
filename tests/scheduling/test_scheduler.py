"""ModelScheduler with a FakeExecutor and a FakeClock: admission, dispatch, completion, shutdown.

Each test body runs under `asyncio.run` (the scheduler binds to the running loop), but nothing
waits on real time: the clock moves only by `advance`, jobs finish only when the test completes
them, and a closing batching window is simulated by calling the scheduler's timer callback.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from conftest import collector_off
from factories import OTHER_SHAPE, SHAPE, FakeExecutor, make_profile

from duetime.clock import FakeClock
from duetime.config import BreakerConfig, ModelConfig, SchedulingConfig
from duetime.errors import (
    DeadlineExceeded,
    InternalError,
    InvalidInput,
    ModelUnavailable,
    Overloaded,
)
from duetime.execution.executor import BatchResult, Feeds
from duetime.repository.tritonconfig import translate
from duetime.resilience.breaker import BreakerState
from duetime.scheduling.ledger import CoreLedger
from duetime.scheduling.profile import (
    OVERRUN_MAX,
    OVERRUN_WINDOW,
    TAIL_MEMORY_NS,
    LatencyProfile,
    profile_from_samples,
)
from duetime.scheduling.scheduler import (
    LOOKAHEAD_BATCHES,
    PROBE_MAX_NS,
    PROBE_NS,
    SHADOW_IN_FLIGHT,
    TURN_WAIT_ALPHA,
    BatchSizeStatistics,
    ModelScheduler,
)
from duetime.types import RequestTiming

US = 1000
MS = 1_000_000
# make_profile(): 1 row takes 100 µs, 2 rows 150, 3 rows 200, 4 rows 250
ONE_ROW = 100 * US
LONG_WINDOW_US = 10_000_000  # a batching window no test lives long enough to see close by itself


@dataclass
class Harness:
    clock: FakeClock
    executor: FakeExecutor
    scheduler: ModelScheduler

    def submit(
        self,
        name: str,
        *,
        rows: int = 1,
        due_in: int | None = None,
        priority: int = 0,
        shape: tuple[object, ...] = SHAPE,
    ) -> asyncio.Future[Feeds]:
        due = None if due_in is None else self.clock.now_ns() + due_in
        return self.scheduler.submit_nowait(
            {"name": np.array([name] * rows)},
            rows=rows,
            shape_key=shape,
            due_ns=due,
            priority=priority,
        )

    def shadow(self, name: str, *, due_in: int = 1_000 * MS) -> asyncio.Future[Feeds] | None:
        """A shadow copy (see `ModelScheduler.submit_shadow`); None: dropped."""
        return self.scheduler.submit_shadow(
            {"name": np.array([name])}, rows=1, shape_key=SHAPE, due_ns=self.clock.now_ns() + due_in
        )

    def job(self, index: int) -> tuple[int, list[str]]:
        """The instance the `index`-th job went to and the requests in it."""
        instance, job = self.executor.jobs[index]
        return instance, [str(feeds["name"][0]) for feeds in job.feeds]

    def started(self) -> list[str]:
        """Every request submitted to the executor so far, in order."""
        return [name for index in range(len(self.executor.jobs)) for name in self.job(index)[1]]


def harness(
    *,
    instances: int = 1,
    max_batch_size: int = 0,
    default_timeout_ns: int | None = None,
    inline: bool = False,
    ledger: CoreLedger | None = None,
    clock: FakeClock | None = None,
    profile: LatencyProfile | None = None,
    wake_slack_ns: int = 0,
    sample_row_bytes: int = 0,
    sample: Callable[[], Feeds] | None = None,
    breaker: BreakerConfig | None = None,
    predictable_cost: bool = True,
    learn_sample: bool = False,
    **scheduling: object,
) -> Harness:
    """A scheduler on the running loop; `scheduling` overrides SchedulingConfig fields.

    The delivery margin is 0 unless a test sets it, so predictions are the profile's alone.
    """
    scheduling.setdefault("delivery_margin_us", 0)
    scheduling.setdefault("exec_margin", 0.0)
    clock = clock or FakeClock(1_000 * MS)
    executor = FakeExecutor(instances, inline=inline)
    scheduler = ModelScheduler(
        executor=executor,  # type: ignore[arg-type]
        config=SchedulingConfig(**scheduling),  # type: ignore[arg-type]
        max_batch_size=max_batch_size,
        profile=profile or make_profile(),
        default_timeout_ns=default_timeout_ns,
        clock=clock,
        label="'m' version 1",
        ledger=ledger,
        wake_slack_ns=wake_slack_ns,
        sample_row_bytes=sample_row_bytes,
        sample=sample,
        breaker=breaker,
        predictable_cost=predictable_cost,
        learn_sample=learn_sample,
    )
    return Harness(clock, executor, scheduler)


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(_unread_failures_are_fine)
        await body()

    asyncio.run(main())


def _unread_failures_are_fine(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler: a request's failure a test does not read is not logged
    (asyncio logs it when the future is collected, in whichever test runs then: a test of a
    command's exact stderr failed on it); anything else is, as by default."""
    if context.get("message") != "Future exception was never retrieved":
        loop.default_exception_handler(context)


def failure(future: asyncio.Future[Feeds]) -> BaseException | None:
    assert future.done()
    return future.exception()


# -- admission -----------------------------------------------------------------------------------


def test_a_full_queue_is_overloaded() -> None:
    async def body() -> None:
        h = harness(max_queue_size=2)
        h.submit("running")
        h.submit("q1")
        h.submit("q2")
        with pytest.raises(
            Overloaded,
            match=r"^Exceeds maximum queue size: model .*queue full "
            r"\(2 requests waiting.*max_queue_size",
        ):  # (Triton's words first)
            h.submit("refused")
        stats = h.scheduler.statistics()
        assert (stats.queued, stats.peak_queued, stats.rejected) == (2, 2, 1)
        assert h.started() == ["running"]
        # a request that brought no due time missed none: the load shedder must not count it
        assert h.scheduler.outcomes() == (0, 1)
        # nor one that brought a due time: the queue's bound refused it, not time (counted as
        # a miss, a server answering every request on time shed 753 requests as "missing
        # their due times" beside 4843 queue-full refusals)
        with pytest.raises(Overloaded, match="queue full"):
            h.submit("due", due_in=10 * MS)
        assert h.scheduler.outcomes() == (0, 2)
        assert h.scheduler.statistics().rejected == 2

    run(body)


def test_each_priority_level_has_its_own_bound_within_the_whole_queues() -> None:
    """Probe queue_full (qs2lv): with priority levels, Triton's default_queue_policy bounds
    each level's queue (max_queue_size 2: 2 requests at level 1 and 2 at level 2 behind a busy
    instance all fit); duetime had one bound for the whole model and refused the 4th."""

    async def body() -> None:
        h = harness(
            max_queue_size=5, max_queue_size_per_level=2, priority_levels=3,
            default_priority_level=2,
        )  # fmt: skip
        h.submit("running")
        h.submit("p1a", priority=1)
        h.submit("p2a", priority=2)
        h.submit("p2b", priority=0)  # the default level
        h.submit("p1b", priority=1)
        now = h.clock.now_ns()
        assert not h.scheduler.fits(now, now + 100 * MS, 1, priority=2)
        assert h.scheduler.fits(now, now + 100 * MS, 1, priority=3)
        with pytest.raises(
            Overloaded,
            match=r"^Exceeds maximum queue size: .*priority level 2 \(2 requests.*_per_level",
        ):
            h.submit("p2c", priority=7)  # beyond the levels: the default level
        h.submit("p3a", priority=3)
        with pytest.raises(Overloaded, match=r"queue full \(5 requests.*max_queue_size"):
            h.submit("p3b", priority=3)  # its level has room; the whole queue has none
        stats = h.scheduler.statistics()
        assert (stats.queued, stats.rejected) == (5, 2)
        h.executor.complete(0)
        assert h.started() == ["running", "p1a"]
        h.submit("p1c", priority=1)  # its level has room again
        assert h.scheduler.statistics().queued == 5

    run(body)


def test_a_full_level_is_named_as_a_pbtxt_wrote_it_even_with_every_level_full() -> None:
    """A config.pbtxt's `priority_levels: 2` with `default_queue_policy { max_queue_size: 3 }`
    (3 per level, Triton's meaning): a full level was refused naming config.toml's
    `scheduling.max_queue_size_per_level`, and with every level full the refusal cited 6, a
    bound the file does not hold (found by a tester)."""
    text = (
        "dynamic_batching { priority_levels: 2 default_priority_level: 2 "
        "default_queue_policy { max_queue_size: 3 } }"
    )
    scheduling = ModelConfig.model_validate(translate(text, source="c", model_name="m")).scheduling
    assert (scheduling.max_queue_size, scheduling.max_queue_size_per_level) == (6, 3)

    async def body() -> None:
        h = harness(**{**scheduling.model_dump(), "delivery_margin_us": 0, "exec_margin": 0.0})
        h.submit("running")
        for name in ("a", "b", "c"):
            h.submit(f"p2{name}", priority=2)
        level_full = (
            r"^Exceeds maximum queue size: model 'm' version 1: queue full for priority level 2 "
            r"\(3 requests of that level waiting: its bound per level, config.pbtxt's "
            r"dynamic_batching.default_queue_policy.max_queue_size with priority_levels, "
            r"config.toml's scheduling.max_queue_size_per_level\); retry later"
        )
        with pytest.raises(Overloaded, match=level_full):
            h.submit("p2d", priority=2)  # (level 1 has room)
        for name in ("a", "b", "c"):
            h.submit(f"p1{name}", priority=1)
        with pytest.raises(Overloaded, match=level_full):  # (the whole queue is full too)
            h.submit("p2e", priority=2)
        with pytest.raises(Overloaded, match=level_full.replace("level 2", "level 1")):
            h.submit("p1d", priority=1)

    run(body)


@pytest.mark.parametrize(
    ("levels", "named"),
    [
        ({}, r"config.pbtxt's dynamic_batching.default_queue_policy.max_queue_size\); retry"),
        (
            {"priority_levels": 2, "max_queue_size_per_level": 3},
            r"config.pbtxt's parameters\['duetime'\] scheduling.max_queue_size, else its "
            r"priority_levels times dynamic_batching.default_queue_policy.max_queue_size\)",
        ),
    ],
)
def test_a_full_queue_names_its_bound_in_both_config_files_terms(
    levels: dict[str, int], named: str
) -> None:
    async def body() -> None:
        h = harness(max_queue_size=2, **levels)
        h.submit("running")
        h.submit("q1", priority=1)
        h.submit("q2", priority=2)
        with pytest.raises(
            Overloaded,
            match=r"queue full \(2 requests waiting: its max_queue_size, config.toml's "
            r"scheduling.max_queue_size or " + named,
        ):
            h.submit("refused", priority=1)

    run(body)


def test_only_a_refusal_for_the_work_ahead_makes_the_model_backlogged() -> None:
    """A due time no idle instance could meet is the request's own doing: it made the model
    look backlogged, and the router sent other clients' requests to cheaper variants."""

    async def body() -> None:
        h = harness()  # (one instance; a run of one row takes 100 µs)
        with pytest.raises(Overloaded):
            h.submit("impossible", due_in=50 * US)
        assert not h.scheduler.backlogged(h.clock.now_ns())
        h.submit("running")
        h.submit("queued", due_in=10 * ONE_ROW)
        with pytest.raises(Overloaded):  # (it would fit alone: 150 µs, behind 200 µs of work)
            h.submit("behind", due_in=150 * US)
        h.executor.complete(0)
        h.executor.complete(1)  # (idle again: only the refusal tells of the backlog now)
        assert h.started() == ["running", "queued"]
        assert h.scheduler.idle
        assert h.scheduler.backlogged(h.clock.now_ns())

    run(body)


@pytest.mark.parametrize("policy", ["edf", "fifo"])
@pytest.mark.parametrize("due_in", [0, -5 * US])
def test_a_request_due_before_it_arrives_is_refused(policy: str, due_in: int) -> None:
    async def body() -> None:
        h = harness(policy=policy)
        # (Triton's words first: its clients and qa/L0_model_queue match on them)
        with pytest.raises(
            DeadlineExceeded, match=r"^Request timeout expired: .*before it reached the scheduler"
        ):
            h.submit("late", due_in=due_in)
        stats = h.scheduler.statistics()
        assert (stats.expired, stats.rejected, stats.queued) == (1, 0, 0)
        assert h.executor.jobs == []

    run(body)


def test_edf_refuses_a_due_time_it_predicts_to_miss() -> None:
    async def body() -> None:
        h = harness()
        h.submit("running")  # the only instance is busy for 100 µs
        with pytest.raises(Overloaded) as caught:
            h.submit("tight", due_in=150 * US)  # waits 100 µs, then runs 100 µs
        message = caught.value.message
        assert "predicted to finish in 200 µs but due in 150 µs (0 requests ahead)" in message
        assert caught.value.retry_after_s == pytest.approx(0.001)
        assert h.scheduler.statistics().rejected == 1
        assert h.scheduler.statistics().queued == 0

    run(body)


def test_edf_keeps_a_larger_margin_once_runs_overrun_their_prediction() -> None:
    async def body() -> None:
        h = harness(exec_margin=0.5)
        h.submit("fits", due_in=160 * US)  # 100 µs run + 50 µs margin: admitted
        for index in range(OVERRUN_WINDOW):  # 2% of runs take 3x their 100 µs
            h.clock.advance(100 * US)
            h.executor.complete(index, compute_ns=300 * US if index % 50 == 0 else 100 * US)
            h.submit(f"r{index}")
        h.clock.advance(100 * US)
        h.executor.complete(OVERRUN_WINDOW)
        assert h.scheduler.statistics().overrun == pytest.approx(3.0, rel=0.05)
        with pytest.raises(Overloaded):  # 100 µs run + 200 µs margin now
            h.submit("tight", due_in=250 * US)
        h.submit("roomy", due_in=320 * US)

    run(body)


def hand_offs(h: Harness, stall_ns: int) -> None:
    """A window of 100 µs runs, 2% of whose results reach the loop `stall_ns` after the run."""
    for index in range(OVERRUN_WINDOW):
        h.submit(f"r{index}")
        h.clock.advance(100 * US + (stall_ns if index % 50 == 0 else 0))
        h.executor.complete(index, compute_ns=100 * US)


def test_edf_keeps_the_tail_of_the_hand_offs_before_the_due_time() -> None:
    async def body() -> None:
        h = harness()
        hand_offs(h, 150 * US)
        assert h.scheduler.statistics().handoff_tail_ns == 150 * US
        with pytest.raises(Overloaded):  # a 100 µs run, but its result may take 150 µs more
            h.submit("tight", due_in=240 * US)
        h.submit("roomy", due_in=260 * US)

    run(body)


def test_a_hand_off_tail_far_longer_than_the_run_counts_only_up_to_a_limit() -> None:
    async def body() -> None:
        h = harness()
        hand_offs(h, 20 * MS)  # a loop saturated by requests: not the batch's doing
        assert h.scheduler.statistics().handoff_tail_ns == 20 * MS
        h.submit("admitted", due_in=2 * MS)  # the run, its mean hand-off, 2 runs of tail

    run(body)


def test_edf_counts_the_answers_settled_on_the_loop() -> None:
    async def body() -> None:
        h = harness()

        def written() -> None:  # a front end encoding and writing the answer
            h.clock.advance(40 * US)

        for index in range(200):
            h.scheduler.submit_nowait(
                {}, rows=1, shape_key=(), due_ns=None, priority=0, on_done=written
            )
            h.clock.advance(100 * US)
            h.executor.complete(index, compute_ns=100 * US)
        assert h.scheduler.statistics().answer_ns == pytest.approx(40 * US, rel=0.01)
        with pytest.raises(Overloaded):  # the run ends at 100 µs, its answer leaves at 140
            h.submit("tight", due_in=130 * US)
        h.submit("fits", due_in=150 * US)

    run(body)


def test_edf_admission_counts_only_the_requests_served_before_the_newcomer() -> None:
    async def body() -> None:
        h = harness()
        h.submit("running")
        h.submit("relaxed1", due_in=10 * MS)
        h.submit("relaxed2", due_in=10 * MS)
        # both relaxed requests sort after it: it waits for the running one only
        h.submit("urgent", due_in=200 * US)
        # one request (1 row at the best 62.5 µs per row) now sorts ahead of the next one
        with pytest.raises(Overloaded, match=r"finish in 262 µs but due in 260 µs \(1 requests"):
            h.submit("urgent2", due_in=260 * US)
        assert h.scheduler.statistics().queued == 3

    run(body)


def test_fifo_admits_a_due_time_it_cannot_meet_and_runs_it_while_not_yet_due() -> None:
    async def body() -> None:
        h = harness(policy="fifo")
        running = h.submit("running")
        tight = h.submit("tight", due_in=150 * US)
        h.clock.advance(100 * US)
        h.executor.complete(0)
        assert running.result()["y"].tolist() == [1.0]
        assert h.started() == ["running", "tight"], "FIFO drops only what is already past due"
        h.executor.complete(1)
        assert tight.done()
        assert failure(tight) is None

    run(body)


def test_default_timeout_applies_to_requests_without_a_due_time_only() -> None:
    """A request's own due time replaces the model's default, shorter or longer: the default
    capped it (found by a tester: a timeout is honoured always, not only below a model
    default, which is what Triton's `allow_timeout_override` allows)."""

    async def body() -> None:
        h = harness(default_timeout_ns=50 * US)
        with pytest.raises(Overloaded, match="due in 50 µs"):
            h.submit("no-due")
        later = h.submit("later", due_in=10 * MS)
        assert h.started() == ["later"]
        h.executor.complete(0)
        assert failure(later) is None
        h = harness(default_timeout_ns=10 * MS)
        with pytest.raises(Overloaded, match="due in 50 µs"):
            h.submit("sooner", due_in=50 * US)
        explicit = h.submit("explicit", due_in=5 * MS)
        assert h.started() == ["explicit"]
        h.executor.complete(0)
        assert failure(explicit) is None

    run(body)


def test_priorities_beyond_the_model_s_levels_get_the_default_level() -> None:
    """As Triton's `priority_levels`: a level the model does not have is its default level."""

    async def body() -> None:
        h = harness(priority_levels=2, default_priority_level=2)
        h.submit("running")
        h.submit("beyond", priority=9)  # level 2: behind the earlier level-2 request
        h.submit("default")  # level 2
        h.submit("first", priority=1)
        h.executor.complete(0)
        h.executor.complete(1)
        h.executor.complete(2)
        assert h.started() == ["running", "first", "beyond", "default"]

    run(body)


def test_default_timeout_makes_a_queued_request_expire() -> None:
    async def body() -> None:
        h = harness(default_timeout_ns=1 * MS)
        h.submit("running")
        queued = h.submit("no-due")
        h.clock.advance(2 * MS)
        h.executor.complete(0, compute_ns=2 * MS)
        assert isinstance(failure(queued), DeadlineExceeded)
        assert h.started() == ["running"]

    run(body)


def test_without_a_default_timeout_a_request_never_expires() -> None:
    async def body() -> None:
        h = harness()
        h.submit("running")
        queued = h.submit("no-due")
        h.clock.advance(3600 * 1000 * MS)
        h.executor.complete(0)
        assert h.started() == ["running", "no-due"]
        h.executor.complete(1)
        assert failure(queued) is None

    run(body)


# -- dispatch ------------------------------------------------------------------------------------


def test_instances_share_one_queue() -> None:
    async def body() -> None:
        h = harness(instances=2)
        futures = [h.submit(name) for name in ("a", "b", "c", "d")]
        assert {h.job(0)[0], h.job(1)[0]} == {0, 1}
        assert h.started() == ["a", "b"]
        assert h.scheduler.statistics().busy_instances == 2
        freed, _ = h.job(1)
        h.executor.complete(1)
        assert h.job(2) == (freed, ["c"]), "the instance that frees up takes the next request"
        freed, _ = h.job(0)
        h.executor.complete(0)
        assert h.job(3) == (freed, ["d"])
        h.executor.complete(2)
        h.executor.complete(3)
        assert all(failure(f) is None for f in futures)
        assert h.scheduler.statistics().busy_instances == 0

    run(body)


def test_a_job_carries_its_requests_futures_for_its_thread_to_skip_the_withdrawn() -> None:
    """The instance thread runs only the requests still waiting when it takes a job
    (executor.BatchJob.futures): a client that withdrew from a batch waiting its turn behind
    another had its request run all the same."""

    async def body() -> None:
        h = harness(max_batch_size=4)
        first = h.submit("a")
        queued = [h.submit("b"), h.submit("c")]
        h.executor.complete(0)
        assert h.job(1)[1] == ["b", "c"]
        assert list(h.executor.jobs[0][1].futures) == [first]
        assert list(h.executor.jobs[1][1].futures) == queued
        h.executor.complete(1)

    run(body)


def test_edf_serves_the_earliest_due_first() -> None:
    async def body() -> None:
        h = harness()
        h.submit("running")
        h.submit("later", due_in=9 * MS)
        h.submit("none")
        h.submit("sooner", due_in=5 * MS)
        for index in range(3):
            h.executor.complete(index)
        assert h.started() == ["running", "sooner", "later", "none"]

    run(body)


def test_fifo_serves_in_arrival_order() -> None:
    async def body() -> None:
        h = harness(policy="fifo")
        h.submit("running")
        h.submit("later", due_in=9 * MS)
        h.submit("none")
        h.submit("sooner", due_in=5 * MS)
        for index in range(3):
            h.executor.complete(index)
        assert h.started() == ["running", "later", "none", "sooner"]

    run(body)


def test_priority_levels_and_the_default_level() -> None:
    async def body() -> None:
        h = harness(default_priority_level=2)
        h.submit("running")
        h.submit("p0", priority=0)  # the default level: 2
        h.submit("p3", priority=3)
        h.submit("p2", priority=2)
        h.submit("p1", priority=1)
        for index in range(4):
            h.executor.complete(index)
        assert h.started() == ["running", "p1", "p0", "p2", "p3"]

    run(body)


def test_priority_zero_shares_the_default_level() -> None:
    async def body() -> None:
        h = harness()  # default level 1
        h.submit("running")
        h.submit("p1-later", priority=1, due_in=9 * MS)
        h.submit("p0-sooner", priority=0, due_in=5 * MS)
        for index in range(2):
            h.executor.complete(index)
        assert h.started() == ["running", "p0-sooner", "p1-later"]

    run(body)


def test_queued_requests_are_batched_by_shape() -> None:
    async def body() -> None:
        h = harness(max_batch_size=4)
        h.submit("running")
        h.submit("a", rows=2)
        h.submit("b", rows=1)
        h.submit("other", shape=OTHER_SHAPE)
        h.submit("c", rows=2)
        h.executor.complete(0)
        _, names = h.job(1)
        assert names == ["a", "b"]
        assert h.executor.jobs[1][1].rows == [2, 1]
        assert h.executor.jobs[1][1].bucket == 3
        h.executor.complete(1)
        h.executor.complete(2)
        assert h.started()[3:] == ["other", "c"]

    run(body)


def test_the_batch_waits_for_more_requests_until_its_window_closes() -> None:
    async def body() -> None:
        h = harness(max_batch_size=4, max_queue_delay_us=LONG_WINDOW_US)
        window = LONG_WINDOW_US * US
        first = h.submit("a")
        h.clock.advance(window // 2)
        h.submit("b")
        assert h.executor.jobs == [], "waiting for the batch to fill"
        h.clock.advance(window // 2 - 1)
        h.scheduler._on_timer()
        assert h.executor.jobs == [], "the window runs from the oldest request's arrival"
        h.clock.advance(1)
        h.scheduler._on_timer()
        assert h.job(0)[1] == ["a", "b"]
        assert h.executor.jobs[0][1].bucket == 2
        h.executor.complete(0)
        assert failure(first) is None
        await h.scheduler.aclose(0)

    run(body)


def test_the_batch_waits_only_as_long_as_its_due_time_allows() -> None:
    async def body() -> None:
        h = harness(max_batch_size=4, max_queue_delay_us=LONG_WINDOW_US)
        h.submit("a", due_in=1 * MS)
        assert h.executor.jobs == []
        # a 2-row batch takes 150 µs, so it must start by 850 µs after the arrival
        h.clock.advance(849 * US)
        h.scheduler._on_timer()
        assert h.executor.jobs == []
        h.clock.advance(1 * US)
        h.scheduler._on_timer()
        assert h.job(0)[1] == ["a"]
        await h.scheduler.aclose(0)

    run(body)


def test_a_batch_waiting_on_a_due_time_wakes_early_enough_for_a_late_timer() -> None:
    """A lone request due in 1 ms on a model with a long window: on an idle server it waited
    until the last instant it could start (850 µs), and a timer a few µs late found it hopeless
    and failed it unrun. The wait now ends `wake_slack_ns` before the last instant its own batch
    (1 row, 100 µs) could start."""

    async def body() -> None:
        h = harness(max_batch_size=4, max_queue_delay_us=LONG_WINDOW_US, wake_slack_ns=300 * US)
        request = h.submit("a", due_in=1 * MS)
        h.clock.advance(599 * US)
        h.scheduler._on_timer()
        assert h.executor.jobs == []
        assert h.scheduler._timer_at == h.clock.now_ns() + 1 * US, "900 - 300 µs after arrival"
        h.clock.advance(1 * US + 250 * US)  # the timer comes 250 µs late
        h.scheduler._on_timer()
        assert h.job(0)[1] == ["a"]
        h.executor.complete(0)
        assert failure(request) is None
        await h.scheduler.aclose(0)

    run(body)


def test_a_full_batch_starts_without_waiting() -> None:
    async def body() -> None:
        h = harness(max_batch_size=4, max_queue_delay_us=LONG_WINDOW_US)
        h.submit("a", rows=3)
        assert h.executor.jobs == []
        h.submit("b", rows=1)
        assert h.job(0)[1] == ["a", "b"]
        assert h.executor.jobs[0][1].bucket == 4
        await h.scheduler.aclose(0)

    run(body)


def test_a_cancelled_request_is_never_submitted() -> None:
    async def body() -> None:
        h = harness(max_batch_size=4)
        h.submit("running")
        gone = h.submit("gone")
        kept = h.submit("kept")
        gone.cancel()
        h.executor.complete(0)
        assert h.job(1)[1] == ["kept"]
        alone = h.submit("alone")
        alone.cancel()
        h.executor.complete(1)
        assert h.started() == ["running", "kept"]
        assert failure(kept) is None
        stats = h.scheduler.statistics()
        assert stats.queued == 0
        # every request ends in exactly one outcome: those withdrawn from the queue too
        assert (stats.succeeded, stats.cancelled) == (2, 2)

    run(body)


def test_statistics_give_each_request_its_batch_compute_time_and_failures_their_wait() -> None:
    """As Triton's: a request's compute_infer is its whole batch's run (the sum over executions
    would understate it by the batch size); a failure counts from arrival to failure."""

    async def body() -> None:
        h = harness(max_batch_size=4)
        h.submit("running")
        h.submit("a")
        h.submit("b")
        h.submit("c", due_in=300 * US)  # due before the second batch can finish
        h.clock.advance(250 * US)
        h.executor.complete(0, compute_ns=100 * US)
        h.executor.complete(1, compute_ns=150 * US)
        stats = h.scheduler.statistics()
        assert (stats.succeeded, stats.executions, stats.expired) == (3, 2, 1)
        assert stats.compute_ns == 250 * US
        assert stats.request_compute_ns == (100 + 2 * 150) * US
        assert stats.fail_ns == 250 * US

    run(body)


def test_a_request_cancelled_in_its_batching_window_never_runs() -> None:
    async def body() -> None:
        h = harness(max_batch_size=4, max_queue_delay_us=LONG_WINDOW_US)
        h.submit("gone").cancel()
        h.clock.advance(LONG_WINDOW_US * US)
        h.scheduler._on_timer()
        assert h.executor.jobs == []
        assert h.scheduler.statistics().queued == 0

    run(body)


def test_a_request_cancelled_while_running_is_counted_and_left_cancelled() -> None:
    async def body() -> None:
        h = harness()
        running = h.submit("running")
        running.cancel()
        h.executor.complete(0)
        assert running.cancelled()
        stats = h.scheduler.statistics()
        assert (stats.cancelled, stats.succeeded) == (1, 0)

    run(body)


def test_an_execution_whose_every_request_was_cancelled_answered_none() -> None:
    """Probe repro_exec_cancelled: a run whose only request's client hung up while it ran was
    counted in executions and batch_sizes (4 executions for 3 answers); as Triton's, those
    count the executions that answered some request. Its compute time still counts."""

    async def body() -> None:
        h = harness(max_batch_size=4)
        h.submit("gone").cancel()  # started at once: cancelled while it runs
        h.executor.complete(0, compute_ns=300 * US)
        stats = h.scheduler.statistics()
        assert (stats.executions, stats.batch_sizes, stats.cancelled) == (0, {}, 1)
        assert stats.compute_time.total == 1
        h.submit("running")
        kept = h.submit("kept")
        withdrawn = h.submit("withdrawn")
        h.executor.complete(1)
        assert h.job(2)[1] == ["kept", "withdrawn"]
        withdrawn.cancel()  # while its batch runs; the batch answers `kept`
        h.executor.complete(2, compute_ns=150 * US)
        assert failure(kept) is None
        stats = h.scheduler.statistics()
        assert (stats.executions, stats.succeeded, stats.cancelled) == (2, 2, 2)
        assert stats.batch_sizes == {
            1: BatchSizeStatistics(1, 100 * US),
            2: BatchSizeStatistics(1, 150 * US),
        }
        assert stats.compute_time.total == 3

    run(body)


def test_a_hopeless_request_is_told_its_run_apart_from_the_margins_kept() -> None:
    """mlp at 1 ms said "a run needs 668 µs" of a run of 15: the rest was margins. They are
    written as a refusal at admission writes them ("predicted to finish in 159 µs (+637 µs kept
    for margins and delivery)"), not "a run needs 220 µs + 490 µs kept ..."."""

    async def body() -> None:
        h = harness(delivery_margin_us=500)
        h.submit("running")
        doomed = h.submit("doomed", due_in=850 * US)  # admitted: 100 + 100 + 500 µs needed
        h.clock.advance(300 * US)
        h.executor.complete(0, compute_ns=300 * US)
        error = failure(doomed)
        assert isinstance(error, DeadlineExceeded)
        assert "a run needs 105 µs (+500 µs kept for margins and delivery); it was not run" in (
            error.message
        )

    run(body)


def test_a_request_that_becomes_hopeless_while_queued_fails_without_running() -> None:
    async def body() -> None:
        h = harness()
        h.submit("running")
        doomed = h.submit("doomed", due_in=250 * US)  # admitted: predicted to end at 200 µs
        fine = h.submit("fine", due_in=10 * MS)
        h.clock.advance(200 * US)  # the running batch took twice its estimate
        h.executor.complete(0, compute_ns=200 * US)
        error = failure(doomed)
        assert isinstance(error, DeadlineExceeded)
        assert error.message.startswith("Request timeout expired: ")  # (Triton's words)
        assert "could not finish before the due time" in error.message
        assert "it was not run" in error.message
        assert h.started() == ["running", "fine"]
        assert h.scheduler.statistics().expired == 1
        h.executor.complete(1)
        assert failure(fine) is None
        with pytest.raises(Overloaded):
            h.submit("refused", due_in=1 * US)
        stats = h.scheduler.statistics()
        assert (stats.rejected, stats.expired, stats.succeeded) == (1, 1, 2)
        # what the load shedder reads, (missed, seen): the 1 µs timeout no idle instance could
        # meet is no miss of a busy server
        assert h.scheduler.outcomes() == (1, 4)

    run(body)


def test_the_load_shedder_reads_refusals_for_the_work_ahead_as_misses_not_impossible_ones() -> None:
    """A few clients' impossible timeouts beside one big JSON body (the loop busy past the
    shedder's target for a moment) made the shedder refuse other clients' requests with 429."""

    async def body() -> None:
        h = harness()
        h.submit("running")  # 100 µs
        with pytest.raises(Overloaded):
            h.submit("impossible", due_in=50 * US)  # no idle instance could: not a miss
        with pytest.raises(Overloaded):
            h.submit("behind", due_in=150 * US)  # alone it would: refused for the work ahead
        assert h.scheduler.statistics().rejected == 2
        assert h.scheduler.outcomes() == (1, 2)

    run(body)


def test_refusals_for_the_work_of_a_models_own_threads_are_no_misses_for_the_load_shedder() -> None:
    """Found profiling resnet at twice its capacity: every refusal at admission counted as a
    miss, so the shedder, its loop busy beside the client, refused a growing share of requests
    unread until the model's thread ran short of work. A refusal the request would have had
    had the loop taken it in as it came is the model's capacity, not the loop's: no miss. One
    the loop's lateness caused still is."""

    async def body() -> None:
        clock, _, scheduler = long_batches()  # 5 ms runs on a thread of their own
        scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=0)
        now = clock.now_ns()
        with pytest.raises(Overloaded):  # the running batch ends in 5 ms, its own run 5 more
            scheduler.submit_nowait(
                {}, rows=1, shape_key=(), due_ns=now + 7 * MS, priority=0, arrival_ns=now
            )
        assert scheduler.outcomes() == (0, 1)
        with pytest.raises(Overloaded):  # taken in as it came, 4 ms ago, it would have fit
            scheduler.submit_nowait(
                {}, rows=1, shape_key=(), due_ns=now + 8 * MS, priority=0,
                arrival_ns=now - 4 * MS,
            )  # fmt: skip
        assert scheduler.outcomes() == (1, 2)
        assert scheduler.statistics().rejected == 2

    run(body)


def test_requests_failed_by_the_scheduler_get_their_timing_stamps() -> None:
    """Probe repro_span_stages: a traced request failed in the queue had no stamp after
    `queued_ns`, and one its run failed none after its start, so their spans showed no `queue`
    (or no `execute`) child and an `encode` child covering the wait (see Tracing.record)."""

    async def body() -> None:
        h = harness()

        def submit(due_in: int | None) -> tuple[asyncio.Future[Feeds], RequestTiming]:
            timing = RequestTiming(h.clock.now_ns())
            due = None if due_in is None else h.clock.now_ns() + due_in
            future = h.scheduler.submit_nowait(
                {}, rows=1, shape_key=SHAPE, due_ns=due, priority=0, timing=timing
            )
            return future, timing

        failing, ran = submit(None)  # runs at once
        doomed, expired = submit(250 * US)
        h.clock.advance(200 * US)
        h.executor.complete(0, outputs=[InternalError("crashed")], compute_ns=150 * US)
        assert isinstance(failure(failing), InternalError)
        assert (ran.finished_ns, ran.compute_ns) == (h.clock.now_ns(), 150 * US)
        assert ran.started_ns
        assert isinstance(failure(doomed), DeadlineExceeded)
        assert (expired.dispatched_ns, expired.started_ns) == (0, 0)
        assert expired.finished_ns == h.clock.now_ns()

    run(body)


def test_an_error_in_the_outputs_fails_only_that_request() -> None:
    async def body() -> None:
        h = harness(max_batch_size=4)
        h.submit("running")
        bad = h.submit("bad")
        good = h.submit("good")
        h.executor.complete(0)
        assert h.job(1)[1] == ["bad", "good"]
        h.executor.complete(1, outputs=[InvalidInput("index 7 out of range"), {"y": np.ones(1)}])
        assert isinstance(failure(bad), InvalidInput)
        assert good.result()["y"].tolist() == [1.0]
        stats = h.scheduler.statistics()
        assert (stats.succeeded, stats.failed, stats.executions) == (2, 1, 2)

    run(body)


def test_statistics_count_executions_rows_and_time() -> None:
    async def body() -> None:
        h = harness(max_batch_size=4)
        h.submit("a")
        h.submit("b", rows=2)
        h.submit("c")
        h.clock.advance(100 * US)
        h.executor.complete(0, compute_ns=100 * US)
        h.clock.advance(200 * US)
        h.executor.complete(1, compute_ns=200 * US)
        stats = h.scheduler.statistics()
        assert (stats.queued, stats.peak_queued) == (0, 2)
        assert (stats.busy_instances, stats.instances) == (0, 1)
        assert (stats.succeeded, stats.failed, stats.rejected, stats.expired) == (3, 0, 0, 0)
        assert (stats.executions, stats.inferences) == (2, 4)
        assert stats.batch_sizes == {
            1: BatchSizeStatistics(1, 100 * US),
            3: BatchSizeStatistics(1, 200 * US),
        }
        assert stats.compute_ns == 300 * US
        assert stats.queue_ns == 2 * 100 * US, "b and c waited for a"
        assert stats.success_ns == 100 * US + 2 * 300 * US
        assert stats.overhead_ns == 0
        assert stats.last_inference_ms > 0

    run(body)


def test_requests_far_bigger_than_the_samples_are_predicted_by_their_size() -> None:
    """A model of free size profiled on 4-byte samples: a 40 KB request ran 5 s against 100 µs
    predicted. Its run teaches a time per byte (the profile stays as it was), and the next big
    request with a due time it cannot meet is refused at once instead of answered late."""

    async def body() -> None:
        h = harness(sample_row_bytes=4)
        scheduler = h.scheduler

        def submit(size: int, due_in: int | None = None) -> asyncio.Future[Feeds]:
            due = None if due_in is None else h.clock.now_ns() + due_in
            feeds = {"x": np.zeros(size, np.float32)}
            return scheduler.submit_nowait(feeds, rows=1, shape_key=(), due_ns=due, priority=0)

        before = scheduler.profile.predict(1)
        submit(10_000)
        h.clock.advance(5_000 * MS)
        h.executor.complete(0, compute_ns=5_000 * MS)
        assert scheduler.profile.predict(1) == before, "the big run left the profile alone"
        with pytest.raises(Overloaded, match="predicted to finish in 5000"):
            submit(10_000, due_in=20 * MS)
        small = submit(1, due_in=20 * MS)  # the samples' size: the profile's 100 µs
        h.executor.complete(1)
        assert small.exception() is None
        submit(10_000, due_in=10_000 * MS)  # time enough: admitted
        assert len(h.executor.jobs) == 3

    run(body)


def test_a_small_request_over_the_samples_size_does_not_make_big_ones_refused() -> None:
    """Probe repro_perbyte: a (1, 7) float request (28 bytes against 4-byte samples) ran in
    about the profile's time, and its run over its bytes (1 µs a byte, the fixed cost's) was
    kept as the model's cost per byte: a 16 MB request that runs in 12 ms was predicted at 57 s
    and refused for good. The fixed cost is the profile's; the bytes teach what is beyond it."""

    async def body() -> None:
        h = harness(sample_row_bytes=4)
        scheduler = h.scheduler

        def submit(size: int, due_in: int | None = None) -> asyncio.Future[Feeds]:
            due = None if due_in is None else h.clock.now_ns() + due_in
            feeds = {"x": np.zeros(size, np.float32)}
            return scheduler.submit_nowait(feeds, rows=1, shape_key=(), due_ns=due, priority=0)

        big = 1_000_000  # 4 MB: runs 10 ms, the profile's 100 µs plus ~2.5 ns a byte
        submit(big)
        h.executor.complete(0, compute_ns=10 * MS)
        submit(7)  # 28 bytes: the profile's time (and a little jitter)
        h.executor.complete(1, compute_ns=110 * US)
        for index in range(2, 5):
            h.clock.advance(10 * MS)
            submit(big, due_in=50 * MS)  # admitted (it raised Overloaded: "finish in 157 s")
            h.executor.complete(index, compute_ns=10 * MS)

    run(body)


def test_a_size_refused_on_a_stalled_run_is_measured_again_when_idle() -> None:
    """Predictions come from runs, and a request refused on them never runs: one big run
    stalled 500x (another process on the core) kept every request of its size refused for good
    (the cost per byte kept the longest run seen). Idle, with its estimate over a second old,
    the model admits one such request as a probe; its run corrects the estimate."""

    async def body() -> None:
        h = harness(sample_row_bytes=4)
        scheduler = h.scheduler
        feeds = {"x": np.zeros(10_000, np.float32)}

        def submit() -> asyncio.Future[Feeds]:
            due = h.clock.now_ns() + 20 * MS
            return scheduler.submit_nowait(feeds, rows=1, shape_key=(), due_ns=due, priority=0)

        scheduler.submit_nowait(feeds, rows=1, shape_key=(), due_ns=None, priority=0)
        h.executor.complete(0, compute_ns=5_000 * MS)  # stalled: it takes 10 ms
        with pytest.raises(Overloaded, match="predicted to finish in 5000"):
            submit()
        h.clock.advance(1_000 * MS)
        probe = submit()  # idle, the estimate a second old: admitted to measure again
        assert h.scheduler.statistics().probes == 1
        h.executor.complete(1, compute_ns=10 * MS)
        assert probe.exception() is None
        admitted = submit()  # on the corrected estimate, no probe
        h.executor.complete(2, compute_ns=10 * MS)
        assert admitted.exception() is None
        assert h.scheduler.statistics().probes == 1

    run(body)


def test_a_profile_taken_on_a_busy_cpu_is_corrected_by_one_run_on_an_idle_instance() -> None:
    """A version profiled while other work held the CPU predicted 38 times its real run: it
    refused every tight request (or the router passed it over), never ran, and nothing
    corrected it. Refusing on its predictions, idle and not run for a second, it runs its
    sample inputs once; a run far under the estimate scales the whole profile down."""

    async def body() -> None:
        busy = profile_from_samples({1: [3_800 * US] * 5, 2: [5_700 * US] * 5})
        h = harness(max_batch_size=2, profile=busy, sample=lambda: {"x": np.zeros((1, 4))})
        with pytest.raises(Overloaded, match="predicted to finish in 3800 µs"):
            h.submit("tight", due_in=1 * MS)
        assert h.executor.jobs == [], "it ran a moment ago (at load): no check yet"
        h.clock.advance(2_000 * MS)
        with pytest.raises(Overloaded):
            h.submit("tight", due_in=1 * MS)
        await asyncio.sleep(0)  # (it starts on a later callback: see the next test)
        ((_, check),) = h.executor.jobs
        assert check.rows == [1]
        with pytest.raises(Overloaded):  # one check at a time
            h.submit("tight", due_in=1 * MS)
        assert len(h.executor.jobs) == 1
        h.executor.complete(0, compute_ns=100 * US)
        assert h.scheduler.profile.predict(1) == 100 * US
        assert h.scheduler.profile.predict(2) == 150 * US, "every bucket scaled alike"
        admitted = h.submit("tight", due_in=1 * MS)
        h.executor.complete(1, compute_ns=100 * US)
        assert admitted.exception() is None
        stats = h.scheduler.statistics()
        assert (stats.executions, stats.succeeded) == (1, 1), "the check is not a request"

    run(body)


def test_a_profile_check_never_takes_the_cpu_ahead_of_the_request_passed_to_a_variant() -> None:
    """Probe repro_refresh504: after a second of quiet, the router passed over the primary and
    asked it to check its profile; its 3.8 ms sample run took the CPU it shares with the
    variant at once, and the request the router then sent the variant, due in 1 ms, was
    refused. The check runs after that request has its turn, and not while requests wait."""

    async def body() -> None:
        ledger, clock = CoreLedger(), FakeClock(1_000 * MS)
        busy = profile_from_samples({1: [3_800 * US] * 5})
        sample = {"name": np.array(["sample"])}
        primary = harness(ledger=ledger, clock=clock, profile=busy, sample=lambda: sample)
        variant = harness(ledger=ledger, clock=clock)
        clock.advance(2_000 * MS)

        def route(name: str) -> asyncio.Future[Feeds]:
            """As Router._cascade: the primary does not fit, the variant takes the request."""
            now = clock.now_ns()
            assert not primary.scheduler.fits(now, now + 1 * MS, 1, 0)
            primary.scheduler.refresh_if_stale(now)
            return variant.submit(name, due_in=1 * MS)

        first = route("v1")  # (it raised Overloaded: behind the check's 3.8 ms)
        variant.submit("queued", due_in=10 * MS)  # waits behind v1
        await asyncio.sleep(0)
        assert primary.executor.jobs == [], "requests wait on the CPU: no check"
        variant.executor.complete(0)
        variant.executor.complete(1)
        assert failure(first) is None
        second = route("v2")  # nothing waits: v2 is handed over at once
        await asyncio.sleep(0)
        assert primary.started() == ["sample"]
        (_, check), (_, v2) = primary.executor.jobs[0], variant.executor.jobs[2]
        assert variant.job(2)[1] == ["v2"]
        assert check.turn is not None
        assert v2.turn is not None
        assert v2.turn[1] < check.turn[1], "the check runs after the request"
        variant.executor.complete(2)
        assert failure(second) is None
        primary.executor.complete(0, compute_ns=100 * US)
        assert primary.scheduler.profile.predict(1) == 100 * US

    run(body)


def test_batch_sizes_count_the_rows_sent_not_the_bucket_they_were_padded_to() -> None:
    async def body() -> None:
        buckets = {1: [100 * US] * 5, 2: [150 * US] * 5, 4: [250 * US] * 5}
        h = harness(max_batch_size=4, profile=profile_from_samples(buckets))
        h.submit("a", rows=3)
        h.clock.advance(250 * US)
        h.executor.complete(0, compute_ns=250 * US)
        assert h.executor.jobs[0][1].bucket == 4, "3 rows run padded to the bucket of 4"
        assert h.scheduler.statistics().batch_sizes == {3: BatchSizeStatistics(1, 250 * US)}

    run(body)


# -- shutdown ------------------------------------------------------------------------------------


def test_aclose_refuses_new_requests_and_lets_queued_ones_finish() -> None:
    async def body() -> None:
        h = harness()
        running = h.submit("running")
        queued = h.submit("queued")
        closing = asyncio.create_task(h.scheduler.aclose(60))
        await asyncio.sleep(0)  # a checkpoint: aclose starts and waits for the queue to drain
        with pytest.raises(ModelUnavailable, match="shutting down"):
            h.submit("refused")
        assert h.scheduler.statistics().unavailable == 1, "a refusal at shutdown counts"
        h.executor.complete(0)
        assert h.started() == ["running", "queued"]
        assert not closing.done()
        h.executor.complete(1)
        await closing
        assert failure(running) is None
        assert failure(queued) is None

    run(body)


@pytest.mark.parametrize("policy", ["edf", "fifo"])
def test_aclose_runs_a_batch_held_for_more_requests_at_once(policy: str) -> None:
    """No request joins a closed queue: one held for its batch to fill (a batching window of
    100 s) ran only when the window ended, after the drain: it failed unrun (found by a
    tester)."""

    async def body() -> None:
        h = harness(max_batch_size=8, max_queue_delay_us=100_000_000, policy=policy)
        held = h.submit("held")
        await asyncio.sleep(0)
        assert h.started() == [], "the premise: it waits for more to join"
        closing = asyncio.create_task(h.scheduler.aclose(30))
        await asyncio.sleep(0)
        assert h.started() == ["held"]
        h.executor.complete(0)
        await closing
        assert failure(held) is None

    run(body)


def test_aclose_fails_what_did_not_run_within_the_grace_period() -> None:
    async def body() -> None:
        h = harness()
        running = h.submit("running")
        queued = h.submit("queued")
        await h.scheduler.aclose(0)
        error = failure(queued)
        assert isinstance(error, ModelUnavailable)
        assert "shut down before it ran" in error.message
        assert not running.done(), "a batch already running is not interrupted"
        h.executor.complete(0)
        assert failure(running) is None
        assert h.started() == ["running"]

    run(body)


def test_aclose_returns_at_once_when_idle() -> None:
    async def body() -> None:
        h = harness()
        h.submit("done")
        h.executor.complete(0)
        await h.scheduler.aclose(60)
        with pytest.raises(ModelUnavailable):
            h.submit("refused")

    run(body)


def test_delivery_margin_is_kept_before_the_due_time() -> None:
    async def body() -> None:
        h = harness(delivery_margin_us=100)
        # 1 row takes 100 µs: due in 150 µs is refused with a 100 µs margin, 250 µs admitted.
        with pytest.raises(Overloaded):
            h.scheduler.submit_nowait(
                {}, rows=1, shape_key=(), due_ns=h.clock.now_ns() + 150 * US, priority=0
            )
        h.scheduler.submit_nowait(
            {}, rows=1, shape_key=(), due_ns=h.clock.now_ns() + 250 * US, priority=0
        )
        assert len(h.executor.jobs) == 1

    run(body)


def test_sweep_fails_hopeless_requests_behind_the_head() -> None:
    async def body() -> None:
        h = harness()
        now = h.clock.now_ns()
        h.scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=0)  # runs
        head = h.scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=2)
        deep = h.scheduler.submit_nowait(
            {}, rows=1, shape_key=(), due_ns=now + 900 * US, priority=3
        )
        h.clock.advance(850 * US)  # `deep` now needs 100 µs but has 50 µs left
        h.scheduler._sweep()
        assert deep.done()
        assert isinstance(deep.exception(), DeadlineExceeded)
        assert not head.done()
        await h.scheduler.aclose(0)

    run(body)


def long_batches(policy: str = "edf") -> tuple[FakeClock, FakeExecutor, ModelScheduler]:
    """A model whose batches take 5-17 ms, on one instance that takes a lookahead batch."""
    clock = FakeClock(1_000 * MS)
    executor = FakeExecutor(1, depth=2)
    scheduler = ModelScheduler(
        executor=executor,  # type: ignore[arg-type]
        config=SchedulingConfig(
            delivery_margin_us=0,
            exec_margin=0.0,
            policy=policy,  # type: ignore[arg-type]
        ),
        max_batch_size=4,
        profile=profile_from_samples({1: [5 * MS] * 5, 2: [9 * MS] * 5, 4: [17 * MS] * 5}),
        default_timeout_ns=None,
        clock=clock,
        label="'big' version 1",
    )
    return clock, executor, scheduler


def test_long_batches_get_the_next_batch_queued_before_they_end() -> None:
    """A model whose batch takes milliseconds: the next batch is handed to the instance shortly
    before the current one ends, so the instance never idles for a loop round trip."""

    async def body() -> None:
        clock, executor, scheduler = long_batches()
        scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=0)
        scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=0)
        assert len(executor.jobs) == 1  # 5 ms to go: too early to commit the next batch
        scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=0)
        clock.advance(4_500 * US)  # within a millisecond of the end
        scheduler._on_timer()
        assert len(executor.jobs) == 2
        assert executor.jobs[1][1].rows == [1, 1]
        executor.complete(0, compute_ns=5 * MS)
        assert scheduler.statistics().busy_instances == 1
        executor.complete(1, compute_ns=9 * MS)
        assert scheduler.statistics().succeeded == 3

    run(body)


def test_a_lookahead_batch_its_thread_takes_too_late_fails_its_requests_unrun() -> None:
    """The batch ahead overran: the next batch, already on the instance's thread, can no longer
    answer in time, so the thread skips it and its requests fail as expired, not late."""

    async def body() -> None:
        clock, executor, scheduler = long_batches()
        first = scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=0)
        due = clock.now_ns() + 20 * MS
        second = scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=due, priority=0)
        unbound = scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=0)
        clock.advance(4_500 * US)
        scheduler._on_timer()
        assert [job.rows for _, job in executor.jobs] == [[1], [1, 1]]
        assert executor.jobs[0][1].start_by is None, "a batch to an idle instance starts at once"
        never = executor.jobs[1][1].start_by
        assert never is not None
        assert never[1] > clock.now_ns() + 10**15, "one request in it has no due time: it runs"
        executor.complete(0, compute_ns=5 * MS)
        executor.complete(1, compute_ns=9 * MS)
        assert all(f.done() and f.exception() is None for f in (first, second, unbound))

        # the same with due times only: the batch ahead overruns
        now = clock.now_ns()
        dues = [now + 40 * MS, now + 20 * MS, now + 20 * MS]
        tight = [
            scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=due, priority=0)
            for due in dues
        ]
        clock.advance(4_500 * US)
        scheduler._on_timer()
        instance, lookahead = executor.jobs[3]
        assert lookahead.rows == [1, 1]
        assert lookahead.start_by is not None
        read_clock, start_by = lookahead.start_by
        assert start_by == dues[2] - scheduler._exec_ns(2), "in time for its last due, no later"
        executor.complete(2, compute_ns=5 * MS)
        clock.advance(15 * MS)  # the thread takes the lookahead batch now: too late for both
        assert read_clock() > start_by
        skipped = BatchResult(lookahead, instance, skipped=True)
        executor.finished.add(3)
        lookahead.on_done(skipped)
        await asyncio.sleep(0)
        said = f"its batch's run needs {scheduler._exec_ns(2) / 1e3:.0f} µs, and its instance"
        for future in tight[1:]:
            assert isinstance(future.exception(), DeadlineExceeded)
            assert "it was not run" in str(future.exception())
            assert said in str(future.exception())  # (the batch's run: not one row's)
        stats = scheduler.statistics()
        assert (stats.expired, stats.late, stats.executions) == (2, 0, 3)

    run(body)


def test_fifo_fails_a_lookahead_batch_s_requests_once_their_due_time_passes() -> None:
    """FIFO mode hands a batch over behind the running one as EDF does, but its requests wait
    there as they would in Triton's queue: each fails unrun once its due time passes, the rest
    run. (It ran whatever it handed over: a request behind a run that never ended waited past
    its due time for as long as that run took.)"""

    async def body() -> None:
        clock, executor, scheduler = long_batches("fifo")
        scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=0)
        due = clock.now_ns() + 20 * MS
        passing = scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=due, priority=0)
        later = scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=due + 60 * MS, priority=0)
        clock.advance(4_500 * US)
        scheduler._on_timer()
        lookahead = executor.jobs[1][1]
        assert lookahead.rows == [1, 1]
        assert lookahead.start_by is not None
        assert lookahead.start_by[1] == due + 60 * MS, "FIFO's latest start: its last due time"
        clock.advance(10 * MS)  # the run ahead overruns, the due time not passed yet
        scheduler._sweep()
        assert not passing.done()
        clock.advance(6 * MS)
        scheduler._sweep()
        error = passing.exception()
        assert isinstance(error, DeadlineExceeded)
        assert "while the request waited in the queue; it was not run" in str(error)
        assert not later.done()
        executor.complete(0, compute_ns=25 * MS)
        executor.complete(1, compute_ns=5 * MS)
        assert later.done()
        assert later.exception() is None
        stats = scheduler.statistics()
        assert (stats.expired, stats.succeeded) == (1, 2)

    run(body)


def test_fifo_skips_a_lookahead_batch_its_thread_takes_past_its_last_due_time() -> None:
    async def body() -> None:
        clock, executor, scheduler = long_batches("fifo")
        scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=0)
        due = clock.now_ns() + 20 * MS
        waiting = [
            scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=due, priority=0)
            for _ in range(2)
        ]
        clock.advance(4_500 * US)
        scheduler._on_timer()
        instance, lookahead = executor.jobs[1]
        assert lookahead.start_by is not None
        read_clock, start_by = lookahead.start_by
        executor.complete(0, compute_ns=25 * MS)
        clock.advance(16 * MS)  # its thread takes it before the sweeper came round
        assert read_clock() > start_by
        executor.finished.add(1)
        lookahead.on_done(BatchResult(lookahead, instance, skipped=True))
        await asyncio.sleep(0)
        for future in waiting:
            error = future.exception()
            assert isinstance(error, DeadlineExceeded)
            assert "while the request waited in the queue; it was not run" in str(error)
        assert scheduler.statistics().expired == 2

    run(body)


def test_a_batch_that_waited_for_another_keeps_no_reference_cycle_once_it_ends() -> None:
    """A batch given a `start_by` (it waited for the one ahead) holds its requests in a clock
    that holds the batch; once it ended, nothing but the collector would free them, and the
    runtime tuning makes the collector rare: with two instances on one core every batch waits
    its turn, and 2,500 requests of 1 MB grew a server by 1.6 GB (found by a tester)."""

    async def body() -> None:
        clock, executor, scheduler = long_batches()
        inputs = [np.zeros(1000) for _ in range(3)]
        alive = [weakref.ref(array) for array in inputs]
        futures = [
            scheduler.submit_nowait({"x": array}, rows=1, shape_key=(), due_ns=due, priority=0)
            for array, due in zip(inputs, (None, clock.now_ns() + 50 * MS, None), strict=True)
        ]
        del inputs
        clock.advance(4_500 * US)
        scheduler._on_timer()
        assert executor.jobs[1][1].start_by is not None  # (the premise: it waited)
        executor.complete(0, compute_ns=5 * MS)
        executor.complete(1, compute_ns=9 * MS)
        assert all(future.done() for future in futures)
        del futures
        executor.jobs.clear()
        assert [ref() is None for ref in alive] == [True, True, True]

    with collector_off():
        run(body)


def submit_named(scheduler: ModelScheduler, name: str, priority: int) -> asyncio.Future[Feeds]:
    """A one-row request whose only input is named `name` (a batch's names tell it apart)."""
    feeds = {name: np.zeros(1)}
    return scheduler.submit_nowait(feeds, rows=1, shape_key=(name,), due_ns=None, priority=priority)


def job_names(job: object) -> list[str]:
    """The names of the requests (see `submit_named`) a batch job holds, in order."""
    return [next(iter(feeds)) for feeds in job.feeds]  # type: ignore[attr-defined]


def committed_lookahead(
    clock: FakeClock, executor: FakeExecutor, scheduler: ModelScheduler
) -> tuple[asyncio.Future[Feeds], int, Any]:
    """A level-2 batch running and the next ("lazy") committed behind it as a lookahead batch,
    shortly before the running one is predicted to end: lazy's future, the instance, the job."""
    submit_named(scheduler, "running", 2)
    lazy = submit_named(scheduler, "lazy", 2)
    clock.advance(4_500 * US)
    scheduler._on_timer()
    instance, committed = executor.jobs[1]
    return lazy, instance, committed


def overrun_ends_and_skips(executor: FakeExecutor, instance: int, committed: Any) -> None:
    """The running batch ends 300 ms past its prediction; its thread takes the revoked
    lookahead batch and skips it."""
    executor.complete(0, compute_ns=305 * MS)
    executor.finished.add(1)
    committed.on_done(BatchResult(committed, instance, skipped=True))


def test_batches_are_handed_over_as_far_ahead_as_the_hand_offs_tail() -> None:
    """Found by profiling resnet at twice its capacity: its 1-2 row batches (~1.3 ms) were
    handed over one at a time a millisecond ahead, and a busy loop came back for the next one
    later than that, its thread idle 11% of the time. Where the hand-offs' recent tail is longer
    than the batches, the next batches are handed over that far ahead, several deep (up to
    `LOOKAHEAD_BATCHES`), and the instance's predicted end counts every one of them; while the
    running batch overruns its prediction, one waits behind it, no more."""

    async def body() -> None:
        clock, executor, scheduler = long_batches()
        executor.depth = LOOKAHEAD_BATCHES
        for _ in range(OVERRUN_WINDOW):  # the loop came back 12 ms late lately
            scheduler._handoff.observe(12 * MS, clock.now_ns())
        assert scheduler._handoff.value == 12 * MS
        futures = [submit_named(scheduler, name, 0) for name in ("a", "b", "c", "d")]
        # each 5 ms: a runs, b and c end within 12 ms, d would start 15 ms from now
        assert [job_names(job) for _, job in executor.jobs] == [["a"], ["b"], ["c"]]
        assert all(job.start_by is not None for _, job in executor.jobs[1:])
        clock.advance(5 * MS)
        executor.complete(0, compute_ns=5 * MS)
        # d now ends within 12 ms, after b and c: the instance is booked 15 ms ahead
        assert [job_names(job) for _, job in executor.jobs[3:]] == [["d"]]
        assert scheduler._busy_until[0] == clock.now_ns() + 15 * MS
        clock.advance(300 * MS)  # b overruns: nothing more joins the two waiting behind it
        queued = submit_named(scheduler, "e", 0)
        assert len(executor.jobs) == 4
        for index in (1, 2, 3):
            executor.complete(index, compute_ns=5 * MS)
        assert job_names(executor.jobs[4][1]) == ["e"]
        executor.complete(4, compute_ns=5 * MS)
        assert all(f.done() and f.exception() is None for f in (*futures, queued))

    run(body)


def test_a_lookahead_batch_is_taken_back_for_a_more_urgent_request_while_one_overruns() -> None:
    """The batch ahead ran far past its prediction (0.3 s against 5 ms): a more urgent request
    arriving meanwhile ran after the lookahead batch committed before it. Now the committed
    batch is revoked (its thread skips it) and planned again behind the urgent request."""

    async def body() -> None:
        clock, executor, scheduler = long_batches()
        lazy, instance, committed = committed_lookahead(clock, executor, scheduler)
        assert job_names(committed) == ["lazy"]
        submit_named(
            scheduler, "on-time", 1
        )  # the batch ahead is on schedule: the commitment stands
        assert not committed.revoked
        clock.advance(300 * MS)
        urgent = submit_named(scheduler, "urgent", 1)
        assert committed.revoked
        overrun_ends_and_skips(executor, instance, committed)
        assert job_names(executor.jobs[2][1]) == ["on-time"]
        assert not lazy.done(), "planned again, not failed"
        executor.complete(2, compute_ns=5 * MS)
        assert job_names(executor.jobs[3][1]) == ["urgent"]
        clock.advance(4_500 * US)
        scheduler._on_timer()
        assert job_names(executor.jobs[4][1]) == ["lazy"]
        executor.complete(3, compute_ns=5 * MS)
        executor.complete(4, compute_ns=5 * MS)
        assert urgent.exception() is None
        assert lazy.exception() is None
        stats = scheduler.statistics()
        assert (stats.succeeded, stats.expired, stats.failed) == (4, 0, 0)

    run(body)


def test_a_request_queued_before_the_batch_ahead_overran_takes_the_lookahead_batchs_place() -> None:
    """Found reading `_revoke_passed` for probe prio_overrun: a level-1 request arrived in the
    last millisecond of the running batch, when the lookahead batch behind it stood; the running
    batch then overran by 300 ms, and with no later arrival to revoke the lookahead batch the
    level-1 request ran after it, though that batch had not started. The sweeper's rounds now
    take it back once the overrun shows."""

    async def body() -> None:
        clock, executor, scheduler = long_batches()
        lazy, instance, committed = committed_lookahead(clock, executor, scheduler)
        urgent = submit_named(scheduler, "urgent", 1)  # on schedule: the commitment stands
        assert not committed.revoked
        clock.advance(300 * MS)  # no arrival since, only the sweeper's rounds
        scheduler._sweep()
        assert committed.revoked
        overrun_ends_and_skips(executor, instance, committed)
        assert job_names(executor.jobs[2][1]) == ["urgent"]
        clock.advance(4_500 * US)
        scheduler._on_timer()
        assert job_names(executor.jobs[3][1]) == ["lazy"]
        executor.complete(2, compute_ns=5 * MS)
        executor.complete(3, compute_ns=5 * MS)
        assert urgent.exception() is None
        assert lazy.exception() is None
        await scheduler.aclose(0)

    run(body)


def test_fifo_runs_a_batch_it_handed_to_an_instance_predicted_to_end_late() -> None:
    """FIFO mode stands for Triton's batcher: a batch handed over runs while its due times have
    not passed, even where its run is predicted to end past them (EDF would skip it)."""

    async def body() -> None:
        clock, executor, scheduler = long_batches("fifo")
        due = clock.now_ns() + 12 * MS
        futures = [
            scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=due, priority=0)
            for _ in range(3)
        ]
        clock.advance(4_500 * US)
        scheduler._on_timer()
        assert len(executor.jobs) == 2
        start_by = executor.jobs[1][1].start_by
        assert start_by is not None
        assert start_by[1] == due  # (EDF's: the due time less its 9 ms run)
        clock.advance(4 * MS)  # its thread takes it, 3.5 ms before the due time
        assert start_by[0]() <= start_by[1]
        executor.complete(0, compute_ns=5 * MS)
        executor.complete(1, compute_ns=9 * MS)
        assert all(f.done() and f.exception() is None for f in futures)
        await scheduler.aclose(0)

    run(body)


def test_an_idle_instance_takes_a_lone_request_at_once() -> None:
    """Nothing queued and an instance free: the request starts without waiting in the queue."""

    async def body() -> None:
        h = harness(max_batch_size=4)
        h.scheduler.submit_nowait({}, rows=3, shape_key=(), due_ns=None, priority=0)
        assert len(h.executor.jobs) == 1
        assert h.executor.jobs[0][1].bucket == 3
        assert h.scheduler.statistics().queued == 0
        h.executor.complete(0)
        assert h.scheduler.statistics().succeeded == 1

    run(body)


def test_an_idle_model_that_refused_everything_for_a_while_probes_once() -> None:
    async def body() -> None:
        h = harness()
        with pytest.raises(Overloaded):
            h.submit("tight", due_in=50 * US)  # a run takes 100 µs: refused, not probed
        h.clock.advance(PROBE_NS)
        probe = h.submit("probe", due_in=50 * US)  # idle and quiet that long: admitted
        assert h.started() == ["probe"]
        assert h.scheduler.statistics().probes == 1
        h.clock.advance(100 * US)
        h.executor.complete(0)
        await asyncio.sleep(0)
        assert probe.done()
        with pytest.raises(Overloaded):  # one probe per period, not every request after it
            h.submit("tight again", due_in=50 * US)
        stats = h.scheduler.statistics()
        assert (stats.probes, stats.rejected, stats.late) == (1, 2, 1)

    run(body)


def test_probes_that_confirm_the_miss_come_ever_more_rarely_till_a_request_fits() -> None:
    """The probe's period doubles at each probe (up to PROBE_MAX_NS) while its runs teach
    nothing: a request every 120 ms, each predicted to miss and slower still, was admitted as a
    probe every time and answered late; one that fits sets the period back."""

    async def body() -> None:
        h = harness()
        probed: list[int] = []

        def every_120_ms(indexes: range, refresh_every: int = 0) -> None:
            """A request every 120 ms, each predicted to miss; the probes' runs slower still.
            `refresh_every`: a refresh's sample run ends every that many requests."""
            for index in indexes:
                h.clock.advance(120 * MS)
                if refresh_every and index % refresh_every == 0:
                    h.scheduler._last_run_ns = h.clock.now_ns()  # (as a refresh's sample run)
                try:
                    h.submit(f"r{index}", due_in=60 * US)
                except Overloaded:
                    continue
                probed.append(index)
                h.clock.advance(ONE_ROW)
                h.executor.complete(len(probed) - 1, compute_ns=3 * ONE_ROW)

        every_120_ms(range(60))  # (7.2 s)
        # (periods 100, 200, 400, ... 3,200 ms from each probe's end; 9 of 10 probed before)
        assert probed == [0, 2, 6, 13, 27, 54], probed
        assert h.scheduler._probe_gap_ns == PROBE_MAX_NS  # (6,400 ms, capped)
        # the profile's refresh runs (one a second while refusing) end runs too: they kept any
        # probe more than a second apart from ever coming (found by a tester)
        every_120_ms(range(60, 120), refresh_every=8)
        later = probed[6:]
        assert later, "probes come back"
        assert later[0] - probed[-1] <= 5_000 // 120 + 2, later
        h.clock.advance(120 * MS)
        h.submit("fits", due_in=10 * MS)
        assert h.scheduler._probe_gap_ns == PROBE_NS

    run(body)


def test_an_inline_probe_runs_though_predicted_to_miss() -> None:
    """An inline model's dispatch checked the probe as any queued request, found it hopeless
    (it is admitted because it is predicted to miss) and failed it unrun: nothing was measured,
    and `duetime itch run --deadline-us 200` kept refusing 84-99% of its requests."""

    async def body() -> None:
        h = harness(inline=True)
        with pytest.raises(Overloaded):
            h.submit("tight", due_in=50 * US)  # a run takes 100 µs: refused
        h.clock.advance(PROBE_NS)
        probe = h.submit("probe", due_in=50 * US)
        await asyncio.sleep(0)  # the dispatch turn
        assert h.started() == ["probe"]
        assert failure(probe) is None
        stats = h.scheduler.statistics()
        assert (stats.probes, stats.expired, stats.executions) == (1, 0, 1)

    run(body)


def test_a_probe_waiting_for_a_batching_window_is_run_not_failed_as_hopeless() -> None:
    async def body() -> None:
        h = harness(max_batch_size=4, max_queue_delay_us=LONG_WINDOW_US)
        with pytest.raises(Overloaded):
            h.submit("tight", due_in=50 * US)
        h.clock.advance(PROBE_NS)
        probe = h.submit("probe", due_in=50 * US)
        assert h.started() == ["probe"], "predicted to miss: no window is waited for"
        h.scheduler._sweep()  # the sweeper does not fail it either
        h.clock.advance(ONE_ROW)
        h.executor.complete(0)
        assert failure(probe) is None
        assert h.scheduler.statistics().expired == 0

    run(body)


def test_margins_learnt_from_a_stall_are_forgotten_by_a_model_that_refuses_everything() -> None:
    """The overrun tail was read only as runs ended: two stalled runs set it to its cap, every
    tight request was refused (beyond a probe's reach), nothing ran, and they stayed refused for
    good. A second later the stalls no longer count; on a machine still slow, the runs admitted
    then teach it again (the first, cold after the refusals, does not count)."""

    async def body() -> None:
        h = harness()
        for index in range(OVERRUN_WINDOW):
            h.submit(f"warm {index}")
            stalled = index >= OVERRUN_WINDOW - 2
            h.executor.complete(index, compute_ns=10 * ONE_ROW if stalled else ONE_ROW)
        assert h.scheduler.statistics().overrun == OVERRUN_MAX
        with pytest.raises(Overloaded, match="kept for margins"):
            h.submit("tight", due_in=150 * US)  # 7 runs kept for the overrun
        h.clock.advance(TAIL_MEMORY_NS + MS)
        for index in range(3):
            admitted = h.submit(f"later {index}", due_in=150 * US)
            assert h.scheduler.statistics().probes == 0, "admitted on its predictions"
            h.clock.advance(10 * ONE_ROW)  # still slow
            h.executor.complete(OVERRUN_WINDOW + index, compute_ns=10 * ONE_ROW)
            assert failure(admitted) is None
        stats = h.scheduler.statistics()
        assert (stats.overrun, stats.late) == (OVERRUN_MAX, 3)
        with pytest.raises(Overloaded):
            h.submit("tight again", due_in=150 * US)

    run(body)


def test_a_probe_slower_than_predicted_leaves_the_estimates_as_they_were() -> None:
    """A probe runs cold, after 100 ms without a run: its times are not what the runs it would
    let in take (probes every 100 ms raised an inline model's estimates until it refused
    everything). A faster one still corrects them (see the probe test above)."""

    async def body() -> None:
        h = harness()
        with pytest.raises(Overloaded):
            h.submit("tight", due_in=50 * US)
        h.clock.advance(PROBE_NS)
        probe = h.submit("probe", due_in=50 * US)
        h.clock.advance(ONE_ROW)
        h.executor.complete(0, compute_ns=3 * ONE_ROW)
        assert failure(probe) is None
        assert h.scheduler.profile.predict(1) == ONE_ROW
        assert h.scheduler.statistics().overhead_ns == 0

    run(body)


def test_no_probe_for_a_request_far_beyond_its_time() -> None:
    async def body() -> None:
        h = harness()
        h.clock.advance(PROBE_NS)
        with pytest.raises(Overloaded):
            h.submit("hopeless", due_in=40 * US)  # needs 100 µs: over twice what it has
        assert h.scheduler.statistics().probes == 0

    run(body)


def test_no_probe_while_requests_run() -> None:
    async def body() -> None:
        h = harness()
        h.clock.advance(PROBE_NS)
        h.submit("running")  # no due time: always admitted, and the instance is now busy
        with pytest.raises(Overloaded):
            h.submit("tight", due_in=50 * US)
        assert h.scheduler.statistics().probes == 0

    run(body)


# -- inline execution ------------------------------------------------------------------------------


def test_inline_batches_what_one_loop_turn_brings_and_answers_in_that_turn() -> None:
    async def body() -> None:
        h = harness(inline=True, max_batch_size=4)
        futures = [h.submit(name) for name in ("a", "b", "c")]
        assert h.executor.jobs == []  # nothing runs inside submit: the turn may bring more
        await asyncio.sleep(0)  # the dispatch callback runs; the batch runs in it, on the loop
        assert [h.job(i)[1] for i in range(len(h.executor.jobs))] == [["a", "b", "c"]]
        assert all(f.done() and f.result()["y"].tolist() == [1.0] for f in futures)
        stats = h.scheduler.statistics()
        assert (stats.executions, stats.succeeded, stats.queued) == (1, 3, 0)
        assert h.scheduler.idle

    run(body)


def test_inline_requests_waiting_for_the_loop_s_turn_are_judged_on_their_bare_run() -> None:
    """A request queued for an inline model's dispatch waits out the loop's turn (`_kick`), as
    a batching window's request waits for more: once it starts it is failed unrun only where
    its run no longer fits, not the margins admission kept. Judged on those, mlp's requests
    admitted with a little slack expired as a busy loop's turns ended (~1,000 a second at 150%
    of capacity on the 2-core VM)."""

    async def body() -> None:
        h = harness(inline=True, max_batch_size=4, delivery_margin_us=500)
        fits = h.submit("fits", due_in=MS)  # admitted: a run (100 µs) and 500 µs kept fit
        gone = h.submit("gone", due_in=700 * US)
        h.clock.advance(650 * US)  # the rest of the turn: 350 and 50 µs left
        await asyncio.sleep(0)  # the dispatch turn
        assert h.started() == ["fits"]
        assert failure(fits) is None
        error = failure(gone)
        assert isinstance(error, DeadlineExceeded)
        assert "(50 µs left): a run needs 100 µs" in str(error)
        assert "waited for its batch to gather the requests of the event loop's turn" in str(error)

    run(body)


def test_inline_learns_how_long_a_turn_s_first_request_waits_for_its_dispatch() -> None:
    """`turn_wait_ns`: an EWMA over turns of the loop of the time from the first request queued
    in the turn to the end of the dispatch that ran it; one stall raises it by a bounded step;
    a model whose instances run on threads has none."""

    async def body() -> None:
        h = harness(inline=True, max_batch_size=4)
        scheduler = h.scheduler
        assert scheduler.turn_wait_ns == 0
        first = h.submit("a")
        h.clock.advance(300 * US)  # the turn reads on
        h.submit("b")
        h.clock.advance(200 * US)
        await asyncio.sleep(0)  # the dispatch: one batch, run on the loop
        assert first.done()
        assert scheduler.turn_wait_ns == TURN_WAIT_ALPHA * 500 * US
        scheduler.turn_wait_ns = learnt = 2 * MS
        h.submit("c")
        h.clock.advance(1_000 * MS)  # a stall: counted as 2 * 2 ms + 1 ms at most
        await asyncio.sleep(0)
        learnt += TURN_WAIT_ALPHA * (2 * learnt + MS - learnt)
        assert scheduler.turn_wait_ns == pytest.approx(learnt)
        threaded = harness(max_batch_size=4)
        threaded.submit("d")
        threaded.submit("e")
        threaded.clock.advance(MS)
        threaded.executor.complete(0)
        threaded.executor.complete(1)
        assert threaded.scheduler.turn_wait_ns == 0

    run(body)


def test_inline_runs_back_to_back_batches_in_one_dispatch_and_edf_order() -> None:
    async def body() -> None:
        h = harness(inline=True, max_batch_size=2)
        h.submit("late", due_in=50 * MS)
        h.submit("soon", due_in=5 * MS)
        h.submit("sooner", due_in=2 * MS)
        await asyncio.sleep(0)
        assert [h.job(i)[1] for i in range(len(h.executor.jobs))] == [["sooner", "soon"], ["late"]]

    run(body)


def test_inline_answer_that_submits_again_runs_in_a_later_turn_not_nested() -> None:
    async def body() -> None:
        h = harness(inline=True, max_batch_size=4)
        follow_ups: list[asyncio.Future[Feeds]] = []

        def again(_: object) -> None:
            follow_ups.append(h.submit("follow-up"))

        first = h.submit("first")
        first.add_done_callback(again)
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the done callback runs, and submits
        assert len(h.executor.jobs) == 1
        await asyncio.sleep(0)
        assert h.started() == ["first", "follow-up"]
        assert follow_ups[0].done()

    run(body)


@pytest.mark.parametrize("policy", ["edf", "fifo"])
def test_inline_lone_request_the_loop_held_past_its_due_time_is_not_run(policy: str) -> None:
    async def body() -> None:
        h = harness(inline=True, max_batch_size=4, policy=policy)
        held = h.submit("held", due_in=1 * MS)  # admitted: a run takes 100 µs
        h.clock.advance(2 * MS)  # the loop does other work before its dispatch turn
        await asyncio.sleep(0)
        assert h.executor.jobs == []
        assert isinstance(failure(held), DeadlineExceeded)
        assert h.scheduler.statistics().expired == 1
        assert h.scheduler.idle

    run(body)


def test_inline_waits_for_its_batching_window_like_a_thread() -> None:
    async def body() -> None:
        h = harness(inline=True, max_batch_size=4, max_queue_delay_us=LONG_WINDOW_US)
        h.submit("a")
        await asyncio.sleep(0)
        assert h.executor.jobs == []  # waiting for others to join
        h.submit("b")
        await asyncio.sleep(0)
        assert h.executor.jobs == []
        h.clock.advance(LONG_WINDOW_US * US)
        h.scheduler._on_timer()
        assert h.started() == ["a", "b"]

    run(body)


# -- schedulers sharing a CPU ----------------------------------------------------------------------


def one_cpu(max_batch_size: int = 0) -> tuple[CoreLedger, FakeClock, Harness, Harness]:
    """Two schedulers whose instances share one CPU (one ledger, one clock); the first batches
    up to `max_batch_size` rows."""
    ledger, clock = CoreLedger(), FakeClock(1_000 * MS)
    a = harness(ledger=ledger, clock=clock, max_batch_size=max_batch_size)
    return ledger, clock, a, harness(ledger=ledger, clock=clock)


def test_schedulers_on_one_cpu_plan_behind_each_other_and_take_turns_in_order() -> None:
    async def body() -> None:
        ledger, clock, a, b = one_cpu()
        a.submit("a1")  # runs now: 100 µs
        assert b.scheduler.fits(clock.now_ns(), clock.now_ns() + 250 * US, 1, 0)
        assert not b.scheduler.fits(clock.now_ns(), clock.now_ns() + 150 * US, 1, 0)
        with pytest.raises(Overloaded, match="predicted to finish in 200 µs"):
            b.submit("b-tight", due_in=150 * US)  # behind a1: 100 + 100 µs
        b.submit("b1", due_in=250 * US)
        assert (a.started(), b.started()) == (["a1"], ["b1"])  # handed over, to wait its turn
        (_, first), (_, second) = a.executor.jobs[0], b.executor.jobs[0]
        assert first.turn is not None
        assert second.turn is not None
        assert first.turn[0] is second.turn[0] is ledger.turns
        assert first.turn[1] < second.turn[1]

    run(body)


def test_work_another_scheduler_of_the_cpu_queued_counts_at_admission_if_it_cannot_wait() -> None:
    async def body() -> None:
        _, clock, a, b = one_cpu(max_batch_size=4)
        a.submit("running")
        for name in ("q1", "q2", "q3"):
            # queued behind it: 3 rows at the best per-row cost, 62.5 µs each, due 92.5 µs
            # after them: a 100 µs run before them would make them late
            a.submit(name, due_in=380 * US)
        needed = 100 * US + int(3 * 62.5 * US) + 100 * US
        assert not b.scheduler.fits(clock.now_ns(), clock.now_ns() + needed - 1_000, 1, 0)
        assert b.scheduler.fits(clock.now_ns(), clock.now_ns() + needed + 1_000, 1, 0)
        _, clock, a, b = one_cpu(max_batch_size=4)
        a.submit("running")
        for name in ("q1", "q2", "q3"):
            a.submit(name)  # due whenever: b's request goes first
        needed = 100 * US + 100 * US
        assert not b.scheduler.fits(clock.now_ns(), clock.now_ns() + needed - 1_000, 1, 0)
        assert b.scheduler.fits(clock.now_ns(), clock.now_ns() + needed, 1, 0)

    run(body)


def test_a_request_that_would_make_the_others_queued_work_late_fits_only_behind_it() -> None:
    async def body() -> None:
        _, clock, a, b = one_cpu(max_batch_size=4)
        a.submit("running", due_in=10 * MS)
        a.submit("tight", due_in=220 * US)  # queued behind 100 µs running: 57.5 µs of slack
        now = clock.now_ns()
        # a 100 µs run before `tight` would make it late: it fits behind it (262.5 µs) only
        assert not b.scheduler.fits(now, now + 250 * US, 1, 0)
        assert b.scheduler.fits(now, now + 10 * MS, 1, 0)
        later = b.submit("later", due_in=10 * MS)
        assert b.started() == [], "held back for `tight`"
        a.executor.complete(0)  # `tight` is handed over ...
        await asyncio.sleep(0)  # ... and b, woken, hands its batch over behind it
        assert (a.started(), b.started()) == (["running", "tight"], ["later"])
        (_, tight_job), (_, later_job) = a.executor.jobs[1], b.executor.jobs[0]
        assert tight_job.turn is not None
        assert later_job.turn is not None
        assert tight_job.turn[1] < later_job.turn[1]
        a.executor.complete(1)
        b.executor.complete(0)
        assert failure(later) is None

    run(body)


# -- the circuit breaker ---------------------------------------------------------------------------

FAST_BREAKER = BreakerConfig(failures=2, open_s=0.01, slow_executions=2, slow_min_us=0)


def test_a_model_whose_made_up_samples_fail_is_checked_on_a_request_that_ran() -> None:
    """Samples that failed at load (a OneHotEncoder refusing made-up strings) cannot tell a
    model at fault from its clients' values: the check after `failures` requests refused on
    their values opened the breaker, and 5 bad requests from one client had every client
    refused 503 for 5 s. The first row of a request that ran is the sample instead (until one
    runs, the made-up ones are)."""

    async def body() -> None:
        made_up = {"name": np.array(["made-up"])}
        h = harness(
            breaker=FAST_BREAKER, max_batch_size=4, sample=lambda: made_up, learn_sample=True
        )
        bad_values = InvalidInput("unknown category 'purple'")
        h.submit("red", rows=2)
        h.executor.complete(0)
        for index in range(2):  # (the second in a row has the sample run)
            h.submit(f"purple{index}")
            h.executor.complete(1 + index, outputs=[bad_values])
        assert h.job(3)[1] == ["red"], "the first row of the request that ran"
        assert h.executor.jobs[3][1].feeds[0]["name"].shape == (1,)
        h.executor.complete(3)  # (it answers its own sample: its clients' values are at fault)
        assert h.scheduler._breakers[0].state is BreakerState.CLOSED
        good = h.submit("blue")
        h.executor.complete(4)
        assert failure(good) is None

    run(body)


def test_the_learnt_sample_is_a_request_that_ran_in_a_batch_others_failed_in() -> None:
    """A tester's first good request shared a batch with bad ones: the batch was not clean,
    nothing was learnt, and the bad requests after it opened the breaker. And a string counts
    by its length: a 40 MB string was kept as 8 bytes' worth."""

    async def body() -> None:
        made_up = {"name": np.array(["made-up"])}
        h = harness(
            breaker=FAST_BREAKER, max_batch_size=4, sample=lambda: made_up, learn_sample=True,
            max_queue_delay_us=LONG_WINDOW_US,
        )  # fmt: skip
        bad_values = InvalidInput("unknown category 'purple'")
        huge = h.scheduler.submit_nowait(
            {"name": np.array(["x" * (2 << 20)], dtype=object)}, rows=1, shape_key=SHAPE,
            due_ns=None, priority=0,
        )  # fmt: skip
        h.submit("bad", rows=1)
        h.submit("good", rows=1)
        h.clock.advance(LONG_WINDOW_US * US)
        h.scheduler._on_timer()
        assert h.job(0)[1] == ["x" * (2 << 20), "bad", "good"]
        h.executor.complete(0, outputs=[{"y": np.ones(1)}, bad_values, {"y": np.ones(1)}])
        assert failure(huge) is None
        for index in range(2):  # (the second in a row has the sample run)
            h.submit(f"purple{index}")
            h.clock.advance(LONG_WINDOW_US * US)
            h.scheduler._on_timer()
            h.executor.complete(1 + index, outputs=[bad_values])
        assert h.job(3)[1] == ["good"], "not the 2 MiB string: the next request that ran"
        h.executor.complete(3)
        assert h.scheduler._breakers[0].state is BreakerState.CLOSED

    run(body)


def test_a_probe_that_fails_on_its_client_s_data_lets_the_next_request_probe() -> None:
    """Answered 400 while the model answered others within `open_s`, a half-open probe says
    nothing of the model: the breaker stays half-open for the next request to probe."""

    async def body() -> None:
        h = harness(breaker=BreakerConfig(failures=2, open_s=0.5, slow_min_us=0))
        fault = InternalError("the session crashed")
        h.submit("answered")
        h.executor.complete(0)
        for index in range(1, 3):  # the model's faults open it
            h.submit(f"m{index}")
            h.executor.complete(index, outputs=[fault])
        assert [b.state for b in h.scheduler._breakers] == [BreakerState.OPEN]
        scheduler = h.scheduler
        scheduler._breakers[0].open_until_ns = h.clock.now_ns()  # (its answer is 0 s old)
        bad = h.submit("bad-values")
        h.executor.complete(3, outputs=[InvalidInput("index 99 out of range")])
        assert isinstance(failure(bad), InvalidInput)
        assert "not counted against model 'm' version 1's circuit breaker" in str(failure(bad))
        assert [b.state for b in scheduler._breakers] == [BreakerState.HALF_OPEN]
        good = h.submit("good")
        assert h.started()[-1] == "good", "the next request probes"
        h.executor.complete(4)
        assert failure(good) is None
        assert [b.state for b in scheduler._breakers] == [BreakerState.CLOSED]

    run(body)


def test_a_probe_failing_on_its_data_has_the_samples_run_and_reopens_if_they_fail() -> None:
    """Probe repro_breaker_halfopen: a model failing every input let `failures` requests (5)
    through each half-open period, each answered 400. A probe failing on its data (400) has the
    samples run at once: a model failing those too reopens, doubled."""

    async def body() -> None:
        sample = {"name": np.array(["sample"])}
        h = harness(breaker=FAST_BREAKER, sample=lambda: sample)
        for index in range(2):  # the second in a row has the samples run: they fail
            h.submit(f"bad{index}")
            h.executor.complete(index, outputs=[InvalidInput("index 99 out of range")])
        h.executor.complete(2, outputs=[InvalidInput("index 99 out of range")])
        breaker = h.scheduler._breakers[0]
        assert breaker.state is BreakerState.OPEN
        assert breaker.retry_after_ns(h.clock.now_ns()) == 10 * MS
        h.clock.advance(20 * MS)
        probe = h.submit("probe")
        h.executor.complete(3, outputs=[InvalidInput("index 99 out of range")])
        assert isinstance(failure(probe), InvalidInput)
        assert failure(probe).http_status == 400
        assert h.executor.jobs[4][1].feeds == [sample], "the samples run at once"
        h.executor.complete(4, outputs=[InvalidInput("index 99 out of range")])
        assert breaker.state is BreakerState.OPEN, "one probe, not `failures`"
        assert breaker.retry_after_ns(h.clock.now_ns()) == 20 * MS  # doubled
        with pytest.raises(ModelUnavailable):
            h.submit("refused")

    run(body)


def test_failures_on_data_never_count_while_the_model_answers_its_samples() -> None:
    """Probe repro_breaker_dos: a healthy model that answered nobody within `open_s` counted
    its clients' bad values as its own failures (500) and opened its breaker on everyone. They
    stay 400 while the model answers its own samples, checked at most once per `open_s`."""

    async def body() -> None:
        sample = {"name": np.array(["sample"])}
        h = harness(breaker=BreakerConfig(failures=2, open_s=0.01), sample=lambda: sample)
        h.clock.advance(20 * MS)  # (idle, past open_s after its load)
        for index in range(6):
            bad = h.submit(f"bad{index}")
            job = len(h.executor.jobs) - 1
            h.executor.complete(job, outputs=[InvalidInput("index 500 out of range")])
            assert isinstance(failure(bad), InvalidInput)
            assert failure(bad).http_status == 400
            assert "not counted against model 'm' version 1's circuit breaker" in str(failure(bad))
            for n in range(len(h.executor.jobs)):  # the samples' run, answered
                if n not in h.executor.finished:
                    h.executor.complete(n)
        checks = [j for _, j in h.executor.jobs if j.feeds == [sample]]
        assert len(checks) == 1, "at most one sample check per open_s"
        assert [b.state for b in h.scheduler._breakers] == [BreakerState.CLOSED]
        h.clock.advance(20 * MS)  # (open_s later: the next such failure is checked again)
        h.submit("later")
        h.executor.complete(len(h.executor.jobs) - 1, outputs=[InvalidInput("index 500")])
        assert h.executor.jobs[-1][1].feeds == [sample]
        h.executor.complete(len(h.executor.jobs) - 1)
        assert h.scheduler.available(h.clock.now_ns())

    run(body)


def test_requests_refused_by_an_open_breaker_are_counted_unavailable() -> None:
    """Probe repro_breaker_503_uncounted: 20 requests refused 503 by an open breaker moved no
    statistic (nor `duetime_requests_total{outcome="unavailable"}`, nor Triton's OTHER)."""

    async def body() -> None:
        h = harness(breaker=BreakerConfig(failures=2, open_s=30))
        for index in range(2):
            h.submit(f"m{index}")
            h.executor.complete(index, outputs=[InternalError("crashed")])
        for _ in range(3):
            with pytest.raises(ModelUnavailable):
                h.submit("refused")
        stats = h.scheduler.statistics()
        assert (stats.failed, stats.unavailable) == (2, 3)

    run(body)


def test_a_probe_its_thread_skipped_lets_the_next_request_probe() -> None:
    """A half-open probe that never ran (its thread took it too late) told nothing: without
    letting go of it, the instance waited for that probe's verdict for good."""

    async def body() -> None:
        h = harness(breaker=FAST_BREAKER)
        for index in range(2):
            h.submit(f"m{index}")
            h.executor.complete(index, outputs=[InternalError("crashed")])
        h.clock.advance(20 * MS)
        probe = h.submit("probe", due_in=10 * MS)
        instance, job = h.executor.jobs[2]
        h.executor.finished.add(2)
        job.on_done(BatchResult(job, instance, skipped=True))
        assert isinstance(failure(probe), DeadlineExceeded)
        h.submit("next")
        assert h.started()[-1] == "next"

    run(body)


def test_a_model_whose_cost_follows_its_inputs_values_is_never_judged_slow() -> None:
    """Probe t3: valid Loop requests of 60-120 ms against a 1 ms profile, all answered, opened
    the breaker for everyone. With `predictable_cost=False` runs are never slow; failures
    still count."""

    async def body() -> None:
        h = harness(breaker=FAST_BREAKER, predictable_cost=False)
        for index in range(4):
            h.submit(f"long{index}")
            h.executor.complete(index, compute_ns=1_000 * ONE_ROW)
        assert [b.state for b in h.scheduler._breakers] == [BreakerState.CLOSED]
        for index in range(4, 6):
            h.submit(f"crash{index}")
            h.executor.complete(index, outputs=[InternalError("crashed")])
        assert [b.state for b in h.scheduler._breakers] == [BreakerState.OPEN]

        control = harness(breaker=FAST_BREAKER)  # a model of predictable cost: slow opens it
        for index in range(2):
            control.submit(f"long{index}")
            control.executor.complete(index, compute_ns=1_000 * ONE_ROW)
        assert [b.state for b in control.scheduler._breakers] == [BreakerState.OPEN]

    run(body)


def test_slow_settings_a_model_of_input_dependent_cost_ignores_are_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its runs are never judged slow: a config's slow settings were ignored unseen (a
    tester's breaker set to open on 3 runs over 5 ms stayed closed through 66-106 ms runs)."""

    async def body() -> None:
        with caplog.at_level(logging.WARNING):
            harness(breaker=BreakerConfig(slow_min_us=50_000), predictable_cost=False)
            harness(breaker=BreakerConfig(), predictable_cost=False)  # (nothing set: quiet)
            harness(breaker=BreakerConfig(slow_min_us=50_000))  # (judged by them: quiet)
        (said,) = [r.getMessage() for r in caplog.records if "never judged slow" in r.getMessage()]
        assert "slow_min_us and slow_executions do not apply to it" in said

    run(body)


def test_requests_failing_on_their_data_have_the_model_checked_on_its_samples() -> None:
    """After `failures` uncounted failures on clients' data (within `open_s` of its load), the
    model runs its own samples: a model that fails on them opens its breaker at once; one that
    answers them stays closed."""

    async def body() -> None:
        sample = {"name": np.array(["sample"])}
        for samples_fail in (False, True):
            h = harness(breaker=BreakerConfig(failures=2, open_s=1), sample=lambda: sample)
            for index in range(2):
                h.submit(f"bad{index}")
                h.executor.complete(index, outputs=[InvalidInput("index 99 out of range")])
            assert h.started()[-1] == "sample", "the samples' run was handed over"
            verdict = [InvalidInput("index 10 out of range")] if samples_fail else None
            h.executor.complete(2, outputs=verdict)
            state = BreakerState.OPEN if samples_fail else BreakerState.CLOSED
            assert [b.state for b in h.scheduler._breakers] == [state]
            assert h.scheduler.statistics().failed == 2

    run(body)


# -- batches handed over that wait for another -----------------------------------------------------


def test_a_hopeless_request_committed_behind_an_overrunning_batch_fails_at_its_time() -> None:
    """Probe t_lookahead_late504: a request committed as the lookahead batch behind a batch
    that overran heard its 504 only when that batch ended, long after its due time. The sweep
    now fails it unrun once it cannot make it, and takes its batch back."""

    async def body() -> None:
        clock, executor, scheduler = long_batches()
        scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=0)
        due = clock.now_ns() + 14 * MS
        victim = scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=due, priority=0)
        clock.advance(4_500 * US)
        scheduler._on_timer()
        instance, lookahead = executor.jobs[1]
        assert lookahead.start_by is not None
        clock.advance(3 * MS)  # 7.5 ms in, the 5 ms batch still runs; the victim needs 5 ms
        scheduler._sweep()
        assert not victim.done(), "it can still make it"
        clock.advance(2 * MS)  # 4.5 ms left
        scheduler._sweep()
        assert isinstance(failure(victim), DeadlineExceeded)
        assert "it was not run" in str(failure(victim))
        assert lookahead.revoked
        executor.complete(0, compute_ns=300 * MS)  # the overrunning batch ends
        executor.finished.add(1)
        lookahead.on_done(BatchResult(lookahead, instance, skipped=True))
        stats = scheduler.statistics()
        assert (stats.expired, stats.cancelled, stats.succeeded) == (1, 0, 1)

    run(body)


def test_a_request_late_only_in_its_committed_batch_is_planned_again() -> None:
    async def body() -> None:
        clock, executor, scheduler = long_batches()
        scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=0)
        now = clock.now_ns()
        tight = scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=now + 20 * MS, priority=0)
        loose = scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=now + 90 * MS, priority=0)
        clock.advance(4_500 * US)
        scheduler._on_timer()
        instance, lookahead = executor.jobs[1]
        assert lookahead.rows == [1, 1]
        clock.advance(7 * MS)  # 11.5 ms in: the pair (9 ms) would answer `tight` late, alone not
        scheduler._sweep()
        assert lookahead.revoked
        assert not tight.done()
        executor.complete(0, compute_ns=12 * MS)
        executor.finished.add(1)
        lookahead.on_done(BatchResult(lookahead, instance, skipped=True))
        assert executor.jobs[2][1].rows == [1], "planned again: `tight` alone first"
        executor.complete(2, compute_ns=5 * MS)
        assert tight.exception() is None
        assert not loose.done()

    run(body)


def test_a_big_request_s_batch_is_booked_for_its_size_not_the_profile() -> None:
    """Admission predicts a request far bigger than the samples by its size; the instance's
    busy-until used the profile alone, so requests behind it were planned and admitted for a
    start long before it ended."""

    async def body() -> None:
        h = harness(sample_row_bytes=4)
        big = {"x": np.zeros(10_000, np.float32)}
        h.scheduler.submit_nowait(big, rows=1, shape_key=(), due_ns=None, priority=0)
        h.clock.advance(5_000 * MS)
        h.executor.complete(0, compute_ns=5_000 * MS)  # learns ~125 µs a byte
        h.scheduler.submit_nowait(big, rows=1, shape_key=(), due_ns=None, priority=0)
        now = h.clock.now_ns()
        assert h.scheduler._busy_until[0] >= now + 4_900 * MS
        assert not h.scheduler.fits(now, now + 1_000 * MS, 1, 0)

    run(body)


def test_instances_sharing_one_cpu_bound_every_batch_by_its_due_times() -> None:
    """Probe t_instances: two instances pinned to the one spare core of a 2-core machine take
    turns; the second instance's batch, its instance's only one, had no start_by and ran
    whenever its turn came, 300-600 ms after its due time. Now it has one, and the sweep
    fails its request unrun when the batch ahead overruns."""

    async def body() -> None:
        h = harness(instances=2, ledger=CoreLedger())
        h.submit("blocker")  # instance 0, 100 µs predicted
        small = h.submit("small", due_in=500 * US)
        instance, job = h.executor.jobs[1]
        assert (instance, job.turn is not None) == (1, True)
        assert job.start_by is not None
        assert job.start_by[1] == h.clock.now_ns() + 500 * US - h.scheduler._exec_ns(1)
        h.clock.advance(450 * US)  # the blocker overran: its turn has not come
        h.scheduler._sweep()
        assert isinstance(failure(small), DeadlineExceeded)
        assert job.revoked

    run(body)


def test_instances_sharing_one_cpu_are_admitted_as_one() -> None:
    """Their batches take turns: the work queued ahead of a request is not shared out between
    them at admission."""

    async def body() -> None:
        h = harness(instances=2, ledger=CoreLedger())
        h.submit("running")  # instance 0: 100 µs
        h.submit("next")  # instance 1, after it: 200 µs
        h.submit("q1")
        h.submit("q2")  # queued: 2 rows at the best per-row cost, 62.5 µs each
        now = h.clock.now_ns()
        needed = 200 * US + 125 * US + 100 * US  # (priority 2: behind q1 and q2)
        assert not h.scheduler.fits(now, now + needed - 10 * US, 1, 2)
        assert h.scheduler.fits(now, now + needed + 10 * US, 1, 2)

    run(body)


# -- shadow copies -------------------------------------------------------------------------------


def test_a_real_request_takes_the_place_of_a_queued_shadow_copy() -> None:
    """Probe repro_shadow_queue_full: copies of every request to v1 filled the queue of v2
    (max_queue_size 8), and 89 of 100 real requests to v2 were refused 429 "queue full"."""

    async def body() -> None:
        h = harness(max_queue_size=2)
        h.submit("running")
        first, last = h.shadow("s1"), h.shadow("s2")
        assert first is not None
        assert last is not None
        assert h.shadow("s3") is None  # (the queue is full: dropped, not refused)
        now = h.clock.now_ns()
        assert h.scheduler.has_room(0)
        assert h.scheduler.fits(now, now + 10 * MS, 1, 0)
        h.submit("real")
        assert isinstance(failure(last), Overloaded)  # (the last copy gave its place)
        assert not first.done()
        h.submit("due", due_in=10 * MS)
        assert isinstance(failure(first), Overloaded)
        with pytest.raises(Overloaded, match=r"queue full \(2 requests"):
            h.submit("refused")  # (real requests only: full)
        stats = h.scheduler.statistics()
        assert (stats.queued, stats.rejected, stats.expired) == (2, 1, 0)
        assert h.scheduler.outcomes() == (0, 1)
        for index in range(3):
            h.executor.complete(index)
        assert h.started() == ["running", "due", "real"]

    run(body)


@pytest.mark.parametrize(
    ("levels", "priority"), [({"priority_levels": 2, "default_priority_level": 2}, 0), ({}, 2**50)]
)
def test_shadow_copies_run_behind_every_real_request(levels: dict[str, int], priority: int) -> None:
    """The router gave copies priority 1 << 40: with `priority_levels` set, a priority beyond
    them is the default level, where a copy queued first ran before real requests; without,
    a request asking for a larger priority (a uint64, as Triton's) queued behind them."""

    async def body() -> None:
        h = harness(**levels)
        h.submit("running")
        h.shadow("copy")
        h.submit("real", priority=priority)
        h.executor.complete(0)
        h.executor.complete(1)
        assert h.started() == ["running", "real", "copy"]

    run(body)


def test_shadow_copies_beyond_the_cap_are_dropped() -> None:
    async def body() -> None:
        h = harness()  # (one instance that does not batch: SHADOW_IN_FLIGHT copies)
        copies = [h.shadow(f"s{i}") for i in range(SHADOW_IN_FLIGHT)]
        assert all(copy is not None for copy in copies)
        assert h.shadow("over") is None
        h.executor.complete(0)  # (one ran: room for one more)
        assert h.shadow("again") is not None
        assert h.shadow("over") is None
        stats = h.scheduler.statistics()
        assert (stats.succeeded, stats.rejected, stats.queued) == (1, 0, SHADOW_IN_FLIGHT - 1)

    run(body)


def test_shadow_copies_that_cannot_finish_in_time_are_dropped_uncounted() -> None:
    """A copy predicted to miss its due time is not queued, and one that becomes hopeless as it
    waits is dropped: neither is a refusal or an expiry (with 50 ms timeouts, the copies'
    expiries were counted as missed due times, and the load shedder refused other requests
    "the server is saturated"), nor makes the model look backlogged to the router."""

    async def body() -> None:
        h = harness()  # (a run of one row takes 100 µs)
        h.submit("running")
        assert h.shadow("late", due_in=150 * US) is None  # (behind 100 µs, it needs 100 more)
        copy = h.shadow("copy", due_in=300 * US)
        assert copy is not None
        h.clock.advance(250 * US)  # (the run overran: the copy cannot finish by 300 µs now)
        h.scheduler._sweep()
        assert isinstance(failure(copy), DeadlineExceeded)
        h.executor.complete(0)
        stats = h.scheduler.statistics()
        assert (stats.succeeded, stats.rejected, stats.expired, stats.failed) == (1, 0, 0, 0)
        assert h.scheduler.outcomes() == (0, 1)
        assert not h.scheduler.backlogged(h.clock.now_ns() + 1)
        assert h.started() == ["running"]

    run(body)


def test_shadow_copies_failed_at_shutdown_are_not_counted() -> None:
    async def body() -> None:
        h = harness()
        h.submit("running")
        copy = h.shadow("copy")
        assert copy is not None
        await h.scheduler.aclose(0.0)
        assert isinstance(failure(copy), ModelUnavailable)
        assert h.scheduler.statistics().unavailable == 0

    run(body)


def test_shadow_copies_neither_join_a_real_batch_nor_wait_on_a_busy_instance() -> None:
    """In a real request's batch, a copy would lengthen its run (5 ms alone, 9 ms with one
    more row); handed to a busy instance as its next batch, it would keep a real request that
    arrives meanwhile waiting for the copy's whole run."""

    async def body() -> None:
        clock, executor, scheduler = long_batches()
        due = clock.now_ns() + 1_000 * MS
        scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=0)
        assert scheduler.submit_shadow({}, rows=1, shape_key=(), due_ns=due) is not None
        clock.advance(4_500 * US)  # (within a millisecond of the end: a lookahead batch's time)
        scheduler._on_timer()
        assert len(executor.jobs) == 1  # (the copy waits for the instance to be free)
        scheduler.submit_nowait({}, rows=1, shape_key=(), due_ns=None, priority=0)
        assert [job.rows for _, job in executor.jobs] == [[1], [1]]  # (alone: no copy in it)
        executor.complete(0, compute_ns=5 * MS)
        assert len(executor.jobs) == 2
        executor.complete(1, compute_ns=5 * MS)
        assert [job.rows for _, job in executor.jobs] == [[1], [1], [1]]  # (the copy, now)
        executor.complete(2, compute_ns=5 * MS)
        assert scheduler.statistics().succeeded == 3

    run(body)


def test_queued_shadow_copies_take_no_time_from_another_model_of_the_cpu() -> None:
    """Another scheduler of the CPU counted the copies as work queued ahead of its requests
    (and left slack for their due times): it refused real requests for the time of copies."""

    async def body() -> None:
        clock, ledger = FakeClock(1_000 * MS), CoreLedger()
        shadowed, other = (harness(clock=clock, ledger=ledger) for _ in range(2))
        shadowed.submit("running")  # (100 µs)
        assert all(shadowed.shadow(f"s{i}") is not None for i in range(4))
        now = clock.now_ns()
        # (after the running batch and its own run: 200 µs; the copies would add 250 µs)
        assert other.scheduler.fits(now, now + 250 * US, 1, 0)
        other.submit("real", due_in=250 * US)

    run(body)


def test_a_due_time_too_short_from_its_arrival_is_no_miss_for_the_load_shedder() -> None:
    """A request past its due time as it reaches the scheduler is a miss of a busy server when
    it waited to be read, not when its timeout was shorter than a run from its arrival (1 µs):
    counted, a test sending those had the shedder refuse the next test's requests."""

    async def body() -> None:
        h = harness()
        now = h.clock.now_ns()
        for arrival, missed in ((now - 2 * US, 0), (now - 50 * MS, 1)):
            with pytest.raises(DeadlineExceeded):
                h.scheduler.submit_nowait(
                    {"name": np.array(["late"])}, rows=1, shape_key=SHAPE,
                    due_ns=now - US, priority=0, arrival_ns=arrival,
                )  # fmt: skip
            assert h.scheduler.outcomes()[0] == missed
        assert h.scheduler.statistics().expired == 2

    run(body)


def test_a_stall_after_a_noisy_profile_keeps_a_margin_of_the_runs_not_of_the_profile() -> None:
    """A model profiled with three stalled runs in 200 was predicted at 5.5 runs for good, and a
    stall's overrun (its cap) kept 7 of those predictions: `duetime itch run --deadline-us 1000`
    refused 94% of its events (orderbook, ~20 µs a run, 281 predicted). The runs since show
    their own spread, and the margin is 7 of their predictions."""

    async def body() -> None:
        h = harness(profile=profile_from_samples({1: [ONE_ROW] * 197 + [10 * ONE_ROW] * 3}))
        assert h.scheduler.profile.predict(1) == ONE_ROW + 9 * ONE_ROW // 2
        for index in range(OVERRUN_WINDOW):
            h.submit(f"warm {index}")
            stalled = index >= OVERRUN_WINDOW - 2
            h.executor.complete(index, compute_ns=40 * ONE_ROW if stalled else ONE_ROW)
        assert h.scheduler.statistics().overrun == OVERRUN_MAX
        assert h.scheduler.profile.predict(1) < 2 * ONE_ROW
        admitted = h.submit("due in 20 runs", due_in=20 * ONE_ROW)
        h.clock.advance(ONE_ROW)
        h.executor.complete(OVERRUN_WINDOW, compute_ns=ONE_ROW)
        assert failure(admitted) is None

    run(body)


def test_an_expiry_judged_from_an_instance_s_start_says_when_that_is() -> None:
    """Found by a tester: a request judged hopeless from the earliest start an instance had
    was told, counted from now, "(3019 µs left): a run needs 522 µs (+2452 µs kept ...)",
    which fits."""
    from factories import make_request

    async def body() -> None:
        h = harness(max_batch_size=8, delivery_margin_us=2000)
        now = h.clock.now_ns()
        exec_ns = h.scheduler._exec_ns(1)
        kept = h.scheduler._kept_for(1)
        item = make_request(h.scheduler._queue, arrival=now, due=now + exec_ns + kept + 50_000)
        start = now + 400_000  # (an instance free only then: too late from there)
        said = h.scheduler._expiry(item, now, start=start)
        assert "the earliest an instance can start it is in 400 µs" in said
        assert "the earliest" not in h.scheduler._expiry(item, now)  # (free now: not said)

    run(body)
