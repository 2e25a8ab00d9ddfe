"""BatchPolicy: drop_hopeless and plan_batch, driven with plain ints for the time."""

from __future__ import annotations

import pytest
from factories import OTHER_SHAPE, buckets_up_to, enqueue, linear_estimate, names
from hypothesis import given
from hypothesis import strategies as st

from duetime.scheduling.batching import Run, Wait, drop_hopeless, plan_batch, sweep_hopeless
from duetime.scheduling.edf import EDFQueue
from duetime.scheduling.scheduler import batch_bytes_bound

BUCKET_OF = buckets_up_to(8, (1, 2, 3, 4, 6, 8))
# 1 row: 1100 ns, 2: 1200, 3: 1300, 4: 1400, 5-6: 1600, 7-8: 1800
ESTIMATE = linear_estimate(1000, 100, BUCKET_OF)


def plan(queue: EDFQueue, now: int = 0, **overrides: object) -> Run | Wait | None:
    options: dict[str, object] = {
        "max_rows": 8,
        "max_delay_ns": 0,
        "estimate": ESTIMATE,
        "bucket_of": BUCKET_OF,
    }
    options.update(overrides)
    return plan_batch(queue, now_ns=now, **options)  # type: ignore[arg-type]


def run_of(decision: Run | Wait | None) -> Run:
    assert isinstance(decision, Run), decision
    return decision


# -- drop_hopeless -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dues", "dropped", "kept"),
    [
        # now 1000, a 1-row run takes 1100: due 2100 is just in time
        ([2099, 2100, 1500], ["r2", "r0"], ["r1"]),
        ([1000, 2000, 2099, 5000], ["r0", "r1", "r2"], ["r3"]),
        ([None, 0], ["r1"], ["r0"]),  # the no-due request sorts last and is never hopeless
        ([3000, 0], ["r1"], ["r0"]),
    ],
)
def test_edf_drops_head_requests_that_would_finish_late(
    dues: list[int | None], dropped: list[str], kept: list[str]
) -> None:
    queue = EDFQueue(8)
    for i, due in enumerate(dues):
        enqueue(queue, name=f"r{i}", due=due)
    assert names(drop_hopeless(queue, now_ns=1000, estimate=ESTIMATE)) == dropped
    assert sorted(names(queue.drain())) == sorted(kept)


def test_edf_hopelessness_uses_the_requests_own_rows() -> None:
    queue = EDFQueue(8)
    enqueue(queue, name="big", rows=8, due=2500)  # 1800 ns from 1000: late
    enqueue(queue, name="small", rows=1, due=2500)  # 1100 ns: in time
    assert names(drop_hopeless(queue, now_ns=1000, estimate=ESTIMATE)) == ["big"]
    assert names(queue.drain()) == ["small"]


def test_drop_stops_at_the_first_request_that_can_make_it() -> None:
    queue = EDFQueue(8)
    enqueue(queue, name="ok", level=1, due=10_000)
    enqueue(queue, name="late", level=2, due=0)  # behind a live head: left for later
    assert drop_hopeless(queue, now_ns=1000, estimate=ESTIMATE) == []
    assert len(queue) == 2


@pytest.mark.parametrize(
    ("dues", "dropped"),
    [
        ([999, 1000, 1001], ["r0", "r1"]),  # due at or before now has passed
        ([1001, 500], []),  # FIFO: a live head shields what is behind it
        ([None, 0], []),
    ],
)
def test_fifo_drops_only_requests_whose_due_has_passed(
    dues: list[int | None], dropped: list[str]
) -> None:
    queue = EDFQueue(8, "fifo")
    for i, due in enumerate(dues):
        enqueue(queue, name=f"r{i}", due=due)
    assert names(drop_hopeless(queue, now_ns=1000, estimate=None)) == dropped
    assert len(queue) == len(dues) - len(dropped)


def test_settled_requests_are_discarded_silently() -> None:
    queue = EDFQueue(8)
    cancelled = enqueue(queue, name="cancelled", due=0)
    enqueue(queue, name="late", due=1500)
    enqueue(queue, name="ok", due=5000)
    cancelled.future.cancel()  # type: ignore[attr-defined]
    assert names(drop_hopeless(queue, now_ns=1000, estimate=ESTIMATE)) == ["late"]
    assert names(queue.drain()) == ["ok"]


def test_drop_on_an_empty_queue() -> None:
    assert drop_hopeless(EDFQueue(1), now_ns=0, estimate=ESTIMATE) == []


# -- plan_batch: what goes in the batch ----------------------------------------------------------


def test_nothing_to_plan() -> None:
    queue = EDFQueue(4)
    assert plan(queue) is None
    enqueue(queue).future.cancel()  # type: ignore[attr-defined]
    assert plan(queue) is None


def test_takes_the_head_and_the_requests_after_it_in_queue_order() -> None:
    queue = EDFQueue(8)
    for i, due in enumerate([30_000, 10_000, 20_000]):
        enqueue(queue, name=f"r{i}", due=due, rows=2)
    run = run_of(plan(queue))
    assert names(run.requests) == ["r1", "r2", "r0"]
    assert (run.taken, run.rows, run.bucket) == (3, 6, 6)


def test_stops_at_a_different_shape() -> None:
    queue = EDFQueue(8)
    enqueue(queue, name="a", due=1)
    enqueue(queue, name="b", due=2)
    enqueue(queue, name="other", due=3, shape=OTHER_SHAPE)
    enqueue(queue, name="c", due=4)
    # the queue was not exhausted, so the batch does not wait even with a delay allowed
    run = run_of(plan(queue, estimate=None, max_delay_ns=10_000))
    assert names(run.requests) == ["a", "b"]
    assert run.taken == 2


@pytest.mark.parametrize(
    ("rows", "expected_rows"),
    [
        ([3, 3, 3], 6),
        ([8, 1], 8),
        ([5, 4], 5),
        ([1, 1, 1, 1, 1, 1, 1, 1, 1], 8),
        ([2, 7, 1], 2),  # stops at the first request that does not fit
    ],
)
def test_rows_stay_within_max_rows(rows: list[int], expected_rows: int) -> None:
    queue = EDFQueue(16)
    for i, count in enumerate(rows):
        enqueue(queue, rows=count, due=i)
    run = run_of(plan(queue, estimate=None))
    assert run.rows == expected_rows
    assert run.bucket == BUCKET_OF[expected_rows]


def test_stops_before_the_batch_would_finish_after_its_earliest_due() -> None:
    queue = EDFQueue(8)
    # at now=0: 1 row ends at 1100, 2 at 1200, 3 at 1300, 4 at 1400
    enqueue(queue, name="a", due=1250)
    enqueue(queue, name="b", due=9000)
    enqueue(queue, name="c", due=9000)
    run = run_of(plan(queue, max_delay_ns=50_000))
    assert names(run.requests) == ["a", "b"], "a third row would end at 1300 > 1250"
    # without an estimate (FIFO) due times do not limit the batch
    assert run_of(plan(queue, estimate=None)).rows == 3


def test_each_request_waits_for_the_answers_settled_before_its_own() -> None:
    queue = EDFQueue(8)
    # at now=0: 3 rows end at 1300; answers then leave 100 ns a request, in queue order
    enqueue(queue, name="a", due=1400)  # its answer at 1400: in time
    enqueue(queue, name="b", due=1500)  # at 1500: in time
    enqueue(queue, name="c", due=1550)  # at 1600 (1300 + 3 rows): late
    enqueue(queue, name="d", due=9000)
    run = run_of(plan(queue, answer_ns=100))
    assert names(run.requests) == ["a", "b"]
    assert names(run_of(plan(queue)).requests) == ["a", "b", "c", "d"], "answers free: 4 rows fit"


def test_answers_count_per_request_not_per_row() -> None:
    queue = EDFQueue(8)
    # 4 rows end at 1400; "burst" (3 rows, one answer) at 1500, "next" at 1600
    enqueue(queue, name="burst", rows=3, due=1500)
    enqueue(queue, name="next", due=1600)
    assert names(run_of(plan(queue, answer_ns=100)).requests) == ["burst", "next"]


def test_a_later_request_with_an_earlier_due_limits_the_batch() -> None:
    queue = EDFQueue(8)
    enqueue(queue, name="head", level=1, due=None)
    enqueue(queue, name="tight", level=2, due=1150)
    enqueue(queue, name="rest", level=2, due=None)
    run = run_of(plan(queue))
    assert names(run.requests) == ["head"], "with 'tight' the batch would end at 1200 > 1150"


def test_settled_requests_inside_the_batch_are_skipped_but_consumed() -> None:
    queue = EDFQueue(8)
    enqueue(queue, name="a", due=10_000)
    enqueue(queue, name="gone", due=20_000).future.cancel()  # type: ignore[attr-defined]
    enqueue(queue, name="b", due=30_000)
    run = run_of(plan(queue))
    assert names(run.requests) == ["a", "b"]
    assert (run.taken, run.rows) == (3, 2)


def test_a_settled_head_is_skipped() -> None:
    queue = EDFQueue(8)
    enqueue(queue, name="gone", due=10_000).future.cancel()  # type: ignore[attr-defined]
    enqueue(queue, name="a", due=20_000, shape=OTHER_SHAPE)
    run = run_of(plan(queue))
    assert names(run.requests) == ["a"]
    assert run.taken == 2


@pytest.mark.parametrize("max_delay_ns", [0, 10_000])
def test_max_rows_zero_runs_one_request_unpadded(max_delay_ns: int) -> None:
    queue = EDFQueue(8)
    enqueue(queue, name="a", due=10_000)
    enqueue(queue, name="b", due=20_000)
    run = run_of(plan(queue, max_rows=0, max_delay_ns=max_delay_ns))
    assert names(run.requests) == ["a"]
    assert (run.taken, run.rows, run.bucket) == (1, 1, 0)


# -- plan_batch: when to wait ---------------------------------------------------------------------


def test_waits_while_the_oldest_request_is_younger_than_max_delay() -> None:
    queue = EDFQueue(8)
    enqueue(queue, arrival=1000)
    enqueue(queue, arrival=3000)
    assert plan(queue, now=3000, estimate=None, max_delay_ns=5000) == Wait(6000)
    assert plan(queue, now=5999, estimate=None, max_delay_ns=5000) == Wait(6000)
    assert run_of(plan(queue, now=6000, estimate=None, max_delay_ns=5000)).rows == 2


def test_a_preferred_batch_size_reached_starts_at_once_as_triton_s() -> None:
    """FIFO mode with `preferred_batch_size` [2, 4]: two requests make a preferred batch and go
    without waiting out the window; three go as the preferred two, the third waits; the batch
    never grows past the largest preferred size."""
    fifo = {"estimate": None, "max_delay_ns": 300_000, "preferred": (2, 4)}
    queue = EDFQueue(16, "fifo")
    enqueue(queue, name="a")
    assert plan(queue, now=1000, **fifo) == Wait(300_000), "one request: no preferred size yet"
    enqueue(queue, name="b")
    assert names(run_of(plan(queue, now=1000, **fifo)).requests) == ["a", "b"]
    enqueue(queue, name="c")
    run = run_of(plan(queue, now=1000, **fifo))
    assert (names(run.requests), run.taken) == (["a", "b"], 2)
    for name in "defgh":
        enqueue(queue, name=name)
    assert names(run_of(plan(queue, now=1000, **fifo)).requests) == ["a", "b", "c", "d"]


def test_never_waits_when_max_delay_is_zero() -> None:
    queue = EDFQueue(8)
    enqueue(queue, arrival=1000)
    assert run_of(plan(queue, now=1000, max_delay_ns=0)).rows == 1


def test_does_not_wait_once_the_batch_is_full() -> None:
    queue = EDFQueue(8)
    enqueue(queue, rows=4)
    enqueue(queue, rows=4)
    assert run_of(plan(queue, max_delay_ns=10_000)).rows == 8


def test_does_not_wait_when_the_queue_holds_more_than_the_batch() -> None:
    queue = EDFQueue(8)
    enqueue(queue, rows=5)
    enqueue(queue, rows=5)  # does not fit: the batch cannot grow by waiting
    assert run_of(plan(queue, max_delay_ns=10_000)).rows == 5


def test_does_not_wait_when_the_queue_is_full() -> None:
    queue = EDFQueue(2)
    enqueue(queue)
    enqueue(queue)
    # no further request can be queued, so the batch cannot grow by waiting
    assert run_of(plan(queue, max_delay_ns=10_000)).rows == 2


def test_waits_only_as_long_as_the_slack_allows() -> None:
    queue = EDFQueue(8)
    # 3 rows: bucket 3; one bucket bigger (4) takes 1400 ns, so it must start by 5000 - 1400
    for _ in range(3):
        enqueue(queue, due=5000)
    assert plan(queue, now=0, max_delay_ns=10_000) == Wait(3600)
    assert run_of(plan(queue, now=3600, max_delay_ns=10_000)).rows == 3
    # the delay bound still applies when it comes first
    assert plan(queue, now=0, max_delay_ns=2000) == Wait(2000)


def test_no_wait_when_there_is_no_slack() -> None:
    queue = EDFQueue(8)
    # a bigger batch (2 rows, 1200 ns) would have had to start by 100
    enqueue(queue, due=1300)
    assert run_of(plan(queue, now=200, max_delay_ns=10_000)).rows == 1


def test_requests_without_due_wait_for_the_delay_only() -> None:
    queue = EDFQueue(8)
    enqueue(queue, arrival=0)
    assert plan(queue, now=0, max_delay_ns=7000) == Wait(7000)


@given(
    st.lists(
        st.tuples(
            st.integers(1, 3),  # level
            st.one_of(st.none(), st.integers(0, 5_000)),  # due
            st.integers(1, 8),  # rows
            st.booleans(),  # cancelled
        ),
        max_size=60,
    ),
    st.integers(0, 3_000),
)
def test_sweep_finds_exactly_the_hopeless(
    entries: list[tuple[int, int | None, int, bool]], now: int
) -> None:
    """The sweep walks only what is due within the widest estimate, yet finds every hopeless
    request (and keeps the queue in order)."""
    queue = EDFQueue(1000)
    for index, (level, due, rows, cancelled) in enumerate(entries):
        item = enqueue(queue, level=level, due=due, rows=rows, name=str(index))
        if cancelled:
            item.future.cancel()  # type: ignore[attr-defined]

    def estimate(rows: int) -> int:
        return 100 + 50 * rows

    expected = [
        str(i) for i, (_, due, rows, cancelled) in enumerate(entries)
        if not cancelled and due is not None and now + estimate(rows) > due
    ]  # fmt: skip
    before = len(queue)
    hopeless = sweep_hopeless(queue, now_ns=now, estimate=estimate)
    assert sorted(names(hopeless)) == sorted(expected)
    left = [queue[i] for i in range(len(queue))]
    assert [i.key for i in left] == sorted(i.key for i in left)
    assert queue.rows == sum(i.rows for i in left)
    assert not set(map(id, hopeless)) & set(map(id, left))
    assert len(left) + len(hopeless) <= before


# -- a bound on a batch's input bytes ------------------------------------------------------------


def test_a_batch_takes_requests_while_their_bytes_fit_its_bound() -> None:
    """A model whose outputs are a fixed multiple of its inputs (a Tile by 32) batched ten
    requests of 16 MB into one run of 5 GB of outputs, and the server was killed for its
    memory (found by a tester)."""
    queue = EDFQueue(8)
    for i in range(4):
        enqueue(queue, name=f"r{i}", due=1_000_000).nbytes = 10
    assert names(run_of(plan(queue, max_bytes=25)).requests) == ["r0", "r1"]
    assert names(run_of(plan(queue)).requests) == ["r0", "r1", "r2", "r3"]  # (no bound)
    alone = EDFQueue(8)
    enqueue(alone, name="big", due=1_000_000).nbytes = 100
    enqueue(alone, name="next", due=1_000_000).nbytes = 1
    assert names(run_of(plan(alone, max_bytes=25)).requests) == ["big"]  # alone: any size


@pytest.mark.parametrize(
    ("row_in", "row_out", "max_rows", "varies", "bound"),
    [
        (160, 12, 64, False, 0),  # mlp: a full batch is 10 KB, far within
        (160, 12, 64, True, int(1_000_000 / (1 + 12 / 160))),  # sizes that follow the request
        (400, 400 * 32, 8, True, int(1_000_000 / 33)),  # a Tile by 32
        (400_000, 400_000 * 32, 8, False, int(1_000_000 / 33)),  # fixed, but a batch too big
        (160, None, 64, True, 1_000_000),  # no output sample: the inputs alone
        (160, 12, 1, True, 0),  # no batching
    ],
)
def test_the_bound_keeps_a_batch_s_inputs_and_outputs_within_a_run_s_memory(
    row_in: int, row_out: int | None, max_rows: int, varies: bool, bound: int
) -> None:
    assert batch_bytes_bound(1_000_000, row_in, row_out, max_rows, varies) == bound
