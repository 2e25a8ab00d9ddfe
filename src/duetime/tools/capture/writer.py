"""CaptureWriter: creates a capture file and appends records to it."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from duetime import __version__
from duetime.tools.capture.format import CapturedRequest, encode_captured, encode_file_head

FLUSH_BYTES = 1 << 20
"""`write` hands records to the OS once this many bytes are gathered."""


class CaptureWriter:
    """A new capture file at `path`, its header written at once; `write` appends one record.

    `meta` (JSON-able) goes in the header for readers (what was captured, where). The capture
    starts now: `start_mono_ns` is the monotonic instant records' `arrival_ns` count from, and
    the header holds the matching wall-clock time. An existing file raises FileExistsError
    unless `overwrite` is True: a capture is never replaced by accident (one a recording server
    is still writing, say). Records are gathered up to FLUSH_BYTES: a
    reader sees them after that, `flush()` or `close()` (a file written by a process that died
    may end inside a record: CaptureReader reports it). A write that fails (OSError: disk full,
    file size limit, I/O error) raises, after cutting the file back to the end of the last
    record written whole where it can, so that it still reads to there.
    Not thread-safe: one thread writes.
    """

    def __init__(
        self, path: str | Path, *, meta: dict[str, Any] | None = None, overwrite: bool = False
    ) -> None:
        self.path = Path(path)
        self.start_wall_ns = time.time_ns()
        self.start_mono_ns = time.monotonic_ns()
        self.records = 0
        """Records written so far."""
        # Unbuffered: records are gathered here and written in large pieces, and each write
        # is a system call, which lets go of the GIL (the server's writer thread shares it with
        # the event loop).
        self._file = self.path.open("wb" if overwrite else "xb", buffering=0)
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._size = 0
        """Bytes in the file: the end of the last record written whole."""
        header = {"created_by": f"duetime {__version__}", "meta": meta or {}}
        self._write_all(encode_file_head(self.start_wall_ns, header))

    def write(self, record: CapturedRequest) -> None:
        """Append `record` (raises BadField for a value the format cannot hold, writing nothing)."""
        prefix, body = encode_captured(record)
        self._pending += (prefix, body)
        self._pending_bytes += len(prefix) + len(body)
        self.records += 1
        if self._pending_bytes >= FLUSH_BYTES:
            self.flush()

    def write_encoded(self, chunks: Iterable[bytes], count: int) -> None:
        """Append `count` records already encoded (prefix, body, prefix, ...) in one write."""
        self.flush()
        self._write_all(b"".join(chunks))
        self.records += count

    def flush(self) -> None:
        """Hand the records written so far to the operating system (readers then see them)."""
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            self._pending_bytes = 0
            self._write_all(data)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                written = self._file.write(view)
                view = view[written or 0 :]
        except OSError:
            self._cut_back()
            raise
        self._size += len(data)

    def _cut_back(self) -> None:
        """Take off the part of a record a failed write left (a disk that filled in the middle
        of a write), so that a reader reads the file to its last whole record, not to an error."""
        try:
            self._file.truncate(self._size)
            self._file.seek(self._size)
        except OSError:
            pass  # (a device that cannot: the reader reports the record cut short)

    def close(self) -> None:
        if not self._file.closed:
            try:
                self.flush()
            finally:
                self._file.close()

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
