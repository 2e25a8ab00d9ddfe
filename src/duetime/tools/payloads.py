"""Request payloads built before a run: random inputs from a model's signature, encoded once.

Each due class gets a small pool of distinct payloads in the target's wire form: complete HTTP
requests (v2 JSON or JSON + binary tensors), serialised gRPC `ModelInferRequest`s, or input
arrays for an in-process engine. The timeout travels as the v2 `timeout` parameter in µs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import quote

import numpy as np
import orjson

from duetime.datatypes import NUMPY_OF, v2_datatype_of
from duetime.frontend import codec
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.tools.arrivals import DueClass
from duetime.types import ModelSignature

WireProtocol = Literal["http-binary", "http-json", "grpc", "engine"]
PROTOCOLS: tuple[WireProtocol, ...] = ("http-binary", "http-json", "grpc", "engine")

GRPC_DEADLINE_MARGIN_S = 5.0
"""Added to a gRPC call's deadline beyond the request's timeout: the server's own due time is
the timeout (it takes the earlier of the two), the margin only frees the generator from a stuck
call, and leaves late answers measurable as late (as long as an HTTP run's default --drain
waits for them). A call whose own deadline fires is late, not expired (see `GrpcTransport`)."""


_TIMEOUT_KEY = b'"timeout":'
_TIMEOUT_VALUE = re.compile(rb" *\d+")
"""The `timeout` parameter's value in an HTTP payload: its digits, after the spaces an earlier
`restamp` put before them."""


@dataclass(frozen=True, slots=True)
class GrpcPayload:
    """A serialised ModelInferRequest and the call deadline (None: no deadline)."""

    data: bytes
    deadline_s: float | None


@dataclass(frozen=True, slots=True)
class EnginePayload:
    """Arguments of `Engine.infer_async` for one request."""

    inputs: Mapping[str, np.ndarray]
    timeout_s: float | None
    priority: int


@dataclass(frozen=True, slots=True)
class PayloadSpec:
    """What every request of a run carries, whatever its class."""

    protocol: WireProtocol
    model: str
    batch: int
    priority: int | None
    host: str = ""
    port: int = 0


def check_batch(signature: ModelSignature, model: str, batch: int) -> None:
    """Raise ValueError, naming --batch, if `model` cannot take `batch` rows in one request."""
    limit = signature.max_batch_size
    if limit == 0 and batch != 1:
        raise ValueError(f"--batch {batch}: model '{model}' does not batch; use --batch 1")
    if limit and batch > limit:
        raise ValueError(f"--batch {batch} is over model '{model}''s max_batch_size {limit}")


def random_inputs(
    signature: ModelSignature, batch: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """One random tensor per required input: free dims 1, the batch dim `batch` (for a batching
    model)."""
    inputs: dict[str, np.ndarray] = {}
    for spec in signature.required_inputs:
        shape = [d if d >= 0 else 1 for d in spec.shape]
        if signature.max_batch_size > 0 and shape:
            shape[0] = batch
        inputs[spec.name] = _random_array(spec.datatype, tuple(shape), rng)
    return inputs


def _random_array(datatype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dtype = NUMPY_OF[datatype]
    if datatype == "BYTES":
        words = rng.integers(0, 1 << 30, size=shape)
        strings = np.empty(shape, dtype=object)
        strings.flat[:] = [f"w{w}".encode() for w in words.flat]
        return strings
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    if dtype.kind in "iu":  # small values: integer inputs are often indices
        return rng.integers(0, 10, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def build_pool(
    spec: PayloadSpec, signature: ModelSignature, due: DueClass, size: int, rng: np.random.Generator
) -> list[Any]:
    """`size` distinct payloads of class `due`, ready to send."""
    return [encode(spec, random_inputs(signature, spec.batch, rng), due) for _ in range(size)]


def encode(spec: PayloadSpec, inputs: Mapping[str, np.ndarray], due: DueClass) -> Any:
    """One request in the wire form of `spec.protocol`."""
    parameters: dict[str, int] = {}
    if due.timeout_us is not None:
        parameters["timeout"] = due.timeout_us
    if spec.priority is not None:
        parameters["priority"] = spec.priority
    if spec.protocol == "engine":
        timeout_s = None if due.timeout_us is None else due.timeout_us / 1e6
        return EnginePayload(dict(inputs), timeout_s, spec.priority or 0)
    if spec.protocol == "grpc":
        deadline = None if due.timeout_us is None else due.timeout_us / 1e6 + GRPC_DEADLINE_MARGIN_S
        return GrpcPayload(grpc_request_bytes(spec.model, inputs, parameters), deadline)
    binary = spec.protocol == "http-binary"
    return http_request_bytes(spec, inputs, parameters, binary=binary)


def http_request_bytes(
    spec: PayloadSpec,
    inputs: Mapping[str, np.ndarray],
    parameters: Mapping[str, int],
    *,
    binary: bool,
) -> bytes:
    """A complete HTTP/1.1 v2 infer request (keep-alive), JSON or JSON + binary tensors."""
    tensors: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for name, array in inputs.items():
        tensor, raw = codec.encode_tensor(name, array, binary=binary)
        tensors.append(tensor)
        blobs.append(raw)
    request_parameters: dict[str, Any] = dict(parameters)
    if binary:
        request_parameters["binary_data_output"] = True
    doc: dict[str, Any] = {"inputs": tensors}
    if request_parameters:
        doc["parameters"] = request_parameters
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    body = head + b"".join(blobs)
    lines = [
        f"POST /v2/models/{quote(spec.model, safe='')}/infer HTTP/1.1",
        f"Host: {spec.host}:{spec.port}",
        f"Content-Length: {len(body)}",
    ]
    if binary:
        lines += ["Content-Type: application/octet-stream",
                  f"Inference-Header-Content-Length: {len(head)}"]  # fmt: skip
    else:
        lines.append("Content-Type: application/json")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def grpc_request_bytes(
    model: str, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, int]
) -> bytes:
    """A serialised ModelInferRequest with raw input contents and int64 parameters."""
    request = pb.ModelInferRequest(model_name=model)
    for name, array in inputs.items():
        datatype = v2_datatype_of(array)
        request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        request.raw_input_contents.append(codec.to_raw(array, datatype))
    for key, value in parameters.items():
        request.parameters[key].int64_param = value
    data: bytes = request.SerializeToString()
    return data


def restamp(payload: Any, timeout_us: int) -> Any:
    """`payload` (as `encode` made it, with a timeout) carrying `timeout_us` instead: at most
    the timeout it was made with (the time left of it), as an HTTP payload's value is
    rewritten in place, padded with spaces before it (JSON allows them), so that no length
    header changes; ValueError for more.

    NOTE: HTTP payloads once kept 13 characters for the value, padded after it, so that any
    value fitted: `duetime replay` of a `bench --record` capture, which sends the timeout
    as JSON writes it, was then not the bytes bench sent (found by a tester)."""
    if isinstance(payload, EnginePayload):
        return replace(payload, timeout_s=timeout_us / 1e6)
    if isinstance(payload, GrpcPayload):
        # NOTE: serialised messages concatenate as a merge, and a map key's last entry wins
        extra = pb.ModelInferRequest()
        extra.parameters["timeout"].int64_param = timeout_us
        return GrpcPayload(
            payload.data + extra.SerializeToString(), timeout_us / 1e6 + GRPC_DEADLINE_MARGIN_S
        )
    at = payload.find(_TIMEOUT_KEY)
    value = None if at < 0 else _TIMEOUT_VALUE.match(payload, at + len(_TIMEOUT_KEY))
    if value is None:
        raise ValueError("restamp: the HTTP payload has no timeout parameter")
    start, end = value.span()
    digits = b"%d" % timeout_us
    if len(digits) > end - start:
        raise ValueError(
            f"restamp: {timeout_us} µs is longer than the payload's timeout {value[0].decode()}"
        )
    return b"".join((payload[:start], digits.rjust(end - start), payload[end:]))
