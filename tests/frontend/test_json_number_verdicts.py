"""The verdict on a JSON number in numeric 'data' is the one it gets alone, whatever stands
beside it.

A NaN sent the body through the `json` reader, which read integers beyond 64 bits as Python
ints (numpy: an object array): FP64 [NaN, 1e29-as-an-integer, 2] was "not FP64 (object)" where
[1e29-as-an-integer, 1, 2] was taken. An integer beside a float was judged rounded to float64:
UINT64 [2**64 - 1, 1.5, 0] was "outside the range of UINT64", where the fault is 1.5."""

from __future__ import annotations

import orjson
import pytest

from duetime.errors import InvalidInput
from duetime.frontend import codec

BIG = b"100000000000000000000000000000"


def values(body: bytes, datatype: str) -> list[float | int]:
    data = codec.loads_json(b'{"data": %s}' % body)["data"]
    return codec.from_json(data, datatype, (3,), "input 'x'").tolist()  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("datatype", "body", "expected"),
    [
        ("FP64", b"[NaN, %s, 2]" % BIG, [1e29, 2.0]),
        ("FP64", b"[%s, 1, 2]" % BIG, [1e29, 1.0, 2.0]),
        ("FP32", b"[NaN, 18446744073709551616, 2]", [float(2**64), 2.0]),
        ("FP64", b"[-Inf, -9223372036854775809, 18446744073709551615]", [-(2.0**63), 2.0**64]),
    ],
)
def test_big_integers_read_as_without_a_nan(
    datatype: str, body: bytes, expected: list[float]
) -> None:
    got = values(body, datatype)
    assert got[-len(expected) :] == pytest.approx(expected, rel=1e-7)


def test_the_json_reader_reads_numbers_as_orjson_does() -> None:
    for body in (b"[%s, 18446744073709551615, -9223372036854775808, 18446744073709551616]" % BIG,
                 b"[-9223372036854775809, 1.5, -0, 0.1]"):  # fmt: skip
        fast = orjson.loads(body)
        slow = codec.loads_json(body[:-1] + b", NaN]")[:-1]
        assert [(type(v), v) for v in slow] == [(type(v), v) for v in fast]


@pytest.mark.parametrize(
    "body", [b"[NaN, 1e400]", b"[NaN, %s]" % (b"9" * 5000)], ids=["1e400", "5000 digits"]
)
def test_numbers_infinite_as_float64_are_refused_as_orjson_refuses_them(body: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError) as caught:
        codec.loads_json(body)
    shown = "1e400" if b"1e400" in body else "99999999999999999999... (5000 characters)"
    assert codec.json_fault(caught.value, body) == (
        f"the number {shown} at [1] (line 1 column 7) is out of range: JSON numbers are read as "
        "float64 (at most about 1.8e308), or as 64-bit integers"
    )
    with pytest.raises(orjson.JSONDecodeError, match="number is infinity"):
        codec.loads_json(body.replace(b"NaN, ", b""))


@pytest.mark.parametrize(
    ("datatype", "body", "fault"),
    [
        ("UINT64", b"[18446744073709551615, 1.5, 0]", "holds values that are not UINT64"),
        ("UINT64", b"[1.5, 0, 0]", "holds values that are not UINT64"),
        ("INT64", b"[9223372036854775807, 1.5, 0]", "holds values that are not INT64"),
        ("INT64", b"[-9223372036854775808, 2.0, 0]", "holds values that are not INT64"),
        ("UINT64", b"[18446744073709551616, 1.5, 0]", "outside the range of UINT64"),
        ("UINT64", b"[0, 18446744073709551616, 1.5]", "outside the range of UINT64"),
        ("INT64", b"[-9223372036854775809, 1, 2]", "outside the range of INT64"),
        ("INT8", b"[1, 1.5, 300]", "holds values that are not INT8"),
        ("INT8", b"[300, 1.5, 1]", "outside the range of INT8"),
        ("INT32", b"[true, 1.5, 1]", "mixes true/false with numbers"),
        # (an infinity was an OverflowError from math.floor: a 500, found by a tester)
        ("INT64", b"[Infinity, 1, 2]", "outside the range of INT64"),
        ("UINT8", b"[1, -Infinity, 2]", "outside the range of UINT8"),
        ("INT32", b"[1.5, Infinity, 2]", "holds values that are not INT32"),
    ],
)
def test_the_first_faulty_value_is_told_as_it_would_be_alone(
    datatype: str, body: bytes, fault: str
) -> None:
    with pytest.raises(InvalidInput, match=fault):
        values(body, datatype)


def test_in_a_big_document_the_number_is_named_without_its_field() -> None:
    """Its field is found by reading the document again with `json`, a call a number: 1.5-3.4 s
    of the event loop for a body of megabytes (found by a tester). Past `NUMBER_PATH_BYTES`
    the number and its place are told alone."""
    body = b"[" + b"1, " * codec.NUMBER_PATH_BYTES + b"1e400]"
    with pytest.raises(orjson.JSONDecodeError) as caught:
        codec.loads_json(body)
    fault = codec.json_fault(caught.value, body)
    assert fault.startswith(f"the number 1e400 (line 1 column {len(body) - 5}) is out of range")
