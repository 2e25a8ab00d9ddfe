"""Big binary inference bodies are read by the kernel straight into the buffer their tensors are
decoded from (frontend/http.py `_DIRECT_BODY_BYTES`): no copy of them on the event loop, the
same answers as ONNX Runtime's own on an aligned input, however the body arrives, and the
requests around them on the connection read as before."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import numpy as np
import onnxruntime as ort
import pytest
from conftest import RunningServer, start_server, stop_server
from onnx import TensorProto, helper
from repo_models import write_version

from duetime.config import ServerSettings
from duetime.frontend import codec, http

pytestmark = pytest.mark.timeout(120)

COLUMNS = 4096  # a row is 16 KiB: over the threshold
X = np.random.default_rng(7).standard_normal((2, COLUMNS)).astype(np.float32)
assert X.nbytes > http._DIRECT_BODY_BYTES


def _reduce_sum_model() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", COLUMNS])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    node = helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)
    model = helper.make_model(
        helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    return model.SerializeToString()


def _ort_answer(x: np.ndarray) -> bytes:
    """ORT's own answer, on an input at a multiple of 64 (as its own allocator places them)."""
    session = ort.InferenceSession(_reduce_sum_model(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": codec.aligned_copy(x)})
    return np.asarray(y, np.float32).tobytes()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """`sum`: ReduceSum over all of x, served without batching (no batch buffer copies it)."""
    repo = tmp_path_factory.mktemp("in-place")
    write_version(repo, "sum", 1, _reduce_sum_model())
    (repo / "sum" / "config.toml").write_text("max_batch_size = 0\n")
    running, thread = start_server(ServerSettings(model_repository=repo, http_port=0, grpc_port=0))
    try:
        yield running
    finally:
        stop_server(running, thread)


def _request(x: np.ndarray, request_id: str = "", extra_headers: str = "") -> bytes:
    doc = {
        "id": request_id,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }  # fmt: skip
    head = json.dumps(doc).encode()
    body = head + x.tobytes()
    return (
        f"POST /v2/models/sum/infer HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {len(head)}\r\n{extra_headers}\r\n"
    ).encode() + body


class Reader:
    """Reads HTTP/1.1 answers (Content-Length framed) off one socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._more()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        while len(self.buffer) < length:
            self._more()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(lines[0].split()[1]), headers, body

    def closed(self) -> bool:
        self.sock.settimeout(10)
        return self.buffer == b"" and self.sock.recv(1) == b""

    def _more(self) -> None:
        data = self.sock.recv(1 << 16)
        assert data, "the server closed the connection"
        self.buffer += data


def _output(answer: tuple[int, dict[str, str], bytes]) -> bytes:
    status, headers, body = answer
    assert status == 200, body
    return body[int(headers["inference-header-content-length"]) :]


@pytest.fixture
def connection(server: RunningServer) -> Iterator[tuple[socket.socket, Reader]]:
    host, port = server.http.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        yield sock, Reader(sock)
    finally:
        sock.close()


def test_a_body_sent_in_pieces_is_decoded_without_a_copy_and_answers_as_ort(
    connection: tuple[socket.socket, Reader], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _ort_answer(X)
    copies: list[int] = []
    aligned_copy = codec.aligned_copy

    def counted(array: np.ndarray) -> np.ndarray:
        copies.append(array.nbytes)
        return aligned_copy(array)

    monkeypatch.setattr(codec, "aligned_copy", counted)
    sock, reader = connection
    for length in range(0, 70, 9):  # (the JSON header's length moves the tensor's offset)
        data = _request(X, "i" * length)
        for start in range(0, len(data), 7000):
            sock.sendall(data[start : start + 7000])
            time.sleep(0.001)  # (each piece its own read, most likely)
        assert _output(reader.answer()) == expected
    assert [size for size in copies if size >= X.nbytes] == []


def test_requests_pipelined_around_big_bodies_are_answered_in_order(
    connection: tuple[socket.socket, Reader],
) -> None:
    sock, reader = connection
    other = X[::-1].copy()
    health = b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n"
    sock.sendall(_request(X, "a") + _request(other, "bb") + health + _request(X[:1], "c"))
    assert _output(reader.answer()) == _ort_answer(X)
    assert _output(reader.answer()) == _ort_answer(other)
    status, _, _ = reader.answer()
    assert status == 200
    assert _output(reader.answer()) == _ort_answer(X[:1])


def test_a_big_body_on_a_closing_connection_is_answered_then_closed(
    connection: tuple[socket.socket, Reader],
) -> None:
    sock, reader = connection
    data = _request(X, extra_headers="Connection: close\r\n")
    sock.sendall(data[:100])
    time.sleep(0.01)
    sock.sendall(data[100:])
    status, headers, _ = reader.answer()
    assert (status, headers.get("connection")) == (200, "close")
    assert reader.closed()


def test_a_client_gone_mid_body_leaves_the_server_serving(
    server: RunningServer, connection: tuple[socket.socket, Reader]
) -> None:
    host, port = server.http.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as gone:
        gone.sendall(_request(X)[: len(_request(X)) // 2])
        time.sleep(0.02)
    sock, reader = connection
    sock.sendall(_request(X))
    assert _output(reader.answer()) == _ort_answer(X)


def test_a_body_shorter_than_its_shape_is_refused_naming_the_input(
    connection: tuple[socket.socket, Reader],
) -> None:
    sock, reader = connection
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, COLUMNS],
                       "parameters": {"binary_data_size": X.nbytes}}]}  # fmt: skip
    head = json.dumps(doc).encode()
    body = head + X.tobytes()
    sock.sendall(
        f"POST /v2/models/sum/infer HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {len(head)}\r\n\r\n".encode()
        + body
    )
    status, _, answer = reader.answer()
    assert status == 400
    assert b"'x'" in answer
    sock.sendall(_request(X))  # the connection reads on
    assert _output(reader.answer()) == _ort_answer(X)
