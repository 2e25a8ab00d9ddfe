"""Where bytes that protobuf will not decode go wrong, named by the message's fields.

protobuf's parser says only "Error parsing message with type 'inference.ModelInferRequest'" of
any bytes it refuses: a client that wrote one field wrong (a string that is not UTF-8, a
length past the end, a truncated call) is not told which. `undecodable_at` walks the wire
format (https://protobuf.dev/programming-guides/encoding/) beside the message's descriptor and
names the first field at fault, as `inputs[0].name`, `parameters['timeout']` or
`raw_input_contents[1]`, with its byte offset. It runs only on bytes the parser refused.

It refuses what protobuf's parser (upb) refuses: a truncated key, varint, fixed-size value or
length-delimited field; a varint over 10 bytes; field number 0 or over 2**29 - 1; wire types
6 and 7; an
end-group tag with no group open, or a group never closed; a string field that is not UTF-8;
a packed repeated field that does not hold whole values; nesting past 100 messages. A known
field sent with another wire type is kept as an unknown field by protobuf, and skipped here.
It walks at most MAX_FIELDS fields, packed values counting one a KB (it runs on the event
loop), and shortens long map keys.
"""

from __future__ import annotations

from typing import Any

__all__ = ["undecodable_at"]

_VARINT, _FIXED64, _LENGTH, _GROUP_START, _GROUP_END, _FIXED32 = 0, 1, 2, 3, 4, 5

_TYPE_DOUBLE, _TYPE_FLOAT, _TYPE_FIXED64, _TYPE_FIXED32 = 1, 2, 6, 7
_TYPE_GROUP, _TYPE_MESSAGE, _TYPE_STRING, _TYPE_BYTES = 10, 11, 9, 12
_TYPE_SFIXED32, _TYPE_SFIXED64 = 15, 16
_FIXED64_TYPES = frozenset((_TYPE_DOUBLE, _TYPE_FIXED64, _TYPE_SFIXED64))
_FIXED32_TYPES = frozenset((_TYPE_FLOAT, _TYPE_FIXED32, _TYPE_SFIXED32))
_NOT_VARINT = (
    _FIXED64_TYPES | _FIXED32_TYPES | {_TYPE_GROUP, _TYPE_MESSAGE, _TYPE_STRING, _TYPE_BYTES}
)

MAX_DEPTH = 100
"""Nested messages protobuf's parser follows (its default recursion limit)."""
MAX_FIELDS = 4_000
"""Fields walked at most (~20 ms on the 2-core VM): past them, None (protobuf's own words).

NOTE: the walk is Python on the event loop: 4 MB of empty fields (2 million) took 9.4 s, and
every other client waited (found by a tester)."""
MAX_FIELD_NUMBER = (1 << 29) - 1
"""The largest field number protobuf has."""
_SHOWN_KEY = 40
"""Characters of a map key shown in a field's path (a long one would hide the error)."""


_HIGH_BITS = bytes(1 if byte & 0x80 else 0 for byte in range(256))
"""`bytes.translate` table: 1 for a byte that says another follows (in a varint), else 0."""
_TEN_CONTINUED = b"\x01" * 10
"""Ten such bytes in a row: no varint is that long."""
_CONTINUED = bytes(range(0x80, 0x100))


class _Bad(Exception):
    pass


class _Spent(Exception):
    pass


def undecodable_at(data: bytes, descriptor: Any) -> str | None:
    """Which field of `data`, a serialised `descriptor` message, protobuf cannot decode, and
    why (a sentence naming the field and its byte offset); None where nothing is found wrong
    (the parser refused it for a reason not looked for here)."""
    try:
        _message(memoryview(data), 0, len(data), descriptor, "", 0, None, [MAX_FIELDS])
    except _Bad as bad:
        return str(bad)
    except _Spent:
        pass
    return None


def _message(
    data: memoryview,
    pos: int,
    end: int,
    descriptor: Any,
    path: str,
    depth: int,
    group: int | None,
    budget: list[int],
) -> int:
    """Walks one message (or group: `group` its field number) from `pos` to `end`; where it
    ended (after a group's end tag)."""
    if depth > MAX_DEPTH:
        raise _Bad(f"{_which(path)} nests messages more than {MAX_DEPTH} deep")
    seen: dict[int, int] = {}
    while pos < end:
        budget[0] -= 1
        if budget[0] < 0:
            raise _Spent
        start = pos
        key, pos = _varint(data, pos, end, f"a field's key in {_which(path)}")
        if pos - start > 5:
            raise _Bad(
                f"a field's key in {_which(path)} (byte {start}) is {pos - start} bytes long; "
                "protobuf reads keys of at most 5"
            )
        number, wire = key >> 3, key & 7
        if number > MAX_FIELD_NUMBER:
            raise _Bad(
                f"{_which(path)} has field number {number} at byte {start}, over "
                f"{MAX_FIELD_NUMBER}, the largest protobuf has"
            )
        if number == 0:
            raise _Bad(
                f"{_which(path)} has field number 0 at byte {start} (field numbers start at 1)"
            )
        field = descriptor.fields_by_number.get(number) if descriptor is not None else None
        index = seen.get(number, 0)
        seen[number] = index + 1
        name = _field_name(path, field, number, index)
        if wire == _VARINT:
            pos = _varint(data, pos, end, f"the varint of field '{name}'")[1]
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
            if end - pos < size:
                raise _Bad(f"field '{name}' (byte {start}) needs {size} bytes, {end - pos} follow")
            pos += size
        elif wire == _LENGTH:
            length, pos = _varint(data, pos, end, f"the length of field '{name}'")
            if length > end - pos:
                raise _Bad(
                    f"field '{name}' (byte {start}) says it holds {length} bytes, but "
                    f"{end - pos} follow{' in its message' if path else ''}"
                )
            _length_delimited(data, pos, pos + length, field, name, depth, budget)
            pos += length
        elif wire == _GROUP_START:
            inner = field.message_type if field is not None and field.type == _TYPE_GROUP else None
            pos = _message(data, pos, end, inner, name, depth + 1, number, budget)
        elif wire == _GROUP_END:
            if group != number:
                raise _Bad(f"{_which(path)} has an end-group tag (field {number}, byte {start}) "
                           "with no group of that field open")  # fmt: skip
            return pos
        else:
            raise _Bad(
                f"field '{name}' (byte {start}) has wire type {wire}, which protobuf does not "
                "have (0-5)"
            )
    if group is not None:
        raise _Bad(f"group '{path}' is never closed (no end-group tag)")
    return pos


def _length_delimited(
    data: memoryview, pos: int, end: int, field: Any, name: str, depth: int, budget: list[int]
) -> None:
    """Checks what a length-delimited field of `field`'s kind must hold (None: unknown)."""
    if field is None:
        return
    kind = field.type
    if kind == _TYPE_MESSAGE:
        inner = field.message_type
        path = name
        if inner.GetOptions().map_entry:
            key = _map_key(data, pos, end)
            if key is not None:
                shown = repr(key if len(str(key)) <= _SHOWN_KEY else f"{str(key)[:_SHOWN_KEY]}...")
                path = f"{name.rpartition('[')[0]}[{shown}]"
        _message(data, pos, end, inner, path, depth + 1, None, budget)
    elif kind == _TYPE_STRING:
        try:
            data[pos:end].tobytes().decode()
        except UnicodeDecodeError as exc:
            raise _Bad(
                f"field '{name}' is a string but is not valid UTF-8 (its byte {exc.start})"
            ) from None
    elif _repeated(field) and kind not in _NOT_VARINT:  # (packed varints)
        # (by bytes' methods, not value by value: megabytes of them are a client's to send; a
        # regular expression backtracked at every byte of runs of 9, 1.3 s for 64 MB)
        budget[0] -= (end - pos) // 1024  # (a field's worth a KB: MAX_FIELDS KB at most)
        if budget[0] < 0:
            raise _Spent
        region = data[pos:end].tobytes()
        overlong = region.translate(_HIGH_BITS).find(_TEN_CONTINUED)
        if overlong >= 0:
            raise _Bad(
                f"a packed value of field '{name}' (byte {pos + overlong}) runs over 10 bytes, "
                "the most a varint has"
            )
        if region and region[-1] & 0x80:
            start = pos + len(region.rstrip(_CONTINUED))
            raise _Bad(
                f"a packed value of field '{name}' (byte {start}) is cut off: the bytes end "
                "inside it"
            )
    elif _repeated(field) and kind in _FIXED64_TYPES | _FIXED32_TYPES:
        size = 8 if kind in _FIXED64_TYPES else 4
        if (end - pos) % size:
            raise _Bad(
                f"field '{name}' holds {end - pos} bytes of packed {size}-byte values, "
                f"not a multiple of {size}"
            )


def _map_key(data: memoryview, pos: int, end: int) -> str | int | None:
    """A map entry's key (field 1) where it is the entry's first field and decodes."""
    try:
        key, pos = _varint(data, pos, end, "")
        if key == (1 << 3) | _LENGTH:
            length, pos = _varint(data, pos, end, "")
            if length <= end - pos:
                return data[pos : pos + length].tobytes().decode()
        elif key == (1 << 3) | _VARINT:
            return _varint(data, pos, end, "")[0]
    except (_Bad, UnicodeDecodeError):
        pass
    return None


def _varint(data: memoryview, pos: int, end: int, what: str) -> tuple[int, int]:
    """The varint at `pos` and the position after it; `what` it is, for the error."""
    value = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise _Bad(f"{what} (byte {start}) is cut off: the bytes end inside it")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if pos - start >= 10:
            raise _Bad(f"{what} (byte {start}) runs over 10 bytes, the most a varint has")


def _repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)  # (protobuf 6; `label` is deprecated there)
    if repeated is None:
        return bool(field.label == field.LABEL_REPEATED)
    return bool(repeated)


def _field_name(path: str, field: Any, number: int, index: int) -> str:
    name = field.name if field is not None else f"#{number}"
    if field is not None and _repeated(field):
        name = f"{name}[{index}]"
    return f"{path}.{name}" if path else name


def _which(path: str) -> str:
    return f"field '{path}'" if path else "the message"
