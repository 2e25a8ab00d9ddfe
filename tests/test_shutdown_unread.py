"""`duetime serve` stopped by SIGTERM while requests its clients sent whole wait to be read (a
subprocess): each is answered, served or refused 503, none cut off."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.test_cli import STARTUP_GUARD_S, received_until_closed, serving

pytestmark = pytest.mark.timeout(90)

WIDTH = 1 << 20
"""A row of 4 MiB: bodies this big are bulk, read in turns at a share of the loop."""


def mean_repository(root: Path) -> Path:
    """A repository of model `mean`, the mean of a [1, width] input: cheap to run."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "width"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=1)
    graph = helper.make_graph([node], "mean", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (root / "mean" / "1").mkdir(parents=True)
    onnx.save(model, root / "mean" / "1" / "model.onnx")
    (root / "mean" / "config.toml").write_text("max_batch_size = 0\n")
    return root


def binary_request() -> bytes:
    x = np.full((1, WIDTH), 0.5, np.float32)
    header = json.dumps({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, WIDTH],
                    "parameters": {"binary_data_size": x.nbytes}}],
        "parameters": {"timeout": 60_000_000},
    }).encode()  # fmt: skip
    body = header + x.tobytes()
    return (
        b"POST /v2/models/mean/infer HTTP/1.1\r\nHost: x\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n%b"
        % (len(header), len(body), body)
    )


def small_request() -> bytes:
    """A JSON request of one value to `mean`."""
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0.5]}]}
    ).encode()
    return b"POST /v2/models/mean/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b" % (
        len(body),
        body,
    )


def test_sigterm_answers_the_requests_sent_whole_and_not_read_yet(tmp_path: Path) -> None:
    """Sixteen clients each wrote a 4 MiB request whole, then the server got a SIGTERM: 15 of
    16 had their connections closed unanswered (found by a tester), the server reading their
    bodies at a share of its loop and closing every connection without a request begun."""
    request = binary_request()
    clients = 16
    answers: list[bytes] = [b""] * clients
    written = threading.Barrier(clients + 1)

    def client(index: int, sock: socket.socket) -> None:
        sock.sendall(request)
        written.wait()
        answers[index] = received_until_closed(sock)  # (a reset: the answer is lost)

    with serving(tmp_path, str(mean_repository(tmp_path / "repo"))) as server:
        host, port = server.http.rsplit(":", 1)
        sockets = [socket.create_connection((host, int(port)), timeout=30) for _ in range(clients)]
        threads = [threading.Thread(target=client, args=item) for item in enumerate(sockets)]
        try:
            for thread in threads:
                thread.start()
            written.wait(timeout=30)
            server.process.send_signal(signal.SIGTERM)
            for thread in threads:
                thread.join(timeout=30)
        finally:
            for sock in sockets:
                sock.close()
        assert server.process.wait(timeout=STARTUP_GUARD_S) == 0
    statuses = [answer.split(b"\r\n", 1)[0] for answer in answers]
    assert all(
        status in (b"HTTP/1.1 200 OK", b"HTTP/1.1 503 Service Unavailable") for status in statuses
    ), statuses
    for answer in answers:
        if b" 503 " in answer.split(b"\r\n", 1)[0]:
            assert b"the server is shutting down; retry on another replica" in answer
            assert b"connection: close" in answer.lower()


def test_sigterm_while_a_big_body_is_coming_answers_it(tmp_path: Path) -> None:
    """A body big enough to be read straight into its buffer, half sent at the SIGTERM: its
    rest went to the parser, which never saw the first half, and the request never completed
    (closed unanswered after a second; before, after the grace)."""
    request = binary_request()
    half = len(request) // 2
    with serving(tmp_path, str(mean_repository(tmp_path / "repo"))) as server:
        host, port = server.http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(request[:half])
            time.sleep(0.3)  # (its head is read, and a part of its body)
            server.process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            sock.sendall(request[half:])
            answer = received_until_closed(sock)
        assert server.process.wait(timeout=STARTUP_GUARD_S) == 0
    assert answer.split(b"\r\n", 1)[0] in (b"HTTP/1.1 200 OK", b"HTTP/1.1 503 Service Unavailable")


def test_a_request_that_comes_whole_after_sigterm_within_the_grace_is_run(tmp_path: Path) -> None:
    """NOTE: the engine stopped serving at the stop: a request whose body came 20 ms after
    SIGTERM, while the models still ran work queued before it, got 503 "shutting down", where
    the README has such a request run while the models drain (found by a tester). The models
    serve on while a request is half read, or one came within the last 50 ms."""
    request = small_request()
    with serving(tmp_path, str(mean_repository(tmp_path / "repo"))) as server:
        host, port = server.http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(request[:-5])
            time.sleep(0.3)  # (its head is read, and most of its body)
            server.process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            sock.sendall(request[-5:])
            answer = received_until_closed(sock)
        assert server.process.wait(timeout=STARTUP_GUARD_S) == 0
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:300]
    assert b'"data":[0.5]' in answer


def test_a_request_still_coming_when_the_grace_ends_is_refused_503(tmp_path: Path) -> None:
    """Its client stopped half-way: at the grace's end it is told why, not cut off."""
    request = binary_request()
    repository = str(mean_repository(tmp_path / "repo"))
    with serving(tmp_path, repository, "--shutdown-grace-s", "0.5") as server:
        host, port = server.http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(request[: len(request) // 2])
            time.sleep(0.3)
            server.process.send_signal(signal.SIGTERM)
            answer = received_until_closed(sock)
        assert server.process.wait(timeout=STARTUP_GUARD_S) == 0
    assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
    assert b"connection: close" in answer.lower()
    assert b"its grace ended before this request came whole" in answer


def test_sigterm_answers_connections_still_in_the_listen_backlog(tmp_path: Path) -> None:
    """Twenty clients connected and wrote a small request whole while the server was stopped
    (SIGSTOP: the kernel completed the connections and kept them and their bytes in the
    listener's backlog), then it got a SIGTERM: closing its listener reset 18 of them, with
    no answer (found by a tester); and those past --max-connections, once it took them
    (found by another)."""
    request = small_request()
    repository = str(mean_repository(tmp_path / "repo"))
    with serving(tmp_path, repository, "--max-connections", "5") as server:
        host, port = server.http.rsplit(":", 1)
        server.process.send_signal(signal.SIGSTOP)
        sockets = []
        try:
            for _ in range(20):
                sock = socket.create_connection((host, int(port)), timeout=30)
                sockets.append(sock)
                sock.sendall(request)
            server.process.send_signal(signal.SIGTERM)
            server.process.send_signal(signal.SIGCONT)
            answers = [received_until_closed(sock).split(b"\r\n", 1)[0] for sock in sockets]
        finally:
            server.process.send_signal(signal.SIGCONT)
            for sock in sockets:
                sock.close()
        assert server.process.wait(timeout=STARTUP_GUARD_S) == 0
    assert all(
        status in (b"HTTP/1.1 200 OK", b"HTTP/1.1 503 Service Unavailable") for status in answers
    ), answers


def test_grpc_takes_no_new_call_while_the_models_drain(tmp_path: Path) -> None:
    """NOTE: gRPC's stop began only once the models had drained: a client that connected after
    SIGTERM had its call run, and a half-sent call kept a server with a 2 s grace 5.4 s (found
    by a tester). It begins at the signal: new calls are refused while HTTP's drain goes on."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with serving(tmp_path, str(mean_repository(tmp_path / "repo")), "--shutdown-grace-s", "2") as (
        server
    ):
        host, port = server.http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(small_request()[:-5])  # (half read: the drain waits for it)
            time.sleep(0.3)
            signalled = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            x = grpcclient.InferInput("x", [1, 1], "FP32")
            x.set_data_from_numpy(np.full((1, 1), 0.5, np.float32))
            client = grpcclient.InferenceServerClient(server.grpc)
            try:
                with pytest.raises(InferenceServerException):
                    client.infer("mean", [x], client_timeout=5)
            finally:
                client.close()
            assert server.process.wait(timeout=STARTUP_GUARD_S) == 0
            assert time.monotonic() - signalled < 2 + 2.0  # (the grace, then gRPC's 1 s more)
