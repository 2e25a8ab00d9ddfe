"""Executor: instance threads run batches and hand results back to the loop (a stand-in session)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from duetime.errors import InvalidInput
from duetime.execution.executor import BatchJob, BatchResult, Executor, InputPool


class DoublingSession:
    """Like an ORT session of y = 2x that refuses negative inputs (as an index out of range)."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def run(self, names: Sequence[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = feeds["x"]
        self.batches.append(x.shape[0])
        if (x < 0).any():
            raise ValueError("index -1 is out of bounds")
        return [x * 2]


def run_job(
    session: DoublingSession,
    feeds: list[np.ndarray],
    bucket: int,
    *,
    inline: bool = False,
    start_by: tuple[Callable[[], int], int] | None = None,
    settled: Sequence[bool] = (),
) -> BatchResult:
    executor = Executor(
        [session], output_names=["y"], string_outputs=frozenset(), batched=True, label="t",
        inline=inline,
    )  # fmt: skip

    async def body() -> BatchResult:
        done: asyncio.Future[BatchResult] = asyncio.get_running_loop().create_future()
        executor.start(asyncio.get_running_loop())
        rows = [f.shape[0] for f in feeds]
        job = BatchJob([{"x": f} for f in feeds], rows, bucket, done.set_result)
        job.start_by = start_by
        if settled:
            job.futures = [Settled(done) for done in settled]
        if inline:
            return executor.run_now(0, job)
        executor.submit(0, job)
        return await done

    try:
        return asyncio.run(body())
    finally:
        executor.close()


def test_a_batch_is_padded_to_its_bucket_and_split_per_request() -> None:
    session = DoublingSession()
    a, b = np.ones((2, 3), np.float32), np.full((1, 3), 5, np.float32)
    result = run_job(session, [a, b], bucket=4)
    assert session.batches == [4]
    first, second = result.outputs
    assert isinstance(first, dict)
    assert isinstance(second, dict)
    np.testing.assert_array_equal(first["y"], a * 2)
    np.testing.assert_array_equal(second["y"], b * 2)


def test_a_thread_skips_a_job_it_takes_after_its_start_by_and_runs_one_in_time() -> None:
    session = DoublingSession()
    x = np.ones((1, 3), np.float32)
    late = run_job(session, [x], bucket=1, start_by=(lambda: 2_000, 1_000))
    assert late.skipped
    assert list(late.outputs) == []
    assert session.batches == [], "a skipped job never reaches the session"
    in_time = run_job(session, [x], bucket=1, start_by=(lambda: 1_000, 1_000))
    assert not in_time.skipped
    assert session.batches == [1]


class Settled:
    """A request's future, settled or not (its client withdrew it, say)."""

    def __init__(self, settled: bool) -> None:
        self.settled = settled

    def done(self) -> bool:
        return self.settled


class RecordingSession(DoublingSession):
    """A DoublingSession that keeps a copy of each batch it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[np.ndarray] = []

    def run(self, names: Sequence[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.ran.append(feeds["x"].copy())
        return super().run(names, feeds)


def test_a_job_whose_every_request_was_withdrawn_before_its_thread_took_it_is_not_run() -> None:
    """A lookahead batch waits behind the running one; its clients may go meanwhile (a
    cancelled 300-row run delayed the next request by 300-600 ms and counted an execution)."""
    session = DoublingSession()
    x = np.ones((3, 3), np.float32)
    result = run_job(session, [x, x], bucket=8, settled=[True, True])
    assert session.batches == [], "never reaches the session"
    assert result.skipped, "skipped: the loop counts no execution"
    assert result.withdrawn == 2
    assert list(result.outputs) == []


def test_a_job_runs_only_the_requests_still_waiting_and_gives_the_withdrawn_no_outputs() -> None:
    session = RecordingSession()
    gone, kept, also_gone = (np.full((2, 3), v, np.float32) for v in (1, 7, 3))
    result = run_job(session, [gone, kept, also_gone], bucket=8, settled=[True, False, True])
    assert not result.skipped
    assert result.withdrawn == 2
    (ran,) = session.ran
    assert ran.shape == (8, 3), "padded to the bucket planned, as before"
    assert (ran == 7).all(), "no row of a withdrawn request"
    first, second, third = result.outputs
    assert first == {}
    assert third == {}
    assert isinstance(second, dict)
    np.testing.assert_array_equal(second["y"], kept * 2)


def test_a_job_whose_requests_all_wait_runs_whole() -> None:
    session = DoublingSession()
    a, b = np.ones((1, 3), np.float32), np.full((2, 3), 5, np.float32)
    result = run_job(session, [a, b], bucket=4, settled=[False, False])
    assert session.batches == [4]
    assert result.withdrawn == 0
    first, second = result.outputs
    assert isinstance(first, dict)
    assert isinstance(second, dict)
    np.testing.assert_array_equal(second["y"], b * 2)


def test_a_request_that_breaks_the_batch_fails_alone() -> None:
    session = DoublingSession()
    good, bad = np.ones((2, 3), np.float32), np.full((1, 3), -1, np.float32)
    result = run_job(session, [good, bad], bucket=4)
    first, second = result.outputs
    assert isinstance(first, dict)
    np.testing.assert_array_equal(first["y"], good * 2)  # all its rows, none lost to padding
    assert isinstance(second, InvalidInput)
    assert "out of bounds" in second.message
    # each request's own run is timed apart, for the statistics (see BatchResult.alone)
    assert result.alone is not None
    assert [times is not None and times[0] > 0 for times in result.alone] == [True, True]
    assert sum(times[0] for times in result.alone if times) < result.compute_ns


def test_an_instance_thread_keeps_nothing_of_its_last_job_while_it_waits() -> None:
    """The last job's inputs and outputs stayed resident while its thread waited for the next
    (960 MB after a big answer, until the model's next request; found by a tester): the
    waiting thread's frame holds no job and no result."""
    executor = Executor(
        [DoublingSession()], output_names=["y"], string_outputs=frozenset(), batched=True,
        label="t",
    )  # fmt: skip

    async def body() -> None:
        done: asyncio.Future[BatchResult] = asyncio.get_running_loop().create_future()
        executor.start(asyncio.get_running_loop())
        executor.submit(0, BatchJob([{"x": np.ones((2, 3), np.float32)}], [2], 2, done.set_result))
        await done

    try:
        asyncio.run(body())
        deadline = time.monotonic() + 5
        lines, first = inspect.getsourcelines(Executor._serve)
        get_line = first + next(i for i, line in enumerate(lines) if "jobs.get()" in line)
        while True:  # (until the thread waits, in the C call SimpleQueue.get: its top frame)
            waiting = [
                frame
                for frame in sys._current_frames().values()
                if frame.f_code is Executor._serve.__code__ and frame.f_lineno == get_line
            ]
            held = [
                value
                for frame in waiting
                for value in frame.f_locals.values()
                if isinstance(value, BatchJob | BatchResult)
            ]
            found = bool(waiting)
            del waiting
            if found:
                assert not held, f"the waiting instance thread holds {held}"
                break
            assert time.monotonic() < deadline, "the instance thread never waited for a job"
            time.sleep(0.001)
    finally:
        executor.close()


def test_a_batch_that_ran_whole_has_no_runs_alone() -> None:
    assert run_job(DoublingSession(), [np.ones((2, 3), np.float32)] * 2, bucket=4).alone is None


def test_inline_runs_on_the_calling_thread_and_returns_the_result() -> None:
    session = DoublingSession()
    executor = Executor(
        [session], output_names=["y"], string_outputs=frozenset(), batched=True, label="t",
        inline=True,
    )  # fmt: skip
    loop = asyncio.new_event_loop()
    executor.start(loop)  # starts no thread
    loop.close()
    x = np.ones((1, 3), np.float32)
    result = executor.run_now(0, BatchJob([{"x": x}], [1], 1, lambda _: None))
    assert session.batches == [1]
    first = result.outputs[0]
    assert isinstance(first, dict)
    np.testing.assert_array_equal(first["y"], x * 2)
    assert result.compute_ns > 0
    executor.close()


def test_inline_isolates_a_failing_request_too() -> None:
    good, bad = np.ones((2, 3), np.float32), np.full((1, 3), -1, np.float32)
    first, second = run_job(DoublingSession(), [good, bad], bucket=4, inline=True).outputs
    assert isinstance(first, dict)
    assert isinstance(second, InvalidInput)


class StackingSession(DoublingSession):
    """Like an ORT session of y = Concat(x, x) on the first axis: 2N rows for N (`run_job` takes
    its session by type, so this one is a DoublingSession)."""

    def run(self, names: Sequence[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = feeds["x"]
        self.batches.append(x.shape[0])
        return [np.concatenate([x, x])]


def test_a_lone_request_gets_outputs_whose_first_dim_is_not_the_batch_whole() -> None:
    """A data-dependent output (Unique) need not have the rows run; a request that ran alone,
    unpadded, owns all of it (it failed with a 500 'has shape [2] for a batch of 3 rows')."""
    ones = np.ones((1, 3), np.float32)
    (outcome,) = run_job(StackingSession(), [ones], bucket=1).outputs
    assert isinstance(outcome, dict)
    np.testing.assert_array_equal(outcome["y"], np.ones((2, 3), np.float32))


def test_a_batch_whose_outputs_do_not_have_its_rows_runs_each_request_alone_from_then_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    session = StackingSession()
    executor = Executor(
        [session], output_names=["y"], string_outputs=frozenset(), batched=True, label="m-1",
        inline=True,
    )  # fmt: skip
    ones, fives = np.ones((1, 3), np.float32), np.full((1, 3), 5, np.float32)
    with caplog.at_level(logging.WARNING, logger="duetime.executor"):
        first, second = run_inline(executor, [ones, fives], bucket=2).outputs
        assert session.batches == [2, 1, 1], "the batch, then each request on its own"
        assert isinstance(first, dict)
        assert isinstance(second, dict)
        np.testing.assert_array_equal(first["y"], np.concatenate([ones, ones]))
        np.testing.assert_array_equal(second["y"], np.concatenate([fives, fives]))
        assert executor.splits_batches
        session.batches.clear()
        padded = run_inline(executor, [fives], bucket=2).outputs[0]
        run_inline(executor, [ones, fives], bucket=2)
    assert session.batches == [1, 1, 1], "no more batches, nor padding rows"
    assert isinstance(padded, dict)
    np.testing.assert_array_equal(padded["y"], np.concatenate([fives, fives]))
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, "warned once per model"
    assert "model m-1: output 'y' has shape [4, 3] for a batch of 2 rows" in warnings[0]


class PositionsSession(DoublingSession):
    """Like an ORT session of y = Transpose(NonZero(x > 0)): one [row, column] for each positive
    entry, as many as there are (a value-sized output)."""

    def run(self, names: Sequence[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = feeds["x"]
        self.batches.append(x.shape[0])
        return [np.argwhere(x > 0)]


def test_a_model_known_to_have_a_value_sized_output_runs_each_request_at_its_rows() -> None:
    """A 5-row request padded to 6 rows with a copy of its last row got that row's entries too,
    whenever the padded run's count happened to be its 6 rows (so no misfit showed)."""
    session = PositionsSession()
    executor = Executor(
        [session], output_names=["y"], string_outputs=frozenset(), batched=True, label="m-1",
        inline=True, splits_batches=True,
    )  # fmt: skip
    x = np.array([[0, 0], [0, 0], [1, 0], [1, 0], [1, 1]], np.float32)
    other = np.array([[0, 1]], np.float32)
    (alone,) = run_inline(executor, [x], bucket=6).outputs
    both = run_inline(executor, [x, other], bucket=6).outputs
    assert session.batches == [5, 5, 1], "no padding rows, nor another request's"
    assert isinstance(alone, dict)
    assert alone["y"].tolist() == [[2, 0], [3, 0], [4, 0], [4, 1]]
    assert [part["y"].tolist() for part in both if isinstance(part, dict)] == [
        alone["y"].tolist(),
        [[0, 1]],
    ]
    executor.close()


def run_inline(executor: Executor, feeds: list[np.ndarray], bucket: int) -> BatchResult:
    job = BatchJob([{"x": f} for f in feeds], [f.shape[0] for f in feeds], bucket, lambda _: None)
    return executor.run_now(0, job)


def test_padding_rows_copy_the_batch_s_last_row_never_zeros_or_an_earlier_batch() -> None:
    """Rows padded up to the bucket must be inputs the model takes and must move no batch-wide
    statistic: zeros divided by, or big values an earlier batch left (a dynamically quantized
    model scales by the batch's largest value), changed or failed the real rows' answers."""
    pool = InputPool()
    big = np.full((6, 2), 1e6, np.float32)
    assert pool.gather([{"x": big[:3]}, {"x": big[3:]}], [3, 3], 6)["x"] is not big
    small = np.arange(10, dtype=np.float32).reshape(5, 2) + 1
    padded = pool.gather([{"x": small}], [5], 6)["x"]
    np.testing.assert_array_equal(padded[:5], small)
    np.testing.assert_array_equal(padded[5], small[4])
    words = np.array([[b"1.5"], [b"2.5"], [b"3.5"]], dtype=object)
    padded = InputPool().gather([{"s": words[:2]}, {"s": words[2:]}], [2, 1], 4)["s"]
    assert padded.tolist() == [[b"1.5"], [b"2.5"], [b"3.5"], [b"3.5"]]
