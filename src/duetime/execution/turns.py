"""Turns: instance threads that share a CPU run their batches one at a time, in hand-off order.

The event loop takes a ticket for each batch as it hands it to an instance thread (`take`); the
thread waits for its ticket's turn before running the batch (`wait`) and passes the turn on when
done (`done`). A plain lock would let a thread that just finished a batch take the CPU again
before a thread already waiting wakes up, so the order the schedulers planned would not hold.

NOTE: a turn was held for as long as its run took, up to `STUCK_S`: a run of a model whose cost
follows its inputs (a Loop whose trip count a client sent) held the CPU's turn for a second, and
the requests of the models beside it, due in 100 ms, expired unrun while the machine's other CPU
idled (found by a tester). A run may hold its turn for what it was given (`wait`'s `hold_s`:
its prediction with a margin); past that, the next batch runs beside it, as the OS shares the CPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

STUCK_S = 1.0
"""A turn not passed on within this long is skipped (its thread died or its batch was dropped):
the waiting batch runs anyway, beside it if need be, rather than never."""


class Turns:
    """A ticket lock: FIFO turns for the batches of the instance threads on one CPU."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._clock = clock
        self._issued = 0
        self._serving = 0
        self._since = clock()
        """When the turn being served began (the last hand-on)."""
        self._until: float | None = None
        """When the turn being served is passed on if not done by then (None: `STUCK_S` on)."""

    def take(self) -> int:
        """A ticket for the next batch handed over (on the event loop)."""
        ticket = self._issued
        self._issued += 1
        return ticket

    def wait(self, ticket: int, hold_s: float | None = None) -> None:
        """Block until `ticket`'s turn (on an instance thread), which it then holds for at most
        `hold_s` (None: until `STUCK_S`) before the next batch may run beside it."""
        clock = self._clock
        with self._condition:
            while self._serving < ticket:
                until = self._until
                now = clock()
                if until is not None and now >= until:
                    self._pass(self._serving + 1, now)  # the turn overran what it was given
                    continue
                if now - self._since >= STUCK_S:
                    self._pass(ticket, now)  # the turn before it is stuck: skip it
                    break
                limit = self._since + STUCK_S
                if until is not None:
                    limit = min(limit, until)
                self._condition.wait(max(limit - now, 0.0))
            now = clock()
            if self._serving == ticket:  # (not passed on beyond it meanwhile)
                self._since = now
                self._until = None if hold_s is None else now + hold_s
                self._condition.notify_all()  # (the waiters' limits follow its hold)

    def done(self, ticket: int) -> None:
        """`ticket`'s batch finished: the next one may run."""
        with self._condition:
            if ticket + 1 > self._serving:
                self._pass(ticket + 1, self._clock())
            self._condition.notify_all()

    def _pass(self, serving: int, now: float) -> None:
        """The turn goes on to `serving` (under the lock)."""
        self._serving = serving
        self._since = now
        self._until = None
        self._condition.notify_all()
