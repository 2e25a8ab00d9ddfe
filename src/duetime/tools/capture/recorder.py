"""Recorder: the server's traffic capture; samples requests on the event loop, writes them on a
thread of its own.

The event loop does O(1) work per sampled request: two clock reads, a done-callback on its
future and an append of a small tuple (references to the request, its ticket and future, no
copies) to a bounded deque. The writer thread wakes every `flush_s` (or when stopped), encodes
what is buffered (struct headers, the arrays' raw bytes, many records per `write`) and hands it
to the OS. When the buffer is full a sample is dropped and counted: requests never wait.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from duetime.clock import Clock, MonotonicClock
from duetime.errors import DuetimeError
from duetime.observability.tracing import parse_traceparent
from duetime.tools.capture.format import encode_record, tensors_of
from duetime.tools.capture.writer import CaptureWriter

if TYPE_CHECKING:
    import asyncio

    from duetime.engine import Ticket
    from duetime.execution.executor import Feeds
    from duetime.types import InferRequest

log = logging.getLogger("duetime.capture")

CANCELLED_STATUS = 499
"""The status recorded for a request its client gave up on (nginx's "client closed request")."""
_BATCH = 64
"""Records encoded per `write`: each write lets go of the GIL, so the event loop waits at most
this many records' encoding for it (about 0.2 ms)."""

_Item = tuple[int, int, "InferRequest", "Ticket | None", "Any", "Mapping[str, str]"]
"""arrival_ns, done_ns, the request, its ticket (None: refused by submit), its future (or the
error submit raised), its headers."""


@dataclass(frozen=True, slots=True)
class RecorderStatistics:
    """Counts since the recorder started."""

    sampled: int
    """Requests chosen by sampling (written + dropped + failed + still buffered)."""
    written: int
    dropped: int
    """Samples left out because the buffer was full (the writer could not keep up)."""
    failed: int
    """Samples that could not be encoded (a value the format cannot hold; logged)."""
    buffered: int


class Recorder:
    """Captures a `sample` share of the engine's requests into the capture file at `path`.

    `start()` creates the file (FileExistsError if it exists: a capture is never overwritten)
    and the writer thread; then the engine calls `sampled()` and `record()` for each request
    (on its loop). `stop()` (blocking: call it off the loop) writes what is buffered and closes
    the file. `outputs` also records each answer's tensors; `buffer` bounds the requests held
    for the writer (they keep their input arrays alive until written).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        sample: float = 1.0,
        outputs: bool = False,
        buffer: int = 8192,
        clock: Clock | None = None,
        flush_s: float = 0.02,
        rng: random.Random | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if not 0.0 <= sample <= 1.0:
            raise ValueError(f"sample must be between 0 and 1, got {sample}")
        if buffer < 1:
            raise ValueError(f"buffer must be at least 1, got {buffer}")
        self.path = Path(path)
        self.share = sample
        self.outputs = outputs
        self.capacity = buffer
        self._now = (clock or MonotonicClock()).now_ns
        self._flush_s = flush_s
        self._random = (rng or random.Random()).random
        self._meta = {
            "source": "duetime serve", "sample": sample, "outputs": outputs,
            "host": os.uname().nodename, "pid": os.getpid(), **(meta or {}),
        }  # fmt: skip
        self._buffer: deque[_Item] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._closed = False
        self._writer: CaptureWriter | None = None
        self._thread: threading.Thread | None = None
        self._start_ns = 0
        self._warned = False
        # Each counter is changed by one thread only: sampled/dropped on the loop, the others
        # by whoever writes (the writer thread; the stopping thread once it has joined it).
        self._sampled = 0
        self._dropped = 0
        self._written = 0
        self._failed = 0

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Create the capture file and start the writer thread."""
        self._writer = CaptureWriter(self.path, meta=self._meta, overwrite=False)
        self._start_ns = self._now()
        self._thread = threading.Thread(target=self._run, name="duetime-capture", daemon=True)
        self._thread.start()
        log.info("capturing %.0f%% of requests to %s", self.share * 100, self.path)

    def stop(self) -> RecorderStatistics:
        """Write what is buffered, close the file, and log the counts (blocks: off the loop)."""
        if self._thread is not None:
            self._stopping = True
            self._wake.set()
            self._thread.join()
            self._thread = None
        self._closed = True  # what arrives from here on is dropped
        if self._writer is not None:
            self._drain(self._writer)  # what arrived while the thread finished
            self._writer.close()
        stats = self.statistics()
        log.info(
            "capture %s closed: %d requests written, %d dropped (buffer full), %d failed",
            self.path, stats.written, stats.dropped, stats.failed,
        )  # fmt: skip
        if stats.dropped:
            log.warning(
                "capture %s: %d sampled requests were dropped because the writer fell behind; "
                "raise --record-buffer or lower --record-sample",
                self.path, stats.dropped,
            )  # fmt: skip
        return stats

    def statistics(self) -> RecorderStatistics:
        return RecorderStatistics(
            self._sampled, self._written, self._dropped, self._failed, len(self._buffer)
        )

    # -- on the event loop ---------------------------------------------------------------------

    def sampled(self) -> bool:
        """Whether to record the next request (one random draw unless the share is 0 or 1)."""
        share = self.share
        return share >= 1.0 or (share > 0.0 and self._random() < share)

    def record(self, request: InferRequest, submit: Callable[[InferRequest], Ticket]) -> Ticket:
        """`submit(request)`, recording the request and its outcome; raises what submit raises."""
        now = self._now
        arrival = now()
        try:
            ticket = submit(request)
        except Exception as exc:
            self._push((arrival, now(), request, None, exc, request.headers))
            raise
        ticket.future.add_done_callback(functools.partial(self._settled, arrival, request, ticket))
        return ticket

    def _settled(
        self, arrival: int, request: InferRequest, ticket: Ticket, future: asyncio.Future[Feeds]
    ) -> None:
        self._push((arrival, self._now(), request, ticket, future, request.headers))

    def _push(self, item: _Item) -> None:
        self._sampled += 1
        if self._closed or len(self._buffer) >= self.capacity:
            self._dropped += 1
            return
        headers = item[5]
        if type(headers) is not dict:
            # NOTE: gRPC metadata is read from the call object, which only the loop may touch.
            item = (*item[:5], dict(headers))
        self._buffer.append(item)

    # -- on the writer thread ------------------------------------------------------------------

    def _run(self) -> None:
        writer = self._writer
        assert writer is not None
        while True:
            # NOTE: a timed wait, not a wake-up per record: waking this thread for each
            # request would make it contend with the event loop for the GIL at every request.
            self._wake.wait(self._flush_s)
            stopping = self._stopping
            self._drain(writer)
            if stopping:
                return

    def _drain(self, writer: CaptureWriter) -> None:
        buffer = self._buffer
        chunks: list[bytes] = []
        count = 0
        while buffer:
            item = buffer.popleft()
            try:
                chunks.extend(self._encode(item))
            except Exception as exc:
                self._failed += 1
                if not self._warned:
                    self._warned = True
                    log.warning("capture: a request could not be recorded: %r", exc)
                continue
            count += 1
            if count == _BATCH:
                writer.write_encoded(chunks, count)
                self._written += count
                chunks, count = [], 0
        if count:
            writer.write_encoded(chunks, count)
            self._written += count
        writer.flush()

    def _encode(self, item: _Item) -> tuple[bytes, bytes]:
        arrival, done, request, ticket, outcome, headers = item
        error: str | None = None
        outputs = answered = variant = None
        if ticket is None:
            status, error = _failure(outcome)
        else:
            answered, variant = ticket.version or None, ticket.variant
            if outcome.cancelled():
                status, error = CANCELLED_STATUS, "cancelled by the client before its answer"
            elif (exc := outcome.exception()) is not None:
                status, error = _failure(exc)
            else:
                status = 200
                if self.outputs:
                    produced = outcome.result()
                    outputs = tensors_of({name: produced[name] for name in ticket.outputs})
        trace_id = None
        traceparent = headers.get("traceparent")
        if traceparent is not None:
            parent = parse_traceparent(traceparent)
            trace_id = None if parent is None else parent.trace_id_hex
        due = request.due_ns
        # NOTE: positional: this runs for every captured request (see encode_record).
        return encode_record(
            arrival - self._start_ns, request.protocol, request.model, request.version,
            request.id, tensors_of(request.inputs), request.outputs, request.parameters,
            None if due is None else due - arrival, request.priority, headers, trace_id, status,
            error, done - arrival, answered, variant, outputs,
        )  # fmt: skip


def _failure(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, DuetimeError):
        return exc.http_status, exc.message
    return 500, f"internal error: {type(exc).__name__}: {exc}"
