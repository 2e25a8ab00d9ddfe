"""The one place that chooses the event loop implementation: uvloop where installed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


async def in_thread(function: Callable[[], object]) -> None:
    """`asyncio.to_thread(function)`, or, while the interpreter exits (an engine closed by its
    atexit hook: the executors take no more work then), `function()` here, blocking the loop."""
    loop = asyncio.get_running_loop()
    try:
        done = loop.run_in_executor(None, function)
    except RuntimeError:  # ("cannot schedule new futures after interpreter shutdown")
        function()
        return
    await done


class BusyPoll:
    """Keeps an event loop polling its sockets, instead of sleeping in the poll, for a while
    after each `poke`: the next request of a busy client is read without a wake-up.

    NOTE: on a VM an idle vCPU halts; waking it for the next packet took ~40 µs here, and the
    request that woke it ran on cold caches (the HTTP path took 150 µs instead of 60). While
    the window lasts the loop turns without sleeping (a ready callback makes its poll return at
    once), at the cost of a core that stays busy for `window_s` after the last read, and of the
    GIL, which a spinning loop hands to an instance thread only at the switch interval: off by
    default, for a loop whose core is its own and whose models run inline.
    """

    __slots__ = ("_loop", "_spinning", "_until", "_window")

    def __init__(self, loop: asyncio.AbstractEventLoop, window_s: float) -> None:
        self._loop = loop
        self._window = window_s
        self._until = 0.0
        self._spinning = False

    @property
    def spinning(self) -> bool:
        """Whether the loop is being kept from sleeping now."""
        return self._spinning

    def poke(self) -> None:
        """Something was read: keep polling until `window_s` from now."""
        self._until = time.monotonic() + self._window
        if not self._spinning:
            self._spinning = True
            self._loop.call_soon(self._spin)

    def _spin(self) -> None:
        if time.monotonic() < self._until:
            self._loop.call_soon(self._spin)
        else:
            self._spinning = False
