"""CaptureReader: the header and the records of a capture file, checked as they are read."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import orjson

from duetime.tools.capture.format import (
    FILE_HEAD,
    MAGIC,
    MAX_RECORD_BYTES,
    READABLE_VERSIONS,
    RECORD_PREFIX,
    BadField,
    CapturedRequest,
    CaptureFormatError,
    CaptureTruncated,
    decode_record,
)

log = logging.getLogger("duetime.capture")

SKIPS_LOGGED = 10
"""Records skipped (see CaptureReader) that are each logged; past that, one line says so."""


@dataclass(frozen=True, slots=True)
class CaptureHeader:
    """What the file header says."""

    version: int
    """The format version."""
    start_wall_ns: int
    """Wall-clock time (ns since the Unix epoch) of the capture's start: `arrival_ns` 0."""
    meta: dict[str, Any] = field(default_factory=dict)
    """What the writer put there (the server: its settings for the capture)."""
    created_by: str = ""
    size: int = 0
    """Bytes of the file header: the offset of record 0."""


class CaptureReader:
    """Reads a capture file: `header` at once, then records by iterating (once).

    Every record's length and CRC32 are checked; a problem raises CaptureFormatError naming the
    record's index and byte offset: past a bad length or CRC32 nothing can be trusted. A record
    whose CRC32 matches but which does not decode (an unknown flag, a malformed field, an HTTP
    body the parser refuses) is skipped with a warning naming it, and counted in `skipped`
    (`first_skipped` says why): its length prefix, checked with it, says where the next one
    starts, and one such record (a writer's bug) must not make the others unreadable; `strict`
    raises CaptureFormatError for it instead. A file that ends inside a record (a capture still
    being written, or a crashed writer's) raises CaptureTruncated, unless `allow_truncated`:
    then iteration ends there and `truncated` holds the error. `offset` is where the records
    read so far end, so a reader following a live capture can reopen and `skip_to` it later.
    """

    def __init__(
        self, path: str | Path, *, allow_truncated: bool = False, strict: bool = False
    ) -> None:
        self.path = Path(path)
        self.allow_truncated = allow_truncated
        self.strict = strict
        self.truncated: CaptureTruncated | None = None
        self.skipped = 0
        """Records skipped because they do not decode (never with `strict`)."""
        self.first_skipped: CaptureFormatError | None = None
        self.count = 0
        """Records read so far, skipped ones included (the index of the next)."""
        self._file: BinaryIO = self.path.open("rb")
        try:
            self.header = self._read_header()
        except BaseException:
            self._file.close()
            raise
        self.offset = self.header.size

    def _error(self, problem: str, index: int | None, offset: int) -> CaptureFormatError:
        return CaptureFormatError(str(self.path), index, offset, problem)

    def _read_header(self) -> CaptureHeader:
        fixed = self._file.read(FILE_HEAD.size)
        if fixed[: len(MAGIC)] != MAGIC[: len(fixed)] or len(fixed) < len(MAGIC):
            raise self._error(f"not a duetime capture (bad magic {fixed[:8]!r})", None, 0)
        if len(fixed) < FILE_HEAD.size:
            raise CaptureTruncated(str(self.path), None, 0, "the file ends inside its header")
        _, version, _, start_wall, length, crc = FILE_HEAD.unpack(fixed)
        if version not in READABLE_VERSIONS:
            known = ", ".join(map(str, READABLE_VERSIONS))
            raise self._error(
                f"format version {version} is not one this reader knows ({known}); "
                "read it with the duetime that wrote it",
                None, 0,
            )  # fmt: skip
        text = self._file.read(length)
        if len(text) < length:
            raise CaptureTruncated(str(self.path), None, 0, "the file ends inside its header")
        if zlib.crc32(text) != crc:
            raise self._error("header CRC32 mismatch", None, 0)
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise self._error(f"header JSON is not valid: {exc}", None, 0) from None
        if not isinstance(doc, dict) or not isinstance(doc.get("meta", {}), dict):
            raise self._error("header JSON is not an object with a 'meta' object", None, 0)
        return CaptureHeader(
            version, start_wall, doc.get("meta", {}), str(doc.get("created_by", "")),
            FILE_HEAD.size + length,
        )  # fmt: skip

    def skip_to(self, offset: int, count: int) -> None:
        """Continue at `offset`, the end of record `count - 1` (an earlier reader's `offset` and
        `count`)."""
        self._file.seek(offset)
        self.offset, self.count = offset, count

    def __iter__(self) -> Iterator[CapturedRequest]:
        read = self._file.read
        version = self.header.version
        while True:
            index, offset = self.count, self.offset
            prefix = read(RECORD_PREFIX.size)
            if not prefix:
                return
            if len(prefix) < RECORD_PREFIX.size:
                self._cut(
                    index, offset,
                    f"the file ends {len(prefix)} bytes into the record's "
                    f"{RECORD_PREFIX.size}-byte prefix (length and CRC)",
                )  # fmt: skip
                return
            length, crc = RECORD_PREFIX.unpack(prefix)
            if length > MAX_RECORD_BYTES:
                raise self._error(
                    f"record length {length} is implausible (corrupt prefix)", index, offset
                )
            body = read(length)
            if len(body) < length:
                self._cut(
                    index,
                    offset,
                    f"the file ends {len(body)} bytes into a {length}-byte record "
                    f"({length - len(body)} missing: cut short, or its length prefix is corrupt)",
                )
                return
            if zlib.crc32(body) != crc:
                raise self._error(
                    f"CRC32 mismatch ({zlib.crc32(body):#010x}, the prefix says {crc:#010x}): "
                    "the record is corrupt",
                    index, offset,
                )  # fmt: skip
            try:
                record = decode_record(body, version)
            except BadField as exc:
                error = self._error(f"bad field: {exc}", index, offset)
                if self.strict:
                    raise error from None
                self._skip(error)
                self.count, self.offset = index + 1, offset + RECORD_PREFIX.size + length
                continue
            self.count, self.offset = index + 1, offset + RECORD_PREFIX.size + length
            yield record

    def _skip(self, error: CaptureFormatError) -> None:
        self.skipped += 1
        if self.first_skipped is None:
            self.first_skipped = error
        if self.skipped <= SKIPS_LOGGED:
            log.warning("capture record skipped: %s", error)
        if self.skipped == SKIPS_LOGGED:
            log.warning("%s: further records skipped are counted, not logged", self.path)

    def _cut(self, index: int, offset: int, problem: str) -> None:
        """The file ends inside record `index`: raise, or note it and end iteration."""
        error = CaptureTruncated(str(self.path), index, offset, problem)
        if not self.allow_truncated:
            raise error
        self.truncated = error
        self._file.seek(offset)  # a later iteration retries the same record

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> CaptureReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def read_capture(
    path: str | Path, *, allow_truncated: bool = False, strict: bool = False
) -> Iterator[CapturedRequest]:
    """The records of the capture at `path`, in file order (see CaptureReader for the errors
    and the records skipped)."""
    with CaptureReader(path, allow_truncated=allow_truncated, strict=strict) as reader:
        yield from reader


def not_a_file(path: Path, what: str = "capture file") -> str:
    """What `path`, which is no regular file, is instead, as the error about `what` says it.

    NOTE: a link to /dev/null was "no such capture file" to `duetime replay` (it is there: a
    device), and `duetime capture show` of a folder said "[Errno 21] Is a directory" where
    replay said "a folder, not a capture file" (found by a tester)."""
    if path.is_dir():
        return f"a folder, not a {what}"
    if path.exists():
        return f"not a regular file, so no {what}"
    return f"no such {what}"
