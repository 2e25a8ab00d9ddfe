"""While a closing scheduler drains (`ModelScheduler.aclose`), its runs past their due times
are still stopped and its waiting batches still swept, as before the close.

`_watch` returned at once once the scheduler was closed, and `_sweep` stopped arming itself
again: a run past its due time on the version a reload replaced (a Loop whose trip count came
from the input) ran on, its client unanswered, and the requests queued behind it waited for
the whole drain (`--unload-drain-secs`, 30 s) and then failed unrun."""

from __future__ import annotations

import asyncio

from test_scheduler import MS, failure, harness, run

from duetime.errors import DeadlineExceeded
from duetime.execution.executor import BatchResult
from duetime.scheduling.scheduler import STOP_GRACE_NS


def test_a_run_past_its_due_time_is_stopped_while_the_scheduler_drains() -> None:
    async def body() -> None:
        h = harness()
        runaway = h.submit("runaway", due_in=10 * MS)
        queued = h.submit("queued", due_in=60_000 * MS)
        closing = asyncio.create_task(h.scheduler.aclose(60))
        await asyncio.sleep(0)  # the swap: the old version drains
        h.clock.advance(10 * MS + STOP_GRACE_NS + MS)
        h.scheduler._watch()  # (its timer's callback)
        instance, job = h.executor.jobs[0]
        assert h.executor.terminated == [job], "the run past its due time is stopped"
        h.executor.finished.add(0)
        job.on_done(BatchResult(job, instance, terminated=True))
        assert isinstance(failure(runaway), DeadlineExceeded)
        assert h.started() == ["runaway", "queued"], "the request behind it runs at once"
        h.executor.complete(1)
        await closing
        assert failure(queued) is None

    run(body)


def test_the_sweeper_keeps_its_rounds_while_the_scheduler_drains() -> None:
    async def body() -> None:
        h = harness()
        h.submit("running")
        h.submit("queued", due_in=60_000 * MS)
        closing = asyncio.create_task(h.scheduler.aclose(60))
        await asyncio.sleep(0)
        h.scheduler._sweep()  # (its timer's callback)
        assert h.scheduler._sweeper is not None, "a round is armed while work waits"
        h.executor.complete(0)
        h.executor.complete(1)
        await closing
        assert h.scheduler._sweeper is None or h.scheduler._sweeper.cancelled()

    run(body)
