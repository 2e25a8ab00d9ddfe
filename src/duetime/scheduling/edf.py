"""EDFQueue: a bounded heap of queued requests, earliest due first within a priority level; pure."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

NO_DUE = 1 << 62
"""Sort key for requests without a due time: after every real one."""


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
    seq: int = 0
    key: tuple[int, int, int] = field(default=(0, 0, 0))


class EDFQueue:
    """Bounded priority queue of QueuedRequest.

    `edf` orders by (level, due, arrival); `fifo` by (level, arrival). Requests whose future is
    already settled (cancelled by a client that went away) are dropped lazily when they reach the
    head, never searched for.
    """

    def __init__(self, capacity: int, policy: Literal["edf", "fifo"] = "edf") -> None:
        self.capacity = capacity
        self.policy = policy
        self._heap: list[tuple[tuple[int, int, int], QueuedRequest]] = []
        self._seq = 0
        self.rows = 0
        """Rows queued, settled requests included until they are dropped."""

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, item: QueuedRequest) -> bool:
        """Queue `item`; False (nothing queued) when the queue is at capacity."""
        if len(self._heap) >= self.capacity:
            return False
        self._seq += 1
        item.seq = self._seq
        due = item.due_ns if item.due_ns is not None else NO_DUE
        item.key = (item.level, due if self.policy == "edf" else 0, self._seq)
        heapq.heappush(self._heap, (item.key, item))
        self.rows += item.rows
        return True

    def push_back(self, item: QueuedRequest) -> None:
        """Requeue an item taken by `pop` with its original place (capacity not checked)."""
        heapq.heappush(self._heap, (item.key, item))
        self.rows += item.rows

    def peek(self) -> QueuedRequest | None:
        """The head, after dropping settled requests in front of it."""
        heap = self._heap
        while heap and heap[0][1].future.done():
            self.rows -= heapq.heappop(heap)[1].rows
        return heap[0][1] if heap else None

    def pop(self) -> QueuedRequest | None:
        if self.peek() is None:
            return None
        item = heapq.heappop(self._heap)[1]
        self.rows -= item.rows
        return item

    def drain(self) -> list[QueuedRequest]:
        """Remove and return everything queued, in order."""
        items = [item for _, item in sorted(self._heap, key=lambda pair: pair[0])]
        self._heap.clear()
        self.rows = 0
        return items
