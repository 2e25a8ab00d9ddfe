"""A request of a waiting batch that a cheaper variant took over (`_sweep_committed`) is offered
once: the later rounds of the sweeper leave it to that variant, which runs it, answers it, names
itself in the answer and counts it. The engine's own hand-over (`engine._hand_down`, with its
`Ticket`) on schedulers with a FakeClock and FakeExecutors: nothing waits on real time.

Found by a tester: under load, a few answers labelled `variant: int8-static` were int8-dynamic's
output. The primary's batch, committed behind one that overran, kept the request it had handed to
int8-dynamic; the sweeper's next round (a millisecond later) found it hopeless again and handed it
to int8-static too (the ticket now named int8-static): both ran it, and int8-dynamic's answer,
the first, was delivered under int8-static's name. With no cheaper variant left, that round
failed it 504 instead, while its variant was about to answer it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
from factories import FakeExecutor

from duetime.clock import FakeClock
from duetime.config import SchedulingConfig
from duetime.engine import Ticket, _hand_down
from duetime.execution.executor import BatchResult
from duetime.repository.registry import Deployment
from duetime.scheduling.profile import profile_from_samples
from duetime.scheduling.scheduler import STOP_GRACE_NS, ModelScheduler

US = 1_000
MS = 1_000_000


class Version:
    """A primary (5 ms a run, a lookahead batch behind the running one) and its cheaper
    variants (10 µs a run each), best first, on one clock; requests queued as the engine queues
    them (`Engine._queue`): a ticket, and `_hand_down` as their fallback."""

    def __init__(self, *cheaper: str) -> None:
        self.clock = FakeClock(1_000 * MS)
        self.executors = {name: FakeExecutor(1) for name in cheaper}
        self.executors["default"] = FakeExecutor(1, depth=2)
        self.deployments = tuple(
            Deployment(None, self._scheduler(name), name)  # type: ignore[arg-type]
            for name in ("default", *cheaper)
        )
        self.primary = self.deployments[0].scheduler

    def _scheduler(self, name: str) -> ModelScheduler:
        """No margins: predictions are the profile's alone."""
        run_ns = 5 * MS if name == "default" else 10 * US
        return ModelScheduler(
            executor=self.executors[name],  # type: ignore[arg-type]
            config=SchedulingConfig(delivery_margin_us=0, exec_margin=0.0, policy="edf"),
            max_batch_size=0,
            profile=profile_from_samples({1: [run_ns] * 5}),
            default_timeout_ns=None,
            clock=self.clock,
            label=f"'m' version 1 ({name})",
        )

    def submit(self, due_in: int | None) -> Ticket:
        ticket = Ticket("m", "1", ("y",))
        fallback = functools.partial(_hand_down, ticket, self.deployments, 0)
        ticket.future = self.primary.submit_nowait(
            {"x": np.zeros(1)},
            rows=1,
            shape_key=(),
            due_ns=None if due_in is None else self.clock.now_ns() + due_in,
            priority=0,
            on_done=ticket._settled,
            fallback=None if due_in is None else fallback,
        )
        return ticket

    def runs(self, name: str) -> int:
        return len(self.executors[name].jobs)

    def answer(self, name: str, index: int = 0) -> None:
        """The variant's thread answers its `index`-th job: y = its position in quality order."""
        value = float(next(i for i, d in enumerate(self.deployments) if d.variant == name))
        self.executors[name].complete(index, outputs=[{"y": np.array([value])}], compute_ns=10 * US)

    def stats(self, name: str) -> Any:
        return next(d for d in self.deployments if d.variant == name).scheduler.statistics()

    def handed_over_from_a_lookahead_batch(self) -> Ticket:
        """A request committed behind a running batch that overruns, taken over by the best
        cheaper variant at the sweeper's round that finds it hopeless."""
        self.submit(None)  # the primary's one instance: 5 ms predicted
        ticket = self.submit(12 * MS)  # 5 + 5 ms predicted: admitted
        self.clock.advance(4_500 * US)
        self.primary._on_timer()
        _, committed = self.executors["default"].jobs[1]
        assert committed.start_by is not None  # (the premise: it waits for the running one)
        self.clock.advance(3 * MS)  # the running batch overruns: 7.5 + 5 ms would miss 12
        self.primary._sweep()
        assert committed.revoked
        cheaper = self.deployments[1].variant
        assert ticket.variant == cheaper
        assert self.runs(cheaper) == 1
        return ticket


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


def test_a_request_taken_over_is_answered_by_that_variant_under_its_own_name() -> None:
    async def body() -> None:
        v = Version("int8-dynamic", "int8-static")
        ticket = v.handed_over_from_a_lookahead_batch()
        v.clock.advance(1 * MS)  # the sweeper's next round: the primary's batch still waits
        v.primary._sweep()
        assert ticket.variant == "int8-dynamic", "not offered again, to int8-static"
        assert v.runs("int8-static") == 0, "never run on two variants"
        v.answer("int8-dynamic")
        response = ticket.response()
        assert response.variant == "int8-dynamic"
        np.testing.assert_array_equal(response.outputs["y"], [1.0])  # (int8-dynamic's output)
        primary, dynamic, static = (v.stats(n) for n in ("default", "int8-dynamic", "int8-static"))
        assert (primary.handed_over, primary.expired, primary.cancelled) == (1, 0, 0)
        assert (dynamic.succeeded, dynamic.handed_over, dynamic.cancelled) == (1, 0, 0)
        assert (static.succeeded, static.queued, static.cancelled) == (0, 0, 0)

    run(body)


def test_a_request_taken_over_by_the_cheapest_variant_is_not_failed_by_the_next_round() -> None:
    async def body() -> None:
        v = Version("fast")
        ticket = v.handed_over_from_a_lookahead_batch()
        v.clock.advance(1 * MS)
        v.primary._sweep()
        assert not ticket.future.done(), "left to the variant, not failed 504 by the primary"
        v.answer("fast")
        response = ticket.response()
        assert response.variant == "fast"
        np.testing.assert_array_equal(response.outputs["y"], [1.0])
        primary, fast = v.stats("default"), v.stats("fast")
        assert (primary.handed_over, primary.expired, primary.cancelled) == (1, 0, 0)
        assert (fast.succeeded, fast.cancelled) == (1, 0)

    run(body)


def test_a_stopped_run_of_a_request_taken_over_leaves_it_to_the_variant() -> None:
    """The primary's thread took the batch just as its request was taken over (the race in
    `_sweep_committed`'s note) and its run is stopped past the due time (`_watch`): the variant,
    which runs it too, answers it and counts it; the primary neither fails nor counts it."""

    async def body() -> None:
        v = Version("fast")
        ticket = v.handed_over_from_a_lookahead_batch()
        executor = v.executors["default"]
        instance, committed = executor.jobs[1]
        assert committed.start_by is not None
        take, _ = committed.start_by
        take()  # its thread takes it all the same
        executor.complete(0, compute_ns=8 * MS)  # the overrunning batch ends: this one runs
        v.clock.advance(12 * MS + STOP_GRACE_NS)
        v.primary._watch()
        assert executor.terminated == [committed]
        executor.finished.add(1)
        committed.on_done(BatchResult(committed, instance, terminated=True))
        assert not ticket.future.done(), "the variant's to answer"
        v.answer("fast")
        assert ticket.response().variant == "fast"
        primary, fast = v.stats("default"), v.stats("fast")
        assert (primary.handed_over, primary.expired, primary.cancelled) == (1, 0, 0)
        assert (fast.succeeded, fast.late, fast.cancelled) == (1, 1, 0)

    run(body)
