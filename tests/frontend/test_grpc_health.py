"""The standard gRPC health checking protocol and server reflection, against a real server (as a
Kubernetes probe, `grpc-health-probe` and `grpcurl` use them) and on the servicer alone."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import grpc
import pytest
from conftest import RunningServer
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from duetime.frontend import grpchealth
from duetime.frontend.grpchealth import HEALTH_SERVICE, INFERENCE_SERVICE, HealthService

pytestmark = pytest.mark.timeout(60)

Status = health_pb2.HealthCheckResponse.ServingStatus


def check(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status)


def test_check_reports_serving_for_the_server_and_the_inference_service(
    server: RunningServer,
) -> None:
    assert INFERENCE_SERVICE == "inference.GRPCInferenceService"
    assert check(server.grpc, "") == Status.SERVING
    assert check(server.grpc, INFERENCE_SERVICE) == Status.SERVING


def test_check_of_an_unknown_service_is_not_found(server: RunningServer) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        check(server.grpc, "no.such.Service")
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown service 'no.such.Service'" in raised.value.details()


def test_a_long_unknown_service_name_is_cut_in_the_error(server: RunningServer) -> None:
    """(Its error is sent in the call's trailers: a 20,000-character name made it
    RESOURCE_EXHAUSTED, "received metadata size exceeds hard limit".)"""
    with pytest.raises(grpc.RpcError) as raised:
        check(server.grpc, "s" * 20_000)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(raised.value.details()) < 1000


def test_a_check_of_an_unknown_service_leaves_nothing_for_the_cyclic_collector(
    server: RunningServer,
) -> None:
    """grpc.aio's context.abort keeps its exception on the call's state, whose traceback holds
    the handler's frame and context: a cycle, which the server's tuning (gc.freeze, a gen-0
    threshold of 50,000) leaves in memory (the server runs in this process)."""

    def live() -> int:
        return sum(type(o) is health_pb2.HealthCheckRequest for o in gc.get_objects())

    gc.collect()
    gc.disable()
    try:
        before = live()
        for _ in range(20):
            with pytest.raises(grpc.RpcError):
                check(server.grpc, "no.such.Service")
        assert live() - before <= 2  # (the last call's may still be on its way out)
    finally:
        gc.enable()


def test_watch_sends_the_status_at_once(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service, expected in (("", Status.SERVING), ("nope", Status.SERVICE_UNKNOWN)):
            stream = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert next(stream).status == expected
            stream.cancel()


def test_reflection_lists_the_services_and_describes_the_inference_service(
    server: RunningServer,
) -> None:
    with grpc.insecure_channel(server.grpc) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol=INFERENCE_SERVICE),
        ]
        listed, described = list(stub.ServerReflectionInfo(iter(requests), timeout=10))
    names = {service.name for service in listed.list_services_response.service}
    assert {INFERENCE_SERVICE, HEALTH_SERVICE} <= names
    files = described.file_descriptor_response.file_descriptor_proto
    assert files
    assert not described.HasField("error_response")
    assert any(b"ModelInfer" in proto for proto in files)


class _Context:
    """What `Check` touches of a grpc.aio servicer context."""

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


def test_the_status_follows_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOT_SERVING while the server is not ready or drains; a watcher hears each change once."""
    monkeypatch.setattr(grpchealth, "WATCH_POLL_S", 0.001)
    serving = [False]
    service = HealthService(lambda: serving[0], lambda: False)
    request = health_pb2.HealthCheckRequest(service="")

    async def scenario() -> list[int]:
        assert (await service.Check(request, _Context())).status == Status.NOT_SERVING
        watch = service.Watch(request, None)
        seen = [(await anext(watch)).status]
        serving[0] = True
        seen.append((await anext(watch)).status)
        serving[0] = False
        seen.append((await anext(watch)).status)
        await watch.aclose()
        return seen

    assert asyncio.run(scenario()) == [Status.NOT_SERVING, Status.SERVING, Status.NOT_SERVING]


def test_a_watch_ends_once_a_stopping_server_said_not_serving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a tester: an open Watch went on until gRPC's shutdown grace ran out, holding
    every shutdown 5-7 s with nothing queued."""
    monkeypatch.setattr(grpchealth, "WATCH_POLL_S", 0.001)
    stopping = [False]
    service = HealthService(lambda: not stopping[0], lambda: stopping[0])
    request = health_pb2.HealthCheckRequest(service="")

    async def scenario() -> list[int]:
        watch = service.Watch(request, None)
        seen = [(await anext(watch)).status]
        stopping[0] = True
        seen.append((await anext(watch)).status)
        with pytest.raises(StopAsyncIteration):  # (the stream ends: OK)
            await asyncio.wait_for(anext(watch), 5)
        return seen

    assert asyncio.run(scenario()) == [Status.SERVING, Status.NOT_SERVING]
