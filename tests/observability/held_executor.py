"""A test double for the observability tests: an executor that keeps each job until the test
finishes it. Imported as `from held_executor import HeldExecutor` (pytest puts this folder on
`sys.path`; there is no `__init__.py` under tests/)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from duetime.errors import DuetimeError
from duetime.execution.executor import BatchJob, BatchResult, Feeds

US = 1_000


@dataclass
class HeldExecutor:
    """Keeps each job until the test finishes it, with the outputs (or errors) it chooses."""

    instances: int = 1
    inline: bool = False
    jobs: list[tuple[int, BatchJob]] = field(default_factory=list)

    def submit(self, instance: int, job: BatchJob) -> None:
        self.jobs.append((instance, job))

    def terminate(self, instance: int, job: BatchJob) -> bool:
        """A held job is never stopped: the test finishes it."""
        return False

    def finish(
        self,
        index: int,
        *,
        compute_ns: int = 100 * US,
        outputs: Sequence[Feeds | DuetimeError] | None = None,
        input_ns: int = 0,
        output_ns: int = 0,
        alone: list[tuple[int, int] | None] | None = None,
    ) -> None:
        """Finish the `index`-th submitted job; by default each request gets `{"y": zeros}`."""
        instance, job = self.jobs[index]
        if outputs is None:
            outputs = [{"y": np.zeros(rows)} for rows in job.rows]
        result = BatchResult(job, instance, outputs=list(outputs), compute_ns=compute_ns)
        if input_ns or output_ns:
            result.input_ns, result.output_ns = input_ns, output_ns
        result.alone = alone
        job.on_done(result)
