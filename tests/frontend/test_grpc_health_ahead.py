"""Liveness and readiness calls (ServerLive, ServerReady, ModelReady, Health.Check) are answered
ahead of the inference calls waiting in gRPC's core: an orchestrator's probe of a busy server
must not time out behind its backlog (see `grpcbacklog.PROMPT_METHODS`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import RunningServer, on_loop, start_server, stop_server
from grpc_health.v1 import health_pb2, health_pb2_grpc

from duetime.config import ServerSettings
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.frontend.proto import grpc_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(120)

QUEUED = 300
"""Inference calls left waiting in the core before the probes are sent."""


@pytest.fixture(scope="module")
def server(mlp_repo: Path) -> Iterator[RunningServer]:
    running, thread = start_server(
        ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0, metrics=False)
    )
    yield running
    stop_server(running, thread)


def _infer_request() -> Any:
    x = np.zeros((1, 40), np.float32)
    request = pb.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 40])
    request.raw_input_contents.append(x.tobytes())
    return request


def _probes(channel: grpc.Channel) -> dict[str, Callable[[], Any]]:
    stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
    health = health_pb2_grpc.HealthStub(channel)
    return {
        "ServerLive": lambda: stub.ServerLive.future(pb.ServerLiveRequest(), timeout=60),
        "ServerReady": lambda: stub.ServerReady.future(pb.ServerReadyRequest(), timeout=60),
        "ModelReady": lambda: stub.ModelReady.future(pb.ModelReadyRequest(name="mlp"), timeout=60),
        "Check": lambda: health.Check.future(health_pb2.HealthCheckRequest(), timeout=60),
    }


def test_probes_are_answered_ahead_of_the_inference_calls_waiting(server: RunningServer) -> None:
    finished: list[str] = []
    lock = threading.Lock()

    def done(name: str) -> Callable[[Any], None]:
        def record(_future: Any) -> None:
            with lock:
                finished.append(name)

        return record

    with grpc.insecure_channel(server.grpc) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        request = _infer_request()
        assert stub.ModelInfer(request, timeout=30).model_name == "mlp"  # (warm)
        server.loop.call_soon_threadsafe(time.sleep, 2.0)  # the loop busy: calls wait in the core
        time.sleep(0.1)
        calls = [stub.ModelInfer.future(request, timeout=60) for _ in range(QUEUED)]
        for call in calls:
            call.add_done_callback(done("infer"))
        time.sleep(0.5)  # (sent, in order, behind them)
        probes = {name: make() for name, make in _probes(channel).items()}
        for name, probe in probes.items():
            probe.add_done_callback(done(name))
        for name, probe in probes.items():
            answer = probe.result(timeout=60)
            if name == "Check":
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
            elif name != "ServerLive":
                assert answer.ready, name
            else:
                assert answer.live
        for call in calls:
            assert call.result(timeout=60).model_name == "mlp"
    with lock:
        order = list(finished)
    for name in probes:
        ahead = order[: order.index(name)].count("infer")
        # (unregistered, each came after all 300; now after the few the loop took first)
        assert ahead < QUEUED // 2, (name, ahead)
    backlog = server.server._grpc_service.backlog
    assert backlog is not None
    for _ in range(100):  # every call counted taken was released
        if on_loop(server, lambda: backlog.holding) == 0:
            break
        time.sleep(0.05)
    assert on_loop(server, lambda: backlog.holding) == 0
