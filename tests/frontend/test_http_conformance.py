"""HTTP semantics (RFC 9110 / 9112) at the edges of the v2 REST API, over raw sockets."""

from __future__ import annotations

import email.utils
import json
import math
import socket
import time
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import RunningServer

from duetime.frontend import http

pytestmark = pytest.mark.timeout(60)

X = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 40], "data": [0.5] * 40}]}
).encode()


@dataclass
class Response:
    version: str
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Raw:
    """One connection; sends bytes as given, reads responses with a Content-Length."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError(f"connection closed; unparsed: {self.buffer[:200]!r}")
        self.buffer += chunk

    def response(self) -> Response:
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, status, _ = status_line.split(" ", 2)
        headers = {}
        for line in lines:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return Response(version, int(status), headers, body)


def exchange(
    server: RunningServer,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    version: str = "HTTP/1.1",
) -> Response:
    lines = [f"{method} {path} {version}", "Host: duetime.test"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    raw = Raw(server.http)
    try:
        raw.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        return raw.response()
    finally:
        raw.close()


# -- Content-Encoding ----------------------------------------------------------------------------


@pytest.mark.parametrize("coding", ["br", "compress", "gzip, br"])
def test_a_body_in_an_unsupported_coding_gets_415_and_the_codings_accepted(
    server: RunningServer, coding: str
) -> None:
    response = exchange(server, "POST", "/v2/models/mlp/infer", X, {"Content-Encoding": coding})
    assert response.status == 415, response
    assert response.headers["accept-encoding"] == "gzip, deflate"
    assert f"Content-Encoding '{coding}' is not supported" in response.json()["error"]
    response = exchange(server, "POST", "/v1/models/mlp:predict", b"{}", {"Content-Encoding": "br"})
    assert response.status == 415, response


# -- Expect: 100-continue ------------------------------------------------------------------------


def _first_answer_to_expect(server: RunningServer, version: str) -> list[Response]:
    """The answers to a request with `Expect: 100-continue` whose body follows its head at once:
    an interim 100 first if the server sends one, then the final answer."""
    raw = Raw(server.http)
    try:
        head = (
            f"POST /v2/models/mlp/infer {version}\r\nHost: duetime.test\r\n"
            f"Content-Length: {len(X)}\r\nExpect: 100-continue\r\n\r\n"
        )
        raw.sock.sendall(head.encode() + X)
        answers = [raw.response()]
        if answers[0].status == 100:
            answers.append(raw.response())
        return answers
    finally:
        raw.close()


def test_expect_100_continue_is_ignored_on_an_http_1_0_request(server: RunningServer) -> None:
    # RFC 9110 10.1.1: a server MUST ignore it there (an HTTP/1.0 client knows no 1xx)
    (answer,) = _first_answer_to_expect(server, "HTTP/1.0")
    assert answer.status == 200, answer
    interim, answer = _first_answer_to_expect(server, "HTTP/1.1")
    assert (interim.status, answer.status) == (100, 200)


# -- Date ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/v2/health/live", b"", 200),
        ("POST", "/v2/models/mlp/infer", X, 200),
        ("GET", "/v2/models/nope", b"", 404),
        ("DELETE", "/v2", b"", 405),
    ],
    ids=["health", "infer", "not-found", "method"],
)
def test_every_answer_says_when_it_was_made(
    server: RunningServer, method: str, path: str, body: bytes, status: int
) -> None:
    # RFC 9110 6.6.1: an origin server with a clock MUST send Date (in 2xx, 3xx and 4xx)
    before = math.floor(time.time())
    response = exchange(server, method, path, body)
    after = math.ceil(time.time())
    assert response.status == status, response
    sent = email.utils.parsedate_to_datetime(response.headers["date"]).timestamp()
    assert response.headers["date"].endswith(" GMT")
    assert before <= sent <= after


def test_the_date_line_is_an_http_date() -> None:
    assert http._date_line(0) == b"Date: Thu, 01 Jan 1970 00:00:00 GMT\r\n"
    assert http._date_line(784111777) == b"Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"


def test_the_shedder_s_refusal_is_dated_too() -> None:
    before = math.floor(time.time())
    head = http._shed_reply(True, False, {}, "m", None).split(b"\r\n\r\n", 1)[0].decode()
    after = math.ceil(time.time())
    (line,) = [line for line in head.split("\r\n") if line.startswith("Date: ")]
    sent = email.utils.parsedate_to_datetime(line.removeprefix("Date: ")).timestamp()
    assert before <= sent <= after


# -- empty path segments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "what"),
    [
        ("POST", "/v2/models//infer", "model name"),
        ("GET", "/v2/models//infer", "model name"),
        ("GET", "/v2/models//ready", "model name"),
        ("GET", "/v2/models//", "model name"),
        ("POST", "/v2/models/mlp/versions//infer", "version"),
        ("GET", "/v2/models/mlp/versions//", "version"),
        ("POST", "/v2/repository/models//load", "model name"),
        ("GET", "/v2/systemsharedmemory/region//status", "region name"),
        ("GET", "/v1/models//", "model name"),
    ],
)
def test_an_empty_name_in_the_path_is_refused_naming_it(
    server: RunningServer, method: str, path: str, what: str
) -> None:
    # collapsed, '/v2/models//infer' was the metadata of a model 'infer' (GET), or a 405 (POST)
    response = exchange(server, method, path, X if method == "POST" else b"")
    assert response.status == 400, response
    assert f"the {what} in '{path}' is empty" in response.json()["error"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "//v2/health/live"),  # (a client's base URL ending in '/')
        ("GET", "/v2//models/mlp"),
        ("GET", "/v2/models/mlp/"),
        ("POST", "//v2/models/mlp/infer"),
        ("POST", "/v2/models/mlp//infer"),
        ("POST", "/v2/models/mlp/versions/1/infer/"),
    ],
)
def test_other_empty_segments_are_ignored(server: RunningServer, method: str, path: str) -> None:
    response = exchange(server, method, path, X if method == "POST" else b"")
    assert response.status == 200, response
