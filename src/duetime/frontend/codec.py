"""Wire tensors <-> numpy arrays, shared by the HTTP and gRPC front ends.

Raw bytes become arrays without a copy (`np.frombuffer`) where the datatype allows and the bytes
lie at a multiple of `ALIGNMENT` (else they are copied once to such an address); BYTES tensors use
the v2 binary layout: each element a 4-byte little-endian length, then its bytes.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import math
import re
import struct
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NoReturn, cast

import numpy as np
import orjson

from duetime.datatypes import (
    BFLOAT16,
    NUMPY_OF,
    WIRE_DTYPE_OF,
    float_info,
    is_float,
    to_bfloat16,
    v2_datatype_of,
)
from duetime.errors import InvalidInput
from duetime.execution.ort import CHECKED_TEXT, MAX_DIMS
from duetime.types import ModelSignature, TensorSpec
from duetime.validation import (
    batch_refused,
    expected_inputs,
    left_out_input,
    not_an_output,
    other_shapes,
    shape_refused,
    strings_refused,
)

_LENGTH = struct.Struct("<I")
_MAX_DIMS = MAX_DIMS
"""The most dims a request's tensor may have: numpy's own limit, so any rank ONNX Runtime's
Python API can be fed (a model of more is refused at load). It was 16: a model with a rank-17
input loaded READY, metadata advertised its 17 dims, and every request was refused."""
_MAX_ELEMENTS = 1 << 40


def parse_shape(value: Any, where: str) -> tuple[int, ...]:
    """A tensor shape from the wire: a list of non-negative integers."""
    if not isinstance(value, list | tuple) or len(value) > _MAX_DIMS:
        raise InvalidInput(f"{where}: 'shape' must be a list of at most {_MAX_DIMS} integers")
    for dim in value:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            if isinstance(dim, float) and dim.is_integer() and dim >= 2**63:
                # NOTE: orjson reads an integer past 64 bits as a float: [10**30, 40] was
                # refused as "got [1e+30, 40]", as if the client had sent a float
                raise InvalidInput(
                    f"{where}: 'shape' holds an integer of about {dim:.3g}, past int64; dims "
                    "are non-negative integers below 2**63"
                )
            raise InvalidInput(f"{where}: 'shape' must hold non-negative integers, got {value!r}")
    shape = tuple(value)
    count = math.prod(shape)
    # NOTE: numpy refuses [0, 2**40, 2**40] too, though it has no elements: zeros left out.
    if count > _MAX_ELEMENTS or (count == 0 and math.prod(d for d in shape if d) > _MAX_ELEMENTS):
        raise InvalidInput(f"{where}: shape {list(shape)} has too many elements")
    return shape


def check_datatype(value: Any, where: str) -> str:
    """`value` if it is a v2 datatype; InvalidInput saying which it takes otherwise."""
    if not isinstance(value, str) or value not in NUMPY_OF:
        known = ", ".join(NUMPY_OF)
        # (None: not in the JSON, or null; "": not set in the gRPC message. NOTE: both were
        # "'datatype' None is not a v2 datatype", found by a tester)
        got = "is missing" if value is None or value == "" else f"{value!r} is not a v2 datatype"
        raise InvalidInput(f"{where}: 'datatype' {got}; expected one of {known}")
    return value


class Expected:
    """What one model version takes and gives, to check a request's tensors against as a front
    end reads them, before their data is decoded.

    The validator checks the decoded request in full (validation.py); these are its checks of
    what a tensor's header already tells (name, datatype, shape, batch size), with its messages,
    and of how many outputs are asked for: a request the model would refuse is refused before the
    front end decodes its data, which can take seconds (16.7M BYTES elements in a 64 MiB
    body, 140k input tensors or 440k outputs in 8 MiB of JSON). A refusal counts in `invalid`
    under `counted`, as the router counts the validator's.
    """

    __slots__ = (
        "_batch_limit", "_counted", "_invalid", "_left_out", "_model", "_others", "_outputs",
        "_specs", "_unserved", "signature",
    )  # fmt: skip

    def __init__(
        self,
        model: str,
        signature: ModelSignature,
        counted: tuple[str, str],
        invalid: dict[tuple[str, str], int],
        unserved: Mapping[str, str] | None = None,
        left_out: Mapping[str, str] | None = None,
    ) -> None:
        self._model = model
        self.signature = signature
        self._unserved = unserved or {}
        self._left_out = left_out or {}  # (the validator's: see `left_out_inputs`)
        self._specs = {spec.name: spec for spec in signature.inputs}
        self._others = other_shapes(signature)
        self._outputs = tuple(spec.name for spec in signature.outputs)
        self._batch_limit = signature.max_batch_size
        self._counted = counted
        self._invalid = invalid

    def outputs(self, count: int) -> None:
        """InvalidInput for more requested outputs than `OUTPUT_REPEATS` times the model's
        outputs (one may be asked for again, and is answered once; but each entry is read).

        NOTE: input tensors need no such count: each is checked as it is read, and past the
        model's inputs one is unknown or named twice."""
        if count > OUTPUT_REPEATS * len(self._outputs):
            self._refuse(
                f"the request asks for {count} outputs but model '{self._model}' has "
                f"{len(self._outputs)}: {self._named_outputs()}; ask for each once"
            )

    def input(self, name: str, datatype: str, shape: tuple[int, ...]) -> None:
        """InvalidInput unless the model takes input `name` of this datatype and shape."""
        spec = self._specs.get(name)
        if spec is None and name in self._left_out:
            self._refuse(left_out_input(self._model, name, self._left_out[name]))
        if spec is None:
            self._refuse(
                f"input '{name}' is not an input of model '{self._model}'; it expects "
                f"{expected_inputs(self.signature)}"
            )
        if datatype != spec.datatype and NUMPY_OF[datatype] != NUMPY_OF.get(spec.datatype):
            self._refuse(
                f"input '{name}': datatype {datatype} does not match the model's {spec.datatype}"
            )
        if not spec.any_rank:
            wanted = spec.client_shape
            if len(shape) != len(wanted):
                self._other_shape(spec, shape)
            else:
                for index in range(len(wanted)):  # (not zip, nor a generator: a third the time)
                    want = wanted[index]
                    if want != shape[index] and want != -1:
                        self._other_shape(spec, shape)
                        break
        if spec.datatype == "BYTES":
            refused = strings_refused(name, math.prod(shape))
            if refused is not None:
                self._refuse(refused)
        limit = self._batch_limit
        if limit > 0 and shape and not 0 < shape[0] <= limit:
            self._refuse(batch_refused(name, shape[0], limit, self._model))

    def _other_shape(self, spec: TensorSpec, shape: tuple[int, ...]) -> None:
        """InvalidInput unless `shape` is one of the others the input takes (`other_shapes`)."""
        refused = shape_refused(spec, shape, self._others.get(spec.name, ()), self._model)
        if refused is not None:
            self._refuse(refused)

    def output(self, name: str) -> None:
        """InvalidInput unless the model has output `name`."""
        if name not in self._outputs:
            self._refuse(not_an_output(self._model, name, self._outputs, self._unserved))

    def _named_outputs(self) -> str:
        return ", ".join(repr(name) for name in self._outputs)

    def _refuse(self, message: str) -> NoReturn:
        error = InvalidInput(message)
        error.count_in(self._invalid, self._counted)
        raise error


OUTPUT_REPEATS = 4
"""How many times a request may ask for each output of a model, on average (see
`Expected.outputs`): asked for again, an output is answered once, but every entry is read."""


ALIGNMENT = 64
"""Every decoded input array of a fixed-size datatype starts at a multiple of this many bytes:
ONNX Runtime's own allocator's alignment (and the width of an AVX-512 register).

NOTE: ORT runs a numpy input where it lies, and its reduction kernels (ReduceSum, ReduceMean)
add in another order where the data is not 16-byte aligned: a view over a request body lies
wherever the JSON header's length leaves it, so one tensor got answers differing in their last
bits with the length of the request's id, and differing from ORT's own on an aligned copy.
Measured on 2 cores: the copy of a misaligned 64 MiB input takes ~30 ms (a plain memcpy), of a
160-byte one ~4 µs; most bodies are small, and an aligned one is not copied."""


def aligned(array: np.ndarray) -> np.ndarray:
    """`array`, or a copy of it at a multiple of `ALIGNMENT` where it lies elsewhere."""
    if array.dtype.kind == "O" or array.ctypes.data % ALIGNMENT == 0:
        return array
    return aligned_copy(array)


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `array` at a multiple of `ALIGNMENT`."""
    size = array.nbytes
    room = _carve(size) if size <= SLAB_PIECE_BYTES else aligned_empty(size)
    copy = room.view(array.dtype).reshape(array.shape)
    copy[...] = array
    return copy


SLAB_BYTES = 1 << 16
SLAB_PIECE_BYTES = 4096
"""Copies this small are carved from a slab of `SLAB_BYTES` (see `_carve`)."""


class _Slab(threading.local):
    """The slab this thread carves small aligned copies from."""

    def __init__(self) -> None:
        self.room: np.ndarray | None = None
        self.used = 0


_SLAB = _Slab()


def _carve(size: int) -> np.ndarray:
    """`size` new bytes at a multiple of `ALIGNMENT`, from this thread's slab.

    NOTE: an aligned allocation of its own cost a small copy 3.4 µs (numpy cannot be asked for
    an alignment: a spare array, its address, a slice), paid by most binary requests (a JSON
    header leaves their data anywhere); carved from a slab, 1.2 µs. Pieces are never reused: a
    slab is freed with the last array cut from it (a long-lived small input pins 64 KiB)."""
    slab = _SLAB
    room = slab.room
    start = slab.used
    if room is None or start + size > len(room):
        room = slab.room = aligned_empty(SLAB_BYTES)
        start = 0
    slab.used = start + -(-size // ALIGNMENT) * ALIGNMENT
    return room[start : start + size]


def aligned_empty(size: int) -> np.ndarray:
    """`size` new bytes (uint8) at a multiple of `ALIGNMENT` (numpy's own allocations are at a
    multiple of 16).

    NOTE: the address from ctypes over the (writable) array: 1 µs where `spare.ctypes.data`
    takes 2.7, and a misaligned binary input pays this once per request."""
    spare = np.empty(size + ALIGNMENT, np.uint8)
    start = -ctypes.addressof(ctypes.c_char.from_buffer(spare.data)) % ALIGNMENT
    return spare[start : start + size]


def data_address(data: bytes | memoryview) -> int:
    """Where `data`'s bytes start in memory.

    NOTE: for `bytes` (a request body), from its id: CPython keeps the data at a fixed offset
    in the object, checked once below. Asking numpy (`frombuffer(...).ctypes.data`) takes ~3 µs,
    half the time of decoding a whole binary request from its recipe (see rest.py)."""
    if type(data) is bytes and _BYTES_DATA is not None:
        return id(data) + _BYTES_DATA
    return int(np.frombuffer(data, np.uint8).ctypes.data)


def _bytes_data_offset() -> int | None:
    """The offset of a `bytes` object's data from its id, where that holds (CPython)."""
    sample = bytes(ALIGNMENT)
    offset = bytes.__basicsize__ - 1  # (the size counts the data's terminating NUL)
    return offset if np.frombuffer(sample, np.uint8).ctypes.data == id(sample) + offset else None


_BYTES_DATA = _bytes_data_offset()


def from_raw(
    buffer: bytes | memoryview, datatype: str, shape: tuple[int, ...], where: str
) -> np.ndarray:
    """An array over `buffer` (no copy for fixed-size types at a multiple of `ALIGNMENT`; a
    copy at one otherwise); InvalidInput if the size is wrong."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return _bytes_from_raw(memoryview(buffer), count, where).reshape(shape)
    dtype = WIRE_DTYPE_OF[datatype]
    expected = count * dtype.itemsize
    if len(buffer) != expected:
        raise InvalidInput(
            f"{where}: {len(buffer)} bytes of data do not make a {datatype} tensor of shape "
            f"{list(shape)}, which needs {expected} bytes"
        )
    array = np.frombuffer(buffer, dtype=dtype)
    if datatype == "BOOL" and array.view(np.uint8).max(initial=0) > 1:
        raise InvalidInput(f"{where}: BOOL data must be bytes 0 or 1")
    if not dtype.isnative:
        array = array.astype(dtype.newbyteorder("="))
    return aligned(array.reshape(shape))


def _bytes_from_raw(view: memoryview, count: int, where: str) -> np.ndarray:
    end = len(view)
    if count * _LENGTH.size > end:
        # NOTE: checked before allocating: a shape of 2**30 over a few bytes would otherwise
        # reserve gigabytes of element slots before the first length prefix was read.
        raise InvalidInput(
            f"{where}: {end} bytes of BYTES data cannot hold {count} elements (each needs a "
            f"4-byte length prefix); check the shape"
        )
    if count > _FEW_ELEMENTS:
        (length,) = _LENGTH.unpack_from(view, 0)
        stride = _LENGTH.size + length
        if stride * count == end:
            prefixes = np.ndarray((count,), dtype="<u4", buffer=view, strides=(stride,))
            if (prefixes == length).all():
                return _alike(view, count, length)
    return _elements(view, count, where)


_FEW_ELEMENTS = 16
"""BYTES tensors of more elements are checked for elements all of one length first (see
`_alike`)."""


def _alike(view: memoryview, count: int, length: int) -> np.ndarray:
    """`count` BYTES elements of `length` bytes each, every one after its length prefix: read
    by numpy, without a Python step per element.

    NOTE: elements of one length are common (fixed-size keys, hashes) and are what a request
    built to stall the loop holds: 16.7M empty elements in 64 MiB took 13 s one by one."""
    if length == 0:
        return np.full(count, b"", dtype=CHECKED_TEXT)
    items = np.ndarray(
        (count,), dtype=f"V{length}", buffer=view, offset=_LENGTH.size,
        strides=(_LENGTH.size + length,),
    )  # fmt: skip
    codes = np.ndarray(
        (count, length), dtype=np.uint8, buffer=view, offset=_LENGTH.size,
        strides=(_LENGTH.size + length, 1),
    )  # fmt: skip
    # (void items become `bytes`, trailing zero bytes kept)
    return items.astype(CHECKED_TEXT if _rows_utf8(codes) else object)


def _rows_utf8(codes: np.ndarray) -> bool:
    """Whether every row of `codes` (bytes, one element a row) is UTF-8, checked in C: all ASCII,
    or all of them, each followed by a newline, one UTF-8 text.

    NOTE: the newline, ASCII, can be no part of another character: text and newlines are
    UTF-8 only where each element is (see `bytes_elements`)."""
    if not codes.size or codes.max() < 0x80:
        return True
    lines = np.empty((codes.shape[0], codes.shape[1] + 1), np.uint8)
    lines[:, :-1] = codes
    lines[:, -1] = 0x0A
    return _utf8(lines.data)


def bytes_elements(items: list[bytes]) -> np.ndarray:
    """A BYTES tensor (1-D) of `items`: CHECKED_TEXT where every one is UTF-8 (joined by
    newlines, ASCII, which no element's character can take in, so the whole is UTF-8 only where
    each is; in C), object otherwise."""
    out = np.empty(len(items), dtype=CHECKED_TEXT if _utf8(b"\n".join(items)) else object)
    out[:] = items
    return out


def _utf8(data: bytes | memoryview) -> bool:
    text = bytes(data)
    if text.isascii():
        return True
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _elements(view: memoryview, count: int, where: str) -> np.ndarray:
    """BYTES elements of any lengths, read one by one from a copy of `view` (a slice of
    `bytes` is one step; of a memoryview, two)."""
    data, end = bytes(view), len(view)
    unpack = _LENGTH.unpack_from
    items: list[bytes] = []
    append = items.append
    offset = 0
    for i in range(count):
        if offset + 4 > end:
            raise InvalidInput(f"{where}: BYTES data ends inside element {i} of {count}")
        (length,) = unpack(data, offset)
        offset += 4
        stop = offset + length
        if stop > end:
            raise InvalidInput(f"{where}: BYTES element {i} claims {length} bytes past the end")
        append(data[offset:stop])
        offset = stop
    if offset != end:
        raise InvalidInput(f"{where}: {end - offset} bytes left over after {count} BYTES elements")
    return bytes_elements(items)


def to_raw(array: np.ndarray, datatype: str) -> bytes:
    """The raw little-endian bytes of `array` (BYTES: length-prefixed elements)."""
    if datatype == "BYTES":
        parts = []
        for item in array.reshape(-1):
            data = item if isinstance(item, bytes) else str(item).encode("utf-8")
            parts.append(_LENGTH.pack(len(data)))
            parts.append(data)
        return b"".join(parts)
    wire = WIRE_DTYPE_OF[datatype]
    if array.dtype != wire:
        array = array.astype(wire)
    return np.ascontiguousarray(array).tobytes()


def from_json(
    data: Any, datatype: str, shape: tuple[int, ...], where: str, field: str = "data"
) -> np.ndarray:
    """An array from JSON `data` (flat or nested, row-major), checked against datatype and shape,
    at a multiple of `ALIGNMENT`; errors name `where` and the request's `field`."""
    if not isinstance(data, list):
        raise InvalidInput(
            f"{where}: '{field}' must be a list of values, got {type(data).__name__}"
        )
    _check_depth(data, len(shape), where, field)
    if datatype == "BYTES":
        array = _bytes_from_json(data, where, field)
    else:
        array = _numbers_from_json(data, datatype, where, field)
    count = math.prod(shape)
    if array.size != count:
        raise InvalidInput(
            f"{where}: '{field}' holds {array.size} values but shape {list(shape)} needs {count}"
        )
    return aligned(array.reshape(shape))


NEST_LEVELS = 16
"""Levels of lists any tensor's JSON `data` may nest (one of more dims: as many as it has)."""


def _check_depth(data: list[Any], rank: int, where: str, field: str) -> None:
    """InvalidInput where `data`'s first values nest deeper than a tensor of `rank` dims could
    use (and than `NEST_LEVELS`); deeper nests elsewhere meet `_MAX_DIMS` as they are read.

    NOTE: the first path only: a step per level, whatever the number of values."""
    levels, item = 0, cast(Any, data)
    while isinstance(item, list):
        levels += 1
        if levels > max(rank, NEST_LEVELS):
            raise InvalidInput(f"{where}: '{field}' is nested deeper than any tensor")
        item = item[0] if item else None


def from_nested_json(data: Any, datatype: str, where: str, field: str) -> np.ndarray:
    """An array shaped as the nesting of JSON lists `data` (KServe v1 instances)."""
    if not isinstance(data, list):
        return from_json([data], datatype, (), where, field)  # a scalar
    return from_json(data, datatype, _nested_shape(data, where, field=field), where, field)


def _numbers_from_json(data: list[Any], datatype: str, where: str, field: str) -> np.ndarray:
    dtype = NUMPY_OF[datatype]
    want = "f" if is_float(dtype) else dtype.kind  # (BF16's dtype is no numpy float)
    try:
        parsed = np.asarray(data)
        if (
            parsed.size
            and parsed.dtype.kind in "fO"
            and want in "iu"
            and _all_ints(data, where, field)
        ):
            # NOTE: numpy reads ints on both sides of INT64_MAX as float64, losing digits (and
            # ints beyond 64 bits as objects): none of them fit a signed type, all may fit UINT64
            if dtype != np.uint64:
                raise OverflowError
            parsed = np.asarray(data, dtype=np.uint64)
    except OverflowError:
        raise _out_of_range(where, field, datatype) from None
    except (ValueError, TypeError):
        if any(isinstance(item, list) for item in data):
            # NOTE: Triton reads any nest of lists in order, checking only the count against
            # the shape (ReadDataFromJsonHelper recurses into each list it meets): a ragged
            # nest ([[1, 2, 3], [4, 5, 6, 7, 8]] for [2, 4]) or lists beside values was
            # refused 400 here (found by a tester), which numpy cannot read as one array
            return _numbers_from_json(_flatten(data, where, field), datatype, where, field)
        raise InvalidInput(
            f"{where}: '{field}' is not a regular list of {datatype} values"
        ) from None
    if want == "f" and parsed.dtype.kind == "O" and parsed.size:
        parsed = _nulls_as_nan(parsed, where, field, datatype)
    kind = parsed.dtype.kind
    allowed = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}[want]
    if parsed.size and kind not in allowed:
        if kind == "f" and want in "iu":
            raise _first_fault(_flatten(data, where, field), dtype, where, field, datatype)
        raise InvalidInput(
            f"{where}: '{field}' holds values that are not {datatype} ({parsed.dtype})"
        )
    if kind in "iuf" and want in "iuf" and _has_bools(data, parsed.ndim):
        raise InvalidInput(
            f"{where}: '{field}' mixes true/false with numbers; {datatype} takes numbers"
        )
    if want in "iu" and parsed.size:
        info = np.iinfo(dtype)  # type: ignore[type-var]
        if parsed.min() < info.min or parsed.max() > info.max:
            raise _out_of_range(where, field, datatype)
    if want == "f" and parsed.size:
        with np.errstate(over="ignore"):
            converted = to_bfloat16(parsed) if dtype == BFLOAT16 else parsed.astype(dtype)
        if not np.isfinite(converted[np.isfinite(parsed)]).all():
            raise _out_of_range(where, field, datatype)
        return converted.reshape(-1)
    return parsed.astype(dtype, copy=False).reshape(-1)


def _nulls_as_nan(parsed: np.ndarray, where: str, field: str, datatype: str) -> np.ndarray:
    """A float tensor's JSON values read as numbers, null as NaN, where all are numbers or
    null; else `parsed` as it is (refused as holding other values).

    NOTE: JSON has no NaN or infinity, and KServe's v2 client (as its server, and duetime's V1
    answers) writes them as null: its request with a NaN was refused "holds values that are
    not FP32 (object)" (found by a tester)."""
    if not all(item is None or type(item) is int or type(item) is float for item in parsed.flat):
        return parsed
    try:
        return parsed.astype(np.float64)  # (None casts to NaN)
    except OverflowError:  # (an integer beyond any float)
        raise _out_of_range(where, field, datatype) from None


def _out_of_range(where: str, field: str, datatype: str) -> InvalidInput:
    dtype = NUMPY_OF[datatype]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)  # type: ignore[type-var]
        low, high = str(info.min), str(info.max)
    else:
        top = float(float_info(dtype).max)
        low, high = f"{-top:.8g}", f"{top:.8g}"
    return InvalidInput(
        f"{where}: '{field}' has values outside the range of {datatype} ({low} to {high})"
    )


def _first_fault(
    flat: list[Any], dtype: np.dtype[Any], where: str, field: str, datatype: str
) -> InvalidInput:
    """The error for the first value of `flat` (JSON numbers numpy read as float64 together)
    that integer `dtype` does not take, judged on the value as read, as it would be alone.

    NOTE: judged on the float64 array, an integer a float stood beside was judged rounded:
    [18446744073709551615, 1.5, 0] as UINT64 was "outside the range" (2**64 - 1 rounds to
    2**64), where the fault is 1.5, which [1.5, 0, 0] is told."""
    info = np.iinfo(dtype)
    for item in flat:
        if type(item) is bool:
            return InvalidInput(
                f"{where}: '{field}' mixes true/false with numbers; {datatype} takes numbers"
            )
        if type(item) is int:
            if not info.min <= item <= info.max:
                return _out_of_range(where, field, datatype)
        elif isinstance(item, float) and _whole_beyond(item, info):
            # (JSON integers beyond 64 bits, which orjson reads as floats: 2**64 for UINT64)
            return _out_of_range(where, field, datatype)
        else:
            break
    return InvalidInput(f"{where}: '{field}' holds values that are not {datatype} (float64)")


def _whole_beyond(value: float, info: np.iinfo[Any]) -> bool:
    """Whether `value` is a whole number outside the range of the integer type of `info`.

    NOTE: bounds as floats: info.max + 1 and info.min are powers of two, so exact; -2**63
    itself counts, as orjson reads -2**63 - 1 as that float. An infinity (JSON's `Infinity`,
    which orjson reads) is beyond every range: math.floor raised OverflowError on it, a 500
    (found by a tester)."""
    beyond = value >= float(info.max + 1) or value < float(info.min) or value <= -(2.0**63)
    return beyond and (math.isinf(value) or math.floor(value) == value)


def _has_bools(data: list[Any], ndim: int) -> bool:
    """Whether JSON true/false hide among numbers that numpy read (as 1 and 0) without a word.

    NOTE: called once numpy has read `data` as a regular array of `ndim` dims, so its values
    lie `ndim` lists deep; `set(map(type, ...))` runs in C, ~20 ns a value, about what reading
    them took (a generator over the values: 30). Nested lists were flattened in Python first:
    4M values as [[0], [0], ...] (8 MiB of JSON) held the event loop 1.3 s, a flat list 0.3 s
    (found by a tester); `chain.from_iterable` flattens them in C."""
    leaves: Iterable[Any] = data
    for _ in range(ndim - 1):
        leaves = itertools.chain.from_iterable(leaves)
    return bool in set(map(type, leaves))


def _all_ints(data: list[Any], where: str, field: str) -> bool:
    return all(type(item) is int for item in _flatten(data, where, field))


def _bytes_from_json(data: list[Any], where: str, field: str) -> np.ndarray:
    """BYTES elements from JSON strings, encoded as UTF-8 (so checked as such: CHECKED_TEXT).

    NOTE: a flat list of strings, the usual, is encoded by one call that loops in C; nested
    lists, and any fault, take the steps that name it. Each string looked at in Python (is it a
    list? then encoded), 1.5M of them (a 7.5 MB request) held the event loop 0.35 s."""
    if data and not isinstance(data[0], list):
        try:
            encoded = list(map(str.encode, data))  # (TypeError where one is not a str)
        except (TypeError, UnicodeEncodeError):
            pass
        else:
            out = np.empty(len(encoded), dtype=CHECKED_TEXT)
            out[:] = encoded
            return out
    flat = _flatten(data, where, field)  # (any nest, read in order, as Triton reads it)
    out = np.empty(len(flat), dtype=CHECKED_TEXT)  # (text encoded as UTF-8 is UTF-8)
    try:
        out[:] = list(map(str.encode, flat))
    except (TypeError, UnicodeEncodeError):
        raise _text_fault(flat, where, field) from None
    return out


def _text_fault(flat: list[Any], where: str, field: str) -> InvalidInput:
    """The error for the first of `flat` that is not a string with a UTF-8 form."""
    for i, item in enumerate(flat):
        if not isinstance(item, str):
            return InvalidInput(f"{where}: BYTES '{field}' element {i} must be a string")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            return InvalidInput(
                f"{where}: BYTES '{field}' element {i} is not valid Unicode text (a lone "
                "surrogate): it has no UTF-8 form"
            )
    return InvalidInput(f"{where}: BYTES '{field}' holds values that are not strings")


def _nested_shape(
    data: list[Any], where: str, depth: int = 0, field: str = "data"
) -> tuple[int, ...]:
    """The shape of nested lists, or InvalidInput when they are ragged (as numpy refuses): a
    KServe V1 request's, whose nesting is its shape; v2's `data` is read whatever its nesting
    (see `from_json`)."""
    if depth >= _MAX_DIMS:
        raise InvalidInput(f"{where}: '{field}' is nested deeper than any tensor")
    if not any(isinstance(item, list) for item in data):
        return (len(data),)
    shapes = {
        _nested_shape(item, where, depth + 1, field) if isinstance(item, list) else None
        for item in data
    }
    if len(shapes) != 1 or None in shapes:
        raise InvalidInput(
            f"{where}: '{field}' is a ragged nest of lists; rows must match in length"
        )
    (inner,) = shapes
    assert inner is not None
    return (len(data), *inner)


def _flatten(data: Sequence[Any], where: str, field: str) -> list[Any]:
    """The values of nested lists `data`, row-major; errors name `where` and `field`."""
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) >= _MAX_DIMS:
                    raise InvalidInput(f"{where}: '{field}' is nested deeper than any tensor")
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def loads_json(data: bytes | memoryview) -> Any:
    """A JSON document, where numbers may also be `NaN`, `Inf` or `Infinity`, each with an
    optional minus sign (`-NaN` reads as NaN).

    NOTE: JSON has no non-finite numbers; Triton writes `NaN`, `Infinity` and `-Infinity` and
    reads all six spellings (rapidjson's kParseNanAndInfFlag in TritonJson::Value::Parse;
    server PR #3870); Python's `json`, which tritonclient uses, reads and writes the three it
    writes. orjson refuses them all, so a document holding one is read again by `json`, and
    one holding `Inf`, `-Inf` or `-NaN` once more after those are spelled as `json` reads them
    (`_spelled_for_json`): only such documents pay for it; the rest are read by orjson alone,
    as before."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raw = bytes(data)
        if b"NaN" not in raw and b"Inf" not in raw:  # ("Inf" is in "Infinity" as well)
            raise
        error = exc
    try:
        return _paired(json.loads(raw, parse_int=_int_as_orjson, parse_float=_float_as_orjson), raw)
    except _Infinite as exc:
        raise _infinite(exc, raw) from None
    except orjson.JSONDecodeError:
        raise
    except (ValueError, RecursionError):  # Inf, -Inf or -NaN, or not JSON with such tokens
        pass
    try:
        spelled = _spelled_for_json(raw)
        doc = json.loads(spelled, parse_int=_int_as_orjson, parse_float=_float_as_orjson)
    except _Infinite as exc:
        raise _infinite(exc, raw) from None
    except (ValueError, RecursionError):  # not JSON with those tokens either
        raise error from None
    return _paired(doc, raw)


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE_ESCAPE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def _paired(doc: Any, raw: bytes) -> Any:
    """`doc`, which `json` read from `raw`, if none of its strings holds a lone surrogate
    (`"\\ud800"`: no character, so no UTF-8); else orjson's error for it.

    NOTE: orjson refuses a lone surrogate escape, `json` reads it into the string: a request
    with a NaN (read by `json`) and an input named "\\ud800" was refused with a message naming
    the input, which no JSON encoder could write, and its connection hung unanswered (found by
    a tester)."""
    if _SURROGATE_ESCAPE.search(raw) is None:
        return doc
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode()
                except UnicodeEncodeError:
                    lone = _LONE_SURROGATE_ESCAPE.search(raw)
                    raise orjson.JSONDecodeError(
                        "lone surrogate in string (a \\uD800-\\uDBFF escape must be followed "
                        "by a \\uDC00-\\uDFFF one)",
                        raw.decode("utf-8", errors="replace"),
                        0 if lone is None else lone.start(),
                    ) from None
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return doc


class _Infinite(ValueError):
    """A number `json` read (its text the argument) that is infinite as a float64."""


def _int_as_orjson(text: str) -> int | float:
    """A JSON integer as orjson reads it: an int where it fits 64 bits (signed or not), else
    the nearest float (infinite: `_Infinite`).

    NOTE: `json` read bigger ones as ints, which numpy holds as objects: FP64 data
    [NaN, 100000000000000000000000000000, 2], read by `json` for its NaN, was refused as "not
    FP64 (object)", where the same number without a NaN was taken."""
    if len(text) <= 21:
        value = int(text)
        if -(2**63) <= value < 2**64:
            return value
    return _float_as_orjson(text)


def _float_as_orjson(text: str) -> float:
    """A JSON number as a float64, as orjson reads it: one that is infinite refused."""
    value = float(text)
    if math.isinf(value):
        raise _Infinite(text)
    return value


def _infinite(exc: _Infinite, raw: bytes) -> orjson.JSONDecodeError:
    """orjson's error for a number infinite as a float64, at the first place it is written."""
    text = exc.args[0]
    position = max(raw.find(text.encode()), 0)
    document = raw.decode("utf-8", errors="replace")
    return orjson.JSONDecodeError("number is infinity when parsed as double", document, position)


_STRING_OR_NON_FINITE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|-?(?:Infinity|Inf|NaN)')
"""A JSON string (kept as it is, so that text holding `Inf` stays text), or a non-finite
number in any of the spellings rapidjson reads."""
_JSON_SPELLING = {
    b"Inf": b"Infinity", b"-Inf": b"-Infinity", b"Infinity": b"Infinity",
    b"-Infinity": b"-Infinity", b"NaN": b"NaN", b"-NaN": b"NaN",
}  # fmt: skip


def _spelled_for_json(raw: bytes) -> bytes:
    """`raw` with its non-finite numbers outside strings spelled as Python's `json` reads
    them: `Inf` -> `Infinity`, `-Inf` -> `-Infinity`, `-NaN` -> `NaN`."""
    return _STRING_OR_NON_FINITE.sub(lambda m: _JSON_SPELLING.get(m.group(), m.group()), raw)


def json_fault(error: orjson.JSONDecodeError, data: bytes | memoryview) -> str:
    """What is wrong with a document `loads_json` refused: `utf8_fault`'s words where it is not
    UTF-8, `number_fault`'s where a number is out of range, else "not valid JSON: " and
    orjson's reason."""
    return utf8_fault(data) or number_fault(error, data) or f"not valid JSON: {error}"


_OUT_OF_RANGE = "number is infinity when parsed as double"


def number_fault(error: orjson.JSONDecodeError, data: bytes | memoryview) -> str | None:
    """Where `error` is orjson's for a number no float64 holds (`1e400`, an integer of 400
    digits), that number and, in a document of up to `NUMBER_PATH_BYTES`, the field holding
    it, in words: "the number 1e400 at parameters.timeout (line 1 column 65) is out of range:
    ..."; else None.

    NOTE: orjson's reason gave a line and column alone: a client could not tell which field
    held it (found by a tester). The field is found by reading the document again with `json`
    (a call a number), which took 1.5-3.4 s of the event loop for a body of megabytes (a
    second tester's 5 KB of gzip): bigger documents get the number and its place alone."""
    if _OUT_OF_RANGE not in str(error):
        return None
    doc = error.doc
    found = _NUMBER_TEXT.match(doc, error.pos) if isinstance(doc, str) else None
    text = found.group() if found is not None else ""
    path = _number_path(data) if len(data) <= NUMBER_PATH_BYTES else None
    if path is not None and text and path[1] != text:
        path = None  # (another number than orjson's: a key given twice keeps the last)
    if path is not None:
        text = path[1]
    if len(text) > 40:
        text = f"{text[:20]}... ({len(text)} characters)"
    at = "" if path is None else f" at {path[0] or 'the document'}"
    return (
        f"the number {text}{at} (line {error.lineno} column {error.colno}) is out of range: JSON "
        "numbers are read as float64 (at most about 1.8e308), or as 64-bit integers"
    )


NUMBER_PATH_BYTES = 8192
"""The largest document whose out-of-range number `number_fault` names the field of."""
_NUMBER_TEXT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


class _TooBig:
    """A number of a document `_number_path` reads that no float64 holds (its text)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _number_path(data: bytes | memoryview) -> tuple[str, str] | None:
    """Where in `data` (JSON) the first number no float64 holds is ("parameters.timeout",
    "inputs[0].data[3]"), and its text; None where `json` does not read it."""

    def number(text: str) -> Any:
        value = float(text)
        return _TooBig(text) if math.isinf(value) else value

    try:
        doc = json.loads(_spelled_for_json(bytes(data)), parse_int=number, parse_float=number)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, _TooBig):
            return path, item.text
        if isinstance(item, dict):
            stack.extend(
                (value, f"{path}.{key}" if path else str(key))
                for key, value in reversed(item.items())
            )
        elif isinstance(item, list):
            stack.extend(
                (value, f"{path}[{index}]") for index, value in reversed(list(enumerate(item)))
            )
    return None


def utf8_fault(data: bytes | memoryview) -> str | None:
    """The first byte of `data` that is not UTF-8, in words: "not valid UTF-8 (byte 0xff at
    offset 9)" (None: there is none).

    NOTE: orjson checks that the whole document is UTF-8 before it parses, and says "str is not
    valid UTF-8: surrogates not allowed: line 1 column 1 (char 0)" of any byte that is not: a
    place that is never the byte's, and a cause that is seldom the one. Found again here, for a
    refused document only."""
    try:
        bytes(data).decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"not valid UTF-8 (byte 0x{bad.object[bad.start]:02x} at offset {bad.start})"
    return None


JSON_CHUNK = 32_768
"""Values encoded per call when a tensor's JSON is built in pieces (about 1.5 ms of floats): a
thread building a big answer gives the GIL back between pieces, so the event loop runs on."""


JSON_VALUE_BYTES = {
    "BOOL": 5, "INT8": 4, "INT16": 6, "INT32": 11, "INT64": 20, "UINT8": 3, "UINT16": 5,
    "UINT32": 10, "UINT64": 20, "FP16": 16, "FP32": 16, "FP64": 24, "BF16": 24,
}  # fmt: skip
"""The longest one value of each numeric datatype is written as JSON (`false`, `-2147483648`;
a float in its shortest exact form, `-0.0000050164504` as FP32; BF16 as the double it is)."""
JSON_VALUE_MAX_BYTES = max(JSON_VALUE_BYTES.values()) + 1
"""The most any one number takes as JSON, with its comma."""
JSON_FLOAT_TEXT_BYTES = 26
"""The most one float takes in an answer's JSON, with what follows it: where a piece holds a NaN
or an infinity, `json` writes its values as doubles and ', ' (`-2.2250738585072014e-308, `)."""


def json_value_bytes_at_most(datatype: str) -> int:
    """The most one value of `datatype` (numeric) takes in an answer's JSON, with what follows
    it (see `to_json_data`)."""
    if datatype in ("FP16", "FP32", "FP64", "BF16") or datatype not in JSON_VALUE_BYTES:
        return JSON_FLOAT_TEXT_BYTES
    return JSON_VALUE_BYTES[datatype] + 1


def json_size(array: np.ndarray, datatype: str) -> int:
    """About how many bytes `array`'s values take as JSON: each number at its longest, and a
    comma; BYTES elements as `to_json_data` writes them, or more (see `_text_json_size`).

    NOTE: numbers from the count alone, without reading them: this runs before an answer is
    encoded, to refuse one too big to make (see rest.py `_check_json_answer`). So FP16 and FP32
    pieces that hold a NaN or an infinity, which `json` writes (each value as a double, then
    ', ': up to 26 bytes), can come out longer than this says."""
    if datatype != "BYTES":
        return array.size * (JSON_VALUE_BYTES[datatype] + 1)
    return _text_json_size(array.reshape(-1).tolist())


_CONTROL_ESCAPE_BYTES = 5
"""What a control character adds as JSON: written `\\u0001` (6 bytes; `\\n` and the like, 2)."""
_CONTROLS = bytes(range(0x20))
"""The bytes JSON writes escaped as control characters."""
_COUNTED_BY_BYTES = 4096
"""Joined elements up to this many bytes are counted with bytes methods, longer ones by numpy,
whose calls cost a microsecond or more each: about even at 4 KB (6 µs), numpy 3 times faster
at 32 KB."""


def _text_json_size(items: list[Any]) -> int:
    """How many bytes BYTES elements take as JSON strings (with quotes and a comma each), at
    most: as UTF-8 text (bytes that are not become U+FFFD, 3 bytes), a control character at
    its 6-byte escape, a quote or backslash at 2.

    NOTE: counted on all the elements joined by DEL (0x7f: ASCII, which JSON does not escape, so
    no element's decoding reaches into the next), in C. Counted at their raw length, 30,000
    bytes 0x01 were 30 KB where the answer wrote 180 KB: `--max-json-answer-bytes` was passed
    6 times over. A short answer's (`_COUNTED_BY_BYTES`) is counted with bytes methods, not
    numpy: one label took 5.6 µs of the event loop, eight 5.8; now about 1 and 1.3 (the raw
    length's count took 1.6 and 2.5)."""
    if not items:
        return 0
    try:
        if type(items[0]) is str:  # (text, as ONNX Runtime gives string outputs)
            joined = "\x7f".join(items).encode("utf-8", "replace")
        else:
            joined = b"\x7f".join(items)
    except TypeError:  # (a mix, or other values, which `to_json_data` writes as their str())
        joined = b"\x7f".join(
            item if isinstance(item, bytes) else str(item).encode("utf-8", "replace")
            for item in items
        )
    text = len(joined)  # (with the n - 1 DELs: a quote, a quote and a comma each is 2n + 1)
    if not joined.isascii():
        text = len(joined.decode("utf-8", "replace").encode("utf-8"))
    if len(joined) <= _COUNTED_BY_BYTES:
        controls = len(joined) - len(joined.translate(None, _CONTROLS))
        escaped = joined.count(b'"') + joined.count(b"\\")
    else:
        codes = np.frombuffer(joined, np.uint8)
        controls = int(np.count_nonzero(codes < 0x20))
        escaped = int(np.count_nonzero((codes == 0x22) | (codes == 0x5C)))
    return 2 * len(items) + 1 + text + _CONTROL_ESCAPE_BYTES * controls + escaped


def to_json_data(array: np.ndarray, datatype: str) -> Any:
    """Row-major flat values for a JSON response (BYTES as UTF-8 text; a non-finite float as
    `NaN`, `Infinity` or `-Infinity`, as Triton writes them, where orjson would write null).
    More than `JSON_CHUNK` numbers come as one `orjson.Fragment`, encoded in pieces."""
    if datatype == "BYTES":
        return [
            item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
            for item in array.reshape(-1)
        ]
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.dtype == BFLOAT16:  # (orjson writes no ml_dtypes array: each value's exact double)
        flat = flat.astype(np.float64)
    if flat.size > JSON_CHUNK:
        return orjson.Fragment(_json_in_pieces(flat))
    if flat.dtype.kind == "f" and not np.isfinite(flat).all():
        return orjson.Fragment(json.dumps(flat.tolist()))
    return flat


def _json_in_pieces(flat: np.ndarray) -> bytes:
    """`flat` as a JSON list, `JSON_CHUNK` values per encoding call."""
    pieces = []
    for start in range(0, flat.size, JSON_CHUNK):
        chunk = flat[start : start + JSON_CHUNK]
        if chunk.dtype.kind == "f" and not np.isfinite(chunk).all():
            text = json.dumps(chunk.tolist()).encode()
        else:
            text = orjson.dumps(chunk, option=orjson.OPT_SERIALIZE_NUMPY)
        pieces.append(text[1:-1])
    return b"[" + b",".join(pieces) + b"]"


def raw_view(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """`to_raw` without copying where the array is already its wire form (contiguous,
    little-endian, numeric): a view of its bytes, which must not change until written."""
    if datatype == "BYTES":
        return to_raw(array, datatype)
    wire = WIRE_DTYPE_OF[datatype]
    if array.dtype != wire:
        array = array.astype(wire)
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def encode_tensor(
    name: str, array: np.ndarray, *, binary: bool
) -> tuple[dict[str, Any], bytes | memoryview]:
    """The v2 JSON entry of a tensor and, with `binary`, its raw bytes to append after the JSON
    (the entry then carries `binary_data_size`; a view of the array where it can be); without,
    the values go in `data` and no bytes."""
    datatype = v2_datatype_of(array)
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
    if not binary:
        entry["data"] = to_json_data(array, datatype)
        return entry, b""
    raw = raw_view(array, datatype)
    entry["parameters"] = {"binary_data_size": len(raw)}
    return entry, raw
