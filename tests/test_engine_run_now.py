"""The in-process Engine on an idle model that runs on the loop (inline): the first request of a
loop turn runs within its call, the others of that turn wait for the batch (`_runs_now`)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from repo_models import faulty_model, inputs, run_on_engine, scale_model, write_version

from duetime import Engine
from duetime.engine import settled
from duetime.errors import DeadlineExceeded, InvalidInput
from duetime.scheduling.scheduler import ModelScheduler
from duetime.types import InferRequest

pytestmark = pytest.mark.timeout(120)


def inline_repo(tmp_path: Path) -> Path:
    write_version(tmp_path, "m", 1, scale_model(2))
    (tmp_path / "m" / "config.toml").write_text('max_batch_size = 64\nexecution = "inline"\n')
    return tmp_path


def test_an_awaited_request_on_an_idle_inline_model_runs_within_its_submit(
    tmp_path: Path,
) -> None:
    async def scenario(engine: Engine) -> None:
        await engine.infer_async("m", inputs())  # (the first: warm)
        await asyncio.sleep(0)  # a turn of its own
        ticket = engine.submit(InferRequest("m", inputs()), run_now=True)
        assert ticket.future.done(), "an idle inline model ran it within the call"
        np.testing.assert_array_equal(ticket.response().outputs["y"], 2 * inputs()["x"])
        queued = engine.submit(InferRequest("m", inputs()))  # without run_now: the next turn
        assert not queued.future.done()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert queued.future.done()
        answer = await engine.infer_async("m", inputs(), timeout=1.0)
        np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])

    run_on_engine(inline_repo(tmp_path), scenario)


def test_requests_of_one_turn_still_go_together(tmp_path: Path) -> None:
    """A gather of many: the first runs within its call, the rest as one batch on the next turn
    (not one run each, as they would were every request of the turn run at once)."""

    async def scenario(engine: Engine) -> None:
        await engine.infer_async("m", inputs())
        scheduler = engine.registry.resolve("m", None).scheduler
        before = scheduler.statistics().executions
        answers = await asyncio.gather(*(engine.infer_async("m", inputs()) for _ in range(20)))
        for answer in answers:
            np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])
        assert scheduler.statistics().executions - before == 2

    run_on_engine(inline_repo(tmp_path), scenario)


def test_a_request_submitted_from_an_answer_does_not_run_inside_it(tmp_path: Path) -> None:
    """A callback of one answer that asks again (a feed's) queues its request for the next turn:
    a run nested in the settling of another batch's answers would interleave the two."""

    async def scenario(engine: Engine) -> None:
        await engine.infer_async("m", inputs())
        await asyncio.sleep(0)
        nested: list[bool] = []

        def ask_again() -> None:
            ticket = engine.submit(InferRequest("m", inputs()), run_now=True)
            nested.append(ticket.future.done())

        first = engine.submit(InferRequest("m", inputs()))  # (settled on the next turn)
        first.when_done(ask_again)
        for _ in range(4):
            await asyncio.sleep(0)
        assert nested == [False]

    run_on_engine(inline_repo(tmp_path), scenario)


def test_a_task_awaiting_its_calls_one_by_one_runs_each_within_its_call(tmp_path: Path) -> None:
    """One task awaiting call after call never yields between them (each answer is there at
    once): every call runs within it, none waits for a turn of the loop. (Other tasks' requests
    of that turn still wait for the kick: `test_requests_of_one_turn_still_go_together`.)"""

    async def scenario(engine: Engine) -> None:
        await engine.infer_async("m", inputs())
        await asyncio.sleep(0)
        scheduler = engine.registry.resolve("m", None).scheduler
        before = scheduler.statistics().executions
        for _ in range(5):
            ticket = engine.submit(InferRequest("m", inputs()), run_now=True)
            assert ticket.future.done(), "the same task's next call ran within it too"
        assert scheduler.statistics().executions - before == 5

    run_on_engine(inline_repo(tmp_path), scenario)


def test_a_request_run_within_its_call_is_counted_as_a_queued_one(tmp_path: Path) -> None:
    """The run within the call (`run_now`) keeps the same books as the run on the next turn:
    the same statistics counts, histograms, batch sizes and profile learning per request."""

    async def scenario(engine: Engine) -> None:
        await engine.infer_async("m", inputs())
        await asyncio.sleep(0)
        scheduler = engine.registry.resolve("m", None).scheduler
        profile = scheduler.profile
        learned = [0]
        observe = profile.observe

        def counted(rows: int, elapsed_ns: int) -> None:
            learned[0] += 1
            observe(rows, elapsed_ns)

        # NOTE: the runs the profile learns from, counted: its own count of them (`_observed`)
        # stops once no bucket is left unseen, which five slow runs in a row bring about on a
        # loaded machine (a CI run once)
        profile.observe = counted  # type: ignore[method-assign]

        def books() -> tuple[object, ...]:
            s = scheduler.statistics()
            sizes = {n: b.count for n, b in s.batch_sizes.items()}
            return (
                s.succeeded, s.failed, s.rejected, s.expired, s.late, s.on_time, s.cancelled,
                s.executions, s.inferences, s.request_time.counts, s.queue_time.counts,
                s.compute_time.total, sizes, learned[0],
            )  # fmt: skip

        def delta(after: tuple[object, ...], before: tuple[object, ...]) -> list[object]:
            out: list[object] = []
            for a, b in zip(after, before, strict=True):
                if isinstance(a, tuple):
                    out.append(sum(x - y for x, y in zip(a, b, strict=True)))  # type: ignore
                elif isinstance(a, dict):
                    out.append({k: v - b.get(k, 0) for k, v in a.items()})  # type: ignore
                else:
                    out.append(a - b)  # type: ignore[operator]
            return out

        start = books()
        for _ in range(7):
            ticket = engine.submit(InferRequest("m", inputs(), due_ns=None), run_now=True)
            assert ticket.future.done()
            np.testing.assert_array_equal(ticket.response().outputs["y"], 2 * inputs()["x"])
        now = books()
        for _ in range(7):
            queued = engine.submit(InferRequest("m", inputs()))
            assert not queued.future.done()
            await queued.future  # (on the loop's next turn: the kick)
            np.testing.assert_array_equal(queued.response().outputs["y"], 2 * inputs()["x"])
        later = books()
        lean = spy_on_lean_path(scheduler)
        for _ in range(7):  # (`Engine.infer_async`'s lean path: `ModelScheduler.answer_alone`)
            answer = await engine.infer_async("m", inputs())
            np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])
        last = books()
        for _ in range(7):  # (with a due time: admitted on the lean path, then run)
            answer = await engine.infer_async("m", inputs(), timeout=5.0)
            np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])
        due = books()
        assert lean == [True] * 14, "each ran on the lean path"
        assert delta(now, start) == delta(later, now) == delta(last, later) == delta(due, last)
        assert delta(now, start)[0] == 7
        assert delta(now, start)[-1] == 7  # (a run learnt from each)

    run_on_engine(inline_repo(tmp_path), scenario)


def faulty_inline_repo(tmp_path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Model m, inline, in `tmp_path`: `faulty_model`, whose run fails on the second inputs
    returned (ONNX Runtime refuses them) and answers the first."""
    write_version(tmp_path, "m", 1, faulty_model())
    (tmp_path / "m" / "config.toml").write_text('max_batch_size = 8\nexecution = "inline"\n')
    good = {"x": np.ones((1, 4), np.float32), "k": np.zeros((1, 1), np.int64)}
    bad = {"x": np.ones((1, 4), np.float32), "k": np.ones((1, 1), np.int64)}
    return good, bad


def spy_on_lean_path(scheduler: ModelScheduler) -> list[bool]:
    """Whether each call of `scheduler.answer_alone` (the in-process lean path) ran its
    request (True) or left it to the queue (False), in order."""
    calls: list[bool] = []
    answer_alone = scheduler.answer_alone

    def spied(feeds: dict[str, np.ndarray], rows: int, **options: Any) -> object:
        outcome = answer_alone(feeds, rows, **options)
        calls.append(outcome is not None)
        return outcome

    scheduler.answer_alone = spied  # type: ignore[method-assign,assignment]
    return calls


def test_a_failed_run_on_the_lean_path_is_a_queued_one_s_failure(tmp_path: Path) -> None:
    """A run that ONNX Runtime refuses, on the lean path: the same error (type and words) as a
    queued request's, the same statistics, and its breaker not opened (its client's values)."""
    good, bad = faulty_inline_repo(tmp_path)

    async def scenario(engine: Engine) -> None:
        await engine.infer_async("m", good)
        await asyncio.sleep(0)
        scheduler = engine.registry.resolve("m", None).scheduler

        def books() -> tuple[int, ...]:
            s = scheduler.statistics()
            return (s.succeeded, s.failed, s.executions, s.compute_time.total, s.breakers_opened)

        start = books()
        queued = engine.submit(InferRequest("m", bad))
        await settled(queued.future)
        queued_error = queued.failure()
        assert isinstance(queued_error, InvalidInput)
        middle = books()
        lean = spy_on_lean_path(scheduler)
        with pytest.raises(InvalidInput) as raised:
            await engine.infer_async("m", bad)
        assert lean == [True]
        end = books()
        assert str(raised.value) == str(queued_error)
        assert [b - a for a, b in zip(start, middle, strict=True)] == [0, 1, 0, 1, 0]
        assert [b - a for a, b in zip(middle, end, strict=True)] == [0, 1, 0, 1, 0]
        answer = await engine.infer_async("m", good)  # (still served: no breaker opened)
        np.testing.assert_array_equal(answer["y"], good["x"])
        assert lean == [True, True]

    run_on_engine(tmp_path, scenario)


def test_a_request_with_a_due_time_is_admitted_on_the_lean_path_as_a_queued_one(
    tmp_path: Path,
) -> None:
    """The lean path admits a request with a timeout as `submit_nowait` does: one that fits runs
    within its call and counts on time; one due already is refused (DeadlineExceeded, counted
    expired) as a queued request is, and runs nothing."""

    async def scenario(engine: Engine) -> None:
        await engine.infer_async("m", inputs())
        await asyncio.sleep(0)
        scheduler = engine.registry.resolve("m", None).scheduler

        def books() -> tuple[int, ...]:
            s = scheduler.statistics()
            return (s.succeeded, s.on_time, s.late, s.expired, s.executions, s.queue_time.total)

        def moved(after: tuple[int, ...], before: tuple[int, ...]) -> list[int]:
            return [a - b for a, b in zip(after, before, strict=True)]

        lean = spy_on_lean_path(scheduler)
        start = books()
        answer = await engine.infer_async("m", inputs(), timeout=5.0)
        np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])
        assert lean == [True]
        ran = books()
        queued = engine.submit(
            InferRequest("m", inputs(), due_ns=engine.clock.now_ns() + 5 * 10**9)
        )
        await queued.future
        ran_queued = books()
        assert moved(ran, start) == moved(ran_queued, ran) == [1, 1, 0, 0, 1, 1]
        with pytest.raises(DeadlineExceeded) as lean_refusal:
            # (due 1 ns after the clock's read: `timeout=0` sets no due time, as over the wire)
            await engine.infer_async("m", inputs(), timeout=1e-9)
        refused = books()
        with pytest.raises(DeadlineExceeded) as queued_refusal:
            engine.submit(InferRequest("m", inputs(), due_ns=engine.clock.now_ns() - 1))
        refused_queued = books()
        assert moved(refused, ran_queued) == moved(refused_queued, refused) == [0, 0, 0, 1, 0, 0]
        assert "was due before the engine could queue it" in str(lean_refusal.value)
        assert "was due" in str(queued_refusal.value)
        assert lean == [True], "the refused request ran nothing"
        await engine.infer_async("m", inputs())
        assert lean == [True, True]

    run_on_engine(inline_repo(tmp_path), scenario)


def test_an_answer_run_within_its_call_is_delivered_before_the_books_are_kept(
    tmp_path: Path,
) -> None:
    """`Engine.submit_now(request, deliver)`: the outputs of a request run within the call go to
    `deliver` as its run ends, with the scheduler's books not yet moved for it, and are counted
    before the call returns, as without `deliver`; a request made in `deliver` waits for the next
    turn (none nested in the other's books); a `deliver` that raises leaves the books kept."""

    async def scenario(engine: Engine) -> None:
        await engine.infer_async("m", inputs())
        await asyncio.sleep(0)
        scheduler = engine.registry.resolve("m", None).scheduler

        def counted() -> tuple[int, int, int]:
            s = scheduler.statistics()
            return s.succeeded, s.executions, scheduler.profile._observed

        seen: list[tuple[np.ndarray, tuple[int, int, int]]] = []
        nested: list[Any] = []
        before = counted()

        def deliver(outputs: dict[str, np.ndarray]) -> None:
            seen.append((outputs["y"], counted()))
            nested.append(engine.submit_now(InferRequest("m", inputs())))

        done = engine.submit_now(InferRequest("m", inputs(), due_ns=None), deliver)
        assert isinstance(done, tuple), "run within the call"
        ((delivered, books_then),) = seen
        np.testing.assert_array_equal(delivered, 2 * inputs()["x"])
        assert books_then == before, "delivered before the books moved"
        assert counted() == tuple(b + 1 for b in before), "and kept before the call returned"
        assert done[1]["y"] is delivered  # (the same outputs)
        ticket = nested[0]
        assert not isinstance(ticket, tuple), "the request made in `deliver` was queued"
        np.testing.assert_array_equal((await ticket.future)["y"], 2 * inputs()["x"])
        await asyncio.sleep(0)

        def fails(outputs: dict[str, np.ndarray]) -> None:
            raise RuntimeError("the caller's own failure")

        before = counted()
        with pytest.raises(RuntimeError, match="the caller's own failure"):
            engine.submit_now(InferRequest("m", inputs()), fails)
        assert counted() == tuple(b + 1 for b in before), "kept all the same"
        await asyncio.sleep(0)
        answer = await engine.infer_async("m", inputs())  # (and the model serves on)
        np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])

    run_on_engine(inline_repo(tmp_path), scenario)


def test_a_failed_run_within_its_call_is_not_delivered(tmp_path: Path) -> None:
    """`deliver` gets answers only: a run that fails comes back as the call's error outcome."""
    good, bad = faulty_inline_repo(tmp_path)

    async def scenario(engine: Engine) -> None:
        await engine.infer_async("m", good)
        await asyncio.sleep(0)
        delivered: list[object] = []
        done = engine.submit_now(InferRequest("m", bad), delivered.append)
        assert isinstance(done, tuple)
        assert isinstance(done[1], InvalidInput)
        assert delivered == []

    run_on_engine(tmp_path, scenario)


def test_what_the_caller_does_with_its_answer_is_not_learnt_as_hand_back(
    tmp_path: Path,
) -> None:
    """The time an answer takes to settle (`_answer_ns`, kept before every due time) ends
    where `deliver` gets the outputs: a caller's own work on them is not the server's. Learnt
    with it, a deliver of 2 ms kept 923 µs before every due time, and a request due in 780 µs
    that the model answers in 19 µs was refused (a tester)."""

    async def scenario(engine: Engine) -> None:
        await engine.infer_async("m", inputs())
        scheduler = engine.registry.resolve("m", None).scheduler
        for _ in range(60):
            await asyncio.sleep(0)
            done = engine.submit_now(InferRequest("m", inputs()), lambda _: time.sleep(0.002))
            assert isinstance(done, tuple), "run within the call"
        assert scheduler._answer_ns < 200_000, scheduler._answer_ns
        await asyncio.sleep(0)
        answer = await engine.infer_async("m", inputs(), timeout=0.002)
        np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])

    run_on_engine(inline_repo(tmp_path), scenario)
