"""Encode ITCH 5.0 messages and write them to files, checked field by field.

`encode` is the careful path, for tests and hand-made fixtures: every field is named, every
value range-checked, and a mistake says which field of which message and what was allowed.
Bulk producers that generate millions of messages (the session generator) pack with
`framed_struct` instead and skip the checks: they build values that are valid by construction.
"""

from __future__ import annotations

import gzip as gzip_module
import os
import struct
from types import TracebackType
from typing import BinaryIO, Protocol, Self

from duetime.feeds.itch.spec import MAX_TIMESTAMP, SPECS, Field, MessageSpec

_HEADER_DEFAULTS = {"stock_locate": 0, "tracking_number": 0, "timestamp": 0}
"""Header fields may be left out (market-wide messages have locate 0); body fields may not."""

_STRUCTS = {letter: struct.Struct(spec.struct_format) for letter, spec in SPECS.items()}
_MAX_FRAME = 0xFFFF


class _Sink(Protocol):
    def write(self, data: bytes, /) -> int: ...


def framed_struct(letter: str) -> struct.Struct:
    """A `struct.Struct` packing a length prefix and one whole message of type `letter`.

    Its values are: the length (`SPECS[letter].length`), the type byte, stock locate,
    tracking number, the timestamp's high 16 and low 32 bits, then the body fields in order,
    one-byte alpha fields as 1-byte `bytes` and wider ones as `bytes` (padded by the caller).
    """
    return struct.Struct(">H" + SPECS[letter].struct_format[1:])


def encode(letter: str, /, **fields: int | str) -> bytes:
    """One message of type `letter` (no length prefix), from its fields by name.

    Header fields default to 0; every body field is required. Raises ValueError naming the
    message and the field when a name is unknown or missing or a value is out of range.
    """
    spec = SPECS.get(letter)
    if spec is None:
        raise ValueError(f"unknown ITCH message type {letter!r}; known: {''.join(SPECS)}")
    names = {f.name for f in spec.fields}
    unknown = sorted(fields.keys() - names)
    required = (f.name for f in spec.fields if f.name not in _HEADER_DEFAULTS)
    missing = [name for name in required if name not in fields]
    if unknown or missing:
        problems = [f"unknown field(s) {unknown}"] if unknown else []
        problems += [f"missing field(s) {missing}"] if missing else []
        raise ValueError(
            f"{_describe(spec)}: {', '.join(problems)}; its fields are "
            f"{[f.name for f in spec.fields]}"
        )
    values: list[int | bytes] = [letter.encode("ascii")]
    for field in spec.fields:
        value = fields.get(field.name, _HEADER_DEFAULTS.get(field.name, 0))
        values.extend(_wire_values(spec, field, value))
    return _STRUCTS[letter].pack(*values)


def frame(body: bytes) -> bytes:
    """`body` preceded by its 2-byte big-endian length, as messages are stored in files."""
    if not 0 < len(body) <= _MAX_FRAME:
        raise ValueError(f"a framed message must be 1..{_MAX_FRAME} bytes, got {len(body)}")
    return len(body).to_bytes(2, "big") + body


def _describe(spec: MessageSpec) -> str:
    return f"ITCH {spec.letter!r} ({spec.title})"


def _wire_values(spec: MessageSpec, field: Field, value: int | str) -> list[int | bytes]:
    where = f"{_describe(spec)} field {field.name!r}"
    if field.kind == "alpha":
        return [_alpha(where, field.width, value)]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} must be an int, got {value!r}")
    limit = MAX_TIMESTAMP if field.kind == "timestamp6" else (1 << (8 * field.width)) - 1
    if not 0 <= value <= limit:
        raise ValueError(f"{where} must be in [0, {limit}], got {value}")
    if field.kind == "timestamp6":
        return [value >> 32, value & 0xFFFFFFFF]
    return [value]


def _alpha(where: str, width: int, value: int | str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a str, got {value!r}")
    if not (value.isascii() and value.isprintable()):
        raise ValueError(f"{where} must be printable ASCII, got {value!r}")
    if width == 1 and len(value) != 1:
        raise ValueError(f"{where} must be exactly one character, got {value!r}")
    if len(value) > width:
        raise ValueError(f"{where} holds at most {width} characters, got {value!r}")
    return value.encode("ascii").ljust(width, b" ")


class ItchWriter:
    """Writes length-prefixed ITCH messages to a path or a binary file object.

    A path is opened (and closed) by the writer; a file object is left open on close, since
    its owner may still need it. `gzip=True` compresses the stream (the readers detect gzip by
    its magic bytes, so the file name does not matter).
    """

    def __init__(self, target: str | os.PathLike[str] | BinaryIO, *, gzip: bool = False) -> None:
        self._owned: BinaryIO | None = None
        if isinstance(target, str | os.PathLike):
            target = self._owned = open(target, "wb")  # noqa: SIM115 - closed in close()
        self._gzip: gzip_module.GzipFile | None = None
        if gzip:
            self._gzip = gzip_module.GzipFile(fileobj=target, mode="wb", mtime=0)
        self._out: _Sink = self._gzip if self._gzip is not None else target
        self.messages = 0
        """Messages written so far."""

    def write(self, letter: str, /, **fields: int | str) -> None:
        """Encode one message (see `encode`) and write it with its length prefix."""
        self.write_body(encode(letter, **fields))

    def write_body(self, body: bytes) -> None:
        """Write one already encoded message with its length prefix."""
        self._out.write(frame(body))
        self.messages += 1

    def write_framed(self, data: bytes, messages: int) -> None:
        """Write bytes that already hold `messages` length-prefixed messages, unchecked."""
        self._out.write(data)
        self.messages += messages

    def close(self) -> None:
        """Finish the gzip stream if any, and close the file if the writer opened it."""
        if self._gzip is not None:
            self._gzip.close()
            self._gzip = None
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
