"""A small HTTP/1.1 server on httptools for the v2 REST API: the fast path of duetime.

One `HttpConnection` per TCP connection. It parses with httptools, answers pipelined requests in
order, supports Content-Length and chunked bodies and `Expect: 100-continue`, limits header and
body sizes, closes idle keep-alive connections, and pauses reading while too many responses are
owed. A connection that drops cancels its unanswered requests, so they are never run.

What one server takes in is bounded by its `Intake`: open connections (more are answered 503
and closed at once) and request body bytes held (a body that does not fit waits, its connection
paused, until others are answered). A request must arrive within `request_read_timeout_s` of
its first byte, plus its body's size at `min_body_rate_bytes_s`; a slower client (slowloris)
is answered 408 and closed. None of this costs a timer or a lookup per request: one timer per
connection checks the read and idle deadlines, and the byte counts are a few additions.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

import httptools
import orjson

from duetime.config import ServerSettings
from duetime.frontend.rest import PendingReply, Reply, RestApi

log = logging.getLogger("duetime.http")

_MAX_PIPELINED = 64
"""Responses owed on one connection before it stops reading more requests."""

_LINGER_S = 2.0
"""After the last response on a connection the server ends, how long it still drains what the
client sends, so the client reads that response rather than a reset (a 413 mid-upload, say)."""

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_JSON = (b"Content-Type", b"application/json")


@dataclass(frozen=True, slots=True)
class IntakeStatistics:
    """A snapshot of an `Intake`: what is held now, and running totals of what was refused."""

    connections: int
    inflight_bytes: int
    """Request body bytes held: being read, or read and waiting for their answer."""
    waiting_connections: int
    """Connections paused until a body they announced fits within `max_inflight_bytes`."""
    refused_connections: int
    """Connections closed at accept because `max_connections` were open."""
    read_timeouts: int
    """Requests that did not arrive in time (408)."""
    refused_bodies: int
    """Chunked bodies refused (503) because they outgrew the room left for bodies."""


class Intake:
    """What one HTTP server has taken in and not yet answered, within its limits.

    Shared by the server's connections, owned by the event loop. Body bytes are reserved when a
    request's head announces them (Content-Length) or as they arrive (chunked), and released
    when its response is written or its connection drops. A reservation that does not fit waits
    in arrival order; one always fits when nothing else is held, so every body within
    `max_body_bytes` eventually goes through.
    """

    def __init__(self, settings: ServerSettings) -> None:
        self.max_connections = settings.max_connections
        self.max_bytes = settings.max_inflight_bytes
        self.connections = 0
        self.inflight_bytes = 0
        self.refused_connections = 0
        self.read_timeouts = 0
        self.refused_bodies = 0
        self._waiting: deque[tuple[HttpConnection, int]] = deque()

    def fits(self, size: int) -> bool:
        held = self.inflight_bytes
        return held == 0 or held + size <= self.max_bytes

    def reserve(self, connection: HttpConnection, size: int) -> bool:
        """Take `size` bytes now (True), or queue `connection` for `_granted` later (False)."""
        if not self._waiting and self.fits(size):
            self.inflight_bytes += size
            return True
        self._waiting.append((connection, size))
        return False

    def release(self, size: int) -> None:
        self.inflight_bytes -= size
        waiting = self._waiting
        while waiting and self.fits(waiting[0][1]):
            connection, wanted = waiting.popleft()
            self.inflight_bytes += wanted
            connection.granted(wanted)

    def forget(self, connection: HttpConnection) -> None:
        """Drop `connection`'s queued reservation, if any (it closed or got its body anyway)."""
        for entry in self._waiting:
            if entry[0] is connection:
                self._waiting.remove(entry)
                return

    def statistics(self) -> IntakeStatistics:
        return IntakeStatistics(
            connections=self.connections,
            inflight_bytes=self.inflight_bytes,
            waiting_connections=len(self._waiting),
            refused_connections=self.refused_connections,
            read_timeouts=self.read_timeouts,
            refused_bodies=self.refused_bodies,
        )


@dataclass(slots=True, eq=False)
class _Slot:
    """One request's place in the pipeline; `data` is set once its response is encoded."""

    keep_alive: bool
    http10: bool = False
    data: bytes | None = None
    pending: PendingReply | None = None
    size: int = 0
    """Body bytes reserved in the Intake until the response is written."""


class HttpConnection(asyncio.Protocol):
    """The protocol for one client connection (see the module docstring)."""

    def __init__(
        self,
        api: RestApi,
        settings: ServerSettings,
        connections: set[HttpConnection],
        intake: Intake | None = None,
    ):
        self._api = api
        self._max_body = settings.max_body_bytes
        self._max_header = settings.max_header_bytes
        self._max_held = settings.max_connection_inflight_bytes
        self._idle_timeout = settings.idle_timeout_s
        self._read_timeout = settings.request_read_timeout_s
        self._min_rate = float(settings.min_body_rate_bytes_s)
        self._connections = connections
        self._intake = intake if intake is not None else Intake(settings)
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._accepted = False
        self._parser = httptools.HttpRequestParser(self)
        self._slots: deque[_Slot] = deque()
        self._reading_paused = False
        self._paused_at = 0.0
        self._writing_paused = False
        self._closing = False
        self._lingering = False
        self._last_active = 0.0
        self._read_started: float | None = None
        """When the request being read began (its first byte), moved on by pauses of ours."""
        self._timer: asyncio.TimerHandle | None = None
        self._held = 0
        """Body bytes of this connection's requests read and not yet answered."""
        self._reserved = 0
        """Body bytes reserved for the request being read."""
        self._awaiting = 0
        """Body bytes the request being read waits to reserve (its connection is paused)."""
        self._reset_message()

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        writer = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport = writer
        intake = self._intake
        if intake.connections >= intake.max_connections:
            intake.refused_connections += 1
            self._closing = self._lingering = True  # read nothing
            message = (
                f"the server has {intake.max_connections} connections open, its limit; "
                "retry later, reuse a connection, or use another replica"
            )
            writer.write(_encode(_error(503, message, retry_after=True), False))
            writer.close()
            return
        self._connections.add(self)
        intake.connections += 1
        self._accepted = True
        self._last_active = self._loop.time()
        self._timer = self._loop.call_later(
            min(self._idle_timeout, self._read_timeout), self._check_timeouts
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        if self._accepted:
            self._accepted = False
            self._intake.connections -= 1
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._withdraw()  # the client is gone
        self._drop_reservation()
        self._transport = None

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # the last response is out: discard the rest
            return
        self._last_active = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # NOTE: the request itself was answered as plain HTTP/1.1 (a server may ignore
            # Upgrade); the parser cannot read past it, so close once the owed responses are out.
            self.shutdown()
        except httptools.HttpParserCallbackError:
            log.exception("internal error reading an HTTP request")
            if not self._closing:
                self._fail(500, "internal error reading the request; the server logged it")
        except httptools.HttpParserError as exc:
            if not self._closing:
                self._fail(400, f"malformed HTTP request: {exc}")

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    # -- httptools callbacks -------------------------------------------------------------------

    def _reset_message(self) -> None:
        self._url = b""
        self._headers: dict[str, str] = {}
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._chunked = False
        self._rejected = False

    def on_message_begin(self) -> None:
        self._reset_message()
        self._read_started = self._last_active

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_header(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header(len(name) + len(value))
        if not self._rejected:
            self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._rejected or self._closing:
            return
        length = self._headers.get("content-length")
        if length is None:
            self._chunked = True  # or no body at all: bytes are reserved as they come
        else:
            size = int(length) if length.isascii() and length.isdigit() else 0
            if size > self._max_body:
                self._fail(413, f"body of {length} bytes is over the {self._max_body}-byte limit")
                return
            if size and not self._intake.reserve(self, size):
                self._awaiting = size  # `granted` resumes reading (and sends 100 Continue)
                self._update_reading()
                return
            self._reserved = size
        self._continue()

    def on_body(self, body: bytes) -> None:
        if self._rejected or self._closing:
            return
        size = len(body)
        self._body_bytes += size
        if self._body_bytes > self._max_body:
            self._fail(413, f"body is over the {self._max_body}-byte limit")
            return
        if self._chunked:
            intake = self._intake
            if not intake.fits(size):
                intake.refused_bodies += 1
                self._fail(
                    503,
                    f"the server holds {intake.inflight_bytes} bytes of request bodies, its "
                    "limit; retry later, or send a Content-Length so the body can wait its turn",
                    retry_after=True,
                )
                return
            intake.inflight_bytes += size
            self._reserved += size
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._read_started = None
        if self._rejected or self._closing:
            return
        if self._awaiting:  # the whole body came in the read that announced it
            self._intake.forget(self)
            self._intake.inflight_bytes += self._awaiting
            self._reserved, self._awaiting = self._awaiting, 0
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        method = self._parser.get_method().decode("latin-1")
        slot = _Slot(self._parser.should_keep_alive(), self._parser.get_http_version() == "1.0")
        slot.size, self._reserved = self._reserved, 0
        self._held += slot.size
        self._slots.append(slot)
        if not slot.keep_alive:  # requests pipelined after the last one are not run
            self._closing = True
        outcome = self._api.handle(method, self._url, self._headers, body)
        if isinstance(outcome, Reply):
            slot.data = _encode(outcome, slot.keep_alive, slot.http10)
            self._flush()
        else:
            slot.pending = outcome
            outcome.ticket.on_done = lambda: self._settle(slot)
        self._update_reading()

    # -- intake ----------------------------------------------------------------------------------

    def granted(self, size: int) -> None:
        """The Intake reserved the `size` body bytes this connection waited for: read on."""
        self._awaiting = 0
        self._reserved = size
        self._update_reading()
        self._continue()

    def _continue(self) -> None:
        if self._headers.get("expect", "").lower() == "100-continue" and self._transport:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _drop_reservation(self) -> None:
        """Give back what the request being read reserved (it will never be answered)."""
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
            slot.data = _encode(self._api.encode(pending), slot.keep_alive, slot.http10)
            self._flush()

    def _flush(self) -> None:
        transport = self._transport
        slots = self._slots
        while slots and slots[0].data is not None and transport is not None:
            slot = slots.popleft()
            transport.write(slot.data)  # type: ignore[arg-type]
            if slot.size:
                self._held -= slot.size
                self._intake.release(slot.size)
            if not slot.keep_alive:
                self._linger()
                return
        self._update_reading()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or self._lingering:
            return
        should_pause = (
            self._writing_paused
            or len(self._slots) >= _MAX_PIPELINED
            or self._held >= self._max_held
            or self._awaiting > 0
        )
        if should_pause != self._reading_paused:
            self._reading_paused = should_pause
            if should_pause:
                transport.pause_reading()
                self._paused_at = self._loop.time()
            else:
                transport.resume_reading()
                if self._read_started is not None:  # time spent paused by us is not the client's
                    self._read_started += self._loop.time() - self._paused_at

    def _count_header(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self._max_header and not self._rejected:
            self._fail(431, f"request head is over the {self._max_header}-byte limit")

    def _fail(self, status: int, message: str, *, retry_after: bool = False) -> None:
        """Answer a request that cannot be parsed or read further, then close the connection."""
        self._rejected = True
        self._closing = True
        self._read_started = None
        self._drop_reservation()
        self._body = []
        reply = _encode(_error(status, message, retry_after=retry_after), False)
        self._slots.append(_Slot(keep_alive=False, data=reply))
        if self._transport is not None and not self._reading_paused:
            self._transport.pause_reading()
            self._reading_paused = True
        self._flush()

    def _close(self) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    def _linger(self) -> None:
        """Close after the last response: send FIN, drain the client's bytes until it closes too."""
        transport = self._transport
        if transport is None or not transport.can_write_eof():
            self._close()
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
        self._timer = self._loop.call_later(_LINGER_S, self._close)

    def _withdraw(self) -> None:
        """Cancel the requests that will never be answered on this connection, if not run yet."""
        released = 0
        for slot in self._slots:
            if slot.pending is not None:
                slot.pending.ticket.future.cancel()
            released += slot.size
        self._slots.clear()
        if released:
            self._held -= released
            self._intake.release(released)

    def _check_timeouts(self) -> None:
        """The connection's one timer: closes it when idle too long, answers 408 to a request
        that arrives too slowly, else runs again by the next deadline."""
        self._timer = None
        if self._transport is None or self._lingering:
            return
        now = self._loop.time()
        started = self._read_started
        if started is not None and not self._reading_paused:
            deadline = started + self._read_timeout + self._body_bytes / self._min_rate
            if now >= deadline:
                self._read_too_slow(now - started)
                return
        elif started is None and not self._slots:
            deadline = self._last_active + self._idle_timeout
            if now >= deadline:
                self._close()
                return
        else:  # waiting for responses, or paused by us: no deadline runs
            deadline = now + self._idle_timeout
        # NOTE: never later than one read timeout, so a request that begins after this check
        # is still caught on time without a timer of its own.
        wake = min(deadline, now + self._read_timeout)
        self._timer = self._loop.call_at(max(wake, now + 0.01), self._check_timeouts)

    def _read_too_slow(self, elapsed: float) -> None:
        self._intake.read_timeouts += 1
        got = f"{self._header_bytes} bytes of head and {self._body_bytes} of body"
        self._fail(
            408,
            f"the request did not arrive in time ({got} in {elapsed:.1f} s); a request must "
            f"arrive within {self._read_timeout:g} s of its first byte, plus 1 s per "
            f"{self._min_rate:.0f} bytes of body",
        )

    def shutdown(self) -> None:
        """Close after the responses already owed; used when the server stops."""
        self._closing = True
        if not self._slots:
            self._close()
        else:
            self._slots[-1].keep_alive = False


def _error(status: int, message: str, *, retry_after: bool = False) -> Reply:
    headers: tuple[tuple[bytes, bytes], ...] = (_JSON,)
    if retry_after:
        headers += ((b"Retry-After", b"1"),)
    return Reply(status, orjson.dumps({"error": message}), headers)


def _encode(reply: Reply, keep_alive: bool, http10: bool = False) -> bytes:
    head = [
        b"HTTP/1.1 %d %s\r\n" % (reply.status, _REASONS.get(reply.status, b"Unknown")),
        b"Content-Length: %d\r\n" % len(reply.body),
    ]
    head.extend(b"%s: %s\r\n" % pair for pair in reply.headers)
    if not keep_alive:
        head.append(b"Connection: close\r\n")
    elif http10:  # an HTTP/1.0 client assumes the connection closes unless told otherwise
        head.append(b"Connection: keep-alive\r\n")
    head.append(b"\r\n")
    head.append(reply.body)
    return b"".join(head)


async def serve_http(
    api: RestApi,
    settings: ServerSettings,
    connections: set[HttpConnection],
    intake: Intake | None = None,
) -> asyncio.Server:
    """Listen on `settings.host:http_port` (0: any free port); returns the started server.

    `intake` (made from `settings` when not given) bounds and counts what the server takes in;
    pass one to read its `statistics()`."""
    loop = asyncio.get_running_loop()
    shared = intake if intake is not None else Intake(settings)

    def factory() -> Any:
        return HttpConnection(api, settings, connections, shared)

    return await loop.create_server(
        factory, settings.host, settings.http_port, reuse_address=True, backlog=1024
    )
