"""LoadShedder.refuse's `spare`: a request whose model has capacity idle is never refused, at
any share (fake clocks).

A tester found a closed-loop flood of a model with 256 KB bodies held at the cap (95% refused
unread) while the model's instance sat idle 83% of the time: 5 answers/s on time against
101/s with one connection.
"""

from __future__ import annotations

import pytest
from memory_fakes import ShedderClocks

from duetime.overload import LoadShedder

HEAVY_BYTES = 262_144
"""The tester's model's request body (1x256x256 FP32)."""


def saturated() -> LoadShedder:
    """A shedder at its cap (95%), the heavy model's requests weighed."""
    clocks = ShedderClocks()
    shedder = LoadShedder(
        cpu_clock=lambda: clocks.cpu, wall_clock=lambda: clocks.wall, wait_clock=lambda: 0.0
    )
    for _ in range(40):
        shedder.refuse("heavy", HEAVY_BYTES)
        clocks.run(busy=1.0)
        shedder.sample(clocks.failing)
    assert shedder.share == pytest.approx(0.95)
    return shedder


def test_a_model_with_idle_capacity_is_never_refused() -> None:
    shedder = saturated()
    before = shedder.refused
    asked = []

    def idle() -> bool:
        asked.append(True)
        return True

    assert not any(shedder.refuse("heavy", HEAVY_BYTES, spare=idle) for _ in range(100))
    assert shedder.refused == before
    assert 90 <= len(asked) <= 100, "asked only of the requests about to be refused"


def test_a_busy_model_is_refused_at_its_share() -> None:
    shedder = saturated()
    refused = sum(shedder.refuse("heavy", HEAVY_BYTES, spare=lambda: False) for _ in range(100))
    assert refused == 95


def test_a_refusal_passed_over_for_idle_capacity_goes_to_the_next_busy_request() -> None:
    """The class's share holds over all its requests: those its model was idle for are not
    refused, the next ones that find it busy are in their place, one refusal carried at most."""
    shedder = saturated()
    refused = {True: 0, False: 0}
    for number in range(200):
        idle = number % 2 == 0  # (every other request finds the model idle)
        refused[idle] += shedder.refuse("heavy", HEAVY_BYTES, spare=lambda idle=idle: idle)
    assert refused == {True: 0, False: 100}
    for _ in range(50):  # a long idle spell
        assert not shedder.refuse("heavy", HEAVY_BYTES, spare=lambda: True)
    busy = [shedder.refuse("heavy", HEAVY_BYTES, spare=lambda: False) for _ in range(40)]
    assert sum(busy) == 38, "not the spell's refusals all at once"


def test_spare_is_not_asked_when_nothing_would_be_refused() -> None:
    shedder = LoadShedder(cpu_clock=lambda: 0.0, wall_clock=lambda: 0.0, wait_clock=lambda: 0.0)

    def never() -> bool:
        raise AssertionError("asked with nothing to refuse")

    assert not shedder.refuse("heavy", HEAVY_BYTES, spare=never)
