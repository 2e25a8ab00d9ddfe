"""`ModelScheduler._fits_alone`, the lean path's admission in one frame, decides as `_admit` does.

`answer_alone` admits a request it finds fitting without `_admission`, and hands every other one
to it: on random scheduler states (profile, margins learnt, overheads, busy-until, size costs,
probe and cold conditions, policies, default timeouts) and due times, the fast decision is
`_admit`'s first prediction to the ns, and a request answered alone ends the same (outputs or
refusal, in the same words) and leaves the same statistics and learnt state as it does through
`_admission` alone (the code before `_fits_alone`). No real time: a FakeClock.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
from factories import FakeExecutor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duetime.clock import FakeClock
from duetime.config import SchedulingConfig
from duetime.errors import DuetimeError
from duetime.scheduling.admission import admit
from duetime.scheduling.profile import LatencyProfile, ProfilePoint
from duetime.scheduling.scheduler import ModelScheduler

US = 1_000
MS = 1_000_000
NOW = 5_000 * MS


@st.composite
def states(draw: st.DrawFn) -> dict[str, Any]:
    """A scheduler's configuration and learnt state, and a request for it."""
    batching = draw(st.booleans())
    buckets = [1, 2, 3, 4] if batching else [1]
    medians = [draw(st.integers(1 * US, 5 * MS)) for _ in buckets]
    spreads = [draw(st.integers(0, 2 * MS)) for _ in buckets]
    instances = draw(st.integers(1, 2))
    row_bytes = draw(st.sampled_from([0, 16]))
    return {
        "policy": draw(st.sampled_from(["edf", "fifo"])),
        "points": [
            ProfilePoint(b, m, m + s) for b, m, s in zip(buckets, medians, spreads, strict=True)
        ],
        "max_batch_size": 4 if batching else 0,
        "rows": draw(st.integers(1, 4)) if batching else 1,
        "instances": instances,
        "delivery_margin_us": draw(st.integers(0, 1_000)),
        "exec_margin": draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.5])),
        "priority_levels": draw(st.integers(0, 3)),
        "default_timeout_ns": draw(st.none() | st.integers(0, 5 * MS)),
        "overhead_ns": draw(st.floats(0, 300 * US)),
        "answer_ns": draw(st.floats(0, 300 * US)),
        "busy_until": [NOW + draw(st.integers(-2 * MS, 3 * MS)) for _ in range(instances)],
        "overrun_factor": draw(st.sampled_from([1.0, 1.5, 1.495, 1.505]) | st.floats(1.0, 8.0)),
        "overrun_tail": draw(st.sampled_from([0.0]) | st.floats(1.0, 8.0)),
        "handoff": draw(st.sampled_from([0.0]) | st.floats(0, 5 * MS)),
        "tails_read_ago_ns": draw(st.sampled_from([0, 50 * MS, 200 * MS])),
        "last_run_ago_ns": draw(st.sampled_from([0, 20 * MS, 150 * MS])),
        "refusing": draw(st.booleans()),
        "guessed": draw(st.booleans()),
        "row_bytes": row_bytes,
        "size_cost": row_bytes > 0 and draw(st.booleans()),
        "input_factor": draw(st.sampled_from([1, 100])),
        "due_in": draw(
            st.none() | st.integers(-100 * US, 6 * MS) | st.sampled_from([0, 1, 10 * MS])
        ),
        "at_the_edge": draw(st.none() | st.integers(-3, 3)),
        "priority": draw(st.integers(0, 4)),
        "arrived_ago_ns": draw(st.none() | st.integers(0, 2 * MS)),
    }


def build(state: dict[str, Any]) -> tuple[ModelScheduler, dict[str, np.ndarray]]:
    """A scheduler in `state` on the running loop (idle: nothing queued, nothing running), and
    the request's inputs."""
    clock = FakeClock(NOW)
    profile = LatencyProfile(state["points"])
    profile.guessed = state["guessed"]
    scheduler = ModelScheduler(
        executor=FakeExecutor(state["instances"], inline=True),  # type: ignore[arg-type]
        config=SchedulingConfig(
            policy=state["policy"],
            delivery_margin_us=state["delivery_margin_us"],
            exec_margin=state["exec_margin"],
            priority_levels=state["priority_levels"],
        ),
        max_batch_size=state["max_batch_size"],
        profile=profile,
        default_timeout_ns=state["default_timeout_ns"],
        clock=clock,
        label="'m' version 1",
        sample_row_bytes=state["row_bytes"],
    )
    scheduler._overhead_ns = state["overhead_ns"]
    scheduler._answer_ns = state["answer_ns"]
    scheduler._busy_until[:] = state["busy_until"]
    overrun, handoff = scheduler._overrun, scheduler._handoff
    overrun.factor = state["overrun_factor"]
    overrun._tail.value = state["overrun_tail"]
    handoff.value = state["handoff"]
    overrun._tail._refreshed_ns = handoff._refreshed_ns = NOW - state["tails_read_ago_ns"]
    scheduler._last_run_ns = NOW - state["last_run_ago_ns"]
    scheduler._refusing = state["refusing"]
    rows = state["rows"]
    if state["size_cost"]:  # a run of 1,000 extra bytes that took 1 ms more than its profile
        scheduler._size_cost.observe(1_000, 1 * MS, profile.predict(1), NOW - 1 * MS)
    width = max(1, state["row_bytes"] * state["input_factor"] // 4)
    feeds = {"x": np.zeros((rows, width), dtype=np.float32)}
    return scheduler, feeds


def first_needed(scheduler: ModelScheduler, feeds: dict[str, np.ndarray], rows: int) -> int:
    """When `_admit`'s first prediction (before it ages the margins) needs the request to be
    due by at the least, by its own methods."""
    finish, ahead = scheduler._predict(NOW, rows, (0, 0, 0), scheduler._others(NOW))
    assert ahead == 0
    extra = scheduler._extra_bytes(sum(v.nbytes for v in feeds.values()), rows)
    finish += scheduler._size_cost.predict(extra if scheduler._size_cost else 0)
    return finish + scheduler._kept_for(rows)


def due_of(state: dict[str, Any], needed: int) -> int | None:
    """The request's due time: `at_the_edge` ns from the least its prediction needs (where
    rounding would tell), else `due_in` from now."""
    if state["at_the_edge"] is not None:
        return needed + state["at_the_edge"]
    return None if state["due_in"] is None else NOW + state["due_in"]


def answer(state: dict[str, Any], fast: bool) -> tuple[object, ...]:
    """Answer the request alone on a scheduler in `state` (`fast`: as it is; else with
    `_fits_alone` finding nothing fits, as before it): what came of it, and what it left."""

    async def body() -> tuple[object, ...]:
        scheduler, feeds = build(state)
        if not fast:
            scheduler._fits_alone = lambda *_: False  # type: ignore[method-assign]
        ago = state["arrived_ago_ns"]
        due = due_of(state, first_needed(scheduler, feeds, state["rows"]))
        try:
            outcome: object = scheduler.answer_alone(
                feeds,
                state["rows"],
                due_ns=due,
                priority=state["priority"],
                arrival_ns=None if ago is None else NOW - ago,
            )
        except DuetimeError as exc:
            outcome = (type(exc).__name__, str(exc), getattr(exc, "retry_after_s", None))
        if isinstance(outcome, dict):
            outcome = sorted((name, value.tolist()) for name, value in outcome.items())
        statistics = dataclasses.replace(scheduler.statistics(), last_inference_ms=0)
        return (
            outcome,
            statistics,
            scheduler._refused_ns,
            scheduler._last_run_ns,
            scheduler._refusing,
            scheduler._probes,
            scheduler._impossible,
            scheduler._overhead_ns,
            scheduler._answer_ns,
            scheduler._overrun.factor,
            scheduler._handoff.value,
            list(scheduler.profile._predicted),
            scheduler.profile.guessed,
            scheduler._probe,
        )

    return asyncio.run(body())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states())
def test_the_lean_path_decides_and_counts_as_admission_does(state: dict[str, Any]) -> None:
    assert answer(state, fast=True) == answer(state, fast=False)


@settings(max_examples=300, deadline=None)
@given(states())
def test_it_fits_exactly_where_admit_s_first_prediction_admits(state: dict[str, Any]) -> None:
    """`_admit`'s first prediction (before it ages the margins), by its own methods: the fast
    decision is the same, whatever the state."""

    async def body() -> None:
        scheduler, feeds = build(state)
        rows = state["rows"]
        needed = first_needed(scheduler, feeds, rows)
        due = due_of(state, needed)
        if due is None:
            due = needed
        first = admit(now_ns=NOW, due_ns=due, predicted_finish_ns=needed) is None
        assert scheduler._fits_alone(NOW, feeds, rows, due) == first

    asyncio.run(body())


@settings(max_examples=300, deadline=None)
@given(states(), st.booleans())
def test_fits_on_an_idle_scheduler_decides_as_its_full_prediction(
    state: dict[str, Any], tripped: bool
) -> None:
    """`ModelScheduler.fits` (a feed asks it of each burst) on an idle scheduler, its lean
    branch: the same answer as the queue's full prediction (`_predict`, `available`) gives,
    whatever the state, also with a breaker tripped (which takes the full path)."""

    def full(scheduler: ModelScheduler, due: int, rows: int, level: int) -> bool:
        queue = scheduler._queue
        if queue.full(level) or due <= NOW or not scheduler.available(NOW):
            return False
        key = queue.key_for(level, due)
        finish, _ = scheduler._predict(NOW, rows, key, scheduler._others(NOW))
        return finish + scheduler._kept_for(rows) <= due

    async def body() -> None:
        scheduler, feeds = build(state)
        if tripped:
            scheduler._tripped = 1
        rows = state["rows"]
        needed = first_needed(scheduler, feeds, rows) - scheduler._size_cost.predict(
            scheduler._extra_bytes(sum(v.nbytes for v in feeds.values()), rows)
            if scheduler._size_cost
            else 0
        )
        due = due_of(state, needed)
        if due is None:
            due = needed
        level = scheduler._level(state["priority"])
        assert scheduler.fits(NOW, due, rows, state["priority"]) == full(
            scheduler, due, rows, level
        )

    asyncio.run(body())
