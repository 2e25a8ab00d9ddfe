"""Binary BYTES tensors (4-byte little-endian length, then the bytes, per element) are decoded
without a Python step per element where every element has one length: 16.7M empty elements
took 13 s one by one."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from duetime.errors import InvalidInput
from duetime.frontend import codec


def prefixed(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


@pytest.fixture
def no_step_per_element(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: object) -> None:
        raise AssertionError("decoded element by element")

    monkeypatch.setattr(codec, "_elements", refused)


@pytest.mark.usefixtures("no_step_per_element")
@pytest.mark.parametrize("item", [b"", b"k", b"ab\0", b"\0\0\0\0\0"], ids=repr)
def test_elements_of_one_length_are_read_whole(item: bytes) -> None:
    count = 100_000
    array = codec.from_raw(prefixed(*[item] * count), "BYTES", (count // 4, 4), "input 'x'")
    assert array.shape == (count // 4, 4)
    assert array.dtype == object
    flat = array.reshape(-1)
    assert type(flat[0]) is bytes
    assert flat[-1] == item  # trailing zero bytes kept
    assert flat.tolist() == [item] * count


def test_elements_of_several_lengths_in_the_same_bytes_are_read_one_by_one() -> None:
    """Lengths 2 and then 0 and 4: as many bytes as 2s throughout, not all of one length."""
    items = [b"ab"] * 30 + [b"", b"wxyz"]
    array = codec.from_raw(prefixed(*items), "BYTES", (len(items),), "input 'x'")
    assert array.tolist() == items


@pytest.mark.parametrize(
    ("buffer", "count", "needle"),
    [
        pytest.param(prefixed(*[b"a"] * 20) + b"z", 20, "1 bytes left over after 20", id="left"),
        pytest.param(prefixed(*[b"a"] * 20), 21, "ends inside element 20 of 21", id="short"),
        pytest.param(prefixed(*[b"a"] * 19) + b"\x09\0\0\0a", 20, "element 19 claims 9", id="long"),
    ],
)
def test_many_elements_that_do_not_add_up_are_refused(
    buffer: bytes, count: int, needle: str
) -> None:
    with pytest.raises(InvalidInput, match=needle):
        codec.from_raw(buffer, "BYTES", (count,), "input 'x'")


def test_a_view_into_a_larger_body_reads_only_its_window() -> None:
    body = b"JSON" + prefixed(*[b"xy"] * 32) + b"tail"
    view = memoryview(body)[4 : 4 + 32 * 6]
    array = codec.from_raw(view, "BYTES", (32,), "input 'x'")
    assert np.array_equal(array, np.array([b"xy"] * 32, dtype=object))
