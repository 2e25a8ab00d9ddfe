"""The load generator's HTTP/1.1 client: a pool of keep-alive connections on asyncio Protocols.

Each `HttpLane` is one connection whose responses httptools parses; answers come back in the
order requests went out, so a lane may carry several at once (pipelining). The pool sends on an
idle lane when there is one and otherwise round robin, counting those pipelined sends (a request
queued behind another on the same connection). A lost connection is reopened; requests sent to
it meanwhile wait in its backlog, and fail if it cannot be reopened.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

import httptools
import orjson

from duetime.tools.outcomes import Outcome, outcome_of_http_status

Completion = Callable[[int, Outcome, str | None], None]
"""Called once per request: its id, how it ended, and the server's message when it failed."""

_REOPEN_FIRST_S = 0.05
_REOPEN_MAX_S = 1.0


class HttpLane(asyncio.Protocol):
    """One keep-alive connection of an `HttpPool` (see the module docstring)."""

    def __init__(self, pool: HttpPool) -> None:
        self._pool = pool
        self._transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self._parser = httptools.HttpResponseParser(self)
        self._owed: deque[int] = deque()
        self._backlog: list[tuple[int, bytes]] = []
        self._status = 0
        self._body: list[bytes] | None = None
        self._lost: asyncio.Future[None] | None = None

    @property
    def idle(self) -> bool:
        return self._transport is not None and not self._owed and not self._backlog

    def send(self, rid: int, data: bytes) -> None:
        transport = self._transport
        if transport is None:
            self._backlog.append((rid, data))
            self._pool.reopen(self)
            return
        self._owed.append(rid)
        transport.write(data)

    def fail_backlog(self, reason: str) -> None:
        backlog, self._backlog = self._backlog, []
        for rid, _ in backlog:
            self._pool.complete(rid, Outcome.ERROR, reason)

    async def aclose(self) -> None:
        """Close the connection and wait until the loop has let go of it."""
        transport, lost = self._transport, self._lost
        if transport is None or lost is None:
            return
        transport.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(lost), 5.0)

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._transport = transport
        self._lost = asyncio.get_running_loop().create_future()
        self._parser = httptools.HttpResponseParser(self)
        backlog, self._backlog = self._backlog, []
        for rid, data in backlog:
            self.send(rid, data)
        if not self._owed:
            self._pool.became_idle(self)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._drop(f"malformed HTTP response from the server: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        owed, self._owed = self._owed, deque()
        reason = f"connection lost with {len(owed)} answers owed" + (f": {exc}" if exc else "")
        for rid in owed:
            self._pool.complete(rid, Outcome.ERROR, reason)
        self._pool.lost(self)

    # -- httptools callbacks -------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._body = [] if self._status >= 300 else None

    def on_body(self, body: bytes) -> None:
        if self._body is not None:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if not self._owed:
            self._drop(f"the server sent a response ({self._status}) nobody asked for")
            return
        rid = self._owed.popleft()
        status = self._status
        if self._body is None:
            self._pool.complete(rid, Outcome.OK, None)
        else:
            message = error_text(status, b"".join(self._body))
            self._pool.complete(rid, outcome_of_http_status(status), message)
        if not self._owed and not self._backlog:
            self._pool.became_idle(self)

    def _drop(self, reason: str) -> None:
        owed, self._owed = self._owed, deque()
        for rid in owed:
            self._pool.complete(rid, Outcome.ERROR, reason)
        if self._transport is not None:
            self._transport.close()


def error_text(status: int, body: bytes) -> str:
    """`HTTP <status>: <message>`, the message taken from a v2 `{"error": ...}` body if any."""
    text = body[:500].decode("utf-8", "replace").strip()
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and "error" in doc:
        text = str(doc["error"])
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"


class HttpPool:
    """`lanes` keep-alive connections to `host:port`; `send(rid, request_bytes, lane)`.

    With `lane` None the request goes to an idle connection, or round robin when all are busy;
    with a lane index it goes to that connection (a closed-loop client's own). Every request
    ends through `complete`, never synchronously inside `send`.
    """

    def __init__(self, host: str, port: int, complete: Completion) -> None:
        self.host = host
        self.port = port
        self.complete = complete
        self.pipelined = 0
        self._lanes: list[HttpLane] = []
        self._idle: list[HttpLane] = []
        self._turn = 0
        self._closing = False
        self._reopening: dict[HttpLane, asyncio.Task[None]] = {}

    async def open(self, lanes: int) -> None:
        """Connect every lane; raise OSError (after closing the others) if any cannot connect."""
        self._lanes = [HttpLane(self) for _ in range(lanes)]
        try:
            results = await asyncio.gather(
                *(self._connect(lane) for lane in self._lanes), return_exceptions=True
            )
        except BaseException:  # cancelled (a connect timeout): close what did connect
            await self.aclose()
            raise
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            await self.aclose()
            raise failure

    async def _connect(self, lane: HttpLane) -> None:
        loop = asyncio.get_running_loop()
        await loop.create_connection(lambda: lane, self.host, self.port)

    def send(self, rid: int, data: bytes, lane: int | None) -> None:
        if lane is not None:
            self._lanes[lane].send(rid, data)
            return
        idle = self._idle
        while idle:
            candidate = idle.pop()
            if candidate.idle:
                candidate.send(rid, data)
                return
        lanes = self._lanes
        turn = self._turn
        self._turn = (turn + 1) % len(lanes)
        self.pipelined += 1
        lanes[turn].send(rid, data)

    def became_idle(self, lane: HttpLane) -> None:
        self._idle.append(lane)

    def lost(self, lane: HttpLane) -> None:
        self.reopen(lane)

    def reopen(self, lane: HttpLane) -> None:
        if self._closing or lane in self._reopening:
            return
        self._reopening[lane] = asyncio.get_running_loop().create_task(self._reopen(lane))

    async def _reopen(self, lane: HttpLane) -> None:
        delay = _REOPEN_FIRST_S
        try:
            while not self._closing:
                await asyncio.sleep(delay)
                try:
                    await self._connect(lane)
                    return
                except OSError as exc:
                    lane.fail_backlog(f"cannot reconnect to {self.host}:{self.port}: {exc}")
                delay = min(2 * delay, _REOPEN_MAX_S)
        finally:
            self._reopening.pop(lane, None)

    async def aclose(self) -> None:
        """Close every connection; requests still owed end as errors."""
        self._closing = True
        tasks = list(self._reopening.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(lane.aclose() for lane in self._lanes))
        for lane in self._lanes:
            lane.fail_backlog("the run ended before the connection could be reopened")
