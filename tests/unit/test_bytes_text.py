"""BYTES inputs made ONNX text without a Python step per element on the event loop.

A 20 MB binary request of 4M one-byte strings held the event loop ~2 s (every other request,
health checks included, waiting): `strings_for_ort` decoded each element in a Python loop. Now
the codec checks a request's elements are UTF-8 over its own bytes (CHECKED_TEXT), the validator
leaves a big checked input's elements `bytes`, and the run's thread makes them `str`
(`ort.text_feeds`), a chunk per call; other arrays are converted by calls that loop in C. What
a request is refused for, and how its error reads, is unchanged."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from duetime.errors import InvalidInput
from duetime.execution import ort as dort
from duetime.frontend import codec
from duetime.types import ModelSignature, TensorSpec
from duetime.validation import Validator

BIG = getattr(dort, "RUN_TEXT_ELEMENTS", 4096) + 1000  # (getattr: also read on the code before)


def _binary(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def _validator() -> Validator:
    spec = TensorSpec("x", "BYTES", (1, -1))
    return Validator("m", ModelSignature((spec,), (TensorSpec("y", "BYTES", (1, -1)),), 0))


def _identity_session(tmp_path: Path) -> ort.InferenceSession:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.STRING, [1, None])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [1, None])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return ort.InferenceSession(str(path))


@pytest.mark.parametrize(
    "items",
    [
        [b"a"] * BIG,  # one length (`_alike`), ASCII
        ["\u00e9\u2603".encode()] * BIG,  # one length, not ASCII
        [b"a\x00", b"\x00"] * (BIG // 2),  # any lengths (`_elements`), NULs kept
        [b"", "\u00e9".encode(), b"xyz\n"] * (BIG // 3),
    ],
    ids=["ascii", "utf8", "nuls", "mixed-lengths"],
)
def test_a_big_binary_input_reaches_the_run_as_bytes_and_runs_as_text(
    tmp_path: Path, items: list[bytes]
) -> None:
    array = codec.from_raw(_binary(items), "BYTES", (1, len(items)), "input 'x'")
    feeds = _validator().prepare({"x": array}, None).feeds
    assert type(feeds["x"].flat[0]) is bytes  # (not made str on the event loop)
    run = dort.direct_run(_identity_session(tmp_path))
    (y,) = run(["y"], feeds)
    assert y.tolist() == [[item.decode() for item in items]]


def test_a_small_binary_input_is_made_text_at_once() -> None:
    array = codec.from_raw(_binary([b"a", b"b\x00"]), "BYTES", (1, 2), "input 'x'")
    feeds = _validator().prepare({"x": array}, None).feeds
    assert feeds["x"].tolist() == [["a", "b\x00"]]


def test_a_big_json_input_reaches_the_run_as_bytes() -> None:
    data = ["a", "\u00e9", ""] * (BIG // 3)
    array = codec.from_json(data, "BYTES", (1, len(data)), "input 'x'")
    feeds = _validator().prepare({"x": array}, None).feeds
    assert feeds["x"].dtype == object
    assert feeds["x"].tolist() == [[text.encode() for text in data]]


@pytest.mark.parametrize(
    ("items", "bad"),
    [
        ([b"a"] * 5000 + [b"\xff"] + [b"a"] * 100, 5000),  # one length
        ([b"ab"] * 3000 + [b"\xc3"] + [b"a"] * 2000, 3000),  # a character cut at the end
        ([b"\xc3", b"\xa9"] * 3000, 0),  # split across two elements: UTF-8 together only
        ([b"ok", b"\xa9ok"] * 3000, 1),  # a continuation byte first
    ],
    ids=["one-length", "cut", "split", "continuation"],
)
def test_an_element_not_utf8_is_refused_naming_it(items: list[bytes], bad: int) -> None:
    array = codec.from_raw(_binary(items), "BYTES", (1, len(items)), "input 'x'")
    wanted = f"input 'x': BYTES element {bad} is not valid UTF-8; the model's string tensor"
    with pytest.raises(InvalidInput, match=wanted):
        _validator().prepare({"x": array}, None)


def test_a_template_request_is_checked_again() -> None:
    """A big checked input goes on as a view: its template is not remembered as passed as is
    (which would let the next request of that template, not UTF-8, skip the checks)."""
    validator = _validator()
    good = codec.from_raw(_binary([b"a"] * BIG), "BYTES", (1, BIG), "input 'x'")
    validator.prepare({"x": good}, None, template="t")
    bad = codec.from_raw(_binary([b"\xff"] * BIG), "BYTES", (1, BIG), "input 'x'")
    with pytest.raises(InvalidInput, match="element 0 is not valid UTF-8"):
        validator.prepare({"x": bad}, None, template="t")


def test_a_batch_of_text_and_bytes_runs_as_text(tmp_path: Path) -> None:
    """Requests made text on the loop and others left bytes share a batch's buffer."""
    mixed = np.empty((1, 6), dtype=object)
    mixed[0] = ["a", b"b", "\u00e9", "\u2603".encode(), b"", "z"]
    feeds = {"x": mixed}
    texts = dort.text_feeds(feeds, frozenset({"x"}))
    assert texts["x"].tolist() == [["a", "b", "\u00e9", "\u2603", "", "z"]]
    assert mixed[0, 1] == b"b"  # (the request's own array, or the pool's, left as it was)
    text_only = {"x": np.array([["a", "b"]], dtype=object)}
    assert dort.text_feeds(text_only, frozenset({"x"})) is text_only
    (y,) = dort.direct_run(_identity_session(tmp_path))(["y"], feeds)
    assert y.tolist() == texts["x"].tolist()


def test_text_feeds_converts_in_chunks() -> None:
    items = [b"a", b"\x00b"] * (dort.TEXT_CHUNK + 10)
    array = np.empty(len(items), dtype=object)
    array[:] = items
    array[3] = "text"
    out = dort.text_feeds({"x": array.reshape(2, -1)}, frozenset({"x"}))["x"]
    assert out.shape == (2, len(items) // 2)
    assert out.reshape(-1).tolist() == [i if isinstance(i, str) else i.decode() for i in array]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ([b"a", b"\x00", b"\xc3\xa9"], ["a", "\x00", "\u00e9"]),
        (["a", "\u00e9", np.str_("b")], ["a", "\u00e9", "b"]),
        ([b"a", "b", bytearray(b"c"), memoryview(b"d")], ["a", "b", "c", "d"]),
    ],
    ids=["bytes", "text", "mixed"],
)
def test_strings_for_ort_takes_what_it_took(given: list[object], expected: list[str]) -> None:
    array = np.empty(len(given), dtype=object)
    array[:] = given
    assert dort.strings_for_ort(array, "x").tolist() == expected


@pytest.mark.parametrize(
    ("given", "wanted"),
    [
        ([b"a"] * 10 + [b"\xff"], "element 10 is not valid UTF-8"),
        (["a"] * 10 + ["\ud800"], "element 10 is a string that is not valid Unicode text"),
        ([b"a"] * 10 + [None], "element 10 must be bytes or a string, got NoneType"),
        (["a"] * 10 + [1.5], "element 10 must be bytes or a string, got float"),
    ],
    ids=["not-utf8", "surrogate", "none", "float"],
)
def test_strings_for_ort_still_names_the_element(given: list[object], wanted: str) -> None:
    array = np.empty(len(given), dtype=object)
    array[:] = given
    with pytest.raises(InvalidInput, match=f"input 'x': BYTES {wanted}"):
        dort.strings_for_ort(array, "x")


def test_json_text_with_a_lone_surrogate_is_refused_naming_it() -> None:
    """(`json`, which reads documents holding NaN, gives such strings; orjson refuses them.)"""
    data = ["a"] * 10 + ["\ud800"]
    with pytest.raises(InvalidInput, match="input 'x': BYTES 'data' element 10 is not valid"):
        codec.from_json(data, "BYTES", (11,), "input 'x'")
