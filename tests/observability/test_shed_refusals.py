"""Requests the load shedder refuses unread count in `duetime_requests_refused_total` (reason
Shed), over HTTP and gRPC: the metric is of every inference request answered with an error
before any model ran it, and a 429 panel built on it showed under 1% of the 429s of an
overload (found by a tester). A real server, its shedder held refusing every request it may.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import serving, shedder_refusing

from duetime.config import ServerSettings
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.frontend.proto import grpc_service_pb2_grpc as pb_grpc
from duetime.scheduling.scheduler import ModelScheduler

pytestmark = pytest.mark.timeout(120)


def http_status(address: str) -> int:
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 40], "data": [0.5] * 40}]}
    ).encode()
    request = urllib.request.Request(f"http://{address}/v2/models/mlp/infer", body)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


def grpc_code(stub: pb_grpc.GRPCInferenceServiceStub) -> str:
    request = pb.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 40])
    request.raw_input_contents.append(np.full((1, 40), 0.5, np.float32).tobytes())
    try:
        stub.ModelInfer(request, timeout=30)
    except grpc.RpcError as exc:
        return str(exc.code().name)
    return "OK"


def test_shed_requests_count_as_refused(mlp_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (mlp busy: the shedder spares a model with capacity idle)
    monkeypatch.setattr(ModelScheduler, "idle", property(lambda self: False))
    monkeypatch.setattr(ModelScheduler, "backlogged", lambda self, now: True)
    settings = ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0)
    with serving(settings) as server:
        with shedder_refusing(server), grpc.insecure_channel(server.grpc) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            assert [http_status(server.http) for _ in range(5)] == [429] * 5
            assert [grpc_code(stub) for _ in range(3)] == ["RESOURCE_EXHAUSTED"] * 3
        counts = server.samples("duetime_requests_refused_total", "protocol", "status", "reason")
        shed = server.samples("duetime_requests_shed_total")
    assert counts[("http", "429", "Shed")] == 5
    assert counts[("grpc", "RESOURCE_EXHAUSTED", "Shed")] == 3
    assert shed[()] == 8
