"""Turns: instance threads that share a CPU run their batches one at a time, in hand-off order.

The event loop takes a ticket for each batch as it hands it to an instance thread (`take`); the
thread waits for its ticket's turn before running the batch (`wait`) and passes the turn on when
done (`done`). A plain lock would let a thread that just finished a batch take the CPU again
before a thread already waiting wakes up, so the order the schedulers planned would not hold.

Each turn lasts at most its hold, given with its ticket: past it the next batch runs beside it,
as the OS shares the CPU. A batch's hold is its prediction with a margin; one taken without a
hold has `STUCK_S`, which also frees the turns of a thread that died or of a dropped batch.

NOTE: a turn was held for as long as its run took, up to `STUCK_S`: a run of a model whose cost
follows its inputs (a Loop whose trip count a client sent) held the CPU's turn for a second, and
the requests of the models beside it, due in 100 ms, expired unrun while the machine's other CPU
idled (found by a tester).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

STUCK_S = 1.0
"""The hold of a turn taken without one: a turn not passed on within this long is passed on (its
thread died or its batch was dropped), the waiting batch runs anyway, rather than never."""


class Turns:
    """A ticket lock: FIFO turns for the batches of the instance threads on one CPU."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._clock = clock
        self._issued = 0
        self._serving = 0
        self._holds: dict[int, float] = {}
        """Ticket -> its hold (s), from `take` until its turn begins."""
        self._until = clock() + STUCK_S
        """When the turn being served is passed on if not done by then."""

    def take(self, hold_s: float | None = None) -> int:
        """A ticket for the next batch handed over (on the event loop), its turn held for at
        most `hold_s` (None: `STUCK_S`) once it begins (now, if no batch is ahead of it)."""
        if hold_s is None:
            hold_s = STUCK_S
        with self._condition:
            ticket = self._issued
            self._issued += 1
            if ticket == self._serving:
                self._until = self._clock() + hold_s
            else:
                self._holds[ticket] = hold_s
            return ticket

    def wait(self, ticket: int) -> None:
        """Block until `ticket`'s turn (on an instance thread)."""
        clock = self._clock
        with self._condition:
            while self._serving < ticket:
                now = clock()
                if now >= self._until:
                    self._pass(self._serving + 1, now)  # its run overran its hold
                else:
                    self._condition.wait(self._until - now)

    def done(self, ticket: int) -> None:
        """`ticket`'s batch finished: the next one may run (if its turn was not passed on)."""
        with self._condition:
            if ticket + 1 > self._serving:
                self._pass(ticket + 1, self._clock())

    def _pass(self, serving: int, now: float) -> None:
        """The turn goes on to `serving`, held from now (under the lock)."""
        self._serving = serving
        self._until = now + self._holds.pop(serving, STUCK_S)
        self._condition.notify_all()
