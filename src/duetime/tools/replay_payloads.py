"""Captured requests in wire form for `duetime replay`, and the answers' tensors read back.

Each CapturedRequest becomes a complete HTTP/1.1 v2 request (JSON head plus binary tensors, or
plain JSON for one its client sent as JSON) or a serialised gRPC `ModelInferRequest` with its
metadata, built once before the run. Only standard v2 fields are used: model, version, id,
inputs, requested outputs, parameters, headers. The request's due time travels as the v2
`timeout` parameter (µs): the one its client sent where the capture holds it, else the captured
due time (see `due_timeout_us`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np
import orjson

from duetime.datatypes import NUMPY_OF, is_float, v2_datatype_of
from duetime.frontend import codec
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.tools.capture.format import (
    DROPPED_HEADERS,
    BadField,
    CapturedRequest,
    CapturedTensor,
)
from duetime.tools.payloads import GRPC_DEADLINE_MARGIN_S

_FRAMING_HEADERS = frozenset({
    "content-length", "transfer-encoding", "connection", "keep-alive", "expect", "upgrade",
    "proxy-connection", "content-encoding", "inference-header-content-length", "trailer",
})  # fmt: skip
"""Headers that describe how the recorded message was framed on its connection, not the
request: the replay frames its own message (a second Content-Length would be refused)."""
_OWN_HTTP_HEADERS = DROPPED_HEADERS | _FRAMING_HEADERS | {
    "host", "content-type", "accept-encoding", "te",
}  # fmt: skip
"""Headers the replay writes itself (or must not copy) on HTTP."""
_OWN_GRPC_METADATA = DROPPED_HEADERS | _FRAMING_HEADERS | {
    "host", "content-type", "te", "user-agent", "accept-encoding", "grpc-timeout",
    "grpc-encoding", "grpc-accept-encoding",
}  # fmt: skip
"""Metadata gRPC sets itself (or refuses from an application)."""
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1


class Unsendable(ValueError):
    """A captured value the replay's protocol cannot carry; `load_plan` names the record."""


def due_timeout_us(record: CapturedRequest) -> int | None:
    """The budget the replay gives the request, as the v2 `timeout` parameter (µs), or None
    when it had no due time.

    The client's own `timeout` parameter where the record holds it (a v2 REST body always
    does; a gRPC or in-process request when its client set one), as it was sent; otherwise the
    captured due time from arrival (`due_in_ns`), at least 1 µs, the smallest budget the
    protocol can say: a request already overdue when it arrived replays overdue (the server
    answers 504 as it did), never as one without a due time.

    NOTE: `due_in_ns` is only the fallback because it under-states the client's budget: the
    server counts a `timeout` from receipt, the capture stamps arrival after the body was read
    and parsed, so each record -> replay round would hand the server a tighter due time. A
    gRPC deadline tighter than the request's `timeout` parameter is not recorded apart from
    `due_in_ns`: such a request replays with its `timeout` (and a call deadline beyond it).
    """
    sent = client_timeout_us(record.parameters)
    if sent is not None:
        return sent
    if record.due_in_ns is None:
        return None
    return max(1, math.ceil(record.due_in_ns / 1000))


def client_timeout_us(parameters: Mapping[str, Any]) -> int | None:
    """The `timeout` parameter the client sent, when it sets a due time (a positive integer)."""
    value = parameters.get("timeout")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def request_parameters(record: CapturedRequest) -> dict[str, Any]:
    """The captured parameters, with the due time as `timeout` and the priority if it had one.

    A `timeout` the client sent stays as it was, even one the server refused (the replay asks
    the same, and is refused the same); one is added only where the client set none (absent or
    0) but the request had a due time (a gRPC deadline; an in-process `timeout_s`)."""
    parameters = {k: v for k, v in record.parameters.items() if k != "binary_data_output"}
    sent = parameters.get("timeout")
    if sent is None or (type(sent) is int and sent == 0):
        timeout = due_timeout_us(record)
        if timeout is not None:
            parameters["timeout"] = timeout
    if record.priority and "priority" not in parameters:
        parameters["priority"] = record.priority
    return parameters


# -- HTTP ----------------------------------------------------------------------------------------


def http_request(record: CapturedRequest, host: str, port: int) -> bytes:
    """The whole HTTP/1.1 request (keep-alive): JSON for a request its client sent as JSON
    (see `sent_as_json`), else tensors binary both ways. The JSON has an `id` only where the
    record has one, and `parameters` only where there are some: a request of `duetime bench
    --record` replays as the bytes bench sent (but its due time, where a late send cuts it)."""
    return timed_http_request(record, host, port)[0]


def timed_http_request(record: CapturedRequest, host: str, port: int) -> tuple[bytes, int]:
    """`http_request`, and where in it the digits of its `timeout` parameter start (-1: it
    carries no due time the replay gives it, see `due_timeout_us`), for `retimed_http`."""
    as_json = sent_as_json(record)
    doc: dict[str, Any] = {"inputs": _json_inputs(record) if as_json else _binary_inputs(record)}
    if record.request_id:
        doc["id"] = record.request_id
    parameters = request_parameters(record)
    if as_json:
        if "binary_data_output" in record.parameters:  # (as its client asked)
            parameters["binary_data_output"] = record.parameters["binary_data_output"]
        if record.outputs_wanted is not None:
            doc["outputs"] = _json_outputs(record, {})
    elif record.outputs_wanted is None:
        parameters["binary_data_output"] = True
    else:
        doc["outputs"] = _json_outputs(record, {"binary_data": True})
    if parameters:  # (none: no member, as `duetime bench` sends it; see `http_request`)
        doc["parameters"] = parameters
    try:
        head = orjson.dumps(doc, default=str, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:  # an integer past 64 bits: orjson writes none
        raise Unsendable(_unencodable(parameters, exc)) from None
    model = quote(record.model, safe="")
    path = f"/v2/models/{model}/infer"
    if record.version:
        path = f"/v2/models/{model}/versions/{quote(record.version, safe='')}/infer"
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}"]
    if as_json:
        body = head
        lines += [f"Content-Length: {len(body)}", "Content-Type: application/json"]
    else:
        body = b"".join([head, *(t.data for t in record.inputs)])
        lines += [
            f"Content-Length: {len(body)}",
            "Content-Type: application/octet-stream",
            f"Inference-Header-Content-Length: {len(head)}",
        ]
    lines += [f"{k}: {v}" for k, v in _headers(record.headers, _OWN_HTTP_HEADERS)]
    start = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    at = _timeout_digits(head, due_timeout_us(record))
    return start + body, -1 if at < 0 else len(start) + at


_TIMEOUT_KEY = b'"timeout":'


def _timeout_digits(head: bytes, timeout_us: int | None) -> int:
    """Where the digits of `timeout_us` stand as the `timeout` parameter in the request's JSON
    `head`, or -1. The request's parameters are the JSON's last member and name `timeout` once
    (an output's parameters come before them), and the key cannot be inside a JSON string
    (its quotes would be escaped)."""
    if timeout_us is None:
        return -1
    key = head.rfind(_TIMEOUT_KEY)
    digits = str(timeout_us).encode()
    start = key + len(_TIMEOUT_KEY)
    end = start + len(digits)
    if key < 0 or head[start:end] != digits or head[end : end + 1].isdigit():
        return -1  # (not the due time: a `timeout` its client sent that sets none, as it was)
    return start


def retimed_http(payload: bytes, at: int, timeout_us: int, budget_us: int) -> bytes:
    """`payload` (see `timed_http_request`), whose `timeout` parameter's digits (`timeout_us`)
    start at `at`, carrying `budget_us` (at most `timeout_us`) instead: padded with spaces
    before it (JSON allows them before a value), so that no length in the request changes."""
    width = len(str(timeout_us))
    digits = str(min(budget_us, timeout_us)).encode().rjust(width)
    return b"".join((payload[:at], digits, payload[at + width :]))


def sent_as_json(record: CapturedRequest) -> bool:
    """Whether the capture shows `record` came over HTTP as plain JSON (no binary tensors): the
    server recorded the headers that framed its body (Content-Length or Transfer-Encoding), and
    among them no Inference-Header-Content-Length, which the binary extension cannot do without.

    NOTE: a JSON request was once replayed with the binary extension: not the request that was
    captured (the server's JSON decoding, part of the latency compared, was skipped), and a
    JSON-only v2 server (MLServer) refused every one (60 of 60: 400). Records with no framing
    headers (`duetime bench --record`, a converted JSON Lines file, in-process requests) were
    never an HTTP body: they go binary, the cheaper encoding. The reader decodes the captured
    body and keeps neither it nor how it was framed; were it kept, the replay could send the
    body itself (per-output parameters and all)."""
    if record.protocol != "http":
        return False
    headers = record.headers
    framed = "content-length" in headers or "transfer-encoding" in headers
    return framed and "inference-header-content-length" not in headers


def _json_outputs(record: CapturedRequest, own: dict[str, Any]) -> list[dict[str, Any]]:
    """The outputs the request named, each with the parameters it gave them (`classification`)
    and `own`.

    NOTE: the outputs' parameters were once dropped: a request for an output's top classes
    replayed as one for the whole tensor (other work, another answer)."""
    given = record.output_parameters or {}
    outputs = []
    for name in record.outputs_wanted or ():
        entry: dict[str, Any] = {"name": name}
        if name in given or own:
            entry["parameters"] = {**given.get(name, {}), **own}
        outputs.append(entry)
    return outputs


def _binary_inputs(record: CapturedRequest) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "datatype": t.datatype, "shape": list(t.shape),
         "parameters": {"binary_data_size": len(t.data)}}
        for t in record.inputs
    ]  # fmt: skip


def _json_inputs(record: CapturedRequest) -> list[dict[str, Any]]:
    """The inputs with their values in `data`, as JSON carries them (BYTES as text: a JSON
    request's were)."""
    try:
        return [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape),
             "data": codec.to_json_data(t.array(), t.datatype)}
            for t in record.inputs
        ]  # fmt: skip
    except BadField as exc:
        raise Unsendable(f"input {exc}") from None


def _unencodable(parameters: Mapping[str, Any], exc: Exception) -> str:
    """What keeps the request's JSON from encoding, naming the parameter where one is to blame."""
    for key, value in parameters.items():
        if isinstance(value, int) and not _INT64_MIN <= value <= _UINT64_MAX:
            return f"parameter '{key}': {value} is outside the int64 and uint64 JSON is sent with"
    return f"the request does not encode as JSON: {exc}"


def _headers(headers: Mapping[str, str], skip: frozenset[str]) -> list[tuple[str, str]]:
    """The headers worth sending again: not ours to set, and safe on the wire."""
    kept = []
    for key, value in headers.items():
        name = key.lower()
        if name in skip or name.startswith(":") or not _token(name) or not _safe(value):
            continue
        kept.append((name, value))
    return kept


def _token(name: str) -> bool:
    return bool(name) and all(c.isalnum() or c in "-_." for c in name) and name.isascii()


def _safe(value: str) -> bool:
    return "\r" not in value and "\n" not in value and value.isascii()


def http_outputs(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    """The output tensors of a v2 HTTP response (JSON, or JSON then binary tensors)."""
    head = body if header_length is None else body[:header_length]
    doc = orjson.loads(head)
    outputs: dict[str, np.ndarray] = {}
    offset = len(head)
    view = memoryview(body)
    for entry in doc.get("outputs", []):
        name, datatype = str(entry["name"]), str(entry["datatype"])
        shape = tuple(int(d) for d in entry["shape"])
        size = (entry.get("parameters") or {}).get("binary_data_size")
        if size is None:
            outputs[name] = codec.from_json(entry["data"], datatype, shape, name)
        else:
            outputs[name] = codec.from_raw(view[offset : offset + size], datatype, shape, name)
            offset += int(size)
    return outputs


# -- gRPC ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GrpcRequest:
    """A serialised ModelInferRequest, its metadata, and the call deadline (None: none)."""

    data: bytes
    metadata: tuple[tuple[str, str], ...]
    deadline_s: float | None


def grpc_request(record: CapturedRequest) -> GrpcRequest:
    request = pb.ModelInferRequest(
        model_name=record.model, model_version=record.version or "", id=record.request_id
    )
    for tensor in record.inputs:
        request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        request.raw_input_contents.append(tensor.data)
    given = record.output_parameters or {}
    for name in record.outputs_wanted or ():
        output = request.outputs.add(name=name)
        for key, value in given.get(name, {}).items():  # (see `_json_outputs`)
            _set_parameter(output.parameters[key], f"{name}.{key}", value)
    for key, value in request_parameters(record).items():
        _set_parameter(request.parameters[key], key, value)
    timeout = due_timeout_us(record)
    deadline = None if timeout is None else timeout / 1e6 + GRPC_DEADLINE_MARGIN_S
    metadata = tuple(_headers(record.headers, _OWN_GRPC_METADATA))
    return GrpcRequest(request.SerializeToString(), metadata, deadline)


def retimed_grpc(payload: GrpcRequest, budget_us: int) -> GrpcRequest:
    """`payload` carrying `budget_us` as its `timeout` parameter (and call deadline) instead.

    NOTE: appended, not re-encoded: serialised messages concatenate as a merge, and a map
    key's last entry wins (as `duetime bench` restamps its gRPC payloads)."""
    extra = pb.ModelInferRequest()
    extra.parameters["timeout"].int64_param = budget_us
    return GrpcRequest(
        payload.data + extra.SerializeToString(), payload.metadata,
        budget_us / 1e6 + GRPC_DEADLINE_MARGIN_S,
    )  # fmt: skip


def _set_parameter(parameter: Any, key: str, value: Any) -> None:
    """`value` in the InferParameter field of its type: an integer in `int64_param`, or in
    `uint64_param` past int64 (the v2 priority is a uint64: tritonclient sends it there);
    Unsendable for one neither holds.

    NOTE: every integer once went to `int64_param`: a captured priority of 2**64 - 1 raised
    ValueError there and the replay died with a traceback before sending anything."""
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        if _INT64_MIN <= value <= _INT64_MAX:
            parameter.int64_param = value
        elif 0 <= value <= _UINT64_MAX:
            parameter.uint64_param = value
        else:
            raise Unsendable(
                f"parameter '{key}': {value} is outside the int64 and uint64 a gRPC parameter holds"
            )
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = value if isinstance(value, str) else orjson.dumps(value).decode()


def grpc_outputs(data: bytes) -> dict[str, np.ndarray]:
    """The output tensors of a serialised ModelInferResponse."""
    response = pb.ModelInferResponse.FromString(data)
    outputs: dict[str, np.ndarray] = {}
    raw = response.raw_output_contents
    for index, tensor in enumerate(response.outputs):
        shape = tuple(int(d) for d in tensor.shape)
        if index < len(raw):
            outputs[tensor.name] = codec.from_raw(raw[index], tensor.datatype, shape, tensor.name)
        else:
            outputs[tensor.name] = _from_contents(tensor, shape)
    return outputs


def _from_contents(tensor: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A tensor sent in typed `contents` rather than raw bytes, in its datatype's dtype (the
    fields are wider: INT8 travels in `int_contents`, FP32 in no narrower field than float), so
    that comparing it with a recorded tensor sees the datatype that was answered."""
    contents = tensor.contents
    dtype = NUMPY_OF.get(tensor.datatype)
    for field in ("fp32_contents", "fp64_contents", "int_contents", "int64_contents",
                  "uint_contents", "uint64_contents", "bool_contents"):  # fmt: skip
        values = getattr(contents, field)
        if len(values):
            return np.asarray(list(values), dtype=dtype).reshape(shape)
    if len(contents.bytes_contents):
        return np.asarray(list(contents.bytes_contents), dtype=object).reshape(shape)
    return np.zeros(shape, dtype=dtype)


# -- comparing answers ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Difference:
    """How an answer differs from the recorded one; `max_abs_error` is inf for a missing output,
    a shape change or unequal BYTES."""

    output: str
    max_abs_error: float
    problem: str


def compare_outputs(
    recorded: Sequence[CapturedTensor], answered: Mapping[str, np.ndarray], rtol: float, atol: float
) -> Difference | None:
    """How the answer differs from the recorded outputs (None: it matches them): the first
    output that is missing, of another datatype or shape, or an integer, BOOL or BYTES output
    with another value; else the float output with the largest error.

    A missing output, another datatype or another shape is a difference. Floating point
    outputs (FP16, FP32, FP64, BF16) match within `rtol` and `atol` (`np.isclose` with the recorded
    value as the reference; NaN matches NaN, an infinity the same infinity). Integer, BOOL and
    BYTES outputs must be equal: a class or token id that moved by one is another answer.

    NOTE: integers were once compared as float64 through `np.allclose`, which took 100002 for
    100001 (1 <= 1e-6 + 1e-5 * 100001) and INT64 ids past 2**53, rounded, for their neighbours.
    """
    worst: Difference | None = None
    for tensor in recorded:
        got = answered.get(tensor.name)
        if got is None:
            return Difference(tensor.name, math.inf, "missing from the answer")
        want = tensor.array()
        datatype = _datatype(got)
        if datatype != tensor.datatype:
            return Difference(
                tensor.name, math.inf, f"datatype {datatype}, recorded {tensor.datatype}"
            )
        if got.shape != want.shape:
            return Difference(
                tensor.name, math.inf, f"shape {list(got.shape)}, recorded {list(want.shape)}"
            )
        if not is_float(want.dtype):  # (BF16's dtype is no numpy float: see `is_float`)
            difference = _exact_difference(tensor.name, got, want)
            if difference is not None:
                return difference
            continue
        a, b = got.astype(np.float64), want.astype(np.float64)
        close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        if close.all():
            continue
        errors = np.abs(a[~close] - b[~close])  # NaN where one of them is NaN
        error = math.inf if np.isnan(errors).any() else float(errors.max())
        if worst is None or error > worst.max_abs_error:
            worst = Difference(tensor.name, error, f"max abs error {error:.3g}")
    return worst


def _datatype(array: np.ndarray) -> str:
    try:
        return v2_datatype_of(array)
    except TypeError:
        return f"numpy {array.dtype}"


def _exact_difference(name: str, got: np.ndarray, want: np.ndarray) -> Difference | None:
    """How an integer, BOOL or BYTES output differs from the recorded one (None: equal)."""
    unequal = np.flatnonzero(got != want)  # elementwise on object (BYTES) arrays too
    if not unequal.size:
        return None
    first = int(unequal[0])
    index = [int(i) for i in np.unravel_index(first, want.shape)]
    a, b = _plain(got.ravel()[first]), _plain(want.ravel()[first])
    where = f"{unequal.size} of {want.size} values differ, the first at {index}: {a!r}"
    if want.dtype == object:
        return Difference(name, math.inf, f"BYTES: {where}, recorded {b!r}")
    moved, recorded = got.ravel()[unequal], want.ravel()[unequal]
    if want.dtype.itemsize < 8:  # BOOL and narrower integers: exact in int64
        error = float(np.abs(moved.astype(np.int64) - recorded.astype(np.int64)).max())
    else:  # on Python ints: an int64 difference can overflow, a float64 one rounds
        pairs = zip(moved.tolist(), recorded.tolist(), strict=True)
        error = float(max(abs(x - y) for x, y in pairs))
    return Difference(name, error, f"{where}, recorded {b!r}")


def _plain(value: Any) -> Any:
    """A numpy scalar as its Python value (an object array's `bytes` as they are)."""
    return value.item() if isinstance(value, np.generic) else value
