"""LoadShedder's `idle`: a request whose model has capacity idle is never refused, at any share
(fake clocks).

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


class Capacity:
    """The shedder's `idle`: what each model's capacity is said to be, and who asked."""

    def __init__(self) -> None:
        self.idle = False
        self.asked: list[tuple[str, str | None]] = []

    def __call__(self, model: str, version: str | None) -> bool:
        self.asked.append((model, version))
        return self.idle


def saturated(capacity: Capacity) -> LoadShedder:
    """A shedder at its cap (95%), the heavy model's requests weighed."""
    clocks = ShedderClocks()
    shedder = LoadShedder(
        cpu_clock=lambda: clocks.cpu, wall_clock=lambda: clocks.wall, wait_clock=lambda: 0.0,
        idle=capacity,
    )  # fmt: skip
    for _ in range(40):
        shedder.refuse("heavy", HEAVY_BYTES)
        clocks.run(busy=1.0)
        shedder.sample(clocks.failing)
    assert shedder.share == pytest.approx(0.95)
    capacity.asked.clear()
    return shedder


def test_a_model_with_idle_capacity_is_never_refused() -> None:
    capacity = Capacity()
    shedder = saturated(capacity)
    before = shedder.refused
    capacity.idle = True
    assert not any(shedder.refuse("heavy", HEAVY_BYTES, version="2") for _ in range(100))
    assert shedder.refused == before
    assert 90 <= len(capacity.asked) <= 100, "asked only of the requests about to be refused"
    assert set(capacity.asked) == {("heavy", "2")}


def test_a_busy_model_is_refused_at_its_share() -> None:
    shedder = saturated(Capacity())
    refused = sum(shedder.refuse("heavy", HEAVY_BYTES) for _ in range(100))
    assert refused == 95


def test_a_refusal_passed_over_for_idle_capacity_goes_to_the_next_busy_request() -> None:
    """The class's share holds over all its requests: those its model was idle for are not
    refused, the next ones that find it busy are in their place, one refusal carried at most."""
    capacity = Capacity()
    shedder = saturated(capacity)
    refused = {True: 0, False: 0}
    for number in range(200):
        capacity.idle = number % 2 == 0  # (every other request finds the model idle)
        refused[capacity.idle] += shedder.refuse("heavy", HEAVY_BYTES)
    assert refused == {True: 0, False: 100}
    capacity.idle = True
    for _ in range(50):  # a long idle spell
        assert not shedder.refuse("heavy", HEAVY_BYTES)
    capacity.idle = False
    busy = [shedder.refuse("heavy", HEAVY_BYTES) for _ in range(40)]
    assert sum(busy) == 38, "not the spell's refusals all at once"


def test_idle_is_not_asked_when_nothing_would_be_refused_nor_of_no_model() -> None:
    capacity = Capacity()
    shedder = LoadShedder(
        cpu_clock=lambda: 0.0, wall_clock=lambda: 0.0, wait_clock=lambda: 0.0, idle=capacity
    )
    assert not shedder.refuse("heavy", HEAVY_BYTES)
    shedder.share = 1.0  # (set by hand: every class refused at it)
    assert shedder.refuse(None, HEAVY_BYTES)
    assert capacity.asked == []
