"""Test doubles for the scheduling tests: settle-able futures, request factories, a recording
executor and a small latency profile. No event loop, no model, no clock of their own.

Imported as `from factories import ...`: pytest puts this folder on `sys.path` (there is no
`__init__.py` under tests/).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from duetime.errors import DuetimeError
from duetime.execution.executor import BatchJob, BatchResult, Feeds
from duetime.scheduling.edf import EDFQueue, QueuedRequest
from duetime.scheduling.profile import LatencyProfile, profile_from_samples

SHAPE = ("float32", 4)
OTHER_SHAPE = ("float32", 8)


class FakeFuture:
    """The `Completion` a queued request needs: settled once cancelled (or resolved)."""

    __slots__ = ("_done",)

    def __init__(self) -> None:
        self._done = False

    def done(self) -> bool:
        return self._done

    def cancel(self) -> None:
        self._done = True


def make_request(
    queue: EDFQueue,
    *,
    rows: int = 1,
    shape: tuple[object, ...] = SHAPE,
    arrival: int = 0,
    due: int | None = None,
    level: int = 1,
    name: str = "",
) -> QueuedRequest:
    """A request keyed for `queue` (not pushed); `name` is kept in its feeds for assertions."""
    return QueuedRequest(
        feeds={name: np.zeros(0)} if name else {},
        rows=rows,
        shape_key=shape,
        arrival_ns=arrival,
        due_ns=due,
        level=level,
        future=FakeFuture(),
        key=queue.key_for(level, due),
    )


def enqueue(queue: EDFQueue, **kwargs: object) -> QueuedRequest:
    """Make a request and push it; fails the test if the queue refuses it."""
    item = make_request(queue, **kwargs)  # type: ignore[arg-type]
    assert queue.push(item), "queue unexpectedly full"
    return item


def names(items: Sequence[QueuedRequest]) -> list[str]:
    """The names given to `make_request`, in order."""
    return [next(iter(item.feeds)) for item in items]


def buckets_up_to(max_rows: int, buckets: Sequence[int]) -> list[int]:
    """`bucket_of` as LatencyProfile builds it: rows -> the smallest bucket >= rows."""
    return [0] + [next(b for b in buckets if b >= rows) for rows in range(1, max_rows + 1)]


def linear_estimate(
    base_ns: int, per_row_ns: int, bucket_of: Sequence[int]
) -> Callable[[int], int]:
    """A deterministic service-time model: a fixed cost plus a cost per padded row."""
    return lambda rows: base_ns + per_row_ns * bucket_of[rows]


def make_profile() -> LatencyProfile:
    """Buckets 1, 2, 3, 4 taking 100, 150, 200, 250 µs, with no spread (predict = median)."""
    return profile_from_samples(
        {1: [100_000] * 5, 2: [150_000] * 5, 3: [200_000] * 5, 4: [250_000] * 5}
    )


@dataclass
class FakeExecutor:
    """Records each submitted job; a test finishes one with `complete`, which calls its
    `on_done` as the real executor does on the loop. Fails the test if an instance is given more
    jobs than `depth` at once (1, or 2 for a model whose batches are long enough to pipeline)."""

    instances: int = 1
    depth: int = 1
    inline: bool = False
    """Run each job at once in `run_now` (as `execution = "inline"`), never through `submit`."""
    jobs: list[tuple[int, BatchJob]] = field(default_factory=list)
    finished: set[int] = field(default_factory=set)
    """Indexes into `jobs` already completed."""
    terminated: list[BatchJob] = field(default_factory=list)
    """Jobs the scheduler asked to stop (see `terminate`)."""

    def submit(self, instance: int, job: BatchJob) -> None:
        assert not self.inline, "an inline executor was given a job for a thread"
        queued = sum(
            1 for n, (i, _) in enumerate(self.jobs) if i == instance and n not in self.finished
        )
        assert queued < self.depth, f"instance {instance} was given a job beyond depth {self.depth}"
        self.jobs.append((instance, job))

    def run_now(self, instance: int, job: BatchJob) -> BatchResult:
        assert self.inline, "run_now on an executor that is not inline"
        self.jobs.append((instance, job))
        self.finished.add(len(self.jobs) - 1)
        outputs = [{"y": np.full(rows, float(rows))} for rows in job.rows]
        return BatchResult(job, instance, outputs=list(outputs), compute_ns=10_000)

    def terminate(self, instance: int, job: BatchJob) -> bool:
        """Record a stop asked for a job its thread runs (a test completes it)."""
        self.terminated.append(job)
        return True

    def busy(self) -> set[int]:
        return {i for n, (i, _) in enumerate(self.jobs) if n not in self.finished}

    def complete(
        self,
        index: int = 0,
        *,
        outputs: Sequence[Feeds | DuetimeError] | None = None,
        compute_ns: int = 100_000,
    ) -> None:
        """Finish the `index`-th submitted job; by default each request gets `{"y": ...}`, one
        value per row, each equal to its row count."""
        assert index not in self.finished, f"job {index} already completed"
        instance, job = self.jobs[index]
        if outputs is None:
            outputs = [{"y": np.full(rows, float(rows))} for rows in job.rows]
        self.finished.add(index)
        job.on_done(BatchResult(job, instance, outputs=list(outputs), compute_ns=compute_ns))
