"""BatchPolicy: which queued requests run together next, and which are already too late; pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from duetime.scheduling.edf import EDFQueue, QueuedRequest


@dataclass(slots=True)
class Batch:
    """The outcome of one decision: requests to run now, and requests past their due time."""

    requests: list[QueuedRequest] = field(default_factory=list)
    expired: list[QueuedRequest] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(item.rows for item in self.requests)


def should_wait(queue: EDFQueue, *, max_rows: int, max_delay_ns: int, now_ns: int) -> int | None:
    """When the batch former should look again instead of running a partial batch now.

    Returns the instant to wait until, or None to form a batch now: a batch waits only while it is
    not full and its oldest request has waited less than `max_delay_ns` (Triton's window).
    """
    head = queue.peek()
    if head is None or max_delay_ns <= 0 or queue.rows >= max_rows:
        return None
    until = head.arrival_ns + max_delay_ns
    if head.due_ns is not None:
        until = min(until, head.due_ns)
    return until if until > now_ns else None


def take_batch(queue: EDFQueue, *, max_rows: int, now_ns: int) -> Batch:
    """Take the head and the requests after it, in queue order, while they fit one execution.

    A request fits while its shape key equals the head's and the rows stay within `max_rows`
    (`max_rows` 0: the model does not batch, one request per execution). The first request that
    does not fit stays at the head for the next batch. Requests whose due time has passed are
    returned as `expired` instead of being run.
    """
    batch = Batch()
    while (item := queue.pop()) is not None:
        if item.due_ns is not None and item.due_ns <= now_ns:
            batch.expired.append(item)
            continue
        if batch.requests and not _fits(batch, item, max_rows):
            queue.push_back(item)
            break
        batch.requests.append(item)
        if max_rows == 0:
            break
    return batch


def _fits(batch: Batch, item: QueuedRequest, max_rows: int) -> bool:
    head = batch.requests[0]
    return (
        max_rows > 0 and item.shape_key == head.shape_key and batch.rows + item.rows <= max_rows
    )
