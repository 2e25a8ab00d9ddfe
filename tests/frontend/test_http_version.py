"""A request in an HTTP version other than 1.1 or 1.0 is answered 505 HTTP Version Not Supported
and the connection closed: llhttp reads 'HTTP/2.0' and a request line with no version (HTTP/0.9),
and both were answered as HTTP/1.1, 200 OK."""

from __future__ import annotations

import socket

import pytest
from conftest import RunningServer


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


def test_http2s_connection_preface_is_answered_505(server: RunningServer) -> None:
    """An h2 client with prior knowledge (or a gRPC client at the HTTP port) opens with
    `PRI * HTTP/2.0`: it got 400 in the parser's words, "Pause on PRI/Upgrade"."""
    settings_frame = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    answer = exchange(server, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings_frame)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 505 HTTP Version Not Supported"
    assert b"HTTP/2 is not supported here: send HTTP/1.1" in body
    assert b"PRI/Upgrade" not in body


@pytest.mark.parametrize("version", [b"1.1", b"1.0"])
def test_http_1_is_served(server: RunningServer, version: bytes) -> None:
    answer = exchange(
        server, b"GET /v2/health/live HTTP/%s\r\nHost: x\r\nConnection: close\r\n\r\n" % version
    )
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
