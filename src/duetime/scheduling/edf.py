"""EDFQueue: a bounded queue of requests kept sorted, earliest due first within a priority level;
pure (no I/O; the clock it may be given times only the requests their clients withdrew).

A sorted list rather than a heap: the batch former reads a prefix in order without popping, and
admission asks how many requests are ahead of a new one (a bisect). Capacities are small
(`max_queue_size`), so the list's O(n) insert is a short memmove.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

NO_DUE = 1 << 62
"""Sort key for requests without a due time: after every real one."""
SHADOW_LEVEL = 1 << 64
"""Priority level of shadow copies (`ModelScheduler.submit_shadow`): behind every real request,
whatever priority it asks for (Triton's priority is a uint64); there they give up their place to
a real request that finds the queue full (`EDFQueue.yielding_level`)."""

Key = tuple[int, int, int]


class Completion(Protocol):
    """What the queue needs of a request's future: whether it is already settled."""

    def done(self) -> bool: ...


@dataclass(slots=True, eq=False)
class QueuedRequest:
    """A validated request waiting for an instance."""

    feeds: dict[str, np.ndarray]
    rows: int
    """Rows along the batch dim (1 for a model that does not batch)."""
    shape_key: tuple[Any, ...]
    """Requests batch together only when their keys (non-batch dims, dtypes) are equal."""
    arrival_ns: int
    due_ns: int | None
    level: int
    """Priority level: 1 is served first."""
    future: Completion
    key: Key = field(default=(0, 0, 0))
    on_done: Callable[[], None] | None = None
    """Called right after the future is settled, on the loop: a front end writes its answer
    without waiting a loop turn for the future's callbacks."""
    timing: Any = None
    """The request's `RequestTiming` while it is traced (None otherwise)."""
    fallback: Callable[[QueuedRequest, int], bool] | None = None
    """Offers the request, once its scheduler can no longer answer it in time, to a cheaper
    variant of its model version that still can (True: one took it, with its future); given
    with a due time, where the version has a cheaper variant its inputs suit (None: it fails)."""
    held: bool = False
    """Its batch waited for more requests by the batch former's choice (`batching.Wait`, or an
    inline model's wait for the loop's turn): the time that took is not held against it (see
    `batching.is_hopeless`)."""
    nbytes: int = 0
    """Its inputs' bytes, where its scheduler bounds a batch's (see `plan_batch`'s
    `max_bytes`); else 0."""

    @property
    def due_or_never(self) -> int:
        return NO_DUE if self.due_ns is None else self.due_ns


class EDFQueue:
    """Bounded queue of QueuedRequest in service order.

    `edf` orders by (level, due, arrival); `fifo` by (level, arrival). Requests whose future is
    settled (their client went away) are skipped when read and dropped when the queue is full.
    """

    def __init__(
        self,
        capacity: int,
        policy: Literal["edf", "fifo"] = "edf",
        now_ns: Callable[[], int] | None = None,
        level_capacity: int = 0,
        yielding_level: int | None = None,
        on_displaced: Callable[[QueuedRequest], None] | None = None,
    ) -> None:
        """`now_ns`: the scheduler's clock, for `withdrawn_ns` (None: that stays 0).
        `level_capacity`: the most requests one priority level may queue, within `capacity`
        (0: no bound of its own). `yielding_level`: requests at this level or beyond (shadow
        copies) give up their place to a request of a level before it that finds the whole
        queue full: the last of them leaves the queue, handed to `on_displaced` (which settles
        it), and the newcomer takes the room (None: no level yields)."""
        self.capacity = capacity
        self.level_capacity = level_capacity
        self.yielding_level = yielding_level
        self._on_displaced = on_displaced
        self.policy = policy
        self._keys: list[Key] = []
        self._items: list[QueuedRequest] = []
        self._seq = 0
        self.rows = 0
        """Rows queued (settled requests included until they are dropped)."""
        self.widest = 0
        """The most rows of any request queued since the queue was last empty."""
        self.withdrawn = 0
        """Requests removed already settled: their client went away while they waited (each
        ends here, counted once, as the scheduler's other outcomes are)."""
        self.withdrawn_ns = 0
        """Their time from arrival to their removal (as Triton's scheduler times a cancelled
        request: until it finds it cancelled)."""
        self.outranked = False
        """A request was pushed ahead of one of a later priority level (set here; its reader,
        `ModelScheduler._sweep`, clears it: see `batching.sweep_outranked`)."""
        self._now_ns = now_ns

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: int) -> QueuedRequest:
        return self._items[index]

    def key_for(self, level: int, due_ns: int | None) -> Key:
        """The place a request of this level and due time would take (a fresh sequence number)."""
        self._seq += 1
        due = (NO_DUE if due_ns is None else due_ns) if self.policy == "edf" else 0
        return (level, due, self._seq)

    def ahead_of(self, key: Key) -> int:
        """How many queued requests would be served before one with `key`."""
        return bisect.bisect_left(self._keys, key)

    def at_level(self, level: int) -> int:
        """How many requests of priority `level` are queued (settled ones included)."""
        keys = self._keys
        return bisect.bisect_left(keys, (level + 1,)) - bisect.bisect_left(keys, (level,))

    def full(self, level: int) -> bool:
        """Whether a request of priority `level` would find no room (the whole queue's, or
        its level's)."""
        if len(self._items) >= self.capacity and not self._may_displace(level):
            return True
        return bool(self.level_capacity) and self.at_level(level) >= self.level_capacity

    def _may_displace(self, level: int) -> bool:
        """A request of `level` would take the place of the last one queued (see
        `yielding_level`)."""
        yielding = self.yielding_level
        return yielding is not None and level < yielding and self._keys[-1][0] >= yielding

    def push(self, item: QueuedRequest) -> bool:
        """Queue `item` at `item.key`; False (nothing queued) when the queue, or its level's
        part of it, is at capacity. A full queue ending in yielding requests (see
        `yielding_level`) drops its settled ones first, else its last one, to make room."""
        if self.full(item.level) and not (self._purge_settled() and not self.full(item.level)):
            return False
        if len(self._items) >= self.capacity and not (
            self._purge_settled() and len(self._items) < self.capacity
        ):
            displaced = self._items.pop()
            self._keys.pop()
            self.rows -= displaced.rows
            if self._on_displaced is not None:
                self._on_displaced(displaced)
        keys = self._keys
        index = bisect.bisect_left(keys, item.key)
        keys.insert(index, item.key)
        self._items.insert(index, item)
        self.rows += item.rows
        if item.rows > self.widest:
            self.widest = item.rows
        if keys[-1][0] > item.key[0]:
            self.outranked = True
        return True

    def restore(self, item: QueuedRequest) -> None:
        """Put back a request taken for a batch that did not run (its place is its key; the
        capacity does not apply: it was admitted already)."""
        index = bisect.bisect_left(self._keys, item.key)
        self._keys.insert(index, item.key)
        self._items.insert(index, item)
        self.rows += item.rows
        if item.rows > self.widest:
            self.widest = item.rows

    def take(self, count: int) -> list[QueuedRequest]:
        """Remove and return the first `count` requests."""
        taken = self._items[:count]
        del self._items[:count]
        del self._keys[:count]
        if len(taken) == 1:  # (the common case, without a generator's frame)
            self.rows -= taken[0].rows
            if taken[0].future.done():
                self._withdraw(taken)
        else:
            self.rows -= sum(item.rows for item in taken)
            self._withdraw(taken)
        if not self._items:
            self.widest = 0
        return taken

    def remove_where(self, doomed: Callable[[QueuedRequest], bool]) -> list[QueuedRequest]:
        """Remove and return every queued request for which `doomed` is true, in order."""
        flags = [doomed(item) for item in self._items]
        if not any(flags):
            return []
        removed = [item for item, flag in zip(self._items, flags, strict=True) if flag]
        self._items = [item for item, flag in zip(self._items, flags, strict=True) if not flag]
        self._keys = [key for key, flag in zip(self._keys, flags, strict=True) if not flag]
        self.rows = sum(item.rows for item in self._items)
        self._withdraw(removed)
        return removed

    def remove_due_by(
        self, horizon_ns: int, doomed: Callable[[QueuedRequest], bool]
    ) -> list[QueuedRequest]:
        """`remove_where`, asking `doomed` only about requests due by `horizon_ns`: in EDF order
        those are a prefix of each priority level, so a long queue costs a short walk. (FIFO
        order is not by due time: there every request is asked.)"""
        if self.policy != "edf":
            return self.remove_where(doomed)
        keys, items = self._keys, self._items
        flagged: list[int] = []
        index, count = 0, len(items)
        while index < count:
            level, due, _ = keys[index]
            if due > horizon_ns:
                index = bisect.bisect_left(keys, (level + 1,), index)
                continue
            if doomed(items[index]):
                flagged.append(index)
            index += 1
        if not flagged:
            return []
        removed = [items[i] for i in flagged]
        for i in reversed(flagged):
            del items[i]
            del keys[i]
        self.rows -= sum(item.rows for item in removed)
        self._withdraw(removed)
        if not items:
            self.widest = 0
        return removed

    @property
    def mixed(self) -> bool:
        """Whether it holds requests of more than one priority level."""
        keys = self._keys
        return bool(keys) and keys[0][0] != keys[-1][0]

    def level_end(self, index: int) -> int:
        """The index past the last request of the priority level of the one at `index`."""
        return bisect.bisect_left(self._keys, (self._keys[index][0] + 1,), index)

    def pop_at(self, index: int) -> QueuedRequest:
        """Remove and return the request at `index`."""
        item = self._items.pop(index)
        del self._keys[index]
        self.rows -= item.rows
        if item.future.done():
            self._withdraw([item])
        if not self._items:
            self.widest = 0
        return item

    def settled_waiting(self, now_ns: int) -> tuple[int, int]:
        """Requests still queued that are settled already (withdrawn by their clients, not yet
        dropped), and their time from arrival to `now_ns`: O(queue), for statistics."""
        count = waited = 0
        for item in list(self._items):
            if item.future.done():
                count += 1
                waited += now_ns - item.arrival_ns
        return count, waited

    def drain(self) -> list[QueuedRequest]:
        """Remove and return everything queued, in order."""
        return self.take(len(self._items))

    def _withdraw(self, removed: list[QueuedRequest]) -> None:
        """Count the settled requests of `removed` (all just taken off the queue) as withdrawn."""
        now = None
        for item in removed:
            if item.future.done():
                self.withdrawn += 1
                if self._now_ns is not None:
                    if now is None:
                        now = self._now_ns()
                    self.withdrawn_ns += now - item.arrival_ns

    def _purge_settled(self) -> bool:
        live = [i for i, item in enumerate(self._items) if not item.future.done()]
        if len(live) == len(self._items):
            return False
        self._withdraw(self._items)
        self._items = [self._items[i] for i in live]
        self._keys = [self._keys[i] for i in live]
        self.rows = sum(item.rows for item in self._items)
        return True
