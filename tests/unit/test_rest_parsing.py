"""Unit tests for the pure parts of `duetime.frontend.rest`: request parsing and body decoding."""

from __future__ import annotations

import gzip
import re
import struct
import zlib
from typing import Any

import numpy as np
import orjson
import pytest

from duetime.errors import InvalidInput, PayloadTooLarge
from duetime.frontend import codec
from duetime.frontend.rest import _decoded, parse_header_length, parse_infer_request


def fp32(name: Any = "x", **fields: Any) -> dict[str, Any]:
    """A JSON input entry for an FP32 [2] tensor; `fields` replace or add keys (None drops one)."""
    entry: dict[str, Any] = {"name": name, "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}
    for key, value in fields.items():
        if value is None:
            entry.pop(key, None)
        else:
            entry[key] = value
    return entry


def binary(
    name: str, size: int, datatype: str = "FP32", shape: list[int] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": datatype,
        "shape": [2] if shape is None else shape,
        "parameters": {"binary_data_size": size},
    }


def request(doc: dict[str, Any], *blobs: bytes) -> tuple[bytes, int | None]:
    """The body and header length of a request: JSON alone, or JSON followed by binary blobs."""
    head = orjson.dumps(doc)
    return head + b"".join(blobs), (len(head) if blobs else None)


def parse(doc: dict[str, Any], *blobs: bytes, header_length: int | None = -1) -> Any:
    body, length = request(doc, *blobs)
    return parse_infer_request(body, length if header_length == -1 else header_length, "m", None)


F32 = np.array([1.5, -2.0], dtype="<f4").tobytes()


# -- JSON and binary inputs ---------------------------------------------------------------------


def test_json_request() -> None:
    doc = {"id": "r1", "inputs": [fp32(), fp32("b", datatype="BYTES", shape=[1], data=["hi"])]}
    body, _ = request(doc)
    req, plan = parse_infer_request(body, None, "m", "3")
    assert (req.model, req.version, req.id, req.outputs) == ("m", "3", "r1", None)
    assert req.inputs["x"].dtype == np.float32
    assert req.inputs["x"].tolist() == [1.0, 2.0]
    assert req.inputs["b"].tolist() == [b"hi"]
    assert req.parameters == {}
    assert not plan.default_binary
    assert not plan.is_binary("anything")


def test_request_parameters_are_kept() -> None:
    req, _ = parse({"inputs": [fp32()], "parameters": {"timeout": 5, "priority": 1}})
    assert req.parameters == {"timeout": 5, "priority": 1}


def test_binary_inputs_with_header_length() -> None:
    text = struct.pack("<I", 3) + b"abc"
    doc = {"inputs": [binary("x", 8), fp32("j"), binary("s", 7, "BYTES", [1])]}
    body, length = request(doc, F32, text)
    req, _ = parse_infer_request(body, length, "m", None)
    assert req.inputs["x"].tolist() == [1.5, -2.0]
    assert req.inputs["j"].tolist() == [1.0, 2.0]
    assert req.inputs["s"].tolist() == [b"abc"]
    # A view over the request body where it lies at a multiple of codec.ALIGNMENT, else an
    # aligned copy (see tests/frontend/test_aligned_inputs.py)
    assert req.inputs["x"].ctypes.data % codec.ALIGNMENT == 0


def test_binary_input_of_zero_bytes() -> None:
    req, _ = parse({"inputs": [binary("x", 0, shape=[0])]}, b"", header_length=None)
    assert req.inputs["x"].shape == (0,)


@pytest.mark.parametrize(
    ("inputs", "blobs", "match"),
    [
        pytest.param(
            [binary("x", 9)],
            [F32],
            "input 'x': binary_data_size 9 runs past the end",
            id="past-end",
        ),
        pytest.param(
            [binary("x", 8), binary("y", 8)],
            [F32],
            r"input 'y': binary_data_size 8 runs past the end .*\(8 bytes after the JSON header, "
            r"8 already used\)",
            id="second-past-end",
        ),
        pytest.param(
            [binary("x", 8)],
            [F32, b"!"],
            "the binary inputs use 8 bytes but 9 follow the JSON header",
            id="leftover",
        ),
        pytest.param(
            [binary("x", 4, shape=[1])],
            [F32],
            "the binary inputs use 4 bytes but 8 follow",
            id="short-size",
        ),
        pytest.param(
            [fp32()], [F32], "the binary inputs use 0 bytes but 8 follow", id="unused-binary"
        ),
        pytest.param(
            [binary("x", 4)],
            [F32[:4]],
            "input 'x': 4 bytes of data do not make a FP32 tensor of shape",
            id="size-vs-shape",
        ),
    ],
)
def test_binary_sizes_that_do_not_add_up(
    inputs: list[dict[str, Any]], blobs: list[bytes], match: str
) -> None:
    with pytest.raises(InvalidInput, match=match):
        parse({"inputs": inputs}, *blobs)


def test_binary_data_without_header_length_is_not_json() -> None:
    """It was "not valid JSON: str is not valid UTF-8: surrogates not allowed: line 1 column 1
    (char 0)": the first byte that is not UTF-8 is named where it is, and the header missed."""
    body, length = request({"inputs": [binary("x", 8)]}, b"\xc0" * 8)
    with pytest.raises(InvalidInput) as raised:
        parse_infer_request(body, None, "m", None)
    assert raised.value.message == (
        f"request body is not valid UTF-8 (byte 0xc0 at offset {length}); binary data after the "
        "JSON needs header Inference-Header-Content-Length"
    )


@pytest.mark.parametrize(
    ("body", "match"),
    [
        pytest.param(b"", "not valid JSON", id="empty"),
        pytest.param(b'{"inputs": [', "not valid JSON", id="truncated"),
        pytest.param(b"[]", "must be a JSON object with an 'inputs' list", id="array"),
        pytest.param(b'"x"', "must be a JSON object", id="string"),
        pytest.param(
            b'{"inputs": {"name": "x"}}', "request 'inputs' must be a list", id="inputs-object"
        ),
        pytest.param(b'{"inputs": "x"}', "request 'inputs' must be a list", id="inputs-string"),
        pytest.param(
            b'{"inputs": [1]}', r"inputs\[0\] must be a JSON object", id="input-not-object"
        ),
    ],
)
def test_malformed_documents(body: bytes, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        parse_infer_request(body, None, "m", None)


@pytest.mark.parametrize(
    "body", [b"{}", b'{"inputs": []}', b'{"inputs": null}'], ids=["absent", "empty", "null"]
)
@pytest.mark.parametrize("header", [False, True], ids=["json", "binary-header"])
def test_a_request_without_inputs_has_none(body: bytes, header: bool) -> None:
    """As over gRPC: what a model with no inputs takes (the validator names those missing from
    a request to a model with some). Twice: the second from the header's parsed recipe."""
    recipes: dict[bytes, Any] = {}
    for _ in range(2):
        parsed, _ = parse_infer_request(
            body, len(body) if header else None, "m", None, None, recipes
        )
        assert parsed.inputs == {}
    with pytest.raises(InvalidInput, match="0 bytes but 4 follow the JSON header"):
        parse_infer_request(body + b"\0" * 4, len(body), "m", None)


@pytest.mark.parametrize(
    ("inputs", "match"),
    [
        pytest.param(
            [fp32(name=None)], r"inputs\[0\]: 'name' must be a non-empty string", id="no-name"
        ),
        pytest.param(
            [fp32(), fp32("")], r"inputs\[1\]: 'name' must be a non-empty string", id="empty-name"
        ),
        pytest.param(
            [fp32(name=7)], r"inputs\[0\]: 'name' must be a non-empty string", id="name-not-string"
        ),
        pytest.param([fp32(), fp32()], "input 'x' appears more than once", id="duplicate"),
        pytest.param(
            [fp32(data=None)],
            "input 'x': no 'data' and no 'binary_data_size' parameter",
            id="missing-data",
        ),
        pytest.param(
            [fp32(datatype="FLOAT32")],
            "input 'x': 'datatype' 'FLOAT32' is not a v2 datatype",
            id="datatype",
        ),
        pytest.param(
            [fp32(datatype=None)],
            "input 'x': 'datatype' is missing; expected one of",
            id="no-datatype",
        ),
        pytest.param([fp32(shape=None)], "input 'x': 'shape' must be a list", id="no-shape"),
        pytest.param(
            [fp32(shape=[-2])], "input 'x': 'shape' must hold non-negative integers", id="bad-shape"
        ),
        pytest.param(
            [fp32(data=[1.0])], "input 'x': 'data' holds 1 values but shape", id="data-count"
        ),
        pytest.param(
            [fp32(data=["a", "b"])],
            "input 'x': 'data' holds values that are not FP32",
            id="data-kind",
        ),
        pytest.param(
            [fp32(parameters={"shared_memory_region": "r0", "shared_memory_byte_size": 8})],
            "input 'x': its data is in shared memory; send no 'data'",
            id="shared-memory",
        ),
        pytest.param(
            [fp32(parameters=[])], "input 'x' 'parameters' must be a JSON object", id="params-list"
        ),
        pytest.param(
            [fp32(parameters={"binary_data_size": -1})],
            "input 'x': 'binary_data_size' must be a non-negative integer",
            id="negative-size",
        ),
        pytest.param(
            [fp32(parameters={"binary_data_size": "8"})],
            "input 'x': 'binary_data_size' must be a non-negative integer",
            id="string-size",
        ),
        pytest.param(
            [fp32(parameters={"binary_data_size": True})],
            "input 'x': 'binary_data_size' must be a non-negative integer",
            id="bool-size",
        ),
    ],
)
def test_invalid_inputs(inputs: list[dict[str, Any]], match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        parse({"inputs": inputs})


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        pytest.param({"id": 5}, "request 'id' must be a string", id="id"),
        pytest.param(
            {"parameters": []}, "request 'parameters' must be a JSON object", id="params-list"
        ),
        pytest.param(
            {"parameters": {"shared_memory_region": "r"}},
            "request 'parameters': shared memory is named per input and output",
            id="request-shared-memory",
        ),
        pytest.param(
            {"parameters": {"binary_data_output": "yes"}},
            "request parameter 'binary_data_output' must be true or false",
            id="binary-output-flag",
        ),
        pytest.param(
            {"outputs": {"name": "y"}}, "request 'outputs' must be a list", id="outputs-object"
        ),
        pytest.param(
            {"outputs": ["y"]},
            r"outputs\[0\]: 'name' must be a non-empty string",
            id="output-string",
        ),
        pytest.param(
            {"outputs": [{"name": ""}]},
            r"outputs\[0\]: 'name' must be a non-empty string",
            id="output-empty",
        ),
        pytest.param(
            {"outputs": [{"name": "y", "parameters": {"classification": 0}}]},
            "output 'y': parameter 'classification' must be a positive integer",
            id="classification-zero",
        ),
        pytest.param(
            {"outputs": [{"name": "y", "parameters": {"classification": 2.5}}]},
            "output 'y': parameter 'classification' must be a positive integer",
            id="classification-float",
        ),
        pytest.param(
            {"outputs": [{"name": "y", "parameters": {"shared_memory_region": "r"}}]},
            "output 'y': 'shared_memory_region' needs 'shared_memory_byte_size'",
            id="output-shared-memory",
        ),
        pytest.param(
            {"outputs": [{"name": "y", "parameters": {"binary_data": 1}}]},
            "output 'y': parameter 'binary_data' must be true or false",
            id="binary-data-flag",
        ),
    ],
)
def test_invalid_request_fields(doc: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        parse({"inputs": [fp32()], **doc})


@pytest.mark.parametrize(
    ("doc", "outputs", "default", "binary"),
    [
        pytest.param({}, None, False, {}, id="none"),
        pytest.param({"outputs": []}, None, False, {}, id="empty-list-is-all"),
        pytest.param({"parameters": {"binary_data_output": True}}, None, True, {}, id="all-binary"),
        pytest.param(
            {"outputs": [{"name": "y"}, {"name": "z", "parameters": {"binary_data": True}}]},
            ("y", "z"),
            False,
            {"y": False, "z": True},
            id="per-output",
        ),
        pytest.param(
            {
                "parameters": {"binary_data_output": True},
                "outputs": [{"name": "y"}, {"name": "z", "parameters": {"binary_data": False}}],
            },
            ("y", "z"),
            True,
            {"y": True, "z": False},
            id="per-output-overrides-default",
        ),
    ],
)
def test_outputs_and_binary_flags(
    doc: dict[str, Any], outputs: tuple[str, ...] | None, default: bool, binary: dict[str, bool]
) -> None:
    req, plan = parse({"inputs": [fp32()], **doc})
    assert req.outputs == outputs
    assert plan.default_binary is default
    assert dict(plan.binary) == binary
    for name, flag in binary.items():
        assert plan.is_binary(name) is flag
    assert plan.is_binary("unlisted") is default


# -- Inference-Header-Content-Length ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), ("0", 0), ("12", 12), (" 12 ", 12), ("99", 99)]
)
def test_parse_header_length(value: str | None, expected: int | None) -> None:
    assert parse_header_length(value, 99) == expected


@pytest.mark.parametrize("value", ["100", "-1", "+5", "1e2", "abc", "", " ", "12.0", "0x10"])
def test_parse_header_length_errors(value: str) -> None:
    message = (
        f"Inference-Header-Content-Length: '{value}' must be an integer between 0 and the body "
        "length 99"
    )
    with pytest.raises(InvalidInput, match=re.escape(message)):
        parse_header_length(value, 99)


def test_a_header_length_of_thousands_of_digits_is_refused_not_converted() -> None:
    with pytest.raises(
        InvalidInput,
        match=re.escape("'9999999999999999999999999999999999999999... (5000 characters)' must be"),
    ):
        parse_header_length("9" * 5000, 99)
    with pytest.raises(InvalidInput, match="must be an integer between 0 and the body"):
        parse_header_length("0" * 21, 99)  # (a value in range, but no length is that long)


# -- Content-Encoding ---------------------------------------------------------------------------

DATA = b'{"inputs": []}' * 100


@pytest.mark.parametrize(
    ("body", "encoding"),
    [
        pytest.param(DATA, None, id="none"),
        pytest.param(DATA, "", id="empty"),
        pytest.param(DATA, "identity", id="identity"),
        pytest.param(DATA, " Identity ", id="identity-case"),
        pytest.param(gzip.compress(DATA), "gzip", id="gzip"),
        pytest.param(gzip.compress(DATA), " GZIP ", id="gzip-case"),
        pytest.param(zlib.compress(DATA), "deflate", id="deflate"),
    ],
)
def test_decoded(body: bytes, encoding: str | None) -> None:
    assert _decoded(body, encoding, limit=len(DATA)) == DATA


def test_identity_is_not_limited_here() -> None:
    # The protocol enforces the raw body limit before the body is read; only inflation is checked.
    assert _decoded(DATA, None, limit=10) == DATA


@pytest.mark.parametrize("encoding", ["br", "compress", "gzip, deflate"])
def test_unsupported_encoding(encoding: str) -> None:
    message = f"Content-Encoding '{encoding}' is not supported; use gzip or deflate"
    with pytest.raises(InvalidInput, match=re.escape(message)):
        _decoded(DATA, encoding, limit=len(DATA))


@pytest.mark.parametrize(
    ("body", "encoding"),
    [
        pytest.param(DATA, "gzip", id="plain-as-gzip"),
        pytest.param(zlib.compress(DATA), "gzip", id="deflate-as-gzip"),
        pytest.param(gzip.compress(DATA), "deflate", id="gzip-as-deflate"),
    ],
)
def test_invalid_compressed_data(body: bytes, encoding: str) -> None:
    with pytest.raises(InvalidInput, match=f"body is not valid {encoding} data"):
        _decoded(body, encoding, limit=len(DATA))


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_decompression_over_the_limit(encoding: str) -> None:
    compress = gzip.compress if encoding == "gzip" else zlib.compress
    with pytest.raises(PayloadTooLarge, match=f"over the {len(DATA) - 1}-byte limit"):
        _decoded(compress(DATA), encoding, limit=len(DATA) - 1)


def test_decompression_bomb_stops_at_the_limit() -> None:
    bomb = gzip.compress(b"\0" * 50_000_000, compresslevel=9)
    assert len(bomb) < 100_000
    with pytest.raises(PayloadTooLarge, match="over the 1048576-byte limit"):
        _decoded(bomb, "gzip", limit=1 << 20)


# -- decoded headers kept (recipes) ---------------------------------------------------------------


def test_a_binary_header_seen_before_decodes_each_requests_own_bytes() -> None:
    recipes: dict[bytes, Any] = {}
    doc = {
        "inputs": [binary("a", 8), binary("b", 2, "BOOL"), binary("c", 10, "BYTES", [2])],
        "parameters": {"binary_data_output": True, "timeout": 5000},
        "outputs": [{"name": "y", "parameters": {"binary_data": False}}],
    }
    strings = struct.pack("<I", 2) + b"hi" + struct.pack("<I", 0)
    for values, flags in (([1.5, -2.0], b"\x01\x00"), ([3.0, 4.0], b"\x00\x01")):
        blob = np.array(values, dtype="<f4").tobytes()
        body, length = request(doc, blob, flags, strings)
        req, plan = parse_infer_request(body, length, "m", "2", None, recipes)
        assert len({id(recipe) for recipe in recipes.values()}) == 1
        np.testing.assert_array_equal(req.inputs["a"], np.array(values, dtype=np.float32))
        np.testing.assert_array_equal(req.inputs["b"], np.frombuffer(flags, dtype=bool))
        assert req.inputs["c"].tolist() == [b"hi", b""]
        assert (req.model, req.version, req.outputs) == ("m", "2", ("y",))
        assert req.parameters == {"binary_data_output": True, "timeout": 5000}
        assert plan.is_binary("y") is False
        assert plan.is_binary("z") is True


def test_a_header_seen_before_but_for_its_timeout_is_decoded_from_its_recipe() -> None:
    """A client passing on the time left of its own deadline sends a new header each time."""
    recipes: dict[bytes, Any] = {}
    doc: dict[str, Any] = {"inputs": [binary("a", 8)], "parameters": {"timeout": 5000}}
    parse_infer_request(*request(doc, F32), "m", None, None, recipes)
    (recipe,) = {id(kept): kept for kept in recipes.values()}.values()
    doc["parameters"] = {"timeout": 250}
    later = np.array([3.0, 4.0], dtype="<f4").tobytes()
    req, _ = parse_infer_request(*request(doc, later), "m", None, None, recipes)
    assert req.template is recipe  # (from the first header's recipe)
    assert req.parameters == {"timeout": 250}
    assert recipe.parameters == {"timeout": 5000}  # (its own, unchanged)
    np.testing.assert_array_equal(req.inputs["a"], np.array([3.0, 4.0], dtype=np.float32))
    for value in (b"0250", b"-250", b"250.0", b"2e2", b"18446744073709551616"):
        body = orjson.dumps(doc).replace(b"250", value) + later
        length = len(body) - len(later)
        try:
            alone = parse_infer_request(body, length, "m", None)[0].parameters
        except InvalidInput as exc:  # (refused as the whole header's decoding refuses it)
            with pytest.raises(InvalidInput, match=re.escape(exc.message)):
                parse_infer_request(body, length, "m", None, None, recipes)
            continue
        req, _ = parse_infer_request(body, length, "m", None, None, recipes)
        assert req.template is not recipe
        assert req.parameters == alone


def test_only_the_top_level_timeout_is_told_apart() -> None:
    recipes: dict[bytes, Any] = {}
    entry = binary("a", 8)
    entry["parameters"]["timeout"] = 7  # (an input's own parameter, first in the header)
    doc: dict[str, Any] = {"inputs": [entry], "parameters": {"timeout": 5000}}
    parse_infer_request(*request(doc, F32), "m", None, None, recipes)
    assert len(recipes) == 1  # (the first `"timeout":` is not the request's)
    (recipe,) = recipes.values()
    entry["parameters"]["timeout"] = 8
    req, _ = parse_infer_request(*request(doc, F32), "m", None, None, recipes)
    assert req.template is not recipe
    assert req.inputs  # (decoded whole)


def test_a_kept_header_still_checks_the_bytes_that_follow_it() -> None:
    recipes: dict[bytes, Any] = {}
    doc = {"inputs": [binary("a", 2, "BOOL")]}
    parse_infer_request(*request(doc, b"\x01\x00"), "m", None, None, recipes)
    assert len(recipes) == 1
    with pytest.raises(InvalidInput, match="BOOL data must be bytes 0 or 1"):
        parse_infer_request(*request(doc, b"\x01\x07"), "m", None, None, recipes)
    with pytest.raises(InvalidInput, match="binary_data_size 2 runs past the end"):
        parse_infer_request(*request(doc, b"\x01"), "m", None, None, recipes)
    with pytest.raises(InvalidInput, match="use 2 bytes but 3 follow"):
        parse_infer_request(*request(doc, b"\x01\x00\x00"), "m", None, None, recipes)


def test_headers_with_an_id_or_json_data_are_not_kept() -> None:
    recipes: dict[bytes, Any] = {}
    with_id = {"id": "r7", "inputs": [binary("a", 8)]}
    req, _ = parse_infer_request(*request(with_id, F32), "m", None, None, recipes)
    assert req.id == "r7"
    json_data = {"inputs": [binary("a", 8), fp32("b")]}
    req, _ = parse_infer_request(*request(json_data, F32), "m", None, None, recipes)
    assert req.inputs["b"].tolist() == [1.0, 2.0]
    assert recipes == {}


def test_kept_headers_are_bounded() -> None:
    from duetime.frontend.rest import RECIPES_MAX

    recipes: dict[bytes, Any] = {}
    for i in range(RECIPES_MAX + 5):
        doc = {"inputs": [binary(f"x{i}", 8)]}
        parse_infer_request(*request(doc, F32), "m", None, None, recipes)
        assert 1 <= len(recipes) <= RECIPES_MAX


@pytest.mark.parametrize(
    ("path", "infer"),
    [
        ("/v2/models/m/infer", True),
        ("/v2/models/m/versions/3/infer", True),
        ("/v2/models/m/versions/infer", False),  # the metadata of version 'infer'
        ("/v2/models/m/ready", False),
        ("/v2/models/infer", False),
        ("/v1/models/m/infer", False),
        ("/v2/models/m/versions/3/x/infer", False),
    ],
)
def test_the_inference_paths_whose_routing_is_kept(path: str, infer: bool) -> None:
    from duetime.frontend.rest import _names_infer, _segments

    assert _names_infer(_segments(path.encode())) is infer


@pytest.mark.parametrize("off_by", [7, -7])
def test_a_header_length_off_the_jsons_end_is_named(off_by: int) -> None:
    """An Inference-Header-Content-Length past the JSON's end cut into the binary data ("not
    valid UTF-8 (byte 0xcd ...)"), one short of it ended the JSON early ("unexpected end of
    data"); neither named the header."""
    header = (
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], '
        b'"parameters": {"binary_data_size": 16}}]}'
    )
    body = header + b"\xcd" * 16  # (its binary data: not UTF-8)
    with pytest.raises(InvalidInput, match="header Inference-Header-Content-Length says") as bad:
        parse_infer_request(body, len(header) + off_by, "m", None)
    assert f"first {len(header) + off_by} bytes" in str(bad.value)
