"""CoreBacklog: calls waiting in gRPC's core for a handler, and the wait of the call taken now
(fake core counts and clock, no server)."""

from __future__ import annotations

import pytest

from duetime.frontend.grpcbacklog import READ_PERIOD_S, CoreBacklog


class Core:
    """What gRPC's core holds (calls started, not ended), moved by hand; counts its readings."""

    def __init__(self) -> None:
        self.held = 0
        self.readings = 0

    def __call__(self) -> int:
        self.readings += 1
        return self.held


def make() -> tuple[CoreBacklog, Core, list[float]]:
    core, now = Core(), [0.0]
    return CoreBacklog(core, clock=lambda: now[0]), core, now


def take(backlog: CoreBacklog, core: Core, calls: int) -> None:
    """`calls` calls taken by handlers and ended (the core no longer holds them)."""
    for _ in range(calls):
        backlog.taken()
        backlog.released()


def test_calls_the_core_holds_beyond_the_handlers_wait_as_long_as_the_takers_need() -> None:
    backlog, core, now = make()
    core.held = 101 + CoreBacklog.SLACK  # 100 waiting, 1 being handled
    backlog.taken()
    for _ in range(3):  # 1,000 calls/s taken
        now[0] += 0.02
        take(backlog, core, 20)
        backlog.sample()
    assert backlog.calls == 100
    assert backlog.wait_s == pytest.approx(0.1, rel=0.1)


def test_nothing_waits_while_no_calls_are_taken_and_the_core_is_not_read() -> None:
    backlog, core, now = make()
    core.held = 50
    for _ in range(5):
        now[0] += 0.02
        backlog.sample()
    assert (backlog.calls, backlog.wait_s, core.readings) == (0, 0.0, 0)


def test_the_core_is_read_at_most_once_a_period() -> None:
    backlog, core, now = make()
    for _ in range(10):
        now[0] += READ_PERIOD_S / 4
        take(backlog, core, 5)
        backlog.sample()
    assert 2 <= core.readings <= 3


def test_calls_the_handlers_hold_are_not_waiting() -> None:
    backlog, core, now = make()
    for _ in range(8):  # streams held open, each counted by the core too
        backlog.taken()
    core.held = 8
    now[0] += 0.02
    take(backlog, core, 10)
    backlog.sample()
    assert backlog.calls == 0
    assert backlog.wait_s == 0.0


def test_without_the_cores_counts_there_is_no_estimate() -> None:
    backlog = CoreBacklog(None)
    backlog.taken()
    backlog.sample()
    assert (backlog.calls, backlog.wait_s) == (0, 0.0)


def test_the_core_is_not_read_while_the_loop_has_time_for_calls() -> None:
    backlog, core, now = make()
    core.held = 50
    for _ in range(5):
        now[0] += 0.02
        take(backlog, core, 20)
        backlog.sample(busy=False)
    assert (backlog.calls, backlog.wait_s, core.readings) == (0, 0.0, 0)
