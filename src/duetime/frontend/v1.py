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
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from duetime.datatypes import BFLOAT16, NUMPY_OF, is_float, v2_datatype_of
from duetime.errors import InvalidInput
from duetime.frontend.codec import JSON_CHUNK, from_nested_json, json_size
from duetime.types import ModelSignature, TensorSpec

FIELDS = ("instances", "inputs")


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
    if isinstance(data, dict):  # columnar: input name -> every example's values
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
    if len(required) == 1 and not isinstance(data[0], dict):
        (spec,) = required
        return {spec.name: _tensor(spec, data if batched else data[0], field)}
    if not all(isinstance(example, dict) for example in data):
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
        if not is_float(NUMPY_OF[spec.datatype]):
            raise
    # NOTE: the KServe client writes its request with orjson, which writes NaN, Infinity and
    # -Infinity as null: an instance [NaN, 1] arrives as [null, 1] (refused as "not FP32") and
    # KServe's servers read it as NaN (numpy casts None to NaN). Read again only on a refusal:
    # the common request pays no walk over its values
    return from_nested_json(_nan_for_null(values, len(spec.shape) + 1), spec.datatype, where, field)


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
    columns = {name: _rows(array, batched) for name, array in outputs.items()}
    if len(columns) == 1:
        (rows,) = columns.values()
        return orjson.dumps({"predictions": rows}, option=orjson.OPT_SERIALIZE_NUMPY)
    count = min((len(rows) for rows in columns.values()), default=0)
    examples = [{name: rows[i] for name, rows in columns.items()} for i in range(count)]
    return orjson.dumps({"predictions": examples}, option=orjson.OPT_SERIALIZE_NUMPY)


def v1_json_size(outputs: dict[str, np.ndarray]) -> dict[str, int]:
    """About how many bytes of JSON each output takes in a V1 answer (`codec.json_size`: each
    number at its longest), before any is encoded."""
    return {name: json_size(array, v2_datatype_of(array)) for name, array in outputs.items()}


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


def _rows(array: np.ndarray, batched: bool) -> list[Any]:
    """One entry per example (a model that does not batch answers one example)."""
    if array.dtype == object:
        array = np.vectorize(_text, otypes=[object])(array) if array.size else array
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
