"""Properties of `sweep_outranked` over random queues: it removes only live requests with a due
time, of a later level, behind a live request of a higher one; and requests queued behind a
request never change what becomes of it (testers found its first version counting them ahead).

NOTE: fewer requests ahead (one withdrawn) or one more instance do not always remove fewer: a
request ahead that could not make its due time takes no time, and once it can, it runs first
(a higher level's) and pushes the rest back. Checked by hand for the examples found.
"""

from __future__ import annotations

from factories import FakeFuture, enqueue, names
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.scheduling.batching import sweep_outranked
from duetime.scheduling.edf import EDFQueue

MS = 1_000_000
EXAMPLES = settings(max_examples=300, deadline=None)

REQUESTS = st.lists(
    st.tuples(
        st.integers(1, 4),  # level
        st.integers(1, 8),  # rows
        st.none() | st.integers(0, 40),  # due, ms
        st.booleans(),  # withdrawn
    ),
    max_size=14,
)
FREE = st.lists(st.integers(0, 5), min_size=1, max_size=3)  # when each instance frees up, ms


def queue_of(requests: list[tuple[int, int, int | None, bool]]) -> EDFQueue:
    queue = EDFQueue(100)
    for i, (level, rows, due, withdrawn) in enumerate(requests):
        item = enqueue(
            queue, name=f"r{i}", level=level, rows=rows, due=None if due is None else due * MS
        )
        if withdrawn:
            assert isinstance(item.future, FakeFuture)
            item.future.cancel()
    return queue


def removed(queue: EDFQueue, free: list[int]) -> set[str]:
    out = sweep_outranked(
        queue, free_ns=[f * MS for f in free], per_row_ns=MS / 4, bare=lambda rows: MS + rows * MS
    )
    return {names([item])[0] for item, _ in out}


@EXAMPLES
@given(REQUESTS, FREE)
def test_only_live_requests_with_a_due_time_behind_a_higher_level_are_removed(
    requests: list[tuple[int, int, int | None, bool]], free: list[int]
) -> None:
    queue = queue_of(requests)
    before = list(queue)
    gone = removed(queue, free)
    first_level = before[0].level if before else 0
    for item in before:
        if names([item])[0] in gone:
            assert item.level != first_level
            assert item.due_ns is not None
            assert not item.future.done()
            ahead = before[: before.index(item)]
            assert any(o.level < item.level and not o.future.done() for o in ahead)
    assert len(queue) == len(before) - len(gone)


@EXAMPLES
@given(REQUESTS, REQUESTS, FREE)
def test_requests_queued_behind_change_nothing_ahead_of_them(
    requests: list[tuple[int, int, int | None, bool]],
    later: list[tuple[int, int, int | None, bool]],
    free: list[int],
) -> None:
    """Requests of the last level and below, queued behind every request there, never make a
    request ahead of them removed."""
    if not requests:
        return
    last = max(level for level, *_ in requests)
    behind = [(last + level, rows, 10_000, withdrawn) for level, rows, _, withdrawn in later]
    alone = removed(queue_of(requests), free)
    together = removed(queue_of(requests + behind), free)
    assert {n for n in together if int(n[1:]) < len(requests)} == alone
