"""CoreBacklog: calls waiting in gRPC's core for a handler, and the wait of the call taken now
(fake core counts and clock, no server)."""

from __future__ import annotations

import asyncio

import pytest

from duetime.frontend.grpcbacklog import READ_PERIOD_S, CoreBacklog


class Core:
    """What gRPC's core counts (calls started ever, calls held now), moved by hand; counts its
    readings."""

    def __init__(self) -> None:
        self.started = 0
        self.held = 0
        self.readings = 0

    def arrive(self, calls: int) -> None:
        self.started += calls
        self.held += calls

    def __call__(self) -> tuple[int, int]:
        self.readings += 1
        return self.started, self.held + CoreBacklog.SLACK


def make() -> tuple[CoreBacklog, Core, list[float]]:
    core, now = Core(), [0.0]
    return CoreBacklog(core, clock=lambda: now[0]), core, now


def take(backlog: CoreBacklog, core: Core, calls: int) -> None:
    """`calls` calls taken by handlers and ended (the core no longer holds them)."""
    for _ in range(calls):
        backlog.taken()
        backlog.released()
        core.held -= 1


def test_a_steady_queue_dates_the_call_taken_now_by_its_arrival() -> None:
    """2,000 calls/s arrive, 1,000/s are taken: the queue grows by 20 a reading, and the call
    taken now is the one that came when as many had been started as have been taken."""
    backlog, core, now = make()
    for _ in range(10):
        now[0] += 0.025
        core.arrive(40)
        take(backlog, core, 20)
        backlog.sample()
    assert backlog.calls == 200
    # the next call is number 201, started just after the 5th reading (0.125 s); now is 0.25 s
    assert backlog.wait_s == pytest.approx(0.25 - 0.125, abs=0.002)


def test_in_a_burst_the_head_has_waited_least_of_those_left() -> None:
    """400 calls at once on an idle server: the estimate is the head's wait (since the burst
    came), not the wait of the last call, which arrived with it."""
    backlog, core, now = make()
    now[0] += 0.02
    core.arrive(400)
    take(backlog, core, 1)
    backlog.sample()  # first reading: the calls came before it, at it at the latest
    assert backlog.calls == 399
    assert backlog.wait_s == 0.0
    now[0] += 0.02
    take(backlog, core, 20)
    backlog.sample()
    assert backlog.calls == 379
    assert backlog.wait_s == pytest.approx(0.02)


def test_once_the_calls_that_waited_are_taken_the_next_did_not_wait() -> None:
    backlog, core, now = make()
    now[0] += 0.02
    core.arrive(50)
    take(backlog, core, 1)
    backlog.sample()
    now[0] += 0.02
    take(backlog, core, 10)
    backlog.sample()
    assert backlog.calls == 39
    assert backlog.wait_s > 0.0
    take(backlog, core, 39)  # the queue drained before the next reading
    assert backlog.wait_s > 0.0  # (the 39th still came in the burst)
    core.arrive(1)
    take(backlog, core, 1)  # a lone call after the burst
    assert backlog.wait_s == 0.0


def test_nothing_waits_while_no_calls_are_taken_and_the_core_is_not_read() -> None:
    backlog, core, now = make()
    core.arrive(50)
    for _ in range(5):
        now[0] += 0.02
        backlog.sample()
    assert (backlog.calls, backlog.wait_s, core.readings) == (0, 0.0, 0)


def test_the_core_is_not_read_while_the_loop_has_time_for_calls() -> None:
    backlog, core, now = make()
    core.arrive(100)
    for _ in range(5):
        now[0] += 0.02
        take(backlog, core, 10)
        backlog.sample(busy=False)
    assert (backlog.calls, backlog.wait_s, core.readings) == (0, 0.0, 0)


def test_the_core_is_read_at_most_once_a_period() -> None:
    backlog, core, now = make()
    for _ in range(10):
        now[0] += READ_PERIOD_S / 4
        core.arrive(5)
        take(backlog, core, 5)
        backlog.sample()
    assert 2 <= core.readings <= 3


def test_calls_the_handlers_hold_are_not_waiting() -> None:
    backlog, core, now = make()
    core.arrive(8)
    for _ in range(8):  # streams held open, each counted by the core too
        backlog.taken()
    now[0] += 0.02
    core.arrive(10)
    take(backlog, core, 10)
    backlog.sample()
    assert backlog.calls == 0
    assert backlog.wait_s == 0.0


def test_without_the_cores_counts_there_is_no_estimate() -> None:
    backlog = CoreBacklog(None)
    backlog.taken()
    backlog.sample()
    assert (backlog.calls, backlog.wait_s) == (0, 0.0)


def test_a_burst_after_a_quiet_stretch_is_not_spread_over_it() -> None:
    """Readings a long way apart (the loop was not busy in between) say nothing of when the
    calls between them came: 100 calls that came at once are not dated over the stretch."""
    backlog, core, now = make()
    now[0] += 0.02
    core.arrive(10)
    take(backlog, core, 10)
    backlog.sample()
    for _ in range(50):  # a second of steady traffic the loop keeps up with
        now[0] += 0.02
        core.arrive(10)
        take(backlog, core, 10)
        backlog.sample(busy=False)
    now[0] += 0.02
    core.arrive(100)  # a burst
    take(backlog, core, 1)
    backlog.sample()
    assert backlog.calls == 99
    assert backlog.wait_s == 0.0  # (came after the last reading in reach: at most 20 ms ago)


def test_a_call_counts_its_wait_from_when_it_was_taken_not_from_its_handler() -> None:
    """NOTE: a call was dated by the estimate read as its handler began, turns of the loop
    after it was taken: under an HTTP overload, 20 ms calls were answered 60-200 ms after they
    were sent and counted on time (found by a tester). The call's task keeps the estimate of
    when it was taken; the time since counts too."""
    backlog, core, now = make()
    for _ in range(10):  # (as the steady queue above: the call taken now waited 0.125 s)
        now[0] += 0.025
        core.arrive(40)
        take(backlog, core, 20)
        backlog.sample()

    async def call() -> tuple[int, int]:
        assert backlog.take_running()
        taken_wait = backlog.wait_s
        core.held -= 1
        take(backlog, core, 200)  # (the calls behind it are taken: the estimate moves on)
        await asyncio.sleep(0.05)  # (its message read, turns later)
        return backlog.waited_ns(), int(taken_wait * 1e9)

    waited, taken_wait = asyncio.run(call())
    assert taken_wait == pytest.approx(0.125e9, abs=0.002e9)
    assert taken_wait + 0.05e9 <= waited < taken_wait + 2e9
    assert backlog.waited_ns() == int(backlog.wait_s * 1e9)  # (outside a call's task)


def test_a_call_taken_while_the_loop_reads_turn_after_turn_is_as_old_as_its_turn() -> None:
    """With one call waiting (the core's count less `SLACK`: none said to wait), a call taken
    in a turn whose HTTP reads date from 30 ms ago waited at least that long."""
    backlog, _, _ = make()
    backlog.turn_age_ns = lambda: 30_000_000

    async def call() -> int:
        assert backlog.take_running()
        return backlog.waited_ns()

    assert backlog.wait_s == 0.0
    assert 30_000_000 <= asyncio.run(call()) < 2_000_000_000
