"""A connection's pipelined backlog costs the server little until its turn comes.

A client that wrote 2,000 pipelined inference requests on each of many connections and closed
them, reading nothing, held the event loop for 20 s and more: every request of a read was parsed
and decoded (JSON) at once, however many answers its connection already owed, and the client's
FIN, behind the bytes not read, went unseen while answers were written for no one. Now a
connection parses about `_MAX_PIPELINED` requests ahead of its answers (the rest of a read stays
unparsed), only the next to start is decoded ahead, and a client that left is noticed before
waiting requests start; its backlog is dropped undecoded.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import RunningServer, start_server, stop_server
from conftest import read_answers as answers
from repo_models import scale_model, write_version

from duetime.config import ServerSettings
from duetime.frontend import http, rest

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def scaling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("repo")
    write_version(repo, "scale", 1, scale_model(2.0))
    (repo / "scale" / "config.toml").write_text("max_batch_size = 64\n")
    running, thread = start_server(ServerSettings(model_repository=repo, http_port=0, grpc_port=0))
    yield running
    stop_server(running, thread)


def infer(ident: int | None = None, timeout_us: int | None = None) -> bytes:
    request: dict[str, Any] = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2, 3, 4]}]
    }
    if ident is not None:
        request["id"] = str(ident)
    if timeout_us is not None:
        request["parameters"] = {"timeout": timeout_us}
    body = json.dumps(request).encode()
    return (
        b"POST /v2/models/scale/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body)
    ) + body


def connect(server: RunningServer, timeout: float = 30) -> socket.socket:
    host, port = server.http.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def until(condition: Callable[[], bool], what: str, limit_s: float = 30) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.01)


def scale_server(
    tmp_path_factory: pytest.TempPathFactory, **settings: Any
) -> tuple[RunningServer, threading.Thread]:
    """A server of model 'scale' (y = 2x) with these `settings`, on ports of its own."""
    repo = tmp_path_factory.mktemp("repo")
    write_version(repo, "scale", 1, scale_model(2.0))
    return start_server(ServerSettings(model_repository=repo, http_port=0, grpc_port=0, **settings))


def live(server: RunningServer) -> bool:
    with connect(server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        return sock.recv(100).startswith(b"HTTP/1.1 200 ")


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many inference requests the server decoded (a count in a list)."""
    count = [0]
    parse = rest.parse_infer_request

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return parse(*args, **kwargs)

    monkeypatch.setattr(rest, "parse_infer_request", counted)
    return count


def test_a_pipelining_client_that_leaves_has_its_backlog_dropped_undecoded(
    scaling: RunningServer, decodes: list[int]
) -> None:
    """Every request of its first read (256 KiB: some 1,500 of these) was decoded, then those
    started as answers were written, until a write failed (2,445 decodes for these three)."""
    before = scaling.statistics("scale")
    for _ in range(3):
        with connect(scaling) as sock:
            sock.sendall(infer() * 2000)  # then FIN, reading nothing
    until(lambda: not scaling.server._connections, "closed the connections")
    assert live(scaling)
    after = scaling.statistics("scale")
    ran = after.executions - before.executions
    # (a few each: those its first answers let start before the server heard of its FIN)
    assert decodes[0] <= 3 * 2 * 64, decodes[0]
    assert ran <= decodes[0]
    assert after.succeeded - before.succeeded + after.cancelled - before.cancelled <= decodes[0]


def test_liveness_is_answered_while_pipelining_clients_hold_their_backlogs(
    scaling: RunningServer,
) -> None:
    """Clients that pipeline and read nothing, their connections open."""
    holders = [connect(scaling) for _ in range(20)]
    try:
        for sock in holders:
            sock.sendall(infer() * 1000)
        until(lambda: len(scaling.server._connections) >= 20, "took the connections")
        assert live(scaling)
    finally:
        for sock in holders:
            sock.close()
    until(lambda: not scaling.server._connections, "closed the connections")


def test_a_connection_pipelining_20000_requests_is_answered_in_order(
    scaling: RunningServer,
) -> None:
    count = 20_000
    before = scaling.statistics("scale")
    with connect(scaling, timeout=120) as sock:
        payload = b"".join(infer(ident) for ident in range(count))
        sender = threading.Thread(target=sock.sendall, args=(payload,), daemon=True)
        sender.start()
        with sock.makefile("rb") as stream:
            got = answers(stream, count)
        sender.join(timeout=60)
    assert [status for status, _ in got] == [200] * count
    assert [json.loads(body)["id"] for _, body in got] == [str(i) for i in range(count)]
    after = scaling.statistics("scale")
    assert after.succeeded - before.succeeded == count


@pytest.mark.parametrize("connections", [2])
def test_idle_connections_make_room_for_new_ones_at_the_limit(
    tmp_path_factory: pytest.TempPathFactory, connections: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connections that sent nothing held every slot: new clients got 503 until the idle
    timeout (60 s). At the limit the longest-idle connection with nothing in flight is closed
    for a new one; connections reading a request are not (while their heads come)."""
    monkeypatch.setattr(http, "STALLED_S", 600.0)
    monkeypatch.setattr(http, "IDLE_EVICT_S", 0.0)  # (silent since accepted, however briefly)
    running, thread = scale_server(
        tmp_path_factory, max_connections=connections, request_read_timeout_s=30
    )
    try:
        silent = [connect(running) for _ in range(connections)]
        until(lambda: len(running.server._connections) == connections, "took them")
        assert live(running)  # (one silent connection closed for it)
        assert silent[0].recv(10) == b""  # the longest idle
        # connections each reading a request are not closed: a new one is refused
        busy = [connect(running) for _ in range(connections)]
        for sock in busy:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
        until(
            lambda: (
                all(c._window_start is not None and c._reads for c in running.server._connections)
                and len(running.server._connections) == connections
            ),
            "read the heads begun",
        )
        with connect(running) as late:
            late.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")
            assert late.recv(100).startswith(b"HTTP/1.1 503 ")
        for sock in silent + busy:
            sock.close()
    finally:
        stop_server(running, thread)


def alive(sock: socket.socket) -> bool:
    """Whether a liveness probe on `sock`, kept open, is answered 200 (read whole)."""
    sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")
    with sock.makefile("rb") as stream:
        ((status, _body),) = answers(stream, 1)
    return status == 200


@pytest.mark.parametrize("how", ["silent head", "trickled head", "silent body"])
def test_connections_reading_too_slowly_make_room_before_idle_ones(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A client holding every connection with a byte of a head each (reopening any the server
    closed) had well-behaved clients' idle keep-alive connections closed and new clients
    refused 503 for as long as it went on (found by a tester: 756 requests lost beside it).
    At the limit a connection too slow reading its request is closed first: its head not
    complete `STALLED_S` after its first byte (a byte now and then keeps it no longer: a
    second tester's byte every 0.9 s did), or its body slower than the minimum rate."""
    monkeypatch.setattr(http, "STALLED_S", 0.2)
    running, thread = scale_server(tmp_path_factory, max_connections=3, request_read_timeout_s=30)
    try:
        keeper = connect(running)  # a well-behaved client, idle between its requests
        assert alive(keeper)
        slow = [connect(running) for _ in range(2)]
        first = b"POST /v2/models/scale/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n"
        for sock in slow:
            sock.sendall(first if how == "silent body" else b"GET /v2/health/live HTTP/1.1\r\nX: ")
        until(
            lambda: sum(c in c._intake.reading for c in running.server._connections) == 2,
            "read the requests begun",
        )
        for _ in range(4):  # (0.4 s: a byte every 0.1 s, where silence counts from 0.2 s)
            time.sleep(0.1)
            if how == "trickled head":
                for sock in slow:
                    sock.sendall(b"a")  # (the header's value, a byte at a time)
        with connect(running) as late:  # (one of them closed for it)
            assert alive(late)
        assert slow[0].recv(10) == b"", "the request begun first"
        assert alive(keeper), "the idle one is kept"
        for sock in [keeper, *slow]:
            sock.close()
    finally:
        stop_server(running, thread)


def test_a_request_waiting_for_room_for_its_body_makes_room_last(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connections waiting for room for their bodies (`max_inflight_bytes`) held every slot,
    and new clients were refused 503 for as long as one body as big as the room came at the
    minimum rate (found by a tester). Where nothing else can be closed, the request that
    waited longest is refused 503 (retry later) for the new connection."""
    monkeypatch.setattr(http, "STALLED_S", 0.2)
    room = 64 * 1024
    running, thread = scale_server(
        tmp_path_factory,
        max_connections=3,
        request_read_timeout_s=30,
        max_inflight_bytes=room,
        min_body_rate_bytes_s=1,
    )
    head = (
        f"POST /v2/models/scale/infer HTTP/1.1\r\nHost: t\r\nContent-Length: {room}\r\n\r\n"
    ).encode()
    try:
        filling = connect(running)  # (its body takes all the room, and keeps coming)
        filling.sendall(head)
        until(lambda: bool(running.server._connections), "took it")
        intake = next(iter(running.server._connections))._intake
        until(lambda: intake.reserved == room, "reserved its body")
        waiting = [connect(running) for _ in range(2)]
        for sock in waiting:
            sock.sendall(head)
        until(lambda: len(intake._waiting) == 2, "queued the others")
        for _ in range(4):
            time.sleep(0.1)
            filling.sendall(b"{")  # (above the minimum rate: not too slow)
        with connect(running) as late:
            assert alive(late)
        with waiting[0].makefile("rb") as stream:
            ((status, body),) = answers(stream, 1)
        assert status == 503
        assert b"waited for room" in body
        assert len(intake._waiting) == 1, "the other still waits"
        for sock in [filling, *waiting]:
            sock.close()
    finally:
        stop_server(running, thread)


def test_a_connection_that_sends_nothing_is_closed_after_the_read_timeout(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """It was kept until the idle timeout (60 s): the read timeout ran from a first byte."""
    running, thread = scale_server(tmp_path_factory, request_read_timeout_s=0.5, idle_timeout_s=120)
    try:
        with connect(running, timeout=20) as silent:
            assert silent.recv(10) == b""  # closed, unanswered, well before the idle timeout
        assert live(running)
    finally:
        stop_server(running, thread)
