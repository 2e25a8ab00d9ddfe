"""The HTTP connection layer's reading of a request head, and the refusals it makes itself.

A field sent on several lines is read as their values comma-separated (RFC 9110 5.3), but for
the fields that take one value: Host twice (RFC 9112 3.2), or Content-Type or
Inference-Header-Content-Length twice with different values, is refused (400, naming it). The
last line's value was kept alone: `Transfer-Encoding: gzip` + `Transfer-Encoding: chunked` got a
misleading 400 ("not valid UTF-8") where the one line `gzip, chunked` gets 501. An HTTP/1.1
request without Host is refused (400). And every refusal the connection makes of an inference
request (413, 408, 400, 501) counts in `duetime_requests_refused_total`, as the API's own do:
none did (all found by a tester)."""

from __future__ import annotations

import gzip
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import RunningServer, serving
from repo_models import scale_model, write_version

from duetime.config import ServerSettings

pytestmark = pytest.mark.timeout(60)

MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Model 'double' (y = 2x, FP32 [-1, 4]); bodies up to 64 KiB; a request's body must keep
    coming within 0.3 s."""
    repo: Path = tmp_path_factory.mktemp("repo")
    write_version(repo, "double", 1, scale_model(2.0))
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, max_body_bytes=MAX_BODY,
        request_read_timeout_s=0.3,
    )  # fmt: skip
    with serving(settings) as running:
        yield running


def exchange(server: RunningServer, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `data` on a connection of its own; the status, headers and body of the one answer
    (the connection closes after it: a refusal, or `Connection: close`)."""
    host, port = server.http.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def infer(head: str, body: bytes = b"", path: str = "/v2/models/double/infer") -> bytes:
    """A POST to `path` with the header lines `head` (each ending CRLF) and `body`."""
    return f"POST {path} HTTP/1.1\r\n{head}\r\n".encode("latin-1") + body


def doubled_body() -> bytes:
    x = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
    return json.dumps({"inputs": [x]}).encode()


def refused(server: RunningServer) -> dict[tuple[str, str], float]:
    counts = server.samples("duetime_requests_refused_total", "protocol", "status", "reason")
    return {(status, reason): n for (protocol, status, reason), n in counts.items()
            if protocol == "http"}  # fmt: skip


def error_of(body: bytes) -> str:
    return str(json.loads(body)["error"])


# -- repeated fields -------------------------------------------------------------------------------


def test_transfer_encoding_on_two_lines_is_refused_as_on_one(server: RunningServer) -> None:
    packed = gzip.compress(doubled_body())
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(packed), packed)
    one = exchange(server, infer("Host: t\r\nTransfer-Encoding: gzip, chunked\r\n", chunked))
    two = exchange(
        server,
        infer("Host: t\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", chunked),
    )
    assert one[0] == two[0] == 501
    assert "'gzip, chunked'" in error_of(two[2])


def test_content_encoding_on_two_lines_is_both(server: RunningServer) -> None:
    twice = gzip.compress(gzip.compress(doubled_body()))
    length = f"Content-Length: {len(twice)}\r\nConnection: close\r\n"
    one = exchange(server, infer(f"Host: t\r\nContent-Encoding: gzip, gzip\r\n{length}", twice))
    two = exchange(
        server,
        infer(f"Host: t\r\nContent-Encoding: gzip\r\nContent-Encoding: gzip\r\n{length}", twice),
    )
    assert one[0] == two[0] == 415
    assert "'gzip, gzip'" in error_of(two[2])


def test_accept_encoding_on_two_lines_is_both(server: RunningServer) -> None:
    body = doubled_body()
    status, headers, data = exchange(
        server,
        infer(
            f"Host: t\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
            "Accept-Encoding: gzip\r\nAccept-Encoding: identity;q=0.5\r\n",
            body,
        ),
    )
    assert status == 200
    assert headers["content-encoding"] == "gzip"  # (the last line alone: not compressed)
    assert json.loads(gzip.decompress(data))["outputs"][0]["data"] == [2, 4, 6, 8]


@pytest.mark.parametrize(
    ("lines", "name"),
    [
        ("Inference-Header-Content-Length: 10\r\nInference-Header-Content-Length: 12\r\n",
         "inference-header-content-length"),
        ("Content-Type: application/json\r\nContent-Type: application/octet-stream\r\n",
         "content-type"),
        ("Host: b\r\n", "host"),  # (a second Host, whatever its value)
        ("Host: t\r\n", "host"),
    ],
    ids=["header-length", "content-type", "host", "same-host"],
)  # fmt: skip
def test_a_field_of_one_value_sent_twice_is_refused(
    server: RunningServer, lines: str, name: str
) -> None:
    body = doubled_body()
    head = f"Host: t\r\nContent-Length: {len(body)}\r\n{lines}"
    status, headers, data = exchange(server, infer(head, body))
    assert status == 400
    assert headers["connection"] == "close"
    assert f"'{name}'" in error_of(data)


def test_a_field_of_one_value_sent_twice_alike_is_read(server: RunningServer) -> None:
    body = doubled_body()
    head = (
        f"Host: t\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
        "Content-Type: application/json\r\nContent-Type: application/json\r\n"
    )
    status, _, data = exchange(server, infer(head, body))
    assert status == 200
    assert json.loads(data)["outputs"][0]["data"] == [2, 4, 6, 8]


# -- Host ------------------------------------------------------------------------------------------


def test_an_http11_request_without_host_is_refused(server: RunningServer) -> None:
    status, _, data = exchange(server, b"GET /v2/health/live HTTP/1.1\r\n\r\n")
    assert status == 400
    assert "Host" in error_of(data)
    status, _, _ = exchange(server, b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n"
                                    b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nConnection: close"
                                    b"\r\n\r\n")  # fmt: skip
    assert status == 200


def test_an_http10_request_needs_no_host(server: RunningServer) -> None:
    status, _, data = exchange(server, b"GET /v2/health/live HTTP/1.0\r\n\r\n")
    assert status == 200
    assert json.loads(data) == {"live": True}


# -- refusals counted ------------------------------------------------------------------------------


def test_the_connections_refusals_of_inference_requests_are_counted(
    server: RunningServer,
) -> None:
    before = refused(server)
    over = MAX_BODY + 1
    chunk = b"%x\r\n%s\r\n" % (16384, b"a" * 16384)
    refusals = [
        (infer(f"Host: t\r\nContent-Length: {over}\r\n"), 413),
        (infer("Host: t\r\nTransfer-Encoding: chunked\r\n", chunk * 5), 413),
        (infer("Host: t\r\nBad Header: 1\r\nContent-Length: 2\r\n", b"{}"), 400),
        (infer("Host: t\r\nTransfer-Encoding: gzip, chunked\r\n", b"0\r\n\r\n"), 501),
        (infer("Host: t\r\nContent-Length: 100\r\n", b"{"), 408),  # (then nothing)
        (infer("Content-Length: 2\r\n", b"{}"), 400),  # (no Host)
        (infer("Host: t\r\nContent-Type: a\r\nContent-Type: b\r\nContent-Length: 2\r\n"), 400),
        (infer(f"Host: t\r\nContent-Length: {over}\r\n", path="/v2/models/other/infer?x=1"), 413),
        (infer(f"Host: t\r\nContent-Length: {over}\r\n", path="/v1/models/double:predict"), 413),
    ]
    for data, status in refusals:
        assert exchange(server, data)[0] == status, data
    # not inference requests: not counted
    assert exchange(server, b"GARBAGE\r\n\r\n")[0] == 400
    assert exchange(server, b"GET /v2/health/live HTTP/1.1\r\n\r\n")[0] == 400
    assert exchange(server, infer(f"Host: t\r\nContent-Length: {over}\r\n", path="/v2/x"))[0] == 413
    after = refused(server)
    counted = {key: n - before.get(key, 0) for key, n in after.items() if n > before.get(key, 0)}
    assert counted == {
        ("413", "HttpError"): 4,
        ("400", "HttpError"): 3,
        ("501", "HttpError"): 1,
        ("408", "HttpError"): 1,
    }


def test_a_refusal_found_later_still_counts_once(server: RunningServer) -> None:
    """(The API's own refusals count as before, and not twice.)"""
    before = refused(server)
    x = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": np.ones(4).tolist()}
    body = json.dumps({"inputs": [x], "parameters": {"timeout": -1}})
    data = body.encode()
    head = f"Host: t\r\nConnection: close\r\nContent-Length: {len(data)}\r\n"
    assert exchange(server, infer(head, data))[0] == 400
    after = refused(server)
    assert after[("400", "InvalidInput")] - before.get(("400", "InvalidInput"), 0) == 1
    assert after.get(("400", "HttpError"), 0) == before.get(("400", "HttpError"), 0)


@pytest.mark.parametrize(
    "trailer",
    [
        "Inference-Header-Content-Length: 5",
        "Content-Encoding: gzip",
        "Host: elsewhere",
        "Content-Type: text/plain",
    ],
)
def test_a_chunked_body_s_trailer_is_not_taken_as_the_head_s_fields(
    server: RunningServer, trailer: str
) -> None:
    """RFC 9110 6.5.1: trailer fields are not merged into the head, and framing, content
    coding and routing fields are never taken from one. They were: a trailer's
    Inference-Header-Content-Length or Content-Encoding changed how the body was read, and a
    trailer's Host refused the request as a second Host (found by a tester)."""
    body = doubled_body()
    chunked = f"{len(body):x}\r\n".encode() + body + f"\r\n0\r\n{trailer}\r\n\r\n".encode()
    status, _, answer = exchange(
        server, infer("Host: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n", chunked)
    )
    assert status == 200, answer
    assert json.loads(answer)["outputs"][0]["data"] == [2, 4, 6, 8]


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b'{"parameters": {"timeout": 1e400}, "inputs": []}', "parameters.timeout"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], '
         b'"data": [1, 2, 3, 1%s]}]}' % (b"0" * 400), "inputs[0].data[3]"),
    ],
    ids=["timeout", "data"],
)  # fmt: skip
def test_a_number_no_float64_holds_is_refused_naming_its_field(
    server: RunningServer, raw: bytes, where: str
) -> None:
    """orjson's reason gave a line and column alone (found by a tester)."""
    length = f"Content-Length: {len(raw)}\r\n"
    status, _, answer = exchange(server, infer(f"Host: t\r\nConnection: close\r\n{length}", raw))
    assert status == 400
    assert f" at {where} (line 1 column " in error_of(answer)
    assert "is out of range" in error_of(answer)


@pytest.mark.parametrize(
    "data",
    [np.ones((1, 4), np.float32).tobytes(), b"0000000000000000"],
    ids=["not text", "text"],
)
def test_a_header_length_of_the_whole_body_is_named_as_the_cut(
    server: RunningServer, data: bytes
) -> None:
    """Binary data counted in Inference-Header-Content-Length (the whole body): the refusal
    said the header was needed, though it was sent, and where the data read as text (four
    FP32 values of ASCII digits), nothing of the header (found by testers)."""
    x = {"name": "x", "datatype": "FP32", "shape": [1, 4],
         "parameters": {"binary_data_size": len(data)}}  # fmt: skip
    body = json.dumps({"inputs": [x]}).encode() + data
    head = (
        f"Host: t\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {len(body)}\r\n"
    )
    status, _, answer = exchange(server, infer(head, body))
    assert status == 400
    message = error_of(answer)
    assert f"Inference-Header-Content-Length says its JSON part is all its {len(body)}" in message
    assert "needs header" not in message
