"""EDFQueue: order per policy, the capacity bound, settled requests, ahead_of, take and drain."""

from __future__ import annotations

import pytest
from factories import enqueue, make_request, names

from duetime.scheduling.edf import NO_DUE, EDFQueue

# (name, level, due) pushed in this order (so arrival order is the list order).
MIXED = [
    ("a", 2, 100),
    ("b", 1, 500),
    ("c", 1, None),
    ("d", 1, 200),
    ("e", 2, 50),
    ("f", 1, 200),
    ("g", 3, 10),
]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        # (level, due, arrival); no due sorts after every due within its level
        ("edf", ["d", "f", "b", "c", "e", "a", "g"]),
        # (level, arrival)
        ("fifo", ["b", "c", "d", "f", "a", "e", "g"]),
    ],
)
def test_service_order(policy: str, expected: list[str]) -> None:
    queue = EDFQueue(16, policy)  # type: ignore[arg-type]
    for name, level, due in MIXED:
        enqueue(queue, name=name, level=level, due=due)
    assert names([queue[i] for i in range(len(queue))]) == expected
    assert names(queue.drain()) == expected
    assert len(queue) == 0


def test_key_for_gives_a_fresh_sequence_number_each_time() -> None:
    queue = EDFQueue(4)
    first, second = queue.key_for(1, 100), queue.key_for(1, 100)
    assert first[:2] == second[:2] == (1, 100)
    assert first[2] < second[2]
    assert queue.key_for(2, None)[1] == NO_DUE
    assert EDFQueue(4, "fifo").key_for(1, 100)[1] == 0


def test_due_or_never() -> None:
    queue = EDFQueue(4)
    assert make_request(queue, due=7).due_or_never == 7
    assert make_request(queue).due_or_never == NO_DUE


def test_capacity_bounds_the_queue() -> None:
    queue = EDFQueue(2)
    enqueue(queue, rows=2, due=10)
    enqueue(queue, rows=3, due=20)
    refused = make_request(queue, rows=4, due=5)
    assert not queue.push(refused)
    assert len(queue) == 2
    assert queue.rows == 5


def test_full_queue_purges_settled_requests_to_make_room() -> None:
    queue = EDFQueue(3)
    kept = enqueue(queue, name="kept", rows=2, due=10)
    gone = enqueue(queue, name="gone", rows=3, due=20)
    also_gone = enqueue(queue, name="also", rows=1, due=30)
    gone.future.cancel()  # type: ignore[attr-defined]
    also_gone.future.cancel()  # type: ignore[attr-defined]
    assert queue.rows == 6, "settled requests count until they are dropped"
    assert queue.push(make_request(queue, name="new", rows=4, due=5))
    assert names(queue.drain()) == ["new", "kept"]
    assert kept.future.done() is False
    assert queue.withdrawn == 2  # (counted once, as they go)


def test_a_level_capacity_bounds_each_level_within_the_whole_capacity() -> None:
    queue = EDFQueue(5, level_capacity=2)
    for name, level in [("a", 1), ("b", 2), ("c", 1), ("d", 2)]:
        enqueue(queue, name=name, level=level)
    assert (queue.at_level(1), queue.at_level(2), queue.at_level(3)) == (2, 2, 0)
    assert [queue.full(level) for level in (1, 2, 3)] == [True, True, False]
    assert not queue.push(make_request(queue, name="e", level=2))
    enqueue(queue, name="f", level=3)
    assert queue.full(3), "the whole queue is full"
    assert names(queue.take(1)) == ["a"]
    enqueue(queue, name="g", level=1)
    assert names(queue.drain()) == ["c", "g", "b", "d", "f"]


def test_settled_requests_of_other_levels_make_no_room_in_a_full_level() -> None:
    queue = EDFQueue(8, level_capacity=1)
    enqueue(queue, name="kept", level=1)
    other = enqueue(queue, name="other", level=2)
    other.future.cancel()  # type: ignore[attr-defined]
    assert not queue.push(make_request(queue, name="refused", level=1))
    assert names(queue.drain()) == ["kept"], "purged all the same"


def test_settled_requests_are_not_purged_below_capacity() -> None:
    queue = EDFQueue(3)
    gone = enqueue(queue, name="gone", due=10)
    gone.future.cancel()  # type: ignore[attr-defined]
    enqueue(queue, name="new", due=20)
    assert queue.withdrawn == 0
    assert names(queue.drain()) == ["gone", "new"]
    assert queue.withdrawn == 1


@pytest.mark.parametrize(
    ("level", "due", "expected"),
    [
        (1, 5, 0),  # before everything
        (1, 10, 1),  # same key prefix as the first: the newcomer goes after it
        (1, 15, 1),
        (1, None, 2),  # no due: after every level-1 due
        (2, 0, 2),  # a lower level goes after all of level 1
        (3, 0, 3),
    ],
)
def test_ahead_of_counts_requests_served_first(level: int, due: int | None, expected: int) -> None:
    queue = EDFQueue(8)
    enqueue(queue, level=1, due=10)
    enqueue(queue, level=1, due=20)
    enqueue(queue, level=2, due=1)
    assert queue.ahead_of(queue.key_for(level, due)) == expected


def test_ahead_of_in_fifo_ignores_due_times() -> None:
    queue = EDFQueue(8, "fifo")
    enqueue(queue, level=1, due=50)
    enqueue(queue, level=2, due=10)
    assert queue.ahead_of(queue.key_for(1, 1)) == 1
    assert queue.ahead_of(queue.key_for(2, 1)) == 2


def test_take_removes_a_prefix_and_tracks_rows() -> None:
    queue = EDFQueue(8)
    for name, rows, due in [("a", 1, 10), ("b", 2, 20), ("c", 4, 30)]:
        enqueue(queue, name=name, rows=rows, due=due)
    assert queue.rows == 7
    assert names(queue.take(2)) == ["a", "b"]
    assert queue.rows == 4
    assert names(queue.take(5)) == ["c"], "taking more than queued takes what is there"
    assert queue.rows == 0
    assert queue.take(1) == []
    assert queue.drain() == []


def test_a_key_pushed_after_take_still_sorts() -> None:
    queue = EDFQueue(8)
    enqueue(queue, name="a", due=10)
    enqueue(queue, name="b", due=30)
    queue.take(1)
    enqueue(queue, name="c", due=20)
    assert names(queue.drain()) == ["c", "b"]
