"""A small HTTP/1.1 server on httptools for the v2 REST API: the fast path of duetime.

One `HttpConnection` per TCP connection. It parses with httptools, answers pipelined requests in
order, supports Content-Length and chunked bodies and `Expect: 100-continue`, limits header and
body sizes, closes idle keep-alive connections, and pauses reading while too many responses are
owed. A connection that drops cancels its unanswered requests, so they are never run.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

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


@dataclass(slots=True, eq=False)
class _Slot:
    """One request's place in the pipeline; `data` is set once its response is encoded."""

    keep_alive: bool
    http10: bool = False
    data: bytes | None = None
    pending: PendingReply | None = None


class HttpConnection(asyncio.Protocol):
    """The protocol for one client connection (see the module docstring)."""

    def __init__(self, api: RestApi, settings: ServerSettings, connections: set[HttpConnection]):
        self._api = api
        self._max_body = settings.max_body_bytes
        self._max_header = settings.max_header_bytes
        self._idle_timeout = settings.idle_timeout_s
        self._connections = connections
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._slots: deque[_Slot] = deque()
        self._reading_paused = False
        self._writing_paused = False
        self._closing = False
        self._lingering = False
        self._last_active = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._reset_message()

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self._connections.add(self)
        self._last_active = self._loop.time()
        self._idle_timer = self._loop.call_later(self._idle_timeout, self._check_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        self._closing = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._withdraw()  # the client is gone
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
        self._rejected = False

    def on_message_begin(self) -> None:
        self._reset_message()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_header(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header(len(name) + len(value))
        if not self._rejected:
            self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._rejected:
            return
        length = self._headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self._max_body:
            self._fail(413, f"body of {length} bytes is over the {self._max_body}-byte limit")
            return
        if self._headers.get("expect", "").lower() == "100-continue" and self._transport:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._rejected:
            return
        self._body_bytes += len(body)
        if self._body_bytes > self._max_body:
            self._fail(413, f"body is over the {self._max_body}-byte limit")
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._rejected or self._closing:
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        method = self._parser.get_method().decode("latin-1")
        slot = _Slot(self._parser.should_keep_alive(), self._parser.get_http_version() == "1.0")
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
            if not slot.keep_alive:
                self._linger()
                return
        self._update_reading()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None:
            return
        should_pause = self._writing_paused or len(self._slots) >= _MAX_PIPELINED
        if should_pause != self._reading_paused:
            self._reading_paused = should_pause
            if should_pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _count_header(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self._max_header and not self._rejected:
            self._fail(431, f"request head is over the {self._max_header}-byte limit")

    def _fail(self, status: int, message: str) -> None:
        """Answer a request that cannot be parsed or read further, then close the connection."""
        self._rejected = True
        self._closing = True
        body = orjson.dumps({"error": message})
        self._slots.append(_Slot(keep_alive=False, data=_encode(Reply(status, body), False)))
        if self._transport is not None:
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
        transport.write_eof()
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = self._loop.call_later(_LINGER_S, self._close)

    def _withdraw(self) -> None:
        """Cancel the requests that will never be answered on this connection, if not run yet."""
        for slot in self._slots:
            if slot.pending is not None:
                slot.pending.ticket.future.cancel()
        self._slots.clear()

    def _check_idle(self) -> None:
        if self._transport is None:
            return
        deadline = self._last_active + self._idle_timeout
        if not self._slots and self._loop.time() >= deadline:
            self._close()
            return
        self._idle_timer = self._loop.call_at(
            max(deadline, self._loop.time() + 0.1), self._check_idle
        )

    def shutdown(self) -> None:
        """Close after the responses already owed; used when the server stops."""
        self._closing = True
        if not self._slots:
            self._close()
        else:
            self._slots[-1].keep_alive = False


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
    api: RestApi, settings: ServerSettings, connections: set[HttpConnection]
) -> asyncio.Server:
    """Listen on `settings.host:http_port` (0: any free port); returns the started server."""
    loop = asyncio.get_running_loop()

    def factory() -> Any:
        return HttpConnection(api, settings, connections)

    return await loop.create_server(
        factory, settings.host, settings.http_port, reuse_address=True, backlog=1024
    )
