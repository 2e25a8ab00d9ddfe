"""Hypothesis drives `HttpConnection` over a fake transport: random splits of pipelined requests,
garbage, truncated bodies, huge declared lengths, and many connections sharing a small budget
of body bytes. Whatever arrives, no exception escapes, every answer is well-formed HTTP, and
once the clients are gone nothing stays reserved."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import types
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httptools
import pytest
from fuzz_support import TIMEOUT_S, examples
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from duetime.clock import MonotonicClock
from duetime.config import ServerSettings
from duetime.frontend.arrival import ReadTurn
from duetime.frontend.http import HttpConnection, Intake
from duetime.frontend.rest import PendingReply, Reply
from duetime.frontend.sharedmemory import SharedMemoryRegions
from duetime.loops import new_event_loop
from duetime.overload import LoadShedder
from duetime.repository.registry import Registry

pytestmark = pytest.mark.timeout(TIMEOUT_S)

SETTINGS = ServerSettings(max_body_bytes=4096, max_header_bytes=2048)
ERROR_STATUSES = {400, 408, 413, 431, 503, 505}  # (505: a request line of HTTP/0.9 or 2.0)
FUZZ = settings(max_examples=examples(150), deadline=None, suppress_health_check=list(HealthCheck))


# -- doubles -------------------------------------------------------------------------------------


@dataclass(eq=False)
class Ticket:
    """A pending inference: the test (or the loop) finishes it."""

    future: asyncio.Future[Reply]
    on_done: Any = None

    def when_done(self, callback: Any) -> None:  # as engine.Ticket: at once if settled already
        if self.future.done():
            callback()
        else:
            self.on_done = callback

    def finish(self, reply: Reply) -> None:
        if not self.future.done():
            self.future.set_result(reply)
            if self.on_done is not None:
                self.on_done()


class EchoApi:
    """Answers at once with what it received, except under `/later` (a pending reply that the
    loop finishes), under `/settled` (a pending reply already finished when it is handed over,
    as the scheduler can fail a request within the call that queued it) and, with `hold`, every
    POST (finished by the test)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        hold: bool = False,
    ) -> None:
        self.loop = loop
        self.hold = hold
        self.accepting = True  # (as RestApi: False once the server stops)
        self.shed = 0  # (as RestApi: requests the load shedder refused)
        self.held: list[tuple[Ticket, Reply]] = []
        self.refused: dict[tuple[int, str], int] = {}  # (as RestApi's: the connection counts)
        self.turn = ReadTurn(MonotonicClock())
        self.shared_memory = SharedMemoryRegions()  # (as RestApi's; none registered)
        # (as RestApi's: nothing records, no model is served)
        registry = types.SimpleNamespace(snapshot=types.SimpleNamespace(models={}))
        registry.served_name = functools.partial(Registry.served_name, registry)
        self.engine = types.SimpleNamespace(recorder=None, registry=registry)

    def handle(self, method: str, target: bytes, headers: Any, body: bytes) -> Any:
        reply = Reply(
            200, json.dumps([method, target.decode("latin-1"), zlib.crc32(body)]).encode()
        )
        if target.startswith(b"/settled"):
            ticket = Ticket(self.loop.create_future())
            ticket.finish(reply)
            return PendingReply(ticket, lambda done: done.future.result())
        if target.startswith(b"/later") or (self.hold and method == "POST"):
            ticket = Ticket(self.loop.create_future())
            if self.hold:
                self.held.append((ticket, reply))
            else:
                self.loop.call_soon(ticket.finish, reply)
            return PendingReply(ticket, lambda done: done.future.result())
        return reply

    def encode(self, pending: PendingReply) -> Reply:
        return pending.encode(pending.ticket)  # type: ignore[no-any-return]

    def hold_back(self, method: str, target: bytes, headers: Any, body: bytes, **_: Any) -> None:
        return None  # (handled whole once started)

    def infer_target(self, target: bytes) -> None:
        return None  # (as RestApi's for a target naming no model: weighed as no model's)


class FakeTransport:
    """Holds what the connection writes; delivers the client's bytes only while reading is on,
    as a real transport does; `close` ends the connection on the next loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: HttpConnection) -> None:
        self.loop = loop
        self.protocol = protocol
        self.out = bytearray()
        self.inbox: list[bytes] = []
        self.paused = False
        self.closed = False
        self.eof = False
        self.lost = False

    # the client side
    def send(self, data: bytes) -> None:
        self.inbox.append(data)
        self.pump()

    def pump(self) -> None:
        while self.inbox and not self.paused and not self.closed:
            self.protocol.data_received(self.inbox.pop(0))

    def hang_up(self) -> None:
        if not self.lost:
            self.lost = True
            self.closed = True
            self.protocol.connection_lost(None)

    # the transport interface HttpConnection uses
    def get_extra_info(self, name: str, default: object = None) -> object:
        return default  # (no socket: the kernel is not asked when data came)

    def write(self, data: bytes) -> None:
        assert not self.closed, "wrote after close"
        assert not self.eof, "wrote after the end of the stream"
        self.out += data

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False
        self.loop.call_soon(self.pump)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.call_soon(self.hang_up)

    def is_closing(self) -> bool:
        return self.closed


@dataclass
class Response:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


class _Collector:
    """httptools callbacks gathering complete responses."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.responses: list[Response] = []
        self.headers: dict[bytes, bytes] = {}
        self.body = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        self.responses.append(Response(status, self.headers, self.body))
        self.headers, self.body = {}, b""


def parse_responses(data: bytes) -> list[Response]:
    """Every complete response in `data`; fails the test on anything that is not HTTP/1.1."""
    collector = _Collector()
    collector.parser.feed_data(data)
    return collector.responses


# -- the driver ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = new_event_loop()
    yield loop
    loop.close()


def run(loop: asyncio.AbstractEventLoop, coroutine: Any) -> Any:
    return loop.run_until_complete(coroutine)


async def settle(turns: int = 5) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


@dataclass
class Outcome:
    responses: list[Response]
    closed: bool
    intake: Intake


def converse(
    loop: asyncio.AbstractEventLoop,
    chunks: list[bytes],
    *,
    settings: ServerSettings = SETTINGS,
    hang_up: bool = True,
    shedder: LoadShedder | None = None,
) -> Outcome:
    """One connection: send `chunks` one read at a time, let replies settle, then (with
    `hang_up`) the client goes away. Exceptions from the connection fail the test."""

    async def scenario() -> Outcome:
        intake = Intake(settings)
        api = EchoApi(loop)
        connection = HttpConnection(api, settings, set(), intake, shedder)  # type: ignore[arg-type]
        transport = FakeTransport(loop, connection)
        connection.connection_made(transport)  # type: ignore[arg-type]
        for chunk in chunks:
            transport.send(chunk)
            await settle(2)
        await settle()
        closed = transport.closed or transport.eof
        responses = parse_responses(bytes(transport.out))
        if hang_up:
            transport.hang_up()
            await settle()
            stats = intake.statistics()
            assert (stats.big_body_bytes, stats.waiting_connections, stats.connections) == (0, 0, 0)
        return Outcome(responses, closed, intake)

    return run(loop, scenario())  # type: ignore[no-any-return]


def request(
    method: str, path: str, body: bytes = b"", *, chunked: bool = False, **headers: str
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: fuzz"]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
        pieces = [body[i : i + 7] for i in range(0, len(body), 7)]
        body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    elif body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


# -- strategies ----------------------------------------------------------------------------------

paths = st.sampled_from(["/v2/health/live", "/later/x", "/v2/models/m/infer", "/a?b=c%20d"])
bodies = st.binary(max_size=600)


@st.composite
def valid_requests(draw: st.DrawFn) -> tuple[bytes, list[Any]]:
    """A valid request and the echo it must get back."""
    method = draw(st.sampled_from(["GET", "POST"]))
    path = draw(paths)
    body = draw(bodies) if method == "POST" else b""
    chunked = method == "POST" and draw(st.booleans())
    extra = draw(
        st.dictionaries(st.sampled_from(["X-A", "X-B", "Accept"]), st.text("abc xyz", max_size=20))
    )
    return request(method, path, body, chunked=chunked, **extra), [method, path, zlib.crc32(body)]


# -- properties ----------------------------------------------------------------------------------


@FUZZ
@given(
    st.lists(valid_requests(), min_size=1, max_size=12),
    st.lists(st.integers(0, 10_000), max_size=20),
)
def test_pipelined_requests_split_anywhere_are_answered_in_order(
    loop: asyncio.AbstractEventLoop, pipeline: list[tuple[bytes, list[Any]]], cuts: list[int]
) -> None:
    data = b"".join(raw for raw, _ in pipeline)
    outcome = converse(loop, split(data, cuts))
    assert not outcome.closed
    assert [r.status for r in outcome.responses] == [200] * len(pipeline)
    assert [json.loads(r.body) for r in outcome.responses] == [echo for _, echo in pipeline]


def test_a_reply_settled_before_it_is_handed_over_is_still_written(
    loop: asyncio.AbstractEventLoop,
) -> None:
    pipeline = [request("GET", "/settled/1"), request("GET", "/later/2"), request("GET", "/3")]
    outcome = converse(loop, [b"".join(pipeline)])
    assert not outcome.closed
    assert [json.loads(r.body)[1] for r in outcome.responses] == ["/settled/1", "/later/2", "/3"]
    alone = converse(loop, [request("GET", "/settled/alone")], hang_up=False)
    assert [r.status for r in alone.responses] == [200], "the client is not left waiting"


def test_the_load_shedder_refuses_inference_unread_and_nothing_else(
    loop: asyncio.AbstractEventLoop,
) -> None:
    shedder = LoadShedder()
    shedder.share = 1.0
    pipeline = [
        request("POST", "/v2/models/m/infer", b"{}"),
        request("GET", "/v2/models/m"),
        request("POST", "/v2/models/m/versions/2/infer?x=1", b"{}"),
        request("POST", "/v2/repository/index", b"{}"),
    ]
    outcome = converse(loop, [b"".join(pipeline)], shedder=shedder)
    assert [r.status for r in outcome.responses] == [429, 200, 429, 200]
    refused = outcome.responses[0]
    assert refused.headers.get(b"retry-after") == b"1"
    assert "saturated" in json.loads(refused.body)["error"]
    assert shedder.refused == 2
    assert not outcome.closed  # a refusal keeps the connection


@FUZZ
@given(
    st.lists(valid_requests(), max_size=3),
    st.one_of(
        st.binary(min_size=1, max_size=300),
        st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.lists(
            st.sampled_from(
                [
                    b"GET ",
                    b"POST ",
                    b"/v2",
                    b" HTTP/1.1",
                    b" HTTP/1.0",
                    b"HTTP/2",
                    b"\r\n",
                    b"\n",
                    b"Content-Length: ",
                    b"Transfer-Encoding: chunked",
                    b"Expect: 100-continue",
                    b"Connection: close",
                    b"Connection: upgrade",
                    b"Upgrade: h2c",
                    b"0",
                    b"5",
                    b"-1",
                    b"99999999999999999999",
                    b"ffffffff",
                    b"\r\n\r\n",
                    b":",
                    b" ",
                    b"\x00",
                    b"\xff",
                    b"abc",
                    b"Content-Encoding: gzip",
                ]
            ),
            max_size=40,
        ).map(b"".join),
    ),
    st.lists(st.integers(0, 10_000), max_size=10),
)
def test_garbage_is_answered_or_awaited_never_raised(
    loop: asyncio.AbstractEventLoop,
    prefix: list[tuple[bytes, list[Any]]],
    garbage: bytes,
    cuts: list[int],
) -> None:
    data = b"".join(raw for raw, _ in prefix) + garbage
    outcome = converse(loop, split(data, cuts))
    responses = outcome.responses
    echoes = [echo for _, echo in prefix]
    assert len(responses) >= len(echoes)
    assert [json.loads(r.body) for r in responses[: len(echoes)]] == echoes
    for response in responses[len(echoes) :]:
        assert response.status in ERROR_STATUSES | {100, 200}, response
        if response.status in ERROR_STATUSES:
            assert response.headers[b"connection"] == b"close"
            assert json.loads(response.body)["error"]


@FUZZ
@given(valid_requests(), st.integers(1, 10_000), st.lists(st.integers(0, 10_000), max_size=5))
def test_truncated_request_waits_then_the_client_leaves(
    loop: asyncio.AbstractEventLoop, valid: tuple[bytes, list[Any]], keep: int, cuts: list[int]
) -> None:
    raw, _ = valid
    truncated = raw[: keep % len(raw)]
    outcome = converse(loop, split(truncated, cuts))
    assert outcome.responses == [] or outcome.responses[0].status == 100
    assert not outcome.closed


@FUZZ
@given(
    st.integers(SETTINGS.max_body_bytes + 1, 10**30),
    st.booleans(),
    st.sampled_from([b"", b"x" * 100]),
)
def test_huge_declared_length_gets_413_at_once(
    loop: asyncio.AbstractEventLoop, length: int, expect: bool, some_body: bytes
) -> None:
    head = f"POST /v2/models/m/infer HTTP/1.1\r\nHost: fuzz\r\nContent-Length: {length}\r\n"
    if expect:
        head += "Expect: 100-continue\r\n"
    outcome = converse(loop, [head.encode() + b"\r\n" + some_body])
    (response,) = outcome.responses
    assert response.status in (413, 400)  # 400: llhttp refuses lengths past 2**64
    assert outcome.closed


@FUZZ
@given(st.integers(1, 4096), st.booleans(), st.lists(st.integers(0, 10_000), max_size=8))
def test_body_over_the_limit_while_streaming_gets_413(
    loop: asyncio.AbstractEventLoop, over: int, chunked: bool, cuts: list[int]
) -> None:
    body = b"y" * (SETTINGS.max_body_bytes + over)
    outcome = converse(loop, split(request("POST", "/x", body, chunked=chunked), cuts))
    assert [r.status for r in outcome.responses] == [413]
    assert outcome.closed


def test_many_pipelined_pending_requests_pause_reading_and_all_get_answers(
    loop: asyncio.AbstractEventLoop,
) -> None:
    data = b"".join(request("GET", f"/later/{i}") for i in range(300))
    outcome = converse(loop, [data[i : i + 1000] for i in range(0, len(data), 1000)])
    assert [json.loads(r.body)[1] for r in outcome.responses] == [f"/later/{i}" for i in range(300)]


# -- many connections, one small budget ----------------------------------------------------------

BUDGET = ServerSettings(
    max_body_bytes=1024, max_header_bytes=1024, max_inflight_bytes=2048,
    max_connection_inflight_bytes=1500,
)  # fmt: skip


class Client:
    def __init__(self, transport: FakeTransport) -> None:
        self.transport = transport
        self.sent = 0
        self.complete = 0


class SharedBudget(RuleBasedStateMachine):
    """Connections send bodies against a budget smaller than their sum; replies are held until
    the test settles them. Whatever the order, the Intake's count stays exact, and once every
    reply is settled every request that arrived whole is answered (nothing deadlocks)."""

    clients = Bundle("clients")

    def __init__(self) -> None:
        super().__init__()
        self.loop = new_event_loop()
        self.intake = Intake(BUDGET)
        self.api = EchoApi(self.loop, hold=True)
        self.all: list[Client] = []

    def turn(self) -> None:
        self.loop.run_until_complete(settle(3))

    @initialize(target=clients)
    def first(self) -> Client:
        return self.connect()

    @rule(target=clients)
    def connect(self) -> Client:
        async def accept() -> Client:
            connection = HttpConnection(self.api, BUDGET, set(), self.intake)  # type: ignore[arg-type]
            transport = FakeTransport(self.loop, connection)
            connection.connection_made(transport)  # type: ignore[arg-type]
            return Client(transport)

        client: Client = self.loop.run_until_complete(accept())
        self.all.append(client)
        return client

    @rule(
        client=clients,
        size=st.integers(0, 1024),
        chunked=st.booleans(),
        cuts=st.lists(st.integers(0, 2000), max_size=4),
    )
    def send(self, client: Client, size: int, chunked: bool, cuts: list[int]) -> None:
        raw = request("POST", "/v2/models/m/infer", b"z" * size, chunked=chunked)
        client.sent += 1
        for piece in split(raw, cuts):
            client.transport.send(piece)
            self.turn()

    @rule(count=st.integers(1, 5))
    def answer(self, count: int) -> None:
        for ticket, reply in self.api.held[:count]:
            ticket.finish(reply)
        del self.api.held[:count]
        self.turn()

    @rule(client=consumes(clients))
    def leave(self, client: Client) -> None:
        client.transport.hang_up()
        self.turn()

    @rule(client=clients, paused=st.booleans())
    def client_reads(self, client: Client, paused: bool) -> None:
        if client.transport.lost:
            return
        connection = client.transport.protocol
        connection.pause_writing() if paused else connection.resume_writing()
        self.turn()

    @invariant()
    def count_is_exact(self) -> None:
        stats = self.intake.statistics()
        assert stats.big_body_bytes >= 0
        event(
            f"waiting: {min(stats.waiting_connections, 2)}, refused: {min(stats.refused_bodies, 1)}"
        )
        assert stats.connections == sum(not c.transport.lost for c in self.all)

    def teardown(self) -> None:
        try:
            for client in self.all:  # everyone reads again, every reply is given
                if not client.transport.lost:
                    client.transport.protocol.resume_writing()
            for _ in range(50):  # paced big bodies take a few loop turns per piece
                held, self.api.held = self.api.held, []
                for ticket, reply in held:
                    ticket.finish(reply)
                self.turn()
            for client in self.all:
                if not (client.transport.lost or client.transport.eof):
                    responses = parse_responses(bytes(client.transport.out))
                    answered = [r for r in responses if r.status != 100]
                    assert len(answered) == client.sent, "a request that came whole is unanswered"
                client.transport.hang_up()
            self.turn()
            stats = self.intake.statistics()
            assert (stats.big_body_bytes, stats.waiting_connections, stats.connections) == (0, 0, 0)
        finally:
            self.loop.close()


TestSharedBudget = SharedBudget.TestCase
TestSharedBudget.settings = settings(
    max_examples=examples(60), stateful_step_count=30, deadline=None,
    suppress_health_check=list(HealthCheck),
)  # fmt: skip
