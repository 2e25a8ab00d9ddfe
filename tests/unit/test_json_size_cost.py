"""`codec.json_size` of a BYTES output (classification and label outputs are) runs on the event
loop before every JSON answer: a short one is counted without numpy, whose calls cost a
microsecond or more each (one label took 5.6 µs, where the raw length's count took 1.6), and
the count is the same upper bound as numpy's (tests/unit/test_codec_limits.py: never short).
The speed itself is measured outside the tests (no timed asserts)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.frontend import codec


def _objects(items: list[Any]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def _counted_by_numpy(items: list[Any]) -> int:
    """The count as numpy made it (3c34238): the bound the bytes methods must equal."""
    if not items:
        return 0
    joined = b"\x7f".join(
        item if isinstance(item, bytes) else str(item).encode("utf-8", "replace") for item in items
    )
    text = len(joined.decode("utf-8", "replace").encode("utf-8")) - (len(items) - 1)
    codes = np.frombuffer(joined, np.uint8)
    controls = int(np.count_nonzero(codes < 0x20))
    escaped = int(np.count_nonzero((codes == 0x22) | (codes == 0x5C)))
    return 3 * len(items) + text + 5 * controls + escaped


def _written(array: np.ndarray) -> int:
    written = len(orjson.dumps(codec.to_json_data(array, "BYTES")))
    return written - 1 if len(array) else 0


class _NoNumpy:
    """Stands in for the codec's numpy: any use fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"json_size of a short BYTES output called numpy.{name}")


@pytest.mark.parametrize(
    "items",
    [
        [b"positive"],
        [b"label-%d" % i for i in range(8)],
        [b"0.912:3:tabby cat"] * 8,
        ["positive", "caf\u00e9"],
        [b'"quoted"\\', b"\x01\n", b"\xff"],
    ],
    ids=["one-label", "eight-labels", "classes", "str", "escapes"],
)
def test_a_short_bytes_output_is_counted_without_numpy(
    items: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    array = _objects(items)
    monkeypatch.setattr(codec, "np", _NoNumpy())
    assert codec.json_size(array, "BYTES") == _counted_by_numpy(items)


@pytest.mark.parametrize(
    "items",
    [
        [b"x" * 32] * 4096,
        [b"\x01"] * 5000,
        [b'"\\\xff\xe2\x82\n'] * 1000,
        ["\u00e9\u2603"] * 2000,
        [b"a" * 4095],
        [b"a" * 4096],
        [b"a" * 4097],
        [b"a", "b", 3, 1.5],
    ],
    ids=["4096x32", "controls", "escapes", "text", "4095", "4096", "4097", "mixed"],
)
def test_the_count_is_numpys_either_side_of_the_switch(items: list[Any]) -> None:
    array = _objects(items)
    assert codec.json_size(array, "BYTES") == _counted_by_numpy(items)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.binary(max_size=40) | st.text(max_size=20).filter(lambda t: t.isprintable()),
        max_size=200,
    )
)
def test_the_count_is_numpys_and_never_short(items: list[Any]) -> None:
    array = _objects(items)
    size = codec.json_size(array, "BYTES")
    assert size == _counted_by_numpy(items)
    assert size >= _written(array)
