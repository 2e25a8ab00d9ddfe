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
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote

from duetime.clock import Clock, MonotonicClock
from duetime.errors import DuetimeError
from duetime.frontend.parameters import priority_of as priority_of_parameters
from duetime.frontend.rest import parse_header_length, parse_infer_request
from duetime.frontend.sharedmemory import REGION
from duetime.observability.tracing import parse_traceparent
from duetime.tools.capture.format import (
    BadField,
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
_SHED_BUSY = 0.05
"""The share of its time the writer may spend writing and still record the requests the load
shedder refuses (see `Recorder.refused_unread`)."""
_BATCH = 64
"""Records encoded per `write`: each write lets go of the GIL, so the event loop waits at most
this many records' encoding for it (about 0.2 ms)."""


class _Unread(NamedTuple):
    """A request refused before it was decoded (see `Recorder.refused_unread`)."""

    protocol: str
    target: bytes
    data: bytes
    due_in_ns: int | None


_Item = tuple[
    int, int, "InferRequest | _Unread", "Ticket | None", "Exception | None", "Mapping[str, str]"
]
"""arrival_ns; when submit raised (0 for a ticket: it stamps its own `done_ns`); the request
(or, refused unread, its bytes); its ticket (None: refused by submit or unread); the error it
was refused with; its headers."""


@dataclass(frozen=True, slots=True)
class RecorderStatistics:
    """Counts since the recorder started."""

    sampled: int
    """Requests chosen by sampling (written + dropped + failed + still buffered)."""
    written: int
    dropped: int
    """Samples left out because the buffer was full (the writer could not keep up), and those
    of requests the load shedder refused while the writer was busy (`skipped`)."""
    failed: int
    """Samples not recorded for an error: one that could not be encoded (a value the format
    cannot hold; logged), and, once a write failed (the capture stopped, see `stopped`), those
    that write held and every sample since."""
    buffered: int
    """Samples held: not yet settled, or settled and not yet written (they count against the
    buffer's bound)."""
    stopped: str | None = None
    """Why the capture stopped before `stop()`: the write error (None: it records)."""
    skipped: int = 0
    """Of `dropped`: samples of requests the load shedder refused, left out because the writer
    was busy (see `Recorder.refused_unread`)."""


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
        self._skipped = 0
        """Of `_dropped`: shed samples left out while the writer was busy."""
        self._busy = 0.0
        """The share of its time the writer spent writing, lately (the writer's)."""

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Create the capture file (and its missing folders, as the other tools' outputs) and
        start the writer thread."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
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
            "capture %s closed: %d requests written, %d dropped (the writer behind), %d failed",
            self.path, stats.written, stats.dropped, stats.failed,
        )  # fmt: skip
        if stats.stopped is not None:
            log.warning(
                "capture %s stopped early (%s): %d sampled requests were not recorded",
                self.path, stats.stopped, stats.failed,
            )  # fmt: skip
        if stats.skipped:
            log.warning(
                "capture %s: %d requests refused by the load shedder were not recorded (the "
                "writer was busy: recording them would have taken from the overloaded server); "
                "the capture holds less than the load received; lower --record-sample",
                self.path, stats.skipped,
            )  # fmt: skip
        if stats.dropped > stats.skipped:
            log.warning(
                "capture %s: %d sampled requests were dropped because the writer fell behind; "
                "raise --record-buffer or lower --record-sample",
                self.path, stats.dropped - stats.skipped,
            )  # fmt: skip
        return stats

    def statistics(self) -> RecorderStatistics:
        # The writer's counts first: read from another thread, the held count is never negative.
        written, failed = self._written, self._failed
        sampled, dropped, failed = self._sampled, self._dropped, failed + self._lost
        broken = self._broken
        return RecorderStatistics(
            sampled, written, dropped, failed, sampled - written - dropped - failed,
            None if broken is None else _reason(broken), self._skipped,
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

    def refused_unread(
        self,
        protocol: str,
        target: bytes,
        data: bytes,
        headers: Mapping[str, str],
        error: DuetimeError,
        due_in_ns: int | None = None,
    ) -> None:
        """Record a request refused before it was decoded (the load shedder's), sampled as
        any: `data` is its HTTP body (`target`: its request target) or its serialised gRPC
        ModelInferRequest, `error` what it was refused with, `due_in_ns` its gRPC deadline.

        NOTE: a recording server at overload once left every shed request out of the capture,
        uncounted: 3,411 of 4,464 requests refused 429, a capture of 1,053 and a rate a third of
        what the server received, so a replay offered a third of the load. The loop does what
        it does for any sampled request (a draw, a clock read, an append: nothing is decoded
        or copied); the writer thread decodes the request to check that it reads back (a
        capture reader refuses a capture with a record that does not decode), and one that does
        not (it would have been refused 400) is counted failed. But while the writer is busy
        (`_SHED_BUSY`: writing big tensors at a high rate) a shed sample is only counted,
        `skipped`: recording the shed requests of 600 KB inputs at 1,500/s on two cores cut the
        requests the overloaded server answered by more than half; the shedder refuses
        requests to keep the server's answers going, and the recorder must not undo that."""
        share = self.share
        if share < 1.0 and not (share > 0.0 and self._random() < share):
            return
        if self._busy > _SHED_BUSY and self._broken is None:
            self._sampled += 1
            self._dropped += 1
            self._skipped += 1
            return
        now = self._now()
        if type(headers) is not dict:
            headers = dict(headers)
        unread = _Unread(protocol, target, data, due_in_ns)
        self._push((now, now, unread, None, error, headers))

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
            waited = time.perf_counter()
            self._wake.wait(self._flush_s)
            began = time.perf_counter()
            stopping = self._stopping
            try:
                self._drain(writer)
            except Exception as exc:  # (a bug: write errors are handled in `_write`)
                log.exception("capture %s: the writer failed", self.path)
                self._stop_on(exc)
            ended = time.perf_counter()
            busy = (ended - began) / max(ended - waited, 1e-9)
            self._busy = (self._busy + busy) / 2  # (the last turns, the latest most)
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
        if type(request) is _Unread:
            assert refusal is not None
            return self._encode_unread(arrival, request, refusal, headers)
        assert not isinstance(request, _Unread)  # (for mypy: `type() is` does not narrow)
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
            elif (exc := ticket.failure()) is not None:
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
                self._since_start(arrival), request.model, request.version, wire[0], wire[1],
                due_in, request.priority, headers, trace_id, status, error, done - arrival,
                answered, variant, outputs,
            )  # fmt: skip
        return encode_record(
            self._since_start(arrival), request.protocol, request.model, request.version,
            request.id, tensors_of(request.inputs), request.outputs, request.parameters,
            due_in, request.priority, headers, trace_id, status, error, done - arrival,
            answered, variant, outputs, output_parameters_of(request.classes),
        )  # fmt: skip

    def _since_start(self, arrival: int) -> int:
        """A record's `arrival_ns`: from the capture's start, 0 for a request that came before
        it (dated by its front end from the turn that read it, or a tick before: the reader
        refuses an arrival before the start, see format.decode_record)."""
        since = arrival - self._start_ns
        return since if since > 0 else 0

    def _encode_unread(
        self, arrival: int, unread: _Unread, refusal: Exception, headers: Mapping[str, str]
    ) -> Sequence[bytes]:
        """A request refused unread (`refused_unread`), decoded here, off the loop."""
        status, error = _failure(refusal)
        trace_id = None
        traceparent = headers.get("traceparent")
        if traceparent is not None:
            parent = parse_traceparent(traceparent)
            trace_id = None if parent is None else parent.trace_id_hex
        if unread.protocol == "http":
            model, version = _infer_target(unread.target)
            body = _inflated(unread.data, headers.get("content-encoding"))
            length = headers.get("inference-header-content-length")
            try:  # (as the server and a capture reader decode it: see format._decode_http)
                header_length = parse_header_length(length, len(body))
                request, _ = parse_infer_request(body, header_length, model, version)
            except DuetimeError as exc:
                raise BadField(f"the HTTP body does not decode: {exc.message}") from None
            timeout = request.parameters.get("timeout")
            due_in = timeout * 1000 if type(timeout) is int and timeout > 0 else None
            return encode_http_record(
                self._since_start(arrival), model, version, body, header_length, due_in,
                _priority(request.parameters), headers, trace_id, status, error,
                0, None, None, None,
            )  # fmt: skip
        from duetime.frontend.grpc import unread_infer_request  # (the writer's first call)

        try:
            request = unread_infer_request(unread.data)
        except DuetimeError as exc:
            raise BadField(f"the gRPC request does not decode: {exc.message}") from None
        return encode_record(
            self._since_start(arrival), unread.protocol, request.model, request.version,
            request.id, tensors_of(request.inputs), request.outputs, request.parameters,
            unread.due_in_ns, request.priority, headers, trace_id, status, error, 0, None, None,
            None, output_parameters_of(request.classes),
        )  # fmt: skip


def _answer_of(ticket: Ticket) -> Mapping[str, Any]:
    """The outputs the client got for a request that succeeded: those it asked for, each
    output it asked to classify as its top classes (BYTES, as the answer carries them).

    NOTE: the model's raw output was once recorded where the client asked for
    `classification`: FP32 scores where the client got "score:index" strings, so a replay
    with --compare-outputs against the very same server reported every such answer as a
    difference ("datatype BYTES, recorded FP32") and exited 3."""
    if ticket.classes or ticket.units:  # (as the client got them: see `Ticket.units`)
        return ticket.response().outputs
    produced = ticket.future.result()
    return {name: produced[name] for name in ticket.outputs}


def _priority(parameters: Mapping[str, Any]) -> int:
    """The request's priority parameter (0: none, or one the server would have refused)."""
    try:
        return priority_of_parameters(parameters)
    except DuetimeError:
        return 0


def _infer_target(target: bytes) -> tuple[str, str | None]:
    """The model and version a v2 REST inference target names (`/v2/models/M[/versions/V]/infer`);
    BadField for another."""
    path = target.split(b"?", 1)[0].decode("latin-1")
    parts = [unquote(part) for part in path.strip("/").split("/")]
    if parts[:2] == ["v2", "models"] and parts[-1:] == ["infer"]:
        if len(parts) == 4:
            return parts[2], None
        if len(parts) == 6 and parts[3] == "versions":
            return parts[2], parts[4]
    raise BadField(f"'{path}' is not a v2 inference target")


_MAX_INFLATED = 1 << 30


def _inflated(body: bytes, encoding: str | None) -> bytes:
    """`body` with its Content-Encoding (gzip, deflate) undone; BadField where it cannot be."""
    kind = (encoding or "identity").strip().lower()
    if kind in ("", "identity"):
        return body
    if kind not in ("gzip", "deflate"):
        raise BadField(f"Content-Encoding '{encoding}' is not supported")
    inflater = zlib.decompressobj(wbits=31 if kind == "gzip" else 15)
    try:
        data = inflater.decompress(body, _MAX_INFLATED)
    except zlib.error as exc:
        raise BadField(f"body is not valid {kind} data: {exc}") from None
    if not inflater.eof or inflater.unconsumed_tail:
        raise BadField(f"body is not one complete {kind} stream")
    return data


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
