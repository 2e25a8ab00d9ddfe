"""ModelScheduler: drives the pure queue and batch policy on the event loop, one per model version.

It owns the request queue and the record of idle instances. Work happens on three events only: a
request arrives (`submit_nowait`), an instance finishes a batch, or the batching window closes. No
task per request, no lock: every method runs on the loop that created the scheduler.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from duetime.clock import Clock
from duetime.config import SchedulingConfig
from duetime.errors import DeadlineExceeded, DuetimeError, ModelUnavailable, Overloaded
from duetime.execution.executor import BatchJob, BatchResult, Executor, Feeds
from duetime.scheduling.batching import Batch, should_wait, take_batch
from duetime.scheduling.edf import EDFQueue, QueuedRequest


@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    """A snapshot of one scheduler's counters (durations in ns)."""

    queued: int
    peak_queued: int
    busy_instances: int
    instances: int
    succeeded: int
    failed: int
    rejected: int
    expired: int
    executions: int
    inferences: int
    queue_ns: int
    compute_ns: int
    batch_sizes: dict[int, int] = field(default_factory=dict)
    """Executions per batch size (rows)."""


class ModelScheduler:
    """Queue, batch and dispatch the requests of one model version to its instances."""

    def __init__(
        self,
        *,
        executor: Executor,
        config: SchedulingConfig,
        max_batch_size: int,
        default_timeout_ns: int | None,
        clock: Clock,
        label: str,
    ) -> None:
        self._executor = executor
        self._queue = EDFQueue(config.max_queue_size, config.policy)
        self._max_rows = max_batch_size
        self._max_delay_ns = config.max_queue_delay_us * 1000
        self._default_timeout_ns = default_timeout_ns
        self._clock = clock
        self._label = label
        self._loop = asyncio.get_running_loop()
        self._idle = list(range(executor.instances))
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._drained = asyncio.Event()
        self._drained.set()
        self._counts: Counter[str] = Counter()
        self._batch_sizes: Counter[int] = Counter()
        self._peak = 0

    def submit_nowait(
        self,
        feeds: Feeds,
        *,
        rows: int,
        shape_key: tuple[Any, ...],
        due_ns: int | None,
        priority: int,
    ) -> asyncio.Future[Feeds]:
        """Queue one validated request; its future resolves to the model's outputs.

        Raises `Overloaded` when the queue is full, `DeadlineExceeded` when the due time has already
        passed, `ModelUnavailable` after `aclose`. Cancelling the future withdraws the request if
        it has not started.
        """
        now = self._clock.now_ns()
        if self._closed:
            raise ModelUnavailable(f"model {self._label} is shutting down; retry on another replica")
        if due_ns is None and self._default_timeout_ns is not None:
            due_ns = now + self._default_timeout_ns
        if due_ns is not None and due_ns <= now:
            self._counts["expired"] += 1
            raise DeadlineExceeded(
                f"model {self._label}: the request was due {(now - due_ns) / 1e3:.0f} µs ago "
                "when it arrived; send a larger timeout"
            )
        future: asyncio.Future[Feeds] = self._loop.create_future()
        item = QueuedRequest(feeds, rows, shape_key, now, due_ns, max(priority, 1), future)
        if not self._queue.push(item):
            self._counts["rejected"] += 1
            raise Overloaded(
                f"model {self._label}: queue full ({self._queue.capacity} requests waiting, "
                "scheduling.max_queue_size); retry later or raise the limit"
            )
        self._drained.clear()
        self._peak = max(self._peak, len(self._queue))
        self._dispatch()
        return future

    def statistics(self) -> SchedulerStatistics:
        c = self._counts
        return SchedulerStatistics(
            queued=len(self._queue),
            peak_queued=self._peak,
            busy_instances=self._executor.instances - len(self._idle),
            instances=self._executor.instances,
            succeeded=c["succeeded"],
            failed=c["failed"],
            rejected=c["rejected"],
            expired=c["expired"],
            executions=c["executions"],
            inferences=c["inferences"],
            queue_ns=c["queue_ns"],
            compute_ns=c["compute_ns"],
            batch_sizes=dict(self._batch_sizes),
        )

    async def aclose(self, grace_s: float) -> None:
        """Refuse new requests, let queued ones finish for up to `grace_s`, fail the rest."""
        self._closed = True
        try:
            await asyncio.wait_for(self._drained.wait(), grace_s)
        except TimeoutError:
            pass
        if self._timer is not None:
            self._timer.cancel()
        for item in self._queue.drain():
            _settle(item, ModelUnavailable(f"model {self._label} shut down before it ran"))

    def _dispatch(self) -> None:
        queue = self._queue
        while self._idle and len(queue):
            now = self._clock.now_ns()
            until = should_wait(
                queue, max_rows=self._max_rows, max_delay_ns=self._max_delay_ns, now_ns=now
            )
            if until is not None:
                self._arm_timer(until, now)
                return
            batch = take_batch(queue, max_rows=self._max_rows, now_ns=now)
            self._expire(batch, now)
            if batch.requests:
                self._start(batch, now)
        if not len(queue) and len(self._idle) == self._executor.instances:
            self._drained.set()

    def _arm_timer(self, until_ns: int, now_ns: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        delay_s = (until_ns - now_ns) / 1e9
        self._timer = self._loop.call_at(self._loop.time() + delay_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._dispatch()

    def _expire(self, batch: Batch, now: int) -> None:
        for item in batch.expired:
            self._counts["expired"] += 1
            late_us = (now - (item.due_ns or now)) / 1e3
            _settle(item, DeadlineExceeded(
                f"model {self._label}: due time passed {late_us:.0f} µs ago while queued; "
                "the request was not run"
            ))  # fmt: skip

    def _start(self, batch: Batch, now: int) -> None:
        instance = self._idle.pop()
        requests = batch.requests
        self._counts["queue_ns"] += sum(now - item.arrival_ns for item in requests)
        job = BatchJob(
            feeds=[item.feeds for item in requests],
            rows=[item.rows for item in requests],
            on_done=functools.partial(self._finish, requests),
        )
        self._executor.submit(instance, job)

    def _finish(self, requests: list[QueuedRequest], result: BatchResult) -> None:
        self._idle.append(result.instance)
        counts = self._counts
        counts["executions"] += 1
        counts["compute_ns"] += result.compute_ns
        rows = 0
        for item, outputs in zip(requests, result.outputs, strict=True):
            if isinstance(outputs, DuetimeError):
                counts["failed"] += 1
                _settle(item, outputs)
            else:
                counts["succeeded"] += 1
                rows += item.rows
                _settle(item, outputs)
        counts["inferences"] += rows
        self._batch_sizes[sum(item.rows for item in requests)] += 1
        self._dispatch()


def _settle(item: QueuedRequest, outcome: dict[str, np.ndarray] | DuetimeError) -> None:
    future: asyncio.Future[Feeds] = item.future  # type: ignore[assignment]
    if future.done():  # cancelled by its client while it ran
        return
    if isinstance(outcome, DuetimeError):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
