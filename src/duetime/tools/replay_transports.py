"""Where `duetime replay` sends: HTTP connections that never queue, or gRPC channels.

Open loop must not wait behind slow answers, so an HTTP connection carries one request at a
time: a send takes an idle connection, or opens a new one (up to a cap; past it the request
waits for the first connection to free, and is counted). gRPC multiplexes calls on its
channels, so the load generator's transport is reused as it is, keeping each answer's bytes.
Every request ends through one `Answered` callback with an HTTP-style status.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from typing import Any, Protocol

import grpc
import httptools

from duetime.tools.outcomes import Outcome
from duetime.tools.replay_payloads import GrpcRequest
from duetime.tools.transports import CONNECT_TIMEOUT_S, BenchError, GrpcTransport

NO_STATUS = 0
"""The status of a request that got no answer (connection lost, refused, client fault)."""

HTTP_STATUS_OF_GRPC = {
    "OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504, "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429, "FAILED_PRECONDITION": 400, "ABORTED": 409, "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501, "INTERNAL": 500, "UNAVAILABLE": 503, "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}  # fmt: skip
"""The status duetime's HTTP front end would give for each gRPC code (as captures record)."""


class Answered(Protocol):
    """One request's end: its id, HTTP-style status (NO_STATUS: none came), the answer's body
    when kept (error bodies always), the v2 JSON head's length within it (None: all JSON), and
    what went wrong when no answer came."""

    def __call__(
        self, rid: int, status: int, body: bytes | None, head: int | None, message: str | None
    ) -> None: ...


class ReplayTransport(Protocol):
    opened: int
    """Connections (HTTP) or channels (gRPC) opened in all."""
    waited: int
    """Requests that had to wait for a connection (the cap was reached)."""

    async def open(self, connections: int) -> None: ...

    def send(self, rid: int, payload: Any) -> None: ...

    async def aclose(self) -> None: ...


# -- HTTP ----------------------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection carrying at most one request at a time."""

    def __init__(self, pool: HttpReplayPool) -> None:
        self._pool = pool
        self._transport: Any = None
        self._parser = httptools.HttpResponseParser(self)
        self._rid = -1
        self._pending: bytes | None = None
        self._status = 0
        self._head: int | None = None
        self._body: list[bytes] | None = None
        self.closed = False

    def send(self, rid: int, data: bytes) -> None:
        self._rid = rid
        if self._transport is None:
            self._pending = data
        else:
            self._transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def fail(self, message: str) -> None:
        """End the request this connection carries (if any) without an answer."""
        rid, self._rid = self._rid, -1
        if rid >= 0:
            self._pool.answered(rid, NO_STATUS, None, None, message)

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._transport = transport
        pending, self._pending = self._pending, None
        if pending is not None:
            transport.write(pending)  # type: ignore[attr-defined]
        else:
            self._pool.freed(self)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(f"malformed HTTP response from the server: {exc}")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._transport = None
        self.fail("the server closed the connection" + (f": {exc}" if exc else ""))
        self._pool.lost(self)

    # -- httptools callbacks -------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"inference-header-content-length":
            self._head = int(value)

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._body = [] if self._pool.keep_bodies or self._status >= 300 else None

    def on_body(self, body: bytes) -> None:
        if self._body is not None:
            self._body.append(body)

    def on_message_complete(self) -> None:
        rid, self._rid = self._rid, -1
        body = None if self._body is None else b"".join(self._body)
        head, self._head = self._head, None
        if rid < 0:
            self.close()  # an answer nobody asked for: this connection cannot be trusted
            return
        if not self._parser.should_keep_alive():
            self.closed = True  # the server closes it; connection_lost follows
        self._pool.answered(rid, self._status, body, head, None)
        if not self.closed:
            self._pool.freed(self)


class HttpReplayPool:
    """Keep-alive connections to `host:port`, each with at most one request outstanding."""

    def __init__(
        self, host: str, port: int, answered: Answered, *, keep_bodies: bool,
        max_connections: int = 4096,
    ) -> None:  # fmt: skip
        self.host = host
        self.port = port
        self.answered = answered
        self.keep_bodies = keep_bodies
        self.max_connections = max_connections
        self.opened = 0
        self.waited = 0
        self._live: set[_Connection] = set()
        self._idle: list[_Connection] = []
        self._waiting: deque[tuple[int, bytes]] = deque()
        self._connecting: set[asyncio.Task[None]] = set()
        self._closing = False

    async def open(self, connections: int) -> None:
        """Open `connections` before the run (more open on demand); BenchError if none can."""
        conns = [self._new() for _ in range(connections)]
        try:
            await asyncio.wait_for(
                asyncio.gather(*(self._connect(c) for c in conns)), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            await self.aclose()
            raise BenchError(
                f"--target: cannot connect to {self.host}:{self.port}: {exc}"
            ) from None

    def _new(self) -> _Connection:
        connection = _Connection(self)
        self._live.add(connection)
        self.opened += 1
        return connection

    async def _connect(self, connection: _Connection) -> None:
        loop = asyncio.get_running_loop()
        await loop.create_connection(lambda: connection, self.host, self.port)

    def send(self, rid: int, payload: bytes) -> None:
        idle = self._idle
        while idle:
            connection = idle.pop()
            if not connection.closed:
                connection.send(rid, payload)
                return
        if len(self._live) >= self.max_connections:
            self.waited += 1
            self._waiting.append((rid, payload))
            return
        connection = self._new()
        connection.send(rid, payload)
        task = asyncio.get_running_loop().create_task(self._open_one(connection))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _open_one(self, connection: _Connection) -> None:
        try:
            await self._connect(connection)
        except OSError as exc:
            connection.closed = True
            connection.fail(f"cannot connect to {self.host}:{self.port}: {exc}")
            self._live.discard(connection)

    def freed(self, connection: _Connection) -> None:
        if self._waiting and not self._closing:
            rid, payload = self._waiting.popleft()
            connection.send(rid, payload)
        else:
            self._idle.append(connection)

    def lost(self, connection: _Connection) -> None:
        self._live.discard(connection)
        if self._waiting and not self._closing:  # room for a new connection now
            rid, payload = self._waiting.popleft()
            self.send(rid, payload)

    async def aclose(self) -> None:
        """Close every connection; requests still owed end without an answer."""
        self._closing = True
        for task in list(self._connecting):
            task.cancel()
        await asyncio.gather(*self._connecting, return_exceptions=True)
        for connection in list(self._live):
            connection.fail("the replay ended before the answer came")
            connection.close()
        while self._waiting:
            rid, _ = self._waiting.popleft()
            self.answered(rid, NO_STATUS, None, None, "the replay ended before it could be sent")
        await asyncio.sleep(0)  # let the loop deliver connection_lost


# -- gRPC ----------------------------------------------------------------------------------------


def _unused(rid: int, outcome: Outcome, message: str | None) -> None:
    """GrpcTransport's completion callback; the replay reports through `answered` instead."""


class GrpcReplayTransport(GrpcTransport):
    """The load generator's gRPC channels, calls taken in turn, answers kept as bytes."""

    def __init__(self, target: str, answered: Answered, *, keep_bodies: bool) -> None:
        super().__init__(target, _unused)
        self.answered = answered
        self.keep_bodies = keep_bodies
        self.opened = 0
        self.waited = 0

    async def open(self, lanes: int) -> None:
        await super().open(lanes)
        self.opened = lanes

    def send(self, rid: int, payload: GrpcRequest, lane: int | None = None) -> None:  # type: ignore[override]
        turn = self._turn
        self._turn = (turn + 1) % len(self._calls)
        self._tasks.spawn(self._replay(self._calls[turn], rid, payload))

    async def _replay(self, call: Any, rid: int, payload: GrpcRequest) -> None:
        try:
            data = await call(payload.data, timeout=payload.deadline_s, metadata=payload.metadata)
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            status = HTTP_STATUS_OF_GRPC.get(code, 500)
            self.answered(rid, status, None, None, f"gRPC {code}: {exc.details()}")
            return
        except Exception as exc:  # a fault of the client library: count it, keep going
            self.answered(rid, NO_STATUS, None, None, f"{type(exc).__name__}: {exc}")
            return
        self.answered(rid, 200, data if self.keep_bodies else None, None, None)
