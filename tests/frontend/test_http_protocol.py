"""The HTTP/1.1 layer over raw sockets: keep-alive, pipelining, bodies, limits and closing."""

from __future__ import annotations

import gzip
import json
import socket
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pytest
from conftest import RunningServer, start_server, stop_server
from repo_models import wide_tile_model, write_version

from duetime.config import ServerSettings

pytestmark = pytest.mark.timeout(60)

GUARD_S = 10.0
"""Socket timeout: only trips when an expected event never comes."""


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class RawClient:
    """One TCP connection to the server; writes bytes as given and parses responses."""

    def __init__(self, address: str, receive_buffer: int | None = None) -> None:
        host, port = address.rsplit(":", 1)
        if receive_buffer is None:
            self.sock = socket.create_connection((host, int(port)), timeout=GUARD_S)
        else:  # (set before connecting: the window the server may fill)
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            self.sock.settimeout(GUARD_S)
            self.sock.connect((host, int(port)))
        self._buffer = b""

    def __enter__(self) -> RawClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError(f"connection closed; unparsed: {self._buffer[:200]!r}")
        self._buffer += chunk

    def response(self) -> Response:
        while b"\r\n\r\n" not in self._buffer:
            self._fill()
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, status, _ = status_line.split(" ", 2)
        assert version == "HTTP/1.1", status_line
        headers = {}
        for line in lines:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(self._buffer) < length:
            self._fill()
        body, self._buffer = self._buffer[:length], self._buffer[length:]
        return Response(int(status), headers, body)

    def closed_by_server(self) -> bool:
        """True once the server closes: reads the stream to its end (guarded by the timeout)."""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return True
            if not chunk:
                return not self._buffer
            self._buffer += chunk


def request(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: duetime.test"]
    all_headers = dict(headers or {})
    if body and "Transfer-Encoding" not in all_headers:
        all_headers.setdefault("Content-Length", str(len(body)))
    lines += [f"{name}: {value}" for name, value in all_headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def infer_body(model: str = "mlp", rows: int = 1) -> bytes:
    shape = [rows, 40] if model == "mlp" else [rows, 3, 64, 64]
    data = np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32)
    name = "x" if model == "mlp" else "image"
    doc = {"inputs": [{"name": name, "datatype": "FP32", "shape": shape, "data": data.tolist()}]}
    return json.dumps(doc).encode()


def infer_request(
    model: str = "mlp", rows: int = 1, headers: dict[str, str] | None = None
) -> bytes:
    return request("POST", f"/v2/models/{model}/infer", infer_body(model, rows), headers)


def output_of(response: Response) -> list[float]:
    assert response.status == 200, response
    (output,) = response.json()["outputs"]
    return list(output["data"])


@pytest.fixture
def client(server: RunningServer) -> Iterator[RawClient]:
    with RawClient(server.http) as client:
        yield client


@pytest.fixture(scope="module")
def expected_mlp(server: RunningServer) -> list[float]:
    """mlp's output for `infer_body()`, sent plainly on its own connection."""
    with RawClient(server.http) as client:
        client.send(infer_request())
        return output_of(client.response())


# -- persistent connections ----------------------------------------------------------------------


def test_keep_alive_serves_many_requests(client: RawClient, expected_mlp: list[float]) -> None:
    filler = {"X-Filler": "f" * 1024}  # 70 of these together are over the 64 KiB head limit
    for i in range(70):
        if i % 10 == 0:
            client.send(infer_request(headers=filler))
            response = client.response()
            assert output_of(response) == expected_mlp
        else:
            client.send(request("GET", "/v2/health/live", headers=filler))
            response = client.response()
            assert response.status == 200
        assert "connection" not in response.headers


def test_pipelined_requests_are_answered_in_order(
    client: RawClient, expected_mlp: list[float]
) -> None:
    """A slow inference first: the quick requests behind it must wait for its answer."""
    client.send(
        infer_request("resnet", rows=8)
        + request("GET", "/v2/models/mlp")
        + infer_request()
        + request("GET", "/v2/health/ready")
    )
    first = client.response()
    assert first.status == 200
    assert first.json()["model_name"] == "resnet"
    assert first.json()["outputs"][0]["shape"] == [8, 10]
    assert client.response().json()["name"] == "mlp"
    assert output_of(client.response()) == expected_mlp
    last = client.response()
    assert (last.status, last.json()) == (200, {"ready": True})


def test_health_answers_carry_json_bodies(client: RawClient) -> None:
    """tritonclient reads the status; KServe's client reads `live` / `ready` from the body."""
    for path, body in (
        ("/v2/health/live", {"live": True}),
        ("/v2/health/ready", {"ready": True}),
        ("/v2/models/mlp/ready", {"name": "mlp", "ready": True}),
        ("/v2/models/mlp/versions/1/ready", {"name": "mlp", "ready": True}),
    ):
        client.send(request("GET", path))
        answer = client.response()
        assert (answer.status, answer.json()) == (200, body)


def test_head_answers_like_get_without_the_body(client: RawClient) -> None:
    """A load balancer's HEAD health check: the GET's status and Content-Length, no body; the
    request pipelined behind it is answered right after its head."""
    client.send(request("GET", "/v2/models/mlp"))
    full = client.response()
    client.send(request("HEAD", "/v2/models/mlp") + request("GET", "/v2/health/ready"))
    while client._buffer.count(b"\r\n\r\n") < 2:
        client._fill()
    head, rest = client._buffer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert f"Content-Length: {len(full.body)}".encode() in head
    assert rest.startswith(b"HTTP/1.1 200 OK\r\n")
    client._buffer = rest
    assert client.response().json() == {"ready": True}


def test_absolute_form_target_is_served(client: RawClient) -> None:
    """A request line naming the whole URL, as through a proxy (RFC 9112 3.2.2)."""
    client.send(request("GET", "http://duetime.test/v2/health/ready"))
    answer = client.response()
    assert (answer.status, answer.json()) == (200, {"ready": True})


def test_deep_pipeline_pauses_and_resumes_reading(client: RawClient) -> None:
    """More requests than the server keeps owed at once, all in one write."""
    paths = [f"/v2/models/{'mlp' if i % 2 else 'resnet'}" for i in range(200)]
    client.send(b"".join(request("GET", path) for path in paths))
    for path in paths:
        assert client.response().json()["name"] == path.rsplit("/", 1)[1]


def test_connection_close_is_honoured(client: RawClient) -> None:
    client.send(request("GET", "/v2/health/live", headers={"Connection": "close"}))
    response = client.response()
    assert response.status == 200
    assert response.headers["connection"] == "close"
    assert client.closed_by_server()


def test_requests_after_connection_close_are_not_answered(client: RawClient) -> None:
    client.send(
        request("GET", "/v2/health/live", headers={"Connection": "close"})
        + request("GET", "/v2/health/ready")
    )
    assert client.response().headers["connection"] == "close"
    assert client.closed_by_server()


def test_http_10_closes_after_the_response(client: RawClient) -> None:
    client.send(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
    response = client.response()
    assert response.status == 200
    assert response.headers["connection"] == "close"
    assert client.closed_by_server()


def test_http_10_keep_alive(client: RawClient, expected_mlp: list[float]) -> None:
    body = infer_body()
    post = b"POST /v2/models/mlp/infer HTTP/1.0\r\nConnection: keep-alive\r\n"
    for _ in range(2):
        client.send(post + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        response = client.response()
        assert output_of(response) == expected_mlp
        assert response.headers["connection"].lower() == "keep-alive"


@pytest.mark.parametrize(
    "connection",
    [b"Connection: close, keep-alive\r\n", b"Connection: keep-alive\r\nConnection: close\r\n"],
)
def test_http_10_asking_for_close_and_keep_alive_is_closed(
    client: RawClient, connection: bytes
) -> None:
    """RFC 9112 9.3: 'close' wins in any version. llhttp kept an HTTP/1.0 connection saying both
    open (found by a tester); its client, reading to the end, waited for the idle timeout."""
    client.send(b"GET /v2/health/live HTTP/1.0\r\n" + connection + b"\r\n")
    response = client.response()
    assert response.status == 200
    assert response.headers["connection"] == "close"
    assert client.closed_by_server()


@pytest.mark.parametrize("host", ["a b", "x/y", "u@x", "x:port", "x\xff", "[::1"])
def test_a_host_that_is_not_a_host_and_port_gets_400(client: RawClient, host: str) -> None:
    """RFC 9112 3.2: 400 for a Host field with an invalid value (it was served, found by a
    tester); one that is a host and port, a name, an IPv4 or IPv6 literal, is served."""
    head = f"GET /v2/health/live HTTP/1.1\r\nHost: {host}\r\n\r\n".encode("latin-1")
    client.send(head)
    response = client.response()
    assert response.status == 400
    assert "Host" in response.json()["error"]


@pytest.mark.parametrize(
    "host", ["localhost:8000", "127.0.0.1", "[::1]:8000", "my_host.test", "", "localhost \t"]
)
def test_a_host_and_port_is_served(client: RawClient, host: str) -> None:
    client.send(f"GET /v2/health/live HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    assert client.response().status == 200


# -- request bodies ------------------------------------------------------------------------------


def test_chunked_request_body(client: RawClient, expected_mlp: list[float]) -> None:
    body = infer_body()
    sizes = [1, 7, 100, 4096]
    chunks, offset = [], 0
    while offset < len(body):
        size = sizes[len(chunks) % len(sizes)]
        chunks.append(body[offset : offset + size])
        offset += size
    encoded = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks) + b"0\r\n\r\n"
    headers = {"Transfer-Encoding": "chunked"}
    client.send(request("POST", "/v2/models/mlp/infer", encoded, headers))
    assert output_of(client.response()) == expected_mlp
    client.send(request("GET", "/v2/health/live"))  # the connection is still in step
    assert client.response().status == 200


def test_chunked_body_sent_in_pieces(client: RawClient, expected_mlp: list[float]) -> None:
    body = infer_body()
    half = len(body) // 2
    client.send(request("POST", "/v2/models/mlp/infer", headers={"Transfer-Encoding": "chunked"}))
    for piece in (b"%x\r\n" % half, body[:half], b"\r\n%x\r\n" % (len(body) - half)):
        client.send(piece)
    client.send(body[half:] + b"\r\n0\r\n\r\n")
    assert output_of(client.response()) == expected_mlp


def test_a_transfer_coding_other_than_chunked_gets_501(client: RawClient) -> None:
    """llhttp frames `gzip, chunked` as chunked; the body would be read still compressed."""
    body = gzip.compress(infer_body())
    encoded = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    headers = {"Transfer-Encoding": "gzip, chunked"}
    client.send(request("POST", "/v2/models/mlp/infer", encoded, headers))
    response = client.response()
    assert response.status == 501
    assert "Transfer-Encoding 'gzip, chunked' is not supported" in response.json()["error"]
    assert client.closed_by_server()


def test_expect_100_continue(client: RawClient, expected_mlp: list[float]) -> None:
    body = infer_body()
    headers = {"Expect": "100-continue", "Content-Length": str(len(body))}
    client.send(request("POST", "/v2/models/mlp/infer", headers=headers))
    interim = client.response()
    assert (interim.status, interim.body) == (100, b"")
    client.send(body)
    assert output_of(client.response()) == expected_mlp


def test_expect_100_continue_over_the_limit_gets_413_instead(
    client: RawClient, server: RunningServer
) -> None:
    limit = server.server.settings.max_body_bytes
    headers = {"Expect": "100-continue", "Content-Length": str(limit + 1)}
    client.send(request("POST", "/v2/models/mlp/infer", headers=headers))
    assert client.response().status == 413
    assert client.closed_by_server()


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "GZIP"])
def test_compressed_request_body(
    client: RawClient, expected_mlp: list[float], encoding: str
) -> None:
    body = infer_body()
    packed = gzip.compress(body) if encoding.lower() == "gzip" else zlib.compress(body)
    client.send(request("POST", "/v2/models/mlp/infer", packed, {"Content-Encoding": encoding}))
    assert output_of(client.response()) == expected_mlp


# -- limits and malformed requests ---------------------------------------------------------------


def test_content_length_over_the_limit(client: RawClient, server: RunningServer) -> None:
    limit = server.server.settings.max_body_bytes
    client.send(request("POST", "/v2/models/mlp/infer", headers={"Content-Length": str(limit + 1)}))
    response = client.response()
    assert response.status == 413
    assert response.headers["connection"] == "close"
    assert str(limit) in response.json()["error"]
    assert client.closed_by_server()


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_body_over_the_limit_sent_whole_still_gets_413(
    client: RawClient, server: RunningServer, framing: str
) -> None:
    """A client that uploads without waiting reads the 413, not a connection reset."""
    body = b"x" * (server.server.settings.max_body_bytes + 1024)
    if framing == "chunked":
        encoded = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        client.send(
            request("POST", "/v2/models/mlp/infer", encoded, {"Transfer-Encoding": "chunked"})
        )
    else:
        client.send(request("POST", "/v2/models/mlp/infer", body))
    response = client.response()
    assert response.status == 413
    assert response.headers["connection"] == "close"
    assert client.closed_by_server()


@pytest.mark.parametrize("where", ["header", "url"])
def test_head_over_the_limit(client: RawClient, server: RunningServer, where: str) -> None:
    big = "a" * (server.server.settings.max_header_bytes + 1)
    if where == "header":
        client.send(request("GET", "/v2/health/live", headers={"X-Big": big}))
    else:
        client.send(request("GET", f"/v2/health/live?{big}"))
    response = client.response()
    assert response.status == 431
    assert "limit" in response.json()["error"]
    assert client.closed_by_server()


@pytest.mark.parametrize(
    "data",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /v2/health/live HTTP/1.1 extra\r\n\r\n",
        b"GET /v2/health/live FTP/1.1\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32) + b"\r\n\r\n",  # a TLS hello
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nContent-Length: ten\r\n\r\n",
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: t\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /v2/health/live HTTP/1.1\r\nBad Header\r\n\r\n",
    ],
    ids=["garbage", "extra-token", "not-http", "tls", "bad-length", "bad-chunk", "bad-header"],
)
def test_malformed_request_gets_400(client: RawClient, server: RunningServer, data: bytes) -> None:
    client.send(data)
    response = client.response()
    assert response.status == 400
    assert response.headers["connection"] == "close"
    assert "malformed" in response.json()["error"]
    assert client.closed_by_server()
    with RawClient(server.http) as fresh:
        fresh.send(request("GET", "/v2/health/ready"))
        assert fresh.response().status == 200


def test_malformed_request_after_a_good_one(client: RawClient) -> None:
    """The good one is answered first, then the 400, then the connection closes."""
    client.send(request("GET", "/v2/health/live") + b"NOT HTTP AT ALL\r\n\r\n")
    assert client.response().status == 200
    assert client.response().status == 400
    assert client.closed_by_server()


@pytest.mark.parametrize("behind_inference", [False, True])
def test_upgrade_is_ignored_then_the_connection_closes(
    client: RawClient, expected_mlp: list[float], behind_inference: bool
) -> None:
    """The request is answered as HTTP/1.1 (no 101), saying the connection closes (it said
    nothing, and a keep-alive client's next request went unanswered); nothing after it on the
    wire is read."""
    upgrade = request("GET", "/v2/health/live", headers={"Connection": "Upgrade", "Upgrade": "h2c"})
    if behind_inference:  # owed responses are still written, in order
        client.send(infer_request() + upgrade + request("GET", "/v2/health/ready"))
        assert output_of(client.response()) == expected_mlp
    else:
        client.send(upgrade)
    answer = client.response()
    assert answer.status == 200
    assert answer.headers["connection"] == "close"
    assert client.closed_by_server()


@pytest.mark.parametrize(
    ("method", "path", "allowed", "header"),
    [
        ("DELETE", "/v2/health/live", "GET", "GET, HEAD"),
        ("POST", "/v2", "GET", "GET, HEAD"),
        ("PUT", "/v2/models/mlp", "GET", "GET, HEAD"),
        ("POST", "/v2/models/mlp/config", "GET", "GET, HEAD"),
        ("DELETE", "/v2/logging", "GET, POST", "GET, HEAD, POST"),
        ("GET", "/v2/models/mlp/infer", "POST", "POST"),
    ],
)
def test_wrong_method_gets_405(
    client: RawClient, method: str, path: str, allowed: str, header: str
) -> None:
    """Allow lists HEAD wherever GET is taken (a HEAD is answered as its GET, without the
    body): it left HEAD out (found by a tester)."""
    client.send(request(method, path))
    response = client.response()
    assert response.status == 405
    assert response.headers["allow"] == header
    assert allowed in response.json()["error"]
    client.send(request("GET", "/v2/health/live"))  # still usable
    assert client.response().status == 200


@pytest.mark.parametrize(
    "path",
    [
        "/nope",  # ("/" is KServe V1's liveness)
        "/v1/nope",
        "/v2/nope",
        "/v2/health/dead",
        "/v2/models/mlp/nope",
        "/v2/models/mlp/versions/1/x",
    ],
)
def test_unknown_path_gets_404(client: RawClient, path: str) -> None:
    client.send(request("GET", path))
    response = client.response()
    assert response.status == 404
    assert response.json()["error"]
    client.send(request("GET", "/v2/health/live"))
    assert client.response().status == 200


def test_an_unknown_path_is_named_as_it_was_sent(client: RawClient) -> None:
    """An encoded '/' separates no segments: the 404 named '/v2/health/live', an endpoint
    there is, for '/v2%2Fhealth%2Flive' (found by a tester)."""
    client.send(request("GET", "/v2%2Fhealth%2Flive"))
    response = client.response()
    assert response.status == 404
    assert "'/v2%2Fhealth%2Flive'" in response.json()["error"]
    client.send(request("OPTIONS", "*"))  # (it was named '/*')
    response = client.response()
    assert response.status == 404
    assert "no such endpoint '*'" in response.json()["error"]


# -- closing -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def impatient(mlp_repo: Path) -> Iterator[RunningServer]:
    """The demo mlp behind a server that closes idle connections after 0.3 s."""
    settings = ServerSettings(
        model_repository=mlp_repo, http_port=0, grpc_port=0, idle_timeout_s=0.3
    )
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


def test_idle_connection_is_closed(impatient: RunningServer) -> None:
    with RawClient(impatient.http) as client:
        client.send(request("GET", "/v2/health/live"))
        assert client.response().status == 200
        answered = time.monotonic()
        assert client.closed_by_server()
        assert time.monotonic() - answered >= 0.2


def test_silent_connection_is_closed(impatient: RunningServer) -> None:
    """At the idle timeout (0.3 s here): a connection that never sent a byte is idle, not only
    late with its first request's head (`request_read_timeout_s`, 10 s)."""
    accepted = time.monotonic()
    with RawClient(impatient.http) as client:
        assert client.closed_by_server()
    assert time.monotonic() - accepted < 5.0, "closed at the read timeout, not the idle one"


def test_busy_connection_outlives_the_idle_timeout(impatient: RunningServer) -> None:
    """Requests every so often keep it open past several idle periods."""
    with RawClient(impatient.http) as client:
        started = time.monotonic()
        while time.monotonic() - started < 0.7:
            client.send(infer_request())
            assert client.response().status == 200


def test_client_gone_with_requests_in_flight(server: RunningServer) -> None:
    pipelined = b"".join(infer_request("resnet", rows=8) for _ in range(4))
    with RawClient(server.http) as client:
        client.send(pipelined)
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with RawClient(server.http) as client:  # abort (RST) above; the server keeps serving
        client.send(infer_request("resnet", rows=2) + request("GET", "/v2/health/ready"))
        assert client.response().json()["outputs"][0]["shape"] == [2, 10]
        assert client.response().status == 200


def tile_repository(repo: Path) -> Path:
    """A model whose answer is 400 KB for a 16-byte input: y = Tile(x, [1, 25000])."""
    write_version(repo, "tile", 1, wide_tile_model())
    # (its 400 KB JSON answers are encoded on the loop, holding the GIL for milliseconds that
    # the instance thread's runs then count as their own: no slow-execution breaker here)
    (repo / "tile" / "config.toml").write_text("[breaker]\nslow_min_us = 60000000\n")
    return repo


@pytest.fixture(scope="module", params=[64 * 1024 * 1024, 1024 * 1024], ids=["64MiB", "1MiB"])
def big_answers_server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[RunningServer]:
    """The tile model, with this `max_connection_inflight_bytes`."""
    repo = tile_repository(tmp_path_factory.mktemp("big-answers"))
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0,
        max_connection_inflight_bytes=request.param,
    )  # fmt: skip
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


def executions(server: RunningServer) -> int:
    with RawClient(server.http) as other:
        other.send(request("GET", "/v2/models/tile/stats"))
        return int(other.response().json()["model_stats"][0]["inference_count"])


def settled_executions(server: RunningServer, beyond: int, within_s: float = 10.0) -> int:
    """The executions once they stop growing for 0.5 s (a busy machine takes longer than a
    second to run and encode the answers owed: CI read 66, then 67), or once past `beyond`."""
    last, end = executions(server), time.monotonic() + within_s
    while time.monotonic() < end:
        time.sleep(0.5)
        now = executions(server)
        if now == last or now > beyond:
            return now
        last = now
    return last


def test_a_client_not_reading_its_answers_gets_no_more_started(
    big_answers_server: RunningServer,
) -> None:
    """A read can hold many pipelined requests: they all ran, and their answers piled up in the
    server's memory while the client read none (100 MB each, 4 GB in one probe). Requests wait
    unstarted beyond the owed answers allowed, or while the client does not read."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                   "data": [1, 2, 3, 4]}]}).encode()  # fmt: skip
    count = 150
    held = big_answers_server.server.settings.max_connection_inflight_bytes
    owed = 64 if held > 64 * 400_000 else held // 400_000 + 8  # (8: before any answer's size)
    before = executions(big_answers_server)
    with RawClient(big_answers_server.http) as client:
        client.send(request("POST", "/v2/models/tile/infer", body) * count)
        started = settled_executions(big_answers_server, beyond=before + owed + 36) - before
        # those owed, and those whose answers the kernel's socket buffers took (a few MB)
        assert started <= owed + 36, f"{started} of {count} run, none of their answers read"
        time.sleep(0.5)
        assert executions(big_answers_server) - before == started  # (none while none is read)
        for _ in range(count):  # none is lost: each is answered, in order, once read
            response = client.response()
            assert response.status == 200
            assert len(response.json()["outputs"][0]["data"]) == 100_000
    assert executions(big_answers_server) - before == count


@pytest.fixture(scope="module")
def impatient_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The tile model, closing connections idle (or not reading) for 1 s."""
    repo = tile_repository(tmp_path_factory.mktemp("impatient"))
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0,
        idle_timeout_s=1.0, request_read_timeout_s=1.0,
    )  # fmt: skip
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


TILE_BODY = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
).encode()


def test_a_client_that_reads_none_of_its_answers_is_dropped_after_the_idle_timeout(
    impatient_server: RunningServer,
) -> None:
    """As nginx's `send_timeout`: a connection whose client read nothing for `idle_timeout_s`
    while answers wait to be sent is dropped. It used to stay open for as long as the client
    kept it, holding its answers (up to `max_connection_inflight_bytes`) and a connection."""
    count = 20  # 8 MB of answers: more than the socket buffers take
    with RawClient(impatient_server.http, receive_buffer=32 * 1024) as client:
        client.send(request("POST", "/v2/models/tile/infer", TILE_BODY) * count)
        time.sleep(3.5)  # (timeouts are checked every second)
        answered = 0
        try:
            for _ in range(count):
                assert client.response().status == 200
                answered += 1
        except (EOFError, ConnectionResetError):
            pass  # dropped
        assert answered < count, "the server kept the connection of a client not reading"
    with RawClient(impatient_server.http) as other:  # the server serves on
        other.send(request("POST", "/v2/models/tile/infer", TILE_BODY))
        assert other.response().status == 200


def test_a_client_reading_slowly_is_not_dropped(impatient_server: RunningServer) -> None:
    """Each read restarts the clock: a client reading big answers (10 MB) more slowly than the
    server writes them, but reading, gets them all, however long that takes."""
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [10, 4],
                                   "data": list(range(40))}]}).encode()  # fmt: skip
    with RawClient(impatient_server.http, receive_buffer=128 * 1024) as client:
        client.send(request("POST", "/v2/models/tile/infer", body) * 2)
        received = b""
        started = time.monotonic()
        while received.count(b"HTTP/1.1 200") < 2 or not received.endswith(b"]}]}"):
            time.sleep(0.025)
            chunk = client.sock.recv(128 * 1024)
            assert chunk, f"dropped after {len(received)} bytes"
            received += chunk
        assert time.monotonic() - started > 1.5, "read faster than the idle timeout"
