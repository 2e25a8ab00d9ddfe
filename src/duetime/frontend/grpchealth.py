"""The standard gRPC health checking protocol (`grpc.health.v1.Health`) and server reflection.

Kubernetes gRPC probes, `grpc-health-probe` and cloud load balancers ask `Health/Check`, not the
v2 `ServerReady`; `grpcurl` lists and calls services through reflection. Both answer from the
same state as the v2 calls: serving while the server accepts requests and its models are ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from duetime.frontend.proto import grpc_service_pb2 as pb

INFERENCE_SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
SERVICES = frozenset({"", INFERENCE_SERVICE})
_NAME_SHOWN = 256
"""Characters of an unknown service's name quoted in the error (sent in the call's trailers,
which clients take up to 8 KB of)."""
"""What a health check may name: the whole server ("") or the inference service."""
WATCH_POLL_S = 0.25
"""How often a `Watch` stream looks at the server's state (it sends only changes)."""

_Status = health_pb2.HealthCheckResponse.ServingStatus


class HealthService(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """`Check` and `Watch` from `serving()`: SERVING or NOT_SERVING for the server ("") and the
    inference service; NOT_FOUND (Check) or SERVICE_UNKNOWN (Watch) for any other name, as the
    protocol says."""

    def __init__(self, serving: Callable[[], bool], stopping: Callable[[], bool]) -> None:
        self._serving = serving
        self._stopping = stopping

    def _status(self, service: str) -> int:
        if service not in SERVICES:
            return int(_Status.SERVICE_UNKNOWN)
        return int(_Status.SERVING if self._serving() else _Status.NOT_SERVING)

    async def Check(self, request: Any, context: Any) -> Any:
        status = self._status(request.service)
        if status == _Status.SERVICE_UNKNOWN:
            # (not context.abort: its exception stays on the call's state, its traceback holds
            # this frame and the context: a cycle only the rarely run collector frees; see
            # grpc._abort. A status that is not OK drops the answer returned.)
            context.set_code(grpc.StatusCode.NOT_FOUND)
            context.set_details(
                f"unknown service '{request.service[:_NAME_SHOWN]}'; this server checks '' (the "
                "server) and "
                f"'{INFERENCE_SERVICE}'"
            )
            return health_pb2.HealthCheckResponse()
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """The status now, then each change, until the client goes away or the server stops:
        then the stream ends (OK) once it has said NOT_SERVING.

        NOTE: it went on until gRPC's grace ran out: an open Watch (a load balancer's, a
        Kubernetes probe's) held every shutdown 5-7 s with nothing queued (found by a tester)."""
        sent = None
        while True:
            status = self._status(request.service)
            if status != sent:
                yield health_pb2.HealthCheckResponse(status=status)
                sent = status
            if self._stopping() and status != _Status.SERVING:
                return
            await asyncio.sleep(WATCH_POLL_S)


def add_health_and_reflection(
    server: Any, serving: Callable[[], bool], stopping: Callable[[], bool]
) -> None:
    """Register the health service and reflection (for the inference and health services);
    `stopping`: whether the server is shutting down (its Watch streams then end)."""
    health_pb2_grpc.add_HealthServicer_to_server(HealthService(serving, stopping), server)
    names = (INFERENCE_SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server, pool=_reflected_pool())


def _reflected_pool() -> Any:
    """The descriptor pool reflection describes services from: the v2 protos' own pool (kept
    apart from the default one, see scripts/gen_proto.sh) with the health and reflection protos
    added, so that one pool answers for every service the server lists."""
    pool = pb.DESCRIPTOR.pool
    for file in (health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR):
        try:
            pool.FindFileByName(file.name)
        except KeyError:
            pool.AddSerializedFile(file.serialized_pb)
    return pool
