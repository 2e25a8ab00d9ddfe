"""Properties of the batch policy over random workloads, checked with a small pure simulator.

The simulator plays the part of ModelScheduler with integer time and no event loop: it acts on
the same three events (a request arrives, an instance finishes, a batching window closes), and on
each it calls drop_hopeless and then plan_batch until the instances are busy, the queue is empty
or the policy says Wait. A batch runs for exactly `service_ns(rows)`, which is also the estimate
the EDF policy is given, so predicted and actual finish times agree. Clients cancel requests at
random times; cancelling a request that already started has no effect, as in the real server.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Literal

from factories import OTHER_SHAPE, SHAPE, buckets_up_to, make_request
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.scheduling.batching import Run, Wait, drop_hopeless, plan_batch
from duetime.scheduling.edf import EDFQueue, QueuedRequest
from duetime.scheduling.profile import batch_buckets

BASE_NS = 1000
PER_ROW_NS = 100
SHAPES = (SHAPE, OTHER_SHAPE)
POLICIES: tuple[Literal["edf", "fifo"], ...] = ("edf", "fifo")
EXAMPLES = settings(max_examples=250, deadline=None)
GAPS = st.integers(0, 3000)
DUES = st.none() | st.integers(0, 20_000)
CANCELS = st.none() | st.integers(1, 5000)


@dataclass(frozen=True)
class Setup:
    policy: Literal["edf", "fifo"]
    instances: int
    max_rows: int
    max_delay_ns: int
    capacity: int

    @property
    def bucket_of(self) -> list[int]:
        return buckets_up_to(max(1, self.max_rows), batch_buckets(self.max_rows))

    def service_ns(self, rows: int) -> int:
        return BASE_NS + PER_ROW_NS * self.bucket_of[rows]


@dataclass(frozen=True)
class Arrival:
    gap_ns: int
    """Time since the previous arrival."""
    rows: int
    shape: int
    level: int
    due_in_ns: int | None
    cancel_after_ns: int | None


@dataclass
class Start:
    at_ns: int
    run: Run
    settled: list[bool]
    """Per request in the batch: was its future settled when the batch started."""
    waiting: list[QueuedRequest]
    """The live requests still queued right after the batch was taken."""


@dataclass
class Trace:
    requests: list[QueuedRequest | None] = field(default_factory=list)
    """By arrival index; None where the queue was full."""
    cancelled: set[int] = field(default_factory=set)
    starts: list[Start] = field(default_factory=list)
    dropped: list[tuple[int, QueuedRequest]] = field(default_factory=list)
    waits: list[tuple[int, int]] = field(default_factory=list)
    leftover: list[QueuedRequest] = field(default_factory=list)
    """Live requests still queued when nothing was left to happen."""

    def started(self) -> list[QueuedRequest]:
        return [item for start in self.starts for item in start.run.requests]


def index(item: QueuedRequest) -> int:
    return int(next(iter(item.feeds)))


def simulate(setup: Setup, arrivals: list[Arrival]) -> Trace:
    """Run the workload to the end and record every decision."""
    queue = EDFQueue(setup.capacity, setup.policy)
    estimate = setup.service_ns if setup.policy == "edf" else None
    times = list(itertools.accumulate(a.gap_ns for a in arrivals))
    cancels = sorted(
        (at + a.cancel_after_ns, i)
        for i, (at, a) in enumerate(zip(times, arrivals, strict=True))
        if a.cancel_after_ns is not None
    )
    trace = Trace()
    free_at = [0] * setup.instances
    timers: set[int] = set()
    answered: set[int] = set()
    """Requests started or dropped as hopeless: a client's cancel no longer changes anything."""

    def dispatch(now: int) -> None:
        while len(queue) and min(free_at) <= now:
            hopeless = drop_hopeless(queue, now_ns=now, estimate=estimate)
            trace.dropped += [(now, item) for item in hopeless]
            answered.update(index(item) for item in hopeless)
            decision = plan_batch(
                queue,
                now_ns=now,
                max_rows=setup.max_rows,
                max_delay_ns=setup.max_delay_ns,
                estimate=estimate,
                bucket_of=setup.bucket_of,
            )
            if decision is None:
                return
            if isinstance(decision, Wait):
                trace.waits.append((now, decision.until_ns))
                timers.add(decision.until_ns)
                return
            settled = [item.future.done() for item in decision.requests]
            queue.take(decision.taken)
            free_at[free_at.index(min(free_at))] = now + setup.service_ns(decision.rows)
            waiting = [queue[i] for i in range(len(queue)) if not queue[i].future.done()]
            trace.starts.append(Start(now, decision, settled, waiting))
            answered.update(index(item) for item in decision.requests)

    next_arrival = next_cancel = now = 0
    for _ in range(20_000):
        pending = [t for t in free_at if t > now] + list(timers)
        if next_arrival < len(arrivals):
            pending.append(times[next_arrival])
        if next_cancel < len(cancels):
            pending.append(cancels[next_cancel][0])
        if not pending:
            break
        now = min(pending)
        wake = now in timers or now in free_at
        timers = {t for t in timers if t > now}
        while next_cancel < len(cancels) and cancels[next_cancel][0] <= now:
            request = trace.requests[cancels[next_cancel][1]]
            if request is not None and index(request) not in answered:
                request.future.cancel()  # type: ignore[attr-defined]
                trace.cancelled.add(index(request))
            next_cancel += 1
        while next_arrival < len(arrivals) and times[next_arrival] <= now:
            a = arrivals[next_arrival]
            due = None if a.due_in_ns is None else now + a.due_in_ns
            item = make_request(
                queue, rows=a.rows, shape=SHAPES[a.shape], arrival=now, due=due, level=a.level,
                name=str(next_arrival),
            )  # fmt: skip
            trace.requests.append(item if queue.push(item) else None)
            next_arrival += 1
            wake = True
        if wake:
            dispatch(now)
    else:
        raise AssertionError("the simulation did not settle")
    trace.leftover = [queue[i] for i in range(len(queue)) if not queue[i].future.done()]
    return trace


# -- workloads -------------------------------------------------------------------------------------


@st.composite
def setups(
    draw: st.DrawFn,
    policy: Literal["edf", "fifo"] | None = None,
    capacity: int | None = None,
) -> Setup:
    return Setup(
        policy=policy if policy is not None else draw(st.sampled_from(POLICIES)),
        instances=draw(st.integers(1, 3)),
        max_rows=draw(st.sampled_from([0, 1, 2, 4, 8])),
        max_delay_ns=draw(st.sampled_from([0, 500, 3000])),
        capacity=capacity or draw(st.sampled_from([3, 8, 64])),
    )


def arrivals(
    max_rows: int,
    *,
    gaps: st.SearchStrategy[int] = GAPS,
    dues: st.SearchStrategy[int | None] = DUES,
    cancels: st.SearchStrategy[int | None] = CANCELS,
) -> st.SearchStrategy[list[Arrival]]:
    arrival = st.builds(
        Arrival,
        gap_ns=gaps,
        rows=st.integers(1, max(1, max_rows)),
        shape=st.integers(0, 1),
        level=st.integers(1, 3),
        due_in_ns=dues,
        cancel_after_ns=cancels,
    )
    return st.lists(arrival, max_size=40)


@st.composite
def workloads(
    draw: st.DrawFn, policy: Literal["edf", "fifo"] | None = None
) -> tuple[Setup, list[Arrival]]:
    setup = draw(setups(policy))
    return setup, draw(arrivals(setup.max_rows))


@st.composite
def light_workloads(draw: st.DrawFn) -> tuple[Setup, list[Arrival]]:
    """Well under capacity: one request per service time at most, generous dues, no cancels."""
    setup = draw(setups(capacity=64))
    longest = setup.service_ns(max(1, setup.max_rows))
    work = arrivals(
        setup.max_rows,
        gaps=st.integers(longest, 3 * longest),
        dues=st.none() | st.integers(200_000, 1_000_000),
        cancels=st.none(),
    )
    return setup, draw(work)


# -- properties ------------------------------------------------------------------------------------


def check_batches_are_well_formed(setup: Setup, trace: Trace) -> None:
    for start in trace.starts:
        run = start.run
        assert run.requests
        assert len({item.shape_key for item in run.requests}) == 1
        assert run.rows == sum(item.rows for item in run.requests)
        if setup.max_rows == 0:
            assert (len(run.requests), run.bucket) == (1, 0)
        else:
            assert run.rows <= setup.max_rows
            assert run.bucket == setup.bucket_of[run.rows]
    if setup.max_delay_ns == 0 or setup.max_rows == 0:
        assert trace.waits == []
    assert all(until > now for now, until in trace.waits)


def check_every_request_is_accounted_for(trace: Trace) -> None:
    started = [index(item) for item in trace.started()]
    dropped = [index(item) for _, item in trace.dropped]
    assert len(set(started)) == len(started), "a request ran twice"
    assert not set(started) & set(dropped)
    assert not set(dropped) & trace.cancelled, "a cancelled request was reported as hopeless"
    assert trace.leftover == [], "live requests were left queued with nothing left to happen"
    for item in trace.requests:
        if item is not None:
            assert index(item) in set(started) | set(dropped) | trace.cancelled


def check_drops_were_hopeless(setup: Setup, trace: Trace) -> None:
    for now, item in trace.dropped:
        assert item.due_ns is not None
        if setup.policy == "edf":
            assert now + setup.service_ns(item.rows) > item.due_ns
        else:
            assert item.due_ns <= now


@EXAMPLES
@given(workloads())
def test_batches_are_well_formed_and_every_request_is_accounted_for(
    workload: tuple[Setup, list[Arrival]],
) -> None:
    setup, work = workload
    trace = simulate(setup, work)
    check_batches_are_well_formed(setup, trace)
    check_every_request_is_accounted_for(trace)
    check_drops_were_hopeless(setup, trace)


@EXAMPLES
@given(workloads(policy="edf"))
def test_no_batch_starts_that_is_predicted_to_finish_after_a_due_time(
    workload: tuple[Setup, list[Arrival]],
) -> None:
    setup, work = workload
    for start in simulate(setup, work).starts:
        finish = start.at_ns + setup.service_ns(start.run.rows)
        dues = [item.due_ns for item in start.run.requests if item.due_ns is not None]
        assert all(finish <= due for due in dues), (start.at_ns, finish, dues)


@EXAMPLES
@given(workloads(policy="edf"))
def test_edf_starts_requests_in_due_order_within_a_level(
    workload: tuple[Setup, list[Arrival]],
) -> None:
    setup, work = workload
    for start in simulate(setup, work).starts:
        for item in start.run.requests:
            # a queued request of the same level and shape with an earlier due may not be left
            # behind (had it been hopeless, drop_hopeless would have removed it first)
            passed_over = [
                q
                for q in start.waiting
                if q.level == item.level
                and q.shape_key == item.shape_key
                and q.due_or_never < item.due_or_never
            ]
            assert passed_over == []


@EXAMPLES
@given(workloads(policy="fifo"))
def test_fifo_starts_requests_in_arrival_order_within_a_level(
    workload: tuple[Setup, list[Arrival]],
) -> None:
    setup, work = workload
    trace = simulate(setup, work)
    for level in (1, 2, 3):
        order = [index(item) for item in trace.started() if item.level == level]
        assert order == sorted(order)
    for start in trace.starts:
        for item in start.run.requests:
            passed_over = [
                q for q in start.waiting if q.level == item.level and index(q) < index(item)
            ]
            assert passed_over == []


@EXAMPLES
@given(workloads())
def test_cancelled_requests_never_run(workload: tuple[Setup, list[Arrival]]) -> None:
    setup, work = workload
    trace = simulate(setup, work)
    assert not any(any(start.settled) for start in trace.starts)
    assert not {index(item) for item in trace.started()} & trace.cancelled


@EXAMPLES
@given(light_workloads())
def test_below_capacity_every_request_is_served(workload: tuple[Setup, list[Arrival]]) -> None:
    setup, work = workload
    trace = simulate(setup, work)
    assert trace.dropped == []
    assert all(item is not None for item in trace.requests), "the queue was never full"
    assert sorted(index(item) for item in trace.started()) == list(range(len(work)))
