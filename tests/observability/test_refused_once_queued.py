"""A request its model's scheduler refuses once it is queued (here: due while it waits in the
queue, dropped unrun: 504 / DEADLINE_EXCEEDED) counts in `duetime_requests_refused_total` as
the same refusal given before the scheduler does, on HTTP, gRPC ModelInfer and a gRPC stream
alike. (Only refusals raised as a request was submitted counted: a tester's client saw 7
504s of requests expired in the queue, and the metric moved by 0.)"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import RunningServer, serving
from tritonclient.grpc import service_pb2

from duetime.config import ServerSettings
from tests.unit.test_executor_close import FOREVER, loop_model

pytestmark = pytest.mark.timeout(60)

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
TIMEOUT_US = 100_000
"""The requests' timeout: they are admitted (due later than now) and expire in the queue."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Model 'loop' (y = x + n, n additions: `loop_model`), one instance, FIFO (it admits what
    fits the queue, as Triton's does), its instance held by a request that runs for hours:
    every request after it waits in the queue until its due time passes, never run."""
    repo: Path = tmp_path_factory.mktemp("refused-once-queued")
    version = repo / "loop" / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(loop_model())
    (repo / "loop" / "config.toml").write_text(
        'max_batch_size = 0\nexecution = "thread"\n[scheduling]\npolicy = "fifo"\n'
    )
    with serving(ServerSettings(model_repository=repo, http_port=0, grpc_port=0)) as running:
        host, port = running.http.rsplit(":", 1)
        body = json.dumps({"inputs": inputs_json(FOREVER)}).encode()
        with socket.create_connection((host, int(port)), timeout=30) as holder:
            holder.sendall(
                f"POST /v2/models/loop/infer HTTP/1.1\r\nHost: t\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            deadline = time.monotonic() + 30
            while not running.statistics("loop").busy_instances:  # (until its run starts)
                assert time.monotonic() < deadline, "the holding run never started"
                time.sleep(0.005)
            yield running
        # (its client gone, the holding run is stopped: see test_stopped_runs)


def inputs_json(n: int) -> list[dict[str, Any]]:
    return [
        {"name": "n", "datatype": "INT64", "shape": [1], "data": [n]},
        {"name": "x", "datatype": "FP32", "shape": [1], "data": [0.0]},
    ]


def refused(server: RunningServer) -> dict[tuple[str, ...], float]:
    return server.samples("duetime_requests_refused_total", "protocol", "status", "reason")


def http_post(server: RunningServer) -> int:
    host, port = server.http.rsplit(":", 1)
    body = json.dumps({"inputs": inputs_json(1), "parameters": {"timeout": TIMEOUT_US}})
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", "/v2/models/loop/infer", body.encode())
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def grpc_request() -> Any:
    message = service_pb2.ModelInferRequest(model_name="loop")
    message.inputs.add(name="n", datatype="INT64", shape=[1])
    message.raw_input_contents.append(np.ones(1, np.int64).tobytes())
    message.inputs.add(name="x", datatype="FP32", shape=[1])
    message.raw_input_contents.append(np.zeros(1, np.float32).tobytes())
    message.parameters["timeout"].int64_param = TIMEOUT_US
    return message


def grpc_call(server: RunningServer) -> grpc.StatusCode:
    with grpc.insecure_channel(server.grpc) as channel:
        infer = channel.unary_unary(
            INFER,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        try:
            infer(grpc_request(), timeout=30)
        except grpc.RpcError as error:
            return error.code()
        return grpc.StatusCode.OK


def grpc_streamed(server: RunningServer) -> str:
    with grpc.insecure_channel(server.grpc) as channel:
        stream = channel.stream_stream(
            STREAM,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        [answer] = list(stream(iter([grpc_request()]), timeout=30))
    return str(answer.error_message)


@pytest.mark.parametrize("protocol", ["http", "grpc", "grpc-stream"])
def test_a_request_expired_in_the_queue_counts_as_refused(
    server: RunningServer, protocol: str
) -> None:
    before = refused(server)
    expired = server.statistics("loop").expired
    if protocol == "http":
        assert http_post(server) == 504
        key = ("http", "504", "DeadlineExceeded")
    elif protocol == "grpc":
        assert grpc_call(server) == grpc.StatusCode.DEADLINE_EXCEEDED
        key = ("grpc", "DEADLINE_EXCEEDED", "DeadlineExceeded")
    else:
        assert "was not run" in grpc_streamed(server)
        key = ("grpc", "DEADLINE_EXCEEDED", "DeadlineExceeded")
    # (queued, then expired there: its model counts it expired; not refused as it came)
    assert server.statistics("loop").expired == expired + 1
    after = refused(server)
    assert after.get(key, 0) - before.get(key, 0) == 1
    assert sum(after.values()) - sum(before.values()) == 1
