"""Misbehaving clients against a live server: slowloris heads and bodies, garbage, huge bodies,
too many connections, bodies bigger than the room left for them. Each is answered or closed
in bounded time, and a well-behaved client beside them keeps getting its answers.

Real time is the subject here (a client too slow for the server's read timeout), so these
tests trickle bytes on a clock; the server's timeouts are set short to keep them quick.
"""

from __future__ import annotations

import contextlib
import json
import random
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import RunningServer, start_server, stop_server
from fuzz_support import http_request, read_response

from duetime.config import ServerSettings

pytestmark = pytest.mark.timeout(60)

READ_TIMEOUT_S = 0.5
MIN_RATE = 20_000
MAX_BODY = 1024 * 1024
GUARD_S = 10.0
"""Socket timeout: trips only when an expected answer never comes."""


@pytest.fixture(scope="module")
def strict(mlp_repo: Path) -> Iterator[RunningServer]:
    """The demo mlp behind short read timeouts and a 1 MiB room for bodies."""
    settings = ServerSettings(
        model_repository=mlp_repo, http_port=0, grpc_port=0, metrics=False,
        request_read_timeout_s=READ_TIMEOUT_S, min_body_rate_bytes_s=MIN_RATE,
        max_body_bytes=MAX_BODY, max_inflight_bytes=MAX_BODY, max_connections=256,
    )  # fmt: skip
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=GUARD_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def infer_body(pad_to: int = 0) -> bytes:
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 40], "data": [0.25] * 40}]}
    body = json.dumps(doc).encode()
    return body + b" " * max(0, pad_to - len(body))  # JSON allows trailing whitespace


def infer(body: bytes | None = None) -> bytes:
    return http_request("POST", "/v2/models/mlp/infer", infer_body() if body is None else body)


def closed(sock: socket.socket) -> bool:
    """True once the server closes (reads to the end, within the guard)."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


# -- slow clients --------------------------------------------------------------------------------


def test_slow_head_gets_408_then_close(strict: RunningServer) -> None:
    with connect(strict.http) as sock:
        sock.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        sock.settimeout(0.05)
        status = None
        while status is None:  # one header line every 50 ms: never a complete head
            try:
                status, body = read_response(sock)
            except TimeoutError:
                sock.sendall(b"X-Trickle: 1\r\n")
        waited = time.monotonic() - started
        assert status == 408
        assert "head" in json.loads(body)["error"]
        assert READ_TIMEOUT_S * 0.9 <= waited < READ_TIMEOUT_S + 2
        sock.settimeout(GUARD_S)
        assert closed(sock)


def test_slow_body_gets_408(strict: RunningServer) -> None:
    with connect(strict.http) as sock:
        sock.sendall(http_request("POST", "/v2/models/mlp/infer", Content_Length="500000"))
        sock.settimeout(0.05)
        status = None
        while status is None:  # 200 bytes per 50 ms: 4 kB/s, under the 20 kB/s minimum
            try:
                status, body = read_response(sock)
            except TimeoutError:
                sock.sendall(b" " * 200)
        assert status == 408
        assert "bytes/s" in json.loads(body)["error"]


def test_a_body_that_stops_after_its_head_gets_408_after_one_read_timeout(
    strict: RunningServer,
) -> None:
    """The body's window opens at the head's end (it opened at the first check after it, so a
    stalled body waited two read timeouts: found by a tester)."""
    with connect(strict.http) as sock:
        sock.sendall(http_request("POST", "/v2/models/mlp/infer", Content_Length="1000") + b"{ ")
        started = time.monotonic()
        status, body = read_response(sock)
        waited = time.monotonic() - started
    assert status == 408
    assert "bytes/s" in json.loads(body)["error"]
    assert READ_TIMEOUT_S * 0.9 <= waited < READ_TIMEOUT_S * 1.8  # (it was twice the timeout)


def test_body_at_a_steady_rate_above_the_minimum_is_read(strict: RunningServer) -> None:
    """Over several read-timeout periods, at twice the minimum rate: answered, not cut off."""
    body = infer_body(pad_to=int(MIN_RATE * 2 * READ_TIMEOUT_S * 3))
    raw = infer(body)
    with connect(strict.http) as sock:
        step = MIN_RATE * 2 // 20
        for offset in range(0, len(raw), step):
            sock.sendall(raw[offset : offset + step])
            time.sleep(0.05)
        status, _ = read_response(sock)
        assert status == 200


def test_silent_connection_is_closed_after_the_read_timeout(strict: RunningServer) -> None:
    """No byte yet: the read timeout runs from accept, and the connection is closed unanswered
    (the idle timeout applied: silent sockets held every connection slot for a minute)."""
    with connect(strict.http) as sock:
        assert sock.recv(10) == b""
    with connect(strict.http) as sock:
        sock.sendall(infer())
        assert read_response(sock)[0] == 200


# -- big bodies ----------------------------------------------------------------------------------


def test_declared_100mb_body_gets_413_without_being_read(strict: RunningServer) -> None:
    with connect(strict.http) as sock:
        sock.sendall(http_request("POST", "/v2/models/mlp/infer", Content_Length=str(100 << 20)))
        sock.sendall(b"x" * 65536)
        status, body = read_response(sock)
        assert status == 413
        assert str(MAX_BODY) in json.loads(body)["error"]


def test_body_over_the_limit_beside_others_still_gets_413(strict: RunningServer) -> None:
    """What follows the 413 is drained in turns with other uploads, yet in time for a client
    that sends it all before reading (not a reset)."""
    with connect(strict.http) as other, connect(strict.http) as sock:
        other.sendall(http_request("GET", "/v2/health/live"))
        assert read_response(other)[0] == 200
        sock.sendall(infer(b"x" * (MAX_BODY + 256 * 1024)))
        status, _ = read_response(sock)
        assert status == 413
        assert closed(sock)


def test_big_body_waits_for_room_then_is_served(strict: RunningServer) -> None:
    """One client announces a body as big as the whole room and stalls; the next big body
    waits (its connection paused) until the first is cut off, then it is answered."""
    with connect(strict.http) as stalled, connect(strict.http) as waiting:
        stalled.sendall(http_request("POST", "/v2/models/mlp/infer", Content_Length=str(MAX_BODY)))
        started = time.monotonic()
        sender = threading.Thread(target=waiting.sendall, args=(infer(infer_body(MAX_BODY)),))
        sender.start()
        assert read_response(stalled)[0] == 408
        timed_out = time.monotonic() - started
        assert read_response(waiting)[0] == 200
        sender.join(GUARD_S)
        assert timed_out >= READ_TIMEOUT_S * 0.9


def test_chunked_body_past_the_room_gets_503(strict: RunningServer) -> None:
    with connect(strict.http) as stalled, connect(strict.http) as chunked:
        stalled.sendall(http_request("POST", "/v2/models/mlp/infer", Content_Length=str(MAX_BODY)))
        time.sleep(0.05)  # the stalled body's room is taken first
        chunked.sendall(http_request("POST", "/v2/models/mlp/infer", Transfer_Encoding="chunked"))
        piece = b"x" * 32768
        try:
            for _ in range(8):
                chunked.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, body = read_response(chunked)
        assert status == 503
        assert "Content-Length" in json.loads(body)["error"]


# -- too many connections ------------------------------------------------------------------------


def test_connections_past_the_limit_get_503(mlp_repo: Path) -> None:
    settings = ServerSettings(
        model_repository=mlp_repo, http_port=0, grpc_port=0, metrics=False, max_connections=3
    )
    running, thread = start_server(settings)
    try:
        held = [connect(running.http) for _ in range(3)]
        for sock in held:  # each is accepted and served
            sock.sendall(http_request("GET", "/v2/health/live"))
            assert read_response(sock)[0] == 200
        for sock in held:  # each reading a request now (an idle one is closed for a new one)
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
        time.sleep(0.2)
        with connect(running.http) as extra:
            status, body = read_response(extra)
            assert status == 503
            assert "3 connections" in json.loads(body)["error"]
            assert closed(extra)
        held.pop().close()
        deadline = time.monotonic() + GUARD_S
        while True:  # the server notices the close on its next loop turn
            with connect(running.http) as again:
                again.sendall(http_request("GET", "/v2/health/live"))
                try:
                    if read_response(again)[0] == 200:
                        break
                except (EOFError, ConnectionResetError):
                    pass
            assert time.monotonic() < deadline
        for sock in held:
            sock.close()
    finally:
        stop_server(running, thread)


# -- everyone at once ----------------------------------------------------------------------------


@dataclass
class Abusers:
    """Misbehaving clients driven from one thread: slowloris heads, slow bodies, garbage, huge
    declared bodies and bodies at the limit, each reconnecting when the server closes it."""

    address: str
    stop: threading.Event = field(default_factory=threading.Event)
    statuses: dict[int, int] = field(default_factory=dict)
    connections: int = 0

    def run(self) -> None:
        rng = random.Random(5)
        selector = selectors.DefaultSelector()
        kinds = ["loris"] * 20 + ["slow-body"] * 8 + ["garbage"] * 6 + ["huge"] * 2 + ["bulk"] * 2
        for kind in kinds:
            self._open(selector, kind, rng)
        while not self.stop.is_set():
            for key, _ in selector.select(timeout=0.05):
                sock, kind = key.fileobj, key.data
                try:
                    data = sock.recv(65536)  # type: ignore[union-attr]
                except OSError:
                    data = b""
                if data[:9] == b"HTTP/1.1 ":
                    status = int(data[9:12])
                    self.statuses[status] = self.statuses.get(status, 0) + 1
                if not data:
                    selector.unregister(sock)
                    sock.close()  # type: ignore[union-attr]
                    self._open(selector, kind, rng)
            for key in list(selector.get_map().values()):
                self._trickle(key.fileobj, key.data, rng)  # type: ignore[arg-type]
        for key in list(selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]

    def _open(self, selector: selectors.BaseSelector, kind: str, rng: random.Random) -> None:
        sock = connect(self.address)
        sock.setblocking(False)
        self.connections += 1
        first = {
            "loris": b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n",
            "slow-body": http_request("POST", "/v2/models/mlp/infer", Content_Length="900000"),
            "garbage": rng.randbytes(rng.randint(1, 2000)),
            "huge": http_request("POST", "/v2/models/mlp/infer", Content_Length=str(100 << 20)),
            "bulk": http_request("POST", "/v2/models/mlp/infer", Content_Length=str(MAX_BODY)),
        }[kind]
        with contextlib.suppress(OSError):
            sock.send(first)
        selector.register(sock, selectors.EVENT_READ, kind)

    def _trickle(self, sock: socket.socket, kind: str, rng: random.Random) -> None:
        more = {
            "loris": b"X-Loris: %d\r\n" % rng.randint(0, 9),
            "slow-body": b" " * 100,
            "garbage": rng.randbytes(rng.randint(0, 200)),
            "huge": b"x" * 65536,
            "bulk": b"x" * 65536,  # a whole body in 16 ticks: read (paced), then refused
        }[kind]
        with contextlib.suppress(OSError):
            sock.send(more)


def test_well_behaved_client_is_served_beside_abusers(strict: RunningServer) -> None:
    abusers = Abusers(strict.http)
    thread = threading.Thread(target=abusers.run, name="abusers")
    thread.start()
    latencies = []
    try:
        with connect(strict.http) as sock:
            started = time.monotonic()
            while time.monotonic() - started < READ_TIMEOUT_S * 4:
                sent = time.monotonic()
                sock.sendall(infer())
                status, _ = read_response(sock)
                latencies.append(time.monotonic() - sent)
                assert status == 200
    finally:
        abusers.stop.set()
        thread.join(GUARD_S)
    assert len(latencies) > 50
    assert max(latencies) < 1.0, f"a request took {max(latencies):.3f} s"
    assert abusers.statuses.get(408, 0) >= 20, abusers.statuses  # the lorises were cut off
    assert abusers.statuses.get(413, 0) >= 2, abusers.statuses
    assert abusers.statuses.get(400, 0) >= 1, abusers.statuses  # garbage
    assert set(abusers.statuses) <= {400, 408, 413, 503}, abusers.statuses
