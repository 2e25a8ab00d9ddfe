"""A connection with nothing in flight is closed (its idle timeout, or for a new connection at
`max_connections`) only where its client's next request has not come: closed with that request
unread in the kernel, the connection was reset and the request lost, though the client had sent
it whole before the close (timers run before reads in a loop's turn). Found by a tester (t118):
361 requests lost in 10 s by 40 keep-alive clients at `--max-connections 16`, 45 in 40 s at
`--idle-timeout-s 0.5`."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from conftest import RunningServer, on_loop, start_server, stop_server

from duetime.config import ServerSettings
from duetime.frontend import http

pytestmark = pytest.mark.timeout(60)

LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n"
T = TypeVar("T")


@contextlib.contextmanager
def serving(tmp_path: Path, **settings: object) -> Iterator[RunningServer]:
    running, thread = start_server(
        ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0, metrics=False,
                       **settings)  # type: ignore[arg-type]
    )  # fmt: skip
    try:
        yield running
    finally:
        stop_server(running, thread)


def connect(server: RunningServer) -> socket.socket:
    host, port = server.http.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def answered(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def asked(sock: socket.socket) -> bytes:
    """The head of the answer to a liveness probe sent on `sock`."""
    sock.sendall(LIVE)
    return answered(sock)


def on_loop_once_sent(server: RunningServer, sock: socket.socket, call: Callable[[], T]) -> T:
    """`call()`'s result, run on the server's loop once `sock` has sent a request whole, before
    the loop can read it (timers run before reads: as a timer's callback would find it)."""
    sent = threading.Event()

    def once_sent() -> T:
        sent.wait(10)
        time.sleep(0.05)  # (the request is in the kernel)
        return call()

    result: list[T] = []
    worker = threading.Thread(target=lambda: result.append(on_loop(server, once_sent)))
    worker.start()
    time.sleep(0.05)  # (the loop is in the call)
    sock.sendall(LIVE)
    sent.set()
    worker.join(10)
    (value,) = result
    return value


@pytest.fixture
def idle_soon(tmp_path: Path) -> Iterator[RunningServer]:
    with serving(tmp_path, idle_timeout_s=0.3) as running:
        yield running


def test_a_request_come_as_the_idle_timeout_passes_is_answered(idle_soon: RunningServer) -> None:
    with connect(idle_soon) as sock:
        assert asked(sock).startswith(b"HTTP/1.1 200 ")
        (connection,) = idle_soon.server._connections

        def time_out() -> None:
            connection._last_active -= 1.0  # (its idle timeout has passed)
            connection._check_timeouts()

        on_loop_once_sent(idle_soon, sock, time_out)
        assert answered(sock).startswith(b"HTTP/1.1 200 ")


def test_an_idle_timeout_sends_fin_first_then_drains(idle_soon: RunningServer) -> None:
    """A request crossing the close meets a connection its server has ended (EOF), which reads
    on and drops what comes, not a closed socket, which resets it."""
    with connect(idle_soon) as sock:
        assert asked(sock).startswith(b"HTTP/1.1 200 ")
        time.sleep(0.6)  # (past the timeout: the server has sent its FIN)
        assert sock.recv(100) == b""
        # (draining, it no longer holds a slot of --max-connections)
        assert on_loop(idle_soon, lambda: idle_soon.server._intake.connections) == 0
        for _ in range(3):
            sock.sendall(LIVE)  # (a reset would fail these)
            time.sleep(0.05)


def test_a_connection_with_its_next_request_unread_is_not_taken_for_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "IDLE_EVICT_S", 0.0, raising=False)
    with serving(tmp_path, max_connections=4) as running, connect(running) as sock:
        assert asked(sock).startswith(b"HTTP/1.1 200 ")
        closed = on_loop_once_sent(
            running, sock, lambda: running.server._intake.close_one(running.loop.time())
        )
        assert closed is False  # (the only connection: not idle, its request is there)
        assert answered(sock).startswith(b"HTTP/1.1 200 ")


def test_a_keep_alive_connection_is_closed_for_a_new_one_only_once_idle_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "IDLE_EVICT_S", 0.5, raising=False)
    with serving(tmp_path, max_connections=1) as running, connect(running) as sock:
        assert asked(sock).startswith(b"HTTP/1.1 200 ")
        with connect(running) as new:  # (its client is between two requests: it stays)
            assert answered(new).startswith(b"HTTP/1.1 503 ")
        assert asked(sock).startswith(b"HTTP/1.1 200 ")
        time.sleep(0.6)
        with connect(running) as new:  # (idle long enough now: closed for it)
            assert asked(new).startswith(b"HTTP/1.1 200 ")
        assert sock.recv(100) == b""


def test_a_connection_silent_since_accepted_makes_room_however_young(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """None of its requests can be lost: kept for `IDLE_EVICT_S` too, connections reopened
    every 0.9 s that sent nothing held every slot, and a client got 0 of 20 answers (found by
    a tester)."""
    monkeypatch.setattr(http, "IDLE_EVICT_S", 600.0)
    with serving(tmp_path, max_connections=2) as running:
        silent = [connect(running) for _ in range(2)]
        deadline = time.monotonic() + 10
        while on_loop(running, lambda: len(running.server._intake.silent)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with connect(running) as new:
            assert asked(new).startswith(b"HTTP/1.1 200 ")
        assert silent[0].recv(10) == b""  # (the oldest made room)
        for sock in silent:
            sock.close()
