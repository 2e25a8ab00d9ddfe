"""Read ITCH 5.0 streams: message by message with bounded memory, or whole files as columns.

`read_messages` streams length-prefixed messages from a path (plain or gzip, told apart by the
magic bytes), from bytes or from a binary file object, in chunks, so any file size needs the
same memory. It returns the message classes of `spec`. Malformed input never turns into
garbage: an unknown type, a length that does not match the type, a zero length or a frame cut
off at the end raise `ItchFormatError` with the byte offset (`on_error="stop"`), or are counted
and skipped by their length prefix (`on_error="skip"`, see `ItchReader.skipped`).

`frame_index` and `decode_columns` are the whole-file fast path: one compiled pass (numba when
installed, a Python loop otherwise) finds every frame, then numpy decodes each type's fields
into columns at once.
"""

from __future__ import annotations

import functools
import io
import os
import stat
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, Generic, Literal, NamedTuple, TypeVar, overload

import numpy as np

from duetime.feeds.itch.spec import SPECS, Field, Message, MessageSpec

Source = str | os.PathLike[str] | bytes | bytearray | memoryview | BinaryIO
OnError = Literal["stop", "skip"]
Reason = Literal["unknown_type", "bad_length", "zero_length", "truncated", "bad_gzip"]
Engine = Literal["auto", "numba", "python"]
CHUNK_SIZE = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"


class ItchFormatError(ValueError):
    """A frame that is not a well-formed ITCH 5.0 message, at `offset` in the stream.

    `offset` is the position of the frame's 2-byte length prefix in the uncompressed stream;
    `reason` is one of unknown_type, bad_length, zero_length, truncated, or bad_gzip (a gzip
    file damaged or cut short: `offset` is then how far its uncompressed stream could be read);
    `letter` the type byte as a character (None when there was none); `expected` and `got` the
    lengths.
    """

    def __init__(
        self,
        offset: int,
        reason: Reason,
        detail: str,
        *,
        letter: str | None = None,
        expected: int | None = None,
        got: int | None = None,
    ) -> None:
        what = "ITCH stream" if reason == "bad_gzip" else "ITCH frame"
        super().__init__(f"{what} at byte offset {offset}: {detail}")
        self.offset = offset
        self.reason: Reason = reason
        self.letter = letter
        self.expected = expected
        self.got = got


def file_problem(path: str | os.PathLike[str]) -> str | None:
    """Why `path` cannot be read as an ITCH stream, in a few words for a command's one-line
    error ("no such file", "is a directory, not a file"), or None if it can: a regular file, or
    a pipe or character device (`<(zcat day.gz)`, /dev/stdin), which the streaming reader
    reads once, front to back (a whole-file path that needs a regular file checks for one
    itself).

    NOTE: a pipe was refused as "not a regular file", though only the whole-file paths need
    one; the commands now take a non-regular file the streaming way."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # (the latter: a path through a file)
        return "no such file"
    except OSError as exc:  # (no permission on a directory on the way, a loop of links)
        return f"cannot be read: {exc.strerror or exc}"
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    return "is not a regular file, a pipe or a character device"


def skipped_note(count: int, first: ItchFormatError) -> str:
    """One line on what `on_error="skip"` stepped over (for stderr): how many, and the first."""
    return f"skipped {count} malformed part(s) of the stream; the first: {first}"


def frame_error(offset: int, size: int, type_byte: int | None, remaining: int) -> ItchFormatError:
    """Describe the bad frame whose prefix is at `offset` and declares `size` bytes; with fewer
    than 2 bytes `remaining`, the prefix itself is cut and `size` is not read."""
    if remaining < 2:
        detail = f"the stream ends {remaining} byte into the frame's 2-byte length prefix"
        return ItchFormatError(offset, "truncated", detail, got=0)
    letter = None if type_byte is None else chr(type_byte)
    if remaining < 2 + size or (type_byte is None and size > 0):
        return ItchFormatError(
            offset,
            "truncated",
            f"declares {size} bytes but the stream ends after {max(remaining - 2, 0)}",
            letter=letter,
            expected=size,
            got=max(remaining - 2, 0),
        )
    if size == 0:
        return ItchFormatError(offset, "zero_length", "zero length", expected=None, got=0)
    assert letter is not None
    spec = SPECS.get(letter)
    if spec is None:
        detail = f"unknown message type {letter!r} (byte 0x{type_byte:02x}), {size} bytes"
        return ItchFormatError(offset, "unknown_type", detail, letter=letter, got=size)
    detail = f"type {letter!r} ({spec.title}) must be {spec.length} bytes, the frame has {size}"
    return ItchFormatError(
        offset, "bad_length", detail, letter=letter, expected=spec.length, got=size
    )


# --- per-message decoders ------------------------------------------------------------------

_CHARS = [chr(i) for i in range(256)]


class _AlphaCache(dict[bytes, str]):
    """Padded alpha bytes → stripped str; symbols repeat, so each is decoded once (bounded)."""

    def __missing__(self, raw: bytes) -> str:
        text = raw.rstrip(b" ").decode("latin-1")
        if len(self) < 65536:
            self[raw] = text
        return text


_ALPHA = _AlphaCache()
Decoder = Callable[[bytes, int], Message]


def _decoder(spec: MessageSpec) -> Decoder:
    """Generate the decoder of one type: one `unpack_from` and one tuple, nothing generic.

    Built from source like `collections.namedtuple` builds its classes: a generic loop over the
    fields would cost more than the unpacking itself, and the stream pays it per message.
    """
    fmt = ">x"
    names: list[str] = []
    args = [repr(spec.letter)]
    for i, field in enumerate(spec.fields):
        fmt += _decode_code(field)
        names.append(f"f{i}h, f{i}" if field.kind == "timestamp6" else f"f{i}")
        if field.kind == "timestamp6":
            args.append(f"(f{i}h << 32) | f{i}")
        elif field.kind == "alpha":
            args.append(f"CHARS[f{i}]" if field.width == 1 else f"ALPHA[f{i}]")
        else:
            args.append(f"f{i}")
    source = (
        f"def decode_{spec.letter}(buf, pos):\n"
        f"    {', '.join(names)}, = unpack_from(buf, pos)\n"
        f"    return new(cls, ({', '.join(args)},))\n"
    )
    namespace: dict[str, Any] = {
        "unpack_from": struct.Struct(fmt).unpack_from,
        "new": tuple.__new__,
        "cls": spec.cls,
        "CHARS": _CHARS,
        "ALPHA": _ALPHA,
    }
    exec(source, namespace)
    decoder: Decoder = namespace[f"decode_{spec.letter}"]
    return decoder


def _decode_code(field: Field) -> str:
    if field.kind == "timestamp6":
        return "HI"
    if field.kind == "alpha":
        return "B" if field.width == 1 else f"{field.width}s"
    return {2: "H", 4: "I", 8: "Q"}[field.width]


_DECODERS: list[Decoder | None] = [None] * 256
_LENGTHS: list[int] = [-1] * 256
"""Expected message length by type byte; -1 (never a frame's size) for unknown types."""
for _spec in SPECS.values():
    _DECODERS[ord(_spec.letter)] = _decoder(_spec)
    _LENGTHS[ord(_spec.letter)] = _spec.length
LENGTH_TABLE = np.array(_LENGTHS, dtype=np.int64)
"""`_LENGTHS` as an array, for the compiled scan."""


def decode_message(body: bytes, offset: int = 0) -> Message:
    """Decode one message (no length prefix) of exactly its type's length."""
    if not body:
        raise ItchFormatError(offset, "zero_length", "zero length", got=0)
    decoder = _DECODERS[body[0]]
    if decoder is None or _LENGTHS[body[0]] != len(body):
        raise frame_error(offset, len(body), body[0], len(body) + 2)
    return decoder(bytes(body), 0)


# --- the streaming reader ------------------------------------------------------------------

T = TypeVar("T", Message, tuple[int, Message], bytes)


KEPT_ERRORS = 100
"""How many of the parts skipped with `on_error="skip"` an `ItchReader` keeps the error of."""


class ItchReader(Generic[T]):
    """An iterator over the messages of one stream, with what it skipped in `skipped` and
    `errors`.

    Made by `read_messages`. `messages` counts the messages yielded; `skipped` counts the
    malformed parts stepped over with `on_error="skip"` (with "stop" the first one is raised
    instead) and `errors` holds the `ItchFormatError` of the first `KEPT_ERRORS` of them. A
    truncated last frame ends the stream in both policies.

    NOTE: only the first errors are kept, not one per part: a run of zero bytes is a bad frame
    every two bytes, and a list of them all took 4.9 GB for a 20 MiB run (the reader promises
    the same memory for any file).
    """

    def __init__(
        self, source: Source, on_error: OnError, offsets: bool, *, raw: bool = False
    ) -> None:
        if on_error not in ("stop", "skip"):
            raise ValueError(f"on_error must be 'stop' or 'skip', got {on_error!r}")
        self.errors: list[ItchFormatError] = []
        self.skipped = 0
        self.messages = 0
        self._skip = on_error == "skip"
        self._raw = raw
        self._iterator: Iterator[Any] = self._run(_chunks(source), offsets)

    def __iter__(self) -> ItchReader[T]:
        return self

    def __next__(self) -> T:
        item: T = next(self._iterator)
        return item

    def _run(self, chunks: Iterator[bytes], offsets: bool) -> Iterator[Any]:
        lengths, decoders, raw = _LENGTHS, _DECODERS, self._raw
        carry = b""
        base = 0  # stream offset of data[0]
        for chunk in self._readable(chunks):
            data = carry + chunk if carry else chunk
            n = len(data)
            pos = 0
            while pos + 2 < n:
                size = (data[pos] << 8) | data[pos + 1]
                end = pos + 2 + size
                if end > n:
                    break
                kind = data[pos + 2]
                if lengths[kind] != size:
                    self._reject(frame_error(base + pos, size, kind, n - pos))
                    pos = end if size else pos + 2
                    continue
                message = data[pos + 2 : end] if raw else decoders[kind](data, pos + 2)  # type: ignore[misc]
                self.messages += 1
                yield (base + pos, message) if offsets else message
                pos = end
            carry = data[pos:]
            base += pos
        if carry:
            size = (carry[0] << 8) | carry[1] if len(carry) >= 2 else 2
            if size == 0 and len(carry) == 2:
                self._reject(frame_error(base, 0, None, 2))
            else:
                self._reject(frame_error(base, size, None, len(carry)))

    def _readable(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """`chunks` up to a damaged gzip stream, which ends the stream in both policies (nothing
        after it can be read): raised with "stop", counted as skipped with "skip"."""
        try:
            yield from chunks
        except ItchFormatError as error:
            self._reject(error)

    def _reject(self, error: ItchFormatError) -> None:
        if not self._skip:
            raise error
        self.skipped += 1
        if len(self.errors) < KEPT_ERRORS:
            self.errors.append(error)


@overload
def read_messages(
    source: Source, *, on_error: OnError = "stop", offsets: Literal[False] = False
) -> ItchReader[Message]: ...
@overload
def read_messages(
    source: Source, *, on_error: OnError = "stop", offsets: Literal[True]
) -> ItchReader[tuple[int, Message]]: ...
def read_messages(
    source: Source, *, on_error: OnError = "stop", offsets: bool = False
) -> ItchReader[Message] | ItchReader[tuple[int, Message]]:
    """Stream the messages of `source`; with `offsets=True`, (offset, message) pairs.

    `source` is a path (plain or gzip), bytes, or a binary file object (read from where it
    stands and left open). The offset is that of the frame's length prefix in the
    uncompressed stream. See `ItchReader` for the error policy.
    """
    if offsets:
        return ItchReader[tuple[int, Message]](source, on_error, offsets)
    return ItchReader[Message](source, on_error, offsets)


def read_frames(source: Source, *, on_error: OnError = "stop") -> ItchReader[bytes]:
    """Stream the message bodies of `source` undecoded (each without its length prefix), framed
    and checked as `read_messages` frames them: what a feed sends on (see `live.send_session`)."""
    return ItchReader[bytes](source, on_error, False, raw=True)


def _chunks(source: Source) -> Iterator[bytes]:
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        if data[:2] == _GZIP_MAGIC:
            yield from _file_chunks(io.BytesIO(data))
        else:
            yield data
        return
    if isinstance(source, str | os.PathLike):
        with open(source, "rb") as file:
            yield from _file_chunks(file)
        return
    yield from _file_chunks(source)


def gunzip(data: bytes) -> bytes:
    """The uncompressed bytes of a whole gzip file (members one after another, as `gzip`
    writes them); `ItchFormatError` (bad_gzip) if it is damaged or cut short."""
    readable, error = gunzip_readable(data)
    if error is not None:
        raise error
    return readable


def gunzip_readable(data: bytes) -> tuple[bytes, ItchFormatError | None]:
    """The uncompressed bytes of a gzip file as far as they can be read, and the bad_gzip error
    that ended them (None for an intact file): what `read_messages` reads of it, for the
    whole-buffer paths (`fastbook`) to apply the same error policy."""
    chunks: list[bytes] = []
    try:
        for chunk in _file_chunks(io.BytesIO(data)):
            chunks.append(chunk)
    except ItchFormatError as error:
        return b"".join(chunks), error
    return b"".join(chunks), None


def read_stream(
    path: str | os.PathLike[str], max_bytes: int | None = None
) -> tuple[bytearray, ItchFormatError | None] | None:
    """The uncompressed stream of the file at `path` (plain or gzip) as far as it can be read,
    and the bad_gzip error that ended it (None for an intact file), as `gunzip_readable` gives
    them; None as soon as the stream is longer than `max_bytes` (a gzip file is decompressed no
    further), for a whole-buffer path to give the file to the streaming reader instead."""
    data = bytearray()
    with open(path, "rb") as file:
        try:
            for chunk in _file_chunks(file):
                data += chunk
                if max_bytes is not None and len(data) > max_bytes:
                    return None
        except ItchFormatError as error:
            return data, error
    return data, None


def _file_chunks(file: BinaryIO) -> Iterator[bytes]:
    first = file.read(CHUNK_SIZE)
    if first[:2] == _GZIP_MAGIC:
        yield from _gunzip_chunks(first, file)
        return
    if first:
        yield first
    while chunk := file.read(CHUNK_SIZE):
        yield chunk


def _gunzip_chunks(head: bytes, file: BinaryIO) -> Iterator[bytes]:
    """The uncompressed stream of the gzip file `head` + the rest of `file`, in chunks of at
    most `CHUNK_SIZE`; at damage, every byte that decompressed before it, then `ItchFormatError`
    (bad_gzip) with the uncompressed offset reached.

    Members follow one another (each starts with the gzip magic); zero bytes after a member are
    padding (as `gzip` accepts them); any other trailing byte is damage.

    NOTE: zlib itself, not `gzip.GzipFile`: `GzipFile.read` drops what it decompressed in a
    call that fails (up to a whole chunk of intact messages before damage, or before junk after
    the last member), and `zlib.error` does the same; so each call starts from a copy of the
    inflater, and a failing one is replayed from it in small steps (`_salvage`)."""
    delivered = 0
    pending = head  # compressed bytes not fed to the inflater yet
    inflater = zlib.decompressobj(wbits=31)

    def damaged(why: str) -> ItchFormatError:
        detail = f"the gzip data is damaged or cut short ({why})"
        return ItchFormatError(delivered, "bad_gzip", detail)

    while True:
        if not pending:
            pending = file.read(CHUNK_SIZE)
        before = inflater.copy()
        try:
            # NOTE: with no input left this drains what the inflater still holds (the rest of
            # a long match when the last call filled its output)
            out = inflater.decompress(pending, CHUNK_SIZE) if pending else inflater.flush()
        except zlib.error as exc:
            out = _salvage(before, pending)
            if out:
                delivered += len(out)
                yield out
            raise damaged(str(exc)) from None
        if out:
            delivered += len(out)
            yield out
        if not inflater.eof:
            if not pending:
                raise damaged("the file ends inside a member")
            pending = inflater.unconsumed_tail
            continue
        pending = inflater.unused_data
        while True:  # after a member: zero padding, the next member, the end, or junk
            pending = pending.lstrip(b"\x00")
            if len(pending) >= 2:
                break
            more = file.read(CHUNK_SIZE)
            if not more:
                break
            pending += more
        if not pending:
            return
        if pending[:2] != _GZIP_MAGIC:
            raise damaged(f"trailing bytes that start no gzip member: {pending[:4]!r}")
        inflater = zlib.decompressobj(wbits=31)


def _salvage(inflater: Any, data: bytes) -> bytes:
    """What `inflater` (a copy made before the call that failed on `data`) decompresses of
    `data` before the byte it fails at: fed in ever smaller steps, each from a copy."""
    out: list[bytes] = []
    pos = 0
    step = 4096
    while step and pos < len(data):
        trial = inflater.copy()
        try:
            got = trial.decompress(data[pos : pos + step])
        except zlib.error:
            step //= 16  # (4096, 256, 16, 1: one failing call each)
            continue
        out.append(got)
        inflater = trial
        pos += step
    return b"".join(out)


# --- the whole-file fast path --------------------------------------------------------------


class FrameIndex(NamedTuple):
    """Where each frame of a buffer starts (its length prefix) and its type byte."""

    offsets: np.ndarray
    types: np.ndarray


def frame_index(buffer: bytes | np.ndarray, *, engine: Engine = "auto") -> FrameIndex:
    """Find every frame of a whole uncompressed stream in one pass.

    Raises `ItchFormatError` at the first malformed frame (the fast path has no skip policy:
    use `read_messages(..., on_error="skip")` for damaged files). `engine` picks numba or the
    plain-Python loop; "auto" uses numba when it is installed.
    """
    array = _as_array(buffer)
    offsets, types, status = scan_frames(array, engine)
    if status >= 0:
        size = (int(array[status]) << 8) | int(array[status + 1]) if status + 1 < len(array) else 2
        kind = int(array[status + 2]) if status + 2 < len(array) and size else None
        raise frame_error(status, size, kind, len(array) - status)
    return FrameIndex(offsets, types)


def decode_columns(
    buffer: bytes | np.ndarray,
    index: FrameIndex | tuple[np.ndarray, np.ndarray],
    letters: str = "AFECXDUP",
    *,
    engine: Engine = "auto",
) -> dict[str, np.ndarray]:
    """Each type of `letters` as a structured array with one row per message, in stream order.

    Columns: `offset` (int64, the frame's offset, to merge types back into stream order), then
    every field by its spec name in native byte order: uint and price fields as uint16/32/64,
    `timestamp` as uint64 ns, alpha fields as fixed-width bytes with their space padding.
    """
    array = _as_array(buffer)
    offsets, types = index
    return {
        letter: _columns(array, offsets[types == ord(letter)], SPECS[letter], engine)
        for letter in letters
    }


def columns_dtype(spec: MessageSpec) -> np.dtype[np.void]:
    """The structured dtype `decode_columns` returns for one message type."""
    names, formats = ["offset"], ["<i8"]
    for field in spec.fields:
        names.append(field.name)
        formats.append(_native_format(field))
    return np.dtype({"names": names, "formats": formats})


def _columns(array: np.ndarray, starts: np.ndarray, spec: MessageSpec, engine: Engine) -> Any:
    rows = gather_rows(array, starts + 2, spec.length, engine)
    wire = rows.view(_wire_dtype(spec)).reshape(len(starts))
    out = np.empty(len(starts), columns_dtype(spec))
    out["offset"] = starts
    for field in spec.fields:
        if field.kind == "timestamp6":
            high = wire["timestamp_high"].astype(np.uint64)
            out["timestamp"] = (high << np.uint64(32)) | wire["timestamp_low"]
        else:
            out[field.name] = wire[field.name]
    return out


def _wire_dtype(spec: MessageSpec) -> np.dtype[np.void]:
    names: list[str] = []
    formats: list[str] = []
    offsets: list[int] = []
    for field in spec.fields:
        if field.kind == "timestamp6":
            names += ["timestamp_high", "timestamp_low"]
            formats += [">u2", ">u4"]
            offsets += [field.offset, field.offset + 2]
        else:
            names.append(field.name)
            formats.append(_native_format(field).replace("<", ">"))
            offsets.append(field.offset)
    layout = {"names": names, "formats": formats, "offsets": offsets, "itemsize": spec.length}
    return np.dtype(layout)  # type: ignore[call-overload,no-any-return]


def _native_format(field: Field) -> str:
    if field.kind == "alpha":
        return f"S{field.width}"
    if field.kind == "timestamp6":
        return "<u8"
    return f"<u{field.width}"


def _as_array(buffer: bytes | np.ndarray) -> np.ndarray:
    if isinstance(buffer, np.ndarray):
        if buffer.dtype != np.uint8 or buffer.ndim != 1:
            raise ValueError(f"buffer must be a 1-d uint8 array, got {buffer.dtype} {buffer.shape}")
        return buffer
    return np.frombuffer(buffer, dtype=np.uint8)


# --- compiled kernels (numba is optional and imported on first use) ------------------------


def _count_frames(buf: np.ndarray, lengths: np.ndarray) -> tuple[int, int]:
    """(well-formed frames from the start, offset of the first bad frame or -1)."""
    n = len(buf)
    pos = 0
    count = 0
    while pos + 2 < n:
        size = (int(buf[pos]) << 8) | int(buf[pos + 1])
        if size == 0 or pos + 2 + size > n or lengths[buf[pos + 2]] != size:
            return count, pos
        count += 1
        pos += 2 + size
    return count, (-1 if pos == n else pos)


def _fill_offsets(buf: np.ndarray, offsets: np.ndarray) -> None:
    pos = 0
    for i in range(len(offsets)):
        offsets[i] = pos
        pos += 2 + ((int(buf[pos]) << 8) | int(buf[pos + 1]))


def _gather(buf: np.ndarray, starts: np.ndarray, out: np.ndarray) -> None:
    width = out.shape[1]
    for i in range(len(starts)):
        start = starts[i]
        for j in range(width):
            out[i, j] = buf[start + j]


class _Kernels(NamedTuple):
    count_frames: Callable[[np.ndarray, np.ndarray], tuple[int, int]]
    fill_offsets: Callable[[np.ndarray, np.ndarray], None]
    gather: Callable[[np.ndarray, np.ndarray, np.ndarray], None]


@functools.cache
def _numba_kernels() -> _Kernels | None:
    try:
        import numba
    except ImportError:
        return None
    jit = numba.njit(nogil=True)
    return _Kernels(jit(_count_frames), jit(_fill_offsets), jit(_gather))


def _kernels(engine: Engine) -> _Kernels | None:
    if engine not in ("auto", "numba", "python"):
        raise ValueError(f"engine must be 'auto', 'numba' or 'python', got {engine!r}")
    kernels = None if engine == "python" else _numba_kernels()
    if kernels is None and engine == "numba":
        raise ValueError("engine='numba' needs numba: pip install 'duetime[itch]'")
    return kernels


def scan_frames(array: np.ndarray, engine: Engine) -> tuple[np.ndarray, np.ndarray, int]:
    """(offsets, type bytes, offset of the first bad frame or -1) of a whole buffer."""
    kernels = _kernels(engine)
    if kernels is None:
        listed, status = _scan_python(array.tobytes())
        offsets = np.array(listed, dtype=np.int64)
    else:
        count, status = kernels.count_frames(array, LENGTH_TABLE)
        offsets = np.empty(count, dtype=np.int64)
        kernels.fill_offsets(array, offsets)
    return offsets, array[offsets + 2], status


def _scan_python(data: bytes) -> tuple[list[int], int]:
    lengths = _LENGTHS
    offsets: list[int] = []
    n = len(data)
    pos = 0
    while pos + 2 < n:
        size = (data[pos] << 8) | data[pos + 1]
        if size == 0 or pos + 2 + size > n or lengths[data[pos + 2]] != size:
            return offsets, pos
        offsets.append(pos)
        pos += 2 + size
    return offsets, (-1 if pos == n else pos)


def gather_rows(array: np.ndarray, starts: np.ndarray, width: int, engine: Engine) -> np.ndarray:
    """A (len(starts), width) uint8 array: `width` bytes from each start."""
    out = np.empty((len(starts), width), dtype=np.uint8)
    kernels = _kernels(engine)
    if kernels is not None:
        kernels.gather(array, starts, out)
        return out
    step = np.arange(width, dtype=np.int64)
    block = 1 << 16  # bounds the (rows, width) index array numpy builds
    for first in range(0, len(starts), block):
        chunk = starts[first : first + block]
        out[first : first + len(chunk)] = array[chunk[:, None] + step]
    return out
