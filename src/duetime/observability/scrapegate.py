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
Scrapes take their turns in the order they came (a render answers every scrape of its key
waiting then), and nothing is kept once its scrapes have it.

NOTE: the first version woke every waiting scrape at once and let whichever ran first render:
with 30 scrapers asking different things a scrape was overtaken for 11 s, past Prometheus's
10 s timeout. And it kept the last render of every key ever asked (each query string, each
Accept header) for good: 400 scrapes of distinct query strings took 11 MB (found by a tester).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")

RENDER_SHARE = 0.1
"""The share of the time renders may take: one that took `d` is followed by the next no sooner
than `d / RENDER_SHARE` after it began (a 2 ms render of a small server: 20 ms)."""


class _Ticket(Generic[T]):
    """One scrape waiting for its answer."""

    __slots__ = ("done", "key", "result")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.done = False
        self.result: T | None = None


class ScrapeGate(Generic[T]):
    """Renders (`fetch`) one at a time, in the order the scrapes came, each answering the
    scrapes of its key that came before it began, spaced by `share` (see the module's doc).
    Thread-safe; `clock` in seconds."""

    def __init__(
        self, share: float = RENDER_SHARE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self._share = share
        self._clock = clock
        self._changed = threading.Condition()
        self._waiting: deque[_Ticket[T]] = deque()
        """Scrapes not answered and not riding on a render, in the order they came."""
        self._busy = False
        self._next_at = 0.0
        """The earliest time the next render may begin."""

    def fetch(self, key: Hashable, render: Callable[[], T]) -> T:
        """What `render` gives, from a render of `key` begun after this call: this thread's,
        or another's it shares. Raises what `render` raised, in the thread that ran it (the
        scrapes that would have shared it render in their turn)."""
        ticket: _Ticket[T] = _Ticket(key)
        changed, waiting = self._changed, self._waiting
        with changed:
            waiting.append(ticket)
            while True:
                if ticket.done:
                    return ticket.result  # type: ignore[return-value]
                if self._busy or waiting[0] is not ticket:
                    changed.wait()
                    continue
                wait = self._next_at - self._clock()
                if wait <= 0:
                    break
                changed.wait(wait)
            waiting.popleft()
            riders = [other for other in waiting if other.key == key]
            for other in riders:
                waiting.remove(other)
            self._busy = True
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
                    for other in riders:
                        other.result, other.done = result, True
                else:  # (their turns come first: they came before those still waiting)
                    waiting.extendleft(reversed(riders))
                changed.notify_all()
        return result
