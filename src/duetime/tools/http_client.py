"""The load tools' HTTP/1.1 client: keep-alive connections on asyncio Protocols, never pipelined.

Open loop must not wait behind slow answers, so a connection carries one request at a time: a
send takes an idle connection, or opens a new one (up to a cap; past it the request waits for
the first connection to free, and is counted). Pipelining instead would hold an answer behind
every answer ahead of it on its connection: a request with a 10 ms due time queued behind one
with 50 ms would come back late however early the server finished it (and real v2 clients,
tritonclient's pool or httpx, do not pipeline). Every request ends through one `Answered`
callback with its HTTP status.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import httptools
import orjson

from duetime.frontend.arrival import JIFFY_MAX_NS, last_data_age_ns
from duetime.tools.outcomes import DUE_PASSED_UNSENT

NO_STATUS = 0
"""The status of a request that got no answer (connection lost, client fault)."""
NO_CONNECTION = -1
"""The status of a request that never went out: its connection could not be opened."""
DUE_UNSENT = -2
"""The status of a request that never went out: it waited for a free connection until its due
time had passed (see `HttpPool.on_waited`)."""

CONNECT_TIMEOUT_S = 10.0


async def resolve(host: str, port: int) -> list[str]:
    """`host`'s addresses (IP literals), resolved once, in the order to try them; OSError with
    one line saying so when the name does not resolve."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OSError(f"cannot resolve the host name {host!r}: {exc.strerror or exc}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise OSError(f"cannot resolve the host name {host!r}: no address")
    return addresses


ONE_SEGMENT_BYTES = 1400
"""An answer of at most this many bytes comes in one TCP segment (an Ethernet MTU's worth)."""
READ_LATE_NS = 1_000_000
"""An answer read this long after its loop turn began counts as read late (`HttpPool.read_late`)."""


class Answered(Protocol):
    """One request's end: its id, HTTP-style status (NO_STATUS: none came; NO_CONNECTION: it
    could not be sent), the answer's body
    when kept (error bodies always), the v2 JSON head's length within it (None: all JSON),
    what went wrong when no answer came, and when the answer came if known before it was read
    (`time.perf_counter_ns`, see `HttpPool.begin_turn`; None: now)."""

    def __call__(
        self, rid: int, status: int, body: bytes | None, head: int | None, message: str | None,
        came: int | None = None,
    ) -> None: ...  # fmt: skip


ERROR_TEXT_CHARS = 200
"""An error message is cut to this many characters (a server's HTML error page, say)."""


def error_text(status: int, body: bytes) -> str:
    """`HTTP <status>: <message>`, the message taken from a v2 `{"error": ...}` body if any; one
    printable line (see `one_line`), at most ERROR_TEXT_CHARS long."""
    text = body[: 4 * ERROR_TEXT_CHARS].decode("utf-8", "replace")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and "error" in doc:
        text = str(doc["error"])
    text = one_line(text, ERROR_TEXT_CHARS)
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"


def one_line(text: str, limit: int) -> str:
    """`text` safe to print on a terminal: whitespace runs become one space, other characters
    that do not print (NUL, escapes, a binary protocol's bytes) their `\\xNN` escape, and it is
    cut to `limit` characters ("..." at the end when cut).

    NOTE: every refusal's message passes here as the load generator reads it, and the walk
    character by character took 27 µs for a 250-character one: at 7,000 refusals a second
    a fifth of the generator's core. Text that prints as it is is only spaced and cut."""
    text = " ".join(text.split())
    if text.isprintable():
        return text if len(text) <= limit else text[: limit - 3] + "..."
    pieces = [c if c.isprintable() else repr(c)[1:-1] for c in text]
    if sum(len(piece) for piece in pieces) <= limit:
        return "".join(pieces)
    kept, length = [], 0
    for piece in pieces:  # (never half an escape)
        if length + len(piece) > limit - 3:
            break
        kept.append(piece)
        length += len(piece)
    return "".join(kept) + "..."


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection carrying at most one request at a time."""

    def __init__(self, pool: HttpPool) -> None:
        self._pool = pool
        self._transport: Any = None
        self._parser = httptools.HttpResponseParser(self)
        self._rid = -1
        self._pending: bytes | None = None
        self._status = 0
        self._head: int | None = None
        self._body: list[bytes] | None = None
        self._lead = b""
        """The answer's first byte: a v2 inference response is a JSON object."""
        self._reads = 0
        self._read_bytes = 0
        self._begun_in = 0
        """The read the answer being read began in (`_reads`)."""
        self._sock: Any = None
        """The TCP socket, for the kernel's word on when an answer came (see `_came_by_kernel`)."""
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

    def fail(self, message: str, status: int = NO_STATUS) -> None:
        """End the request this connection carries (if any) without an answer."""
        rid, self._rid = self._rid, -1
        if rid >= 0:
            self._pool.answered(rid, status, None, None, message)

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                self._sock = sock
        self._transport = transport
        pending, self._pending = self._pending, None
        if pending is not None:
            transport.write(pending)  # type: ignore[attr-defined]
        else:
            self._pool.freed(self)

    def data_received(self, data: bytes) -> None:
        pool = self._pool
        if not pool.turn_ns:
            pool.begin_turn()
        self._reads += 1
        self._read_bytes = len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(f"malformed HTTP response from the server: {exc}")
            self.close()

    def _came_by_kernel(self, turn_ns: int, now: int) -> int:
        """When an answer read whole, long into its turn, came: not before the turn began, nor
        before the kernel's word on the socket's last data (see `begin_turn`).

        NOTE: a turn is more than one poll where the loop has many sockets to read: libuv polls
        again, without waiting, when a poll fills its array, and the sockets the later polls
        find became readable while the first one's were read. Their answers counted from the
        turn's start (found by a tester: a fake server that answers at once, sent 45,000
        requests/s, had 34-48% of its answers timed before it wrote them, by up to 257 ms).
        The kernel's age of the socket's last data counts in jiffies, and may say one more than
        the truth: with a jiffy taken off it (the shortest age the kernel gave, as the server's
        `ReadTurn` learns it), it is never early. Not later than now, either; from the turn's
        start where the kernel does not say."""
        sock = self._sock
        age = None if sock is None else last_data_age_ns(sock)
        if age is None:
            return turn_ns
        pool = self._pool
        if 0 < age < pool.jiffy_ns:
            pool.jiffy_ns = age
        return min(now, max(turn_ns, now - age + pool.jiffy_ns))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._transport = None
        self.fail("the server closed the connection" + (f": {exc}" if exc else ""))
        self._pool.lost(self)

    # -- httptools callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._begun_in = self._reads

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"inference-header-content-length":
            self._head = int(value)

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._body = [] if self._pool.keep_bodies or self._status >= 300 else None

    def on_body(self, body: bytes) -> None:
        if not self._lead:
            self._lead = body[:1]
        if self._body is not None:
            self._body.append(body)

    def on_message_complete(self) -> None:
        pool = self._pool
        turn_ns = pool.turn_ns
        now = time.perf_counter_ns()
        if turn_ns and now - turn_ns > READ_LATE_NS:
            pool.read_late += 1
        rid, self._rid = self._rid, -1
        body = None if self._body is None else b"".join(self._body)
        head, self._head = self._head, None
        if rid < 0:
            self.close()  # an answer nobody asked for: this connection cannot be trusted
            return
        # (an answer one read brought whole, in one segment, was all there as the turn began)
        whole = self._begun_in == self._reads and self._read_bytes <= ONE_SEGMENT_BYTES
        came = turn_ns if whole and turn_ns else None
        if came is not None and now - came > READ_LATE_NS:
            came = self._came_by_kernel(came, now)
        if not self._parser.should_keep_alive():
            self.closed = True  # the server closes it; connection_lost follows
        lead, self._lead = self._lead, b""
        status = self._status
        if not self.closed:
            # (free before the answer is told: a closed-loop client sends its next request
            # from that, and found no idle connection: N clients kept N + 1 open; found by a
            # tester)
            pool.freed(self)
        if 200 <= status < 300 and lead != b"{":  # (a server that is no v2 one)
            pool.answered(rid, NO_STATUS, None, None, (
                f"HTTP {status}, but not a v2 inference response (it does not start "
                f"with a JSON object: {lead!r}); is the target a v2 server?"
            ))  # fmt: skip
        else:
            pool.answered(rid, status, body, head, None, came)


class HttpPool:
    """Keep-alive connections to `host:port`, each with at most one request outstanding."""

    def __init__(
        self, host: str, port: int, answered: Answered, *, max_connections: int,
        keep_bodies: bool = False, waited: Callable[[int, bytes], bytes | None] | None = None,
    ) -> None:  # fmt: skip
        self.host = host
        self.port = port
        self.answered = answered
        self.keep_bodies = keep_bodies
        self.on_waited = waited
        """Given a request that waited for a free connection, as it goes (its id and payload):
        the payload to send instead (`duetime bench` shortens its due time by the wait), or
        None where it is not to be sent: it ends with status `DUE_UNSENT`."""
        self.max_connections = max_connections
        self.opened = 0
        self.waited = 0
        self.read_late = 0
        """Answers read more than READ_LATE_NS after the loop's turn that read them began (see
        `begin_turn`)."""
        self.turn_ns = 0
        """When the loop's current turn of reads began (`time.perf_counter_ns`); 0 outside one."""
        self.jiffy_ns = JIFFY_MAX_NS
        """The kernel's tick, as the shortest age of a socket's last data it gave."""
        self._live: set[_Connection] = set()
        self._idle: list[_Connection] = []
        self._waiting: deque[tuple[int, bytes]] = deque()
        self._connecting: set[asyncio.Task[None]] = set()
        self._closing = False
        self._address = host
        """The address every connection goes to: `host` resolved once, by `open`."""

    async def open(self, connections: int) -> None:
        """Resolve the host once, then open `connections` before the run (more open on demand);
        OSError if the name does not resolve or a connection cannot open within
        CONNECT_TIMEOUT_S."""
        # NOTE: resolved here once, not by every connection: a name that does not resolve
        # would fail each of them (their lookups ending after the loop closed), and a lookup
        # would delay every connection opened on demand during the run
        addresses = await resolve(self.host, self.port)
        conns = [self._new() for _ in range(connections)]
        connecting = asyncio.ensure_future(self._connect_all(conns, addresses))
        # NOTE: when the caller is cancelled (Ctrl-C while connecting), wait_for cancels the
        # task, which then ends with an error nobody reads ("exception was never retrieved").
        connecting.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            await asyncio.wait_for(connecting, CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            await self.aclose()
            raise OSError(f"cannot connect to {self.host}:{self.port}: {exc}") from None

    async def _connect_all(self, conns: list[_Connection], addresses: list[str]) -> None:
        """The first connection tries each address in turn and keeps the first that answers;
        the others go there together (all are cancelled when one fails)."""
        if not conns:
            return
        for address in addresses:
            try:
                await self._connect(conns[0], address)
            except OSError:
                if address == addresses[-1]:
                    raise
                continue
            self._address = address
            break
        rest = [asyncio.ensure_future(self._connect(c)) for c in conns[1:]]
        try:
            await asyncio.gather(*rest)
        finally:
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

    def begin_turn(self) -> None:
        """Call at a turn's first read: its answers were all in their sockets by now.

        NOTE: a generator whose loop is busy reads late what came: its own delay is counted in
        the server's latency. mlp at ~2x capacity, 2-core VM, client and server clocks joined:
        late answers had been written 30-40 ms (median) before the generator read them, which
        the kernel's age of the sockets' last data (TCP_INFO) confirmed, while sends kept to
        the schedule (their p99 lag 0.5 ms: each answer read also sends what is due). An
        answer read long after its turn began waited at least that long; counting those shows
        such a run for what it is.

        NOTE: and an answer one read brought whole, small enough to come in one segment, had
        come by the turn's start (the loop's poll found its socket readable, and it was all
        that socket was owed): it counts as come then (`Answered`'s `came`), not when the loop
        got to it. A bigger one, or one read in pieces, may have still been coming: it counts when
        read. The same run (mlp, ~2x capacity) read a batch's 64 answers in one turn, each
        parsed and counted in turn for ~70 µs: the last ones 4 ms after they came, past 2 ms
        due times by the generator's delay alone. (A server that wrote an answer's head, then
        its body later, and whose two pieces one late read took together, would have the answer
        counted from before its body came: v2 servers write an answer at once.)"""
        self.turn_ns = time.perf_counter_ns()
        asyncio.get_running_loop().call_soon(self._end_turn)

    def _end_turn(self) -> None:
        self.turn_ns = 0

    def _new(self) -> _Connection:
        connection = _Connection(self)
        self._live.add(connection)
        self.opened += 1
        return connection

    async def _connect(self, connection: _Connection, address: str | None = None) -> None:
        loop = asyncio.get_running_loop()
        await loop.create_connection(lambda: connection, address or self._address, self.port)

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
            message = f"cannot connect to {self.host}:{self.port}: {exc}"
            connection.fail(message, NO_CONNECTION)
            self._live.discard(connection)

    def freed(self, connection: _Connection) -> None:
        waiting = self._next_waiting()
        if waiting is not None:
            connection.send(*waiting)
        else:
            self._idle.append(connection)

    def lost(self, connection: _Connection) -> None:
        self._live.discard(connection)
        waiting = self._next_waiting()
        if waiting is not None:  # room for a new connection now
            self.send(*waiting)

    def _next_waiting(self) -> tuple[int, bytes] | None:
        """The next request that waited for a connection and is still to be sent (those that
        `on_waited` drops end `DUE_UNSENT`); None: none (or the pool is closing)."""
        while self._waiting and not self._closing:
            rid, payload = self._waiting.popleft()
            if self.on_waited is None:
                return rid, payload
            sent = self.on_waited(rid, payload)
            if sent is not None:
                return rid, sent
            self.answered(rid, DUE_UNSENT, None, None, DUE_PASSED_UNSENT)
        return None

    async def aclose(self) -> None:
        """Close every connection; requests still owed end without an answer."""
        self._closing = True
        for task in list(self._connecting):
            task.cancel()
        await asyncio.gather(*self._connecting, return_exceptions=True)
        for connection in list(self._live):
            connection.fail("the run ended before the answer came")
            connection.close()
        while self._waiting:
            rid, _ = self._waiting.popleft()
            self.answered(rid, NO_STATUS, None, None, "the run ended before it could be sent")
        await asyncio.sleep(0)  # let the loop deliver connection_lost
