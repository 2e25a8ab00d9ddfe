"""KServe's V1 protocol (the TensorFlow Serving style JSON that KServe's `InferenceRESTClient`
speaks by default): `GET /` (liveness), `GET /v1/models`, `GET /v1/models/<m>` (readiness) and
`POST /v1/models/<m>:predict`.

A predict request carries `instances`, a list with one entry per example: the example's tensor
for a model with one input, or an object of input name -> tensor for several (optional inputs
may be left out); or `inputs` in the same row format, or as one object of input name -> all
examples' values (columnar); not both, and no name that is not an input (as TensorFlow Serving,
whose REST API the V1 protocol is, refuses them). Examples are
stacked on the batch dimension of a model that batches; a model that does not takes exactly one.
The answer is `{"predictions": [...]}`, one entry per example: the output's tensor for a model
with one output, else an object of output name -> tensor. Values are checked as the v2 JSON
path checks them (datatype, range, ragged lists), with the field named in the error.

JSON has no NaN or infinity: a V1 answer writes them as null, as KServe's own V1 server does,
and a float input reads null as NaN (what the KServe client sends for a NaN or infinity).

JSON has no bytes either: as TensorFlow Serving does, a BYTES input's element may come as
`{"b64": "<base64>"}` (binary data: image bytes, a serialized example), read as the bytes it
encodes, and a BYTES output whose name ends in `_bytes` is answered so, each element
`{"b64": "<base64>"}`. Such an object for an input of another datatype is refused.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import numpy as np
import orjson

from duetime.datatypes import BFLOAT16, NUMPY_OF, is_float, v2_datatype_of
from duetime.errors import InvalidInput
from duetime.execution.ort import MAX_DIMS
from duetime.frontend.codec import JSON_CHUNK, bytes_elements, from_nested_json, json_size
from duetime.types import ModelSignature, TensorSpec

FIELDS = ("instances", "inputs")

B64 = "b64"
"""The key of TensorFlow Serving's form of binary data in JSON: `{"b64": "<base64>"}`."""
BYTES_SUFFIX = "_bytes"
"""A BYTES output whose name ends so is answered as binary data (`{"b64": ...}` elements), as
TensorFlow Serving answers a string tensor so named (its `kBytesTensorNameSuffix`)."""


def v1_inputs(doc: Any, signature: ModelSignature, model: str) -> dict[str, np.ndarray]:
    """The model's input tensors from a V1 predict request's JSON document."""
    if not isinstance(doc, dict):
        raise InvalidInput("predict request: expected a JSON object with 'instances'")
    given = [name for name in FIELDS if name in doc]
    if not given:
        raise InvalidInput(
            "predict request: expected 'instances' (a list with one entry per example) or 'inputs'"
        )
    if len(given) > 1:
        # NOTE: 'instances' was read and 'inputs' ignored; KServe's own server reads 'inputs'
        # instead, and TensorFlow Serving refuses the two together
        raise InvalidInput(
            "predict request: has both 'instances' and 'inputs'; send the examples in one of them"
        )
    (field,) = given
    data = doc[field]
    specs = signature.inputs
    required = signature.required_inputs
    batched = signature.max_batch_size > 0
    if _is_object(data):  # columnar: input name -> every example's values
        _only_inputs(data, signature, model, field, "the request")
        return {
            spec.name: _tensor(spec, _named(data, spec, field, "the request"), field)
            for spec in specs
            if not spec.optional or spec.name in data
        }
    if not isinstance(data, list) or not data:
        raise InvalidInput(f"predict request: '{field}' must be a non-empty list of examples")
    if not batched and len(data) != 1:
        raise InvalidInput(
            f"predict request: model '{model}' does not batch (max_batch_size 0); send one "
            f"example in '{field}', got {len(data)}"
        )
    if len(required) == 1 and not _is_object(data[0]):
        (spec,) = required
        return {spec.name: _tensor(spec, data if batched else data[0], field)}
    if not all(_is_object(example) for example in data):
        names = ", ".join(f"'{spec.name}'" for spec in required)
        raise InvalidInput(
            f"predict request: model '{model}' takes {len(required)} inputs ({names}); each "
            f"entry of '{field}' must be an object of input name -> value"
        )
    for i, example in enumerate(data):
        _only_inputs(example, signature, model, field, f"example {i}")
    tensors = {}
    for spec in specs:
        if spec.optional and not any(spec.name in example for example in data):
            continue  # (given by some examples only: `_named` names one without it)
        values = [_named(example, spec, field, f"example {i}") for i, example in enumerate(data)]
        tensors[spec.name] = _tensor(spec, values if batched else values[0], field)
    return tensors


def _is_b64(value: Any) -> bool:
    """Whether `value` is binary data as TensorFlow Serving writes it in JSON: an object with
    one key, "b64", whose value is a string (its `IsValBase64Object`)."""
    return type(value) is dict and len(value) == 1 and type(value.get(B64)) is str


def _is_object(value: Any) -> bool:
    """Whether `value` is an object of input name -> value (not binary data: `_is_b64`).

    NOTE: as TensorFlow Serving tells them apart: an instance `{"b64": "..."}` of a model with
    one BYTES input is that input's value, not an object naming an input 'b64'."""
    return isinstance(value, dict) and not _is_b64(value)


def _only_inputs(
    values: dict[str, Any], signature: ModelSignature, model: str, field: str, where: str
) -> None:
    """InvalidInput if `values` names something the model does not take (it was ignored: an
    optional input misspelt went unsent, unheard of)."""
    names = {spec.name for spec in signature.inputs}
    stray = next((name for name in values if name not in names), None)
    if stray is not None:
        inputs = ", ".join(f"'{spec.name}'" for spec in signature.inputs)
        raise InvalidInput(
            f"predict request: '{field}': {where} has '{stray}', which is not an input of model "
            f"'{model}' (its inputs: {inputs})"
        )


def _named(values: dict[str, Any], spec: TensorSpec, field: str, where: str) -> Any:
    if spec.name not in values:
        raise InvalidInput(
            f"predict request: '{field}': {where} has no input '{spec.name}' ({spec.describe()})"
        )
    return values[spec.name]


def _tensor(spec: TensorSpec, values: Any, field: str) -> np.ndarray:
    where = f"input '{spec.name}'"
    try:
        return from_nested_json(values, spec.datatype, where, field)
    except InvalidInput:
        # (read again only on a refusal, as below: the common request pays no walk)
        depth = len(spec.shape) + 1
        if spec.datatype == "BYTES":
            decoded = _with_b64(values, where, field)
            if decoded is None:
                raise
            return decoded
        if _has_b64(values, depth):
            # NOTE: TensorFlow Serving refuses binary data for any tensor but a string one
            raise InvalidInput(
                f"{where}: '{field}' holds {{\"b64\": ...}} (binary data), which only a BYTES "
                f"input takes; {spec.datatype} takes numbers"
            ) from None
        if not is_float(NUMPY_OF[spec.datatype]):
            raise
    # NOTE: the KServe client writes its request with orjson, which writes NaN, Infinity and
    # -Infinity as null: an instance [NaN, 1] arrives as [null, 1] (refused as "not FP32") and
    # KServe's servers read it as NaN (numpy casts None to NaN). Read again only on a refusal:
    # the common request pays no walk over its values
    return from_nested_json(_nan_for_null(values, len(spec.shape) + 1), spec.datatype, where, field)


def _with_b64(values: Any, where: str, field: str) -> np.ndarray | None:
    """The BYTES tensor of `values` where elements are binary data, `{"b64": "<base64>"}`,
    each read as the bytes it encodes; None where none is (the refusal of `values` stands).
    Shape and the other elements are checked as any BYTES input's.

    NOTE: TensorFlow Serving's REST API (which KServe's V1 protocol is) sends binary values so,
    the only way JSON carries bytes that are not UTF-8 text; they were refused "element 0 must
    be a string" (found by a tester)."""
    flat: list[bytes] = []
    found = False

    def read(value: Any, depth: int) -> Any:
        nonlocal found
        if isinstance(value, list) and depth:
            return [read(item, depth - 1) for item in value]
        if _is_b64(value):
            found = True
            flat.append(_decoded(value[B64], where, field, len(flat)))
            return ""  # (a string in its place, for the checks of shape and the others)
        if isinstance(value, dict):
            raise InvalidInput(
                f"{where}: BYTES '{field}' element {len(flat)} is an object that is not binary "
                'data: send a string, or {"b64": "<base64>"} (one key, a string)'
            )
        try:
            flat.append(value.encode() if isinstance(value, str) else b"")
        except UnicodeEncodeError:  # (a lone surrogate: refused below, in the usual words)
            flat.append(b"")
        return value

    stand_ins = read(values, MAX_DIMS + 1)  # (lists deeper than any tensor: refused below)
    if not found:
        return None
    shape = from_nested_json(stand_ins, "BYTES", where, field).shape  # (checks all the others)
    # (CHECKED_TEXT: all UTF-8, as an ONNX string tensor takes them; else the run refuses the
    # element that is not, as it refuses one of a v2 binary request's)
    return bytes_elements(flat).reshape(shape)


def _decoded(text: str, where: str, field: str, index: int) -> bytes:
    """The bytes of the base64 `text` (standard alphabet; its `=` padding may be left out)."""
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(
            f"{where}: BYTES '{field}' element {index}: its \"b64\" is not valid base64"
        ) from None


def _has_b64(values: Any, depth: int) -> bool:
    """Whether binary data (`_is_b64`) is among `values`, down to `depth` levels of lists."""
    if isinstance(values, list) and depth:
        return any(_has_b64(item, depth - 1) for item in values)
    return _is_b64(values)


def _nan_for_null(values: Any, depth: int) -> Any:
    """`values` with each null (None) down to `depth` levels of lists read as NaN."""
    if values is None:
        return math.nan
    if depth and isinstance(values, list):
        return [_nan_for_null(value, depth - 1) for value in values]
    return values


def v1_predictions(outputs: dict[str, np.ndarray], batched: bool) -> bytes:
    """`{"predictions": [...]}`: per example, the only output's value or an object of them.
    Big tensors are encoded `JSON_CHUNK` values per call (see `_json_of`): a thread building a
    big answer gives the GIL back between pieces, so the event loop runs on.

    NOTE: orjson writes NaN and ±inf as null, and so must this: KServe's V1 server answers with
    orjson (ORJSONResponse) and its client reads with orjson, which refuses the NaN/Infinity
    tokens the v2 path writes (as Triton does): `{"predictions":[Infinity]}` failed the KServe
    client's `infer` with JSONDecodeError. Triton has no V1 protocol to follow."""
    if len(outputs) == 1:
        (array,) = outputs.values()
        if array.dtype != object:
            # (the only output's examples are its rows: the array is the predictions list)
            array = _numeric(array)
            if array.ndim == 0:
                predictions = b"[" + orjson.dumps(array.item()) + b"]"
            elif batched:
                predictions = _json_of(array)
            else:
                predictions = b"[" + _json_of(array) + b"]"
            return b'{"predictions":' + predictions + b"}"
    columns = {name: _rows(array, batched, name) for name, array in outputs.items()}
    if len(columns) == 1:
        (rows,) = columns.values()
        return orjson.dumps({"predictions": rows}, option=orjson.OPT_SERIALIZE_NUMPY)
    count = min((len(rows) for rows in columns.values()), default=0)
    examples = [{name: rows[i] for name, rows in columns.items()} for i in range(count)]
    return orjson.dumps({"predictions": examples}, option=orjson.OPT_SERIALIZE_NUMPY)


def v1_json_size(outputs: dict[str, np.ndarray]) -> dict[str, int]:
    """About how many bytes of JSON each output takes in a V1 answer (`codec.json_size`: each
    number at its longest; binary data, `_b64`, as written), before any is encoded."""
    return {
        name: _b64_size(array) if _binary(name, array) else json_size(array, v2_datatype_of(array))
        for name, array in outputs.items()
    }


def _binary(name: str, array: np.ndarray) -> bool:
    """Whether output `name` is answered as binary data (see `BYTES_SUFFIX`)."""
    return array.dtype == object and name.endswith(BYTES_SUFFIX)


def _b64_size(array: np.ndarray) -> int:
    """The bytes of JSON `_b64` writes for `array`'s elements, a comma after each."""
    lengths = (len(_raw(item)) for item in array.reshape(-1).tolist())
    return sum(4 * ((length + 2) // 3) + len('{"b64":""},') for length in lengths)


def _numeric(array: np.ndarray) -> np.ndarray:
    """A numeric output as orjson encodes it: C-contiguous, integers of a plain scalar type,
    BF16 as the doubles its values are (orjson writes no ml_dtypes array)."""
    if array.dtype == BFLOAT16:
        return array.astype(np.float64)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if array.dtype.kind in "iu":
        # NOTE: ONNX Runtime gives int64 outputs as numpy's `longlong` (the same bits, another
        # scalar type), whose scalars orjson refuses: every scikit-learn or XGBoost classifier's
        # 1-D `label` answered 500 "Type is not JSON serializable: numpy.longlong"
        array = array.view(np.dtype(array.dtype.str))
    return array


def _json_of(array: np.ndarray) -> bytes:
    """`array` (numeric, at least 1-D, from `_numeric`) as nested JSON lists, its rows encoded
    in blocks of about `JSON_CHUNK` values, a row bigger than that row by row in turn."""
    if array.size <= JSON_CHUNK:
        return orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY)
    inner = math.prod(array.shape[1:])  # (values per row)
    if inner > JSON_CHUNK:
        pieces = [_json_of(row) for row in array]
    else:
        step = JSON_CHUNK // max(inner, 1)
        pieces = [
            orjson.dumps(array[start : start + step], option=orjson.OPT_SERIALIZE_NUMPY)[1:-1]
            for start in range(0, len(array), step)
        ]
    return b"[" + b",".join(pieces) + b"]"


def _rows(array: np.ndarray, batched: bool, name: str) -> list[Any]:
    """One entry per example (a model that does not batch answers one example)."""
    if array.dtype == object:
        each = _b64 if _binary(name, array) else _text
        array = np.vectorize(each, otypes=[object])(array) if array.size else array
        values = array.tolist()
        return values if batched and array.ndim else [values]
    array = _numeric(array)
    if array.ndim == 0:
        return [array.item()]
    if not batched:
        return [orjson.Fragment(_json_of(array))]
    if math.prod(array.shape[1:]) > JSON_CHUNK:
        return [orjson.Fragment(_json_of(row)) for row in array]
    return list(array)


def _text(item: Any) -> str:
    return item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)


def _b64(item: Any) -> dict[str, str]:
    """A BYTES element as binary data: `{"b64": "<base64>"}` (see `BYTES_SUFFIX`).

    NOTE: as TensorFlow Serving answers a string output whose name ends in `_bytes` (its
    `IsNamedTensorBytes`): bytes that are not UTF-8 come back whole. Other BYTES outputs are
    written as text, as before (bytes that are not UTF-8 as U+FFFD), as TF Serving writes them
    (and KServe's V1 server, which has no binary form)."""
    return {B64: base64.b64encode(_raw(item)).decode("ascii")}


def _raw(item: Any) -> bytes:
    if isinstance(item, bytes | bytearray | memoryview):
        return bytes(item)
    return str(item).encode("utf-8", "replace")
