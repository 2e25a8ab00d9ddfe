"""Answers a client has not read are bounded, per connection and over all of them.

A connection ran 8 requests at once before it knew how big its answers were, and counted an
answer only once it was written: one client pipelining requests for 64 MiB answers and reading
none held ~470 MiB, six of them 2.9 GB. Now a connection runs one request until its first
answer is made, counts every big answer from when it is made until its client has read it, and
starts no request whose answer would not fit its budget; over all connections, while big
answers not yet read reach `max_unsent_answer_bytes`, requests that may make more wait
unstarted, and start once clients read.

The connections here are driven in memory: an API whose answers the test makes, and a transport
whose client reads only when the test says so.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from conftest import RunningServer, read_answers, tight_tile_server

from duetime.clock import MonotonicClock
from duetime.config import ServerSettings
from duetime.frontend.arrival import ReadTurn
from duetime.frontend.http import HttpConnection, Intake
from duetime.frontend.rest import PendingReply, Reply
from duetime.frontend.sharedmemory import SharedMemoryRegions

REQUEST = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
SMALL = REQUEST.replace(b"/m/", b"/s/")
"""An inference request of another model, whose answers are small."""
MiB = 1024 * 1024


@dataclass(eq=False)
class Ticket:
    """A request the API took; the test makes its answer (`answer`)."""

    future: asyncio.Future[Reply]
    on_done: Callable[[], None] | None = None

    def when_done(self, callback: Callable[[], None]) -> None:
        self.on_done = callback

    def answer(self, size: int) -> None:
        self.future.set_result(Reply(200, b"a" * size))
        assert self.on_done is not None
        self.on_done()


@dataclass
class Api:
    """Takes every request; the test answers them."""

    tickets: list[Ticket] = field(default_factory=list)
    accepting = True
    turn = ReadTurn(MonotonicClock())
    shared_memory = SharedMemoryRegions()  # (none registered)

    def handle(self, method: str, target: bytes, headers: Any, body: bytes) -> PendingReply:
        ticket = Ticket(asyncio.get_running_loop().create_future())
        self.tickets.append(ticket)
        return PendingReply(ticket, lambda done: done.future.result())

    def infer_target(self, target: bytes) -> tuple[str, str | None] | None:
        parts = target.split(b"/")
        if len(parts) == 5 and parts[1:3] == [b"v2", b"models"] and parts[4] == b"infer":
            return parts[3].decode(), None
        return None

    def hold_back(self, method: str, target: bytes, headers: Any, body: bytes, **_: Any) -> None:
        return None  # (handled whole once started)

    def answer_estimate(self, pending: PendingReply) -> None:
        return None  # (nothing known from a request's shapes)

    def encode(self, pending: PendingReply) -> Reply:
        return pending.encode(pending.ticket)  # type: ignore[no-any-return]


class Transport:
    """What a connection writes to. Its client reads everything at once while `reading`; else
    the bytes stay in the buffer, and writing pauses past 64 KiB, as asyncio's does."""

    HIGH_WATER = 64 * 1024

    def __init__(self, protocol: HttpConnection) -> None:
        self.protocol = protocol
        self.reading = True
        self.buffered = 0
        self.paused = False
        self.answers = 0

    def write(self, data: bytes) -> None:
        self.answers += data.startswith(b"HTTP/1.1 ")
        if self.reading:
            return
        self.buffered += len(data)
        if not self.paused and self.buffered > self.HIGH_WATER:
            self.paused = True
            self.protocol.pause_writing()

    def writelines(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self.write(piece)

    def read_all(self) -> None:
        """The client reads what the server sent, and goes on reading."""
        self.reading = True
        self.buffered = 0
        if self.paused:
            self.paused = False
            self.protocol.resume_writing()

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None: ...


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


async def turns(count: int = 2) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def connect(api: Api, settings: ServerSettings, intake: Intake) -> tuple[HttpConnection, Transport]:
    connection = HttpConnection(api, settings, set(), intake)  # type: ignore[arg-type]
    transport = Transport(connection)
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


def test_one_request_runs_until_the_size_of_the_answers_is_known() -> None:
    async def body() -> None:
        settings = ServerSettings()
        api = Api()
        connection, transport = connect(api, settings, Intake(settings))
        connection.data_received(REQUEST * 3)
        assert len(api.tickets) == 1  # (8 ran at once: 8 answers of any size)
        api.tickets[0].answer(100)
        await turns()
        assert len(api.tickets) == 3  # small answers: the others run at once
        for ticket in api.tickets[1:]:
            ticket.answer(100)
        assert transport.answers == 3
        connection.connection_lost(None)

    run(body)


def test_an_answer_counts_once_made_and_the_next_waits_until_the_client_reads() -> None:
    async def body() -> None:
        settings = ServerSettings(max_connection_inflight_bytes=3 * MiB)
        api = Api()
        intake = Intake(settings)
        connection, transport = connect(api, settings, intake)
        connection.data_received(REQUEST)
        api.tickets[0].answer(1000)  # answers are small, so far
        await turns()
        transport.reading = False
        connection.data_received(REQUEST * 3)
        assert len(api.tickets) == 4
        api.tickets[2].answer(2 * MiB)  # made, not written: the second is not answered yet
        assert intake.statistics().answer_bytes > 2 * MiB
        connection.data_received(REQUEST)
        await turns()
        assert len(api.tickets) == 4  # 2 MiB made, and two running as big: no room for one more
        api.tickets[1].answer(1000)
        api.tickets[3].answer(1000)
        await turns()
        assert transport.paused
        assert len(api.tickets) == 4  # written, not read
        transport.read_all()
        await turns()
        assert len(api.tickets) == 5
        assert intake.statistics().answer_bytes == 0
        api.tickets[4].answer(1000)
        assert transport.answers == 5
        connection.connection_lost(None)

    run(body)


def test_over_all_connections_big_answers_not_read_hold_back_requests_that_may_make_more() -> None:
    async def body() -> None:
        settings = ServerSettings(max_unsent_answer_bytes=4 * MiB, max_connections=16)
        intake = Intake(settings)  # (answers over 256 KiB count)
        api = Api()
        small, small_transport = connect(api, settings, intake)
        small.data_received(SMALL)
        api.tickets[0].answer(1000)  # this model's answers are small
        await turns()
        greedy, greedy_transport = connect(api, settings, intake)
        greedy_transport.reading = False
        greedy.data_received(REQUEST)
        api.tickets[1].answer(5 * MiB)
        assert intake.statistics().answer_bytes >= 5 * MiB  # over the limit, unread
        fresh, fresh_transport = connect(api, settings, intake)
        fresh.data_received(REQUEST)  # its answers could be as big
        small.data_received(SMALL)  # answers small: not held back
        await turns()
        assert len(api.tickets) == 3
        assert intake.statistics().waiting_for_answers == 1
        api.tickets[2].answer(1000)
        greedy_transport.read_all()
        await turns()
        assert len(api.tickets) == 4  # the fresh connection's request, once the greedy read
        assert intake.statistics().waiting_for_answers == 0
        api.tickets[3].answer(1000)
        assert (small_transport.answers, greedy_transport.answers, fresh_transport.answers) == (
            2, 1, 1,
        )  # fmt: skip
        for connection in (small, greedy, fresh):
            connection.connection_lost(None)

    run(body)


def test_new_connections_asking_together_for_big_answers_start_as_room_allows() -> None:
    """A request's answer counts from its start, at what its model's answers are expected to
    weigh (nothing known of this model: `max_connection_inflight_bytes`; then the largest it
    made), until it is made; then as made, until read. New connections asking at once for big
    answers, none read, start as the bound allows, not all at once (each was let on while
    nothing was made yet: 40 of them asking for 100 MB answers made 4 GB under 1 GiB)."""

    async def body() -> None:
        settings = ServerSettings(
            max_unsent_answer_bytes=8 * MiB, max_connections=16,
            max_connection_inflight_bytes=3 * MiB,
        )  # fmt: skip
        intake = Intake(settings)  # (answers over 512 KiB count)
        api = Api()
        connections = [connect(api, settings, intake) for _ in range(6)]
        for connection, transport in connections:
            transport.reading = False
            connection.data_received(REQUEST)
        await turns()
        assert len(api.tickets) == 3, "3 MiB expected each: the fourth would pass 8 MiB"
        for ticket in api.tickets:
            ticket.answer(2 * MiB)
        await turns()
        assert intake.statistics().answer_bytes >= 6 * MiB
        assert len(api.tickets) == 4, "2 MiB expected now (the model's largest): one more fits"
        api.tickets[3].answer(2 * MiB)
        for _, transport in connections:
            transport.read_all()
        for _ in range(3):
            await turns()
            for ticket in api.tickets[4:]:
                if not ticket.future.done():
                    ticket.answer(2 * MiB)
        assert [transport.answers for _, transport in connections] == [1] * 6
        assert intake.statistics().answer_bytes == 0
        assert intake.expected == 0
        for connection, _ in connections:
            connection.connection_lost(None)

    run(body)


def test_a_request_running_when_its_client_leaves_no_longer_counts_its_expected_answer() -> None:
    """What a request's answer was expected to weigh counts no more once its client has gone:
    else the room it held would be lost for good."""

    async def body() -> None:
        settings = ServerSettings(
            max_unsent_answer_bytes=8 * MiB, max_connections=16,
            max_connection_inflight_bytes=3 * MiB,
        )  # fmt: skip
        intake = Intake(settings)
        api = Api()
        leaving, _ = connect(api, settings, intake)
        leaving.data_received(REQUEST)
        assert intake.expected == 3 * MiB
        leaving.connection_lost(None)
        assert api.tickets[0].future.cancelled(), "withdrawn, never run"
        assert intake.expected == 0
        assert intake.statistics().answer_bytes == 0

    run(body)


def test_a_model_whose_outputs_follow_its_values_is_expected_at_the_unknown_size() -> None:
    """No answer of such a model tells its next one's: after one small answer (a Tile by 1),
    40 new connections asking at once for 8 MB answers all ran under an 8 MiB bound (a
    tester's). A model whose samples tell its size is expected at what it made lately."""
    settings = ServerSettings(
        max_unsent_answer_bytes=8 * MiB, max_connections=16,
        max_connection_inflight_bytes=3 * MiB,
    )  # fmt: skip
    intake = Intake(settings)  # (answers over 512 KiB count)
    intake.guess = lambda model: None if model == "tile" else 1000
    intake.answer_sizes.learned("tile", 300)
    assert intake.expected_answer("tile") == 3 * MiB
    assert intake.expected_answer("fixed") == 0, "its samples' answers are small"
    intake.answer_sizes.learned("fixed", 2 * MiB)
    assert intake.expected_answer("fixed") == 2 * MiB


def over_the_limit(sent: bytes) -> tuple[ServerSettings, Intake, Api, HttpConnection]:
    """A 4 MiB limit on answers unread, and a connection that sent `sent` and reads none of its
    answers, the first of which (5 MiB) is made: over the limit."""
    settings = ServerSettings(max_unsent_answer_bytes=4 * MiB, max_connections=16)
    intake = Intake(settings)
    api = Api()
    greedy, greedy_transport = connect(api, settings, intake)
    greedy_transport.reading = False
    greedy.data_received(sent)
    api.tickets[0].answer(5 * MiB)
    return settings, intake, api, greedy


@pytest.mark.parametrize(
    "request_",
    [
        b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v2/models/m HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    ],
    ids=["health", "metadata", "index"],
)
def test_a_new_connection_s_request_that_is_no_inference_is_never_held_back(
    request_: bytes,
) -> None:
    """A new connection's answers count as big until it has made one: its health probe waited
    behind other clients' big answers unread, and a few clients not reading 40 MB answers failed
    every liveness probe (a new connection each) until the idle timeout dropped them (found by
    a tester). An answer that is no inference's is small whatever its request asks."""

    async def body() -> None:
        settings, intake, api, greedy = over_the_limit(REQUEST)
        assert intake.statistics().answer_bytes >= 5 * MiB  # over the limit, unread
        probe, probe_transport = connect(api, settings, intake)
        probe.data_received(request_)
        await turns()
        assert len(api.tickets) == 2  # started at once
        api.tickets[1].answer(100)
        assert probe_transport.answers == 1
        fresh, _ = connect(api, settings, intake)
        fresh.data_received(REQUEST)  # an inference's answer could be as big: it waits
        await turns()
        assert len(api.tickets) == 2
        assert intake.statistics().waiting_for_answers == 1
        for connection in (greedy, probe, fresh):
            connection.connection_lost(None)

    run(body)


def test_a_client_that_leaves_gives_back_what_its_answers_held() -> None:
    async def body() -> None:
        settings, intake, api, greedy = over_the_limit(REQUEST * 2)
        fresh, _ = connect(api, settings, intake)
        fresh.data_received(REQUEST)
        await turns()
        assert len(api.tickets) == 1
        greedy.connection_lost(None)
        await turns()
        assert intake.statistics().answer_bytes == 0
        assert len(api.tickets) == 2  # the fresh one's: the greedy one's second never runs
        fresh.connection_lost(None)

    run(body)


# -- a real server, its clients reading nothing ----------------------------------------------------


def tile_request(rows: int, timeout_us: int = 0) -> bytes:
    """A binary request for `rows` rows of tile's answer (400 KB each, binary), due `timeout_us`
    after it arrives (0: no due time)."""
    x = np.ones((rows, 4), np.float32).tobytes()
    doc: dict[str, Any] = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4],
                    "parameters": {"binary_data_size": len(x)}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }  # fmt: skip
    if timeout_us:
        doc["parameters"] = {"timeout": timeout_us}
    head = json.dumps(doc).encode()
    return (
        b"POST /v2/models/tile/infer HTTP/1.1\r\nHost: x\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n%s%s"
        % (len(head), len(head) + len(x), head, x)
    )


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server of tile whose big answers not yet read are bounded to 1 MiB."""
    with tight_tile_server(tmp_path_factory.mktemp("unsent-http")) as running:
        yield running


def connected(server: RunningServer, unread: bool = False) -> socket.socket:
    """A client connection; `unread`: one whose client reads little and late (a small receive
    buffer, so the server's answers stay with the server)."""
    sock = socket.socket()
    if unread:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = server.http.rsplit(":", 1)
    sock.connect((host, int(port)))
    sock.settimeout(10)
    return sock


def answers(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    """The status and body of the next `count` answers on `sock`."""
    return read_answers(sock.makefile("rb"), count)


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.01)


def test_a_request_held_back_for_answer_room_is_refused_at_its_due_time(
    tight: RunningServer,
) -> None:
    """It waited unstarted until clients read (a request due in 100 ms had no answer after 3 s),
    and then ran as if it had just arrived."""
    with connected(tight, unread=True) as greedy, connected(tight) as fresh:
        # (8 MB answers, not read: of a 4 MB one the kernel's buffers took all but 1.01 MB once,
        # under the 1 MiB limit, and nothing was held back)
        greedy.sendall(tile_request(20) * 3)
        until(lambda: bool(tight.server._connections), "the server took the connections")
        intake = next(iter(tight.server._connections))._intake
        until(lambda: intake.statistics().answer_bytes >= 1 * MiB, "the answers filled the limit")
        before = tight.statistics("tile")
        started = time.monotonic()
        fresh.sendall(tile_request(1, timeout_us=100_000))
        [(status, body)] = answers(fresh, 1)
        took = time.monotonic() - started
        message = json.loads(body)["error"]
        assert status == 504
        assert message.startswith("Request timeout expired: model 'tile'"), message
        assert "--max-unsent-answer-bytes" in message
        assert 0.05 <= took < 1.5  # (due 0.1 s after it was read; a turn may date it earlier)
        after = tight.statistics("tile")
        assert after.expired == before.expired + 1  # counted as its scheduler counts one
        assert after.executions == before.executions  # never run
        assert intake.statistics().waiting_for_answers == 0  # (out of the line)


def test_new_clients_asking_at_once_for_big_answers_they_do_not_read_stay_within_the_bound(
    tight: RunningServer,
) -> None:
    """Six new connections each ask for an 8 MB answer and read nothing (1 MiB bound): they
    start one at a time (each answer counts from its start, at what tile's answers are expected
    to weigh), not all six while no answer was made yet (48 MB held). Read at last, all six are
    answered."""
    clients = [connected(tight, unread=True) for _ in range(6)]
    try:
        before = tight.statistics("tile")
        for client in clients:
            client.sendall(tile_request(20))
        until(lambda: bool(tight.server._connections), "the server took the connections")
        intake = next(iter(tight.server._connections))._intake
        until(lambda: intake.statistics().answer_bytes >= 1 * MiB, "the answers filled the limit")
        time.sleep(0.3)  # (more would start meanwhile, were they to)
        assert intake.statistics().answer_bytes < 2 * 8 * MiB
        assert tight.statistics("tile").executions - before.executions <= 2
        assert intake.statistics().waiting_for_answers >= 1
        for client in clients:
            [(status, body)] = answers(client, 1)
            assert status == 200, body[:200]
        assert tight.statistics("tile").executions - before.executions == 6
        until(lambda: intake.statistics().answer_bytes == 0, "the answers were read")
        assert intake.expected == 0
    finally:
        for client in clients:
            client.close()


def test_a_pipelined_request_held_back_is_due_after_its_arrival_and_never_runs(
    tight: RunningServer,
) -> None:
    """Its due time counted from when it started: a request due 200 ms after it came, held
    behind answers its client had not read, ran once they were read, 500 ms later."""
    with connected(tight, unread=True) as greedy:
        before = tight.statistics("tile")
        greedy.sendall(tile_request(10) * 2 + tile_request(1, timeout_us=200_000))
        time.sleep(0.5)  # (its due time passes)
        # (a request read last: the kernel's word on the connection's last data is now)
        greedy.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        got = answers(greedy, 4)  # read at last: those without a due time are answered, in order
        assert [status for status, _ in got] == [200, 200, 504, 200]
        message = json.loads(got[2][1])["error"]
        assert message.startswith("Request timeout expired: model 'tile'"), message
        after = tight.statistics("tile")
        assert (after.executions - before.executions, after.expired - before.expired) == (2, 1)
