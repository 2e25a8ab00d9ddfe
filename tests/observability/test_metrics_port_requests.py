"""The metrics port on the wire, a tester's second pass (t105): a scrape is compressed as its
`Accept-Encoding` asks, q-values read as the inference port reads them (`gzip;q=0`: not
gzip), with `Vary`; the absolute-form target is served; an HTTP/1.1 request with no Host, two,
or one that is no host[:port] gets 400; a version other than 1.0 and 1.1 gets 505, with a
status line.

Before: `gzip;q=0` got gzip and no answer had Vary (prometheus_client's `gzip_accepted` looks
for the token alone); `GET http://host/metrics` got 400 "the metrics are at /metrics"; every
Host was served; and `GET /metrics HTTP/2.0` got a bare HTML page, no status line, no headers
(http.server answered as to HTTP/0.9)."""

from __future__ import annotations

import gzip
import socket
import zlib

import pytest
from conftest import RunningServer

pytestmark = pytest.mark.timeout(60)

SERIES = b"duetime_requests_total"


def ask(server: RunningServer, request: bytes) -> tuple[str, int, dict[str, str], bytes]:
    """The version, status, headers (names in lower case) and body of the metrics port's
    answer to `request` (the port closes the connection after each answer)."""
    port = server.addresses.metrics_port
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/"), data[:80]
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, status, _ = status_line.split(" ", 2)
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return version, int(status), headers, body


def scrape(server: RunningServer, *field_lines: str, target: str = "/metrics") -> bytes:
    lines = [f"GET {target} HTTP/1.1", "Host: 127.0.0.1", *field_lines]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def vary(headers: dict[str, str]) -> list[str]:
    return [name.strip().lower() for name in headers.get("vary", "").split(",")]


# -- Accept-Encoding (RFC 9110 12.5.3) -----------------------------------------------------------


@pytest.mark.parametrize(
    "accepted",
    ["gzip;q=0", "gzip;q=0, identity", "identity, gzip;q=0", "GZIP; Q=0", "deflate;q=0, gzip;q=0"],
)
def test_a_scrape_that_refuses_gzip_is_not_compressed(server: RunningServer, accepted: str) -> None:
    _, status, headers, body = ask(server, scrape(server, f"Accept-Encoding: {accepted}"))
    assert status == 200
    assert "content-encoding" not in headers
    assert SERIES in body
    assert "accept-encoding" in vary(headers)


@pytest.mark.parametrize(
    ("accepted", "coding"),
    [("gzip", "gzip"), ("identity;q=0.5, gzip", "gzip"), ("gzip;q=0.5, deflate", "deflate")],
)
def test_a_scrape_is_compressed_as_accept_encoding_asks_and_says_it_varies(
    server: RunningServer, accepted: str, coding: str
) -> None:
    _, status, headers, body = ask(server, scrape(server, f"Accept-Encoding: {accepted}"))
    assert status == 200
    assert headers["content-encoding"] == coding
    assert "accept-encoding" in vary(headers)
    assert SERIES in (gzip.decompress(body) if coding == "gzip" else zlib.decompress(body))


# -- request targets and Host (RFC 9112 3.2) -----------------------------------------------------


@pytest.mark.parametrize(
    "target", ["http://127.0.0.1/metrics", "HTTP://duetime.test:8002/metrics/", "http://h/metrics?"]
)
def test_the_absolute_form_is_served(server: RunningServer, target: str) -> None:
    _, status, _, body = ask(server, scrape(server, target=target))
    assert status == 200, body[:200]
    assert SERIES in body


def test_the_absolute_form_keeps_its_query(server: RunningServer) -> None:
    target = "http://127.0.0.1/metrics?name[]=duetime_queue_depth"
    _, status, _, body = ask(server, scrape(server, target=target))
    assert status == 200
    assert b"duetime_queue_depth" in body
    assert SERIES not in body


@pytest.mark.parametrize(
    ("request_bytes", "needle"),
    [
        (b"GET /metrics HTTP/1.1\r\n\r\n", b"must have a Host header"),
        (b"GET /metrics HTTP/1.1\r\nHost: a b\r\n\r\n", b"not a host[:port]"),
        (b"GET /metrics HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", b"more than once"),
    ],
)
def test_a_request_without_one_valid_host_gets_400(
    server: RunningServer, request_bytes: bytes, needle: bytes
) -> None:
    version, status, headers, body = ask(server, request_bytes)
    assert (version, status) == ("HTTP/1.1", 400)
    assert headers["connection"] == "close"
    assert needle in body
    assert SERIES not in body


def test_an_http_1_0_request_needs_no_host(server: RunningServer) -> None:
    _, status, _, body = ask(server, b"GET /metrics HTTP/1.0\r\n\r\n")
    assert status == 200
    assert SERIES in body


# -- versions ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_line", [b"GET /metrics HTTP/2.0", b"GET /metrics HTTP/1.2", b"GET /metrics"]
)
def test_a_version_other_than_1_0_and_1_1_gets_505_with_a_status_line(
    server: RunningServer, request_line: bytes
) -> None:
    version, status, headers, body = ask(server, request_line + b"\r\nHost: x\r\n\r\n")
    assert (version, status) == ("HTTP/1.1", 505)
    assert headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    assert SERIES not in body
