"""The capture file format: constants, the record type, and encoding / decoding of one record.

A capture is a file header, then length-prefixed records appended one after another; see
`docs/capture-format.md` for the byte layout. Encoding takes plain values and buffers (numpy
arrays or bytes), so the server's recorder and `CaptureWriter` produce the same bytes. A record
is either encoded field by field (`encode_record`) or, for a v2 REST request, holds the HTTP
body as it came (`encode_http_record`); both decode to the same `CapturedRequest`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import orjson

from duetime import classification
from duetime.datatypes import WIRE_DTYPE_OF, v2_datatype_of
from duetime.errors import DuetimeError, InvalidInput
from duetime.frontend.codec import from_raw, to_raw
from duetime.frontend.rest import parse_infer_request

MAGIC: Final = b"DUETCAP\n"
"""The first 8 bytes of every capture file."""
FORMAT_VERSION: Final = 2
"""Bumped on any change an older reader could misread (2: raw HTTP records, flag RAW_HTTP)."""
READABLE_VERSIONS: Final = (1, 2)
"""The format versions this reader reads (a version-1 file is a version-2 file without
RAW_HTTP records)."""

FILE_HEAD: Final = struct.Struct("<8sHHqII")
"""magic, format version, reserved (0), capture start wall time (ns since the Unix epoch),
length of the header JSON, CRC32 of the header JSON; the JSON follows."""
RECORD_PREFIX: Final = struct.Struct("<II")
"""Before each record's body: its length in bytes, and the CRC32 of the body."""
RECORD_FIXED: Final = struct.Struct("<qqqqHHHHI")
"""The start of a record body: arrival_ns, due_in_ns, latency_ns, priority, status, flags,
number of input tensors, number of output tensors, length of the meta JSON."""
MAX_RECORD_BYTES: Final = 1 << 31
"""Bodies longer than this are taken as corruption of the length prefix."""
META_FIELDS: Final = (
    "protocol", "model", "version", "request_id", "trace_id", "answered_version", "variant",
    "error", "parameters", "headers", "outputs_wanted", "input_names", "output_names",
)  # fmt: skip
"""The meta JSON is an array of these, in this order, then OPTIONAL_META_FIELDS."""
PROTOCOLS: Final = ("http", "grpc", "grpc-stream", "engine")
"""What a record's `protocol` may be (`CapturedRequest.protocol`)."""
OPTIONAL_META_FIELDS: Final = ("output_parameters",)
"""Written after META_FIELDS only when the record has them (a reader takes their absence as
None): `output_parameters`, an object of each output's parameters the server acted on.

NOTE: optional rather than a new format version: a record without them (all but requests for
classified outputs) reads with any version-2 reader as before; one with them is refused by an
older reader (skipped by one that skips), never misread."""
HTTP_META_FIELDS: Final = (
    "model", "version", "trace_id", "answered_version", "variant", "error", "headers",
    "header_length", "output_names",
)  # fmt: skip
"""The meta JSON of a RAW_HTTP record: the request id, parameters, outputs wanted and inputs are
in the body that follows."""

# flags
HAS_DUE: Final = 1
HAS_OUTPUTS: Final = 2
RAW_HTTP: Final = 4
"""The record ends with a v2 REST body, verbatim (format version 2)."""
KNOWN_FLAGS: Final = {1: HAS_DUE | HAS_OUTPUTS, 2: HAS_DUE | HAS_OUTPUTS | RAW_HTTP}
"""The flags each format version may set."""

DATATYPES: Final = (
    "BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
    "FP16", "FP32", "FP64", "BYTES", "BF16",
)  # fmt: skip
"""A tensor's datatype is stored as its index in this tuple (one byte): new datatypes are
appended, so that a code keeps its meaning in every file.

NOTE: BF16 (13) was missing: a BF16 model's requests could not be recorded (`bench --record`
died after its run with KeyError: 'BF16', `capture convert` too, and `serve --record` dropped
every gRPC one; found by a tester). Added without a new format version: a reader that predates
it refuses such a record as an unknown datatype code (skips it, see `CaptureReader`), never
misreads it, and reads every other record as before."""
_CODE_OF: Final = {name: code for code, name in enumerate(DATATYPES)}
_MAX_DIMS: Final = 32
_TENSOR_HEADS: dict[int, struct.Struct] = {}

DROPPED_HEADERS: Final = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"}
)
"""Headers never written: credentials (and every one `is_credential` names)."""
CREDENTIAL_WORDS: Final = (
    "auth", "token", "secret", "key", "passw", "session", "cookie", "credential", "signature",
)  # fmt: skip
"""A header whose name holds one of these is taken as a credential: never written, nor read.

NOTE: the five names above were all that was left out: x-auth-token, api-key, x-goog-api-key,
ocp-apim-subscription-key and x-amz-security-token were written in clear and re-sent by
`duetime replay` to whatever target it was given (a tester's report). A rule on the name, not a
list, since services name their keys as they please; it leaves out some that are no secret
(idempotency-key; a sticky key header so named: send it as a parameter to keep it)."""
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(slots=True)
class CapturedTensor:
    """One tensor of a captured request: raw little-endian bytes in row-major order. BYTES
    tensors use the v2 binary layout: per element a 4-byte little-endian length, then its bytes."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes

    def array(self) -> np.ndarray:
        """The tensor as a numpy array (a read-only view of `data`; BYTES: an object array of
        `bytes`)."""
        try:
            return from_raw(self.data, self.datatype, self.shape, f"tensor '{self.name}'")
        except InvalidInput as exc:
            raise BadField(exc.message) from None

    @classmethod
    def of(cls, name: str, array: np.ndarray) -> CapturedTensor:
        """The tensor holding `array`'s values (object / str arrays become BYTES)."""
        datatype, data = tensor_data(array)
        return cls(name, datatype, tuple(array.shape), data)


@dataclass(slots=True)
class CapturedRequest:
    """One request seen by the server and how it ended. Times are nanoseconds on the monotonic
    clock: `arrival_ns` from the capture's start, `due_in_ns` and `latency_ns` from arrival."""

    arrival_ns: int
    protocol: str
    """`http`, `grpc`, `grpc-stream` or `engine` (in-process)."""
    model: str
    version: str | None
    """The version the request named (None: the traffic policy chose)."""
    request_id: str
    inputs: list[CapturedTensor]
    outputs_wanted: tuple[str, ...] | None
    """The outputs the request named (None: all)."""
    parameters: dict[str, Any]
    due_in_ns: int | None
    """The due time the request brought, from its arrival (None: none; the model's default
    timeout, if any, is not recorded here)."""
    priority: int
    headers: dict[str, str]
    """HTTP headers or gRPC metadata, lower-case keys, without credentials (`is_credential`)."""
    trace_id: str | None
    status: int
    """HTTP-style outcome: 200, or the error's status (400, 404, 429, 503, 504, 500 ...); 499
    when the client cancelled it."""
    error: str | None
    latency_ns: int
    """From arrival to the answer (or error) on the server's event loop."""
    answered_version: str | None
    variant: str | None
    outputs: list[CapturedTensor] | None
    """The answer's tensors when the capture records outputs (None: not recorded)."""
    output_parameters: dict[str, dict[str, Any]] | None = None
    """The parameters the request gave its outputs that change its answer, by output name:
    today `classification` (the class count; Triton's classification extension). Shared memory
    regions are left out (a replay cannot use them). None: none (or a capture written before
    they were recorded)."""


class CaptureFormatError(Exception):
    """A capture file that cannot be read: says which record (index from 0, None for the file
    header), at which byte offset, and what was wrong."""

    def __init__(self, path: str, index: int | None, offset: int, problem: str) -> None:
        where = "file header" if index is None else f"record {index}"
        super().__init__(f"{path}: {where} at byte offset {offset}: {problem}")
        self.path = path
        self.index = index
        self.offset = offset
        self.problem = problem


class CaptureTruncated(CaptureFormatError):
    """The file ends inside a record: a capture still being written, or one whose writer died."""


class BadField(ValueError):
    """A record body that does not decode; the reader adds where it is."""


# -- encoding ------------------------------------------------------------------------------------


def is_credential(name: str) -> bool:
    """Whether a header (or gRPC metadata) name looks like it carries a credential (see
    CREDENTIAL_WORDS)."""
    name = name.lower()
    return name in DROPPED_HEADERS or any(word in name for word in CREDENTIAL_WORDS)


_NOT_CREDENTIALS: set[str] = set()
"""Header names seen that `is_credential` let through (NOTE: a set test of a request's names,
0.5 µs, instead of nine substring tests a name on the capture thread), up to 4096 of them."""


def without_credentials(headers: Mapping[str, str]) -> Mapping[str, str]:
    """`headers` without those `is_credential` names (the same mapping when it has none)."""
    if _NOT_CREDENTIALS.issuperset(headers):
        return headers
    kept = {}
    for name, value in headers.items():
        if not is_credential(name):
            kept[name] = value
            if len(_NOT_CREDENTIALS) < 4096:
                _NOT_CREDENTIALS.add(name)
    return kept


def tensor_data(array: np.ndarray) -> tuple[str, bytes]:
    """The v2 datatype of `array` and its raw bytes: little-endian, row-major."""
    try:
        datatype = v2_datatype_of(array)
    except TypeError as exc:
        raise BadField(str(exc)) from None
    return datatype, to_raw(array, datatype)


def tensors_of(arrays: Mapping[str, np.ndarray]) -> list[Tensor]:
    """`encode_record`'s tensors for arrays by name (see `tensor_data`)."""
    tensors = []
    for name, array in arrays.items():
        datatype, data = tensor_data(array)
        tensors.append((name, datatype, array.shape, data))
    return tensors


Tensor = tuple[str, str, tuple[int, ...], bytes]
"""A tensor to encode: name, v2 datatype, shape, raw little-endian bytes (see CapturedTensor)."""


def _tensor_head(ndim: int) -> struct.Struct:
    if ndim > _MAX_DIMS:
        raise BadField(f"a tensor has {ndim} dims, over {_MAX_DIMS}")
    head = _TENSOR_HEADS[ndim] = struct.Struct(f"<BBQ{ndim}q")
    return head


def encode_record(
    arrival_ns: int,
    protocol: str,
    model: str,
    version: str | None,
    request_id: str,
    inputs: Sequence[Tensor],
    outputs_wanted: Sequence[str] | None,
    parameters: Mapping[str, Any],
    due_in_ns: int | None,
    priority: int,
    headers: Mapping[str, str],
    trace_id: str | None,
    status: int,
    error: str | None,
    latency_ns: int,
    answered_version: str | None,
    variant: str | None,
    outputs: Sequence[Tensor] | None,
    output_parameters: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[bytes, bytes]:
    """One record: its prefix (length, CRC32) and its body. Credential headers (`is_credential`)
    are left out. Raises BadField for a value the format cannot hold.

    NOTE: the server's capture thread runs this for every request, competing with the event
    loop for the GIL, so it is written for few bytecodes rather than for looks: the strings go
    in one orjson call (meta), the numbers in one struct."""
    if headers:
        headers = without_credentials(headers)
    fields: tuple[Any, ...] = (
        protocol, model, version, request_id, trace_id, answered_version, variant, error,
        parameters, headers, outputs_wanted, [t[0] for t in inputs],
        None if outputs is None else [t[0] for t in outputs],
    )  # fmt: skip
    if output_parameters:
        fields += (output_parameters,)
    try:
        try:
            meta = orjson.dumps(fields)  # without `default=`: it costs 0.25 µs even unused
        except orjson.JSONEncodeError:  # a parameter JSON has no type for: as its str()
            meta = orjson.dumps(fields, default=str)
        fixed = RECORD_FIXED.pack(
            arrival_ns, due_in_ns or 0, latency_ns,
            priority if _INT64_MIN <= priority <= _INT64_MAX else _clamp(priority), status,
            (due_in_ns is not None) | (outputs is not None) << 1, len(inputs),
            0 if outputs is None else len(outputs), len(meta),
        )  # fmt: skip
    except (struct.error, orjson.JSONEncodeError) as exc:
        raise BadField(f"a field cannot be encoded: {exc}") from None
    parts = [fixed, meta]
    heads = _TENSOR_HEADS
    try:
        for _, datatype, shape, data in inputs if outputs is None else (*inputs, *outputs):
            ndim = len(shape)
            head = heads.get(ndim) or _tensor_head(ndim)
            parts += (head.pack(_CODE_OF[datatype], ndim, len(data), *shape), data)
    except KeyError:
        raise _no_code(datatype) from None
    body = b"".join(parts)
    return RECORD_PREFIX.pack(len(body), zlib.crc32(body)), body


def encode_http_record(
    arrival_ns: int,
    model: str,
    version: str | None,
    body: bytes,
    header_length: int | None,
    due_in_ns: int | None,
    priority: int,
    headers: Mapping[str, str],
    trace_id: str | None,
    status: int,
    error: str | None,
    latency_ns: int,
    answered_version: str | None,
    variant: str | None,
    outputs: Sequence[Tensor] | None,
) -> list[bytes]:
    """One RAW_HTTP record: a v2 REST request kept as its `body` (JSON, or a JSON header of
    `header_length` bytes then binary tensors), as the pieces to write one after another:
    prefix, fixed part and meta, output tensors, body. `model` and `version` are the URL's;
    the rest of the request is decoded from the body when the record is read. Credential
    headers (`is_credential`) are left out. Raises BadField for a value the format cannot hold.

    NOTE: the cheapest record for the server's capture thread: no tensor is looked at, the
    body is not copied until the batch's one `join` (its CRC32 is chained over the pieces),
    and orjson gets no `default=` (0.25 µs a call even unused; every field here is JSON)."""
    if headers:
        headers = without_credentials(headers)
    try:
        meta = orjson.dumps(
            (
                model, version, trace_id, answered_version, variant, error, headers,
                header_length, None if outputs is None else [t[0] for t in outputs],
            )
        )  # fmt: skip
        head = RECORD_FIXED.pack(
            arrival_ns, due_in_ns or 0, latency_ns,
            priority if _INT64_MIN <= priority <= _INT64_MAX else _clamp(priority), status,
            RAW_HTTP | (due_in_ns is not None) | (outputs is not None) << 1, 0,
            0 if outputs is None else len(outputs), len(meta),
        ) + meta  # fmt: skip
    except (struct.error, orjson.JSONEncodeError) as exc:
        raise BadField(f"a field cannot be encoded: {exc}") from None
    if outputs is None:  # the common case, unrolled
        crc = zlib.crc32(body, zlib.crc32(head))
        return [RECORD_PREFIX.pack(len(head) + len(body), crc), head, body]
    parts = [b"", head]
    try:
        for _, datatype, shape, data in outputs:
            ndim = len(shape)
            tensor_head = _TENSOR_HEADS.get(ndim) or _tensor_head(ndim)
            parts += (tensor_head.pack(_CODE_OF[datatype], ndim, len(data), *shape), data)
    except KeyError:
        raise _no_code(datatype) from None
    parts.append(body)
    crc = length = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
        length += len(part)
    parts[0] = RECORD_PREFIX.pack(length, crc)
    return parts


def _no_code(datatype: str) -> BadField:
    """The error for a tensor whose datatype has no code in DATATYPES (a KeyError once, which
    ended `bench --record` in a traceback)."""
    return BadField(
        f"datatype {datatype!r} has no code in the capture format (it holds {', '.join(DATATYPES)})"
    )


def _clamp(value: int) -> int:
    return min(max(value, _INT64_MIN), _INT64_MAX)


def encode_captured(record: CapturedRequest) -> tuple[bytes, bytes]:
    """`encode_record` of a CapturedRequest."""
    return encode_record(
        arrival_ns=record.arrival_ns, protocol=record.protocol, model=record.model,
        version=record.version, request_id=record.request_id,
        inputs=[(t.name, t.datatype, t.shape, t.data) for t in record.inputs],
        outputs_wanted=record.outputs_wanted, parameters=record.parameters,
        due_in_ns=record.due_in_ns, priority=record.priority, headers=record.headers,
        trace_id=record.trace_id, status=record.status, error=record.error,
        latency_ns=record.latency_ns, answered_version=record.answered_version,
        variant=record.variant,
        outputs=None if record.outputs is None
        else [(t.name, t.datatype, t.shape, t.data) for t in record.outputs],
        output_parameters=record.output_parameters,
    )  # fmt: skip


def output_parameters_of(classes: Mapping[str, int] | None) -> dict[str, dict[str, Any]] | None:
    """A request's `output_parameters` from its classified outputs (`InferRequest.classes`)."""
    if not classes:
        return None
    return {name: {classification.PARAMETER: count} for name, count in classes.items()}


def encode_file_head(start_wall_ns: int, header: Mapping[str, Any]) -> bytes:
    """The file header: fixed part, then `header` as JSON."""
    text = orjson.dumps(header, default=str)
    return (
        FILE_HEAD.pack(MAGIC, FORMAT_VERSION, 0, start_wall_ns, len(text), zlib.crc32(text)) + text
    )


# -- decoding ------------------------------------------------------------------------------------


def decode_record(body: bytes, format_version: int = FORMAT_VERSION) -> CapturedRequest:
    """The CapturedRequest in one record body (its CRC already checked) of a file in format
    `format_version`; BadField if it does not decode."""
    if len(body) < RECORD_FIXED.size:
        raise BadField(
            f"body of {len(body)} bytes is shorter than the {RECORD_FIXED.size}-byte fixed part"
        )
    arrival, due_in, latency, priority, status, flags, n_inputs, n_outputs, meta_length = (
        RECORD_FIXED.unpack_from(body)
    )
    if arrival < 0:
        # NOTE: read as it was, one record of -1,000 s (a hand-edited file, its CRC right) was
        # shown at -1000000 ms, and a replay scheduled the next request 1,000 s after it (found
        # by a tester); no writer writes an arrival before the capture's start
        raise BadField(
            f"arrival_ns {arrival} is negative: a request cannot arrive before the capture's start"
        )
    if flags & ~KNOWN_FLAGS[format_version]:
        raise BadField(f"unknown flags {flags:#x}")
    start = RECORD_FIXED.size
    if start + meta_length > len(body):
        raise BadField(f"meta ({meta_length} bytes) runs past the end of the record")
    if flags & RAW_HTTP:
        return _decode_http(body, start + meta_length, n_inputs, n_outputs, flags)
    meta = _Meta(body[start : start + meta_length], META_FIELDS, OPTIONAL_META_FIELDS)
    protocol, model = meta.text("protocol"), meta.text("model")
    version, request_id = meta.text("version", True), meta.text("request_id")
    trace_id, answered = meta.text("trace_id", True), meta.text("answered_version", True)
    variant, error = meta.text("variant", True), meta.text("error", True)
    parameters, headers = meta.object("parameters"), meta.headers()
    wanted = meta.names("outputs_wanted", None, True)
    input_names = meta.names("input_names", n_inputs)
    output_names = meta.names("output_names", n_outputs, not flags & HAS_OUTPUTS)
    output_parameters = meta.output_parameters()
    cursor = _Cursor(body, start + meta_length)
    inputs = [cursor.tensor(name) for name in input_names or ()]
    outputs = [cursor.tensor(name) for name in output_names or ()]
    if cursor.offset != len(body):
        raise BadField(f"{len(body) - cursor.offset} bytes left over after the last tensor")
    return CapturedRequest(
        arrival_ns=arrival, protocol=protocol or "", model=model or "", version=version,
        request_id=request_id or "", inputs=inputs, outputs_wanted=wanted,
        parameters=parameters, due_in_ns=due_in if flags & HAS_DUE else None,
        priority=priority, headers=headers, trace_id=trace_id, status=status, error=error,
        latency_ns=latency, answered_version=answered, variant=variant,
        outputs=outputs if flags & HAS_OUTPUTS else None, output_parameters=output_parameters,
    )  # fmt: skip


def _decode_http(
    body: bytes, meta_end: int, n_inputs: int, n_outputs: int, flags: int
) -> CapturedRequest:
    """A RAW_HTTP record: the fixed part's fields, the meta, output tensors, then the v2 REST
    body, decoded by the server's own parser."""
    arrival, due_in, latency, priority, status, *_ = RECORD_FIXED.unpack_from(body)
    if n_inputs:
        raise BadField(f"a raw HTTP record counts {n_inputs} input tensors (must be 0)")
    meta = _Meta(body[RECORD_FIXED.size : meta_end], HTTP_META_FIELDS)
    model, version = meta.text("model"), meta.text("version", True)
    trace_id, answered = meta.text("trace_id", True), meta.text("answered_version", True)
    variant, error, headers = meta.text("variant", True), meta.text("error", True), meta.headers()
    output_names = meta.names("output_names", n_outputs, not flags & HAS_OUTPUTS)
    cursor = _Cursor(body, meta_end)
    outputs = [cursor.tensor(name) for name in output_names or ()]
    wire = body[cursor.offset :]
    header_length = meta.values["header_length"]
    if header_length is not None and (
        type(header_length) is not int or not 0 <= header_length <= len(wire)
    ):
        raise BadField(
            f"meta 'header_length' {header_length!r} is not a length within the "
            f"{len(wire)}-byte HTTP body"
        )
    try:
        request, _ = parse_infer_request(wire, header_length, model or "", version)
    except DuetimeError as exc:
        raise BadField(f"the HTTP body does not decode: {exc.message}") from None
    return CapturedRequest(
        arrival_ns=arrival, protocol="http", model=model or "", version=version,
        request_id=request.id,
        inputs=[CapturedTensor.of(name, array) for name, array in request.inputs.items()],
        outputs_wanted=request.outputs, parameters=dict(request.parameters),
        due_in_ns=due_in if flags & HAS_DUE else None, priority=priority, headers=headers,
        trace_id=trace_id, status=status, error=error, latency_ns=latency,
        answered_version=answered, variant=variant,
        outputs=outputs if flags & HAS_OUTPUTS else None,
        output_parameters=output_parameters_of(request.classes),
    )  # fmt: skip


class _Meta:
    """A meta JSON array of `fields`, then as many of `optional` as it holds (the others None),
    checked field by field; BadField names the field that is wrong."""

    __slots__ = ("values",)

    def __init__(
        self, text: bytes, fields: tuple[str, ...], optional: tuple[str, ...] = ()
    ) -> None:
        try:
            values = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise BadField(f"meta is not valid JSON: {exc}") from None
        if not isinstance(values, list) or not (
            len(fields) <= len(values) <= len(fields) + len(optional)
        ):
            if optional:
                raise BadField(
                    f"meta is not an array of the {len(fields)} fields (and up to "
                    f"{len(optional)} more)"
                )
            raise BadField(f"meta is not an array of the {len(fields)} fields")
        self.values = dict.fromkeys(optional)
        self.values.update(zip(fields + optional, values, strict=False))

    def text(self, name: str, nullable: bool = False) -> str | None:
        value = self.values[name]
        if isinstance(value, str) or (nullable and value is None):
            return value
        raise BadField(f"meta '{name}' is not a string: {value!r}")

    def object(self, name: str) -> dict[str, Any]:
        value = self.values[name]
        if not isinstance(value, dict):
            raise BadField(f"meta '{name}' is not an object")
        return value

    def headers(self) -> dict[str, str]:
        """The headers, without credentials: a capture written before `is_credential` left
        them out holds some, which a replay would send on."""
        headers = self.object("headers")
        if not all(isinstance(v, str) for v in headers.values()):
            raise BadField("meta 'headers' holds a value that is not a string")
        return {k: v for k, v in headers.items() if not is_credential(k)}

    def output_parameters(self) -> dict[str, dict[str, Any]] | None:
        value = self.values["output_parameters"]
        if value is None:
            return None
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            raise BadField("meta 'output_parameters' is not an object of objects")
        return value

    def names(self, name: str, count: int | None, nullable: bool = False) -> tuple[str, ...] | None:
        value = self.values[name]
        if value is None and nullable:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise BadField(f"meta '{name}' is not a list of names")
        if count is not None and len(value) != count:
            raise BadField(f"meta '{name}' names {len(value)} tensors, the record holds {count}")
        return tuple(value)


class _Cursor:
    """Reads tensors off a record body in order."""

    __slots__ = ("body", "offset")

    def __init__(self, body: bytes, offset: int) -> None:
        self.body = body
        self.offset = offset

    def take(self, count: int, what: str) -> bytes:
        end = self.offset + count
        if end > len(self.body):
            raise BadField(f"{what} ({count} bytes) runs past the end of the record")
        data = self.body[self.offset : end]
        self.offset = end
        return data

    def tensor(self, name: str) -> CapturedTensor:
        if self.offset + 2 > len(self.body):
            raise BadField(f"tensor '{name}': its header runs past the end of the record")
        ndim = self.body[self.offset + 1]
        head = _TENSOR_HEADS.get(ndim) or _tensor_head(ndim)
        code, _, nbytes, *shape = head.unpack(self.take(head.size, f"tensor '{name}' header"))
        if code >= len(DATATYPES):
            raise BadField(f"tensor '{name}': unknown datatype code {code}")
        if any(dim < 0 for dim in shape):
            raise BadField(f"tensor '{name}': negative dimension in shape {shape}")
        datatype = DATATYPES[code]
        data = self.take(nbytes, f"tensor '{name}' data")
        if datatype != "BYTES":
            expected = WIRE_DTYPE_OF[datatype].itemsize * int(np.prod(shape, dtype=np.int64))
            if expected != nbytes:
                raise BadField(
                    f"tensor '{name}': {nbytes} bytes do not make {datatype}{shape} "
                    f"({expected} bytes)"
                )
        return CapturedTensor(name, datatype, tuple(shape), data)
