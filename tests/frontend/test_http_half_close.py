"""A client that ends its side of the connection (FIN) is gone, as after a reset (Triton closes
such a connection and drops its requests; nginx counts it as the client closing, its 499): its
requests not started yet are withdrawn (counted cancelled, never run), and the server closes.
Answers written before the FIN was read are still delivered."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import RunningServer, start_server, stop_server
from repo_models import scale_model, write_version

from duetime.config import ServerSettings

pytestmark = pytest.mark.timeout(60)

QUEUE_DELAY_S = 0.3
"""How long a lone request of the `waits` model waits in its queue for a batch of 4."""


@pytest.fixture(scope="module")
def waiting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A fifo model whose lone request waits `QUEUE_DELAY_S` for its batch: still queued when its
    client leaves."""
    repo = tmp_path_factory.mktemp("repo")
    write_version(repo, "waits", 1, scale_model(2.0))
    (repo / "waits" / "config.toml").write_text(
        'max_batch_size = 16\n[scheduling]\npolicy = "fifo"\n'
        f"max_queue_delay_us = {int(QUEUE_DELAY_S * 1e6)}\npreferred_batch_size = [4]\n"
    )
    running, thread = start_server(ServerSettings(model_repository=repo, http_port=0, grpc_port=0))
    yield running
    stop_server(running, thread)


def _infer(model: str = "waits", rows: int = 1) -> bytes:
    x = np.ones((rows, 4), np.float32)
    tensor = {"name": "x", "datatype": "FP32", "shape": list(x.shape),
              "parameters": {"binary_data_size": x.nbytes}}  # fmt: skip
    head = json.dumps({"inputs": [tensor]}).encode()
    body = head + x.tobytes()
    return (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {len(head)}\r\n\r\n"
    ).encode() + body


def _connect(server: RunningServer) -> socket.socket:
    host, port = server.http.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=20)


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


def _cancelled(server: RunningServer, before: int, count: int) -> None:
    """Wait until `count` more requests of `waits` are counted cancelled."""
    deadline = time.monotonic() + 20
    while server.statistics("waits").cancelled < before + count:
        assert time.monotonic() < deadline, "the requests were never withdrawn"
        time.sleep(0.005)


@pytest.mark.parametrize("how", ["close", "shutdown"])
def test_a_queued_request_whose_client_sends_fin_is_withdrawn(
    waiting: RunningServer, how: str
) -> None:
    """It ran once its batch was due and counted succeeded (a reset withdrew it)."""
    before = waiting.statistics("waits")
    sock = _connect(waiting)
    try:
        sock.sendall(_infer())
        deadline = time.monotonic() + 20
        while waiting.statistics("waits").queued == 0:  # (the server has it)
            assert time.monotonic() < deadline, "the request never reached the queue"
            time.sleep(0.001)
        if how == "shutdown":
            sock.shutdown(socket.SHUT_WR)
        else:
            sock.close()
        _cancelled(waiting, before.cancelled, 1)
        time.sleep(QUEUE_DELAY_S * 2)  # (past its batch's due time: it would have run by now)
        after = waiting.statistics("waits")
        assert after.executions == before.executions
        assert after.succeeded == before.succeeded
        if how == "shutdown":
            assert _statuses(sock) == []  # (closed, nothing answered)
    finally:
        sock.close()


def test_pipelined_requests_then_fin_are_withdrawn_and_the_connection_closes(
    waiting: RunningServer,
) -> None:
    """The same rule for a pipelining client: what was not answered when the FIN was read is
    withdrawn (its half-close used to have them all run and answered)."""
    before = waiting.statistics("waits")
    with _connect(waiting) as sock:
        sock.sendall(_infer() + b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n" + _infer())
        deadline = time.monotonic() + 20
        while waiting.statistics("waits").queued == 0:
            assert time.monotonic() < deadline, "the request never reached the queue"
            time.sleep(0.001)
        sock.shutdown(socket.SHUT_WR)
        assert _statuses(sock) == []
        _cancelled(waiting, before.cancelled, 1)
        time.sleep(QUEUE_DELAY_S * 2)
        after = waiting.statistics("waits")
    assert after.executions == before.executions
    assert after.succeeded == before.succeeded


def test_answers_read_before_the_fin_are_delivered(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n")
        reply = sock.recv(1 << 16)
        assert reply.startswith(b"HTTP/1.1 200")
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1) == b""


def test_a_half_close_with_nothing_owed_closes(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1) == b""
