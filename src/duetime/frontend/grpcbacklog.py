"""CoreBacklog: the gRPC calls that wait inside gRPC's core for a handler, and how long.

grpc.aio takes one call from its core per turn of the event loop. When the loop is saturated,
calls that have arrived wait in the core's queue, where Python cannot see them: a request whose
due time comes from its `timeout` parameter (no gRPC deadline) counted that time from when its
handler ran, so a call that had waited 750 ms was served "on time" and answered 745 ms late. Every
call waited as long (mlp at 1,200 calls/s, 5 ms timeouts, on the 2-core VM: 2 of 5,964 on time),
the schedulers saw no misses, and the load shedder no reason to shed.

The core counts every call it starts and ends (channelz); the handlers count the calls they
hold. Calls in the core that no handler holds wait for one, first in, first out: the next to be
taken is the core's call number `started - waiting + 1`, and the readings of `started` over time
say when that call arrived.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

log = logging.getLogger("duetime.grpc")

READ_PERIOD_S = 0.02
"""The core's counts are read at most this often, only while calls come and the loop is busy
(see `CoreBacklog.sample`).

NOTE: a reading costs 100-700 µs of the loop (channelz writes JSON, which is parsed): every
10 ms that was 1-5% of a core."""
HISTORY = 256
"""Readings kept to date the call taken now (about 5 s of them); one that waited longer is
dated by the oldest (its wait is underestimated, never overestimated)."""
GAP_S = 0.1
"""Readings further apart than this do not date calls between them (see `sample`)."""

Counts = Callable[[], tuple[int, int]]
"""The calls a server's core has started, ever, and holds now (started, not ended)."""


def server_ids() -> frozenset[int] | None:
    """The channelz ids of this process's gRPC servers, or None where channelz is not there."""
    try:
        from grpc._cython import cygrpc

        ids: set[int] = set()
        start = 0
        while True:
            page = json.loads(cygrpc.channelz_get_servers(start))
            found = [int(server["ref"]["serverId"]) for server in page.get("server", [])]
            ids.update(found)
            if page.get("end", True) or not found:
                break
            start = max(found) + 1
        return frozenset(ids)
    except Exception as exc:  # (grpcio without channelz, or another layout: no estimate)
        log.debug("no gRPC channelz (%s): calls queued in gRPC's core are not estimated", exc)
        return None


def core_counts_reader(
    before: frozenset[int] | None, after: frozenset[int] | None
) -> Counts | None:
    """The `Counts` of the gRPC server created between the two `server_ids()`, or None where
    that is not one server.

    NOTE: a server is known by its id alone: channelz names its listening socket by the
    address asked for (port 0 when any free port was)."""
    if before is None or after is None or len(after - before) != 1:
        return None
    from grpc._cython import cygrpc

    (server_id,) = after - before

    def counts() -> tuple[int, int]:
        data = json.loads(cygrpc.channelz_get_server(server_id))["server"]["data"]
        started = int(data.get("callsStarted", 0))
        ended = int(data.get("callsSucceeded", 0)) + int(data.get("callsFailed", 0))
        return started, started - ended

    return counts


class CoreBacklog:
    """Estimates calls waiting in gRPC's core and the wait of the call a handler takes now.

    Every handler calls `taken` as its call starts and `released` once it is done (its status
    sent: what the core counts as ended; see `counted`). `sample(busy)` runs every few ms on the
    loop and reads the core's counts every READ_PERIOD_S while calls come and the loop is `busy`
    (nothing waits while none come or the loop has time for them). What the core holds beyond
    the handlers' calls (less `SLACK`: calls between their end and the core's count of it)
    waits. The estimate holds for the calls that waited at the reading; once as many more have
    been taken, the next ones came after it and are not said to have waited.

    NOTE: the wait was first the calls waiting divided by the rate they were taken at: that is
    the wait of the call that came last, not of the one taken now. In a burst of 400 calls with
    100 ms timeouts on an idle server the first ones were expired with time left and the last
    ones answered late; and the figure, kept until the next reading, expired calls that came
    after a burst had drained (4-6 of 30).
    """

    SLACK = 1

    def __init__(
        self, core_counts: Counts | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.core_counts = core_counts
        """The core's counts (`core_counts_reader`; None: no estimate)."""
        self._clock = clock
        self.holding = 0
        """Calls the handlers hold now."""
        self.taken_total = 0
        """Calls the handlers have taken, ever."""
        self.calls = 0
        """Calls waiting in the core at the last reading."""
        self._wait_s = 0.0
        self._holds_until = 0
        self._readings: deque[tuple[float, int]] = deque(maxlen=HISTORY)
        self._last_at = clock()
        self._last_taken = 0

    @property
    def wait_s(self) -> float:
        """Estimated wait in the core of the call taken now (0 once the calls that waited at the
        last reading have all been taken)."""
        return self._wait_s if self.taken_total <= self._holds_until else 0.0

    def taken(self) -> None:
        self.holding += 1
        self.taken_total += 1

    def released(self, _context: object = None) -> None:
        self.holding -= 1

    def sample(self, busy: bool = True) -> None:
        core_counts = self.core_counts
        if core_counts is None:
            return
        now = self._clock()
        if now - self._last_at < READ_PERIOD_S:
            return
        taken = self.taken_total - self._last_taken
        self._last_at, self._last_taken = now, self.taken_total
        if taken == 0:
            self.calls, self._wait_s = 0, 0.0
            self._readings.clear()
            return
        if not busy:
            # NOTE: the readings are kept: the loop's use swings across the threshold from one
            # 10 ms to the next in an overload (0.39-0.69 at 1,200 calls/s), and a history
            # cleared each time dated the calls waiting by the next reading (their wait 0)
            return
        if self._readings and now - self._readings[-1][0] > GAP_S:
            self._readings.clear()  # (arrivals are not even over a gap: a burst would spread)
        started, held = core_counts()
        waiting = max(0, held - self.holding - self.SLACK)
        self.calls = waiting
        arrived = self._arrival(started - waiting + 1, now, started) if waiting else now
        self._readings.append((now, started))
        self._wait_s = now - arrived
        self._holds_until = self.taken_total + waiting

    def _arrival(self, number: int, now: float, started: int) -> float:
        """When the core started its call `number` (by the readings, assuming calls arrived
        evenly between two; before the oldest reading: at it)."""
        later_at, later = now, started
        for at, count in reversed(self._readings):
            if count < number:
                return at + (later_at - at) * (number - count) / (later - count)
            later_at, later = at, count
        return later_at


def counted(handler: Any, backlog: CoreBacklog) -> Any:
    """`handler` (a grpc.RpcMethodHandler) with its calls counted in `backlog`; unchanged where
    its behaviour is not a coroutine or an async generator (grpc.aio runs those on a thread)."""
    for kind in ("unary_unary", "stream_unary", "unary_stream", "stream_stream"):
        inner = getattr(handler, kind)
        if inner is not None:
            break
    else:
        return handler
    if inspect.iscoroutinefunction(inner):

        async def call(request: Any, context: Any) -> Any:
            backlog.taken()
            context.add_done_callback(backlog.released)
            return await inner(request, context)

        return handler._replace(**{kind: call})
    if inspect.isasyncgenfunction(inner):

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            backlog.taken()
            context.add_done_callback(backlog.released)
            async for response in inner(request, context):
                yield response

        return handler._replace(**{kind: stream})
    return handler


class _CountedGeneric(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A generic handler whose methods' calls are counted (see `counted`)."""

    def __init__(self, inner: Any, backlog: CoreBacklog) -> None:
        self._inner = inner
        self._backlog = backlog

    def service(self, handler_call_details: Any) -> Any:
        handler = self._inner.service(handler_call_details)
        return None if handler is None else counted(handler, self._backlog)


class CountingServer:
    """Registers services on a grpc.aio `server` with their calls counted in `backlog`.

    NOTE: calls the handlers did not count looked queued: 50 health Watch streams held open (a
    client-side health check holds one per connection) made 4 clients far below capacity get
    502 expiries and 7,862 refusals."""

    def __init__(self, server: Any, backlog: CoreBacklog) -> None:
        self._server = server
        self._backlog = backlog

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(_CountedGeneric(h, self._backlog) for h in handlers)
        )

    def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
        counted_handlers = {m: counted(h, self._backlog) for m, h in handlers.items()}
        self._server.add_registered_method_handlers(name, counted_handlers)


# (reflection registers its asyncio servicer only on what it takes for a grpc.aio server)
grpc.aio.Server.register(CountingServer)
