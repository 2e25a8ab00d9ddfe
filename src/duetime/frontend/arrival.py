"""ReadTurn: when the requests read in the event loop's current turn reached the server.

The v2 `timeout` parameter counts from when the server receives the request, and a server only
knows when it reads one. Under load one turn of the loop reads every connection that has data:
hundreds of requests, each parsed and scheduled before the next is read. The last of them has
waited in its socket for the whole turn. Counting its timeout from the moment it is parsed lets
the server answer it "on time" by its own clock while its client sees it late; and since such
stale requests cost as much to serve as fresh ones, a backlog in the sockets, once there, stays
(measured on mlp at 150% load: a turn's oldest request 34 ms old at the 99th percentile, answers
late for seconds at a time while the server counted them on time).

So a request read in a turn counts its timeout from the turn's first read, which is when the
loop's poll returned: its bytes had arrived by then. Requests read late in a long turn are then
due early, and those that cannot make it are refused for a fraction of the cost of serving them,
which shortens the next turn: the backlog drains instead of feeding itself.

A busy loop hides a second wait: what a poll returns arrived after the poll before it, while the
loop was reading the last turn, running batches and timers. When the loop hardly slept since the
last turn began (its thread's CPU time says so), a request read now may have waited that whole
stretch in its socket, and counts from when the last turn began.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from duetime.clock import Clock
from duetime.loops import BusyPoll

BUSY_SHARE = 0.5
"""The share of the time since the last turn began that the loop's thread must have been on the
CPU for a new turn's requests to count from then (see `ReadTurn.mark`)."""


class ReadTurn:
    """The start of the loop turn in which the front end reads requests (see the module doc)."""

    __slots__ = (
        "_arrival_ns",
        "_clock",
        "_cpu_clock",
        "_cpu_ns",
        "_open",
        "_started_ns",
        "busy_poll",
    )

    def __init__(self, clock: Clock, cpu_clock: Callable[[], int] = time.thread_time_ns) -> None:
        self._clock = clock
        self._cpu_clock = cpu_clock
        """The loop thread's CPU time (ns): call `mark` on the loop's thread."""
        self._open = False
        self._started_ns = 0
        self._cpu_ns = 0
        self._arrival_ns = 0
        self.busy_poll: BusyPoll | None = None
        """Poked at each turn that reads (`busy_poll_us`); None: the loop sleeps when idle."""

    def mark(self, loop: asyncio.AbstractEventLoop) -> None:
        """Call as data is read, on `loop`: the turn's first read starts it.

        NOTE: the loop runs its ready callbacks after all the reads its poll returned (checked
        on uvloop and asyncio), so the callback that ends the turn runs before the next poll.

        NOTE: a loop that slept since the last turn began was woken by what it reads now, or
        by a timer shortly before: its requests count from now. One that was busy all along
        polled last as the last turn began, and each request may have waited since then.
        Measured (mlp over HTTP binary at about twice its capacity, 2/10 ms due times, on the
        2-core VM, client and server clocks joined): of the 2 ms requests answered late, the
        wait in their socket before the turn that read them was 1.3 ms on average, and every
        one was written by its due time counted from that turn; 10% of the answers were late.
        Counted from the last turn (bench/scheduling.py --models mlp, one run each, same VM):
        at 200% of capacity 99.3% of answers on time instead of 94.9%, goodput 5,656-6,631/s
        instead of 3,711-5,748/s (less work spent on answers already late).
        On a CPU shared with other work, the loop's thread is off the CPU for some of the
        time: it counts the CPU time it had, no more."""
        if not self._open:
            self._open = True
            now = self._clock.now_ns()
            cpu = self._cpu_clock()
            busy, since = cpu - self._cpu_ns, now - self._started_ns
            self._arrival_ns = now - min(busy, since) if busy >= BUSY_SHARE * since else now
            self._started_ns, self._cpu_ns = now, cpu
            loop.call_soon(self._close)
            if self.busy_poll is not None:
                self.busy_poll.poke()

    def arrival_ns(self, now_ns: int) -> int:
        """When a request being handled now reached the server, as far as the loop can tell:
        the start of the current read turn (or of the one before, see `mark`), or `now_ns`
        outside one."""
        return self._arrival_ns if self._open else now_ns

    def _close(self) -> None:
        self._open = False
