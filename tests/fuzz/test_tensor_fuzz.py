"""Hypothesis against the tensor decoders: the v2 JSON + binary request parser and the gRPC
input decoder. Whatever the message, the answer is a request or InvalidInput, never another
exception, and the arrays it returns match what the message declared."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np
import orjson
import pytest
from fuzz_support import TIMEOUT_S, examples
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from duetime.datatypes import NUMPY_OF
from duetime.errors import InvalidInput
from duetime.frontend import codec
from duetime.frontend.grpc import decode_inputs, requested_outputs
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.frontend.rest import parse_header_length, parse_infer_request

pytestmark = pytest.mark.timeout(TIMEOUT_S)

FUZZ = settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))
DATATYPES = [*NUMPY_OF, "FP8", "fp32", "", "INT128"]

# -- strategies ----------------------------------------------------------------------------------

names = st.one_of(st.sampled_from(["x", "y", "image", ""]), st.text(max_size=8))
datatypes = st.one_of(st.sampled_from(DATATYPES), st.integers(), st.none())
small_dims = st.integers(-2, 6)
shapes = st.one_of(
    st.lists(small_dims, max_size=4),
    st.lists(st.integers(-(2**63), 2**63), max_size=20),
    st.sampled_from([[2**20, 2**20], [2**62], [0, 2**40], [2**31] * 3]),
    st.text(max_size=3),
    st.none(),
)
scalars = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(max_size=4),
    st.none(),
)
json_data = st.recursive(
    st.lists(scalars, max_size=12),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=40,
)
parameter_values = st.one_of(scalars, st.dictionaries(st.text(max_size=4), scalars, max_size=2))


@st.composite
def input_entries(draw: st.DrawFn) -> Any:
    entry: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        entry["name"] = draw(names)
    if draw(st.integers(0, 9)):
        entry["datatype"] = draw(datatypes)
    if draw(st.integers(0, 9)):
        entry["shape"] = draw(shapes)
    choice = draw(st.integers(0, 3))
    if choice == 0:
        entry["data"] = draw(json_data)
    elif choice in (1, 2):
        size = draw(
            st.one_of(
                st.integers(0, 64), st.integers(-5, 2**40), st.booleans(), st.text(max_size=2)
            )
        )
        entry["parameters"] = {"binary_data_size": size}
    else:
        entry["parameters"] = draw(
            st.dictionaries(
                st.sampled_from(["binary_data_size", "shared_memory_region", "z"]),
                parameter_values,
                max_size=2,
            )
        )
    return entry if draw(st.integers(0, 19)) else draw(scalars)


@st.composite
def documents(draw: st.DrawFn) -> Any:
    doc: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        doc["inputs"] = (
            draw(st.lists(input_entries(), max_size=4))
            if draw(st.integers(0, 9))
            else draw(scalars)
        )
    if draw(st.booleans()):
        doc["outputs"] = draw(
            st.lists(
                st.one_of(
                    st.fixed_dictionaries(
                        {"name": names},
                        optional={
                            "parameters": st.dictionaries(
                                st.sampled_from(["binary_data", "classification", "q"]),
                                parameter_values,
                                max_size=2,
                            )
                        },
                    ),
                    scalars,
                ),
                max_size=3,
            )
        )
    if draw(st.booleans()):
        doc["parameters"] = draw(
            st.dictionaries(
                st.sampled_from(
                    ["timeout", "priority", "binary_data_output", "shared_memory_region", "k"]
                ),
                parameter_values,
                max_size=3,
            )
        )
    if draw(st.booleans()):
        doc["id"] = draw(scalars)
    return doc if draw(st.integers(0, 19)) else draw(json_data)


def well_formed_binary(draw: st.DrawFn) -> tuple[bytes, int]:
    """A valid binary request (shapes and sizes agree) to perturb."""
    count = draw(st.integers(1, 3))
    entries, blobs = [], []
    for i in range(count):
        datatype = draw(st.sampled_from(list(NUMPY_OF)))
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        n = math.prod(shape)
        size = n * NUMPY_OF[datatype].itemsize
        if datatype == "BYTES":
            items = draw(st.lists(st.binary(max_size=5), min_size=n, max_size=n))
            blob = b"".join(struct.pack("<I", len(b)) + b for b in items)
        elif datatype == "BOOL":
            blob = bytes(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
        else:
            blob = draw(st.binary(min_size=size, max_size=size))
        entries.append(
            {
                "name": f"in{i}",
                "datatype": datatype,
                "shape": shape,
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    head = orjson.dumps({"inputs": entries})
    return head + b"".join(blobs), len(head)


def refused(exc: InvalidInput) -> None:
    """Counts a refusal; every refusal says what was wrong."""
    event("refused")
    if not exc.message:
        raise AssertionError("InvalidInput without a message")


def check_decoded(request: Any) -> None:
    """What the parser accepted is consistent: arrays of the declared dtype and shape."""
    for array in request.inputs.values():
        assert isinstance(array, np.ndarray)
        if array.dtype != object:
            assert array.dtype.isnative


# -- the v2 HTTP parser --------------------------------------------------------------------------


@FUZZ
@given(documents(), st.binary(max_size=200), st.one_of(st.none(), st.integers(-3, 400)))
def test_parse_infer_request_accepts_or_refuses_clearly(
    doc: Any, tail: bytes, length: int | None
) -> None:
    head = json.dumps(doc).encode()  # not orjson: a client may send integers past 64 bits
    body = head + tail
    header_length = (
        None if length is None and not tail else (len(head) if length is None else length)
    )
    try:
        checked = parse_header_length(
            None if header_length is None else str(header_length), len(body)
        )
        request, _ = parse_infer_request(body, checked, "m", None)
    except InvalidInput as exc:
        refused(exc)
        return
    event("accepted")
    check_decoded(request)


@FUZZ
@given(st.data())
def test_perturbed_binary_requests_accept_or_refuse_clearly(data: st.DataObject) -> None:
    body, length = well_formed_binary(data.draw)
    request, _ = parse_infer_request(body, length, "m", None)  # the unperturbed one parses
    check_decoded(request)
    edits = data.draw(
        st.lists(
            st.tuples(st.integers(0, len(body)), st.binary(max_size=4), st.integers(0, 4)),
            max_size=4,
        )
    )
    mutated = bytearray(body)
    for at, insert, delete in edits:
        mutated[at : at + delete] = insert
    new_length = data.draw(st.one_of(st.just(length), st.integers(0, len(mutated))))
    try:
        request, _ = parse_infer_request(bytes(mutated), new_length, "m", None)
    except InvalidInput:
        event("refused")
        return
    event("accepted")
    check_decoded(request)


def outcome(body: bytes, length: int, recipes: dict[bytes, Any] | None) -> Any:
    """What the parser makes of a request: its refusal's message, or its arrays as plain data."""
    try:
        request, plan = parse_infer_request(body, length, "m", None, None, recipes)
    except InvalidInput as exc:
        return exc.message
    arrays = {
        name: (a.dtype.str, a.shape, a.tolist() if a.dtype == object else a.tobytes())
        for name, a in request.inputs.items()
    }
    return arrays, request.outputs, dict(request.parameters), plan.default_binary


@FUZZ
@given(st.data())
def test_a_kept_header_decodes_other_bytes_as_the_full_parser_does(data: st.DataObject) -> None:
    body, length = well_formed_binary(data.draw)
    recipes: dict[bytes, Any] = {}
    parse_infer_request(body, length, "m", None, None, recipes)  # keeps its header
    assert len(recipes) == 1
    size = len(body) - length
    tail = data.draw(
        st.one_of(st.binary(min_size=size, max_size=size), st.binary(max_size=size + 8))
    )
    again = body[:length] + tail
    assert outcome(again, length, recipes) == outcome(again, length, None)


@FUZZ
@given(st.data())
def test_a_header_kept_but_for_its_timeout_decodes_as_the_full_parser_does(
    data: st.DataObject,
) -> None:
    """A header that differs from one kept only where its `timeout` was (any bytes there, other
    tensor bytes after it) decodes, or is refused, as it is decoded whole (see
    `rest._timeout_slot`); inputs may have a `timeout` parameter of their own."""
    body, length = well_formed_binary(data.draw)
    doc = orjson.loads(body[:length])
    integers = st.integers(0, 2**64 + 5)
    for entry in doc["inputs"]:
        if data.draw(st.booleans()):
            entry["parameters"]["timeout"] = data.draw(integers)
    parameters = {"timeout": data.draw(integers)}
    if data.draw(st.booleans()):
        parameters["priority"] = data.draw(st.integers(0, 3))
    doc["parameters"] = parameters
    separators = data.draw(st.sampled_from([(",", ":"), (", ", ": "), (",", " :  ")]))
    head = json.dumps(doc, separators=separators).encode()
    tail = body[length:]
    recipes: dict[bytes, Any] = {}
    outcome(head + tail, len(head), recipes)  # (keeps the header, where it can)
    at = head.rfind(b'"timeout"')
    start = head.index(b":", at) + 1
    while head[start : start + 1] == b" ":
        start += 1
    end = start
    while head[end : end + 1].isdigit():
        end += 1
    value = data.draw(
        st.one_of(
            st.integers(0, 2**64 + 5).map(lambda n: str(n).encode()),
            st.from_regex(rb"\A[-0-9.eE]{1,24}\Z"),
            st.binary(max_size=6),
        )
    )
    again_head = head[:start] + value + head[end:]
    size = len(tail)
    again_tail = data.draw(
        st.one_of(st.just(tail), st.binary(min_size=size, max_size=size), st.binary(max_size=8))
    )
    again = again_head + again_tail
    expected = outcome(again, len(again_head), None)
    assert outcome(again, len(again_head), recipes) == expected


@FUZZ
@example("BYTES", [2**33], b"")
@example("FP32", [0, 2**40, 2**40], b"")
@example("BYTES", [2**20, 2**10], struct.pack("<I", 0) * 4)
@given(
    st.sampled_from(list(NUMPY_OF)),
    st.lists(st.integers(0, 2**40), max_size=4),
    st.binary(max_size=64),
)
def test_from_raw_never_allocates_for_a_claimed_shape(
    datatype: str, shape: list[int], raw: bytes
) -> None:
    """A huge declared shape over a few bytes is refused before anything is allocated for it."""
    try:
        parsed = codec.parse_shape(shape, "x")
        array = codec.from_raw(raw, datatype, parsed, "x")
    except InvalidInput:
        return
    assert array.shape == tuple(shape)


# -- the gRPC decoder ----------------------------------------------------------------------------

CONTENT_FIELDS = [
    "bool_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "fp32_contents",
    "fp64_contents",
    "bytes_contents",
]
FIELD_VALUES = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=4),
}


@st.composite
def infer_requests(draw: st.DrawFn) -> Any:
    request = pb.ModelInferRequest(model_name="m", id=draw(st.text(max_size=4)))
    for _ in range(draw(st.integers(0, 3))):
        tensor = request.inputs.add(
            name=draw(names),
            datatype=draw(st.sampled_from(DATATYPES)),
            shape=draw(
                st.one_of(
                    st.lists(small_dims, max_size=4),
                    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
                )
            ),
        )
        if draw(st.integers(0, 4)) == 0:
            tensor.parameters[
                draw(st.sampled_from(["shared_memory_region", "x"]))
            ].string_param = "r"
        for name in draw(st.lists(st.sampled_from(CONTENT_FIELDS), max_size=2, unique=True)):
            getattr(tensor.contents, name).extend(draw(st.lists(FIELD_VALUES[name], max_size=12)))
    if draw(st.booleans()):
        request.raw_input_contents.extend(draw(st.lists(st.binary(max_size=48), max_size=4)))
    for _ in range(draw(st.integers(0, 2))):
        output = request.outputs.add(name=draw(names))
        if draw(st.booleans()):
            output.parameters[
                draw(st.sampled_from(["classification", "shared_memory_region", "binary_data"]))
            ].bool_param = True
    return request


@FUZZ
@given(infer_requests())
def test_grpc_decode_inputs_accepts_or_refuses_clearly(request: Any) -> None:
    try:
        arrays = decode_inputs(request)
        requested_outputs(request)
    except InvalidInput as exc:
        refused(exc)
        return
    event("accepted")
    for tensor in request.inputs:
        assert arrays[tensor.name].shape == tuple(tensor.shape)
