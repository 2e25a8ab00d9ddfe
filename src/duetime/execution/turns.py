"""Turns: instance threads that share a CPU run their batches one at a time, in hand-off order.

The event loop takes a ticket for each batch as it hands it to an instance thread (`take`); the
thread waits for its ticket's turn before running the batch (`wait`) and passes the turn on when
done (`done`). A plain lock would let a thread that just finished a batch take the CPU again
before a thread already waiting wakes up, so the order the schedulers planned would not hold.
"""

from __future__ import annotations

import threading

STUCK_S = 1.0
"""A turn not passed on within this long is skipped (its thread died or its batch was dropped):
the waiting batch runs anyway, beside it if need be, rather than never."""


class Turns:
    """A ticket lock: FIFO turns for the batches of the instance threads on one CPU."""

    def __init__(self) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._issued = 0
        self._serving = 0

    def take(self) -> int:
        """A ticket for the next batch handed over (on the event loop)."""
        ticket = self._issued
        self._issued += 1
        return ticket

    def wait(self, ticket: int) -> None:
        """Block until `ticket`'s turn (on an instance thread)."""
        with self._condition:
            while self._serving < ticket:
                if not self._condition.wait(STUCK_S):
                    self._serving = ticket  # the turn before it is stuck: skip it
                    return

    def done(self, ticket: int) -> None:
        """`ticket`'s batch finished: the next one may run."""
        with self._condition:
            if ticket + 1 > self._serving:
                self._serving = ticket + 1
            self._condition.notify_all()
