"""Model readiness follows the breakers: a model whose every instance's breaker is open takes
no request (each gets 503), so /v2/models/NAME/ready and gRPC ModelReady say it is not ready,
and ready again once its open period ends (the probe may go). Server readiness stays as it
was: one failing model does not take the server out of rotation."""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import start_server, stop_server
from repo_models import inputs, write_version
from tritonclient.grpc import service_pb2, service_pb2_grpc

from duetime.config import ServerSettings
from duetime.resilience.breaker import BreakerState
from tests.resilience.test_breakers import BREAKER, broken_model, config

pytestmark = pytest.mark.timeout(120)


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_a_model_whose_every_breaker_is_open_is_not_ready(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, broken_model())
    config(tmp_path, "m", "max_batch_size = 8\n" + BREAKER.replace("0.3", "30"))
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0, cpus="none")
    running, thread = start_server(settings)
    try:
        engine = running.server.engine
        http = running.http
        assert get(f"http://{http}/v2/models/m/ready") == 200
        feeds = {"x": inputs()["x"], "k": np.zeros((1, 1), np.int64)}

        async def fail() -> None:
            with contextlib.suppress(Exception):
                await engine.infer_async("m", feeds)

        for _ in range(3):  # (the third has the samples run: they fail, and it opens)
            asyncio.run_coroutine_threadsafe(fail(), running.loop).result(timeout=30)
        scheduler = engine.registry.snapshot.models["m"].versions["1"].primary.scheduler
        deadline = time.monotonic() + 30
        while [b.state for b in scheduler._breakers] != [BreakerState.OPEN]:
            assert time.monotonic() < deadline, "the breaker never opened"
            time.sleep(0.01)
        assert get(f"http://{http}/v2/models/m/ready") == 400
        assert get(f"http://{http}/v2/models/m/versions/1/ready") == 400
        assert get(f"http://{http}/v2/health/ready") == 200, "the server stays ready"
        with grpc.insecure_channel(running.grpc) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            answer = stub.ModelReady(service_pb2.ModelReadyRequest(name="m"))
            assert not answer.ready
        scheduler._breakers[0].open_until_ns = 0  # (its open period over: the probe may go)
        assert get(f"http://{http}/v2/models/m/ready") == 200
    finally:
        stop_server(running, thread)
