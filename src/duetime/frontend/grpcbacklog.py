"""CoreBacklog: the gRPC calls that wait inside gRPC's core for a handler, and how long.

grpc.aio takes one call from its core per turn of the event loop. When the loop is saturated,
calls that have arrived wait in the core's queue, where Python cannot see them: a request whose
due time comes from its `timeout` parameter (no gRPC deadline) counted that time from when its
handler ran, so a call that had waited 750 ms was served "on time" and answered 745 ms late. Every
call waited as long (mlp at 1,200 calls/s, 5 ms timeouts, on the 2-core VM: 2 of 5,964 on time),
the schedulers saw no misses, and the load shedder no reason to shed.

The core counts every call it starts and ends (channelz); grpc.aio's lookups of their handlers
count the calls it has taken (`CountingServer`). Calls in the core that were not taken wait for
the loop, first in, first out: the next to be taken is the core's call number
`started - waiting + 1`, and the readings of `started` over time say when that call arrived.

NOTE: a call is taken when grpc.aio looks up its handler, before its request message has come;
its handler runs once the message is all there. Counted from the handler, a call whose message
had not all come looked like a call waiting for the loop: 2,000 unary calls left with a 5-byte
message prefix on connections kept open (the core holds such calls until their connection
closes) made every later call look old, and 92-97% of one small client's calls were refused,
still 60 s later; 20 clients uploading 4 MiB over 8 s each got 33-62% of another client's
small calls refused while they uploaded (0% and 0% counted from the lookup). The backlog that
dates a call is calls the loop has not got to, not bytes a client has not sent.

NOTE: the core's counts are not the truth for good: a call it kills before the loop took it (over
its pending-call limit, `grpc.server.max_pending_requests`: a random share of those past 1,000
waiting; or past `grpc.server_max_unrequested_time_in_server`) stays started in channelz and is
never counted ended (grpcio 1.85: 449 of 2,500 calls queued while the loop was held, still "held"
with nothing in flight). Each looked queued forever: after a tester's 15 minutes of floods,
75-93% of light load's 10 ms calls were refused "due before it reached the scheduler", answered
in 4-7 ms. Counts cannot tell such calls from calls that wait; the probe (`CoreBacklog.probe`)
can: a call of the server's own, taken in turn behind every call before it.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import math
import secrets
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

PROBE_PERIOD_S = 1.0
"""While calls are said to wait in the core (or some were found `leaked`) and the loop is busy, a
probe (`CoreBacklog.probe`) is sent at most this often: a call of the server's own on a
connection of its own, 2.8 ms of CPU for both sides (200 in a row on the dev VM), 0.3% of a
core."""
PROBES_KEPT = 3
"""The probes whose findings count (see `CoreBacklog.leaked`)."""
PROBE_TIMEOUT_S = 30.0
"""A probe not taken by then is given up (the next is sent once it is)."""

_TAKEN: contextvars.ContextVar[tuple[int, int]] = contextvars.ContextVar("duetime_grpc_taken")
"""In a call's task (see `CoreBacklog.take_running`): when grpc.aio took the call from the core
(time.monotonic_ns) and how long it had waited then, as estimated (ns)."""

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

    Every call is `taken` as grpc.aio takes it from the core (`take_running`, from the lookup of
    its handler; `counted` where that cannot be done) and `released` once it is done (its status
    sent: what the core counts as ended). `sample(busy)` runs every few ms on the
    loop and reads the core's counts every READ_PERIOD_S while calls come and the loop is `busy`
    (nothing waits while none come or the loop has time for them). What the core holds beyond
    the calls taken (less `SLACK`: calls between their end and the core's count of it)
    waits. The estimate holds for the calls that waited at the reading; once as many more have
    been taken, the next ones came after it and are not said to have waited. Calls the core
    holds for good without handing them over (`leaked`, found by probes: see the module's
    NOTE) are not counted waiting.

    NOTE: the probe in flight, once it may have reached the core, is not counted waiting: a
    reading while the loop had not yet taken it said one call waited, and the next call taken
    (the probe, or a client's where the probe had not come yet) was dated by the reading before
    (a tester's CI run: light load said to wait 20 ms once a second, after the floods).

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
        self._leaks: deque[int] = deque(maxlen=PROBES_KEPT)
        self.probe_target: str | None = None
        """The server's own address, where probes go (`serve_grpc` sets it; None: none)."""
        self.probe_method = f"/duetime.CoreBacklog/Probe{secrets.token_hex(8)}"
        """The probe's method: a name no client knows (`CountingServer` answers it)."""
        self._probe_since: int | None = None
        """The core's count of calls started as the probe in flight was sent (None: none)."""
        self._probed_at = -math.inf
        self._probe_task: asyncio.Task[None] | None = None
        self.holding = 0
        """Calls the handlers hold now."""
        self.taken_total = 0
        """Calls the handlers have taken, ever."""
        self.calls = 0
        """Calls waiting in the core at the last reading."""
        self._wait_s = 0.0
        self.turn_age_ns: Callable[[], int] | None = None
        """How long ago what the loop handles now may have come, by its turns (HTTP's
        `ReadTurn`; 0 outside a turn that read): a floor under a call's wait (`waited_ns`)."""
        self._holds_until = 0
        self._readings: deque[tuple[float, int]] = deque(maxlen=HISTORY)
        self._last_at = clock()
        self._last_taken = 0

    @property
    def leaked(self) -> int:
        """Calls the core counts held that it will neither hand over nor count ended (see the
        module's NOTE): not counted waiting. The most the last PROBES_KEPT probes found.

        NOTE: a probe can find one too few: a call whose end the core has counted while its
        task has not ended yet is still in `holding`. Taken alone, the one left over was said
        to wait at every reading until the next probe, and the call taken then dated by the
        reading before (20 ms early under light load: a 10 ms timeout refused). A probe that
        finds more than the probes before is confirmed by another sent at the next reading."""
        return max(self._leaks, default=0)

    @property
    def wait_s(self) -> float:
        """Estimated wait in the core of the call taken now (0 once the calls that waited at the
        last reading have all been taken)."""
        return self._wait_s if self.taken_total <= self._holds_until else 0.0

    @property
    def probing(self) -> bool:
        """A probe is in flight, or due at the next reading that finds calls held."""
        return self._probe_since is not None or self._probed_at == -math.inf

    def taken(self) -> None:
        self.holding += 1
        self.taken_total += 1

    def released(self, _context: object = None) -> None:
        self.holding -= 1

    def take_running(self) -> bool:
        """Count the call the running task serves as taken until the task ends; False (nothing
        counted) where no task runs.

        NOTE: grpc.aio serves each call in a task of its own, from the lookup of its handler to
        its status sent; the task ends as the core counts the call ended, a call whose client
        cancelled it or whose deadline passed before its message came included (its handler
        never runs)."""
        try:
            task = asyncio.current_task()
        except RuntimeError:  # (no running loop)
            return False
        if task is None:
            return False
        self.taken()
        task.add_done_callback(self.released)
        waited = int(self.wait_s * 1e9)
        if self.turn_age_ns is not None:
            waited = max(waited, self.turn_age_ns())
        _TAKEN.set((time.monotonic_ns(), waited))
        return True

    def waited_ns(self) -> int:
        """How long the call the running task serves has been in the server: its wait in the
        core, estimated as the call was taken (`take_running`), and the time since; the wait of
        the call taken now where it was not taken so (`counted`, outside a task).

        NOTE: a call was dated by the estimate read as its handler began, after its request
        message had been read: turns of the loop after the call was taken. While HTTP requests
        at twice capacity made those turns long, a light gRPC client's calls with 20 ms
        timeouts were answered 60-200 ms after they were sent, and counted on time (found by a
        tester). The estimate in the core misses a call waiting alone (`SLACK`), and the turns
        of the loop between the core's hand-over and the lookup: where the loop has read HTTP
        turn after turn, the call is at least as old as the requests read in this turn
        (`turn_age_ns`)."""
        taken = _TAKEN.get(None)
        if taken is None:
            return int(self.wait_s * 1e9)
        at, waited = taken
        return time.monotonic_ns() - at + waited

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
        leaked = self.leaked
        since = self._probe_since
        probing = 1 if since is not None and started > since else 0
        waiting = max(0, held - self.holding - self.SLACK - leaked - probing)
        self.calls = waiting
        arrived = self._arrival(started - waiting + 1, now, started) if waiting else now
        self._readings.append((now, started))
        self._wait_s = now - arrived
        self._holds_until = self.taken_total + waiting
        if (waiting or leaked) and now - self._probed_at >= PROBE_PERIOD_S:
            self._send_probe(now, started)  # (`leaked`: found again, else its error would stay)

    def _send_probe(self, now: float, started: int) -> None:
        """Send a probe (see `probe`) unless one is in flight or there is no address to send it
        to; `started`: the core's count of calls started, read just now (read again once the
        probe's connection is up).

        NOTE: counted from before the probe connected, the calls that came while it did (taken
        before it, first in, first out) were counted as possibly behind it, and as many leaked
        calls not found: one light call sent as the probe connected left one of 8 leaked calls
        said to wait until the next probe."""
        target = self.probe_target
        if target is None or self._probe_since is not None:
            return
        self._probed_at = now
        self._probe_since = started
        self._probe_task = asyncio.get_running_loop().create_task(self.probe(target))

    async def probe(self, target: str) -> None:
        """Call the server at `target` (its own) with a call of `probe_method`, and wait for it.

        The core hands calls over first in, first out: when the probe is taken (`probed`),
        every call started before it was sent has been taken or ended, so only those started
        since can be waiting; what else the core holds beyond the calls taken, it holds for
        good (`leaked`). Never raises: a probe lost (the server stopping) just ends."""
        try:
            options = (("grpc.enable_http_proxy", 0),)
            async with grpc.aio.insecure_channel(target, options=options) as channel:
                await asyncio.wait_for(channel.channel_ready(), PROBE_TIMEOUT_S)
                core_counts = self.core_counts
                if core_counts is not None and self._probe_since is not None:
                    self._probe_since = core_counts()[0]  # (see `_send_probe`)
                await channel.unary_unary(self.probe_method)(b"", timeout=PROBE_TIMEOUT_S)
        except (grpc.aio.AioRpcError, OSError, TimeoutError) as exc:
            log.debug("gRPC backlog probe to %s: %s", target, exc)
        finally:
            if self._probe_task is asyncio.current_task():
                # NOTE: only its own: a probe taken (`probed`) may be followed by the next
                # before its answer comes, and the first's end cleared the next's state (its
                # finding was lost and the calls said to wait until the probe after)
                self._probe_since = None
                self._probe_task = None

    def probed(self) -> None:
        """The probe is being taken (see `probe`): count as `leaked` what the core holds beyond
        the calls taken and those started since the probe was sent."""
        since = self._probe_since
        core_counts = self.core_counts
        if since is None or core_counts is None:
            return  # (no probe of ours in flight)
        self._probe_since = None
        started, held = core_counts()
        after = max(0, started - since - 1)  # (the probe itself is one of them, and taken)
        found = max(0, held - self.holding - self.SLACK - after)
        if found > self.leaked:
            self._probed_at = -math.inf  # (confirmed by the next: see `leaked`)
        self._leaks.append(found)
        self._holds_until = min(self._holds_until, self.taken_total + after)

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
    """`handler` (a grpc.RpcMethodHandler) with its calls counted in `backlog` from when it runs
    (where they cannot be counted from the lookup: see `_CountedGeneric`); unchanged where its
    behaviour is not a coroutine or an async generator (grpc.aio runs those on a thread)."""
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
    """A generic handler whose methods' calls are counted from the lookup of their handler,
    which grpc.aio does in the call's task as it takes the call from the core, before its
    request message has come (see `CoreBacklog.take_running`; `counted` outside a task)."""

    def __init__(self, inner: Any, backlog: CoreBacklog) -> None:
        self._inner = inner
        self._backlog = backlog

    def service(self, handler_call_details: Any) -> Any:
        handler = self._inner.service(handler_call_details)
        if handler is None or self._backlog.take_running():
            return handler
        return counted(handler, self._backlog)


class _Probes(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Answers `backlog`'s probes (`CoreBacklog.probe`), counted taken as any call is."""

    def __init__(self, backlog: CoreBacklog) -> None:
        self._backlog = backlog
        self._answer = grpc.unary_unary_rpc_method_handler(_probe_answer)

    def service(self, handler_call_details: Any) -> Any:
        backlog = self._backlog
        if handler_call_details.method != backlog.probe_method:
            return None
        if not backlog.take_running():
            return counted(self._answer, backlog)
        backlog.probed()
        return self._answer


async def _probe_answer(request: bytes, context: Any) -> bytes:
    return b""


class CountingServer:
    """Registers services on a grpc.aio `server` with their calls counted in `backlog`, every
    method as a generic one (see `add_registered_method_handlers`).

    NOTE: calls the handlers did not count looked queued: 50 health Watch streams held open (a
    client-side health check holds one per connection) made 4 clients far below capacity get
    502 expiries and 7,862 refusals."""

    def __init__(self, server: Any, backlog: CoreBacklog) -> None:
        self._server = server
        self._backlog = backlog
        server.add_generic_rpc_handlers((_Probes(backlog),))

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(_CountedGeneric(h, self._backlog) for h in handlers)
        )

    def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
        """`handlers` (method name -> grpc.RpcMethodHandler) of service `name`, registered as a
        generic handler, but the health checks (`PROMPT_METHODS`), registered with gRPC's core
        as such and counted from when they run: they are answered ahead of the calls waiting.

        NOTE: the core holds a call of a method not registered with it in one queue, first in,
        first out, until the loop takes it; a registered method's calls are matched to its own
        requests, at once. In an overload of ModelInfer calls, ServerReady and Health.Check
        waited behind thousands of them: 1-2 s (a Kubernetes probe gives up after 1 s and
        restarts a server that is busy, not broken), 3.7-4.4 s at 2.5x capacity in a
        reproduction; registered, 1.5-5 ms. A call of theirs whose client stalls its message
        is held in the core as a call waiting (it is not taken before its message has come),
        until a probe finds it held for good (`leaked`); where `handlers` come through
        `grpcreads.FirstMessageServer` (as `serve_grpc` registers them), each takes its request
        as a stream and runs at the call's start, so it is counted from then, and ended if its
        message has not come within the read timeout.

        NOTE: grpc.aio runs a registered method's handler without a lookup, once the call's
        message has all come: nothing sees the call taken before then (a call whose client
        stalled looked queued in the core while its connection stayed open; see the module's
        NOTE). A generic lookup is
        a dict's: 64 clients' empty unary calls took 195-314 µs of server CPU a call with
        generic handlers, 289-418 µs with registered ones, 343-370 µs counted so (3 runs each
        on the loaded 2-core VM: no difference above the noise)."""
        prompt = PROMPT_METHODS.get(name, frozenset())
        registered = {m: counted(h, self._backlog) for m, h in handlers.items() if m in prompt}
        if registered:
            self._server.add_registered_method_handlers(name, registered)
        rest = {method: handler for method, handler in handlers.items() if method not in prompt}
        if rest:
            generic = grpc.method_handlers_generic_handler(name, rest)
            self.add_generic_rpc_handlers((generic,))


PROMPT_METHODS = {
    "inference.GRPCInferenceService": frozenset(("ServerLive", "ServerReady", "ModelReady")),
    "grpc.health.v1.Health": frozenset(("Check",)),
}
"""The methods answered ahead of the calls waiting in gRPC's core (see
`CountingServer.add_registered_method_handlers`): liveness and readiness, which orchestrators
poll with short timeouts."""


# (reflection registers its asyncio servicer only on what it takes for a grpc.aio server)
grpc.aio.Server.register(CountingServer)
