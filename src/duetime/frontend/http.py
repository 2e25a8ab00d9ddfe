"""A small HTTP/1.1 server on httptools for the v2 REST API: the fast path of duetime.

One `HttpConnection` per TCP connection. It parses with httptools (but for the bodies of binary
inference requests, which the kernel reads straight into the buffer their tensors are decoded
from: `_DIRECT_BODY_BYTES`), answers pipelined requests in order, supports Content-Length and
chunked bodies and `Expect: 100-continue`, limits header and body sizes, closes idle keep-alive
connections, and pauses reading while too many responses are owed. A connection that drops
cancels its unanswered requests, so they are never run.

What one server takes in is bounded by its `Intake`: open connections (at the limit a new one
closes the longest-idle connection with nothing in flight; with none, it is answered 503 and
closed at once) and the bytes of big request bodies (one that does not fit waits, its
connection paused, until others are answered). Bulk bodies (a MiB or more) are read in turns
and at most a tenth of the loop's time while others are connected, so an upload cannot starve
other clients. A request's head must arrive within `request_read_timeout_s` of its first byte,
and its body must then keep coming at `min_body_rate_bytes_s` or more over each such period
from the head's end; a slower client (slowloris) is answered 408 and closed; a connection that
sends nothing within `request_read_timeout_s` of its accept is closed. The common request pays
for none of this but a few comparisons: one timer per connection checks the read and idle
deadlines, and small bodies are not counted.

A header field sent on several lines is read as one, its values comma-separated (RFC 9110
5.3), but for those that take one value (a second Host, or a Content-Type or
Inference-Header-Content-Length that differs, is refused: 400); an HTTP/1.1 request without
Host is refused (RFC 9112 3.2). A compressed inference body is inflated on the loop up to
`INFLATE_INLINE_BYTES`, the rest on the server's few inflation workers, one body at a time a
connection, reserved in the Intake's budget for big bodies as it grows
(`HttpConnection._inflate`). What the connection
refuses of an inference request counts in duetime_requests_refused_total, as the API's own
refusals do (`HttpConnection._count_refused`).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import errno
import functools
import itertools
import logging
import math
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, TypeVar, cast

import httptools
import numpy as np

from duetime.config import ServerSettings
from duetime.engine import SHUTTING_DOWN
from duetime.errors import ConfigError, DuetimeError
from duetime.execution.affinity import lower_thread_priority
from duetime.frontend import codec, sharedmemory
from duetime.frontend.answersizes import LargestAnswers, distrust
from duetime.frontend.arrival import SocketView, bytes_waiting, tcp_view
from duetime.frontend.rest import (
    INFLATE_INLINE_BYTES,
    BulkReply,
    HeldInfer,
    HttpError,
    Inflation,
    PendingReply,
    Reply,
    RestApi,
    build_bulk,
    error_reply,
    failed_reply,
)
from duetime.observability.logs import log_request
from duetime.observability.tracing import new_trace_id, parse_traceparent
from duetime.overload import LoadShedder
from duetime.requestparams import MAX_DUE_US

if TYPE_CHECKING:  # (not at run time: that module imports onnx)
    from duetime.repository.outputsizes import OutputSizes

log = logging.getLogger("duetime.http")

_MAX_PIPELINED = 64
"""Responses owed on one connection before it stops reading more requests."""

_TURN_BUDGET_S = 0.005
"""How long one turn of the event loop parses what it read before the reads still to come in it
wait for a later turn (`Intake.defers`); those that wait are parsed, oldest first, this long a
turn too (`Intake.wait_turn`), with polls, timers and the models' batches in between.

NOTE: 3,000 connections sending one small mlp request each (1 s timeouts) within 0.1 s were all
parsed and submitted in one turn of about a second: mlp's batches waited for its end (its queue
of 1,024 full: 300-1,700 refused 429, and 1,024 failed in it long past their due time), most of
the rest were due before they reached the scheduler (504), 100-1,260 answered, and a health
check waited 0.75-1.85 s. With the budget (the 2-core VM, shared; 3 runs each, interleaved):
800-3,000 answered, none refused for a full queue nor failed late in it, health checks within
41-89 ms (a GET is parsed at once: see `HttpConnection._cheap_start`)."""

_FEED_BYTES = 16 * 1024
"""A read bigger than this is parsed in pieces this big: once a piece leaves the connection
owing `_MAX_PIPELINED` answers, the rest is kept unparsed (see `HttpConnection._parse`)."""

STALLED_S = 1.0
"""A connection this long into reading a request, its head not complete or its body slower than
`min_body_rate_bytes_s`, is closed before any idle one for a new connection at
`max_connections` (see `HttpConnection.stalled`)."""
IDLE_EVICT_S = 1.0
"""A connection with nothing in flight is closed for a new connection at `max_connections` only
once it has been idle this long (see `Intake.close_one`)."""
_STALLED_LOOKED_AT = 64
"""How many connections reading requests, and waiting for room for their bodies, `Intake.close_one`
looks at, oldest first, at most."""
_KEPT_READING_BYTES = _FEED_BYTES
"""Bytes kept unparsed (waiting for a turn of the loop or for the connection's next quota
period) up to which the connection goes on reading: what comes meanwhile is kept too. Reading
pauses beyond them (TCP then holds the client back).

NOTE: reading paused as soon as a byte was kept. A connection's request that waited for a turn
of a busy loop then cost two more changes to the poll's set (a pause, a resume) and a look at
its socket's state (see `_client_left`), which a client that sends one request at a time never
needed: 15-20 µs a request on the 2-core VM, in a loop already behind its sockets, so at twice
mlp's capacity more requests waited, and each cost more."""

_QUOTA_REQUESTS = 4
_QUOTA_PERIOD_S = 0.01
"""While the loop is busy (its load shedder watching), one connection has at most
`_QUOTA_REQUESTS` pipelined requests (those after the first of a read) read every
`_QUOTA_PERIOD_S`: what it sent beyond them waits unparsed (reading paused beyond
`_KEPT_READING_BYTES`: TCP holds its client back), until its next period (see
`HttpConnection._parse`). A client that waits for each answer before it sends the next request
never meets it, however fast it goes.

NOTE: counted over every request, the quota held back `duetime bench`'s busiest connections (its
free connections are reused most recent first: ~1,000 requests/s each on a few of them), and mlp
at 12,000/s answered 8,200 on time instead of 10,800."""
_BUSY_FEED_BYTES = 2048
"""The pieces a read is parsed in while the loop is busy: the quota is checked between them."""

_TCP_INFO = getattr(socket, "TCP_INFO", None)
_PEER_CLOSED = (7, 8)
"""`tcpi_state` (TCP_INFO's first byte) once the client has closed: TCP_CLOSE (reset),
TCP_CLOSE_WAIT (its FIN came, maybe behind bytes not read yet)."""

_LINGER_S = 2.0
"""After the last response on a connection the server ends, how long it still drains what the
client sends, so the client reads that response rather than a reset (a 413 mid-upload, say)."""

_BULK_BODY_BYTES = 1 << 20
"""Bodies this big are bulk: read in turns at a share of the loop (see `Intake.take_turns`) and
joined on a thread of their own (bytes.join releases the GIL there), so that copying them does
not stall the loop for milliseconds at a time."""

_BULK_SHARE = 0.1
"""While other connections are open, the share of the event loop's time that reading bulk
bodies may take; a lone connection's goes as fast as the loop can read."""

_READ_COST = 2.0
"""The loop's cost of reading a piece of body (not read straight into its buffer), over what
`data_received` measures: the kernel's copy into the read buffer comes before it, unseen, and
httptools' copy into the piece it hands on within it. NOTE: 3.0 while uvloop also copied each
read into a bytes object (measured then: the protocol saw about a third of the thread's time);
2.0 is that measurement less the copy no longer made."""

_DIRECT_BODY_BYTES = 1 << 13
"""Binary inference bodies this big are read by the kernel straight into the aligned buffer the
decoder takes its tensors from (see `get_buffer`).

NOTE: read as other bodies, a body's bytes were copied four times on the event loop before the
model saw them: by uvloop into a bytes object per read, by httptools into the piece it hands on,
by the join of the pieces, and by the decoder to align the tensor. Measured on the 2-core VM
(server on one core, `duetime bench` closed loop with 8 clients on the other), a ReduceMean
model: 602 kB requests (3x224x224 FP32) 1,610 -> 2,590-2,940 answers/s, the loop's CPU per
request 520 -> 245 µs; 49 kB requests (3x64x64, the demo resnet's) 8,280-8,360 -> 8,930-9,380."""

_READ_BUFFER_BYTES = 256 * 1024
"""The buffer other reads land in (one per thread; uvloop's own is as big)."""

_BURST_S = 0.005
"""Loop time bulk bodies may take at once before they are paced."""

_JOIN_NICENESS = 10
"""The joining thread's niceness: on the loop's CPU it must not take turns from the loop."""
T = TypeVar("T")

_DRAIN_COST_S = 1e-9
"""Loop time charged per byte drained after a connection's last response (uvloop's copies): a
client still uploading is drained in turns with bulk bodies, not as fast as the loop can copy."""

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}

_RATE_MEASURE_S = 1.0
"""How long a body must have been read under its reservation before its rate is judged (see
`Intake._refuse_slow_bodies`): its first second comes partly from the socket's buffers."""

_SLOW_CHECK_S = 0.25
"""How often, while bodies wait for room, the bodies holding it are judged."""


@dataclass(frozen=True, slots=True)
class IntakeStatistics:
    """A snapshot of an `Intake`: what is held now, and running totals of what was refused."""

    connections: int
    big_body_bytes: int
    """Bytes of big request bodies held: being read, or read and waiting for their answer."""
    waiting_connections: int
    """Connections paused until the big body they announced fits."""
    refused_connections: int
    """Connections closed at accept because `max_connections` were open."""
    read_timeouts: int
    """Requests that did not arrive in time (408)."""
    send_timeouts: int
    """Connections closed because their client read none of the answers for `idle_timeout_s`."""
    refused_bodies: int
    """Chunked bodies refused (503) because they outgrew the room left for big bodies."""
    answer_bytes: int
    """Bytes of big answers made and not yet read by their clients."""
    waiting_for_answers: int
    """Connections whose next request waits until clients read some of those."""


class Intake:
    """What one HTTP server has taken in and not yet answered, within its limits.

    Shared by the server's connections, owned by the event loop. Bodies of up to
    `small_body_bytes` (`max_inflight_bytes` over `max_connections`) go through uncounted:
    they are what inference sends, and what they hold is bounded by the model queues and the
    pipelining limit. A bigger body's bytes are reserved when its head announces them
    (Content-Length) or as they arrive (chunked), and released when its response is written or
    its connection drops; at most `max_inflight_bytes` are reserved at once. A reservation that
    does not fit waits, in arrival order; one always fits when nothing else is reserved, so
    every body within `max_body_bytes` eventually goes through.

    NOTE: a reservation by the announced length is a promise the body can finish, so bodies
    waiting their turn never deadlock half read; but a slow sender held its promise as long as
    it kept the minimum rate. 17 connections announcing 64 MiB and sending 80 KB/s each (above
    `min_body_rate_bytes_s`, 1.3 MB/s in all) held the whole 1 GiB for 14 minutes, and every
    other body over `small_body_bytes` (a 1 MB inference) waited unread all that while. So
    while a body waits for room, a body holding room must be on course to arrive within
    `request_read_timeout_s`, at the rate it has come since its room was reserved (judged
    after `_RATE_MEASURE_S` of reading, time paused by the server not counted): the slowest
    to finish of those that are not are refused (408), as many as it takes for the waiting
    ones to fit. A waiting body so waits about that long behind slow ones at most; bodies
    sent as fast as that, and every body while none waits, are not affected.

    Answers are bounded alike: the answers connections made that are bigger than
    `small_answer_bytes` (`max_answer_bytes` over `max_connections`) count from when they are
    made until their client has read them (the transport's buffer drained). While they are
    `max_answer_bytes` or more, a connection whose answers may be big (its last one was, or it
    has made none yet) starts no request; it waits, in arrival order, until clients read
    (`_wake_answers`), or, for a request with a due time, until then: it is refused at its due
    time (see `HttpConnection._defer`). Smaller answers go uncounted: a connection stops
    reading requests while its client reads none of its answers, so they are bounded by the
    pipelining limit.

    NOTE: what a request's answer will weigh is known once it is made, so an inference request
    also counts, from its start until its answer is made, what its model's answers are expected
    to weigh if that is big (`expected_answer`: the largest the model made so far; before any,
    what its load-time samples made, or, where its outputs' sizes follow its inputs' values,
    `max_connection_inflight_bytes`). Counted only once made, 40 new connections each asking
    for a 100 MB answer all started while nothing was made yet, and the server held 4 GB of
    answers under a 1 GiB bound (each connection had a first request before its answers' size
    was known; found by a tester).
    """

    def __init__(
        self, settings: ServerSettings, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        """`clock` (s) times the loop's turns (see `defers`)."""
        self.max_connections = settings.max_connections
        self.max_bytes = settings.max_inflight_bytes
        self.max_connection_bytes = settings.max_connection_inflight_bytes
        """What one connection's requests may hold (its HTTP requests: `HttpConnection`'s;
        gRPC requests' bytes read from shared memory: see `sharedmemory.HeldReads`)."""
        self.small_body_bytes = max(1, self.max_bytes // self.max_connections)
        self.max_answer_bytes = settings.max_unsent_answer_bytes
        self.small_answer_bytes = max(1, self.max_answer_bytes // self.max_connections)
        self.answers = 0
        """Bytes of big answers made and not yet read (see the class docstring)."""
        self.expected = 0
        """Bytes big answers are expected to weigh, of the inference requests started whose
        answers are not made yet (see `expected_answer`)."""
        self.unknown_answer_bytes = settings.max_connection_inflight_bytes
        """What an answer is expected to weigh where nothing is known of its model's."""
        self.guess: Callable[[str], int | None] | None = None
        """What a model's answers weigh before it has made one, as far as its load told
        (`Engine.answer_guess`; None: nothing is known before its first answer)."""
        self.answer_sizes = LargestAnswers()
        """The largest answer each model made lately (bytes, as written)."""
        self._answer_waiting: deque[HttpConnection] = deque()
        """Connections waiting for room for their next answer, in order (see `_wake_answers`)."""
        self._answer_waiters: set[HttpConnection] = set()
        self._passing: HttpConnection | None = None
        """The connection let on by `_wake_answers`, while it starts what it may."""
        self._wake_pending = False
        self.connections = 0
        self.silent: dict[HttpConnection, None] = {}
        """Open connections that have sent nothing since accepted, oldest first: the first is
        closed for a new connection at `max_connections`, however young."""
        self.idle: dict[HttpConnection, float] = {}
        """Open connections with nothing in flight between requests, longest idle first, and
        since when (the loop's time): the first, idle `IDLE_EVICT_S` or longer, is closed for a
        new connection at `max_connections`."""
        self.reading: dict[HttpConnection, None] = {}
        """Connections reading a request, in the order they began it: one too slow at it
        (`HttpConnection.stalled`) is closed for a new connection at `max_connections`, before
        any idle one (see `close_one`)."""
        self.evicted_connections = 0
        self.stopping = False
        """The server stops: what its connections were sent is read at once (see
        `HttpConnection.shutdown`), bulk bodies at the loop's pace."""
        self.reserved = 0
        self.refused_connections = 0
        self.read_timeouts = 0
        self.send_timeouts = 0
        self.refused_bodies = 0
        self._waiting: deque[tuple[HttpConnection, int]] = deque()
        """Connections paused until their body's bytes fit, and how many they need."""
        self._paced: deque[HttpConnection] = deque()
        """Bulk-body readers paused until their next turn (see `take_turns`)."""
        self.filling: set[HttpConnection] = set()
        """Connections reading a body whose announced length is reserved (its room held)."""
        self.slow_body_s = settings.request_read_timeout_s
        """While bodies wait, how long a body holding room may still take (see the NOTE)."""
        self._slow_check: asyncio.TimerHandle | None = None
        self._turn_pending = False
        self._clock = clock
        self._reading_turn = False
        self._read_since = 0.0
        """Whether the loop is in a turn that reads, and since when (`_clock`)."""
        self._for_turn: deque[HttpConnection] = deque()
        """Connections whose reads wait for a later turn, oldest first (see `wait_turn`), of
        those that pipeline requests (`HttpConnection.pipelined`)."""
        self._for_turn_first: deque[HttpConnection] = deque()
        """The same, of those that do not: fed in turn with the others, first where both wait."""
        self._first_next = True
        """Whether the next connection fed comes from `_for_turn_first` (where both wait)."""
        self._feeding = False
        self._share = _BULK_SHARE
        self._credit = _BURST_S
        self._refilled = time.monotonic()

    def close_one(self, now: float) -> bool:
        """Close a connection to admit a new one at `max_connections` (`now`: the loop's time):
        one too slow reading its request (`HttpConnection.stalled`, of the
        `_STALLED_LOOKED_AT` that began theirs first), else the longest-idle one with nothing
        in flight, the oldest of those silent since accepted, else the longest-idle keep-alive
        one, idle for `IDLE_EVICT_S` at least (either with no request of its client waiting
        unread; as nginx and Envoy close idle keep-alive connections), else one whose
        request waited longest for room for its body (refused 503); False if none is.

        NOTE: idle ones alone: a client holding 4,100 connections, each with one byte of a
        head (reopening each the server closed within its 10 s for a head), had well-behaved
        clients' keep-alive connections closed and every new one refused 503, for as long as
        it went on: 756 requests lost by a client beside it (found by a tester). Judged by
        silence, a byte every 0.9 s kept a head from it, and a head with a silent body was
        not judged (a second tester)."""
        reading = self.reading
        for connection in list(itertools.islice(reading, _STALLED_LOOKED_AT)):
            if connection.stalled(now) and connection.evict():
                del reading[connection]
                self.evicted_connections += 1
                return True
        # NOTE: a silent one first, however young: none of its requests can be lost (but one
        # on its way), and kept for a second, connections reopened every 0.9 s that sent
        # nothing held every slot (found by a tester)
        silent = self.silent
        while silent:
            connection = next(iter(silent))
            del silent[connection]
            if not connection.unread() and connection.evict():
                self.evicted_connections += 1
                return True
        # NOTE: the longest-idle one whatever its idle time: a keep-alive connection between
        # two requests of a busy client was closed as its next request came (a reset, the
        # request lost: 361 in 10 s of 40 clients at a limit of 16; found by a tester)
        idle = self.idle
        while idle:
            connection, since = next(iter(idle.items()))
            if now - since < IDLE_EVICT_S:
                break  # (the others have been idle for less)
            del idle[connection]
            if not connection.unread() and connection.evict():
                self.evicted_connections += 1
                return True
        # NOTE: connections waiting for room for their bodies held every slot too: a few
        # clients sending bodies as big as `max_inflight_bytes` at just the minimum rate, the
        # rest of their connections waiting behind them, had every new client refused 503
        # (found by a tester): the one that waited longest is refused instead, with 503
        for connection, _size in list(itertools.islice(self._waiting, _STALLED_LOOKED_AT)):
            if connection.waited_for_room(now) and connection.refuse_waiting():
                self.evicted_connections += 1
                return True
        return False

    def fits(self, size: int) -> bool:
        return self.reserved == 0 or self.reserved + size <= self.max_bytes

    def reserve(
        self, connection: HttpConnection, size: int, loop: asyncio.AbstractEventLoop
    ) -> bool:
        """Take `size` bytes now (True), or queue `connection` for `granted` later (False)."""
        if not self._waiting and self.fits(size):
            self.reserved += size
            return True
        self._waiting.append((connection, size))
        if self._slow_check is None:
            self._slow_check = loop.call_later(_SLOW_CHECK_S, self._refuse_slow_bodies, loop)
        return False

    def _refuse_slow_bodies(self, loop: asyncio.AbstractEventLoop) -> None:
        """While bodies wait for room, refuse the bodies holding room that would not arrive
        within `slow_body_s` at their rate, slowest first, until the first waiting body fits
        (each refusal releases its room: `release` lets it on), and none where refusing them
        all would not make it fit; again every `_SLOW_CHECK_S`.

        NOTE: every slow body was refused while anything waited: a 30 MB body coming at
        2.5 MB/s got 408 though the 50 MB body waiting could not fit beside a fast 60 MB one
        in 96 MiB either way (it got its room when the fast one ended, as it would have)."""
        self._slow_check = None
        if not self._waiting:
            return
        now = loop.time()
        slow = []
        for connection in self.filling:
            left_s = connection.body_left_s(now)
            if left_s is not None and left_s > self.slow_body_s:
                slow.append((left_s, connection))
        needed = self._waiting[0][1]
        kept = self.reserved - sum(connection.reserved_bytes for _, connection in slow)
        if slow and kept > 0 and kept + needed > self.max_bytes:
            slow = []  # (refusing them would not let the first waiting body in)
        slow.sort(key=lambda entry: entry[0], reverse=True)
        for left_s, connection in slow:
            if not self._waiting:
                break
            connection.refuse_slow_body(left_s, self.slow_body_s)
        if self._waiting:
            self._slow_check = loop.call_later(_SLOW_CHECK_S, self._refuse_slow_bodies, loop)

    def release(self, size: int) -> None:
        self.reserved -= size
        waiting = self._waiting
        while waiting and self.fits(waiting[0][1]):
            connection, wanted = waiting.popleft()
            self.reserved += wanted
            connection.granted(wanted)

    def take_turns(
        self, connection: HttpConnection, spent: float, loop: asyncio.AbstractEventLoop
    ) -> None:
        """Queue `connection`, paused after reading a piece of a bulk body that took `spent`
        seconds of the loop, for its next read.

        One queued reader is let go per loop turn, in turn, so the other clients wait behind
        one piece of bulk body at most. While other connections are open, bulk bodies also
        share a credit of loop time that refills at `_BULK_SHARE` of real time; when it runs
        out, the next reader waits for it.
        """
        self._charge(spent)
        self._paced.append(connection)
        if not self._turn_pending:
            self._schedule_turn(loop)

    def _turn(self, loop: asyncio.AbstractEventLoop) -> None:
        self._turn_pending = False
        self._charge(0.0)
        if self._credit < 0:
            self._schedule_turn(loop)
            return
        paced = self._paced
        while paced and not paced.popleft().take_turn():
            pass  # that one is gone
        if paced:
            self._schedule_turn(loop)

    def _schedule_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        self._turn_pending = True
        if self._credit >= 0:
            loop.call_soon(self._turn, loop)
        else:
            loop.call_later(-self._credit / self._share, self._turn, loop)

    def _charge(self, spent: float) -> None:
        now = time.monotonic()
        refill = (now - self._refilled) * self._share
        self._credit = min(_BURST_S, self._credit + refill) - spent
        self._refilled = now
        self._share = 1.0 if self.connections <= 1 or self.stopping else _BULK_SHARE

    def defers(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether a read that comes now waits for a later turn of `loop` (`wait_turn`): this
        turn has been reading for `_TURN_BUDGET_S` already. Call it as a read comes."""
        now = self._clock()
        if not self._reading_turn:
            self._reading_turn = True
            self._read_since = now
            loop.call_soon(self._turn_read)  # (after the turn's reads: see `ReadTurn.mark`)
            return False
        return now - self._read_since > _TURN_BUDGET_S

    def _turn_read(self) -> None:
        self._reading_turn = False

    def wait_turn(self, connection: HttpConnection, loop: asyncio.AbstractEventLoop) -> None:
        """Have `connection` parse what it kept unread (`HttpConnection.turn_came`) on a later
        turn of `loop`: waiting connections are fed oldest first, `_TURN_BUDGET_S` a turn, one
        that pipelines requests and one that does not in turn (see `HttpConnection.pipelined`).

        NOTE: in one queue, a connection sending one request at a time waited behind every
        pipelining one, each parsing up to a quota or 64 requests in its turn: beside one
        client writing 200 requests on each of 300 connections, a request due in 20 ms on a
        new connection was read 4.6-12.6 s after it came, and refused then (found by a
        tester). Fed only once no other waited, a pipelining connection got nothing while
        clients sending one request at a time kept coming: 1.8-4.6 s for its 504 beside 150 of
        them (a tester again)."""
        (self._for_turn if connection.pipelined else self._for_turn_first).append(connection)
        if not self._feeding:
            self._feeding = True
            loop.call_soon(self._feed_turn, loop)

    def others_wait(self) -> bool:
        """Whether a connection waits for a turn of the loop (see `wait_turn`)."""
        return bool(self._for_turn_first or self._for_turn)

    def _feed_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        first, rest = self._for_turn_first, self._for_turn
        started = self._clock()
        while (first or rest) and self._clock() - started <= _TURN_BUDGET_S:
            queue = first if first and (self._first_next or not rest) else rest
            self._first_next = queue is rest
            queue.popleft().turn_came()
        if first or rest:  # (called back on the loop's next turn, after its poll)
            loop.call_soon(self._feed_turn, loop)
        else:
            self._feeding = False

    def forget(self, connection: HttpConnection) -> None:
        """Drop `connection`'s queued reservation, if any (it closed or got its body anyway)."""
        for entry in self._waiting:
            if entry[0] is connection:
                self._waiting.remove(entry)
                break
        if not self._waiting and self._slow_check is not None:
            self._slow_check.cancel()
            self._slow_check = None

    def room_for_answer(self, connection: HttpConnection) -> bool:
        """Whether big answers leave room for another now; if not, `connection` waits (its
        `answers_room` is called), behind those that waited first."""
        if (connection is self._passing or not self._answer_waiting) and self._room():
            return True
        if connection not in self._answer_waiters:
            self._answer_waiters.add(connection)
            self._answer_waiting.append(connection)
        return False

    def _room(self) -> bool:
        return self.answers + self.expected < self.max_answer_bytes

    def crowded(self) -> bool:
        """Whether a request that may make a big answer would wait for room now (see
        `room_for_answer`)."""
        return bool(self._answer_waiting) or not self._room()

    def answers_made(self, size: int) -> None:
        self.answers += size

    def expected_answer(self, model: str) -> int:
        """What an answer of `model` is expected to weigh (`LargestAnswers.expected`: what it
        made lately, its `guess`, or `unknown_answer_bytes`), if that is over
        `small_answer_bytes`; else 0."""
        size = self.answer_sizes.expected(model, self.guess, self.unknown_answer_bytes)
        return size if size > self.small_answer_bytes else 0

    def expect(self, size: int) -> None:
        """A request whose answer is expected to weigh `size` (big) bytes started."""
        self.expected += size

    def expected_made(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        """The answer of a request counted by `expect` is made (or never will be): it counts as
        what it weighs from now on (`answers_made`), if big."""
        self.expected -= size
        self._wake_soon(loop)

    def answers_read(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        """`size` counted answer bytes were read (or dropped): waiting connections go on, on
        the loop's next turn (this runs inside another connection's write)."""
        self.answers -= size
        self._wake_soon(loop)

    def _wake_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._answer_waiting and not self._wake_pending:
            self._wake_pending = True
            loop.call_soon(self._wake_answers)

    def _wake_answers(self) -> None:
        """Let waiting connections start requests, in order, while there is room; one that
        cannot for its own reasons (its client reads nothing) tries again when they pass."""
        self._wake_pending = False
        waiting = self._answer_waiting
        while waiting and self._room():
            connection = waiting.popleft()
            self._answer_waiters.discard(connection)
            self._passing = connection
            try:
                connection.answers_room()
            finally:
                self._passing = None

    def holds_back(self, connection: HttpConnection) -> bool:
        """Whether `connection` waits for room for big answers (see `room_for_answer`)."""
        return connection in self._answer_waiters

    def forget_answers(self, connection: HttpConnection) -> None:
        """Drop `connection` from those waiting for room for answers (it closed)."""
        if connection in self._answer_waiters:
            self._answer_waiters.discard(connection)
            self._answer_waiting.remove(connection)

    def statistics(self) -> IntakeStatistics:
        return IntakeStatistics(
            connections=self.connections,
            big_body_bytes=self.reserved,
            waiting_connections=len(self._waiting),
            refused_connections=self.refused_connections,
            read_timeouts=self.read_timeouts,
            send_timeouts=self.send_timeouts,
            refused_bodies=self.refused_bodies,
            answer_bytes=self.answers,
            waiting_for_answers=len(self._answer_waiting),
        )


@dataclass(slots=True, eq=False)
class _Slot:
    """One request's place in the pipeline; `data` is set once its response is encoded."""

    keep_alive: bool
    http10: bool = False
    data: bytes | list[bytes | memoryview] | None = None
    """The encoded response: one piece, or several (a big binary answer's arrays)."""
    pending: PendingReply | None = None
    size: int = 0
    """Big-body bytes reserved in the Intake until the response is written."""
    counted: int = 0
    """Its answer's bytes, counted in the Intake until read, if it is big (see `Intake`)."""
    deferred: tuple[str, bytes, dict[str, str], list[bytes], int] | None = None
    """A request read but not started (method, URL, headers, body pieces, body bytes): the
    connection had `_MAX_PIPELINED` answers owed, or its client was not reading them."""
    arrival_ns: int | None = None
    """For an inference request deferred undecoded: when it arrived (the engine's clock), the
    start of its due time once decoded in its turn (see `HttpConnection._defer`)."""
    dated_ns: int | None = None
    """For a compressed inference request too big to inflate ahead on the loop: when it
    arrived, the start of its due time once started (see `HttpConnection._decode`)."""
    held: HeldInfer | None = None
    """An inference request read but not started, decoded instead (see `_defer`)."""
    expiry: asyncio.TimerHandle | None = None
    """While it has a due time: its refusal then (`HttpConnection._expire`)."""
    started: bool = False
    """Its request was handed to the API (it counts in the connection's `_running`)."""
    one_read: bool = True
    """Its request was read whole by one read (see `ReadTurn.reading`)."""
    first_read: bool = False
    """Its request began in its connection's first read (see `ReadTurn.reading`)."""
    weighed: bool = False
    """The load shedder weighed its request as it was read and let it through: it is not
    weighed again as it starts (see `HttpConnection._complete`)."""
    model: str | None = None
    """The model its inference request names, once started (its answer's size is learned)."""
    expected: int = 0
    """What its answer is expected to weigh, counted in the Intake until it is made (see
    `Intake.expected_answer`)."""
    shaped: tuple[OutputSizes, ...] | None = None
    """Its model's outputs' sizes, where they gave its answer's from its request's shapes (see
    `HttpConnection._sized`), and what they gave (`shaped_size`)."""
    shaped_size: int = 0
    unread: bool = False
    """It waited unstarted only for its bytes to be read (they waited for a turn of a busy loop,
    or for its connection's quota), behind no request of its connection: if due when read, it
    is refused as the server's lateness, not its client's (see `HttpConnection._held_because`)."""


class _ReadBuffer(threading.local):
    """Where a thread's event loop reads what is not read straight into a body (`get_buffer`).

    NOTE: one per thread, not per process: uvloop reads (between `get_buffer` and
    `buffer_updated`) without the GIL, so loops in two threads would read into one buffer."""

    def __init__(self) -> None:
        self.view = memoryview(bytearray(_READ_BUFFER_BYTES))


_READ_BUFFERS = _ReadBuffer()


class HttpConnection(asyncio.BufferedProtocol):
    """The protocol for one client connection (see the module docstring).

    A buffered protocol: reads land in the thread's `_ReadBuffer` and are parsed from there,
    but for big binary inference bodies, which the kernel writes straight into the buffer the
    decoder takes the tensors from (`_direct`)."""

    # NOTE: attribute access is most of what this class costs per request, and with this many
    # attributes an instance dict is measurably slower than slots (0.4 µs a request, measured).
    __slots__ = (
        "_accepted", "_answer_bytes", "_api", "_arrival_of_read", "_awaiting", "_begun_at", "_body",
        "_body_bytes",
        "_bytes_block",
        "_chunked", "_closing", "_connections", "_direct", "_direct_read", "_feed_pending",
        "_filled_from",
        "_filling_since", "_head_done",
        "_header_bytes", "_headers",
        "_held", "_held_since", "_http10", "_idle_timeout", "_in_message", "_in_transport",
        "_inflating",
        "_intake",
        "_last_active", "_last_request",
        "_lingering", "_loop", "_max_body", "_max_header", "_max_held", "_min_rate", "_parser",
        "_pipelined",
        "_promoting", "_quota_read", "_quota_since", "_quota_used", "_read_buffer",
        "_read_from", "_read_timeout", "_reading_paused", "_reads",
        "_rejected", "_replay_arrival", "_reserved", "_running",
        "_sent_checked", "_shed_of", "_shedder", "_slots", "_small_answer", "_small_body",
        "_sock",
        "_stall_since",
        "_start_pending", "_starting",
        "_timer", "_transport", "_turn", "_unparsed", "_unsent", "_unstarted",
        "_upgrading", "_url",
        "_window_bytes",
        "_window_start", "_writing_paused", "_yielding",
    )  # fmt: skip

    def __init__(
        self,
        api: RestApi,
        settings: ServerSettings,
        connections: set[HttpConnection],
        intake: Intake | None = None,
        shedder: LoadShedder | None = None,
    ):
        self._api = api
        self._turn = api.turn
        self._shedder = shedder
        """Refuses its share of inference requests before they reach the API (`_answer`)."""
        self._max_body = settings.max_body_bytes
        self._max_header = settings.max_header_bytes
        self._max_held = settings.max_connection_inflight_bytes
        self._idle_timeout = settings.idle_timeout_s
        self._read_timeout = settings.request_read_timeout_s
        self._min_rate = settings.min_body_rate_bytes_s
        self._connections = connections
        self._intake = intake if intake is not None else Intake(settings)
        self._small_body = min(self._intake.small_body_bytes, self._max_body)
        self._small_answer = self._intake.small_answer_bytes
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._sock: SocketView | None = None
        """The connection's TCP socket, for the kernel's word on when its data came (see
        `ReadTurn.reading`) and on whether its client left (`_client_left`); None on other
        sockets. Detached as the connection is lost."""
        self._accepted = False
        self._reads = 0
        self._quota_since = 0.0
        self._quota_used = 0
        self._quota_read = 0
        """When the connection's current quota period began (the loop's clock), the pipelined
        requests read in it (those after the first of a read), and the read the last request
        came in (see `_QUOTA_REQUESTS`)."""
        self._begun_at = 0
        """The reads so far, and the one the request being read began in."""
        self._pipelined = False
        """Whether the client's last request came in the same read as the one before it, or
        while an answer was owed (it does not wait for answers), rather than alone with none
        owed: its reads that wait for a turn of the loop take turns with those of connections
        that do not (see `Intake.wait_turn`)."""
        self._parser = httptools.HttpRequestParser(self)
        self._read_buffer = _READ_BUFFERS.view
        self._direct_read = False
        """The last `get_buffer` handed out the body's own buffer (`_direct`)."""
        self._read_from = 0.0
        """When it did (perf_counter): the read's time is the kernel's copy of a bulk body."""
        self._slots: deque[_Slot] = deque()
        self._running = 0
        """Slots whose request was started and whose answer is not written yet."""
        self._answer_bytes = self._max_held
        """The size of the connection's last answer made (before any: all of `_max_held`, so
        that one request runs until the first answer's size is known): requests run at once
        while their answers at this size each, and those not yet read, fit `_max_held` (see
        `_full`)."""
        self._unsent = 0
        """Bytes of the connection's big answers made and not yet read by its client, written
        or not (counted in the Intake too)."""
        self._in_transport = 0
        """Those of them written, and still in the transport's buffer when it was last seen."""
        self._starting = False
        self._start_pending = False
        self._unstarted: deque[_Slot] = deque()
        """Slots holding a request not started yet, in order (see `_Slot.deferred`)."""
        self._http10 = False
        """The request being read is HTTP/1.0 (its head is read)."""
        self._reading_paused = False
        self._held_since: float | None = None
        """Since when the server has held this connection's bytes back (reading paused, or
        bytes read kept unparsed: see `_update_reading`); None while it does not. That time is
        not the client's: a request's read timeout and its body's rate do not count it.

        NOTE: it counted reading paused only. Kept unparsed with reading going on, complete
        pipelined requests waiting past a busy loop's turns were refused 408 ("its head was
        not complete"), 231-594 connections of 3,000 with a 1 s read timeout (a tester's)."""
        self._stall_since = 0.0
        """The last check at which the transport's buffer was empty or smaller than before."""
        self._sent_checked = 0
        """The transport's buffered bytes at the last check (see `_send_stalled`)."""
        self._writing_paused = False
        self._closing = False
        self._in_message = False
        """A request's head has begun and its end has not been read yet."""
        self._last_request = False
        """The server stopped while a request was being read: it is answered, then the
        connection closes (see `shutdown`)."""
        self._lingering = False
        """The client ended its side (FIN) with answers owed: they are written, then it closes."""
        self._last_active = 0.0
        self._window_start: float | None = None
        """While a request is being read: when its current read-timeout period began."""
        self._window_bytes: int | None = None
        """Body bytes read when that period began (None: the first period, for the head)."""
        self._timer: asyncio.TimerHandle | None = None
        self._reserved = 0
        """Big-body bytes reserved for the request being read."""
        self._filling_since = 0.0
        self._filled_from = 0
        """When the body being read got its announced length reserved (loop time, moved on by
        the time reading was paused by the server since), and its bytes read then."""
        self._awaiting = 0
        """Big-body bytes the request being read waits for (its connection is paused)."""
        self._held = 0
        """Big-body bytes of this connection's requests read and not yet answered."""
        self._yielding = False
        """Reading a bulk body, paused until the Intake gives this connection its turn."""
        self._bytes_block = False
        """Reading waits: for a reservation, for the loop's next turn, or for `_held` to go
        under the connection's limit."""
        self._upgrading = False
        """The request being read asks to switch protocols and has a body, which the parser
        skipped: it is read past the Upgrade (see `_upgraded`)."""
        self._shed_of: tuple[str, str | None] = ("", None)
        """The model and version named by the last request `_shed` asked the shedder about."""
        self._unparsed = b""
        """Bytes read and not parsed yet: the connection owed `_MAX_PIPELINED` answers (see
        `_parse`; reading stays paused until they are parsed), or they wait for a turn of the
        loop or for the connection's next quota period (paused beyond `_KEPT_READING_BYTES`)."""
        self._replay_arrival: int | None = None
        """While `_unparsed` is parsed: when those bytes arrived."""
        self._feed_pending = False
        self._promoting = False
        self._inflating = False
        """A body of this connection's is being inflated off the loop (see `_inflate`)."""
        self._arrival_of_read = (-1, 0)
        """The read, and the arrival it gave requests it held whole (see `_defer`)."""
        self._reset_message()

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        writer = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport = writer
        intake = self._intake
        # (a stopping server takes every connection its listener held: see `Server.stop`)
        if (
            intake.connections >= intake.max_connections
            and not intake.stopping
            and not intake.close_one(self._loop.time())
        ):
            intake.refused_connections += 1
            self._closing = self._lingering = True  # read nothing
            message = (
                f"the server has {intake.max_connections} connections open, its limit; "
                "retry later, reuse a connection, or use another replica"
            )
            # NOTE: traced but not logged: no request was read, and a flood of connections
            # would be a flood of warnings (the Intake counts them)
            refusal = error_reply(HttpError(503, message, retry_after_s=1.0))
            writer.write(cast(bytes, _encode(refusal, False)))
            writer.close()
            return
        self._connections.add(self)
        intake.connections += 1
        self._accepted = True
        self._sock = tcp_view(writer.get_extra_info("socket"))
        self._last_active = self._stall_since = self._loop.time()
        # NOTE: a connection that sends nothing has `request_read_timeout_s` from its accept for
        # its first request's head, as a request has from its first byte: silent sockets were
        # kept until `idle_timeout_s` (60 s), and enough of them held every connection slot
        # (a well-behaved client got 503 all that while)
        self._window_start, self._window_bytes = self._last_active, None
        intake.silent[self] = None
        self._timer = self._loop.call_later(
            min(self._idle_timeout, self._read_timeout), self._check_timeouts
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        self._intake.silent.pop(self, None)
        self._intake.idle.pop(self, None)
        self._intake.reading.pop(self, None)
        self._free_slot()
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._withdraw()  # the client is gone
        self._drop_reservation()
        self._intake.forget_answers(self)
        if self._in_transport:
            self._unsent -= self._in_transport
            self._intake.answers_read(self._in_transport, self._loop)
            self._in_transport = 0
        self._transport = None
        if self._sock is not None:
            self._sock.detach()
            self._sock = None
        # NOTE: the parser holds this protocol (its callbacks), and this protocol the parser: a
        # cycle only the collector frees, with the last body read, and with the runtime tuning
        # (gc.freeze, a gen-0 threshold of 50,000) it hardly runs. A client opening a connection
        # per request grew the server by a body each: 0.55 MB a connection, 1.4 GB in 2,400.
        self._parser = None  # type: ignore[assignment]
        self._reset_message()  # (the last body read)

    def eof_received(self) -> bool:
        """The client ended its side (FIN): it is gone, as after a reset. The transport closes
        (after what is already written), and `connection_lost` withdraws the requests not
        started yet (counted cancelled, never run); those running finish, their answers
        dropped (`_withdraw`).

        NOTE: RFC 9112 9.6 allows a client to half-close and still read, but the servers
        clients meet take a FIN as the client leaving: Triton (libevent's evhtp) closes the
        connection and drops its requests, nginx takes recv() == 0 with a request pending as
        the client closed (its 499). So do clients: close() and the timeouts of requests and
        tritonclient send FIN, and a request queued behind its due time was run and counted
        succeeded for a client long gone (a tester's; with a reset it was withdrawn). A
        pipelining client that sends FIN after its requests gets the answers written before the
        FIN is read, no more; one that means to read them keeps its side open until it has.
        Withdrawn here, not when the transport has closed: that waits for the client to read
        what was written."""
        self._closing = True
        self._withdraw()  # the client is gone
        self._drop_reservation()
        return False  # (the transport closes)

    def get_buffer(self, sizehint: int) -> memoryview:
        direct = self._direct
        # NOTE: not while bytes are kept unparsed (`_unparsed`): the body's first bytes may be
        # among them, and a read into the body's buffer would land ahead of them. Kept behind
        # the quota of a busy loop, a binary body's pieces were put out of order (answered 200,
        # on a scrambled tensor), or overran its buffer (500) (a tester's)
        if (
            direct is not None
            and not (self._closing and not self._last_request)
            and not self._unparsed
        ):
            self._direct_read = True
            if self._reserved >= _BULK_BODY_BYTES:
                self._read_from = time.perf_counter()
            return direct[self._body_bytes :]
        self._direct_read = False
        return self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if not self._direct_read:
            self.data_received(self._read_buffer[:nbytes])  # type: ignore[arg-type]
        else:
            self._read_in_place(nbytes)

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # the last response is out: discard the rest, in turns
            self._pace(len(data) * _DRAIN_COST_S)
            return
        self._turn.mark(self._loop)
        self._reads += 1
        self._last_active = self._loop.time()
        if self._unparsed:  # (what comes while bytes wait their turn waits too)
            self._unparsed += data
            self._update_reading()
            return
        if self._intake.defers(self._loop) and not self._cheap_start(data):
            self._wait_turn(data)
            return
        bulk = self._reserved >= _BULK_BODY_BYTES  # time it, and pace this connection
        if bulk:
            started = time.perf_counter()
        self._parse(data)
        if bulk and not self._closing:
            self._pace((time.perf_counter() - started) * _READ_COST)

    def _parse(self, data: bytes, turn: bool = False) -> None:
        """Parse `data`, in pieces of `_FEED_BYTES` (`_BUSY_FEED_BYTES` while the loop is busy);
        once the connection owes `_MAX_PIPELINED` answers, keep the rest unparsed (`_unparsed`,
        reading paused) until it owes fewer, and once it has had its quota of a busy loop
        (`_over_quota`), until its next period. `turn`: `data` waited for a turn of the loop;
        once it is seen to pipeline, its connection waits for another turn for the rest while
        others wait for theirs (see `Intake.wait_turn`).

        NOTE: every request of a read was parsed at once, and each inference request decoded
        (`_defer`), however many answers its connection already owed: a client writing 2,000
        pipelined requests on each of 1,000 connections and closing them (reading nothing) had
        the loop decode them all before it saw that they were gone; liveness probes went
        unanswered for 20 s and more. Now a connection holds at most about `_MAX_PIPELINED`
        requests parsed (plus one piece's worth), and those not started stay undecoded."""
        shedder = self._shedder
        busy = shedder is not None and shedder.watching
        if busy and self._quota_used >= _QUOTA_REQUESTS and self._over_quota():
            self._wait_quota(data)
            return
        step = _BUSY_FEED_BYTES if busy or turn else _FEED_BYTES
        end = len(data)
        at = 0
        try:
            while True:
                # NOTE: a turn's connection parsed all it kept, up to 64 requests: as a flood
                # began, 300 pipelining connections not yet known to pipeline were fed one by
                # one, 3 s in all, before a request on a new connection that came meanwhile
                if turn and at and self._pipelined and self._intake.others_wait():
                    self._wait_turn(data[at:])
                    return
                piece = end if end - at <= step else at + step
                self._parser.feed_data(data[at:piece] if at or piece < end else data)
                at = piece
                if (
                    at >= end
                    or (self._closing and not self._last_request)
                    or self._transport is None
                ):
                    return
                if len(self._slots) >= _MAX_PIPELINED:
                    self._unparsed = bytes(data[at:])
                    self._keep_arrival()
                    self._update_reading()
                    return
                if busy and self._over_quota():
                    self._wait_quota(data[at:])
                    return
        except httptools.HttpParserUpgrade as exc:
            self._upgraded(data[at + exc.args[0] : end])
        except httptools.HttpParserError as exc:
            self._parse_failed(exc)

    def _over_quota(self) -> bool:
        """Whether the connection has had its `_QUOTA_REQUESTS` pipelined requests read in its
        current period.

        NOTE: without it, a connection that pipelines had all it sent parsed as it came (up to
        `_MAX_PIPELINED` owed answers, and its refusals are written at once): 30 connections
        writing 20 requests at a time and reading no answer (their answers fill the kernel's
        buffers for seconds before writing blocks) took a busy loop from well-behaved clients,
        and beside an overload of 512 others health checks waited up to 5 s and 4 answers a
        second were on time of 15,000 sent (found by a tester; measured in the commit)."""
        return (
            self._quota_used >= _QUOTA_REQUESTS
            and self._loop.time() - self._quota_since < _QUOTA_PERIOD_S
        )

    def _wait_quota(self, data: bytes) -> None:
        """Keep `data` unparsed until the connection's next quota period, and what comes
        meanwhile (up to `_KEPT_READING_BYTES`); its requests are due from when they arrived
        (`_keep_arrival`)."""
        self._unparsed = bytes(data)
        self._keep_arrival()
        self._feed_pending = True  # (fed by the timer, not by `_update_reading`)
        # (then in a turn of the Intake's, within its budget: each connection's timer fed it
        # at once, and hundreds of them fell due in one turn of the loop)
        self._loop.call_at(
            self._quota_since + _QUOTA_PERIOD_S, self._intake.wait_turn, self, self._loop
        )
        self._update_reading()

    def _cheap_start(self, data: bytes) -> bool:
        """Whether `data` begins a GET (health, metadata: cheap, and what a load balancer's
        probe sends), parsed at once rather than after every read waiting for a turn.

        NOTE: a liveness probe read behind a burst of 3,000 inference requests waited for
        all of them to be parsed (0.3-0.6 s)."""
        between = self._window_start is None or self._reads == 1  # (no request begun)
        return between and data[:4] == b"GET "

    def _wait_turn(self, data: bytes) -> None:
        """Keep `data` unparsed until the Intake gives the connection a turn of the loop
        (`turn_came`), and what comes meanwhile (up to `_KEPT_READING_BYTES`); its requests
        are due from when they arrived (`_keep_arrival`)."""
        self._unparsed = bytes(data)
        self._keep_arrival()
        self._feed_pending = True  # (fed by the Intake, not by `_update_reading`)
        self._intake.wait_turn(self, self._loop)
        self._update_reading()

    @property
    def pipelined(self) -> bool:
        """Whether the client pipelines requests (see `_pipelined`)."""
        return self._pipelined

    def turn_came(self) -> None:
        """Parse what waited for a turn of the loop (the Intake's call; see `_wait_turn`)."""
        self._feed_unparsed()

    def _keep_arrival(self) -> None:
        """Note when the bytes kept unparsed arrived (the current read turn's start, within the
        kernel's word), for the due times of the requests they hold."""
        if self._replay_arrival is not None:  # (kept again: they came as the others did)
            return
        turn = self._turn
        turn.reading(self._sock, True, self._reads == 1)
        try:
            # (the turn is open: `mark` ran for this read, and the time passed is not used)
            self._replay_arrival = turn.arrival_ns(time.monotonic_ns())
        finally:
            turn.done_reading()

    def _feed_unparsed(self) -> None:
        """Parse what was kept unparsed (`_parse`), now that the connection owes fewer answers;
        its requests are due from when they arrived (`_replay_arrival`)."""
        self._feed_pending = False
        data, self._unparsed = self._unparsed, b""
        if (
            not data
            or self._transport is None
            or self._lingering
            or (self._closing and not self._last_request)
        ):
            return
        if self._client_left():
            return
        self._turn.mark(self._loop)
        try:
            self._parse(data, turn=True)
        finally:
            if not self._unparsed:
                self._replay_arrival = None
        if self._unstarted and self._transport is not None:
            self._start_deferred()
        self._update_reading()

    def _parse_failed(self, exc: httptools.HttpParserError) -> None:
        """Answer a request the parser refused (or whose callback raised: 500), then close."""
        if isinstance(exc, httptools.HttpParserCallbackError):
            log.exception("internal error reading an HTTP request")
            if not self._closing:
                self._fail(500, "internal error reading the request; the server logged it")
        elif not self._closing:
            if "HTTP version" in str(exc):  # (llhttp's for HTTP/3.0 or 1.2, say)
                self._fail(505, f"{exc}: send HTTP/1.1 (or 1.0)")
            elif "PRI/Upgrade" in str(exc):
                # NOTE: HTTP/2's connection preface (`PRI * HTTP/2.0`: an h2 client with prior
                # knowledge, or a gRPC client sent to this port) got 400 in llhttp's words,
                # "Pause on PRI/Upgrade", where any other HTTP/2.0 request gets 505 (found by a
                # tester)
                self._fail(505, "HTTP/2 is not supported here: send HTTP/1.1 (or 1.0); gRPC "
                           "is served on the gRPC port")  # fmt: skip
            else:
                self._fail(400, f"malformed HTTP request: {exc}")

    def _upgraded(self, rest: bytes) -> None:
        """The parser stopped at the end of a request's head that asks to switch protocols
        (`Upgrade`, with `Connection: upgrade`); `rest` is what followed the head in this read.
        The request is answered as plain HTTP/1.1 (RFC 9110 7.8: a server may ignore Upgrade),
        then the connection closes once the owed answers are out: the parser cannot read past
        the head, and what the client sends after it may be the other protocol's.

        NOTE: httptools has llhttp skip the body of such a request (its on_headers_complete
        says so): `curl --http2` on an http:// URL sends `Upgrade: h2c` with its POST, and the
        request reached the API without its body (400, 'not valid JSON: zero-length'). A
        parser of its own reads that body: it is given a head that frames the same body and
        closes the connection (no request of its own: `_BodyPastUpgrade`), then `rest`."""
        if not self._upgrading or self._closing:
            self.shutdown()
            return
        self._upgrading = False
        length = self._headers.get("content-length")  # (digits: llhttp refuses others)
        framing = (
            b"Transfer-Encoding: chunked" if length is None else b"Content-Length: %d" % int(length)
        )
        method = self._parser.get_method()
        parser = self._parser = httptools.HttpRequestParser(_BodyPastUpgrade(self))
        try:
            parser.feed_data(
                b"%s / HTTP/1.1\r\n%s\r\nConnection: close\r\n\r\n" % (method, framing)
            )
            parser.feed_data(rest)
        except httptools.HttpParserError as exc:
            self._parse_failed(exc)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._in_transport:
            self._sent()
        if self._unstarted:
            self._start_deferred()
        self._update_reading()

    # -- httptools callbacks -------------------------------------------------------------------

    def _reset_message(self) -> None:
        self._url = b""
        self._headers: dict[str, str] = {}
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._chunked = False
        self._head_done = False
        self._rejected = False
        self._direct: memoryview | None = None
        """The body's own buffer while the kernel reads it straight there (see `_go_direct`)."""

    def on_message_begin(self) -> None:
        intake = self._intake
        intake.silent.pop(self, None)
        intake.idle.pop(self, None)
        intake.reading[self] = None
        self._reset_message()
        self._in_message = True
        self._begun_at = self._reads
        self._window_start = self._last_active
        self._window_bytes = None

    def on_url(self, url: bytes) -> None:
        self._url += url
        # (`_count_header` written out but for the refusal, as in `on_header`)
        size = self._header_bytes = self._header_bytes + len(url)
        if size > self._max_header:
            self._count_header(0)

    def on_header(self, name: bytes, value: bytes) -> None:
        # NOTE: `_count_header` written out but for the refusal: this runs for every header
        size = self._header_bytes = self._header_bytes + len(name) + len(value)
        if size > self._max_header:
            self._count_header(0)
        elif not (self._rejected or self._head_done):  # (after the head: a chunked trailer)
            key = name.decode("latin-1").lower()
            headers = self._headers
            if key in headers:  # (a lookup: 8 ns a header, measured)
                self._repeated(key, value.decode("latin-1"))
            else:
                headers[key] = value.decode("latin-1")

    def _repeated(self, name: str, value: str) -> None:
        """A field line for `name` that the head already had: combined with the ones before
        (RFC 9110 5.3: as if their values came on one line, comma-separated), but for a field
        that takes one value (`_SINGLE_FIELDS`): the request is refused (400) where the values
        differ, and where it is a second Host (RFC 9112 3.2), whatever its value.

        NOTE: the last line's value was kept alone: `Transfer-Encoding: gzip` then
        `Transfer-Encoding: chunked` framed the body as chunked and handed it on still
        compressed (a 400 "not valid UTF-8" in place of the 501 of one line saying
        `gzip, chunked`); two `Content-Encoding: gzip` lines were decoded once (the one line
        `gzip, gzip` gets 415); two different `Inference-Header-Content-Length` values, the
        last was used (found by a tester)."""
        headers = self._headers
        if name not in _SINGLE_FIELDS:
            headers[name] = f"{headers[name]}, {value}"
        elif (name == "host" or headers[name] != value) and not self._closing:
            self._fail(400, f"header '{name}' is sent more than once; send it once")

    def on_headers_complete(self) -> None:
        self._head_done = True
        # NOTE: the body's first window opens here: it opened at the next read-timeout check,
        # so a body that stopped right after its head got its 408 after two read timeouts, not
        # one (found by a tester)
        self._window_start, self._window_bytes = self._last_active, self._body_bytes
        if self._rejected or (self._closing and not self._last_request):
            return
        version = self._parser.get_http_version()
        self._http10 = version == "1.0"
        if version != "1.1" and not self._http10:
            # NOTE: llhttp reads 'HTTP/2.0' and a request line with no version (HTTP/0.9); both
            # were answered as HTTP/1.1
            self._fail(505, f"HTTP/{version} is not supported here; send HTTP/1.1 (or 1.0)")
            return
        headers = self._headers
        refusal = host_refusal(headers.get("host"), self._http10)
        if refusal is not None:  # (a second Host is refused as it is read: `_repeated`)
            self._fail(400, refusal)
            return
        coding = headers.get("transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            # NOTE: llhttp takes the last coding, chunked, for the framing: the body would reach
            # the API still compressed (RFC 9112: 501 for a transfer coding not understood)
            self._fail(501, f"Transfer-Encoding '{coding}' is not supported: send 'chunked' alone "
                       "(compress with Content-Encoding: gzip or deflate)")  # fmt: skip
            return
        expect = headers.get("expect")
        if expect is not None and not self._http10 and _expectations(expect) - _CONTINUE:
            # NOTE: an expectation not met was not answered: the client waited for a 100 that
            # never came (RFC 9110 10.1.1: a server may answer 417 to one it does not know;
            # found by a tester)
            self._fail(417, f"the expectation {expect!r} cannot be met here: send "
                       "'Expect: 100-continue' or none (RFC 9110 10.1.1)")  # fmt: skip
            return
        length = headers.get("content-length")
        if "upgrade" in headers and self._parser.should_upgrade():  # (its body: see `_upgraded`)
            self._upgrading = coding is not None or length is not None
        if length is None:
            self._chunked = True  # (or no body): counted once it outgrows a small body
        else:
            try:
                size = int(length)
            except ValueError:  # llhttp refuses such a length before this
                size = 0
            if size > self._small_body and not self._big_body(size, length):
                return
            if size >= _DIRECT_BODY_BYTES and "upgrade" not in headers:
                self._go_direct(size)
        if "expect" in headers:
            self._continue()

    def _go_direct(self, size: int) -> None:
        """Have the body of `size` bytes read into the buffer its tensors will be decoded from,
        if it is a binary inference request's: laid out so that its first tensor starts at a
        multiple of `codec.ALIGNMENT` (as `_join_aligned` lays out a bulk body)."""
        at = _binary_start(self._parser.get_method().decode("latin-1"), self._url, self._headers)
        if at is None:
            return
        self._direct = _aligned_body(size, at).data

    def _read_in_place(self, nbytes: int) -> None:
        """The kernel wrote `nbytes` more of the body into `_direct` (the parser sees none)."""
        self._turn.mark(self._loop)
        self._reads += 1
        self._last_active = self._loop.time()
        got = self._body_bytes = self._body_bytes + nbytes
        direct = self._direct
        assert direct is not None
        if got < len(direct):
            if self._reserved >= _BULK_BODY_BYTES:
                self._pace(time.perf_counter() - self._read_from)
            return
        # NOTE: the parser still waits for the body: the next request goes to a new one, and
        # the old one tells how this one ends (its method, keep-alive, upgrade)
        parser = self._parser
        self._parser = httptools.HttpRequestParser(self)
        self._complete(parser)

    def on_body(self, body: bytes) -> None:
        if self._rejected or (self._closing and not self._last_request):
            return
        self._body_bytes += len(body)
        if self._body_bytes > self._max_body:
            self._fail(413, f"body is over the {self._max_body}-byte limit")
            return
        if self._chunked and self._body_bytes > self._small_body and not self._big_chunk(body):
            return
        direct = self._direct
        if direct is not None:  # (the part of the body read with its head)
            direct[self._body_bytes - len(body) : self._body_bytes] = body
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._upgrading:  # its head only: the body follows (see `_upgraded`)
            return
        self._complete(self._parser)

    def _complete(self, parser: httptools.HttpRequestParser) -> None:
        """The request `parser` read the head of is read whole: weighed by the load shedder
        (an inference request), then refused, started, or queued."""
        direct, self._direct = self._direct, None
        if direct is not None:
            self._body = [direct]  # type: ignore[list-item]
        self._in_message = False
        self._window_start = None
        self._intake.reading.pop(self, None)
        if self._quota_read == self._reads:  # (one more of the same read: pipelined)
            self._pipelined = True
            now = self._loop.time()
            if now - self._quota_since >= _QUOTA_PERIOD_S:
                self._quota_since, self._quota_used = now, 0
            self._quota_used += 1
        else:
            self._quota_read = self._reads
            if self._slots:  # (sent before the last answer was written)
                self._pipelined = True
            elif self._begun_at == self._reads:  # (alone: begun in this read, none owed)
                self._pipelined = False
        if self._rejected or (self._closing and not self._last_request):
            return
        self._last_request = False
        method = parser.get_method().decode("latin-1")
        # (a request asking to upgrade is the connection's last: its answer says so; see
        # `_upgraded`. It said nothing, then the connection closed under a keep-alive client)
        keep_alive = parser.should_keep_alive() and not (
            "upgrade" in self._headers and parser.should_upgrade()
        )
        if (
            keep_alive
            and self._http10
            and (_asks_close(self._headers) or "transfer-encoding" in self._headers)
        ):
            # NOTE: llhttp has an HTTP/1.0 request that says keep-alive kept open though it
            # says close too ('close, keep-alive', or on two lines): RFC 9112 9.3, close wins
            # in any version (found by a tester). So it did one framed by Transfer-Encoding,
            # which RFC 9112 6.1 has a server read as faulty framing and close after: an
            # HTTP/1.0 hop knows no chunked, and may frame those bytes otherwise (found by a
            # tester)
            keep_alive = False
        if method == "CONNECT":
            # NOTE: routed as any: `CONNECT x:80` (authority-form) got 404 for a path '/x:80'
            # it never sent, and its connection (llhttp reads no further after a CONNECT)
            # closed though its answer did not say so (found by a tester). This server is no
            # proxy: no target takes CONNECT (RFC 9110 9.3.6, 501 for a method not implemented)
            self._fail(501, "the method CONNECT is not supported here: this is no proxy; "
                       "send the API's requests to it directly")  # fmt: skip
            return
        weighed = False
        refusal: HttpError | None = None
        shedder = self._shedder
        if (
            shedder is not None
            and (shedder.share or shedder.watching)
            and self._api.accepting  # (once the server stops, 503: see `shutdown`)
            and len(self._body) == 1
            and _is_infer(method, self._url)
        ):
            # NOTE: weighed as it is read, not as it starts: a request parsed from bytes that
            # waited for a turn of the loop (or behind answers owed) was decoded, held and,
            # mostly, refused as expired at its due time, the shedder never asked. Once the
            # loop's turns ran past their budget, mlp at twice its capacity stayed there for
            # seconds: ~2,000 requests/s decoded for nothing, 0-40 answers/s on time
            refusal = self._shed(self._url, self._headers, self._body[0], due=True)
            if refusal is not None:
                if (
                    not self._slots
                    and keep_alive
                    and not (self._reserved or self._awaiting or self._full())
                    and self._small_answer >= _shed_size()
                ):
                    self._shed_at_once(refusal)
                    return
            else:
                weighed = True
        slot = _Slot(keep_alive, self._http10)
        slot.one_read = self._begun_at == self._reads
        slot.first_read = self._begun_at == 1
        slot.weighed = weighed
        if self._reserved or self._awaiting:
            self._hold(slot)
        self._slots.append(slot)
        if not slot.keep_alive:  # requests pipelined after the last one are not run
            self._closing = True
        if refusal is not None:  # (in its turn; never started: it holds no running one's place)
            self._shed_in_turn(slot, self._url, self._headers, self._body[0], refusal)
        elif (behind := bool(self._unstarted) or self._full(method, self._url)) or (
            self._replay_arrival is not None
        ):
            # NOTE: one read can hold many pipelined requests (pausing reading stops only the
            # next read): beyond the owed answers allowed, or while the client is not reading
            # its answers, a request waits here unstarted (its answer would pile up unsent);
            # behind one waiting, every later one waits too (they start in order). Those
            # parsed from bytes kept unparsed wait too, to start dated from their arrival
            slot.unread = not behind
            self._defer(slot, method)
        else:
            self._start(slot, method, self._url, self._headers, self._body, self._body_bytes)
        self._update_reading()

    def _due(
        self, model: str, version: str | None, headers: Mapping[str, str], body: bytes
    ) -> bool:
        """Whether the inference request just read, of `model` and `version` (served), is
        refused for its due time, where the load shedder let it through: the loop is saturated
        (`LoadShedder.saturated`), and its `timeout` (read from its JSON head, undecoded) is no
        longer than the loop's lag (the time since the earliest the loop can tell the request
        came: `ReadTurn.arrival_ns`, or when its bytes kept unparsed came) plus what requests of
        its model queued early in a turn of the loop waited lately for their answers, where its
        instances run on the loop (`ModelScheduler.turn_wait_ns`): it would be due before its
        answer. Priority 1 is spared (refused last, as the shedder refuses it).

        NOTE: the shedder refuses a share of every class of requests alike; a saturated loop's
        turns last longer than a tight due time, so most of the tight ones it let through were
        decoded, then refused as due (504) or expired in the queue, while it refused others it
        could have answered. mlp on the 2-core VM, 2/10 ms due times half each, 10 s runs
        interleaved with the code before this: at 8,400 requests/s (about 200% of capacity)
        4,192 and 4,172 answers a second on time against 2,826 and 2,902; at 12,600/s 2,503
        against 1,969; at 4,200/s (100%) 4,111 against 3,915. The 2 ms requests are then
        refused nearly all above capacity (they were 21% answered at 200%).
        NOTE: refused by the lag alone, requests read with less time left than their wait for
        the turn's dispatch were decoded, admitted (admission predicts the model's runs, not the
        loop's turns its batches wait for), and expired in the queue: mlp on the 2-core VM at
        19,000 requests/s, ~950 a second. With the turn's wait counted (15 s runs, interleaved):
        at 18,700/s 8,339 and 8,463 answers a second on time, against 7,271 and 7,059 with the
        lag alone (at 19,000/s); 1.5 times the wait gave 7,786 and 7,739, and 1.5 times the
        wait of each batch's first request from admission to answer (all models', threaded
        too) 7,630 and 8,022. That last one refused resnet's requests at twice its capacity
        nearly all (its batches' waits are its due times' length: admission fills the queue so
        far), 500-630 answers a second on time against 1,440 at capacity.
        NOTE: the first `"timeout"` key of the head's first `_DUE_SCAN` bytes is taken for the
        request's (an input's own `timeout` parameter would be taken for it: the shedder then
        refuses that request, where it refuses some requests at random anyway)."""
        shedder = self._shedder
        assert shedder is not None
        if not shedder.saturated:
            return False
        end = _json_head_end(headers, body)
        found = None if end is None else _DUE_TIMEOUT.search(body, 0, min(end, _DUE_SCAN))
        if found is None or not 0 < (timeout := int(found[1])) <= MAX_DUE_US:  # (0: none)
            return False
        now = time.monotonic_ns()
        arrival = self._replay_arrival  # (kept unparsed: see `_keep_arrival`)
        if arrival is None:
            arrival = self._turn.arrival_ns(now)
        wait = self._api.engine.registry.turn_wait_ns(model, version or None)
        return timeout * 1000 <= now - arrival + wait and not _priority_one(headers, body)

    def _shed_at_once(self, refusal: HttpError) -> None:
        """Write the shedder's `refusal` of the request just read, owing no answer before it
        (`_complete`): at once, with no slot in the connection's pipeline.

        NOTE: at overload most requests are refused, and a refusal that went through the
        pipeline (a slot made, started, answered, flushed) cost 10-15% more than this. A
        refusal bigger than a small answer (`Intake`) still goes through it, to be counted."""
        headers = self._headers
        reply = _shed_reply(True, self._http10, headers, *self._shed_of, refusal)
        transport = self._transport
        assert transport is not None
        self._answer_bytes = len(reply)
        transport.write(reply)
        self._record_shed(self._url, headers, self._body[0], refusal)
        if not self._unparsed and not self._closing:
            self._intake.idle[self] = self._loop.time()  # (nothing in flight: see `close_one`)
        self._update_reading()

    def _shed_in_turn(
        self, slot: _Slot, url: bytes, headers: Mapping[str, str], body: bytes, refusal: HttpError
    ) -> None:
        """`slot`'s answer is the shedder's `refusal`, written in its turn."""
        reply = _shed_reply(slot.keep_alive, slot.http10, headers, *self._shed_of, refusal)
        self._made(slot, reply)
        self._record_shed(url, headers, body, refusal)

    def _record_shed(
        self, url: bytes, headers: Mapping[str, str], body: bytes, refusal: HttpError
    ) -> None:
        """Record a request the shedder refused unread (`refusal`) in a traffic capture, if one
        is on."""
        recorder = self._api.engine.recorder
        if recorder is not None:
            recorder.refused_unread("http", url, body, headers, refusal)

    def _full(self, method: str = "POST", url: bytes | None = None) -> bool:
        """Whether the connection runs as many requests as it may: `_MAX_PIPELINED` answers
        owed, its client not reading them, or no room within `_max_held` for one more answer
        the size of its last beside those running (as big each) and those made and not yet
        read (a client pipelining requests for 100 MB answers and reading none ran them all:
        gigabytes held for it); nor, when its answers are big, within the server's
        (`Intake.room_for_answer`), unless the next request's answer (`method`, `url`; where
        not known, an inference's) is small whatever it asks (`_answers_small`); nor while a
        body of its is inflated off the loop (one at a time a connection: see `_inflate`).

        NOTE: a new connection's answers count as big until it has made one, and its health
        probe, metadata GET and small inference all waited behind other clients' big answers
        unread: a few clients not reading 40 MB answers failed every liveness probe (a new
        connection each) for the minute until the idle timeout dropped them (a tester)."""
        running = self._running
        if running >= _MAX_PIPELINED or self._writing_paused or self._inflating:
            return True
        estimate = self._answer_bytes
        owed = self._unsent + running * estimate
        if owed and owed + estimate > self._max_held:
            return True
        intake = self._intake
        if estimate <= self._small_answer and (
            url is None or not intake.crowded() or not self._expects_big(url)
        ):
            return False
        return not _answers_small(method, url) and not intake.room_for_answer(self)

    def _expects_big(self, url: bytes) -> bool:
        """Whether `url` is an inference of a model whose answers are expected big (see
        `Intake.expected_answer`): it waits for room for them, whatever this connection's
        answers weighed so far."""
        target = self._api.infer_target(url)
        return target is not None and self._intake.expected_answer(target[0]) > 0

    def _expect(self, slot: _Slot, model: str) -> None:
        """`slot`'s inference request of `model` starts: what its answer is expected to weigh
        counts in the Intake until it is made, if big (see `Intake.expected_answer`)."""
        slot.model = model
        intake = self._intake
        expected = intake.expected_answer(model)
        if expected:
            slot.expected = expected
            intake.expect(expected)

    def _defer(self, slot: _Slot, method: str) -> None:
        """Queue the request just read (into `slot`) to start once the connection may. An
        inference request is dated now, as it is read, and kept undecoded until it is the next
        to start (`_promote`): decoded then (`RestApi.hold_back`), its due time counts from
        its arrival, and once that passes the request is refused at once (`_expire`), never
        run.

        NOTE: it waited unstarted past its due time, dated from when it started: behind 4 MB
        answers unread (max_unsent_answer_bytes 1 MiB), a request due in 100 ms had no answer
        after 3 s, and was run once its turn came, as if just arrived. A body in pieces too big
        to join on the loop (`_BULK_BODY_BYTES`: JSON of a MiB or more) is decoded once started,
        as before; its due time then counts from when it started, with the kernel's word on
        its arrival (see `ReadTurn.reading`).

        NOTE: every request held back was decoded as it was read: a connection's pipelined
        backlog held the loop (JSON decoding) however many answers it owed, and for clients
        already gone (see `_parse`). Only the first waiting is decoded now, so that it is
        refused at its due time while it waits; the others are decoded in their turn (one
        already due then is refused as expired), or dropped undecoded with their connection."""
        url, headers, chunks, size = self._url, self._headers, self._body, self._body_bytes
        slot.deferred = (method, url, headers, chunks, size)
        self._unstarted.append(slot)
        if _is_infer(method, url) and (len(chunks) == 1 or size < _BULK_BODY_BYTES):
            arrival = self._replay_arrival
            if arrival is None and slot.one_read and self._arrival_of_read[0] == self._reads:
                arrival = self._arrival_of_read[1]  # (as the others read whole by this read)
            elif arrival is None:
                turn = self._turn
                turn.reading(self._sock, slot.one_read, slot.first_read)
                try:
                    # (the turn is open: `mark` ran for this read; the time passed is unused)
                    arrival = turn.arrival_ns(time.monotonic_ns())
                finally:
                    turn.done_reading()
                if slot.one_read:
                    self._arrival_of_read = (self._reads, arrival)
            slot.arrival_ns = arrival
            if len(self._unstarted) == 1:
                self._promote()

    def _promote(self) -> None:
        """Decode the first waiting request if it is an inference request kept undecoded (see
        `_defer`): held, with its refusal at its due time (`_expire`), or answered at once
        where it cannot be decoded or is already due; then the next, and so on."""
        if self._promoting:
            return
        self._promoting = True
        unstarted = self._unstarted
        try:
            while unstarted and self._transport is not None:
                slot = unstarted[0]
                if slot.arrival_ns is None:
                    return
                self._decode(slot)
        finally:
            self._promoting = False

    def _decode(self, slot: _Slot) -> None:
        """Decode the inference request `slot` holds undecoded (the first waiting), dated from
        its arrival: it is held (and refused at its due time), or answered now (it cannot be
        decoded, or it is already due)."""
        deferred, arrival = slot.deferred, slot.arrival_ns
        assert deferred is not None
        assert arrival is not None
        slot.arrival_ns = None
        method, url, headers, chunks, _ = deferred
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)  # (see `_start`)
        held: HeldInfer | Reply | None
        if "content-encoding" in headers:
            # NOTE: a compressed request was not dated as it was read (for every gzip client):
            # its due time counted from when it started, and it was never refused while it
            # waited. Inflated here if its body is small (as `_inflate` would inline), else
            # dated from its arrival once started (found by a reviewer)
            ahead = self._inflate_ahead(url, headers, body)
            if ahead is None:
                slot.dated_ns = arrival
                return
            if isinstance(ahead, Reply):
                held = ahead
            else:
                with self._charged(slot):
                    held = self._api.hold_back(method, url, ahead[0], ahead[1], arrival_ns=arrival)
        else:
            with self._charged(slot):
                held = self._api.hold_back(method, url, headers, body, arrival_ns=arrival)
        if held is None:  # (not one the API decodes ahead: handled whole once started)
            return
        slot.deferred = None
        if isinstance(held, Reply):  # (it cannot be decoded: answered in its turn)
            self._unstarted.remove(slot)
            if not self._unstarted:
                self._intake.forget_answers(self)
            self._made(slot, _encode(held, self._keep_alive(slot), slot.http10))
            return
        slot.held = held
        if held.due_ns is not None:
            left_s = self._api.time_left_s(held.due_ns)
            if left_s <= 0:
                self._expire(slot)
            else:
                slot.expiry = self._loop.call_later(left_s, self._expire, slot)

    def _inflate_ahead(
        self, url: bytes, headers: dict[str, str], body: bytes
    ) -> tuple[dict[str, str], bytes] | Reply | None:
        """A waiting compressed inference request's headers (but Content-Encoding) and body
        inflated, if it inflates to `INFLATE_INLINE_BYTES` or less; its error reply if it
        cannot be inflated; None if it inflates to more (inflated once started: `_inflate`).
        A coding not served is left to the API (415): its headers and body as they came."""
        inflated = self._inflate_inline(url, headers, body)
        if inflated is None:
            return headers, body
        if isinstance(inflated, Reply):
            return inflated
        if isinstance(inflated, Inflation):
            return None  # (it inflates past the inline part: once started, see `_inflate`)
        return _without_coding(headers), inflated

    def _inflate_inline(
        self, url: bytes, headers: Mapping[str, str], body: bytes
    ) -> bytes | Reply | Inflation | None:
        """The first step of undoing an inference request's Content-Encoding, on the loop: its
        body inflated, if that takes `INFLATE_INLINE_BYTES` or less; the Inflation to go on with
        off the loop if it takes more; its refusal if it cannot be inflated; None for a coding
        not served (the API answers 415). Shared by `_inflate_ahead` and `_inflate`."""
        try:
            inflation = Inflation(body, headers["content-encoding"], self._max_body)
        except DuetimeError:
            return None
        try:
            data = inflation.step(INFLATE_INLINE_BYTES)
        except DuetimeError as exc:
            return self._api.refuse_infer(url, headers, exc)
        return inflation if data is None else data

    def _expire(self, slot: _Slot) -> None:
        """`slot`'s request, held back, is due: refused as its scheduler refuses a request due
        before it is queued (`RestApi.refuse_held`), and never started. Its answer goes out in
        its turn, after those of the requests before it (HTTP/1.1 answers in order)."""
        slot.expiry = None
        held = slot.held
        if held is None or self._transport is None:
            return
        assert held.due_ns is not None
        left_s = self._api.time_left_s(held.due_ns)
        if left_s > 0:  # (a timer may fire a little early: uvloop's count whole ms)
            slot.expiry = self._loop.call_later(left_s, self._expire, slot)
            return
        slot.held = None
        self._unstarted.remove(slot)
        reply = self._api.refuse_held(held, self._held_because(slot))
        if not self._unstarted:
            self._intake.forget_answers(self)
        self._made(slot, _encode(reply, self._keep_alive(slot), slot.http10))
        self._promote()  # (the next waiting is the first now)

    def _held_because(self, slot: _Slot) -> str:
        """Why `slot`'s request waited unstarted, and what to do about it."""
        if slot.unread:
            # (its client owed nothing: the words below blamed one that did all it should,
            # found by a tester)
            return (
                "it waited to be read behind other requests (the server is overloaded); send "
                "a larger timeout or retry later"
            )
        intake = self._intake
        if intake.holds_back(self):
            return (
                f"answers not yet read by their clients fill the {intake.max_answer_bytes} "
                "bytes the server holds for them (server setting max_unsent_answer_bytes, "
                "--max-unsent-answer-bytes); retry with a later due time, or once clients read "
                "their answers"
            )
        return (
            "its client had not read the answers to the requests before it on its connection "
            f"(the server runs no more while one owes {_MAX_PIPELINED} answers, or answers over "
            f"{self._max_held} bytes: max_connection_inflight_bytes); read answers as they "
            "come, or retry with a later due time"
        )

    def answers_room(self) -> None:
        """The Intake has room for big answers again: start what waits (the Intake's call)."""
        if self._unstarted and self._transport is not None:
            self._start_deferred()
            self._update_reading()

    def _start(
        self,
        slot: _Slot,
        method: str,
        url: bytes,
        headers: dict[str, str],
        chunks: list[bytes],
        body_bytes: int,
    ) -> None:
        self._running += 1
        slot.started = True
        if method == "POST":
            target = self._api.infer_target(url)
            if target is not None:
                self._expect(slot, target[0])
        if len(chunks) == 1:
            self._answer(slot, method, url, headers, chunks[0])
        elif body_bytes < _BULK_BODY_BYTES:
            self._answer(slot, method, url, headers, b"".join(chunks))
        else:
            self._join_off_loop(slot, method, url, headers, chunks)

    def _start_held(self, slot: _Slot) -> None:
        """Start the inference request decoded when it was held back (see `_defer`)."""
        held, slot.held = slot.held, None
        assert held is not None  # (an unstarted slot holds its request one way or the other)
        if slot.expiry is not None:
            slot.expiry.cancel()
            slot.expiry = None
        self._running += 1
        slot.started = True
        self._expect(slot, held.request.model)
        shedder = self._shedder
        if (
            not slot.weighed
            and shedder is not None
            and (shedder.share or shedder.watching)
            and self._shed_held(held)
        ):
            request = held.request
            reply = _shed_reply(
                slot.keep_alive, slot.http10, request.headers, request.model, request.version
            )
            self._made(slot, reply)
            recorder = self._api.engine.recorder
            if recorder is not None and recorder.sampled():  # (decoded: recorded as any)
                with contextlib.suppress(HttpError):
                    recorder.record(held.request, _shed_submit)
            return
        self._answered(slot, self._api.start_held(held))

    def _client_left(self) -> bool:
        """Whether the client has closed its side (FIN or reset) though reading is paused, by
        the kernel's word (TCP_INFO); if so the connection is closed as on `eof_received`: its
        requests not started are withdrawn (counted cancelled, never run).

        NOTE: while a connection owes `_MAX_PIPELINED` answers it reads nothing, so it does not
        see its client's FIN behind the requests not read: a client that pipelined 2,000
        requests and closed had them started as answers were written (64 at a time) until a
        write failed, for no one; a flood of such connections held the loop for 20 s and more.
        Asked before waiting requests start (a read of a few µs), and only while reading is
        paused: a connection that reads sees its client's FIN itself (`eof_received`), and a
        pipelining client's every answer would otherwise cost a system call."""
        sock = self._sock
        if sock is None or _TCP_INFO is None or not self._reading_paused:
            return False
        try:
            state = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 1)[0]
        except (OSError, IndexError):
            return False
        if state not in _PEER_CLOSED:
            return False
        self.eof_received()
        self.close_now()
        return True

    def _start_deferred(self) -> None:
        """Start the requests waiting unstarted, in order, while the connection may.

        NOTE: a request answered at once (a refusal, metadata) flushes, which calls this again:
        that inner call returns at once and this loop goes on (no recursion per request)."""
        if self._starting or self._client_left():
            return
        self._starting = True
        unstarted = self._unstarted
        try:
            while unstarted and not self._full(*_next_request(unstarted[0])):
                if self._transport is None or self._lingering:  # (the client is gone)
                    return
                if unstarted[0].arrival_ns is not None:  # (kept undecoded: see `_defer`)
                    self._promote()
                    if unstarted and unstarted[0].arrival_ns is not None:
                        return  # (a decode under way further up: it goes on from there)
                    continue
                slot = unstarted.popleft()
                deferred, slot.deferred = slot.deferred, None
                if deferred is not None:
                    self._start(slot, *deferred)
                else:
                    self._start_held(slot)
            self._promote()  # (the next to start is refused at its due time while it waits)
        finally:
            self._starting = False

    def _start_soon(self) -> None:
        """`_start_deferred` on the loop's next turn.

        NOTE: an answer is mostly written from the callback that settled it, inside the
        scheduler's completion of a batch: a request started there would enter the engine
        from within it (and now that a connection runs one request until its answers' size is
        known, pipelined requests start this way)."""
        if not self._start_pending:
            self._start_pending = True
            self._loop.call_soon(self._start_later)

    def _start_later(self) -> None:
        self._start_pending = False
        if self._unstarted and self._transport is not None:
            self._start_deferred()
            self._update_reading()

    def _answer(
        self, slot: _Slot, method: str, url: bytes, headers: dict[str, str], body: bytes
    ) -> None:
        shedder = self._shedder
        if (
            not slot.weighed
            and shedder is not None
            and (shedder.share or shedder.watching)
            and _is_infer(method, url)
            and (refusal := self._shed(url, headers, body)) is not None
        ):
            self._shed_in_turn(slot, url, headers, body, refusal)
            return
        if "content-encoding" in headers and self._inflate(slot, method, url, headers, body):
            return
        self._handle(slot, method, url, headers, body)

    def _handle(
        self, slot: _Slot, method: str, url: bytes, headers: Mapping[str, str], body: bytes
    ) -> None:
        """Hand the request to the API, dated by the read that brought it (see `reading`)."""
        head = method == "HEAD"  # a GET's status and headers without its body (RFC 9110 9.3.2)
        outcome: Reply | PendingReply
        try:
            if method == "POST":  # (v2 infer and V1 predict date their requests: see `reading`)
                turn = self._turn
                turn.reading(self._sock, slot.one_read, slot.first_read)
                try:
                    with self._charged(slot):
                        outcome = self._api.handle(method, url, headers, body)
                finally:
                    turn.done_reading()
            else:
                outcome = self._api.handle("GET" if head else method, url, headers, body)
        except Exception as exc:
            # NOTE: the API answers its own errors, a bug of its own with a 500; when writing
            # that answer raised too (a lone surrogate from the request in its message), the
            # request was left unanswered and its connection hung, never idle, so never closed
            # (found by a tester). Whatever escapes the API is answered here
            log.exception("internal error answering an HTTP request")
            outcome = _error(500, f"internal error: {type(exc).__name__}", headers)
        self._answered(slot, outcome, head)

    def _inflate(
        self, slot: _Slot, method: str, url: bytes, headers: dict[str, str], body: bytes
    ) -> bool:
        """Undo the Content-Encoding of an inference request's body (v2's, or a V1 predict's)
        here, if it inflates to `INFLATE_INLINE_BYTES` or less, then answer it (True); else go on
        off the loop (True: answered once inflated, its place in the pipeline kept), in steps
        on the server's inflation workers (`_inflate_pool`). False: not one of those (the API
        inflates its body, to `INFLATE_INLINE_BYTES` at most, or answers 415).

        The API is handed the body inflated, with its headers but Content-Encoding; a body
        that cannot be inflated is answered as the API answers it (`RestApi.refuse_infer`).

        NOTE: each body inflating past the inline part went on a thread of its own, none of
        it reserved: one connection pipelining 12 deflate bodies of 60 KB (735 KB sent) had
        12 threads inflating 60 MB each, the server's peak RSS 191 -> 1170 MB, and a thread that
        could not start raised out of `data_received` (found by a reviewer). Now a connection
        inflates one body at a time (`_full` while it does: what follows waits), on one of
        `_INFLATE_WORKERS` threads shared by all, `_INFLATE_STEP_BYTES` a step, and what it
        inflates is reserved in the Intake's budget for big bodies as it grows (until its
        answer is written), refused (503) as a chunked body is when it does not fit."""
        arrival, slot.dated_ns = slot.dated_ns, None
        # NOTE: `infer_target` alone (and `_names_predict`) left '//v2/models/m/infer' and
        # '/v1/models/m%3Apredict' to the API, which inflated them on the loop (a tester)
        if method != "POST" or not (_names_predict(url) or self._api.inference_route(url)):
            return False
        inflated = self._inflate_inline(url, headers, body)
        if inflated is None:
            return False  # (a coding not served: the API answers 415)
        if isinstance(inflated, Reply):
            self._answered(slot, inflated)
            return True
        plain = _without_coding(headers)
        if not isinstance(inflated, Inflation):
            self._inflated(slot, method, url, plain, inflated, arrival)
            return True
        self._inflating = True
        job = _Inflating(slot, method, url, headers, plain, inflated, arrival)
        job.at = _binary_start(method, url, plain)
        self._inflate_on(job, None)
        return True

    def _inflate_on(self, job: _Inflating, future: asyncio.Future[Any] | None) -> None:
        """Reserve what `job` inflated so far, and inflate its next step off the loop (`future`:
        the step just done, None at first); answer it once its body is whole, or refused."""
        slot = job.slot
        if self._transport is None or slot not in self._slots:
            self._inflating = False
            return  # the client left (what its slot held was given back: `_withdraw`)
        body = None
        try:
            if future is not None:
                body = future.result()
            grown = job.inflation.size - job.reserved
            if grown and not self._reserve_inflated(job, grown):
                return
            if body is None:
                work = functools.partial(_inflate_step, job.inflation, job.at)
                step = self._loop.run_in_executor(_inflate_pool(), work)
                step.add_done_callback(functools.partial(self._inflate_on, job))
                return
        except Exception as exc:  # (InvalidInput, PayloadTooLarge; MemoryError; no thread)
            if not isinstance(exc, DuetimeError):
                log.exception("could not inflate a request body")
            exc.__traceback__ = None  # (its frames hold `future`, which holds it: no cycle)
            self._inflate_done(job, self._api.refuse_infer(job.url, job.headers, exc))
            return
        self._inflate_done(job, body)

    def _reserve_inflated(self, job: _Inflating, size: int) -> bool:
        """Reserve `size` more bytes inflated of `job`'s body in the Intake, held by its slot
        until its answer is written; refuse it (503, False) when they do not fit, as a big
        chunked body is (one always fits where nothing else is reserved).

        NOTE: "nothing else" compared the Intake's reservations with the inflated bytes alone,
        leaving out the compressed body the slot holds too: a lone 217 KB gzip body inflating
        to 1.9 MB under --max-inflight-bytes 2000000 was refused "retry later" on an idle
        server, every time (found by a tester)."""
        intake = self._intake
        others = intake.reserved - job.slot.size  # (what other requests hold)
        if others > 0 and intake.reserved + size > intake.max_bytes:
            intake.refused_bodies += 1
            error = HttpError(
                503,
                f"other requests hold {others} bytes of big request bodies, and this body "
                f"inflates past the room they leave of the server's {intake.max_bytes} "
                "(--max-inflight-bytes); retry later, or send it uncompressed",
                retry_after_s=1.0,
            )
            self._inflate_done(job, self._api.refuse_infer(job.url, job.headers, error))
            return False
        intake.reserved += size
        job.reserved += size
        job.slot.size += size
        self._held += size
        self._recount()
        return True

    def _inflate_done(self, job: _Inflating, outcome: Any) -> None:
        """`job` is over: its body (answered) or its refusal; the connection's next may start."""
        self._inflating = False
        if isinstance(outcome, Reply):
            self._answered(job.slot, outcome)
        else:
            self._inflated(job.slot, job.method, job.url, job.plain, outcome, job.arrival)
        if self._unstarted:
            self._start_soon()
        self._update_reading()

    def _inflated(
        self,
        slot: _Slot,
        method: str,
        url: bytes,
        headers: dict[str, str],
        body: Any,
        arrival: int | None,
    ) -> None:
        """Answer a request whose body was inflated; one that waited (`arrival`: read then, see
        `_decode`) has its due time count from then, and is refused if already due."""
        if arrival is not None:
            with self._charged(slot):
                held = self._api.hold_back(method, url, headers, body, arrival_ns=arrival)
            if isinstance(held, Reply):
                self._answered(slot, held)
                return
            if held is not None:
                if held.due_ns is not None and self._api.time_left_s(held.due_ns) <= 0:
                    self._answered(slot, self._api.refuse_held(held, self._held_because(slot)))
                else:
                    self._answered(slot, self._api.start_held(held))
                return
        self._handle(slot, method, url, headers, body)

    def _shed(
        self, url: bytes, headers: Mapping[str, str], body: bytes, due: bool = False
    ) -> HttpError | None:
        """The load shedder's refusal of this inference request, read and not decoded, if it
        refuses it: it is weighed by its model (one the server serves; a name a client invents
        is weighed with requests of no model), its body's size and its priority (see
        `LoadShedder.refuse`); and where it lets it through, with `due` (a request just read),
        by its due time (`_due`: a model's served). A refusal counts against its model."""
        shedder = self._shedder
        assert shedder is not None
        target = self._api.infer_target(url)
        self._shed_of = named, version = target if target is not None else ("", None)
        model = self._api.engine.registry.served_name(named, version)
        # NOTE: looked for whenever the loop was busy (two scans of up to 4 KB a request, just
        # then), its priority is looked for only where its model's requests may be refused
        top = shedder.refusing(model) and _priority_one(headers, body)
        if self._refused(model, version, len(body), top):
            return _SHED_ERROR
        if due and model is not None and self._due(model, version, headers, body):
            shedder.refuse_due(model)
            self._count_shed(model, version)
            return _DUE_SHED_ERROR
        return None

    def _shed_held(self, held: HeldInfer) -> bool:
        """`_shed` for a request decoded when it was held back (weighed by its body's size as
        it was read, as `_shed` weighs it: one model, one unit)."""
        request = held.request
        return self._refused(
            self._api.engine.registry.served_name(request.model, request.version),
            request.version,
            held.body_bytes,
            request.priority == 1,
        )

    def _refused(self, model: str | None, version: str | None, size: int, top: bool) -> bool:
        """Whether the load shedder refuses a request of `model` (`size` bytes, priority 1 if
        `top`); a refusal counts against its model (as rejected: see
        `ModelScheduler.count_shed`; one of a version not served counts nowhere).

        NOTE: counted only in duetime_requests_shed_total, a model whose clients got hundreds
        of 429s for another model's flood showed none of them (found by a tester)."""
        shedder = self._shedder
        assert shedder is not None
        if not shedder.refuse(model, size, top, version):
            return False
        self._count_shed(model, version)
        return True

    def _count_shed(self, model: str | None, version: str | None) -> None:
        """Count a request of `model` the shedder refused (see `_refused`)."""
        self._api.shed += 1
        if model is not None:
            self._api.engine.registry.count_shed(model, version)

    def _answered(self, slot: _Slot, outcome: Reply | PendingReply, head: bool = False) -> None:
        """`slot`'s answer made now (a Reply), or once its work is done (`_settle`)."""
        if isinstance(outcome, Reply):
            self._made(slot, _encode(outcome, self._keep_alive(slot), slot.http10, head_only=head))
        else:
            slot.pending = outcome
            if slot.expected >= self._intake.unknown_answer_bytes:
                self._sized(slot, outcome)
            outcome.ticket.when_done(lambda: self._settle(slot))

    def _sized(self, slot: _Slot, pending: PendingReply) -> None:
        """`slot`'s inference, whose answer was expected to weigh the most one may (nothing was
        known of its model's), is expected to weigh what its request's shapes say now it is
        decoded, where its model's graph tells (`RestApi.answer_estimate`): the rest is let go,
        and connections waiting for room for their answers may go on."""
        estimate = self._api.answer_estimate(pending)
        if estimate is None:
            return
        size, slot.shaped = estimate
        slot.shaped_size = size
        intake = self._intake
        if size <= intake.small_answer_bytes:
            size = 0
        if size < slot.expected:
            intake.expected_made(slot.expected - size, self._loop)
            slot.expected = size

    def _join_off_loop(
        self, slot: _Slot, method: str, url: bytes, headers: dict[str, str], chunks: list[bytes]
    ) -> None:
        """Join a bulk body's pieces on a thread of its own, then answer it (its place in the
        pipeline is kept: requests behind it may run first, but answer after it)."""

        def joined(future: asyncio.Future[bytes]) -> None:
            if self._transport is None or slot not in self._slots:
                return  # the client left
            try:
                body = future.result()
            except Exception as exc:  # MemoryError, most likely
                log.exception("could not join a request body")
                message = f"internal error joining the request body: {type(exc).__name__}"
                reply = _error(500, message, headers)
                self._made(slot, _encode(reply, slot.keep_alive, slot.http10))
                return
            self._answer(slot, method, url, headers, body)
            self._update_reading()

        at = _binary_start(method, url, headers)
        join = (lambda: b"".join(chunks)) if at is None else (lambda: _join_aligned(chunks, at))
        _in_thread(self._loop, join, "duetime-body-join").add_done_callback(joined)

    def _continue(self) -> None:
        """Answer `Expect: 100-continue`, but not on an HTTP/1.0 request: a 1.0 client knows no
        interim answers, and RFC 9110 10.1.1 has the server ignore it there.

        NOTE: the field had to be that one token exactly: `100-continue ` (llhttp keeps the
        whitespace that trails a value), two Expect lines or `100-continue, foo` got no 100,
        and the client waited its own expect timeout (found by a tester)."""
        if (
            "100-continue" in _expectations(self._headers.get("expect", ""))
            and self._transport is not None
            and not self._http10
        ):
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    # -- big bodies ----------------------------------------------------------------------------

    def _big_body(self, size: int, length: str) -> bool:
        """Reserve room for a body announced as `size` bytes; False if the request ends here
        (over the limit) or waits for room (reading paused until `granted`)."""
        if size > self._max_body:
            self._fail(413, f"body of {length} bytes is over the {self._max_body}-byte limit")
            return False
        if self._intake.reserve(self, size, self._loop):
            self._reserved = size
            self._fill()
            return True
        self._awaiting = size
        self._recount()
        return False

    def granted(self, size: int) -> None:
        """The Intake reserved the `size` body bytes this connection waited for: read on."""
        self._awaiting = 0
        self._reserved = size
        self._fill()
        self._recount()
        if "expect" in self._headers:
            self._continue()

    def _fill(self) -> None:
        """The body's announced length is reserved: time its rate from now (see `Intake`), or
        from when reading resumes (`_update_reading` moves the start on by the pause)."""
        held = self._held_since
        self._filling_since = held if held is not None else self._loop.time()
        self._filled_from = self._body_bytes
        self._intake.filling.add(self)

    @property
    def reserved_bytes(self) -> int:
        """The room this connection's body holds (the Intake's look)."""
        return self._reserved

    def body_left_s(self, now: float) -> float | None:
        """How long the rest of the body being read would take at the rate it came since its
        room was reserved; None before `_RATE_MEASURE_S` of reading (the Intake's call)."""
        elapsed = now - self._filling_since
        if self._held_since is not None:  # (time held back by the server is not the client's)
            elapsed -= now - self._held_since
        if elapsed < _RATE_MEASURE_S:
            return None
        got = self._body_bytes - self._filled_from
        left = self._reserved - self._body_bytes
        return left * elapsed / got if got > 0 else math.inf

    def refuse_slow_body(self, left_s: float, limit_s: float) -> None:
        """Answer 408 to the request whose body holds room others wait for, and would take
        `left_s` more (the Intake's call)."""
        if self._closing:
            return
        left = self._reserved - self._body_bytes
        self._intake.read_timeouts += 1
        self._fail(
            408,
            f"the request did not arrive in time: its body came at {left / left_s:.0f} bytes/s, "
            f"and the rest ({left} bytes) would take {left_s:.0f} s more while other requests "
            f"wait for the room it holds (the server gives {limit_s:g} s then); send it faster, "
            "or in smaller requests",
        )

    def _big_chunk(self, body: bytes) -> bool:
        """Reserve a chunked body's bytes once it is big (what came so far, then each piece);
        refuse it (503, False) when they do not fit."""
        intake = self._intake
        size = len(body) if self._reserved else self._body_bytes
        if not intake.fits(size):
            intake.refused_bodies += 1
            self._fail(
                503,
                f"the server holds {intake.reserved} bytes of big request bodies, its limit; "
                "retry later, or send a Content-Length so the body can wait its turn",
                retry_after=True,
            )
            return False
        intake.reserved += size
        self._reserved += size
        return True

    def _pace(self, spent: float) -> None:
        """Read no more (of a bulk body, or what is drained after the last response) until the
        Intake gives this connection its turn.

        NOTE: libuv reads a ready socket up to 32 times in one go, so an 8 MB upload would be
        read whole while every other client waits; turns keep them interleaved.
        """
        if not self._yielding:
            self._yielding = True
            self._recount()
            self._intake.take_turns(self, spent, self._loop)

    def take_turn(self) -> bool:
        """Read on (the Intake's call); False if this connection no longer waits for it."""
        if not self._yielding or self._transport is None:
            return False
        self._yielding = False
        self._recount()
        return True

    def _hold(self, slot: _Slot) -> None:
        """Move the complete request's reservation onto its slot, until its answer is out."""
        self._intake.filling.discard(self)
        if self._awaiting:  # the whole body came in the read that announced it
            self._intake.forget(self)
            self._intake.reserved += self._awaiting
            self._reserved, self._awaiting = self._awaiting, 0
        slot.size, self._reserved = self._reserved, 0
        self._held += slot.size
        self._recount()

    def _release(self, size: int) -> None:
        self._held -= size
        self._intake.release(size)
        self._recount()

    def _charged(self, slot: _Slot) -> contextlib.AbstractContextManager[None]:
        """Have what the request of `slot` reads from shared memory as the API decodes it
        meanwhile held as its body is (`_take_shared`); the common request, with no region
        registered, builds no charge (it is on every request's path)."""
        memory = self._api.shared_memory
        if not memory.any_registered:
            return memory.charged(None)
        return memory.charged(functools.partial(self._take_shared, slot))

    def _take_shared(self, slot: _Slot, size: int, where: str) -> None:
        """Hold `size` bytes the request of `slot` copies out of shared memory for `where` (an
        input) as its body's: in the Intake and the connection's, until its answer is written
        or the connection drops; NoRoomToRead where they do not fit beside other requests'
        (`sharedmemory.check_room`: as a chunked body that outgrows the room, it cannot wait).

        NOTE: uncounted, 20 requests of 300-byte bodies, each naming a 60 MiB input, grew the
        server by 1 GiB under --max-inflight-bytes 64 MiB (found by a tester)."""
        intake = self._intake
        check = sharedmemory.check_room
        check(size, where, intake.reserved, slot.size, intake.max_bytes, sharedmemory.INFLIGHT)
        check(size, where, self._held, slot.size, self._max_held, sharedmemory.CONNECTION_INFLIGHT)
        intake.reserved += size
        slot.size += size
        self._held += size
        self._recount()

    def _recount(self) -> None:
        self._bytes_block = self._yielding or self._awaiting > 0 or self._held >= self._max_held
        self._update_reading()

    def _drop_reservation(self) -> None:
        """Give back what the request being read reserved (it will never be answered)."""
        self._intake.filling.discard(self)
        if self._awaiting:
            self._intake.forget(self)
            self._awaiting = 0
        if self._reserved:
            reserved, self._reserved = self._reserved, 0
            self._intake.release(reserved)

    # -- responses -----------------------------------------------------------------------------

    def _settle(self, slot: _Slot) -> None:
        pending = slot.pending
        if pending is None or self._transport is None:
            return
        slot.pending = None
        if not pending.ticket.future.cancelled():
            reply = self._api.encode(pending)
            if isinstance(reply, BulkReply):
                self._build_off_loop(slot, reply)
                return
            self._made(slot, _encode(reply, self._keep_alive(slot), slot.http10))

    def _keep_alive(self, slot: _Slot) -> bool:
        """Whether the connection stays open after `slot`'s answer: not once the server is
        shutting down (its answer says `Connection: close`, so the client does not write its
        next request on a connection about to close and never know whether it ran)."""
        if slot.keep_alive and not self._api.accepting:
            slot.keep_alive = False
            self._closing = True
        return slot.keep_alive

    def _build_off_loop(self, slot: _Slot, bulk: BulkReply) -> None:
        """Build a big answer on a thread of its own, then write it in its place (see
        BulkReply); answers after it wait for it, as ever."""

        def built(future: asyncio.Future[Reply | DuetimeError]) -> None:
            if self._transport is None or slot not in self._slots:
                return  # the client left
            reply = self._api.finish(bulk, future.result())
            self._made(slot, _encode(reply, self._keep_alive(slot), slot.http10))

        _in_thread(self._loop, lambda: build_bulk(bulk), "duetime-answer").add_done_callback(built)

    def _made(self, slot: _Slot, data: bytes | list[bytes | memoryview]) -> None:
        """`slot`'s answer is made: its size is the connection's estimate from now on, it counts
        until read if big (see `Intake`), and it is written once those before it are."""
        slot.data = data
        size = len(data) if isinstance(data, bytes) else sum(len(piece) for piece in data)
        if slot.started:
            self._answer_bytes = size
        model = slot.model
        if model is not None:
            self._intake.answer_sizes.learned(model, size)
            if slot.shaped is not None:
                distrust(slot.shaped, model, size, slot.shaped_size)
            if slot.expected:
                self._intake.expected_made(slot.expected, self._loop)
                slot.expected = 0
        if size > self._small_answer:
            slot.counted = size
            self._unsent += size
            self._intake.answers_made(size)
        self._flush()

    def _flush(self) -> None:
        transport = self._transport
        slots = self._slots
        written = False
        while slots and slots[0].data is not None and transport is not None:
            slot = slots.popleft()
            data = slot.data
            if isinstance(data, bytes):
                transport.write(data)
            else:
                assert data is not None
                transport.writelines(data)
            if slot.counted:
                self._in_transport += slot.counted
                self._sent()  # (the kernel may have taken it all)
            if slot.started:
                self._running -= 1
            written = True
            if slot.size:
                self._release(slot.size)
            if not slot.keep_alive:
                self._linger()
                return
        if written and self._unstarted and not self._starting:
            self._start_soon()
        if (
            not slots
            and self._window_start is None
            and not self._unparsed
            and not self._closing
            and transport is not None
        ):
            self._intake.idle[self] = self._loop.time()  # (nothing in flight: see `close_one`)
        self._update_reading()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None:
            return
        backlogged = len(self._slots) >= _MAX_PIPELINED
        should_pause = (
            self._writing_paused
            or backlogged
            or self._bytes_block
            or len(self._unparsed) > _KEPT_READING_BYTES
        )
        if (
            self._unparsed
            and not (backlogged or self._writing_paused or self._bytes_block)
            and not self._feed_pending
        ):
            self._feed_pending = True  # (on the loop's next turn: this may run within a parse)
            self._intake.wait_turn(self, self._loop)
        if should_pause != self._reading_paused:
            self._reading_paused = should_pause
            if should_pause:
                transport.pause_reading()
            else:
                transport.resume_reading()
        held = self._held_since
        if should_pause or self._unparsed:
            if held is None:
                self._held_since = self._loop.time()
        elif held is not None:
            self._held_since = None
            now = self._loop.time()
            start = self._window_start
            if start is not None:  # time held by us is not the client's
                # NOTE: only what the request's own window held: one that began within the
                # hold (parsed from bytes kept) was moved on by all of it, past now, and a
                # client trickling a head to a busy loop got its 408 after 3-4 read timeouts
                self._window_start = start + now - max(held, start)
            self._filling_since += now - held

    def _count_header(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self._max_header and not self._rejected:
            self._fail(431, f"request head is over the {self._max_header}-byte limit")

    def _fail(self, status: int, message: str, *, retry_after: bool = False) -> None:
        """Answer a request that cannot be parsed or read further, then close the connection;
        one for inference counts in `RestApi.refused` (see `_count_refused`)."""
        self._rejected = True
        self._closing = True
        self._window_start = None
        self._body = []
        self._drop_reservation()
        error = _error(status, message, self._headers, retry_after=retry_after)
        self._count_refused(status)
        reply = _encode(error, False)
        self._slots.append(_Slot(keep_alive=False, data=reply))
        if self._transport is not None and not self._reading_paused:
            self._transport.pause_reading()
            self._reading_paused = True
        self._flush()

    def _count_refused(self, status: int) -> None:
        """Count a refusal of the request being read (`_fail`) in `RestApi.refused` (the
        metric duetime_requests_refused_total) if it is an inference request, as the API counts
        its own: by status and error class (HttpError), no label from the request.

        It counts where what was read of the request names an inference target (its method
        and URL: `_names_inference`). A head refused before its method and URL were read
        whole (a malformed request line) does not count: nothing says it was an inference
        request, and garbage sent to the port (a scanner's, a TLS hello) is no refused
        inference. A malformed header after them counts.

        NOTE: the connection's own refusals counted nowhere: 413 for a Content-Length or a
        chunked body over the limit, 408 for a stalled body, 400 for a malformed head, 501 for
        a Transfer-Encoding (found by a tester); the API's 413 for a JSON part over its limit
        counted."""
        url = self._url
        if url and _names_inference(self._parser.get_method(), url):
            refused = self._api.refused
            key = (status, HttpError.__name__)
            refused[key] = refused.get(key, 0) + 1

    def stalled(self, now: float) -> bool:
        """Whether this connection is reading a request too slowly (`now`: the loop's time):
        `STALLED_S` or more into its read window (from the request's first byte, or the last
        read timeout's check; time the server held it back does not count), its head not
        complete, or its body not come at `min_body_rate_bytes_s` since. A head comes whole
        in one read or a few, milliseconds apart; a body slower than that is refused 408 at the
        read timeout anyway."""
        start = self._window_start
        if (
            start is None
            or not self._in_message
            or self._held_since is not None
            or self._unparsed
            or self._feed_pending
        ):
            return False
        elapsed = now - start
        if elapsed < STALLED_S:
            return False
        if not self._head_done:
            return True
        return self._body_bytes - (self._window_bytes or 0) < self._min_rate * elapsed

    def waited_for_room(self, now: float) -> bool:
        """Whether this connection's request has waited `STALLED_S` or more for room for its
        body in the Intake (`max_inflight_bytes`), owing no answer."""
        held = self._held_since
        return (
            bool(self._awaiting)
            and held is not None
            and now - held >= STALLED_S
            and not self._slots
            and not self._unstarted
        )

    def refuse_waiting(self) -> bool:
        """Refuse the request waiting for room for its body (503, retry later) and close, for a
        new connection at `max_connections` (the Intake's call); False if already closing. It
        no longer counts as open."""
        if not self._accepted or self._closing:
            return False
        self._free_slot()
        self._fail(
            503,
            f"this request's body ({self._awaiting} bytes) waited for room among the bodies "
            "the server reads at once (server setting max_inflight_bytes, "
            "--max-inflight-bytes), and a new connection needed its place; retry later",
            retry_after=True,
        )
        return True

    def evict(self) -> bool:
        """Close this connection, idle or too slow at its request, for a new one at
        `max_connections` (the Intake's call); False if it owes answers or is already closing.
        It no longer counts as open."""
        if not self._accepted or self._closing or self._slots or self._unstarted:
            return False
        self._free_slot()
        self.close_now()
        return True

    def _free_slot(self) -> None:
        """It no longer counts as open (`max_connections`): it is lost, or let go for a new
        connection, or ended by its idle timeout while it drains."""
        if self._accepted:
            self._accepted = False
            self._intake.connections -= 1

    def unread(self) -> bool:
        """Whether bytes its client sent wait in the kernel, unread: a request the loop reads
        this turn (timers run before reads), so the connection is not idle.

        NOTE: closed as idle (its idle timeout, or for a new connection at `max_connections`)
        with its next request unread, the connection was reset, and that request lost: 361 in
        10 s of 40 keep-alive clients at `--max-connections 16`, 45 in 40 s at
        `--idle-timeout-s 0.5` (found by a tester). nginx reads before it closes too."""
        return self._sock is not None and bytes_waiting(self._sock)

    def close_now(self) -> None:
        """Close at once, whatever is owed or unread (also a stopping server's last word)."""
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    def _linger(self) -> None:
        """Close after the last response: send FIN, drain the client's bytes until it closes too."""
        transport = self._transport
        if transport is None or not transport.can_write_eof():
            self.close_now()
            return
        # NOTE: closing with unread bytes makes the kernel send RST, which can destroy the
        # response still in flight; a client uploading a body over the limit would never see 413.
        self._closing = self._lingering = True
        self._withdraw()
        self._drop_reservation()
        transport.write_eof()
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(_LINGER_S, self.close_now)

    def _withdraw(self) -> None:
        """Cancel the requests that will never be answered on this connection, if not run yet."""
        released = answers = withdrawn = 0
        first: PendingReply | None = None
        expected = 0
        for slot in self._slots:
            expected += slot.expected
            slot.expected = 0
            pending = slot.pending
            if pending is not None and pending.ticket.future.cancel():
                withdrawn += 1
                pending.withdrawn_span()
                if first is None:
                    first = pending
            if slot.expiry is not None:
                slot.expiry.cancel()
            released += slot.size
            answers += slot.counted
        if first is not None:
            # NOTE: a line each: a flood of pipelining clients that left wrote 70,000 lines
            # (one per request running), the loop busy with them. One line a request stays
            # for the first (its trace id); the others are one line, with their count.
            first.withdrawn()
            if withdrawn > 1:
                log.info(
                    "http: %d more requests of the same connection were cancelled by its "
                    "client before their answers (counted cancelled)", withdrawn - 1,
                )  # fmt: skip
        self._slots.clear()
        self._unstarted.clear()  # (those undecoded are dropped as they are)
        self._unparsed = b""
        self._replay_arrival = None
        self._running = 0
        if released:
            self._held -= released
            self._intake.release(released)
        if expected:
            self._intake.expected_made(expected, self._loop)
        if answers:
            self._unsent -= answers
            self._intake.answers_read(answers, self._loop)

    def _sent(self) -> None:
        """Uncount what the client has read of the big answers written.

        NOTE: what stays in the transport's buffer below its high-water mark (when it does not
        pause writing) is taken as read: it is bounded per connection, as small answers are,
        and the transport says when it drains only across that mark."""
        transport = self._transport
        buffered = 0
        if self._writing_paused and transport is not None:
            buffered = transport.get_write_buffer_size()
        read = self._in_transport - buffered
        if read > 0:
            self._in_transport -= read
            self._unsent -= read
            self._intake.answers_read(read, self._loop)

    # -- timeouts ------------------------------------------------------------------------------

    def _check_timeouts(self) -> None:
        """The connection's one timer: closes it when idle too long, answers 408 to a request
        that arrives too slowly, else runs again by the next deadline."""
        self._timer = None
        if self._transport is None or self._lingering:
            return
        now = self._loop.time()
        start = self._window_start
        if start is not None and self._held_since is None:
            # NOTE: a connection silent since its accept is idle too: it has the shorter of the
            # two (it had `request_read_timeout_s` alone, 10 s where `idle_timeout_s` was 0.3)
            limit = (
                self._read_timeout if self._reads else min(self._read_timeout, self._idle_timeout)
            )
            deadline = start + limit
            if now >= deadline:
                if not self._read_on_time(now - start):
                    return
                self._window_start, self._window_bytes = now, self._body_bytes
                deadline = now + self._read_timeout
        elif start is None and not self._slots:
            deadline = self._last_active + self._idle_timeout
            if self._send_stalled(now):
                return
            if now >= deadline:
                if not self._sent_checked and not self.unread():
                    # (FIN first, then what comes is drained: a request sent as the timeout
                    # passed, crossing the FIN, meets a closed connection, not a reset; its
                    # slot is free at once, as an evicted one's, whatever its client does)
                    self._free_slot()
                    self._linger()
                    return
                # (its client is still reading, or its next request came: it is read this turn)
                deadline = now + self._idle_timeout
        else:  # waiting for responses, or paused by us: no deadline runs
            if self._send_stalled(now):
                return
            if self._in_transport:
                self._sent()
            deadline = now + self._idle_timeout
        # NOTE: never later than one read timeout, so a request that begins after this check
        # is still caught on time without a timer of its own.
        wake = min(deadline, now + self._read_timeout)
        self._timer = self._loop.call_at(max(wake, now + 0.01), self._check_timeouts)

    def _send_stalled(self, now: float) -> bool:
        """Whether the client has read none of its answers for `idle_timeout_s`, as nginx's
        `send_timeout`: answer bytes stayed in the transport's buffer (the kernel's socket
        buffers full), the same number from one check to the next over that time. If so, drops
        the connection (its requests not started yet are withdrawn) and returns True.

        NOTE: a buffer that grew says nothing of the client, yet it restarts the clock too: it
        grows only by the answers of requests already running (none start while writing is
        paused), so a client reading nothing is still caught, a little later."""
        transport = self._transport
        assert transport is not None
        buffered = transport.get_write_buffer_size()
        if not buffered or buffered != self._sent_checked:  # owes nothing, or it moved
            self._stall_since = now
        self._sent_checked = buffered
        if now - self._stall_since < self._idle_timeout:
            return False
        self._intake.send_timeouts += 1
        self._closing = True
        transport.abort()  # (close would wait for the client to read)
        return True

    def _read_on_time(self, elapsed: float) -> bool:
        """Whether the request being read kept pace over the last `elapsed` seconds: its head
        complete by the end of the first period, then, from the head's end, `min_rate` body
        bytes per second. Else
        answers 408 (the client is too slow, or a slowloris) and returns False."""
        if not self._reads:  # a connection that sent nothing since accepted: closed, unanswered
            if self.unread():  # (it did: the loop, late, has not read it yet)
                return True
            self._intake.read_timeouts += 1
            self.close_now()
            return False
        if not self._head_done:
            problem = f"its head was not complete {elapsed:.1f} s after its first byte"
        else:
            rate = (self._body_bytes - (self._window_bytes or 0)) / elapsed
            if rate >= self._min_rate:
                return True
            problem = f"its body came at {rate:.0f} bytes/s over the last {elapsed:.1f} s"
        self._intake.read_timeouts += 1
        self._fail(
            408,
            f"the request did not arrive in time: {problem}; send the head within "
            f"{self._read_timeout:g} s and the body at {self._min_rate} bytes/s or more",
        )
        return False

    def shutdown(self) -> None:
        """Close after the responses already owed, or after the next request if any of it came
        (it is answered as requests are while the server stops: 503, `Connection: close`);
        used when the server stops.

        NOTE: a request whose body was still coming was cut off (the connection closed: no
        answer, a broken pipe), which its client could not tell from a crash (found by a
        tester); its body gets the time it has to come (the read timeout, within the
        server's grace). So did one sent whole but not read yet, kept unparsed or in the
        kernel: 15 of 16 clients that had each written a 4 MiB request 0.2 s before a SIGTERM
        got a reset (bulk bodies are read at a share of the loop: see `Intake.take_turns`),
        found by another tester."""
        self._closing = True
        if self._slots:
            self._slots[-1].keep_alive = False
        elif not self._lingering and (
            self._in_message
            or self._unparsed
            or (self._sock is not None and bytes_waiting(self._sock))
        ):
            self._last_request = True
            self._update_reading()  # (feeds what was kept unparsed, unless it waits its turn)
        else:
            self.close_now()

    @property
    def receiving(self) -> bool:
        """Whether the stopping server still reads a request here (see `shutdown`)."""
        return self._last_request and self._transport is not None

    def cut_short(self) -> None:
        """Refuse the request still being read when the stopping server's grace ends (503, and
        what its client still sends is drained, so that it reads the answer: see `_linger`)."""
        if not self.receiving or self._rejected:
            return
        self._last_request = False
        self._fail(
            503,
            f"{SHUTTING_DOWN} (its grace ended before this request came whole)",
            retry_after=True,
        )


class _BodyPastUpgrade:
    """The httptools callbacks of the parser that reads a body past an Upgrade (see
    `HttpConnection._upgraded`): the head it is given is no request's, so only the body and its
    end go to the connection, for the request whose head it read."""

    __slots__ = ("on_body", "on_message_complete")

    def __init__(self, connection: HttpConnection) -> None:
        self.on_body = connection.on_body
        self.on_message_complete = connection.on_message_complete


def _in_thread(
    loop: asyncio.AbstractEventLoop, job: Callable[[], T], name: str
) -> asyncio.Future[T]:
    """`job()` on a short-lived low-priority thread; its future settles on `loop`."""
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: Exception | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        lower_thread_priority(_JOIN_NICENESS)
        result, error = None, None
        try:
            result = job()
        except Exception as exc:  # MemoryError
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name=name, daemon=True).start()
    return future


_SHED_MESSAGE = (
    "the server is saturated (its event loop is busy past its limit, and requests are missing "
    "their due times); this request was refused unread; retry later or on another replica"
)


_SHED_ERROR = HttpError(429, _SHED_MESSAGE, retry_after_s=1.0)
"""The shedder's refusal (never raised: see `_shed_submit`)."""
_DUE_SHED_MESSAGE = (
    "the server is saturated and its event loop is behind: this request's timeout is no longer "
    "than requests wait to be read and answered now, so it was refused unread; retry later, on "
    "another replica, or with a larger timeout"
)
_DUE_SHED_ERROR = HttpError(429, _DUE_SHED_MESSAGE, retry_after_s=1.0)
"""The refusal of a request due before the saturated loop could take it (see
`HttpConnection._due`)."""
_DUE_SCAN = 1024
"""Bytes of a request's JSON head looked through for its timeout (see `HttpConnection._due`)."""
_DUE_TIMEOUT = re.compile(rb'"timeout"[ \t\n\r]*:[ \t\n\r]*(0|[1-9][0-9]*)(?![0-9.eE])')
"""A `timeout` key and a JSON integer after it (`1.5`, `1e3`, `01` are none: the request is
decoded, and refused as its parameter says)."""


def _shed_submit(request: Any) -> Any:
    """The engine's submit for a request the shedder refused, to record it: it raises the
    refusal (a copy)."""
    raise HttpError(429, _SHED_MESSAGE, retry_after_s=1.0)


_SINGLE_FIELDS = frozenset(("host", "content-type", "inference-header-content-length"))
"""Header fields that take one value: sent twice, the request is refused (see
`HttpConnection._repeated`); llhttp refuses a second Content-Length itself."""


@dataclass(slots=True, eq=False)
class _Inflating:
    """A request body being inflated off the loop (see `HttpConnection._inflate`)."""

    slot: _Slot
    method: str
    url: bytes
    headers: dict[str, str]
    plain: dict[str, str]
    """Its headers but Content-Encoding (the API's, once inflated)."""
    inflation: Inflation
    arrival: int | None
    at: int | None = None
    """Where its binary tensors start (`_binary_start`), if it has them."""
    reserved: int = 0
    """Its inflated bytes reserved in the Intake (held by its slot)."""


_INFLATE_WORKERS = 2
"""Threads that inflate big compressed request bodies, for the whole process (see
`HttpConnection._inflate`)."""

_INFLATE_STEP_BYTES = 4 << 20
"""What a worker inflates of a body before its connection reserves it (see `_inflate`)."""

_INFLATE_POOL: list[ThreadPoolExecutor] = []


def _inflate_pool() -> ThreadPoolExecutor:
    """The inflation workers (`_INFLATE_WORKERS` low-priority threads, started as needed)."""
    if not _INFLATE_POOL:
        _INFLATE_POOL.append(
            ThreadPoolExecutor(
                _INFLATE_WORKERS,
                "duetime-inflate",
                initializer=lower_thread_priority,
                initargs=(_JOIN_NICENESS,),
            )
        )
    return _INFLATE_POOL[0]


def _inflate_step(inflation: Inflation, at: int | None) -> Any:
    """Inflate `_INFLATE_STEP_BYTES` more of a body (on a worker): None if more is left, else
    the whole body (joined aligned where it has binary tensors)."""
    if not inflation.more(_INFLATE_STEP_BYTES):
        return None
    pieces = inflation.take()
    if at is not None:
        return _join_aligned(pieces, at)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _without_coding(headers: Mapping[str, str]) -> dict[str, str]:
    """`headers` but Content-Encoding (a body's, once inflated)."""
    return {name: value for name, value in headers.items() if name != "content-encoding"}


def _names_predict(url: bytes) -> bool:
    """Whether `url` is V1's `/v1/models/<m>:predict`."""
    return url.startswith(b"/v1/models/") and url.split(b"?", 1)[0].endswith(b":predict")


def _answers_small(method: str, url: bytes | None) -> bool:
    """Whether a request's answer is small whatever it asks: any but an inference (health,
    metadata, statistics, the repository API: their size is the server's state's); `url` None:
    an inference not known."""
    return url is not None and not _names_inference(method.encode("latin-1"), url)


def _next_request(slot: _Slot) -> tuple[str, bytes | None]:
    """The method and URL of a request waiting unstarted (one held for its body: taken as an
    inference)."""
    deferred = slot.deferred
    return ("POST", None) if deferred is None else (deferred[0], deferred[1])


def _is_infer(method: str, url: bytes) -> bool:
    return method == "POST" and url.split(b"?", 1)[0].endswith(b"/infer")


def _names_inference(method: bytes, url: bytes) -> bool:
    """Whether a request (what was read of it) is for inference: v2's `POST .../infer`, or
    V1's `POST /v1/models/<m>:predict` (or `:explain`), as `RestApi` counts its refusals."""
    if method != b"POST":
        return False
    path = url.split(b"?", 1)[0]
    return path.endswith((b"/infer", b":predict", b":explain"))


_PRIORITY_ONE = re.compile(rb'"priority"\s*:\s*1(?![0-9.eE])')
_PRIORITY_SCAN = 4096
"""Bytes of a JSON body looked through for its priority, at either end (see `_priority_one`)."""


def _priority_one(headers: Mapping[str, str], body: bytes) -> bool:
    """Whether an inference request not decoded asks for priority 1 (the highest), by a look
    through its JSON: the header of a binary body, or the two ends of a JSON one (its
    `parameters` come before or after its tensors), `_PRIORITY_SCAN` bytes each; a compressed
    body is not looked into. A name or value that only looks like one errs toward priority 1:
    refused last."""
    end = _json_head_end(headers, body)
    if end is None:
        return False
    search = _PRIORITY_ONE.search  # (within bounds: no copy of a big body's ends)
    if search(body, 0, min(end, _PRIORITY_SCAN)) is not None:
        return True
    return (
        end > _PRIORITY_SCAN
        and search(body, max(_PRIORITY_SCAN, end - _PRIORITY_SCAN), end) is not None
    )


def _json_head_end(headers: Mapping[str, str], body: Any) -> int | None:
    """Where the JSON of an inference request's body ends (its binary tensors start there, if
    any); None where the body is compressed (not looked into before it is inflated)."""
    if headers.get("content-encoding", "identity") != "identity":
        return None
    length = _header_length(headers)
    return len(body) if length is None else min(len(body), length)


def _binary_start(method: str, url: bytes, headers: dict[str, str]) -> int | None:
    """Where an inference request's binary tensors start in its body (the JSON header's
    length), if it has them and its body is not compressed; else None."""
    if not _is_infer(method, url) or headers.get("content-encoding", "identity") != "identity":
        return None
    return _header_length(headers)


_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~%!$&'()*+,;=]*)(?::[0-9]*)?")
"""RFC 9112 3.2's Host value: RFC 3986's uri-host (an IP literal in brackets, or a reg-name or
IPv4 address), then an optional port."""


def host_refusal(host: str | None, http10: bool) -> str | None:
    """Why a request whose Host header says `host` (None: it has none; whitespace around it
    is not part of it) is refused, 400, or None where it is not: RFC 9112 3.2 has a server
    refuse an HTTP/1.1 request (`http10`: an HTTP/1.0 one) with no Host, and one whose Host is
    not a host and optional port (RFC 3986's uri-host). The metrics port checks its requests'
    Host by it too.

    NOTE: both were answered as any (found by a tester); a padded 'Host: localhost ' was
    refused (RFC 9110 5.5: llhttp keeps what trails a value, also found by a tester)."""
    if host is None:
        return None if http10 else "an HTTP/1.1 request must have a Host header (RFC 9112 3.2)"
    if _HOST.fullmatch(host.strip(" \t")) is None:
        return f"the Host header {host!r} is not a host[:port] (RFC 9112 3.2)"
    return None


_CONTINUE = frozenset(("100-continue",))


def _expectations(expect: str) -> set[str]:
    """The expectations an Expect field value lists, in lower case: a comma-separated list (RFC
    9110 10.1.1; several lines are one: see `HttpConnection._repeated`), whitespace around its
    members no part of them (RFC 9110 5.5), empty members dropped (RFC 9110 5.6.1)."""
    return {member.strip(" \t").lower() for member in expect.split(",")} - {""}


def _asks_close(headers: Mapping[str, str]) -> bool:
    """Whether the request's Connection header holds the option 'close'."""
    connection = headers.get("connection")
    return connection is not None and any(
        option.strip().lower() == "close" for option in connection.split(",")
    )


def _header_length(headers: Mapping[str, str]) -> int | None:
    """The request's Inference-Header-Content-Length where it is a number (ASCII digits, under
    19 of them), else None: its decoding refuses it.

    NOTE: str.isdigit() takes '²', which int() refuses: a binary body of 8 KiB or more with
    the length '1²' got 500 and its connection closed (found by a tester)."""
    length = headers.get("inference-header-content-length")
    if length is None or not (length.isascii() and length.isdigit() and len(length) < 19):
        return None
    return int(length)


def _aligned_body(size: int, at: int) -> np.ndarray:
    """Room for a body of `size` bytes (uint8) whose byte `at` (its first binary tensor) lies at
    a multiple of `codec.ALIGNMENT`."""
    start = -min(at, size) % codec.ALIGNMENT
    return codec.aligned_empty(size + start)[start:]


def _join_aligned(chunks: list[bytes], at: int) -> Any:
    """The body's pieces joined so that byte `at` (its first binary tensor) lies at a multiple
    of `codec.ALIGNMENT`, as a memoryview.

    NOTE: the decoder copies a tensor that does not lie so (ONNX Runtime gives other bits for
    misaligned data), on the event loop: 20-45 ms for 64 MiB. Laid out here, on the joining
    thread, the first tensor (most often the only big one) is used where it lies. numpy's
    copies release the GIL, and ran faster than bytes.join (26 vs 37 ms for 64 MiB)."""
    body = _aligned_body(sum(map(len, chunks)), at)
    position = 0
    for chunk in chunks:
        body[position : position + len(chunk)] = np.frombuffer(chunk, np.uint8)
        position += len(chunk)
    return body.data


_TRACE_SLOT = "~" * 32
"""Where a refusal's trace id goes in its bytes encoded once (as long as a trace id)."""


def _shed_reply(
    keep_alive: bool,
    http10: bool,
    headers: Mapping[str, str],
    model: str,
    version: str | None,
    refusal: HttpError = _SHED_ERROR,
) -> bytes:
    """The load shedder's `refusal` of a request (`_SHED_ERROR`, or `_DUE_SHED_ERROR`: see
    `HttpConnection._due`), with its trace id, and its log line (of `model` and `version`, as
    the request named them).

    NOTE: at overload most requests are refused, and a refusal that cost as much as an answer
    (routing, an exception, a JSON body: 70% of serving mlp, measured) left the loop too little
    time to answer the rest: refusing 50% of 200% load took all of it. It is encoded once, the
    trace id put into its place."""
    traceparent = headers.get("traceparent")
    parent = parse_traceparent(traceparent) if traceparent else None
    trace_id = parent.trace_id_hex if parent is not None else new_trace_id()
    log_request(
        protocol="http", model=model, version=version, status=refusal.http_status,
        reason=refusal.message, trace_id=trace_id,
    )  # fmt: skip
    pieces = _shed_pieces(keep_alive, http10, _date_line(int(time.time())), refusal)
    return trace_id.encode().join(pieces)


@functools.lru_cache(maxsize=8)
def _shed_pieces(keep_alive: bool, http10: bool, date: bytes, refusal: HttpError) -> list[bytes]:
    """The shedder's `refusal` encoded (with the Date line `date`), split where its trace id
    goes."""
    reply = error_reply(refusal, _TRACE_SLOT)
    encoded = cast(bytes, _encode(reply, keep_alive, http10, date=date))
    return encoded.split(_TRACE_SLOT.encode())


@functools.cache
def _shed_size() -> int:
    """The most bytes the shedder's refusal takes (its Date line and trace id are of fixed
    length)."""
    date = _date_line(int(time.time()))  # (the current second's: any has the same length)
    return max(
        len(("0" * len(_TRACE_SLOT)).encode().join(_shed_pieces(keep_alive, http10, date, error)))
        for keep_alive in (False, True)
        for http10 in (False, True)
        for error in (_SHED_ERROR, _DUE_SHED_ERROR)
    )


@functools.lru_cache(maxsize=1)
def _date_line(second: int) -> bytes:
    """The Date header line of answers sent in `second` (of the epoch), formatted once a second
    (RFC 9110 6.6.1: an origin server with a clock sends one)."""
    return b"Date: %s\r\n" % email.utils.formatdate(second, usegmt=True).encode()


def _error(
    status: int, message: str, headers: Mapping[str, str], *, retry_after: bool = False
) -> Reply:
    """The answer to a request the protocol layer refuses itself, with its trace id (that of the
    `traceparent` in `headers`, if any, else a new one) and its log line."""
    error = HttpError(status, message, retry_after_s=1.0 if retry_after else None)
    return failed_reply(error, headers)


def _encode(
    reply: Reply,
    keep_alive: bool,
    http10: bool = False,
    *,
    head_only: bool = False,
    date: bytes | None = None,
) -> bytes | list[bytes | memoryview]:
    """The reply on the wire: bytes, or a list of pieces where it has a tail (written as they
    are, never joined); `head_only` (an answer to HEAD) leaves out the body, not its
    Content-Length; `date`: its Date line (None: now's)."""
    tail = reply.tail
    size = len(reply.body) + sum(len(piece) for piece in tail) if tail else len(reply.body)
    head = [
        b"HTTP/1.1 %d %s\r\n" % (reply.status, _REASONS.get(reply.status, b"Unknown")),
        _date_line(int(time.time())) if date is None else date,
        b"Content-Length: %d\r\n" % size,
    ]
    head.extend(b"%s: %s\r\n" % pair for pair in reply.headers)
    if not keep_alive:
        head.append(b"Connection: close\r\n")
    elif http10:  # an HTTP/1.0 client assumes the connection closes unless told otherwise
        head.append(b"Connection: keep-alive\r\n")
    head.append(b"\r\n")
    if head_only:
        return b"".join(head)
    head.append(reply.body)
    if tail:
        return [b"".join(head), *tail]
    return b"".join(head)


def connection_factory(
    api: RestApi,
    settings: ServerSettings,
    connections: set[HttpConnection],
    intake: Intake,
    shedder: LoadShedder | None,
) -> Callable[[], HttpConnection]:
    """What makes the protocol of each HTTP connection `serve_http` accepts (and a stopping
    server takes from its listener's backlog: see `Server.stop`)."""
    return functools.partial(HttpConnection, api, settings, connections, intake, shedder)


async def serve_http(
    api: RestApi,
    settings: ServerSettings,
    connections: set[HttpConnection],
    intake: Intake | None = None,
    shedder: LoadShedder | None = None,
) -> asyncio.Server:
    """Listen on `settings.host:http_port` (0: any free port); returns the started server.

    `intake` (made from `settings` when not given) bounds and counts what the server takes in;
    pass one to read its `statistics()`."""
    loop = asyncio.get_running_loop()
    shared = intake if intake is not None else Intake(settings)
    if shared.guess is None:
        shared.guess = api.engine.answer_guess
    factory = connection_factory(api, settings, connections, shared, shedder)

    try:
        if settings.host == "::":
            sock = _every_interface(settings.http_port)
            return await loop.create_server(factory, sock=sock, backlog=1024)
        return await loop.create_server(
            factory, settings.host, settings.http_port, reuse_address=True, backlog=1024
        )
    except OSError as exc:
        where = f"{settings.host}:{settings.http_port}: {exc.strerror or exc}"
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"server settings: field 'http_port': cannot listen on {where}; pass "
                "--http-port with a free port (0 picks one)"
            ) from None
        raise ConfigError(  # (no such address here, or a name that does not resolve)
            f"server settings: field 'host': cannot listen on {where}; pass --host with an "
            "address of this host (127.0.0.1, 0.0.0.0 or :: for every one)"
        ) from None


def _every_interface(port: int) -> socket.socket:
    """A socket on `::` that takes IPv4 too where the OS makes IPv6 sockets dual stack (Linux's
    default), as gRPC's and the metrics endpoint's do.

    NOTE: `create_server` marks every IPv6 socket it makes IPv6-only, so given `::` it would
    leave IPv4 clients refused."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::", port))
    except OSError:
        sock.close()
        raise
    return sock
