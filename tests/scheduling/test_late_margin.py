"""The margin learnt from late answers: `LateMargin` (pure), and a scheduler keeping it before
due times once a batch ended late by its clock, then giving it back (a fake clock and executor)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_scheduler import ONE_ROW, US, harness, run

from duetime.errors import Overloaded
from duetime.scheduling.profile import LATE_HALF_LIFE_NS, LATE_SHARE_MAX, LateMargin

MS = 1_000_000
SECOND = 1_000 * MS


def test_a_late_batch_grows_the_margin_by_how_late_it_was() -> None:
    margin = LateMargin()
    margin.late(2 * MS, 50 * MS, SECOND)
    assert margin.value == 2 * MS
    margin.late(1 * MS, 50 * MS, SECOND + 10 * MS)  # (late though 2 ms were kept: 3 were needed)
    assert margin.value == 3 * MS


def test_the_margin_grows_to_a_share_of_the_late_requests_budget_at_most() -> None:
    margin = LateMargin()
    margin.late(40 * MS, 50 * MS, SECOND)  # (a stall: 40 ms late, of a request due in 50)
    assert margin.value == int(LATE_SHARE_MAX * 50 * MS) == 5 * MS
    margin.late(1 * MS, 2 * MS, SECOND)  # (a short budget does not shrink what was learnt)
    assert margin.value == 5 * MS


def test_the_margin_halves_each_half_life_without_a_late_answer() -> None:
    margin = LateMargin()
    margin.late(4 * MS, 100 * MS, SECOND)
    assert not margin.age(SECOND + LATE_HALF_LIFE_NS - 1)
    assert margin.value == 4 * MS
    assert margin.age(SECOND + LATE_HALF_LIFE_NS)
    assert margin.value == 2 * MS
    assert margin.age(SECOND + 3 * LATE_HALF_LIFE_NS + 5)
    assert margin.value == MS // 2
    assert margin.age(SECOND + 100 * LATE_HALF_LIFE_NS)
    assert margin.value == 0  # (less than 1 µs left: none)
    assert not margin.age(SECOND + 200 * LATE_HALF_LIFE_NS)


late_events = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=100 * MS),  # late by
        st.integers(min_value=1, max_value=SECOND),  # its budget
        st.integers(min_value=0, max_value=3 * SECOND),  # after the event before
    ),
    max_size=30,
)


@given(late_events)
def test_the_margin_stays_within_the_largest_share_of_a_budget(events: list) -> None:
    margin, now, ceiling = LateMargin(), SECOND, 0
    for late_ns, budget_ns, after in events:
        now += after
        before = margin.value
        margin.age(now)
        assert margin.value <= before
        margin.late(late_ns, budget_ns, now)
        ceiling = max(ceiling, int(LATE_SHARE_MAX * budget_ns))
        assert 0 <= margin.value <= ceiling
        assert margin.value >= min(late_ns, int(LATE_SHARE_MAX * budget_ns))


def test_a_scheduler_keeps_what_its_late_answers_missed_by_then_gives_it_back() -> None:
    async def body() -> None:
        h = harness()
        # a request due in 600 µs fits a run of 100 µs with room to spare...
        fits = h.submit("fits", due_in=600 * US)
        h.clock.advance(ONE_ROW)
        h.executor.complete(0, compute_ns=ONE_ROW)
        await fits
        # ...then a batch due in 30 ms ends 1 ms past it (the VM stalled its loop)
        late = h.submit("late", due_in=30 * MS)
        h.clock.advance(31 * MS)
        h.executor.complete(1, compute_ns=ONE_ROW)
        await late
        assert h.scheduler.statistics().late == 1
        assert h.scheduler.statistics().late_margin_ns == 1 * MS
        # the same request now needs 100 µs and the 1 ms the late one missed by
        with pytest.raises(Overloaded, match="kept for margins"):
            await h.submit("refused", due_in=600 * US)
        # two half-lives on, the margin is a quarter of that: it fits again
        h.clock.advance(2 * LATE_HALF_LIFE_NS)
        again = h.submit("fits again", due_in=600 * US)
        h.clock.advance(ONE_ROW)
        h.executor.complete(2, compute_ns=ONE_ROW)
        await again
        stats = h.scheduler.statistics()
        assert (stats.late, stats.on_time, stats.rejected) == (1, 2, 1)
        assert stats.late_margin_ns == MS // 4

    run(body)


def test_a_probe_planned_past_its_due_time_teaches_no_margin() -> None:
    """A probe is admitted though predicted to miss (see PROBE_NS): its lateness was planned."""

    async def body() -> None:
        h = harness()
        with pytest.raises(Overloaded):
            await h.submit("refused", due_in=60 * US)  # predicted 100 µs
        h.clock.advance(200 * MS)  # idle and refusing: the next one is a probe
        probe = h.submit("probe", due_in=60 * US)
        h.clock.advance(ONE_ROW)
        h.executor.complete(0, compute_ns=ONE_ROW)
        await probe
        stats = h.scheduler.statistics()
        assert (stats.probes, stats.late, stats.late_by_cause) == (1, 1, {"plan": 1})
        fits = h.submit("fits", due_in=ONE_ROW + 4 * US)  # (a margin of 6 µs would refuse it)
        h.clock.advance(ONE_ROW)
        h.executor.complete(1, compute_ns=ONE_ROW)
        await fits

    run(body)
