"""gRPC calls that wait in gRPC's core before a handler takes them: counted from channelz, their
`timeout` counted from their arrival, and above capacity refused before they are decoded.

NOTE: grpc.aio takes one call from its core per turn of the loop; at 1,200 calls/s (mlp, 5 ms
timeouts, the 2-core VM) 300-800 calls waited there, each then served "on time" from when its
handler ran and answered 260-750 ms late: 0.4-1 answers a second on time."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from conftest import RunningServer, on_loop, shedder_refusing, start_server, stop_server

from duetime.config import ServerSettings
from duetime.frontend.grpc import InferenceService
from duetime.frontend.grpcbacklog import CoreBacklog, core_counts_reader, server_ids
from duetime.frontend.proto import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(120)

_INFER = "/inference.GRPCInferenceService/ModelInfer"
_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def server(mlp_repo: Path) -> Iterator[RunningServer]:
    running, thread = start_server(
        ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0)
    )
    yield running
    stop_server(running, thread)


def test_the_cores_count_of_calls_held_follows_the_real_server(server: RunningServer) -> None:
    backlog = server.server._grpc_service.backlog
    assert backlog is not None
    counts = backlog.core_counts
    assert counts is not None

    def held() -> int:
        assert counts is not None
        return counts()[1]

    with grpc.insecure_channel(server.grpc) as channel:
        stream = channel.stream_stream(_STREAM)
        done = threading.Event()

        def requests() -> Iterator[bytes]:
            done.wait(10)  # nothing to send: the stream stays open until the test is done
            yield from ()

        call = stream(requests())
        for _ in range(100):
            if on_loop(server, held) >= 1 and on_loop(server, lambda: backlog.holding) >= 1:
                break
            threading.Event().wait(0.02)
        assert on_loop(server, held) >= 1
        assert on_loop(server, lambda: backlog.holding) >= 1  # (held by a handler: not waiting)
        done.set()
        call.cancel()
    for _ in range(100):
        if on_loop(server, held) == 0 and on_loop(server, lambda: backlog.holding) == 0:
            break
        threading.Event().wait(0.02)
    assert on_loop(server, held) == 0
    assert on_loop(server, lambda: backlog.holding) == 0


def test_no_reader_unless_one_server_was_created_between_the_readings() -> None:
    one, two = server_ids(), server_ids()
    assert one is not None
    assert one == two
    assert core_counts_reader(one, two) is None
    assert core_counts_reader(None, two) is None
    assert core_counts_reader(frozenset(), frozenset({1, 2})) is None


def _dating(wait_s: float, remaining_s: float | None, now: int) -> tuple[Any, Any]:
    """A service whose backlog says calls wait `wait_s` in the core, and a call's context with
    `remaining_s` left till its gRPC deadline (None: none), at `now` (see `_dated`)."""
    service = SimpleNamespace(
        backlog=SimpleNamespace(waited_ns=lambda: int(wait_s * 1e9)),
        _engine=SimpleNamespace(clock=SimpleNamespace(now_ns=lambda: now)),
    )
    service._due = lambda *args: InferenceService._due(service, *args)  # type: ignore[arg-type]
    return service, SimpleNamespace(time_remaining=lambda: remaining_s)


def _with_timeout(us: int | None) -> Any:
    request = pb.ModelInferRequest(model_name="mlp")
    if us is not None:
        request.parameters["timeout"].int64_param = us
    return request


def test_a_new_call_arrived_and_is_due_by_its_estimated_wait_in_the_core() -> None:
    """Its arrival is the core's too, not its handler's start: a call that expired waiting
    there is a miss of a busy server, which the load shedder acts on (see `_dated`)."""
    now = 10_000_000_000
    service, context = _dating(0.05, None, now)
    dated = InferenceService._dated(service, _with_timeout(80_000), context)  # type: ignore[arg-type]
    assert dated == (now - 50_000_000, now - 50_000_000 + 80_000_000)
    # a stream's message comes on a call already taken: it did not wait in the core's queue
    dated = InferenceService._dated(service, _with_timeout(80_000), context, new_call=False)  # type: ignore[arg-type]
    assert dated == (now, now + 80_000_000)


def test_a_grpc_deadline_is_the_cores_own_and_is_not_moved() -> None:
    now = 10_000_000_000
    service, context = _dating(0.05, 0.02, now)
    dated = InferenceService._dated(service, _with_timeout(None), context)  # type: ignore[arg-type]
    assert dated == (now - 50_000_000, now + 20_000_000)


def test_a_refused_call_is_not_decoded_and_says_why_with_its_trace_id(
    server: RunningServer,
) -> None:
    with shedder_refusing(server), grpc.insecure_channel(server.grpc) as channel:
        infer = channel.unary_unary(_INFER)
        with pytest.raises(grpc.RpcError) as caught:
            infer(b"\xff\xff not a protobuf message")  # (decoded: INVALID_ARGUMENT)
    error = caught.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "saturated" in error.details()
    assert "(trace " in error.details()
    trailing = dict(error.trailing_metadata())
    assert trailing["x-trace-id"] in error.details()
    # and the server serves on, decoding again
    with grpc.insecure_channel(server.grpc) as channel:
        reply = channel.unary_unary(
            _INFER,
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as caught:
            reply(pb.ModelInferRequest(model_name="no-such-model"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_watch_streams_held_open_are_the_handlers_not_waiting_calls(
    server: RunningServer,
) -> None:
    """50 Watch streams held open (a client-side health check holds one per connection) looked
    like 50 calls waiting in the core: 4 clients far below capacity got 502 expiries and 7,862
    refusals."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    backlog = server.server._grpc_service.backlog
    assert backlog is not None
    counts = backlog.core_counts
    assert counts is not None
    with grpc.insecure_channel(server.grpc) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watches = [stub.Watch(health_pb2.HealthCheckRequest()) for _ in range(5)]
        for watch in watches:
            next(watch)  # (its first status: the stream is open)
        unheld = on_loop(server, lambda: counts()[1] - backlog.holding)
        for watch in watches:
            watch.cancel()
    assert unheld <= CoreBacklog.SLACK


def test_calls_are_looked_for_in_the_core_with_shedding_off(mlp_repo: Path) -> None:
    """With --overload-utilization 0 nothing sampled the core: 1,803 calls waited there while
    their timeouts counted from their handlers (good/s 3.5 at 2,000 calls/s, 1,294 with it)."""
    running, thread = start_server(
        ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0, overload_utilization=0)
    )
    try:
        assert running.server.shedder is None
        backlog = running.server._grpc_service.backlog
        assert backlog is not None
        sampled = [0]

        def count_samples() -> None:
            sample = backlog.sample

            def counting(busy: bool = True) -> None:
                sampled[0] += 1
                sample(busy)

            backlog.sample = counting  # type: ignore[method-assign]

        on_loop(running, count_samples)
        threading.Event().wait(0.2)
        assert sampled[0] > 0
    finally:
        stop_server(running, thread)
