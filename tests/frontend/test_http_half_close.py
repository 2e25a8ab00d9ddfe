"""A client that ends its side of the connection (FIN, a half-close) after its requests still gets
their answers (RFC 9112 9.6: a half-close tells nothing of its interest in them); a request cut
off by the FIN is not run, and the server closes once the answers are out."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import RunningServer

pytestmark = pytest.mark.timeout(60)


def _infer(rows: int) -> bytes:
    x = np.ones((rows, 40), np.float32)
    tensor = {"name": "x", "datatype": "FP32", "shape": list(x.shape),
              "parameters": {"binary_data_size": x.nbytes}}  # fmt: skip
    head = json.dumps({"inputs": [tensor]}).encode()
    body = head + x.tobytes()
    return (
        f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {len(head)}\r\n\r\n"
    ).encode() + body


@pytest.fixture
def connection(server: RunningServer) -> Iterator[socket.socket]:
    host, port = server.http.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        yield sock


def _statuses(sock: socket.socket) -> list[int]:
    """The statuses of every answer until the server closes the connection."""
    data = b""
    while chunk := sock.recv(1 << 16):
        data += chunk
    statuses = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))  # fmt: skip
        statuses.append(int(head.split()[1]))
        data = data[length:]
    return statuses


@pytest.mark.parametrize("rows", [1, 64])  # (64 rows: a body read in place)
def test_pipelined_requests_then_a_half_close_are_all_answered(
    connection: socket.socket, rows: int
) -> None:
    connection.sendall(
        _infer(rows) + b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n" + _infer(2)
    )
    connection.shutdown(socket.SHUT_WR)
    assert _statuses(connection) == [200, 200, 200]


def test_a_request_cut_off_by_the_half_close_is_not_answered(connection: socket.socket) -> None:
    whole, cut = _infer(64), _infer(64)
    connection.sendall(whole + cut[: len(cut) // 2])
    connection.shutdown(socket.SHUT_WR)
    assert _statuses(connection) == [200]


def test_a_half_close_with_nothing_owed_closes(connection: socket.socket) -> None:
    connection.shutdown(socket.SHUT_WR)
    assert connection.recv(1) == b""
