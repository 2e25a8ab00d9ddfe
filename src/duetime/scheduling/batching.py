"""BatchPolicy: which queued requests run together next, whether to wait for more, and which
requests can no longer make it. Pure: it reads the queue and the time and returns a decision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from duetime.scheduling.edf import NO_DUE, SHADOW_LEVEL, EDFQueue, QueuedRequest

Estimate = Callable[[int], int]
"""Predicted ns from the start of a batch of `rows` to its result (execution plus hand-off)."""


@dataclass(frozen=True, slots=True)
class Run:
    """Start these requests now as one execution, padded up to `bucket` rows."""

    taken: int
    """How many queue entries the batch consumes (settled ones it skipped included)."""
    requests: list[QueuedRequest]
    rows: int
    bucket: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Form no batch yet: look again at `until_ns` (or when a request arrives)."""

    until_ns: int
    held: tuple[QueuedRequest, ...] = field(default=(), compare=False)
    """The requests of the batch that waits: the caller marks them `QueuedRequest.held`."""
    due_bound: bool = field(default=False, compare=False)
    """The wait ends before its window (`max_delay_ns`) does, for a due time in the batch: it
    ends early by the wake slack, and a raised slack ends it earlier still. A wait the window
    alone bounds ends when the window does, whatever the slack (`max_queue_delay_us`)."""


def drop_hopeless(
    queue: EDFQueue, *, now_ns: int, estimate: Estimate | None, bare: Estimate | None = None
) -> list[QueuedRequest]:
    """Remove from the head the requests that cannot be answered in time, and settled ones.

    With an `estimate` (EDF) a request is hopeless when even starting it now would finish after
    its due time (a `held` one: on its `bare` prediction, see `is_hopeless`); without one (FIFO,
    as Triton) only when its due time has passed. Returns the hopeless requests, to be failed
    without running; settled ones are discarded.
    """
    hopeless: list[QueuedRequest] = []
    while len(queue):
        head = queue[0]
        if head.future.done():
            queue.take(1)
            continue
        if not is_hopeless(head, now_ns, estimate, bare):
            break
        hopeless.extend(queue.take(1))
    return hopeless


def is_hopeless(
    item: QueuedRequest, now_ns: int, estimate: Estimate | None, bare: Estimate | None = None
) -> bool:
    """EDF (an `estimate`): even starting now it would finish after its due time. FIFO (none),
    as Triton: its due time has passed.

    A request whose batch waited for more by the batch former's choice (`QueuedRequest.held`)
    is judged on its `bare` prediction (its run and answer, no margins) where one is given: the
    wait was planned to end with its margins in hand, and a wake-up later than planned (a
    loop's timers: a millisecond, more on a busy machine) or margins grown meanwhile must not
    fail unrun a request that can still be answered on time.
    NOTE: an idle model with a batching window longer than the due times (max_queue_delay_us
    300 ms, timeouts 50 ms, a 2.7 ms run) failed 3 of 40 lone requests unrun with 2.2 ms left:
    their run fitted, their margins (1.6 ms) no longer did."""
    if item.due_ns is None:
        return False
    if estimate is None:
        return item.due_ns <= now_ns
    if item.held and bare is not None:
        return now_ns + bare(item.rows) > item.due_ns
    return now_ns + estimate(item.rows) > item.due_ns


def sweep_hopeless(
    queue: EDFQueue, *, now_ns: int, estimate: Estimate | None, bare: Estimate | None = None
) -> list[QueuedRequest]:
    """Like `drop_hopeless`, over the whole queue: while every instance is busy, requests deep in
    the queue can become hopeless too, and their clients should hear so at once."""

    horizon = now_ns  # FIFO: only what is already due
    if estimate is not None:
        estimate = _memoized(estimate)
        # NOTE: nothing due later than the widest request's estimate can be hopeless yet
        horizon = now_ns + max(estimate(1), estimate(queue.widest or 1))

    def doomed(item: QueuedRequest) -> bool:
        return item.future.done() or is_hopeless(item, now_ns, estimate, bare)

    removed = queue.remove_due_by(horizon, doomed)
    return [item for item in removed if not item.future.done()]


OUTRANKED_WALK = 128
"""`sweep_outranked` looks this far into the queue at most: requests deeper are judged once those
ahead of them have gone. NOTE: a walk costs ~0.3 µs a request on the 2-core VM (40 µs for this
many), on each sweep that asks for one (see `ModelScheduler._sweep`)."""


def sweep_outranked(
    queue: EDFQueue,
    *,
    free_ns: Sequence[int],
    per_row_ns: float,
    bare: Estimate,
    max_rows: int = 0,
    walk: int = OUTRANKED_WALK,
) -> list[tuple[QueuedRequest, int]]:
    """EDF: the requests of a priority level after the queue's first that can no longer start in
    time behind the requests of higher priority ahead of them, each with its predicted start.

    The queue is played forward in its order, as the optimist sees it: the instances free up at
    `free_ns` (one each); the live requests ahead that can still make their due times form
    batches as tight as the batch former could make them (consecutive, of one shape, up to
    `max_rows` rows; 0: a request a batch), each batch run on the instance free first, its rows
    at the best sustained cost a row; a request that cannot make its due time (it will be
    dropped unrun), one withdrawn by its client and one behind the request take no time; a
    request may join the batch forming when it comes up, and its own run is the `bare` one (no
    margins). A request of a later level that cannot start in time so, with a live request of a
    higher level ahead of it, is removed. The first level's own are left to `sweep_hopeless`
    (their work ahead was admission's to judge), as is a request with only its own level ahead.

    NOTE: admitted, a request of a lower level is pushed back by every request of a higher one
    admitted after it; asked only whether its own run still fits, those behind a flood heard
    they were hopeless when the flood had run (at 42-45 ms, hopeless from 3 ms: a tester's
    repro). Rows ahead counted as the whole queue's average (as admission does), requests of
    32 rows queued behind a request of 1 failed it (60 ms left, 3 ms of work ahead); counted
    with the withdrawn ones, or with those that will be dropped, others were failed that the
    server answered on time before; asked only at the head of its level, a level's tail (due
    times 0.05 ms apart, runs 0.92 ms) heard at its due time; the rows ahead spread over two
    instances, a request of 32 rows ahead (it runs on one of them) failed one the other instance
    was free to answer at once; and each request ahead put on an instance of its own, two of 16
    rows that ran as one batch of 32 did the same (all found by testers)."""
    removed: list[tuple[QueuedRequest, int]] = []
    first_end = queue.level_end(0) if len(queue) else 0
    if first_end >= len(queue):
        return removed
    free = list(free_ns)
    bare = _memoized(bare)
    forming_rows = 0  # (the batch forming: its rows and shape; it starts at min(free))
    forming_shape: object = None
    forming_due = NO_DUE
    taken = 0  # (live requests so far that take time)
    level = -1
    index = 0
    while index < len(queue) and walk > 0:
        walk -= 1
        item = queue[index]
        if item.level != level:
            level, ahead = item.level, taken  # (those of the levels before it)
        if item.future.done():
            index += 1
            continue
        start = min(free)
        due = NO_DUE if item.due_ns is None else item.due_ns
        closes = bool(forming_rows) and (
            item.shape_key != forming_shape
            or forming_rows + item.rows > max_rows
            # (the batch former cuts a batch that would end past a due time in it)
            or start + bare(forming_rows + item.rows) > min(forming_due, due)
        )
        if closes:  # (the batch forming runs first, on the instance free first)
            first = free.index(start)
            after = start + int(forming_rows * per_row_ns)
            start = min([after, *free[:first], *free[first + 1 :]])
        if item.due_ns is None or start + bare(item.rows) <= item.due_ns:
            if closes:
                free[first] = after
                forming_rows, forming_due = 0, NO_DUE
            forming_rows += item.rows
            forming_shape = item.shape_key
            forming_due = min(forming_due, due)
            taken += 1
            index += 1
        elif index < first_end or not ahead:
            index += 1  # (`sweep_hopeless`'s; dropped unrun when it is, it takes no time)
            forming_shape = _BOUNDARY  # (a batch is not formed across it)
        else:
            removed.append((queue.pop_at(index), start))
    return removed


_BOUNDARY = object()
"""`sweep_outranked`: the shape of no request (the batch forming takes no more)."""


def _memoized(estimate: Estimate) -> Estimate:
    needs: dict[int, int] = {}

    def cached(rows: int) -> int:
        found = needs.get(rows)
        if found is None:
            found = needs[rows] = estimate(rows)
        return found

    return cached


def plan_batch(
    queue: EDFQueue,
    *,
    now_ns: int,
    max_rows: int,
    max_delay_ns: int,
    estimate: Estimate | None,
    bucket_of: list[int],
    answer_ns: int = 0,
    wake_slack_ns: int = 0,
    preferred: tuple[int, ...] = (),
    bare: Estimate | None = None,
    window_estimate: Estimate | None = None,
    max_bytes: int = 0,
) -> Run | Wait | None:
    """The next batch for a free instance: the head and the requests after it, in queue order,
    while they share its shape, fit `max_rows`, and (with an `estimate`) the batch still finishes
    before the earliest due time in it. Waits for more requests only while the batch could grow,
    its oldest request has waited less than `max_delay_ns`, and the slack allows it.

    The answers of a finished batch are settled one after another in this order, `answer_ns`
    per request: a request's own answer leaves after those of the requests before it, so its
    due time counts as that much earlier.

    A wait bounded by a due time ends `wake_slack_ns` early: how late the caller's wake-up may
    come (a loop's timers: about a millisecond). `Wait.due_bound` says which waits these are:
    only they end earlier when the slack grows.

    `bare`: a batch's predicted run without margins (the profile's own prediction). Requests
    whose batch waited by this policy's choice (`QueuedRequest.held`) join one another while
    the batch still finishes in time on it: a wake-up that came late, or margins grown while
    they waited, do not split them into batches of one that run one after another.

    `window_estimate`, FIFO (no `estimate`): what a batch needs before its due time (its run
    and margins); a due time in the batch ends its wait that long (and `wake_slack_ns`) before
    it, as `max_queue_delay_us` promises, where it held the request past its due time (FIFO
    still never fails a request for its due time before that has passed, as Triton).

    `preferred` batch sizes (Triton's `preferred_batch_size`, FIFO mode): a batch grows to the
    largest of them at most, and one that reached any of them when the queue has no more to add
    starts at once, without waiting out the window (the batch is cut back to the largest size
    reached that is preferred).

    `max_rows` 0 means the model does not batch: one request per execution, no padding.

    `max_bytes` (0: none): the most input bytes (`QueuedRequest.nbytes`) a batch of several
    requests takes; a request alone may bring more.
    """
    taken: list[QueuedRequest] = []
    rows, earliest_due, scanned, exhausted = 0, NO_DUE, 0, True
    nbytes = 0
    all_held = bare is not None  # (every request taken so far waited by this policy's choice)
    limit = min(max_rows, max(preferred)) if preferred and max_rows else max_rows
    best = 0  # how many of `taken` make the largest preferred batch reached so far
    best_scanned = 0
    for index in range(len(queue)):
        item = queue[index]
        if item.future.done():
            continue
        if taken and item.level >= SHADOW_LEVEL > taken[0].level:
            break  # (shadow copies never join real requests: they would lengthen their run)
        if taken and not _joins(taken[0], item, rows, limit):
            exhausted = False
            break
        if max_bytes and taken and nbytes + item.nbytes > max_bytes:
            exhausted = False
            break
        due = min(earliest_due, item.due_or_never - (len(taken) + 1) * answer_ns)
        if taken and estimate is not None:
            need = bare if all_held and item.held and bare is not None else estimate
            if now_ns + need(rows + item.rows) > due:
                exhausted = False
                break
        taken.append(item)
        nbytes += item.nbytes
        all_held = all_held and item.held
        rows, earliest_due, scanned = rows + item.rows, due, index + 1
        if rows in preferred:
            best, best_scanned = len(taken), scanned
    if not taken:
        return None
    if max_rows == 0:
        return Run(scanned, taken, rows, 0)
    if best and exhausted and rows < limit:  # no more to add: the preferred batch goes now
        taken = taken[:best]
        rows = sum(item.rows for item in taken)
        return Run(best_scanned, taken, rows, bucket_of[rows])
    # NOTE: a full queue refuses the very requests the batch would wait for.
    can_grow = exhausted and len(taken) < queue.capacity
    until = _wait_until(taken, rows, earliest_due, limit, max_delay_ns, estimate, bucket_of)
    cut = estimate if estimate is not None else window_estimate
    if until is not None and cut is not None and earliest_due != NO_DUE:
        until = min(until, earliest_due - cut(bucket_of[rows]) - wake_slack_ns)
    if can_grow and until is not None and until > now_ns:
        window_end = min(item.arrival_ns for item in taken) + max_delay_ns
        return Wait(until, tuple(taken), due_bound=until < window_end)
    return Run(scanned, taken, rows, bucket_of[rows])


def _joins(head: QueuedRequest, item: QueuedRequest, rows: int, max_rows: int) -> bool:
    return max_rows > 0 and item.shape_key == head.shape_key and rows + item.rows <= max_rows


def _wait_until(
    taken: list[QueuedRequest],
    rows: int,
    earliest_due: int,
    max_rows: int,
    max_delay_ns: int,
    estimate: Estimate | None,
    bucket_of: list[int],
) -> int | None:
    if max_delay_ns <= 0 or rows >= max_rows:
        return None
    until = min(item.arrival_ns for item in taken) + max_delay_ns
    if estimate is not None and earliest_due != NO_DUE:
        # NOTE: wait only as long as a batch one bucket bigger would still be on time.
        bigger = bucket_of[min(max_rows, bucket_of[rows] + 1)]
        until = min(until, earliest_due - estimate(bigger))
    return until
