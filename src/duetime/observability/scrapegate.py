"""ScrapeGate: scrapes of `/metrics` render one at a time, spaced so that rendering takes at most
a share of the time, and those asking the same render at once share it.

A render is Python (prometheus_client formats every series): about 19 ms of CPU for the ~1,000
series of eight model versions on the 2-core VM. The metrics server answers each connection on
a thread of its own, and those threads take the GIL from the event loop: four scrapers asking
back to back cut a sequential client's inference rate from about 1,500 to 100-175 a second (its
P99 from 1.2 to 21-42 ms), and one alone halved it (found by a tester). Triton gathers its
metrics on an interval of its own; a scrape here still gets a render begun after it arrived
(no count it could have seen is missing), but it may wait for it: renders keep to `share` of
the time, and a scrape that comes while one it could share runs waits for the next.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")

RENDER_SHARE = 0.1
"""The share of the time renders may take: one that took `d` is followed by the next no sooner
than `d / RENDER_SHARE` after it began (a 2 ms render of a small server: 20 ms)."""


class ScrapeGate(Generic[T]):
    """Renders (`fetch`) one at a time, each begun after every scrape it answers arrived, spaced
    by `share` (see the module's doc). Thread-safe; `clock` in seconds."""

    def __init__(
        self, share: float = RENDER_SHARE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self._share = share
        self._clock = clock
        self._changed = threading.Condition()
        self._busy = False
        self._begun = 0
        """Renders begun so far (the last one's number)."""
        self._next_at = 0.0
        """The earliest time the next render may begin."""
        self._last: dict[Hashable, tuple[int, T]] = {}
        """The latest render of each key, and its number."""

    def fetch(self, key: Hashable, render: Callable[[], T]) -> T:
        """What `render` gives, from a render of `key` begun after this call: this thread's,
        or another's it shares. Raises what `render` raised, in the thread that ran it (the
        others wait for a render of their own)."""
        changed = self._changed
        with changed:
            fresh = self._begun + 1  # (a render numbered this or later began after now)
            while True:
                last = self._last.get(key)
                if last is not None and last[0] >= fresh:
                    return last[1]
                wait = None if self._busy else self._next_at - self._clock()
                if wait is not None and wait <= 0:
                    break
                changed.wait(wait)
            self._busy = True
            self._begun += 1
            number = self._begun
        began = self._clock()
        done = False
        try:
            result = render()
            done = True
        finally:
            ended = self._clock()
            with changed:
                self._busy = False
                self._next_at = began + (ended - began) / self._share
                if done:
                    self._last[key] = (number, result)
                changed.notify_all()
        return result
