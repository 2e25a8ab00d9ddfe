"""gRPC calls whose request message has not all come (a client uploading slowly; one that sent
a message's prefix and stalled) are calls the loop has taken in `CoreBacklog`, not calls
waiting for the loop in gRPC's core.

NOTE: counted from their handlers' start, 2,000 calls left with a 5-byte message prefix on
connections kept open looked queued for as long as they were: 92-97% of one small client's
calls were then refused (DEADLINE_EXCEEDED before the scheduler, or RESOURCE_EXHAUSTED), still
60 s later; 20 clients uploading 4 MiB over 8 s each got 33-62% of another client's small calls
refused while they uploaded."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import RunningServer, on_loop, start_server, stop_server

from duetime.config import ServerSettings
from duetime.frontend.grpcbacklog import CoreBacklog

pytestmark = pytest.mark.timeout(60)

_INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def server(mlp_repo: Path) -> Iterator[RunningServer]:
    running, thread = start_server(
        ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0)
    )
    yield running
    stop_server(running, thread)


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes((kind, flags))
        + struct.pack(">I", stream)
        + payload
    )


def _literal(name: str, value: str) -> bytes:
    """An HPACK header field, literal, not indexed, its name new (both under 127 bytes)."""
    return b"\x00" + bytes((len(name),)) + name.encode() + bytes((len(value),)) + value.encode()


class RawCalls:
    """`calls` ModelInfer calls on one HTTP/2 connection, each sent its headers and the first
    `sent` bytes of a `size`-byte message (its 5-byte prefix included), then nothing more until
    `finish`."""

    def __init__(self, address: str, calls: int, size: int, sent: int) -> None:
        host, port = address.rsplit(":", 1)
        self.socket = socket.create_connection((host, int(port)), timeout=10)
        self.socket.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0))
        self._ack_settings()
        self.message = struct.pack(">BI", 0, size) + b"\0" * size
        self.sent = sent
        self.streams = [1 + 2 * n for n in range(calls)]
        headers = b"".join(
            _literal(name, value)
            for name, value in (
                (":method", "POST"),
                (":scheme", "http"),
                (":path", _INFER),
                (":authority", address),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            )
        )
        out = b"".join(
            _frame(1, 0x4, stream, headers) + _frame(0, 0, stream, self.message[:sent])
            for stream in self.streams
        )
        self.socket.sendall(out)

    def _ack_settings(self) -> None:
        """Read the server's first frames up to its SETTINGS, and acknowledge them."""
        data = b""
        while True:
            while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
                length, kind, flags = int.from_bytes(data[:3], "big"), data[3], data[4]
                data = data[9 + length :]
                if kind == 4 and not flags & 1:
                    self.socket.sendall(_frame(4, 1, 0))
                    return
            chunk = self.socket.recv(65536)
            assert chunk, "the server closed the connection before its SETTINGS"
            data += chunk

    def finish(self) -> None:
        """Send the rest of every call's message, its stream's end with it."""
        rest = self.message[self.sent :]
        self.socket.sendall(b"".join(_frame(0, 0x1, stream, rest) for stream in self.streams))

    def close(self) -> None:
        self.socket.close()


def _until(condition: Callable[[], bool], within_s: float = 5.0) -> bool:
    """Whether `condition()` came true within `within_s` seconds (polled)."""
    wait = threading.Event()
    for _ in range(int(within_s / 0.02)):
        if condition():
            return True
        wait.wait(0.02)
    return condition()


def _counts(server: RunningServer) -> tuple[CoreBacklog, Callable[[], tuple[int, int, int]]]:
    """The server's backlog and a reader of (calls the core started, held, held not taken)."""
    backlog = server.server._grpc_service.backlog
    assert backlog is not None
    core_counts = backlog.core_counts
    assert core_counts is not None

    def read() -> tuple[int, int, int]:
        assert core_counts is not None
        started, held = core_counts()
        return started, held, held - backlog.holding

    return backlog, lambda: on_loop(server, read)


def test_calls_uploading_their_message_are_not_waiting_in_the_core(server: RunningServer) -> None:
    """20 calls whose 1,000-byte message has half come: held by the core, taken by the loop;
    once their messages end they are answered and neither holds them any more."""
    backlog, counts = _counts(server)
    started, held, _ = counts()
    holding = on_loop(server, lambda: backlog.holding)
    calls = RawCalls(server.grpc, 20, 1000, 505)
    try:
        assert _until(lambda: counts()[0] >= started + 20)
        assert counts()[1] >= held + 20
        assert _until(lambda: counts()[2] <= CoreBacklog.SLACK), (
            f"{counts()[2]} calls whose message had not all come are counted as waiting"
        )
        calls.finish()  # (zeros: not a ModelInferRequest; each is answered INVALID_ARGUMENT)
        assert _until(lambda: counts()[1] <= held), "the core still holds the finished calls"
        assert _until(lambda: on_loop(server, lambda: backlog.holding) <= holding)
    finally:
        calls.close()


def test_calls_whose_client_stalled_are_not_waiting_in_the_core(server: RunningServer) -> None:
    """50 calls sent their headers and a 5-byte message prefix, then nothing (their connection
    left open): the core holds them while the loop waits for none of them; once their client
    goes away the core ends them, and they are counted nowhere."""
    backlog, counts = _counts(server)
    started, held, _ = counts()
    holding = on_loop(server, lambda: backlog.holding)
    calls = RawCalls(server.grpc, 50, 64, 5)
    try:
        assert _until(lambda: counts()[0] >= started + 50)
        assert counts()[1] >= held + 50
        assert _until(lambda: counts()[2] <= CoreBacklog.SLACK), (
            f"{counts()[2]} calls whose client stalled are counted as waiting"
        )
        threading.Event().wait(0.3)
        assert counts()[2] <= CoreBacklog.SLACK
    finally:
        calls.close()
    assert _until(lambda: counts()[1] <= held), "the core still holds the stalled calls"
    assert _until(lambda: on_loop(server, lambda: backlog.holding) <= holding)
