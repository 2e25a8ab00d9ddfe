"""Late answers counted by what made them late: `late_cause` on a batch's plan and what
happened (pure), and the scheduler's counts of it (`late_by_cause`, a fake clock and executor)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from test_scheduler import ONE_ROW, US, harness, run

from duetime.execution.executor import BatchJob, BatchResult
from duetime.scheduling.scheduler import LATE_CAUSES, late_cause

MS = 1_000_000
PLAN = {"planned_start_ns": 0, "started_ns": 0, "waited_ns": 0, "predicted_ns": 1_200 * US,
        "overhead_ns": 200 * US, "compute_ns": 1_000 * US, "ended_ns": 1_200 * US}  # fmt: skip
"""A batch that went as planned: started on time, ran its predicted 1 ms, handed back in 200 µs."""


def test_a_batch_that_went_as_planned_was_planned_late() -> None:
    assert late_cause(**PLAN) == "plan"


def test_a_run_longer_than_its_prediction() -> None:
    assert late_cause(**{**PLAN, "compute_ns": 5 * MS, "ended_ns": 5_200 * US}) == "run"


def test_a_result_that_reached_the_loop_late() -> None:
    """The resnet case on the 2-core VM: run on time, result on the loop 2.6-6 ms after it."""
    assert late_cause(**{**PLAN, "ended_ns": 6 * MS}) == "delivery"


def test_a_batch_started_after_its_planned_start() -> None:
    late = {**PLAN, "started_ns": 3 * MS, "ended_ns": 4_200 * US}
    assert late_cause(**late) == "start"


def test_a_wait_for_a_turn_on_a_shared_cpu_is_a_late_start() -> None:
    assert late_cause(**{**PLAN, "waited_ns": 3 * MS, "ended_ns": 4_200 * US}) == "start"


times = st.integers(min_value=0, max_value=100 * MS)


@given(times, times, times, times, times, times, times)
def test_the_cause_is_the_part_that_overran_most(
    planned: int, started: int, waited: int, predicted: int, overhead: int, compute: int, end: int
) -> None:
    overhead = min(overhead, predicted)
    cause = late_cause(
        planned_start_ns=planned, started_ns=started, waited_ns=waited, predicted_ns=predicted,
        overhead_ns=overhead, compute_ns=compute, ended_ns=end,
    )  # fmt: skip
    overruns = {
        "start": started - planned + waited,
        "run": compute - (predicted - overhead),
        "delivery": end - started - waited - compute - overhead,
    }
    # (together they are how much later than planned the result came)
    assert sum(overruns.values()) == end - (planned + predicted)
    assert cause in LATE_CAUSES
    if cause == "plan":
        assert max(overruns.values()) <= 0
    else:
        assert overruns[cause] == max(overruns.values()) > 0


def test_the_scheduler_counts_late_answers_by_cause() -> None:
    async def body() -> None:
        h = harness()
        long_run = h.submit("long run", due_in=500 * US)  # predicted 100 µs
        h.clock.advance(ONE_ROW * 10)
        h.executor.complete(0, compute_ns=ONE_ROW * 10)
        await long_run
        slow_loop = h.submit("slow loop", due_in=500 * US)
        h.clock.advance(2 * MS)  # ran its 100 µs; the loop took its result 1.9 ms later
        h.executor.complete(1, compute_ns=ONE_ROW)
        await slow_loop
        on_time = h.submit("on time", due_in=500 * US)
        h.clock.advance(ONE_ROW)
        h.executor.complete(2, compute_ns=ONE_ROW)
        await on_time
        stats = h.scheduler.statistics()
        assert (stats.late, stats.on_time) == (2, 1)
        assert stats.late_by_cause == {"run": 1, "delivery": 1}

    run(body)


def test_a_late_answer_of_the_lean_inline_path_is_counted_by_cause() -> None:
    """`answer_alone`, the in-process Engine's usual call, keeps the books as a queued run."""

    async def body() -> None:
        h = harness(inline=True)
        run_now = h.executor.run_now

        def slow(instance: int, job: BatchJob) -> BatchResult:
            h.clock.advance(3 * ONE_ROW)  # predicted 100 µs
            result = run_now(instance, job)
            result.compute_ns = 3 * ONE_ROW
            return result

        h.executor.run_now = slow  # type: ignore[method-assign]
        feeds = {"name": np.array(["alone"])}
        answer = h.scheduler.answer_alone(feeds, 1, due_ns=h.clock.now_ns() + 150 * US)
        assert answer is not None, "run alone"
        assert not isinstance(answer, Exception), "admitted and answered"
        stats = h.scheduler.statistics()
        assert (stats.late, stats.late_by_cause) == (1, {"run": 1})

    run(body)
