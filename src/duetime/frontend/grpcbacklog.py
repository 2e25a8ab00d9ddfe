"""CoreBacklog: the gRPC calls that wait inside gRPC's core for a handler, and how long.

grpc.aio takes one call from its core per turn of the event loop. When the loop is saturated,
calls that have arrived wait in the core's queue, where Python cannot see them: a request whose
due time comes from its `timeout` parameter (no gRPC deadline) counted that time from when its
handler ran, so a call that had waited 750 ms was served "on time" and answered 745 ms late. Every
call waited as long (mlp at 1,200 calls/s, 5 ms timeouts, on the 2-core VM: 2 of 5,964 on time),
the schedulers saw no misses, and the load shedder no reason to shed.

The core counts every call it starts and ends (channelz); the handlers count the calls they hold.
Calls in the core that no handler holds are the backlog; divided by the rate at which handlers
take calls, it is how long the call taken now has waited (Little's law: the core's queue is
first in, first out). A call's due time from its `timeout` counts from its arrival so estimated.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

log = logging.getLogger("duetime.grpc")

RATE_WEIGHT = 0.3
"""Weight of the newest reading in the moving average of calls taken per second."""
READ_PERIOD_S = 0.02
"""The core's counts are read at most this often, only while calls come and the loop is busy
(see `sample`).

NOTE: a reading costs 100-700 µs of the loop (channelz writes JSON, which is parsed): every
10 ms that was 1-5% of a core."""


def server_ids() -> frozenset[int] | None:
    """The channelz ids of this process's gRPC servers, or None where channelz is not there."""
    try:
        from grpc._cython import cygrpc

        servers = json.loads(cygrpc.channelz_get_servers(0)).get("server", [])
        return frozenset(int(server["ref"]["serverId"]) for server in servers)
    except Exception as exc:  # (grpcio without channelz, or another layout: no estimate)
        log.debug("no gRPC channelz (%s): calls queued in gRPC's core are not estimated", exc)
        return None


def core_counts_reader(
    before: frozenset[int] | None, after: frozenset[int] | None
) -> Callable[[], int] | None:
    """A function giving the calls the gRPC server created between the two `server_ids()`
    holds now (started, less succeeded and failed), or None where that is not one server.

    NOTE: a server is known by its id alone: channelz names its listening socket by the
    address asked for (port 0 when any free port was)."""
    if before is None or after is None or len(after - before) != 1:
        return None
    from grpc._cython import cygrpc

    (server_id,) = after - before

    def held() -> int:
        data = json.loads(cygrpc.channelz_get_server(server_id))["server"]["data"]
        started = int(data.get("callsStarted", 0))
        ended = int(data.get("callsSucceeded", 0)) + int(data.get("callsFailed", 0))
        return started - ended

    return held


class CoreBacklog:
    """Estimates calls waiting in gRPC's core and the wait of the call a handler takes now.

    The handlers call `taken` as a call starts, and `released` once it is done (its status
    sent: what the core counts as ended). `sample(busy)` runs every few ms on the loop and reads
    the core's counts every READ_PERIOD_S while calls come and the loop is `busy` (nothing waits
    while none come or the loop has time for them). What the core holds beyond the handlers'
    calls (less `SLACK`, calls between their end and the core's count of it) waits for a
    handler.
    """

    SLACK = 1

    def __init__(
        self,
        core_held: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core_held = core_held
        """The calls the core holds now (`core_counts_reader`; None: no estimate)."""
        self._clock = clock
        self.holding = 0
        """Calls the handlers hold now."""
        self.taken_total = 0
        """Calls the handlers have taken, ever."""
        self.calls = 0
        """Calls waiting in the core at the last reading."""
        self.wait_s = 0.0
        """Estimated wait in the core of a call taken now (0 while calls are taken at once)."""
        self._rate = 0.0
        self._last_taken = 0
        self._last_at = clock()

    def taken(self) -> None:
        self.holding += 1
        self.taken_total += 1

    def released(self, _context: object = None) -> None:
        self.holding -= 1

    def sample(self, busy: bool = True) -> None:
        core_held = self.core_held
        if core_held is None:
            return
        now = self._clock()
        elapsed = now - self._last_at
        if elapsed < READ_PERIOD_S:
            return
        taken = self.taken_total - self._last_taken
        self._last_at, self._last_taken = now, self.taken_total
        if taken == 0 or not busy:
            self.calls, self.wait_s, self._rate = 0, 0.0, 0.0
            return
        rate, last = taken / elapsed, self._rate
        self._rate = rate if last == 0.0 else last + RATE_WEIGHT * (rate - last)
        self.calls = max(0, core_held() - self.holding - self.SLACK)
        self.wait_s = self.calls / self._rate
