"""Unit tests for `duetime.validation.Validator` against hand-made model signatures."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from duetime.errors import InvalidInput
from duetime.types import ModelSignature, TensorSpec
from duetime.validation import Validator

BATCHED = ModelSignature(
    inputs=(TensorSpec("x", "FP32", (-1, 4)), TensorSpec("ids", "INT64", (-1, -1))),
    outputs=(TensorSpec("y", "FP32", (-1, 2)), TensorSpec("z", "FP32", (-1,))),
    max_batch_size=8,
)
TEXT = ModelSignature(
    inputs=(TensorSpec("text", "BYTES", (-1,)),),
    outputs=(TensorSpec("label", "BYTES", (-1,)),),
    max_batch_size=4,
)
FIXED = ModelSignature(
    inputs=(TensorSpec("x", "FP32", (3, 4)),),
    outputs=(TensorSpec("y", "FP32", (3, 2)),),
    max_batch_size=0,
)


def inputs(rows: int = 2, cols: int = 3, **overrides: Any) -> dict[str, Any]:
    """Valid inputs for BATCHED with `rows` rows; keyword arguments replace or drop (None) one."""
    feeds: dict[str, Any] = {
        "x": np.zeros((rows, 4), dtype=np.float32),
        "ids": np.zeros((rows, cols), dtype=np.int64),
    }
    for name, value in overrides.items():
        if value is None:
            del feeds[name]
        else:
            feeds[name] = value
    return feeds


def test_valid_request() -> None:
    prepared = Validator("m", BATCHED).prepare(inputs(rows=3), None)
    assert prepared.rows == 3
    assert set(prepared.feeds) == {"x", "ids"}
    assert prepared.outputs == ("y", "z")
    assert prepared.shape_key == (("x", (4,)), ("ids", (3,)))


def test_feeds_are_the_request_arrays_when_already_contiguous() -> None:
    feeds = inputs()
    prepared = Validator("m", BATCHED).prepare(feeds, None)
    assert prepared.feeds["x"] is feeds["x"]


@pytest.mark.parametrize(
    ("feeds", "match"),
    [
        pytest.param(
            inputs(ids=None),
            r"input 'ids' \(INT64\[-1, -1\]\) is missing; model 'm' expects 'x' FP32\[-1, 4\]",
            id="missing",
        ),
        pytest.param(
            inputs(extra=np.zeros((2, 4), np.float32)),
            "input 'extra' is not an input of model 'm'; it expects 'x' FP32",
            id="unexpected",
        ),
        pytest.param(
            inputs(x=np.zeros((2, 4), np.float64)),
            "input 'x': datatype FP64 does not match the model's FP32",
            id="wrong-dtype",
        ),
        pytest.param(
            inputs(ids=np.zeros((2, 3), np.int32)),
            "input 'ids': datatype INT32 does not match the model's INT64",
            id="wrong-int-width",
        ),
        pytest.param(
            inputs(x=np.zeros((2, 4), np.complex64)),
            "input 'x': datatype complex64 does not match",
            id="dtype-without-v2-name",
        ),
        pytest.param(
            inputs(x=np.zeros((2, 4, 1), np.float32)),
            r"unexpected shape for input 'x' for model 'm'\. Expected \[-1,4\], got \[2,4,1\]",
            id="wrong-rank",
        ),
        pytest.param(
            inputs(x=np.zeros((2, 5), np.float32)),
            r"unexpected shape for input 'x' for model 'm'\. Expected \[-1,4\], got \[2,5\]",
            id="wrong-dim",
        ),
        pytest.param(
            inputs(x=[[0.0] * 4] * 2),
            "input 'x': expected a numpy array",
            id="not-an-array",
        ),
        pytest.param(
            inputs(rows=9),
            "inference request batch-size must be <= 8 for 'm': input 'x' has 9 rows; split the "
            "request",
            id="batch-over-max",
        ),
        pytest.param(
            inputs(rows=0),
            "inference request batch-size must be >= 1 for 'm': input 'x' has 0 rows",
            id="batch-zero",
        ),
        pytest.param(
            inputs(ids=np.zeros((3, 3), np.int64)),
            "input 'ids': batch size 3 differs from the other inputs' 2",
            id="mismatched-batch",
        ),
    ],
)
def test_invalid_inputs(feeds: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        Validator("m", BATCHED).prepare(feeds, None)


def test_batch_at_max_is_accepted() -> None:
    assert Validator("m", BATCHED).prepare(inputs(rows=8), None).rows == 8


@pytest.mark.parametrize(
    ("requested", "expected"),
    [(None, ("y", "z")), (["z"], ("z",)), (("z", "y"), ("z", "y"))],
)
def test_requested_outputs(requested: Any, expected: tuple[str, ...]) -> None:
    assert Validator("m", BATCHED).prepare(inputs(), requested).outputs == expected


def test_unknown_output() -> None:
    with pytest.raises(
        InvalidInput,
        match="requested output 'w' is not an output of model 'm'; its outputs are 'y', 'z'",
    ):
        Validator("m", BATCHED).prepare(inputs(), ["y", "w"])


@pytest.mark.parametrize(
    "array",
    [
        pytest.param(np.array([b"caf\xc3\xa9", b""], dtype=object), id="object-bytes"),
        pytest.param(np.array([b"caf\xc3\xa9", b""]), id="numpy-S"),
        pytest.param(np.array(["café", ""]), id="numpy-U"),
        pytest.param(np.array(["café", ""], dtype=object), id="object-str"),
    ],
)
def test_bytes_inputs_become_str_for_ort(array: np.ndarray) -> None:
    prepared = Validator("t", TEXT).prepare({"text": array}, None)
    fed = prepared.feeds["text"]
    assert fed.dtype == object
    assert fed.tolist() == ["café", ""]
    assert all(type(item) is str for item in fed.tolist())
    assert prepared.shape_key == (("text", ()),)


def test_bytes_input_must_be_utf8() -> None:
    text = np.array([b"ok", b"\xff\xfe"], dtype=object)
    with pytest.raises(InvalidInput, match="input 'text': BYTES element 1 is not valid UTF-8"):
        Validator("t", TEXT).prepare({"text": text}, None)


def test_numeric_array_for_bytes_input_is_rejected() -> None:
    with pytest.raises(
        InvalidInput, match="input 'text': datatype INT32 does not match the model's BYTES"
    ):
        Validator("t", TEXT).prepare({"text": np.zeros(2, np.int32)}, None)


def test_non_contiguous_input_is_made_contiguous() -> None:
    base = np.arange(32, dtype=np.float32).reshape(2, 16)
    x = base[:, ::4]
    assert not x.flags.c_contiguous
    prepared = Validator("m", BATCHED).prepare(inputs(x=x), None)
    assert prepared.feeds["x"].flags.c_contiguous
    assert np.array_equal(prepared.feeds["x"], x)


def test_non_native_byte_order_is_accepted_and_made_native() -> None:
    x = np.arange(8, dtype=">f4").reshape(2, 4)
    prepared = Validator("m", BATCHED).prepare(inputs(x=x), None)
    assert prepared.feeds["x"].dtype == np.float32
    assert prepared.feeds["x"].dtype.isnative
    assert np.array_equal(prepared.feeds["x"], x)


def test_shape_key_is_equal_for_same_inner_dims() -> None:
    validator = Validator("m", BATCHED)
    one = validator.prepare(inputs(rows=1, cols=5), None)
    many = validator.prepare(inputs(rows=7, cols=5), None)
    other = validator.prepare(inputs(rows=1, cols=6), None)
    assert one.shape_key == many.shape_key
    assert one.shape_key != other.shape_key
    assert hash(one.shape_key) == hash(many.shape_key)


def test_non_batched_model() -> None:
    validator = Validator("f", FIXED)
    prepared = validator.prepare({"x": np.zeros((3, 4), np.float32)}, None)
    assert prepared.rows == 1
    assert prepared.shape_key == ()
    with pytest.raises(
        InvalidInput,
        match=r"unexpected shape for input 'x' for model 'f'\. Expected \[3,4\], got \[1,3,4\]",
    ):
        validator.prepare({"x": np.zeros((1, 3, 4), np.float32)}, None)


def test_non_batched_model_with_a_free_first_dim_takes_any_size() -> None:
    signature = ModelSignature(
        inputs=(TensorSpec("x", "FP32", (-1, 4)),),
        outputs=(TensorSpec("y", "FP32", (-1, 2)),),
        max_batch_size=0,
    )
    validator = Validator("f", signature)
    for rows in (0, 1, 100):
        prepared = validator.prepare({"x": np.zeros((rows, 4), np.float32)}, None)
        assert prepared.rows == 1
        assert prepared.shape_key == ()


# -- templates: requests decoded from one header ---------------------------------------------------


def test_a_template_that_passed_skips_the_checks_and_keeps_its_answer() -> None:
    validator, template = Validator("m", BATCHED), object()
    first = validator.prepare(inputs(rows=3), ["y"], template)
    feeds = inputs(rows=3)
    again = validator.prepare(feeds, ["y"], template)
    assert (again.rows, again.shape_key, again.outputs) == (3, first.shape_key, ("y",))
    assert all(again.feeds[name] is array for name, array in feeds.items())
    assert validator.prepare(inputs(rows=2), None).rows == 2  # without one: checked in full


def test_a_template_that_failed_or_needed_converting_is_checked_every_time() -> None:
    validator, template = Validator("m", BATCHED), object()
    for _ in range(2):
        with pytest.raises(InvalidInput, match="batch-size must be <= 8"):
            validator.prepare(inputs(rows=9), None, template)
    text = Validator("t", TEXT)
    for _ in range(2):  # BYTES become str for ORT: feeds are not the request's arrays
        prepared = text.prepare({"text": np.array([b"a"], dtype=object)}, None, template)
        assert prepared.feeds["text"].tolist() == ["a"]
