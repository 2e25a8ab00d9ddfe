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
"""

from __future__ import annotations

import asyncio

from duetime.clock import Clock
from duetime.loops import BusyPoll


class ReadTurn:
    """The start of the loop turn in which the front end reads requests (see the module doc)."""

    __slots__ = ("_clock", "_open", "_started_ns", "busy_poll")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._open = False
        self._started_ns = 0
        self.busy_poll: BusyPoll | None = None
        """Poked at each turn that reads (`busy_poll_us`); None: the loop sleeps when idle."""

    def mark(self, loop: asyncio.AbstractEventLoop) -> None:
        """Call as data is read, on `loop`: the turn's first read starts it.

        NOTE: the loop runs its ready callbacks after all the reads its poll returned (checked
        on uvloop and asyncio), so the callback that ends the turn runs before the next poll."""
        if not self._open:
            self._open = True
            self._started_ns = self._clock.now_ns()
            loop.call_soon(self._close)
            if self.busy_poll is not None:
                self.busy_poll.poke()

    def arrival_ns(self, now_ns: int) -> int:
        """When a request being handled now reached the server, as far as the loop can tell:
        the start of the current read turn, or `now_ns` outside one."""
        return self._started_ns if self._open else now_ns

    def _close(self) -> None:
        self._open = False
