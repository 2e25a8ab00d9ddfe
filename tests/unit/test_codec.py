"""Unit tests for `duetime.frontend.codec`: wire tensors <-> numpy arrays."""

from __future__ import annotations

import math
import struct
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from duetime.datatypes import BFLOAT16, NUMPY_OF, is_float
from duetime.errors import InvalidInput
from duetime.frontend import codec
from duetime.frontend.rest import parse_infer_request

WHERE = "input 'x'"
FIXED = [name for name in NUMPY_OF if name != "BYTES"]
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)


def _length_prefixed(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def _raises_invalid(match: str | None = None) -> Any:
    """`pytest.raises(InvalidInput)` whose message must name the input (and match `match`)."""
    return pytest.raises(InvalidInput, match=match or "input 'x'")


def _all_finite(array: np.ndarray) -> bool:
    """Whether every value of `array` is finite.

    NOTE: a BF16 signaling NaN (bits hypothesis draws) raises the invalid flag as it is widened
    to test it: numpy's RuntimeWarning, an error here, failed the run that drew one."""
    with np.errstate(invalid="ignore"):
        return bool(np.isfinite(array).all())


def _fixed_arrays(datatype: str, *, finite: bool = False) -> st.SearchStrategy[np.ndarray]:
    dtype = NUMPY_OF[datatype]
    if dtype == BFLOAT16:  # (hypothesis draws no ml_dtypes array: bits, viewed)
        viewed = hnp.arrays(np.uint16, SHAPES).map(lambda bits: bits.view(BFLOAT16))
        return viewed.filter(_all_finite) if finite else viewed
    elements = None
    if dtype.kind == "f" and finite:
        elements = hnp.from_dtype(dtype, allow_nan=False, allow_infinity=False)
    return hnp.arrays(dtype, SHAPES, elements=elements)


@st.composite
def _bytes_arrays(draw: st.DrawFn) -> np.ndarray:
    shape = draw(SHAPES)
    items = draw(
        st.lists(st.binary(max_size=12), min_size=math.prod(shape), max_size=math.prod(shape))
    )
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


# -- raw (binary extension / gRPC raw contents) ------------------------------------------------


@pytest.mark.parametrize("datatype", FIXED)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_raw_round_trip_fixed_size(datatype: str, data: st.DataObject) -> None:
    array = data.draw(_fixed_arrays(datatype))
    raw = codec.to_raw(array, datatype)
    assert len(raw) == array.size * NUMPY_OF[datatype].itemsize
    back = codec.from_raw(raw, datatype, array.shape, WHERE)
    assert back.dtype == NUMPY_OF[datatype]
    assert back.shape == array.shape
    with np.errstate(invalid="ignore"):  # (a signaling NaN: see `_all_finite`)
        assert np.array_equal(back, array, equal_nan=is_float(back.dtype))
    assert codec.to_raw(back, datatype) == raw


@settings(max_examples=60, deadline=None)
@given(array=_bytes_arrays())
def test_raw_round_trip_bytes(array: np.ndarray) -> None:
    raw = codec.to_raw(array, "BYTES")
    back = codec.from_raw(raw, "BYTES", array.shape, WHERE)
    assert back.dtype == object
    assert back.shape == array.shape
    assert back.reshape(-1).tolist() == array.reshape(-1).tolist()


def test_to_raw_is_little_endian_and_casts_to_the_wire_type() -> None:
    assert codec.to_raw(np.array([1, 2], dtype=">i4"), "INT32") == b"\x01\0\0\0\x02\0\0\0"
    assert codec.to_raw(np.array([1.5, 2.0], dtype=np.float64), "FP32") == struct.pack(
        "<2f", 1.5, 2
    )


def test_to_raw_of_a_non_contiguous_array() -> None:
    array = np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2]
    assert codec.to_raw(array, "INT16") == np.ascontiguousarray(array).astype("<i2").tobytes()


def test_to_raw_bytes_encodes_text_as_utf8() -> None:
    array = np.array(["é", "ab"], dtype=object)
    assert codec.to_raw(array, "BYTES") == _length_prefixed("é".encode(), b"ab")


def _aligned_bytes(data: bytes, skip: int = 0) -> memoryview:
    """`data` in a new buffer, after `skip` bytes at a multiple of `codec.ALIGNMENT`."""
    buffer = codec.aligned_empty(skip + len(data))
    buffer[skip:] = np.frombuffer(data, np.uint8)
    return buffer.data


@pytest.mark.parametrize("datatype", FIXED)
def test_from_raw_is_zero_copy_where_the_bytes_are_aligned(datatype: str) -> None:
    dtype = NUMPY_OF[datatype]
    buffer = _aligned_bytes(np.ones(6, dtype=dtype.newbyteorder("<")).tobytes())
    array = codec.from_raw(buffer, datatype, (2, 3), WHERE)
    assert np.shares_memory(array, np.frombuffer(buffer, dtype=np.uint8))


@pytest.mark.parametrize("datatype", FIXED)
@pytest.mark.parametrize("source", [bytes, bytearray])
def test_from_raw_copies_misaligned_bytes_to_an_aligned_address(
    datatype: str, source: type
) -> None:
    dtype = NUMPY_OF[datatype]
    data = np.ones(6, dtype=dtype.newbyteorder("<")).tobytes()
    buffer = memoryview(source(b"\0" + data))[1:]  # (numpy's and Python's: at a multiple of 16)
    array = codec.from_raw(buffer, datatype, (2, 3), WHERE)
    assert array.ctypes.data % codec.ALIGNMENT == 0
    assert array.tobytes() == data


def test_from_raw_view_into_a_larger_body_is_zero_copy_where_aligned() -> None:
    body = _aligned_bytes(b"HEADER" + np.arange(4, dtype="<f4").tobytes() + b"tail", 58)
    view = body[64:80]
    array = codec.from_raw(view, "FP32", (4,), WHERE)
    assert array.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert np.shares_memory(array, np.frombuffer(body, dtype=np.uint8))


@pytest.mark.parametrize("datatype", FIXED)
@pytest.mark.parametrize("delta", [-1, 1])
def test_from_raw_wrong_byte_count(datatype: str, delta: int) -> None:
    size = NUMPY_OF[datatype].itemsize
    with _raises_invalid(rf"input 'x': {6 * size + delta} bytes .* needs {6 * size} bytes"):
        codec.from_raw(b"\0" * (6 * size + delta), datatype, (2, 3), WHERE)


def test_from_raw_empty_tensor() -> None:
    array = codec.from_raw(b"", "FP32", (0, 3), WHERE)
    assert array.shape == (0, 3)
    with _raises_invalid():
        codec.from_raw(b"\0" * 4, "FP32", (0, 3), WHERE)


def test_from_raw_scalar_shape() -> None:
    assert codec.from_raw(struct.pack("<i", 7), "INT32", (), WHERE).item() == 7


@pytest.mark.parametrize("value", [2, 255, 0x80])
def test_from_raw_bool_rejects_bytes_other_than_0_and_1(value: int) -> None:
    with _raises_invalid("input 'x': BOOL data must be bytes 0 or 1"):
        codec.from_raw(bytes([0, 1, value]), "BOOL", (3,), WHERE)


def test_from_raw_bool_accepts_0_and_1() -> None:
    assert codec.from_raw(b"\0\x01\x01", "BOOL", (3,), WHERE).tolist() == [False, True, True]


@pytest.mark.parametrize(
    ("buffer", "shape", "match"),
    [
        pytest.param(b"", (1,), "0 bytes of BYTES data cannot hold 1 elements", id="empty"),
        pytest.param(b"\x01\0\0", (1,), "3 bytes of BYTES data cannot hold 1", id="short-length"),
        pytest.param(
            _length_prefixed(b"ab") + b"\x01\0",
            (2,),
            "ends inside element 1 of 2",
            id="second-length-cut",
        ),
        pytest.param(
            b"\x05\0\0\0abc", (1,), "element 0 claims 5 bytes past the end", id="overlong"
        ),
        pytest.param(
            b"\xff\xff\xff\xff", (1,), "element 0 claims 4294967295 bytes", id="huge-length"
        ),
        pytest.param(
            _length_prefixed(b"ab") + b"z", (1,), "1 bytes left over after 1 BYTES", id="leftover"
        ),
        pytest.param(_length_prefixed(b"ab", b"c"), (1,), "5 bytes left over", id="extra-element"),
        pytest.param(b"\0\0\0\0", (0,), "4 bytes left over after 0 BYTES", id="data-for-empty"),
    ],
)
def test_from_raw_bytes_length_prefix_errors(
    buffer: bytes, shape: tuple[int, ...], match: str
) -> None:
    with _raises_invalid(f"input 'x'.*{match}"):
        codec.from_raw(buffer, "BYTES", shape, WHERE)


def test_from_raw_bytes_accepts_empty_elements_and_reshapes() -> None:
    array = codec.from_raw(_length_prefixed(b"", b"a", b"bc", b""), "BYTES", (2, 2), WHERE)
    assert array.tolist() == [[b"", b"a"], [b"bc", b""]]


# -- JSON ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", FIXED)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_json_round_trip(datatype: str, data: st.DataObject) -> None:
    array = data.draw(_fixed_arrays(datatype, finite=True))
    wire = orjson.loads(
        orjson.dumps(codec.to_json_data(array, datatype), option=orjson.OPT_SERIALIZE_NUMPY)
    )
    flat = codec.from_json(wire, datatype, array.shape, WHERE)
    assert flat.dtype == NUMPY_OF[datatype]
    assert np.array_equal(flat, array)
    if array.ndim:
        nested = codec.from_json(array.tolist(), datatype, array.shape, WHERE)
        assert np.array_equal(nested, array)


@settings(max_examples=60, deadline=None)
@given(shape=SHAPES, data=st.data())
def test_json_round_trip_bytes(shape: tuple[int, ...], data: st.DataObject) -> None:
    count = math.prod(shape)
    texts = data.draw(st.lists(st.text(max_size=8), min_size=count, max_size=count))
    array = codec.from_json(texts, "BYTES", shape, WHERE)
    assert array.shape == shape
    assert array.reshape(-1).tolist() == [t.encode() for t in texts]
    assert codec.to_json_data(array, "BYTES") == texts


@pytest.mark.parametrize(
    ("data", "shape", "expected"),
    [
        pytest.param([1, 2, 3, 4], (2, 2), [[1, 2], [3, 4]], id="flat"),
        pytest.param([[1, 2], [3, 4]], (2, 2), [[1, 2], [3, 4]], id="nested"),
        pytest.param([[[1], [2]]], (1, 2, 1), [[[1], [2]]], id="nested-3d"),
        pytest.param([5], (), 5, id="scalar"),
        pytest.param([], (0,), [], id="empty"),
        pytest.param([[], []], (2, 0), [[], []], id="empty-nested"),
    ],
)
def test_from_json_flat_and_nested(data: list[Any], shape: tuple[int, ...], expected: Any) -> None:
    array = codec.from_json(data, "INT32", shape, WHERE)
    assert array.dtype == np.int32
    assert array.shape == shape
    assert array.tolist() == expected


def test_from_json_bytes_nested() -> None:
    array = codec.from_json([["a", "b"], ["c", "é"]], "BYTES", (2, 2), WHERE)
    assert array.tolist() == [[b"a", b"b"], [b"c", "é".encode()]]


def test_from_json_uint64_on_both_sides_of_int64_max() -> None:
    data = [1, 2**63, 2**64 - 1]
    assert codec.from_json(data, "UINT64", (3,), WHERE).tolist() == data


def test_from_json_ints_for_floats_are_accepted() -> None:
    assert codec.from_json([1, 2.5], "FP32", (2,), WHERE).tolist() == [1.0, 2.5]


@pytest.mark.parametrize(
    ("data", "datatype", "shape", "match"),
    [
        pytest.param(
            [1, 2, 3], "FP32", (2,), "holds 3 values but shape \\[2\\] needs 2", id="too-many"
        ),
        pytest.param(
            [1], "FP32", (2, 2), "holds 1 values but shape \\[2, 2\\] needs 4", id="too-few"
        ),
        pytest.param(["a"], "BYTES", (2,), "holds 1 values", id="bytes-count"),
        pytest.param(5, "FP32", (1,), "'data' must be a list of values, got int", id="not-a-list"),
        pytest.param("abc", "BYTES", (1,), "'data' must be a list", id="bytes-not-a-list"),
        pytest.param({"a": 1}, "INT32", (1,), "'data' must be a list", id="object"),
        pytest.param(["1.0"], "FP32", (1,), "not FP32", id="string-for-fp32"),
        pytest.param([1.5], "INT32", (1,), "not INT32", id="float-for-int32"),
        pytest.param([1.0], "INT64", (1,), "not INT64", id="integral-float-for-int64"),
        pytest.param([1], "BOOL", (1,), "not BOOL", id="int-for-bool"),
        pytest.param([True], "FP32", (1,), "not FP32", id="bool-for-fp32"),
        pytest.param([1.5, True], "FP32", (2,), "mixes true/false", id="bool-among-floats"),
        pytest.param([[0.5, 1.0], [False, 2.0]], "FP64", (2, 2), "mixes", id="bool-nested-floats"),
        pytest.param([3, False], "INT32", (2,), "mixes true/false", id="bool-among-ints"),
        pytest.param([1, True], "FP16", (2,), "mixes true/false", id="bool-among-ints-for-fp16"),
        pytest.param([None], "INT32", (1,), "not INT32", id="null"),  # (NaN in a float)
        pytest.param([{}], "INT8", (1,), "not INT8", id="object-element"),
        pytest.param([128], "INT8", (1,), "outside the range of INT8", id="int8-high"),
        pytest.param([-129], "INT8", (1,), "outside the range of INT8", id="int8-low"),
        pytest.param([-1], "UINT8", (1,), "outside the range of UINT8", id="uint8-negative"),
        pytest.param([65536], "UINT16", (1,), "outside the range of UINT16", id="uint16-high"),
        pytest.param([2**31], "INT32", (1,), "outside the range of INT32", id="int32-high"),
        pytest.param([2**64], "UINT64", (1,), "outside the range of UINT64", id="uint64-too-big"),
        pytest.param([[1, 2], [3]], "FP32", (4,), "holds 3 values but shape", id="ragged-count"),
        pytest.param([[1, 2], ["a"]], "FP32", (3,), "not FP32", id="ragged-string"),
        pytest.param([[1], [2, 1.5]], "INT32", (3,), "not INT32", id="ragged-float-for-int"),
        pytest.param([[1.5], [True]], "FP32", (2,), "mixes true/false", id="ragged-bool"),
        pytest.param([["a"], [1]], "BYTES", (2,), "element 1 must be a string", id="ragged-bytes"),
        pytest.param(
            [1, "a"], "BYTES", (2,), "BYTES 'data' element 0 must be a string", id="bytes-int"
        ),
        pytest.param(["a", None], "BYTES", (2,), "element 1 must be a string", id="bytes-null"),
    ],
)
def test_from_json_errors(data: Any, datatype: str, shape: tuple[int, ...], match: str) -> None:
    with _raises_invalid(f"input 'x'.*{match}"):
        codec.from_json(data, datatype, shape, WHERE)


@pytest.mark.parametrize(
    ("data", "datatype", "shape", "expected"),
    [
        ([[1, 2, 3], [5, 6, 7, 8, 9]], "FP32", (2, 4), [[1, 2, 3, 5], [6, 7, 8, 9]]),
        ([[1, 2], 3], "INT32", (3,), [1, 2, 3]),
        ([1, [2, [3, [4]]]], "INT64", (2, 2), [[1, 2], [3, 4]]),
        ([[True], [False, True]], "BOOL", (3,), [True, False, True]),
        ([[], [0.5], []], "FP64", (1,), [0.5]),
        ([["a"], ["b", "c"]], "BYTES", (3,), [b"a", b"b", b"c"]),
    ],
)
def test_from_json_reads_any_nest_in_order(
    data: Any, datatype: str, shape: tuple[int, ...], expected: list[Any]
) -> None:
    """As Triton reads `data` (ReadDataFromJsonHelper): every value of the nest in order,
    however ragged, checked only by count against the shape."""
    assert codec.from_json(data, datatype, shape, WHERE).tolist() == expected


def test_from_json_bytes_nested_too_deep() -> None:
    data: Any = "a"
    for _ in range(40):
        data = [data]
    with _raises_invalid("input 'x': 'data' is nested deeper"):
        codec.from_json(data, "BYTES", (1,), WHERE)


@pytest.mark.parametrize(
    ("datatype", "array", "expected"),
    [
        ("FP32", np.array([[1.5, 2.0], [3.0, 4.0]], dtype=np.float32), [1.5, 2.0, 3.0, 4.0]),
        ("INT64", np.arange(6, dtype=np.int64).reshape(2, 3)[:, ::2], [0, 2, 3, 5]),
        ("BOOL", np.array([True, False]), [True, False]),
        ("FP16", np.array([0.5], dtype=np.float16), [0.5]),
        ("UINT64", np.array([2**64 - 1], dtype=np.uint64), [2**64 - 1]),
        ("BYTES", np.array([b"ab", b"\xff"], dtype=object), ["ab", "\ufffd"]),
        ("BYTES", np.array(["x", "y"], dtype=object), ["x", "y"]),
    ],
)
def test_to_json_data(datatype: str, array: np.ndarray, expected: list[Any]) -> None:
    data = codec.to_json_data(array, datatype)
    assert orjson.loads(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)) == expected


# -- shape and datatype -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [([], ()), ([0], (0,)), ([2, 3], (2, 3)), ((4,), (4,)), ([1] * 16, (1,) * 16)],
)
def test_parse_shape_accepts(value: Any, expected: tuple[int, ...]) -> None:
    assert codec.parse_shape(value, WHERE) == expected


@pytest.mark.parametrize(
    ("value", "match"),
    [
        pytest.param(None, "must be a list of at most 64 integers", id="missing"),
        pytest.param(3, "must be a list", id="int"),
        pytest.param("2,3", "must be a list", id="string"),
        pytest.param([1] * 65, "at most 64", id="too-many-dims"),
        pytest.param([-1], "non-negative integers, got \\[-1\\]", id="negative"),
        pytest.param([1.0], "non-negative integers", id="float"),
        pytest.param([True], "non-negative integers", id="bool"),
        pytest.param(["2"], "non-negative integers", id="string-dim"),
        pytest.param([None], "non-negative integers", id="null-dim"),
        pytest.param([2**21, 2**21], "has too many elements", id="too-many-elements"),
        pytest.param(
            orjson.loads(b"[1000000000000000000000000000000, 4]"),
            "an integer of about 1e\\+30, past int64",
            id="past-int64",
        ),  # (orjson reads it as a float: it was "got [1e+30, 4]", as if a float was sent)
    ],
)
def test_parse_shape_errors(value: Any, match: str) -> None:
    with _raises_invalid(f"input 'x'.*{match}"):
        codec.parse_shape(value, WHERE)


@pytest.mark.parametrize("value", list(NUMPY_OF))
def test_check_datatype_accepts_every_v2_datatype(value: str) -> None:
    assert codec.check_datatype(value, WHERE) == value


@pytest.mark.parametrize("value", ["fp32", "FLOAT", "STRING", 3, ["FP32"]])
def test_check_datatype_errors(value: Any) -> None:
    with _raises_invalid("input 'x'.*is not a v2 datatype; expected one of BOOL"):
        codec.check_datatype(value, WHERE)


@pytest.mark.parametrize("value", ["", None])
def test_a_missing_datatype_is_called_missing(value: Any) -> None:
    with _raises_invalid("input 'x': 'datatype' is missing; expected one of BOOL"):
        codec.check_datatype(value, WHERE)


def test_json_reads_the_non_finite_tokens_triton_writes() -> None:
    doc = codec.loads_json(b'{"data": [1.5, NaN, Infinity, -Infinity]}')
    assert doc["data"][0] == 1.5
    assert np.isnan(doc["data"][1])
    assert doc["data"][2:] == [np.inf, -np.inf]


@pytest.mark.parametrize("text", [b'{"data": [1, NaNa]}', b'{"data": [1, 2}', b"[" * 5000 + b"NaN"])
def test_json_that_is_not_json_even_with_those_tokens_keeps_orjsons_error(text: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        codec.loads_json(text)


@pytest.mark.parametrize(
    ("token", "value"),
    [(b"Inf", math.inf), (b"-Inf", -math.inf), (b"-NaN", math.nan),
     (b"Infinity", math.inf), (b"-Infinity", -math.inf), (b"NaN", math.nan)],
)  # fmt: skip
def test_json_reads_every_non_finite_spelling_triton_reads(token: bytes, value: float) -> None:
    """Triton parses with rapidjson's kParseNanAndInfFlag: NaN, Inf and Infinity, each with an
    optional minus sign. `Inf`, `-Inf` and `-NaN` were refused ("no digit after sign")."""
    doc = codec.loads_json(b'{"data": [%s, 1.0, %s], "id": "-Inf NaN \\" Inf"}' % (token, token))
    assert doc["id"] == '-Inf NaN " Inf'  # (text is left as it is)
    first, one, last = doc["data"]
    assert one == 1.0
    for got in (first, last):
        assert math.isnan(got) if math.isnan(value) else got == value


@pytest.mark.parametrize(
    "text",
    [b'{"data": [1, Inff]}', b'{"data": [1, --Inf]}', b'{"data": [+Inf]}', b'{"data": [Inf}',
     b'{"data": [-NaNa]}', b'{"s": "Inf}', b"[" * 5000 + b"-Inf"],
)  # fmt: skip
def test_json_that_is_not_json_with_any_spelling_keeps_orjsons_error(text: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        codec.loads_json(text)


def test_a_json_request_may_spell_non_finite_floats_as_triton_reads_them() -> None:
    body = (
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], '
        b'"data": [Inf, -Inf, -NaN, 2.5]}]}'
    )
    request, _ = parse_infer_request(body, None, "m", None)
    x = request.inputs["x"]
    assert x.dtype == np.float32
    assert x[0, :2].tolist() == [math.inf, -math.inf]
    assert math.isnan(x[0, 2])
    assert x[0, 3] == 2.5


def test_json_data_writes_non_finite_floats_as_tokens_and_finite_ones_as_numbers() -> None:
    mixed = codec.to_json_data(np.array([[1.5, np.nan], [np.inf, -np.inf]], np.float32), "FP32")
    assert orjson.dumps({"data": mixed}) == b'{"data":[1.5, NaN, Infinity, -Infinity]}'
    finite = codec.to_json_data(np.array([1.5, 2.0], np.float32), "FP32")
    assert orjson.dumps(finite, option=orjson.OPT_SERIALIZE_NUMPY) == b"[1.5,2.0]"


@pytest.mark.parametrize("datatype", ["FP8", "fp32"])
def test_a_datatype_duetime_does_not_serve_is_refused_naming_the_field(datatype: Any) -> None:
    with _raises_invalid(rf"input 'x': 'datatype' '?{datatype}'? is not a v2 datatype"):
        codec.check_datatype(datatype, WHERE)


def test_bf16_values_from_json_round_to_nearest_even_and_are_range_checked() -> None:
    """BF16 tensors are ml_dtypes' bfloat16 arrays; JSON values round to the nearest (even)
    bfloat16, and one beyond its range is refused as FP16's are."""
    assert codec.check_datatype("BF16", WHERE) == "BF16"
    array = codec.from_json([0.1, 1.5, -0.0, 3e38], "BF16", (4,), WHERE)
    assert array.dtype == ml_dtypes.bfloat16
    assert array.view(np.uint16).tolist() == [0x3DCD, 0x3FC0, 0x8000, 0x7F62]
    with _raises_invalid(r"input 'x': 'data' has values outside the range of BF16"):
        codec.from_json([1e39], "BF16", (1,), WHERE)
    assert codec.to_json_data(array, "BF16").tolist() == [
        0.10009765625,
        1.5,
        -0.0,
        3.00405527047391e38,
    ]
    raw = codec.to_raw(array, "BF16")
    assert raw == array.tobytes()
    assert len(raw) == 8
    assert codec.from_raw(raw, "BF16", (4,), WHERE).view(np.uint16).tolist() == (
        array.view(np.uint16).tolist()
    )


def test_bf16_values_from_json_are_rounded_once() -> None:
    """Rounded by ml_dtypes, a double went to float32 first, then to bfloat16 (found by a
    tester): 257.0000001 became 256, and 3.3961775e38, below the midpoint past BF16's largest
    value, was refused as out of range."""
    values = [257.0000001, 1.0039062509313226, 3.3961775e38, -257.0000001, 259.0]
    array = codec.from_json(values, "BF16", (5,), WHERE)
    assert array.astype(np.float64).tolist() == [
        258.0,
        1.0078125,
        3.3895313892515355e38,
        -258.0,
        260.0,
    ]
    with _raises_invalid(r"outside the range of BF16"):
        codec.from_json([3.3961776e38], "BF16", (1,), WHERE)
