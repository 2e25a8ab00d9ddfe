"""The load shedder weighs a gRPC call by its model, as HTTP's requests are: the model's name
(and version) read from the serialized call without decoding it, its priority looked for only
where its model may be refused, and a refusal counted against the model. (Weighed as no model,
a gRPC flood of one heavy model had every model's gRPC calls refused alike.) Stand-ins for the
service and engine; a real LoadShedder."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import pytest

from duetime.errors import Shed
from duetime.frontend.grpc import (
    InferenceService,
    _asks_priority_one,
    _head_fields,
    _peeked_due,
    _peeked_target,
)
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.overload import LoadShedder
from duetime.repository.registry import Registry


class Scheduler:
    def __init__(self) -> None:
        self.shed = 0

    def count_shed(self) -> None:
        self.shed += 1


def service_of(shedder: LoadShedder, models: dict[str, Scheduler]) -> SimpleNamespace:
    """A service whose engine serves `models` (version "1" each, or none named)."""

    def count_shed(model: str, version: str | None) -> None:  # (as `Registry.count_shed`)
        if model in models and version in (None, "1"):
            models[model].count_shed()

    def scheduler_of(model: str, version: str | None) -> Scheduler | None:  # (as Registry's)
        return models[model] if model in models and version in (None, "1") else None

    registry = SimpleNamespace(
        snapshot=SimpleNamespace(models=models), count_shed=count_shed, scheduler_of=scheduler_of
    )
    registry.served_name = functools.partial(Registry.served_name, registry)
    registry.turn_wait_ns = functools.partial(Registry.turn_wait_ns, registry)
    service = SimpleNamespace(
        _shedder=shedder,
        gone_calls=0,
        shed=0,
        _engine=SimpleNamespace(registry=registry, recorder=None),
    )
    service._shed = functools.partial(InferenceService._shed, service)
    service._count_shed = functools.partial(InferenceService._count_shed, service)
    return service


def call(model: str, version: str = "", size: int = 100, priority: int | None = None) -> bytes:
    request = pb.ModelInferRequest(model_name=model, model_version=version, id="r")
    request.raw_input_contents.append(b"x" * size)
    if priority is not None:
        request.parameters["priority"].int64_param = priority
    return request.SerializeToString()


def live_context() -> Any:
    codes: list[Any] = []
    return SimpleNamespace(
        cancelled=lambda: False,
        time_remaining=lambda: None,
        set_code=codes.append,
        set_details=lambda details: None,
        set_trailing_metadata=lambda metadata: None,
        invocation_metadata=lambda: (),
        codes=codes,
    )


def shedder() -> LoadShedder:
    """A watching shedder (no `idle`: it spares no model's calls)."""
    made = LoadShedder(cpu_clock=lambda: 0.0, wall_clock=lambda: 0.0, wait_clock=lambda: 0.0)
    made.watching = True
    return made


def test_the_model_and_version_are_read_from_the_call_without_decoding_it() -> None:
    assert _peeked_target(call("mlp", "2")) == ("mlp", "2")
    assert _peeked_target(call("resnet")) == ("resnet", "")
    assert _peeked_target(call("m" * 300)) == ("m" * 300, "")  # (a 2-byte length)
    assert _peeked_target(pb.ModelInferRequest(id="x").SerializeToString()) == (None, "")
    assert _peeked_target(b"") == (None, "")
    assert _peeked_target(b"\x0a\xff\xff") == (None, "")  # (a length past the end)
    assert _peeked_target(b"\x0a\x02\xff\xfe") == (None, "")  # (not UTF-8)
    assert _peeked_target(b"\x0a\x80\x80\x80\x80\x80\x80") == (None, "")  # (endless varint)


def test_calls_are_weighed_by_their_served_model() -> None:
    made = shedder()
    service = service_of(made, {"mlp": Scheduler(), "resnet": Scheduler()})
    for data in (call("mlp"), call("resnet", size=40_000), call("made-up")):
        assert not InferenceService.ended(service, live_context(), data)  # type: ignore[arg-type]
    assert {model for model, _ in made.costs()} == {"mlp", "resnet", None}


def test_a_refused_call_counts_against_its_model_and_priority_1_is_its_own_class() -> None:
    made = shedder()
    mlp = Scheduler()
    service = service_of(made, {"mlp": mlp})
    made.share = 1.0  # (set by hand, no spread: every class refused at it)
    context = live_context()
    assert InferenceService.ended(service, context, call("mlp"))  # type: ignore[arg-type]
    assert mlp.shed == 1
    assert made.refused_by_model == {"mlp": 1}
    assert InferenceService.ended(service, context, call("mlp", "7"))  # type: ignore[arg-type]
    assert mlp.shed == 1  # (a version not served counts against no model)
    assert made.refused_by_model == {"mlp": 1, "": 1}
    InferenceService.ended(service, context, call("mlp", priority=1))  # type: ignore[arg-type]
    assert ("mlp", True) in made.costs()
    assert str(context.codes[0]) == "StatusCode.RESOURCE_EXHAUSTED"


def test_a_streamed_request_is_weighed_by_its_model_and_priority() -> None:
    made = shedder()
    mlp = Scheduler()
    service = service_of(made, {"mlp": mlp})
    made.share = 1.0
    request = pb.ModelInferRequest.FromString(call("mlp", priority=1))
    with pytest.raises(Shed):
        InferenceService._submit(service, request, live_context(), 0, None)  # type: ignore[arg-type]
    assert ("mlp", True) in made.costs()
    assert mlp.shed == 1


def test_priority_is_read_from_the_parameters_alone() -> None:
    request = pb.ModelInferRequest(model_name="resnet", id="r")
    request.parameters["timeout"].int64_param = 5000
    request.parameters["priority"].uint64_param = 1
    request.raw_input_contents.append(b"x" * 100_000)
    assert _asks_priority_one(request.SerializeToString())
    request.parameters["priority"].uint64_param = 2
    assert not _asks_priority_one(request.SerializeToString())
    # (the name in the tensors' bytes is no parameter: and the call is not decoded for it)
    tensors = pb.ModelInferRequest(model_name="resnet", raw_input_contents=[b"priority" * 1000])
    assert not _asks_priority_one(tensors.SerializeToString())
    assert not _asks_priority_one(b"\x22\xff\xff\xff\xff\x0f")  # (an entry past the end)


def test_the_head_fields_stop_at_the_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[bytes] = []
    real = pb.ModelInferRequest.FromString
    monkeypatch.setattr(
        pb.ModelInferRequest, "FromString", lambda data: decoded.append(data) or real(data)
    )
    request = pb.ModelInferRequest(model_name="m", model_version="2", id="i")
    request.parameters["priority"].int64_param = 1
    request.inputs.add(name="priority", datatype="FP32", shape=[1])
    request.raw_input_contents.append(b"\x00" * 600_000)
    data = request.SerializeToString()
    assert [tag for tag, *_ in _head_fields(data)] == [0x0A, 0x12, 0x1A, 0x22]
    assert _asks_priority_one(data)
    assert len(decoded) == 1
    assert len(decoded[0]) < 64  # (the entry alone)


def timed_call(
    timeout_us: int | None = None, priority: int | None = None, model: str = "mlp"
) -> bytes:
    request = pb.ModelInferRequest.FromString(call(model, priority=priority))
    if timeout_us is not None:
        request.parameters["timeout"].int64_param = timeout_us
    return request.SerializeToString()


def test_a_saturated_loop_refuses_unread_a_call_due_before_its_model_s_turn_comes() -> None:
    """As HTTP's (`HttpConnection._due`): the call's due time, its `timeout` parameter's from
    its arrival or its deadline's, is no further off than what a turn of the loop lately kept
    its model's requests waiting (`turn_wait_ns`); RESOURCE_EXHAUSTED, counted against its
    model as the shedder's, no miss. Priority 1 is spared, and every call while the loop is
    not saturated."""
    made = shedder()
    mlp = Scheduler()
    mlp.turn_wait_ns = 5e6  # type: ignore[attr-defined]
    service = service_of(made, {"mlp": mlp})
    service._engine.clock = SimpleNamespace(now_ns=lambda: 10**12)
    service.backlog = None
    service._due_unread = functools.partial(InferenceService._due_unread, service)

    def ended(data: bytes, deadline_s: float | None = None) -> list[Any]:
        context = live_context()
        context.time_remaining = lambda: deadline_s
        InferenceService.ended(service, context, data)  # type: ignore[arg-type]
        return [str(code) for code in context.codes]

    made.demand = 0.5  # (not saturated: nothing is refused for its due time)
    assert ended(timed_call(3_000)) == []
    made.demand = 0.95
    assert made.saturated
    assert ended(timed_call(3_000)) == ["StatusCode.RESOURCE_EXHAUSTED"]
    assert ended(timed_call(None), deadline_s=0.004) == ["StatusCode.RESOURCE_EXHAUSTED"]
    assert ended(timed_call(3_000, priority=1)) == []
    assert ended(timed_call(8_000)) == []
    assert ended(timed_call(None), deadline_s=0.008) == []
    assert ended(timed_call(8_000), deadline_s=0.002) == ["StatusCode.RESOURCE_EXHAUSTED"]
    assert ended(timed_call(None)) == []  # (no due time)
    assert ended(timed_call(0)) == []  # (0: none)
    assert ended(timed_call(3_000, model="nope")) == []  # (decoded: answered as not served)
    assert (mlp.shed, service.shed, made.refused_by_model) == (3, 3, {"mlp": 3})
    mlp.turn_wait_ns = 0.0  # type: ignore[attr-defined]  # (a model run on threads)
    assert ended(timed_call(3_000)) == []


def test_a_timeout_is_peeked_from_the_parameters_alone() -> None:
    arrived = 10**12
    assert _peeked_due(timed_call(3_000), arrived) == arrived + 3_000_000
    assert _peeked_due(timed_call(None), arrived) is None
    assert _peeked_due(timed_call(0), arrived) is None
    request = pb.ModelInferRequest.FromString(call("mlp"))
    request.parameters["timeout"].string_param = "soon"  # (refused as such once decoded)
    assert _peeked_due(request.SerializeToString(), arrived) is None
    request = pb.ModelInferRequest.FromString(call("mlp"))
    request.parameters["note"].string_param = "timeout"  # (another parameter saying it)
    assert _peeked_due(request.SerializeToString(), arrived) is None
