"""A request in an HTTP version other than 1.1 or 1.0 is answered 505 HTTP Version Not Supported
and the connection closed: llhttp reads 'HTTP/2.0' and a request line with no version (HTTP/0.9),
and both were answered as HTTP/1.1, 200 OK. A request line with no version is answered as soon
as it ends: llhttp waits for headers after it, and a real HTTP/0.9 client, which sends the one
line and waits, got 408 after the read timeout (10 s)."""

from __future__ import annotations

import asyncio
import re
import socket

import pytest
from conftest import RunningServer

from duetime.frontend.http import HttpConnection


def exchange(server: RunningServer, data: bytes) -> bytes:
    """Send `data`, read until the server closes the connection."""
    host, port = server.http.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


@pytest.mark.parametrize(
    "request_line",
    [b"GET /v2/health/live HTTP/2.0", b"GET /v2/health/live", b"GET /v2/health/live HTTP/3.0"],
    ids=["2.0", "none", "3.0"],
)
def test_an_unsupported_version_is_answered_505_and_closed(
    server: RunningServer, request_line: bytes
) -> None:
    answer = exchange(server, request_line + b"\r\nHost: x\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 505 HTTP Version Not Supported"
    assert b"Connection: close" in lines
    assert b"send HTTP/1.1" in body


class Transport:
    """What an in-memory HttpConnection writes to."""

    def __init__(self) -> None:
        self.written = b""

    def write(self, data: bytes) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return False

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def close(self) -> None: ...


def statuses_after(server: RunningServer, reads: list[bytes]) -> list[bytes]:
    """The status lines a connection wrote once `reads` came, one read each, and the loop ran
    a few turns: no read timeout passes."""

    async def feed() -> bytes:
        running = server.server
        connection = HttpConnection(running._rest, running.settings, running._connections)
        transport = Transport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        for data in reads:
            connection.data_received(data)
        for _ in range(5):
            await asyncio.sleep(0)
        connection.connection_lost(None)
        return transport.written

    written = asyncio.run_coroutine_threadsafe(feed(), server.loop).result(timeout=10)
    return re.findall(rb"HTTP/1\.1 \d{3}", written)


LIVE = b"GET /v2/health/live"
ASKED = LIVE + b" HTTP/1.1\r\n\r\n"


@pytest.mark.parametrize(
    "reads",
    [
        [LIVE + b"\r\n"],
        [LIVE + b"\n"],
        [b"GE", b"T /v2/health/live\r\n"],
        [b"GET", b" /v2/health/live\r\n"],
        [b"GET ", b"/v2/health/live\r\n"],
        [b"GET /v2/he", b"alth/live", b"\r\n"],
        [LIVE, b"\r\n"],
        [LIVE + b"\r", b"\n"],
        [b"\r\n" + LIVE + b"\r\n"],
        [ASKED + LIVE + b"\r\n"],
        [ASKED + b"GET /v2/hea", b"lth/live\r\n"],
        # a body that reads like one before it
        [b"POST /v2/health/live HTTP/1.1\r\nContent-Length: 22\r\n\r\n" + LIVE + b"\r\n" + b"a"
         + LIVE + b"\r\n"],
    ],
)  # fmt: skip
def test_a_request_line_without_a_version_is_answered_505_when_it_ends(
    server: RunningServer, reads: list[bytes]
) -> None:
    assert statuses_after(server, reads)[-1] == b"HTTP/1.1 505"


@pytest.mark.parametrize(
    "reads",
    [
        [LIVE + b" HTTP/1.1\r\n", b"\r\n"],
        [LIVE, b" HTTP/1.1\r\n", b"\r\n"],
        [LIVE + b" ", b"HTTP/1.1\r\n\r\n"],
        [LIVE + b" HTTP/1.1\r\nX: " + LIVE + b"\r\n", b"\r\n"],
        [LIVE + b" HTTP/1.1\r\nX: ", LIVE + b"\r\n", b"\r\n"],
        [LIVE + b" HTTP/1.1\r\nReferer: /v2/health/live\r\n", b"\r\n"],
        [ASKED + LIVE + b" HTTP/1.1\r\n", b"\r\n"],
        [b"POST /v2/health/live HTTP/1.1\r\nContent-Length: 22\r\n\r\n" + LIVE + b"\r\na",
         ASKED],
    ],
)  # fmt: skip
def test_a_head_read_in_pieces_with_its_version_is_served(
    server: RunningServer, reads: list[bytes]
) -> None:
    statuses = statuses_after(server, reads)
    assert b"HTTP/1.1 505" not in statuses
    assert statuses[-1] == b"HTTP/1.1 200"


@pytest.mark.parametrize("version", [b"1.1", b"1.0"])
def test_http_1_is_served(server: RunningServer, version: bytes) -> None:
    answer = exchange(
        server, b"GET /v2/health/live HTTP/%s\r\nHost: x\r\nConnection: close\r\n\r\n" % version
    )
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
