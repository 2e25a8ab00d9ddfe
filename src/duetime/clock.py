"""The one clock: monotonic nanoseconds, injected so tests can drive time by hand."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of monotonic time in integer nanoseconds."""

    def now_ns(self) -> int: ...


class MonotonicClock:
    """The real clock: `time.monotonic_ns()`."""

    __slots__ = ()

    # NOTE: the C function itself, not a method calling it: a request reads the clock five
    # times, and a Python frame each cost more than the read.
    now_ns = staticmethod(time.monotonic_ns)


class FakeClock:
    """A clock that moves only when a test calls `advance`."""

    __slots__ = ("_now",)

    def __init__(self, start_ns: int = 0) -> None:
        self._now = start_ns

    def now_ns(self) -> int:
        return self._now

    def advance(self, ns: int) -> None:
        if ns < 0:
            raise ValueError("a monotonic clock cannot go back")
        self._now += ns
