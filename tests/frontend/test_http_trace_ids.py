"""Every HTTP error ends its message with its trace id and sends it in `x-trace-id` (README,
Tracing), whichever layer answers it: the API, a repository operation, or the protocol layer."""

from __future__ import annotations

import base64
import json
import logging
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import RunningServer, serving, start_server, stop_server

from duetime.config import ServerSettings
from duetime.frontend import http

pytestmark = pytest.mark.timeout(60)

PARENT = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{PARENT}-b7ad6b7169203331-01"
TRAILER = re.compile(r" \(trace ([0-9a-f]{32})\)$")


@pytest.fixture(scope="module")
def explicit(demo_repo: Path) -> Iterator[RunningServer]:
    """The demo repository under explicit model control, with small limits to run into."""
    settings = ServerSettings(
        model_repository=demo_repo, http_port=0, grpc_port=0, model_control_mode="explicit",
        max_body_bytes=4096, max_header_bytes=2048,
    )  # fmt: skip
    with serving(settings) as running:
        yield running


def exchange(server: RunningServer, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `raw` on a new connection; the status, headers and body of the one answer."""
    host, port = server.http.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
        while len(body) < int(headers["content-length"]):
            more = sock.recv(65536)
            if not more:
                break
            body += more
    return int(lines[0].split(" ")[1]), headers, body


def request(method: str, path: str, body: bytes = b"", *extra: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: duetime.test", *extra]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def assert_traced(status: int, headers: dict[str, str], body: bytes, expected: int) -> str:
    """The answer is the error expected, its trace id at the end of its message and in its
    header; returns that id."""
    assert status == expected, body
    message = json.loads(body)["error"]
    found = TRAILER.search(message)
    assert found is not None, message
    assert headers["x-trace-id"] == found.group(1)
    return found.group(1)


def load_body(parameters: dict[str, str]) -> bytes:
    return json.dumps({"parameters": parameters}).encode()


@pytest.mark.parametrize(
    ("model", "body", "status", "needle"),
    [
        ("no_such_model", b"", 404, "is not in the repository"),
        (
            "some_new_model",
            load_body({"file:1/model.onnx": base64.b64encode(b"x").decode()}),
            400,
            "uploaded files need a 'config' too",
        ),
    ],
    ids=["unknown", "files-without-config"],
)
def test_a_repository_operation_that_fails_is_traced(
    explicit: RunningServer, model: str, body: bytes, status: int, needle: str
) -> None:
    path = f"/v2/repository/models/{model}/load"
    answer = exchange(explicit, request("POST", path, body))
    assert_traced(*answer, status)
    assert needle in json.loads(answer[2])["error"]
    # the caller's trace id, when it sends one
    answer = exchange(explicit, request("POST", path, body, f"traceparent: {TRACEPARENT}"))
    assert assert_traced(*answer, status) == PARENT


def test_a_method_not_allowed_is_traced(explicit: RunningServer) -> None:
    status, headers, body = exchange(explicit, request("DELETE", "/v2/health/live"))
    assert_traced(status, headers, body, 405)
    assert headers["allow"] == "GET, HEAD"
    # (a POST-only endpoint no model's presence decides: a model's endpoint in a method it does
    # not take gets 405 only where the model is there, and none is loaded here: 404)
    answer = exchange(explicit, request("GET", "/v2/repository/index", b"", "traceparent: x"))
    assert_traced(*answer, 405)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (request("GET", "/v2/health/live", b"", "X-Big: " + "a" * 4096), 431),
        (request("POST", "/v2/models/mlp/infer", b"x" * 5000), 413),
        (request("POST", "/v2/models/mlp/infer", b"", "Transfer-Encoding: gzip, chunked"), 501),
    ],
    ids=["malformed", "head-too-big", "body-too-big", "transfer-coding"],
)
def test_a_request_the_protocol_layer_refuses_is_traced(
    explicit: RunningServer, raw: bytes, status: int
) -> None:
    assert_traced(*exchange(explicit, raw), status)


def test_a_request_refused_with_a_traceparent_keeps_its_trace_id(explicit: RunningServer) -> None:
    raw = request(
        "POST", "/v2/models/mlp/infer", b"", f"traceparent: {TRACEPARENT}",
        "Transfer-Encoding: gzip, chunked",
    )  # fmt: skip
    assert assert_traced(*exchange(explicit, raw), 501) == PARENT


def parse(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, body = answer.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    assert int(headers["content-length"]) == len(body)
    return int(lines[0].split(" ")[1]), headers, body


def test_a_shed_request_gets_a_trace_id_of_its_own() -> None:
    first = assert_traced(*parse(http._shed_reply(True, False, {}, "m", None)), 429)
    second = assert_traced(*parse(http._shed_reply(True, False, {}, "m", None)), 429)
    assert first != second
    status, headers, body = parse(
        http._shed_reply(False, True, {"traceparent": TRACEPARENT}, "m", None)
    )
    assert assert_traced(status, headers, body, 429) == PARENT
    assert headers["retry-after"] == "1"
    assert headers["connection"] == "close"


def test_a_connection_over_the_limit_is_traced_but_not_logged(
    demo_repo: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = ServerSettings(
        model_repository=demo_repo, http_port=0, grpc_port=0, model_control_mode="explicit",
        max_connections=1,
    )  # fmt: skip
    running, thread = start_server(settings)
    try:
        host, port = running.http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as first:
            first.sendall(request("GET", "/v2/health/live"))
            assert first.recv(65536).startswith(b"HTTP/1.1 200 ")  # (the first is in)
            # (a request being read: an idle connection would be closed for the new one)
            first.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
            time.sleep(0.2)
            with caplog.at_level(logging.INFO, logger="duetime.requests"):
                answer = exchange(running, request("GET", "/v2/health/live"))
            assert_traced(*answer, 503)
            # no request was read: a flood of connections would be a flood of warnings
            assert [r for r in caplog.records if r.name == "duetime.requests"] == []
    finally:
        stop_server(running, thread)
