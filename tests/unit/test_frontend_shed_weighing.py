"""How the front ends weigh requests for the load shedder, and a streamed answer's lateness,
with stand-ins for the connection, the service and the shedder (no server, no timing).

A reviewer found: gRPC weighed nothing till the share was above 0 (HTTP's classes then took all
of it) and weighed each call at 4 KB whatever its size; HTTP looked through every request's
JSON for its priority whenever the loop was busy, even refusing nothing; it parsed the target
apart from the routes `RestApi` keeps; a request held back was weighed by its decoded arrays,
one sent at once by its body; a streamed answer whose settling time was never stamped was
sent as `held_late` though when its model made it was not known.
"""

from __future__ import annotations

import asyncio
import functools
from types import SimpleNamespace
from typing import Any

import pytest

from duetime.errors import Overloaded
from duetime.frontend import http
from duetime.frontend.grpc import InferenceService, _Submitted
from duetime.frontend.http import HttpConnection
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.frontend.rest import HeldInfer, RestApi
from duetime.overload import LoadShedder
from duetime.repository.registry import Registry


class Weighing:
    """A shedder that records what it is asked to weigh, watching and refusing nothing (or
    everything: `refusing`)."""

    def __init__(self, refusing: bool = False) -> None:
        self.share = 0.0
        self.watching = True
        self.saturated = False
        self.refusing_all = refusing
        self.weighed: list[tuple[str | None, int, bool]] = []

    def refuse(
        self, model: str | None = None, size: int = 0, top: bool = False, version: object = None
    ) -> bool:
        self.weighed.append((model, size, top))
        return self.refusing_all

    def refusing(self, model: str | None) -> bool:
        return self.refusing_all

    def check(self) -> None:  # (as LoadShedder's)
        if self.refuse():
            raise self.refusal()

    def refusal(self) -> Overloaded:
        return Overloaded("saturated")


def live_context() -> Any:
    return SimpleNamespace(cancelled=lambda: False, time_remaining=lambda: None)


def grpc_service(shedder: object, **engine: Any) -> SimpleNamespace:
    """What `InferenceService.ended` and `_submit` read of their service: an engine serving
    no model (and what `engine` adds)."""
    registry = SimpleNamespace(snapshot=SimpleNamespace(models={}))
    registry.served_name = functools.partial(Registry.served_name, registry)
    service = SimpleNamespace(
        _shedder=shedder, gone_calls=0, shed=0, _engine=SimpleNamespace(registry=registry, **engine)
    )
    service._shed = functools.partial(InferenceService._shed, service)
    service._count_shed = functools.partial(InferenceService._count_shed, service)
    return service


def test_a_grpc_call_is_weighed_by_its_size_while_the_shedder_watches_at_share_0() -> None:
    shedder = Weighing()
    service = grpc_service(shedder)
    data = b"\x00" * 48_000
    assert not InferenceService.ended(service, live_context(), data)  # type: ignore[arg-type]
    assert shedder.weighed == [(None, 48_000, False)]


def test_a_streamed_request_is_weighed_by_its_contents_while_the_shedder_watches() -> None:
    shedder = Weighing()
    submitted: list[Any] = []
    service = grpc_service(shedder, submit=lambda infer: submitted.append(infer) or "ticket")
    service._infer_request = lambda *args: ("infer", None)
    request = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"x" * 1000, b"y" * 24])
    InferenceService._submit(service, request, live_context(), 0, None)  # type: ignore[arg-type]
    assert shedder.weighed == [(None, 1024, False)]  # ('m': not served)
    assert submitted == ["infer"]
    shedder.refusing_all = True
    with pytest.raises(Overloaded):
        InferenceService._submit(service, request, live_context(), 0, None)  # type: ignore[arg-type]
    assert submitted == ["infer"]


def test_an_unstamped_streamed_answer_is_not_called_held_late() -> None:
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        future.set_result({})
        ticket = SimpleNamespace(future=future, done_ns=0, model="m")  # (never stamped)
        submitted = _Submitted(ticket, None, SimpleNamespace(due_ns=100))  # type: ignore[arg-type]
        service = SimpleNamespace(
            _engine=SimpleNamespace(clock=SimpleNamespace(now_ns=lambda: 10**9))
        )
        assert InferenceService._held_late(service, submitted) is None  # type: ignore[arg-type]
    finally:
        loop.close()


def rest_api_targets() -> Any:
    return SimpleNamespace(_infer_targets={})


def test_rest_api_infer_target_reads_and_fills_its_routes() -> None:
    api = rest_api_targets()
    assert RestApi.infer_target(api, b"/v2/models/mlp/versions/2/infer") == ("mlp", "2")
    assert RestApi.infer_target(api, b"/v2/models/m%20x/infer") == ("m x", None)
    assert api._infer_targets == {
        b"/v2/models/mlp/versions/2/infer": ("mlp", "2"),
        b"/v2/models/m%20x/infer": ("m x", None),
    }
    api._infer_targets[b"/routed"] = ("kept", None)
    assert RestApi.infer_target(api, b"/routed") == ("kept", None)
    assert RestApi.infer_target(api, b"/v2/models/mlp") is None
    assert RestApi.infer_target(api, b"/v2/models//infer") is None


class Api:
    """A RestApi stand-in serving model 'mlp', counting the targets asked of it."""

    def __init__(self) -> None:
        self.asked: list[bytes] = []
        self.shed = 0
        models = {"mlp": object()}
        registry = SimpleNamespace(
            snapshot=SimpleNamespace(models=models),
            count_shed=lambda model, version: None,
            scheduler_of=lambda model, version: models.get(model),
        )
        registry.served_name = functools.partial(Registry.served_name, registry)
        self.engine = SimpleNamespace(registry=registry)

    def infer_target(self, target: bytes) -> tuple[str, str | None] | None:
        self.asked.append(target)
        return ("mlp", None)


def test_http_looks_for_priority_only_where_its_model_may_be_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looks: list[bytes] = []
    real = http._priority_one

    def counted(headers: Any, body: bytes) -> bool:
        looks.append(body)
        return real(headers, body)

    monkeypatch.setattr(http, "_priority_one", counted)
    shedder = LoadShedder(cpu_clock=lambda: 0.0, wall_clock=lambda: 0.0, wait_clock=lambda: 0.0)
    shedder.watching = True  # (busy, refusing nothing: share 0)
    api = Api()
    connection = shedding_connection(shedder, api)
    body = b'{"parameters": {"priority": 1}, "inputs": []}'
    url = b"/v2/models/mlp/infer"
    for _ in range(5):
        assert not HttpConnection._shed(connection, url, {}, body)  # type: ignore[arg-type]
    assert looks == []
    assert api.asked == [url] * 5  # (its routes, not a parse of its own)
    assert {model for model, _ in shedder.costs()} == {"mlp"}
    shedder.share = 0.5  # (set by hand, no spread: every class refused at it)
    assert shedder.refusing("mlp")
    HttpConnection._shed(connection, url, {}, body)  # type: ignore[arg-type]
    assert looks == [body]
    assert ("mlp", True) in shedder.costs()


def shedding_connection(shedder: object, api: object) -> SimpleNamespace:
    """What `HttpConnection._shed` and `_shed_held` read of their connection (refusals are not
    counted)."""
    connection = SimpleNamespace(_shedder=shedder, _api=api)
    connection._refused = functools.partial(HttpConnection._refused, connection)
    return connection


def test_a_held_request_is_weighed_by_its_body_as_read() -> None:
    shedder = Weighing()
    api = Api()
    connection = shedding_connection(shedder, api)
    request = SimpleNamespace(model="mlp", version=None, priority=1, inputs={})
    held = HeldInfer(request, None, 0, 1234)  # type: ignore[arg-type]
    assert not HttpConnection._shed_held(connection, held)  # type: ignore[arg-type]
    assert shedder.weighed == [("mlp", 1234, True)]
