"""Recorder: the server's traffic capture; samples requests on the event loop, writes them on a
thread of its own.

The event loop does O(1) work per sampled request and adds no callback: at submit it reads the
clock, gives the ticket the clock to stamp its own completion with (`Ticket.stamp`, read when
the request settles), and appends a small tuple (references to the request and its ticket, no
copies) to a bounded deque. The writer thread wakes every `flush_s` (or when stopped), writes
the requests that have settled since (many records per `write`; an HTTP request as the body it
came in, others field by field) and keeps the rest for its next turn. When the buffer is full a
sample is dropped and counted: requests never wait. A write error (disk full, file size limit,
I/O error) stops the capture, not the server: logged once, the buffer let go, every sample from
then on counted failed.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from duetime.clock import Clock, MonotonicClock
from duetime.errors import DuetimeError
from duetime.frontend.sharedmemory import REGION
from duetime.observability.tracing import parse_traceparent
from duetime.tools.capture.format import (
    encode_http_record,
    encode_record,
    output_parameters_of,
    tensors_of,
)
from duetime.tools.capture.writer import CaptureWriter

if TYPE_CHECKING:
    from duetime.engine import Ticket
    from duetime.types import InferRequest

log = logging.getLogger("duetime.capture")

CANCELLED_STATUS = 499
"""The status recorded for a request its client gave up on (nginx's "client closed request"),
and for one still unfinished when the capture closed (see UNFINISHED)."""
UNFINISHED = "unfinished at shutdown: the capture closed before the request settled"
"""The error recorded for a request still running when the recorder stopped."""
_BATCH = 64
"""Records encoded per `write`: each write lets go of the GIL, so the event loop waits at most
this many records' encoding for it (about 0.2 ms)."""

_Item = tuple[int, int, "InferRequest", "Ticket | None", "Exception | None", "Mapping[str, str]"]
"""arrival_ns; when submit raised (0 for a ticket: it stamps its own `done_ns`); the request;
its ticket (None: refused by submit); the error submit raised; its headers."""


@dataclass(frozen=True, slots=True)
class RecorderStatistics:
    """Counts since the recorder started."""

    sampled: int
    """Requests chosen by sampling (written + dropped + failed + still buffered)."""
    written: int
    dropped: int
    """Samples left out because the buffer was full (the writer could not keep up)."""
    failed: int
    """Samples not recorded for an error: one that could not be encoded (a value the format
    cannot hold; logged), and, once a write failed (the capture stopped, see `stopped`), those
    that write held and every sample since."""
    buffered: int
    """Samples held: not yet settled, or settled and not yet written (they count against the
    buffer's bound)."""
    stopped: str | None = None
    """Why the capture stopped before `stop()`: the write error (None: it records)."""


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
        clock = clock or MonotonicClock()
        # The real clock without MonotonicClock's frame: it is read twice per request.
        self._now = time.monotonic_ns if type(clock) is MonotonicClock else clock.now_ns
        self._flush_s = flush_s
        self._random = (rng or random.Random()).random
        self._meta = {
            "source": "duetime serve", "sample": sample, "outputs": outputs,
            "host": os.uname().nodename, "pid": os.getpid(), **(meta or {}),
        }  # fmt: skip
        self._buffer: deque[_Item] = deque()
        """Pushed by the loop, taken by the writer."""
        self._pending: list[_Item] = []
        """The writer's: taken from the buffer before they settled, in arrival order."""
        self._unstamped: list[_Item] = []
        """The writer's: settled but not yet stamped at its last turn (see `_drain`)."""
        self._wake = threading.Event()
        self._stopping = False
        self._closed = False
        self._writer: CaptureWriter | None = None
        self._thread: threading.Thread | None = None
        self._start_ns = 0
        self._warned = False
        self._broken: Exception | None = None
        """The error that stopped the capture (set by the writer; then `_closed` too)."""
        # Each counter is changed by one thread only: sampled/dropped/lost on the loop, the
        # others by whoever writes (the writer thread; the stopping thread once it has joined
        # it). Requests held (buffered or pending) = sampled - dropped - lost - written - failed.
        self._sampled = 0
        self._dropped = 0
        self._lost = 0
        """Samples refused because the capture had stopped at a write error."""
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
        """Write what is buffered, close the file, and log the counts (blocks: off the loop).
        Requests not settled by then are written as unfinished (status 499, error UNFINISHED):
        stop the engine first."""
        if self._thread is not None:
            self._stopping = True
            self._wake.set()
            self._thread.join()
            self._thread = None
        self._closed = True  # what arrives from here on is dropped
        if self._writer is not None:
            # What arrived or settled while the thread finished; the unsettled as unfinished.
            self._drain(self._writer, final=True)
            try:
                self._writer.close()
            except OSError as exc:
                self._stop_on(exc)
        stats = self.statistics()
        log.info(
            "capture %s closed: %d requests written, %d dropped (buffer full), %d failed",
            self.path, stats.written, stats.dropped, stats.failed,
        )  # fmt: skip
        if stats.stopped is not None:
            log.warning(
                "capture %s stopped early (%s): %d sampled requests were not recorded",
                self.path, stats.stopped, stats.failed,
            )  # fmt: skip
        if stats.dropped:
            log.warning(
                "capture %s: %d sampled requests were dropped because the writer fell behind; "
                "raise --record-buffer or lower --record-sample",
                self.path, stats.dropped,
            )  # fmt: skip
        return stats

    def statistics(self) -> RecorderStatistics:
        # The writer's counts first: read from another thread, the held count is never negative.
        written, failed = self._written, self._failed
        sampled, dropped, failed = self._sampled, self._dropped, failed + self._lost
        broken = self._broken
        return RecorderStatistics(
            sampled, written, dropped, failed, sampled - written - dropped - failed,
            None if broken is None else _reason(broken),
        )  # fmt: skip

    # -- on the event loop ---------------------------------------------------------------------

    def sampled(self) -> bool:
        """Whether to record the next request (one random draw unless the share is 0 or 1)."""
        share = self.share
        return share >= 1.0 or (share > 0.0 and self._random() < share)

    def record(self, request: InferRequest, submit: Callable[[InferRequest], Ticket]) -> Ticket:
        """`submit(request)`, recording the request and its outcome; raises what submit raises."""
        now = self._now
        # (the front end's receipt, from which the request's due time counts: stamped here,
        # after decoding, a capture's `due_in_ns` understated the client's budget)
        arrival = request.arrival_ns or now()
        headers = request.headers
        if type(headers) is not dict:
            # NOTE: gRPC metadata is read from the call object, which only the loop may touch.
            headers = dict(headers)
        try:
            ticket = submit(request)
        except Exception as exc:
            self._push((arrival, now(), request, None, exc, headers))
            raise
        ticket.stamp = now  # (on a dropped sample too: one wasted clock read, no branch)
        self._push((arrival, 0, request, ticket, None, headers))
        return ticket

    def _push(self, item: _Item) -> None:
        held = self._sampled - self._dropped - self._lost - self._written - self._failed
        self._sampled += 1
        if self._closed or held >= self.capacity:
            if self._broken is None:
                self._dropped += 1
            else:
                self._lost += 1
        else:
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
            try:
                self._drain(writer)
            except Exception as exc:  # (a bug: write errors are handled in `_write`)
                log.exception("capture %s: the writer failed", self.path)
                self._stop_on(exc)
            if stopping:
                return

    def _drain(self, writer: CaptureWriter, final: bool = False) -> None:
        """Write the requests that have settled; keep the others, in order, for the next turn
        (`final`: write them all, the unsettled ones as UNFINISHED).

        NOTE: this thread reads tickets and futures the loop settles, without a lock. In
        CPython that is safe: the loop settles a future (its state, then its result) and then
        stamps the ticket (`Ticket._settled`), each step under the GIL, so a nonzero `done_ns`
        means the future is done and its result or exception is there to read, and a future
        seen done never changes again. A future settled but not yet stamped (the loop lost
        the GIL between the two steps) waits one turn for its stamp; one still unstamped then
        (settled by a path that does not call `_settled`) and a cancelled one (cancellation
        does not call it) get this thread's clock instead: a latency up to `flush_s` long.
        """
        if self._broken is not None:
            self._discard()
            return
        now = self._now
        unstamped, self._unstamped = self._unstamped, []
        pending, self._pending = self._pending, []
        buffer = self._buffer
        pending += [buffer.popleft() for _ in range(len(buffer))]
        ready: list[tuple[_Item, int, str | None]] = []
        for item in unstamped:
            ticket = item[3]
            assert ticket is not None
            ready.append((item, ticket.done_ns or now(), None))
        for item in pending:
            ticket = item[3]
            if ticket is None:
                ready.append((item, item[1], None))
            elif ticket.done_ns:
                ready.append((item, ticket.done_ns, None))
            elif not ticket.future.done():
                if final:
                    ready.append((item, now(), UNFINISHED))
                else:
                    self._pending.append(item)
            elif final or ticket.future.cancelled():
                ready.append((item, now(), None))
            else:
                self._unstamped.append(item)
        self._write(writer, ready)

    def _write(self, writer: CaptureWriter, ready: list[tuple[_Item, int, str | None]]) -> None:
        chunks: list[bytes] = []
        count = settled = 0  # (settled: written, or failed to encode)
        try:
            for item, done, unfinished in ready:
                try:
                    chunks += self._encode(item, done, unfinished)
                except Exception as exc:
                    self._failed += 1
                    settled += 1
                    if not self._warned:
                        self._warned = True
                        log.warning("capture: a request could not be recorded: %r", exc)
                    continue
                count += 1
                if count == _BATCH:
                    writer.write_encoded(chunks, count)
                    self._written += count
                    settled += count
                    chunks, count = [], 0
            if count:
                writer.write_encoded(chunks, count)
                self._written += count
                settled += count
            writer.flush()
        except OSError as exc:
            self._failed += len(ready) - settled
            self._stop_on(exc)

    def _stop_on(self, exc: Exception) -> None:
        """Stop the capture at `exc` (a write error): log it once, let go of what is held, and
        refuse samples from now on (counted failed); the server is not affected.

        NOTE: a tester's capture hit its file size limit (EFBIG): this thread died with an
        uncaught traceback, nothing was counted failed, the buffer filled to --record-buffer
        (holding every sample's tensors) and each later request was reported as dropped
        because 'the writer fell behind'. Retrying would fail the same way (a full disk, a size
        limit, a failing device) and write records out of order."""
        if self._broken is not None:
            return
        self._broken = exc
        self._closed = True
        log.error(
            "capture %s stopped: %s; the server serves on, recording nothing more "
            "(%d requests were written; the file ends at the last whole one)",
            self.path, _reason(exc), self._written,
        )  # fmt: skip
        self._discard()

    def _discard(self) -> None:
        """Let go of every sample held (the capture stopped), counting them failed."""
        buffer = self._buffer
        held = [buffer.popleft() for _ in range(len(buffer))]
        held += self._pending + self._unstamped
        self._pending, self._unstamped = [], []
        self._failed += len(held)

    def _encode(self, item: _Item, done: int, unfinished: str | None) -> Sequence[bytes]:
        arrival, _, request, ticket, refusal, headers = item
        error: str | None = None
        outputs = answered = variant = None
        if ticket is None:
            assert refusal is not None
            status, error = _failure(refusal)
        else:
            answered, variant = ticket.version or None, ticket.variant
            future = ticket.future
            if unfinished is not None:
                status, error = CANCELLED_STATUS, unfinished
            elif future.cancelled():
                status, error = CANCELLED_STATUS, "cancelled by the client before its answer"
            elif (exc := future.exception()) is not None:
                status, error = _failure(exc)
            else:
                status = 200
                if self.outputs:
                    outputs = tensors_of(_answer_of(ticket))
        trace_id = None
        traceparent = headers.get("traceparent")
        if traceparent is not None:
            parent = parse_traceparent(traceparent)
            trace_id = None if parent is None else parent.trace_id_hex
        due = request.due_ns
        due_in = None if due is None else due - arrival
        wire = request.wire
        # NOTE: positional: this runs for every captured request (see encode_record).
        if wire is not None and _holds_its_data(*wire):
            return encode_http_record(
                arrival - self._start_ns, request.model, request.version, wire[0], wire[1],
                due_in, request.priority, headers, trace_id, status, error, done - arrival,
                answered, variant, outputs,
            )  # fmt: skip
        return encode_record(
            arrival - self._start_ns, request.protocol, request.model, request.version,
            request.id, tensors_of(request.inputs), request.outputs, request.parameters,
            due_in, request.priority, headers, trace_id, status, error, done - arrival,
            answered, variant, outputs, output_parameters_of(request.classes),
        )  # fmt: skip


def _answer_of(ticket: Ticket) -> Mapping[str, Any]:
    """The outputs the client got for a request that succeeded: those it asked for, each
    output it asked to classify as its top classes (BYTES, as the answer carries them).

    NOTE: the model's raw output was once recorded where the client asked for
    `classification`: FP32 scores where the client got "score:index" strings, so a replay
    with --compare-outputs against the very same server reported every such answer as a
    difference ("datatype BYTES, recorded FP32") and exited 3."""
    if ticket.classes:
        return ticket.response().outputs
    produced = ticket.future.result()
    return {name: produced[name] for name in ticket.outputs}


_REGION_KEY = REGION.encode()


def _holds_its_data(body: bytes, header_length: int | None) -> bool:
    """Whether a v2 REST body holds its request whole, so that it can be kept as it came: not
    when an input's data or an output's destination is in shared memory (the body names only
    the region, and a capture reader has no regions: it could not decode the body).

    NOTE: a tester's capture with one such request was refused whole by every reader ("the
    HTTP body does not decode: shared memory is not available here"). The JSON names a region
    only with the key `shared_memory_region`, spelt out or with `\\u` escapes (no other JSON
    escape makes any of its characters), so a JSON part with neither holds no region; one with
    either (a string that merely contains them, say) is written field by field, which always
    reads. A search of the JSON part, no parse: this thread shares the GIL with the loop."""
    end = len(body) if header_length is None else header_length
    if type(body) is not bytes:  # (a body read in place is a memoryview: no `find`)
        body = bytes(memoryview(body)[:end])
    return body.find(_REGION_KEY, 0, end) < 0 and body.find(b"\\u", 0, end) < 0


def _reason(exc: Exception) -> str:
    """A write error as words: 'writing it failed: File too large (errno 27)'."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"writing it failed: {exc.strerror} (errno {exc.errno})"
    return f"writing it failed: {type(exc).__name__}: {exc}"


def _failure(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, DuetimeError):
        return exc.http_status, exc.message
    return 500, f"internal error: {type(exc).__name__}: {exc}"
