"""The load shedder refuses no gRPC call of a model with capacity idle, as over HTTP
(test_http_shed_spare): only a busy model's calls are refused. A real server; its shedder held
at a share that refuses every call it may, its sampling stopped so the share stays.

Before, gRPC asked the shedder without `spare`: with the share up (an HTTP flood of another
model, say), the calls of an idle resnet were refused RESOURCE_EXHAUSTED "saturated" while its
instance sat idle.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import RunningServer, serving, shedder_refusing

from duetime.config import ServerSettings
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.frontend.proto import grpc_service_pb2_grpc as pb_grpc
from duetime.scheduling.scheduler import ModelScheduler

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(mlp_resnet_repo: Path) -> Iterator[RunningServer]:
    settings = ServerSettings(model_repository=mlp_resnet_repo, http_port=0, grpc_port=0)
    with serving(settings) as running:
        yield running


def resnet_call() -> pb.ModelInferRequest:
    image = np.ones((1, 3, 64, 64), np.float32)
    request = pb.ModelInferRequest(model_name="resnet")
    request.inputs.add(name="image", datatype="FP32", shape=list(image.shape))
    request.raw_input_contents.append(image.tobytes())
    return request


def codes(running: RunningServer, calls: int) -> list[str]:
    """The status of `calls` resnet calls made one after another (each once the one before
    is answered) while the shedder refuses every call it may."""
    found = []
    with shedder_refusing(running), grpc.insecure_channel(running.grpc) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(calls):
            try:
                stub.ModelInfer(resnet_call(), timeout=30)
                found.append("OK")
            except grpc.RpcError as exc:
                found.append(exc.code().name)
    return found


def test_calls_of_an_idle_model_are_not_shed(server: RunningServer) -> None:
    assert codes(server, 10) == ["OK"] * 10


def test_calls_of_a_busy_model_are_still_shed(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With resnet busy (queued work, every instance taken), the shedder's share applies."""
    monkeypatch.setattr(ModelScheduler, "idle", property(lambda self: False))
    monkeypatch.setattr(ModelScheduler, "backlogged", lambda self, now: True)
    assert codes(server, 10) == ["RESOURCE_EXHAUSTED"] * 10
