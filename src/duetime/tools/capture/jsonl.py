"""Hand-written traffic as JSON Lines, converted to a capture (`duetime capture convert`).

One JSON object per line (blank lines and lines starting with `#` are skipped):

    {"t_ms": 12.5, "model": "mlp", "version": "1", "timeout_us": 20000,
     "inputs": {"x": {"datatype": "FP32", "shape": [1, 40], "data": [0.1, ...]}}}

Fields: `t_ms` (arrival, ms from the start; required), `model` (required), `inputs` (required:
name -> {datatype, shape, and `data` as a flat or nested list, or `data_b64` as base64 of the raw
little-endian bytes}), and optionally `version`, `id`, `timeout_us` (due time after arrival),
`priority`, `outputs` (names), `parameters` (an object), `headers` (an object of strings),
`protocol` (`http`, the default, `grpc`, `grpc-stream` or `engine`). Records get status 0: no
outcome was observed.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from duetime.errors import InvalidInput
from duetime.frontend import codec
from duetime.tools.capture.format import PROTOCOLS, CapturedRequest, CapturedTensor, tensor_data
from duetime.tools.capture.writer import CaptureWriter

FIELDS = frozenset({
    "t_ms", "model", "inputs", "version", "id", "timeout_us", "priority", "outputs",
    "parameters", "headers", "protocol",
})  # fmt: skip
MAX_INT64 = (1 << 63) - 1
MAX_T_MS = MAX_INT64 / 1e6 / 2
"""The latest arrival a record can hold: its nanoseconds fit the format's int64 (with room to
spare for the latency added to it)."""
MAX_TIMEOUT_US = MAX_INT64 / 1e3 / 2
"""The longest due time a record can hold, in nanoseconds as an int64 (likewise)."""
NO_OUTCOME = 0
"""The status of a record that was written by hand, not observed."""


class JsonlError(ValueError):
    """A line of a JSON Lines traffic file that cannot be converted: names the line and field."""


def convert(source: str | Path, target: str | Path, *, overwrite: bool = False) -> int:
    """Write the requests of the JSON Lines file `source` to a new capture `target`; returns
    how many. Raises JsonlError (nothing is left at `target` then)."""
    source = Path(source)
    target = Path(target)
    meta = {"source": "duetime capture convert", "from": str(source)}
    count = 0
    with CaptureWriter(target, meta=meta, overwrite=overwrite) as writer:
        try:
            for record in parse_lines(source):
                writer.write(record)
                count += 1
        except BaseException:
            writer.close()
            target.unlink(missing_ok=True)
            raise
    return count


def parse_lines(path: Path) -> Iterator[CapturedRequest]:
    """The requests of a JSON Lines traffic file, one per non-blank line."""
    with path.open("rb") as file:
        for number, line in enumerate(file, start=1):
            text = line.strip()
            if not text or text.startswith(b"#"):
                continue
            where = f"{path}:{number}"
            try:
                doc = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                raise JsonlError(f"{where}: not valid JSON: {exc}") from None
            yield parse_request(doc, where)


def parse_request(doc: Any, where: str) -> CapturedRequest:
    """One JSON Lines object as a CapturedRequest; JsonlError names `where` and the field."""
    if not isinstance(doc, dict):
        raise JsonlError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - FIELDS)
    if unknown:
        raise JsonlError(
            f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(FIELDS))}"
        )
    t_ms = _number(doc, "t_ms", where, required=True)
    assert t_ms is not None
    if not 0 <= t_ms <= MAX_T_MS:
        raise JsonlError(f"{where}: field 't_ms' must be from 0 to {MAX_T_MS:g}, got {t_ms}")
    timeout_us = _number(doc, "timeout_us", where)
    if timeout_us is not None and not 0 < timeout_us <= MAX_TIMEOUT_US:
        raise JsonlError(
            f"{where}: field 'timeout_us' must be > 0 and <= {MAX_TIMEOUT_US:g}, got {timeout_us}"
        )
    priority = doc.get("priority", 0)
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not 0 <= priority <= MAX_INT64
    ):
        raise JsonlError(f"{where}: field 'priority' must be an integer from 0 to {MAX_INT64}")
    outputs = doc.get("outputs")
    if outputs is not None and (
        not isinstance(outputs, list) or not all(isinstance(o, str) and o for o in outputs)
    ):
        raise JsonlError(f"{where}: field 'outputs' must be a list of output names")
    headers = _object(doc, "headers", where)
    if not all(isinstance(v, str) for v in headers.values()):
        raise JsonlError(f"{where}: field 'headers' must map names to strings")
    protocol = _text(doc, "protocol", where) or "http"
    if protocol not in PROTOCOLS:
        # NOTE: any string was written into the capture ("gprc", a typo, found by a tester)
        raise JsonlError(
            f"{where}: field 'protocol' must be one of {', '.join(PROTOCOLS)}, got {protocol!r}"
        )
    return CapturedRequest(
        arrival_ns=round(t_ms * 1e6), protocol=protocol,
        model=_text(doc, "model", where, required=True) or "",
        version=_version(doc.get("version"), where), request_id=_text(doc, "id", where) or "",
        inputs=_inputs(doc.get("inputs"), where), outputs_wanted=None if outputs is None
        else tuple(outputs), parameters=_object(doc, "parameters", where),
        due_in_ns=None if timeout_us is None else round(timeout_us * 1e3), priority=priority,
        headers={k.lower(): v for k, v in headers.items()}, trace_id=None, status=NO_OUTCOME,
        error=None, latency_ns=0, answered_version=None, variant=None, outputs=None,
    )  # fmt: skip


def _number(doc: dict[str, Any], name: str, where: str, required: bool = False) -> float | None:
    value = doc.get(name)
    if value is None:
        if required:
            raise JsonlError(f"{where}: field '{name}' is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise JsonlError(f"{where}: field '{name}' must be a number, got {value!r}")
    return float(value)


def _text(doc: dict[str, Any], name: str, where: str, required: bool = False) -> str | None:
    value = doc.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        state = "is missing" if value is None else f"must be a non-empty string, got {value!r}"
        raise JsonlError(f"{where}: field '{name}' {state}")
    return value


def _version(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return value
    raise JsonlError(f"{where}: field 'version' must be a version number, got {value!r}")


def _object(doc: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise JsonlError(f"{where}: field '{name}' must be a JSON object")
    return value


def _inputs(value: Any, where: str) -> list[CapturedTensor]:
    if not isinstance(value, dict) or not value:
        raise JsonlError(
            f"{where}: field 'inputs' must be an object of tensors, e.g. "
            '{"x": {"datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}}'
        )
    return [_tensor(name, spec, f"{where}: inputs.{name}") for name, spec in value.items()]


def _tensor(name: str, spec: Any, where: str) -> CapturedTensor:
    if not isinstance(spec, dict):
        raise JsonlError(f"{where}: expected an object with datatype, shape and data")
    extra = sorted(set(spec) - {"datatype", "shape", "data", "data_b64"})
    if extra:
        raise JsonlError(f"{where}: unknown field(s) {', '.join(extra)}")
    try:
        datatype = codec.check_datatype(spec.get("datatype"), where)
        shape = codec.parse_shape(spec.get("shape"), where)
        if ("data" in spec) == ("data_b64" in spec):
            raise JsonlError(f"{where}: give one of 'data' (a list) and 'data_b64' (base64)")
        if "data" in spec:
            array = codec.from_json(spec["data"], datatype, shape, where)
        else:
            raw = _base64(spec["data_b64"], where)
            array = codec.from_raw(raw, datatype, shape, f"{where} 'data_b64'")
    except InvalidInput as exc:
        raise JsonlError(exc.message) from None
    datatype, data = tensor_data(array)
    return CapturedTensor(name, datatype, shape, data)


def _base64(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise JsonlError(f"{where}: 'data_b64' must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise JsonlError(f"{where}: 'data_b64' is not valid base64: {exc}") from None
