"""HTTP/1.1 wire conformance of the inference port, a tester's second pass (t105): an HTTP/1.0
request framed by Transfer-Encoding closes its connection (RFC 9112 6.1); Expect is a list
(RFC 9110 10.1.1), answered 100 where it holds 100-continue, 417 where it holds another;
a target no method has gets 404 in every method; CONNECT gets 501 and `Connection: close`.

Before: the 1.0 request kept its connection open and served the next; `100-continue ` (a
trailing space), two Expect lines or `100-continue, foo` got no answer at all (the client
waited its own expect timeout); `POST /v2/models/mlp%2Finfer` got 405 "use GET", which got 404;
`CONNECT x:80` got 404 for a path '/x:80' and a close its answer did not announce."""

from __future__ import annotations

import json
import socket

import pytest
from conftest import RunningServer

pytestmark = pytest.mark.timeout(60)

X = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 40], "data": [0.5] * 40}]}
).encode()


class Answer:
    """One answer: its status line, headers (names in lower case) and body."""

    def __init__(self, head: bytes, body: bytes) -> None:
        status_line, *lines = head.decode("latin-1").split("\r\n")
        self.version, status, _ = status_line.split(" ", 2)
        self.status = int(status)
        self.headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self.body = body

    def error(self) -> str:
        return str(json.loads(self.body)["error"])


class Wire:
    """One connection to the inference port; sends bytes as given, reads answers."""

    def __init__(self, server: RunningServer) -> None:
        host, port = server.http.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.buffer = b""

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self) -> Answer:
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        answer = Answer(head, b"")
        length = int(answer.headers.get("content-length", "0"))
        while len(self.buffer) < length:
            self._fill()
        answer.body, self.buffer = self.buffer[:length], self.buffer[length:]
        return answer

    def closed(self) -> bool:
        """Whether the server closes the connection with nothing more sent."""
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                return not self.buffer
            self.buffer += chunk

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError(f"connection closed; unread: {self.buffer[:200]!r}")
        self.buffer += chunk


def chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


# -- HTTP/1.0 with Transfer-Encoding (RFC 9112 6.1) ----------------------------------------------


def test_an_http_1_0_request_framed_by_transfer_encoding_is_answered_then_closed(
    server: RunningServer,
) -> None:
    head = (
        b"POST /v2/models/mlp/infer HTTP/1.0\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: keep-alive\r\n\r\n"
    )
    following = b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    with Wire(server) as wire:
        wire.send(head + chunked(X) + following)
        answer = wire.answer()
        assert answer.status == 200, answer.body
        assert answer.headers["connection"] == "close"
        assert wire.closed()  # the request after it is not answered


def test_an_http_1_0_request_with_keep_alive_and_a_length_still_keeps_its_connection(
    server: RunningServer,
) -> None:
    head = b"POST /v2/models/mlp/infer HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: %d"
    with Wire(server) as wire:
        wire.send(head % len(X) + b"\r\n\r\n" + X)
        answer = wire.answer()
        assert (answer.status, answer.headers["connection"]) == (200, "keep-alive")
        wire.send(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        assert wire.answer().status == 200


# -- Expect (RFC 9110 10.1.1) --------------------------------------------------------------------


def _expecting(field_lines: bytes, version: bytes = b"HTTP/1.1") -> bytes:
    head = b"POST /v2/models/mlp/infer %s\r\nHost: duetime.test\r\n" % version
    return head + b"Content-Length: %d\r\n%s\r\n" % (len(X), field_lines)


@pytest.mark.parametrize(
    "field_lines",
    [
        b"Expect: 100-continue\r\n",
        b"Expect: 100-continue \r\n",  # (whitespace around a value is no part of it: 5.5)
        b"Expect: 100-continue\t\r\n",
        b"Expect: 100-Continue\r\n",
        b"Expect: 100-continue\r\nExpect: 100-continue\r\n",  # (one list: RFC 9110 5.3)
        b"Expect: 100-continue,\r\n",  # (an empty member is none: RFC 9110 5.6.1)
    ],
)
def test_expect_holding_100_continue_gets_100_before_the_body(
    server: RunningServer, field_lines: bytes
) -> None:
    with Wire(server) as wire:
        wire.send(_expecting(field_lines))  # the head alone: the client waits for the 100
        interim = wire.answer()
        assert interim.status == 100
        wire.send(X)
        answer = wire.answer()
        assert answer.status == 200, answer.body


@pytest.mark.parametrize(
    "field_lines",
    [
        b"Expect: 100-continue, foo\r\n",
        b"Expect: foo\r\n",
        b"Expect: 100-continue\r\nExpect: bar=1\r\n",
    ],
)
def test_an_expectation_this_server_cannot_meet_gets_417_and_a_close(
    server: RunningServer, field_lines: bytes
) -> None:
    with Wire(server) as wire:
        wire.send(_expecting(field_lines))
        answer = wire.answer()
        assert answer.status == 417
        assert answer.headers["connection"] == "close"
        assert "100-continue" in answer.error()
        assert wire.closed()


def test_an_http_1_0_request_s_expect_is_ignored_whatever_it_says(server: RunningServer) -> None:
    # (RFC 9110 10.1.1: a 1.0 client knows no Expect; a server ignores 100-continue there)
    with Wire(server) as wire:
        wire.send(_expecting(b"Expect: foo\r\n", b"HTTP/1.0") + X)
        assert wire.answer().status == 200


# -- routing: the target first, then the method --------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "needle"),
    [
        ("POST", "/v2/models/mlp%2Finfer", "'mlp/infer'"),
        ("POST", "/v2/models/nosuch/config", "'nosuch'"),
        ("DELETE", "/v2/models/nosuch/versions/1/ready", "'nosuch'"),
        ("POST", "/v2/models/mlp/versions/99", "version 99"),
        ("GET", "/v2/models/nosuch/infer", "'nosuch'"),
    ],
)
def test_a_target_no_method_has_gets_404_in_any_method(
    server: RunningServer, method: str, path: str, needle: str
) -> None:
    request = f"{method} {path} HTTP/1.1\r\nHost: duetime.test\r\nContent-Length: 2\r\n\r\n{{}}"
    with Wire(server) as wire:
        wire.send(request.encode())
        answer = wire.answer()
        assert answer.status == 404, answer.body
        assert "Request for unknown model" in answer.error()
        assert needle in answer.error()
        wire.send(b"GET /v2/health/live HTTP/1.1\r\nHost: duetime.test\r\n\r\n")  # still usable
        assert wire.answer().status == 200


@pytest.mark.parametrize("target", ["x:80", "127.0.0.1:443", "/v2/health/live"])
def test_connect_gets_501_naming_the_method_and_says_its_connection_closes(
    server: RunningServer, target: str
) -> None:
    with Wire(server) as wire:
        wire.send(f"CONNECT {target} HTTP/1.1\r\nHost: duetime.test:80\r\n\r\n".encode())
        answer = wire.answer()
        assert answer.status == 501, answer.body
        assert "CONNECT" in answer.error()
        assert "/x:80" not in answer.error()
        assert answer.headers["connection"] == "close"
        assert wire.closed()
