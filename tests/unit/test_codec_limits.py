"""The codec's limits agree with what it serves and says.

- `json_size` counts a BYTES element as the JSON answer writes it: 30,000 bytes 0x01 were
  counted 30,000 bytes where the answer wrote 180,000 (each `\\u0001`), so
  `--max-json-answer-bytes` 100,000 let a 360,000-byte answer through.
- A `data` nested too deep is refused naming the input, as every other `data` refusal is.
- A request's shape may have as many dims as numpy's arrays (64): it was 16, and a model with
  a rank-17 input loaded READY but refused every request; a model past 64 is refused at load.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.config import parse_model_config
from duetime.errors import ConfigError, InvalidInput
from duetime.frontend import codec
from duetime.repository.loader import reconcile
from duetime.types import TensorSpec

WHERE = "input 'x'"


def _objects(items: list[Any]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def _written(array: np.ndarray) -> int:
    """The bytes the answer's JSON gives `array`'s values, less its brackets, with a comma
    after each (as `json_size` counts)."""
    written = len(orjson.dumps(codec.to_json_data(array, "BYTES")))
    return written - 1 if len(array) else 0


@pytest.mark.parametrize(
    "items",
    [
        [b"\x01" * 30_000],
        [b'"\\' * 100, b"\n\t\x1f" * 50],
        ["\u00e9\u2603".encode() * 100, b"\xff\xfe" * 100, b"\xe2\x82" * 10],
        ["text", "\u00e9"],
        [b""] * 10,
    ],
    ids=["controls", "quotes", "not-utf8", "str", "empty"],
)
def test_json_size_counts_bytes_as_written(items: list[Any]) -> None:
    array = _objects(items)
    assert codec.json_size(array, "BYTES") >= _written(array)


def test_json_size_of_controls_is_not_six_times_over() -> None:
    """An upper bound, but a close one: \\u0001 is 6 bytes, counted 6."""
    array = _objects([b"\x01" * 30_000])
    assert codec.json_size(array, "BYTES") <= _written(array) + 8


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=12), max_size=8))
def test_json_size_is_never_short(items: list[bytes]) -> None:
    array = _objects(items)
    assert codec.json_size(array, "BYTES") >= _written(array)


@pytest.mark.parametrize("datatype", ["FP32", "INT32", "BYTES", "BOOL"])
def test_data_nested_too_deep_names_the_input(datatype: str) -> None:
    value: Any = "a" if datatype == "BYTES" else 1
    data: Any = value
    for _ in range(50):
        data = [data]
    with pytest.raises(InvalidInput, match=r"^input 'x': 'data' is nested deeper"):
        codec.from_json(data, datatype, (1, 1), WHERE)


def test_data_nested_deep_elsewhere_names_the_input() -> None:
    """(past the first values: read by `_flatten`)"""
    deep: Any = 1
    for _ in range(70):
        deep = [deep]
    with pytest.raises(InvalidInput, match=r"^input 'x': 'data'"):
        codec.from_json([1, deep], "FP32", (2,), WHERE)


@pytest.mark.parametrize("rank", [17, 32, 64])
def test_a_shape_of_many_dims_is_read(rank: int) -> None:
    shape = codec.parse_shape([1] * rank, WHERE)
    data: Any = 3.0
    for _ in range(rank):
        data = [data]
    for given_data in ([3.0], data):
        array = codec.from_json(given_data, "FP32", shape, WHERE)
        assert array.shape == (1,) * rank


def test_a_shape_past_numpy_is_refused() -> None:
    with pytest.raises(InvalidInput, match="input 'x': 'shape' must be a list of at most 64"):
        codec.parse_shape([1] * 65, WHERE)


@pytest.mark.parametrize("kind", ["input", "output"])
def test_a_model_past_the_protocol_rank_is_refused_at_load(kind: str) -> None:
    config = parse_model_config({"max_batch_size": 0}, source="c")
    wide = TensorSpec("w", "FP32", (1,) * 65)
    small = TensorSpec("s", "FP32", (1,))
    inputs, outputs = ([wide], [small]) if kind == "input" else ([small], [wide])
    with pytest.raises(ConfigError, match=f"m: {kind} 'w' has 65 dims; .* at most 64"):
        reconcile(config, inputs, outputs, source="m")


def test_a_model_of_rank_64_loads() -> None:
    config = parse_model_config({"max_batch_size": 0}, source="c")
    spec = TensorSpec("x", "FP32", (1,) * 64)
    signature = reconcile(config, [spec], [TensorSpec("y", "FP32", (1,) * 64)], source="m")
    assert signature.inputs[0].shape == (1,) * 64
