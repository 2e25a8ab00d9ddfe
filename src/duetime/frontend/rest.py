"""The KServe v2 REST API (with Triton's binary tensor extension), independent of the transport.

`RestApi.handle` turns one parsed HTTP request into a `Reply` now, or into a `PendingReply` whose
ticket resolves on the loop; the HTTP protocol writes either in request order.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import hmac
import json
import logging
import math
import re
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar
from urllib.parse import unquote

import numpy as np
import orjson

from duetime import __version__, classification
from duetime.config import ModelConfig, ServerSettings
from duetime.datatypes import WIRE_DTYPE_OF, v2_datatype_of
from duetime.engine import SHUTTING_DOWN, Engine, Ticket
from duetime.errors import (
    TIMEOUT_EXPIRED,
    ConfigError,
    DeadlineExceeded,
    DuetimeError,
    InternalError,
    InvalidInput,
    ModelNotFound,
    ModelUnavailable,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    fitted,
    shown,
)
from duetime.frontend import codec, sharedmemory
from duetime.frontend.answersizes import shaped_bytes
from duetime.frontend.arrival import ReadTurn
from duetime.frontend.metadata import model_config_json, model_metadata_json
from duetime.frontend.parameters import (
    OutputSetting,
    check_http_parameters,
    check_output_again,
    check_parameter_count,
    check_scalar_parameters,
    due_from_timeout_us,
    priority_of,
)
from duetime.frontend.sharedmemory import CUDA_REGIONS, CudaRegions, SharedMemoryRegions
from duetime.frontend.v1 import v1_inputs, v1_json_size, v1_predictions
from duetime.observability.logs import (
    CANCELLED_STATUS,
    AccessSampler,
    log_cancelled,
    log_request,
)
from duetime.observability.logsettings import LogSettings
from duetime.observability.tracesettings import TraceSettings, trace_settings_of
from duetime.observability.tracing import (
    RequestTiming,
    TraceParent,
    Tracing,
    http_target,
    new_trace_id,
    parse_traceparent,
)
from duetime.repository.layout import model_folders
from duetime.repository.manager import (
    ModelManager,
    check_model_name,
    check_upload_path,
    load_failed,
)
from duetime.repository.registry import labels
from duetime.repository.tritonconfig import read_json_config
from duetime.types import InferRequest

if TYPE_CHECKING:  # (not at run time: that module imports onnx)
    from duetime.repository.outputsizes import OutputSize, OutputSizes

log = logging.getLogger("duetime.rest")

EXTENSIONS = [
    "binary_tensor_data", "classification", "model_configuration", "model_repository",
    "model_repository(unload_dependents)", "parameters", "schedule_policy", "statistics",
    "system_shared_memory", "trace", "logging",
]  # fmt: skip
"""The v2 extensions both front ends serve (`schedule_policy`: the `priority` and `timeout`
request parameters, which the scheduler honours)."""
_JSON = (b"Content-Type", b"application/json")
_HEADER_LENGTH = "inference-header-content-length"


@dataclass(slots=True)
class Reply:
    """A finished HTTP response (the protocol adds the status line and Content-Length)."""

    status: int
    body: bytes = b""
    headers: tuple[tuple[bytes, bytes], ...] = (_JSON,)
    tail: tuple[bytes | memoryview, ...] = ()
    """Bytes written after `body`, part of it (big binary outputs, as views of their arrays:
    never copied on the event loop)."""


@dataclass(slots=True)
class BulkReply:
    """An answer too big to build on the event loop: `build` makes its Reply (or its error) on
    another thread, then `finish` completes it on the loop (tracing, the access log).

    NOTE: a 4 MB answer in JSON (1M floats) took ~50 ms to encode, the loop stalled all the
    while: two clients asking for such answers back to back made every other client's P99
    2 s. Built on a thread, in pieces (`codec.JSON_CHUNK`), the loop takes the GIL back between
    them."""

    build: Callable[[], Reply | DuetimeError]
    finish: Callable[[Reply | DuetimeError], Reply]


BULK_JSON_VALUES = 65_536
"""JSON answers with more values than this (~3 ms of encoding) are built off the loop."""
BULK_SHARED_BYTES = 4 << 20
"""Likewise answers writing more than this into shared memory."""
TAIL_BYTES = 64 << 10
"""Binary outputs beyond this are written from their arrays, not copied into the body."""
BULK_COMPRESS_BYTES = 64 << 10
"""Answers bigger than this are compressed off the loop (~0.5 ms of zlib at level 1)."""


Headers = tuple[tuple[bytes, bytes], ...]


class UnsupportedEncoding(InvalidInput):
    """A request body in a content coding the server cannot decode: 415, with the codings it
    can in `Accept-Encoding` (RFC 9110 15.5.16 and 12.5.3, as Triton answers)."""

    http_status = 415
    headers: Headers = ((b"Accept-Encoding", b"gzip, deflate"),)


class HttpError(DuetimeError):
    """An error only HTTP has (a method not allowed, a request the protocol layer refuses: too
    big, too slow, malformed), with its status and any headers its answer needs."""

    grpc_code = "UNIMPLEMENTED"

    def __init__(
        self,
        status: int,
        message: str,
        *,
        retry_after_s: float | None = None,
        headers: Headers = (),
    ) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.http_status = status
        self.headers = headers


class ClientWithdrew(DuetimeError):
    """A request its client withdrew (closed its connection, cancelled its gRPC call or
    stream) before its answer: the status of its span and of its log line (nginx's 499, gRPC's
    CANCELLED; no reply is sent)."""

    http_status = CANCELLED_STATUS
    grpc_code = "CANCELLED"

    def __init__(self, message: str = "the client closed its connection before the answer") -> None:
        super().__init__(message)


class Pending(Protocol):
    """Work whose reply comes later: a settled `future`, then the `when_done` callback."""

    @property
    def future(self) -> asyncio.Future[Any]: ...

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call `callback` once `future` settles (at once if it has; never if cancelled)."""


ANSWER_WORDS_BYTES = 2048
"""The most an inference's answer takes as written besides its outputs' entries, its id and its
model's name (status line and headers, the JSON's keys, the version): see
`RestApi.answer_estimate`."""
_ESCAPED = 6
"""The most bytes one character of a name takes in JSON (a control character: `\\u0001`)."""


@dataclass(slots=True)
class PendingReply:
    """A response still being worked on; `encode` builds the Reply once the ticket is done."""

    ticket: Pending
    encode: Callable[[Any], Reply | BulkReply]
    headers: Mapping[str, str] | None = None
    """An inference's request headers (for the log line if its client goes: `withdrawn`)."""
    traced: Callable[[Ticket], str | None] | None = None
    """A traced inference's span, recorded if its client withdraws it (`withdrawn_span`): its
    trace id."""
    request: InferRequest | None = None
    """A v2 inference's request, decoded (see `RestApi.answer_estimate`)."""
    plan: OutputPlan | None = None
    """How that request's outputs go back."""
    trace_id: str | None = None
    """The trace id of the span `withdrawn_span` recorded."""

    def withdrawn_span(self) -> None:
        """Record a traced inference's span, with an error status, once its client withdrew
        it (its connection closed before its answer: call it once its ticket is cancelled)."""
        ticket = self.ticket
        if self.traced is not None and isinstance(ticket, Ticket):
            self.trace_id = self.traced(ticket)

    def withdrawn(self) -> None:
        """Log an inference whose client closed its connection before its answer (call it
        once its ticket is cancelled, after `withdrawn_span`): with its span's trace id, else
        its caller's.

        NOTE: the caller's only: the line of a request sent without a `traceparent` had none,
        though its span was exported (found by a tester)."""
        ticket = self.ticket
        if isinstance(ticket, Ticket):  # (not a repository operation)
            trace_id = self.trace_id
            headers = self.headers
            if trace_id is None and headers:
                parent = parse_traceparent(headers.get("traceparent"))
                trace_id = parent.trace_id_hex if parent is not None else None
            log_cancelled("http", ticket.model, ticket.version, trace_id)


_Settled = TypeVar("_Settled")


@dataclass(slots=True, eq=False)
class _Awaited(Generic[_Settled]):
    """Work running on the loop whose future a pending reply reads (`Pending`)."""

    future: asyncio.Future[_Settled]
    on_done: Callable[[], None] | None = None

    def when_done(self, callback: Callable[[], None]) -> None:
        if not self.future.done():
            self.on_done = callback
        elif not self.future.cancelled():
            callback()


@dataclass(slots=True, eq=False)
class ControlCall(_Awaited[Reply]):
    """A repository operation (load, unload) running as a task; its future holds the Reply."""

    @classmethod
    def start(
        cls,
        operation: Awaitable[None],
        done: Reply,
        failed: Callable[[DuetimeError], Reply],
        what: str = "the repository operation",
    ) -> PendingReply:
        """Run `operation`; the reply is `done` when it succeeds, `failed(error)` otherwise
        (`what` names the operation in the error of one the server's shutdown cancels)."""
        loop = asyncio.get_running_loop()
        call = cls(loop.create_future())

        async def run() -> None:
            cancelled = False
            try:
                await operation
                reply = done
            except DuetimeError as exc:
                reply = failed(exc)
            except asyncio.CancelledError:
                # NOTE: the server's shutdown (`ModelManager.aclose`) cancels a load still
                # running: uncaught, the future was never resolved and the client's connection
                # closed with no response. It hears 503, as inference requests do.
                reply = failed(ModelUnavailable(shut_down_during(what)))
                task = asyncio.current_task()
                cancelled = task is not None and task.cancelling() > 0
            except Exception as exc:
                log.exception("internal error in a repository operation")
                reply = failed(InternalError(f"internal error: {type(exc).__name__}: {exc}"))
            if not call.future.done():
                call.future.set_result(reply)
                if call.on_done is not None:
                    call.on_done()
            if cancelled:  # (this task itself was cancelled: it ends so)
                raise asyncio.CancelledError

        task = loop.create_task(run())
        _CONTROL_TASKS.add(task)
        task.add_done_callback(_CONTROL_TASKS.discard)
        return PendingReply(call, lambda done: done.future.result())


@dataclass(slots=True, eq=False)
class AfterLoad(_Awaited["Reply | PendingReply"]):
    """A V1 predict waiting for its model's load (see `RestApi._v1_after_load`): its future
    holds the reply, or the pending reply of the request submitted once the model loaded."""


def shut_down_during(what: str) -> str:
    """Why a repository operation (`what`: "the load of model 'm'") the server's shutdown
    cancelled has no other answer."""
    return f"{what} did not finish: {SHUTTING_DOWN}"


_CONTROL_TASKS: set[asyncio.Task[None]] = set()
"""Running repository operations (kept referenced until they finish)."""


@dataclass(slots=True, eq=False)
class HeldInfer:
    """A v2 inference request decoded and dated as it was read, not yet handed to the engine:
    its connection holds it back (see `RestApi.hold_back`)."""

    request: InferRequest
    plan: OutputPlan
    received: int
    """When it was received, for its span (0 untraced)."""
    body_bytes: int = 0
    """Its body's size as it was read (the load shedder weighs it so: see HTTP's `_shed`)."""

    @property
    def due_ns(self) -> int | None:
        """When it is due (its `timeout` parameter, from its arrival; None: no due time)."""
        return self.request.due_ns


def _internal_error(exc: Exception) -> Reply:
    log.exception("internal error encoding a response")
    return error_reply(InternalError(f"internal error: {type(exc).__name__}: {exc}"))


def build_bulk(bulk: BulkReply) -> Reply | DuetimeError:
    """`bulk.build()` on any thread; an unexpected fault comes back as an InternalError."""
    try:
        return bulk.build()
    except Exception as exc:
        log.exception("internal error building a response")
        return InternalError(f"internal error: {type(exc).__name__}: {exc}")


def answer_failed(
    engine: Engine, ticket: Ticket, request: InferRequest, reason: str = "unmade"
) -> None:
    """Count, on the scheduler that answered `request` (`ticket`'s model, version and variant),
    an answer its front end could not deliver after the model ran (`reason`: "unmade", an
    output window too small, an answer over a size limit; "held_late", see
    `ModelScheduler.answer_failed`). The model's statistics keep it a success, as Triton's do.
    On the loop; a deployment replaced since and draining counts it too, one closed does not.
    (`request` is what the callers have at hand; the count needs no more of it.)"""
    del request
    snapshot = engine.registry.snapshot
    wanted = (ticket.model, ticket.version, ticket.variant)
    for deployment in (*snapshot.deployments(), *snapshot.retiring):
        if labels(deployment) == wanted:
            deployment.scheduler.answer_failed(reason)
            return


def count_unreturned(engine: Engine, ticket: Ticket, request: InferRequest) -> None:
    """Where `ticket` failed though its model answered (its future holds outputs: one asked
    for could not be returned, see `executor.Unreturned`), count an answer not delivered
    (`answer_failed`). Call it with a failed ticket only."""
    if ticket.future.exception() is None:
        answer_failed(engine, ticket, request)


UNRUN_REFUSALS = (DeadlineExceeded, Overloaded, ModelUnavailable)
"""The errors a request's scheduler settles its ticket with where no model answered it: due
before it could run (expired in the queue, its run stopped past its due time), pushed out of a
full queue, its model unavailable (breakers open, shut down before it ran). A ticket that fails
otherwise failed in its model's run (InvalidInput, InternalError...): no refusal."""


def refused_unrun(ticket: Ticket) -> DuetimeError | None:
    """The error of `ticket`, settled, if its request was refused after it was queued without
    any model answering it (`UNRUN_REFUSALS`): a refusal to count in
    duetime_requests_refused_total as one decided before the scheduler took it is; else None.

    NOTE: only refusals raised as a request was submitted counted: the 504s of requests a
    scheduler dropped from its queue as hopeless, the same answer for the same reason, moved
    no metric (7 of 7 in a tester's overload run)."""
    future = ticket.future
    if future.cancelled():
        return None
    error = future.exception()
    return error if isinstance(error, UNRUN_REFUSALS) else None


def retry_after(seconds: float) -> bytes:
    """`Retry-After` delay-seconds (RFC 9110 10.2.3: a whole number) for a wait of `seconds`:
    rounded up, at least 1.

    NOTE: rounded to nearest, a breaker open 1.4 s more said "Retry-After: 1" (its message said
    1.4 s), and a client that waited so was refused again."""
    return str(max(1, math.ceil(seconds))).encode()


MAX_MESSAGE_BYTES = 8192
"""An error message at most, in UTF-8, in an HTTP answer and its log line: longer ones (a
client's value quoted) are cut (`errors.fitted`), as gRPC cuts its status details.

NOTE: a 7 MB input name came back whole in a 7 MB 400 and a 7 MB log line (found by a
tester)."""


def error_reply(
    exc: DuetimeError, trace_id: str | None = None, message: str | None = None
) -> Reply:
    """The error's status and `{"error": message}` (`message`: its message already cut to
    `MAX_MESSAGE_BYTES`, else cut here), its trace id (`trace_id`, else a new one) at the end of
    the message and in `x-trace-id`."""
    headers: Headers = (_JSON,)
    if exc.retry_after_s is not None:
        headers += ((b"Retry-After", retry_after(exc.retry_after_s)),)
    if exc.headers:
        headers += exc.headers
    if trace_id is None:
        trace_id = new_trace_id()
    headers += ((b"x-trace-id", trace_id.encode()),)
    if message is None:
        message = fitted(exc.message, MAX_MESSAGE_BYTES)
    message = f"{message} (trace {trace_id})"
    try:
        body = orjson.dumps({"error": message})
    except TypeError:  # a lone surrogate from the request, echoed: written as its escape
        body = orjson.dumps({"error": message.encode("utf-8", "backslashreplace").decode()})
    return Reply(exc.http_status, body, headers)


def failed_reply(
    exc: DuetimeError,
    headers: Mapping[str, str],
    model: str = "",
    version: str | None = None,
    trace_id: str = "",
) -> Reply:
    """The reply of a request that failed, with its trace id (`trace_id`, else the caller's
    `traceparent`'s, else a new one), and its log line."""
    if not trace_id:
        parent = parse_traceparent(headers.get("traceparent"))
        trace_id = parent.trace_id_hex if parent is not None else new_trace_id()
    message = fitted(exc.message, MAX_MESSAGE_BYTES)
    log_request(
        protocol="http", model=fitted(model, MAX_MESSAGE_BYTES), version=version,
        status=exc.http_status, reason=message, trace_id=trace_id,
    )  # fmt: skip
    return error_reply(exc, trace_id, message)


def _json(value: Any, status: int = 200) -> Reply:
    return Reply(status, orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY))


_EMPTY_OK = Reply(200, b"", ())
# NOTE: Triton answers health with an empty body and clients read the status; KServe's client
# reads `live` / `ready` from a JSON body (the Open Inference Protocol's health responses), and
# fails on an empty one. A JSON body serves both.
_LIVE = Reply(200, b'{"live":true}', (_JSON,))
_ALIVE = Reply(200, b'{"status":"alive"}', (_JSON,))
"""KServe V1's liveness answer, at `/`."""
_V1_VERBS = ("predict", "explain")
"""The verbs of `POST /v1/models/<m>:<verb>`."""
_READY = Reply(200, b'{"ready":true}', (_JSON,))
_NOT_READY = Reply(400, b'{"ready":false}', (_JSON,))


class Signatures:
    """What the served model versions take (`codec.Expected`), looked up by model name and
    version before a request's tensors are decoded; one per front end, each made once per
    version loaded."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._made: dict[tuple[str, str], codec.Expected] = {}

    def expected(self, model: str, version: str | None) -> codec.Expected | None:
        """What the version a request names takes (naming none: the versions its traffic goes
        to, when they all take the same); raises the error of a model or version not served,
        as routing would. None where it is not known before routing: a model a request may
        load first (lazy loading), or served versions that differ; and while traffic capture
        records (it records what the engine is handed, refused requests too)."""
        engine = self._engine
        if engine.recorder is not None:
            return None
        served = engine.registry.snapshot.models.get(model)
        if served is None:
            manager = engine.manager
            options = None if manager is None else manager.options
            if options is not None and options.lazy and options.control_mode != "explicit":
                return None
            engine.registry.served(model, version)  # raises: unknown, failed to load, ...
            return None
        if version:
            chosen = engine.registry.served_version(served, version)
        else:
            names = served.traffic.versions
            chosen = served.versions[names[0]]
            if len(names) > 1:
                signature = chosen.primary.model.signature
                if any(served.versions[n].primary.model.signature != signature for n in names):
                    return None
        loaded = chosen.primary.model
        key = (model, chosen.version)
        found = self._made.get(key)
        if found is None or found.signature is not loaded.signature:
            if len(self._made) >= SIGNATURES_MAX:
                self._made.clear()
            counted = (served.name, chosen.version)
            found = codec.Expected(
                model, loaded.signature, counted, engine.router.invalid, loaded.unserved_outputs,
                loaded.validator.left_out,
            )  # fmt: skip
            self._made[key] = found
        return found


SIGNATURES_MAX = 256
"""Model versions whose `codec.Expected` a front end keeps; all are dropped when full."""


class RestApi:
    """Routes `/v2/...` requests to the engine."""

    def __init__(
        self,
        engine: Engine,
        settings: ServerSettings,
        tracing: Tracing | None = None,
        log_settings: LogSettings | None = None,
        trace_settings: TraceSettings | None = None,
        shared_memory: SharedMemoryRegions | None = None,
    ) -> None:
        self._engine = engine
        self._settings = settings
        self._tracing = tracing
        self._access = AccessSampler(settings.access_log_sample)
        self.turn = ReadTurn(engine.clock)
        """Marked by the HTTP connections as they read: a request's timeout counts from the
        start of the loop turn that read it."""
        self._recipes: Recipes = {}
        """JSON headers of binary inference requests, decoded (see `_Recipe`)."""
        self.signatures = Signatures(engine)
        """What each model takes, checked before a request's tensors are decoded."""
        self._infer_targets: dict[bytes, tuple[str, str | None]] = {}
        """Request targets (URL path and query) of inference, and the model and version each
        names: the routing of a target seen before, skipped (see `_names_infer`)."""
        self.log_settings = log_settings or LogSettings()
        """`/v2/logging` (shared with the gRPC service)."""
        self.trace_settings = trace_settings or trace_settings_of(tracing)
        """`/v2/[models/<m>/]trace/setting` (shared with the gRPC service)."""
        self.shared_memory = shared_memory or SharedMemoryRegions()
        """`/v2/systemsharedmemory/...` (shared with the gRPC service)."""
        self.accepting = True
        """False once shutdown starts: readiness reports false."""
        self.shed = 0
        """Inference requests the load shedder refused unread (429; counted apart from
        `refused`, which they join in duetime_requests_refused_total, to keep them cheap)."""
        self.refused: dict[tuple[int, str], int] = {}
        """(status, error class) -> inference requests answered with an error before any
        model ran them: malformed, a bad parameter, an unknown model, refused at admission,
        refused by its scheduler once queued (`refused_unrun`: expired unrun...). Bounded: no
        label comes from the client (see `RefusedCollector`)."""

    @property
    def engine(self) -> Engine:
        """The engine it hands requests to (whose traffic capture records the requests its
        connections' load shedding refuses unread)."""
        return self._engine

    def handle(
        self, method: str, target: bytes, headers: Mapping[str, str], body: bytes
    ) -> Reply | PendingReply:
        """Answer one request; never raises (errors become their HTTP reply)."""
        infer = self._infer_targets.get(target) if method == "POST" else None
        parts = None if infer is not None else _segments(target)
        try:
            if infer is not None:
                return self._infer(infer[0], infer[1], headers, body)
            assert parts is not None
            if "" in parts:
                parts = _collapsed(parts, target)
            if method == "POST" and _names_infer(parts):
                if len(self._infer_targets) >= INFER_TARGETS_MAX:
                    self._infer_targets.clear()
                self._infer_targets[target] = _infer_of(parts)
            return self._route(method, parts, headers, body)
        except DuetimeError as exc:
            return self._failed(exc, headers, parts or _segments(target))
        except RecursionError:  # (the client's JSON: see `_too_deep`)
            return self._failed(_too_deep(), headers, parts or _segments(target))
        except Exception as exc:  # a bug of ours: answer 500, log it, keep serving
            log.exception("internal error on %s %r", method, target)
            error = InternalError(f"internal error: {type(exc).__name__}: {exc}")
            return self._failed(error, headers, parts or _segments(target))

    def infer_target(self, target: bytes) -> tuple[str, str | None] | None:
        """The model and version (None: the default) a request target names, if it is
        `/v2/models/<m>[/versions/<v>]/infer`; else None (a path with an empty segment too: it
        is routed whole). Read from, and added to, the routes `handle` keeps."""
        infer = self._infer_targets.get(target)
        if infer is not None:
            return infer
        parts = _segments(target)
        if "" in parts or not _names_infer(parts):
            return None
        infer = _infer_of(parts)
        if len(self._infer_targets) >= INFER_TARGETS_MAX:
            self._infer_targets.clear()
        self._infer_targets[target] = infer
        return infer

    def inference_route(self, target: bytes) -> tuple[str, str | None] | None:
        """The model and version (None: the default; always for V1) of the inference request
        a POST to `target` is, v2's or a V1 predict's, as `handle` routes it: its empty
        segments collapsed, its percent-escapes undone; else None. For a compressed body,
        which the front end inflates off the loop for an inference request alone (see
        `HttpConnection._inflate`)."""
        infer = self.infer_target(target)
        if infer is not None:
            return infer
        parts = _segments(target)
        if "" in parts:
            try:
                parts = _collapsed(parts, target)
            except InvalidInput:
                return None
        if _names_infer(parts):
            return _infer_of(parts)
        if not _names_predict(parts):
            return None
        model, _, verb = parts[2].rpartition(":")
        return (model, None) if verb == "predict" else None

    def hold_back(
        self,
        method: str,
        target: bytes,
        headers: Mapping[str, str],
        body: bytes,
        *,
        arrival_ns: int | None = None,
    ) -> HeldInfer | Reply | None:
        """A v2 inference request that its connection may not start yet, decoded and dated:
        its due time counts from its arrival (`arrival_ns`, the engine's clock, for one read
        earlier and kept undecoded; else now, as it is read), as every other request's does,
        and it is started (`start_held`) or, once due, refused (`refuse_held`) later; its error
        reply if it cannot be decoded (it never reaches the engine). None for any other
        request: it is handled whole (`handle`) once started. Never raises."""
        infer = self._infer_targets.get(target) if method == "POST" else None
        if infer is None:
            parts = _segments(target) if method == "POST" else []
            if "" in parts or not _names_infer(parts):
                return None  # (handled whole, as before: routing decides what it is)
            infer = _infer_of(parts)
        model, version = infer
        received = self._engine.clock.now_ns() if self._tracing is not None else 0
        try:
            request, plan = self._read_infer(model, version, headers, body, received, arrival_ns)
        except Exception as exc:
            return self._not_queued(exc, model, version, headers, received)
        return HeldInfer(request, plan, received, len(body))

    def refuse_infer(self, target: bytes, headers: Mapping[str, str], exc: Exception) -> Reply:
        """The error reply of the inference request to `target` (v2's or a V1 predict's: see
        `inference_route`) whose body could not be decoded (`exc`: its Content-Encoding
        could not be undone off the event loop, see `Inflation`; not a DuetimeError: a 500,
        logged), as `handle` answers it, counted in `refused`; never raises."""
        infer = self.inference_route(target)
        if infer is None:  # (not an inference's: see `HttpConnection._decode`)
            parts = _segments(target)
            name = parts[2] if len(parts) > 2 else ""
            infer = (name.rpartition(":")[0] or name, None)
        model, version = infer
        received = self._engine.clock.now_ns() if self._tracing is not None else 0
        return self._not_queued(exc, model, version, headers, received)

    def start_held(self, held: HeldInfer) -> Reply | PendingReply:
        """Hand a request held back (`hold_back`) to the engine; never raises."""
        request = held.request
        try:
            ticket = self._engine.submit(request)
        except Exception as exc:
            return self._not_queued(exc, request.model, request.version, request.headers,
                                    held.received, request.timing)  # fmt: skip
        plan = held.plan
        return PendingReply(
            ticket, lambda done: self._infer_reply(done, request, plan), request.headers,
            self._withdrawn_span(request), request, plan,
        )  # fmt: skip

    def refuse_held(self, held: HeldInfer, reason: str) -> Reply:
        """The refusal of a request held back whose due time passed while it waited (`reason`:
        why it waited): the scheduler's for a request due before it is queued (504, Triton's
        words, counted as expired in the model's statistics and metrics), which it is handed
        to for that, in words that say why it was late. Never raises.

        NOTE: its scheduler would word it as a request that waited to be read (an overloaded
        server), and blame a client whose due time was ample."""
        request = held.request
        late = DeadlineExceeded(
            f"{TIMEOUT_EXPIRED}: model '{request.model}': the request was due before it could "
            f"start: {reason}"
        )
        try:
            error: Exception = self._engine.refuse_late(request, late)
        except Exception as exc:  # (not a DuetimeError: a bug, answered as one)
            error = exc
        return self._not_queued(error, request.model, request.version, request.headers,
                                held.received, request.timing)  # fmt: skip

    def time_left_s(self, due_ns: int) -> float:
        """Seconds until `due_ns` by the engine's clock (negative once it has passed)."""
        return (due_ns - self._engine.clock.now_ns()) / 1e9

    def _not_queued(
        self, exc: Exception, model: str, version: str | None, headers: Mapping[str, str],
        received: int, timing: RequestTiming | None = None, *, v1: bool = False,
    ) -> Reply:  # fmt: skip
        """The error reply of an inference request that got no ticket, as `handle` answers it
        (a fault of ours: 500, logged); `v1`: a KServe V1 predict's."""
        if isinstance(exc, RecursionError):
            exc = _too_deep()
        elif not isinstance(exc, DuetimeError):
            log.exception("internal error on an inference request for model '%s'", model)
            exc = InternalError(f"internal error: {type(exc).__name__}: {exc}")
        if self._tracing is not None:
            return self._refused(exc, model, version, headers, received, timing, v1=v1)
        return self._failed(exc, headers, _model_parts(model, version), inference=True)

    def _failed(
        self,
        exc: DuetimeError,
        headers: Mapping[str, str],
        parts: list[str],
        trace_id: str = "",
        inference: bool = False,
    ) -> Reply:
        """The error reply of a request to `parts` (see `failed_reply`); an inference request
        (`inference`, or `parts` name one) counts in `refused`.

        NOTE: a 400 for malformed JSON, a bad 'timeout' or 'priority' parameter moved no
        metric (found by a tester)."""
        infer = inference or _names_infer(parts) or _names_predict(parts)
        if infer:
            key = (exc.http_status, type(exc).__name__)
            self.refused[key] = self.refused.get(key, 0) + 1
        model = parts[2] if len(parts) > 2 and parts[1] == "models" else ""
        if parts[:1] == ["v1"] and model.rpartition(":")[2] in _V1_VERBS:
            model = model.rpartition(":")[0]  # (`/v1/models/<m>:predict` names model <m>)
        version = parts[4] if len(parts) > 4 and parts[3] == "versions" else None
        if infer and isinstance(exc, InvalidInput):
            self._engine.router.count_invalid(exc, model, version)
        return failed_reply(exc, headers, model, version, trace_id)

    def _ticket_error(self, ticket: Ticket, request: InferRequest) -> DuetimeError | None:
        """A finished ticket's error, read, not raised (see `Ticket.failure`), and counted: in
        `refused` where no model answered it (`_count_unrun`), as an answer not delivered where
        its model answered but not an output it asked for (`executor.Unreturned`).

        NOTE: V1 predicts did not count the latter, which v2's did (found by a tester)."""
        error = ticket.failure()
        if error is not None:
            self._count_unrun(ticket)
            count_unreturned(self._engine, ticket, request)
        return error

    def _count_unrun(self, ticket: Ticket) -> None:
        """Count in `refused` a failed ticket's request that no model answered
        (`refused_unrun`), as `_failed` counts one refused before it was queued."""
        error = refused_unrun(ticket)
        if error is not None:
            key = (error.http_status, type(error).__name__)
            self.refused[key] = self.refused.get(key, 0) + 1

    def encode(self, pending: PendingReply) -> Reply | BulkReply:
        """The reply of a finished inference (or how to build it off the loop); never raises."""
        try:
            return pending.encode(pending.ticket)
        except Exception as exc:
            return _internal_error(exc)

    def finish(self, bulk: BulkReply, built: Reply | DuetimeError) -> Reply:
        """The reply of an answer `bulk.build` built off the loop; never raises."""
        try:
            return bulk.finish(built)
        except Exception as exc:
            return _internal_error(exc)

    def _route(
        self, method: str, parts: list[str], headers: Mapping[str, str], body: bytes
    ) -> Reply | PendingReply:
        if not parts:  # KServe V1 liveness (`{"status": "alive"}`)
            return _expect(method, "GET", lambda: _ALIVE)
        if parts[0] == "v1":
            return self._v1_route(method, parts[1:], headers, body)
        if parts[0] != "v2":
            shown = "*" if parts == ["*"] else f"/{_sent(parts)}"  # ('*': OPTIONS *'s target)
            raise ModelNotFound(f"no such endpoint '{shown}'; the API is under /v2")
        rest = parts[1:]
        if not rest:
            return _expect(method, "GET", self._server_metadata)
        if rest == ["openapi.json"]:
            return _expect(method, "GET", _openapi)
        if rest[0] == "health" and len(rest) == 2 and rest[1] in ("live", "ready"):
            return _expect(method, "GET", lambda: self._health(rest[1]))
        if rest == ["models", "stats"]:
            return _expect(method, "GET", lambda: self._statistics(None, None))
        if rest == ["logging"]:
            return self._logging(method, headers, body)
        if rest == ["trace", "setting"]:
            return self._trace_setting(method, None, headers, body)
        if rest[0] == "systemsharedmemory":
            return self._shared_memory_route(method, rest[1:], headers, body, self.shared_memory)
        if rest[0] == "cudasharedmemory":
            return self._shared_memory_route(
                method, rest[1:], headers, body, CUDA_REGIONS, "cudasharedmemory"
            )
        if rest[0] == "models" and len(rest) >= 2:
            return self._model_route(method, rest[1:], headers, body)
        if rest[0] == "repository":
            return self._repository_route(method, rest[1:], headers, body)
        raise ModelNotFound(f"no such endpoint '/{_sent(parts)}'")

    def _control_body(self, headers: Mapping[str, str], body: bytes) -> bytes:
        """A control request's body with its Content-Encoding undone, as an inference body's is
        (a model's load inflates its own, on the thread that reads it: see `_load`), once its
        control token is checked: on the event loop, so within `INFLATE_INLINE_BYTES`.

        NOTE: it was read as sent: a gzip load or trace-setting request from a client that
        compresses every body was refused as "not valid UTF-8" (found by a tester).

        NOTE: every control body was inflated as it was routed, before its token was checked,
        up to --max-body-bytes: a client without the token held the event loop (every HTTP
        and gRPC client) 0.3-0.5 s with each 65 KB gzip body (64 MiB of spaces) it sent to
        /v2/logging (found by a tester). These bodies are small JSON documents."""
        return _inflated_here(body, headers.get("content-encoding"), self._settings.max_body_bytes)

    def _model_route(
        self, method: str, rest: list[str], headers: Mapping[str, str], body: bytes
    ) -> Reply | PendingReply:
        model, version, action = rest[0], None, rest[1:]
        if len(action) >= 2 and action[0] == "versions":
            version, action = action[1], action[2:]
        if method != "GET" and (not action or action in _MODEL_GETS):
            raise self._not_allowed_on(model, version, "GET")
        if not action:
            return self._metadata(model, version)
        if action == ["ready"]:
            return self._model_ready(model, version)
        if action == ["config"]:
            return self._config(model, version)
        if action == ["stats"]:
            return self._statistics(model, version)
        if action == ["trace", "setting"] and version is None:
            if method == "POST":  # (before the model is looked up: no answer tells it apart)
                check_control_token(self._settings.control_token, headers.get("authorization"))
            self._engine.registry.resolve(model, None)
            return self._trace_setting(method, model, headers, body)
        if action == ["infer"]:
            if method != "POST":
                raise self._not_allowed_on(model, version, "POST")
            return self._infer(model, version, headers, body)
        raise ModelNotFound(f"no such endpoint under model '{model}': '{_sent(action)}'")

    def _not_allowed_on(self, model: str, version: str | None, allowed: str) -> DuetimeError:
        """The refusal of a request to a resource of `model` (and `version`) in a method it
        does not take: 405 naming the methods `allowed`, where the model (and version) is
        served, loading or failed; else the refusal of a request in the method it takes (404
        for a model or version not served, 400 for a malformed version).

        NOTE: the method was checked first: `POST /v2/models/mlp%2Finfer` (the metadata of a
        model 'mlp/infer') got 405 "use GET", and that GET got 404: a target no method has
        (found by a tester)."""
        try:
            self._engine.registry.resolve(model, version)
        except ModelUnavailable:  # (the model is there, not serving: the method is wrong)
            pass
        except DuetimeError as exc:
            return exc
        return _method_not_allowed(allowed)

    def _repository_route(
        self, method: str, rest: list[str], headers: Mapping[str, str], body: bytes
    ) -> Reply | PendingReply:
        if method != "POST":
            raise _method_not_allowed("POST")
        if rest == ["index"]:
            return self._repository_index(self._control_body(headers, body))
        if len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload"):
            check_control_token(self._settings.control_token, headers.get("authorization"))
            name = check_model_name(rest[1])
            # NOTE: Triton answers with an empty 200, KServe's model server with {"name": ...,
            # "load"/"unload": true}; tritonclient reads no body on success, so this one does both.
            done = _json({"name": name, rest[2]: True})

            def failed(exc: DuetimeError) -> Reply:
                return self._failed(exc, headers, ["v2", "models", name])

            what = f"the {rest[2]} of model '{name}'"
            if rest[2] == "unload":
                body = self._control_body(headers, body)
                check_unload_request(_control_parameters(body, "unload request"))
                return ControlCall.start(self._engine.unload_model(name), done, failed, what)
            coding = headers.get("content-encoding")
            return ControlCall.start(self._load(name, body, coding), done, failed, what)
        raise ModelNotFound(f"no such endpoint '/v2/repository/{_sent(rest)}'")

    async def _load(self, name: str, body: bytes, coding: str | None = None) -> None:
        """A load request's `body` read (its Content-Encoding `coding` undone), then the load.

        NOTE: read on a thread: a model uploaded as base64 JSON (60 MB for a 45 MB model) took
        0.2-0.5 s of the event loop to parse and decode, and every other request waited that
        long (found by a tester); gRPC's arrive parsed."""
        limit = self._settings.max_body_bytes
        asked = await asyncio.to_thread(_load_asked, body, name, coding, limit)
        await self._engine.load_model(name, asked.config, asked.files)

    def _repository_index(self, body: bytes) -> Reply:
        doc = _json_object(body, "index request") if body.strip() else {}
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidInput("index request 'ready' must be true or false")
        return _json(self._engine.repository_index(ready))

    def _shared_memory_route(
        self,
        method: str,
        rest: list[str],
        headers: Mapping[str, str],
        body: bytes,
        regions: SharedMemoryRegions | CudaRegions,
        kind: str = "systemsharedmemory",
    ) -> Reply:
        """`/v2/<kind>/...`: status, register and unregister of system (or CUDA) regions."""
        name: str | None = None
        if len(rest) == 3 and rest[0] == "region":
            name, rest = rest[1], rest[2:]
        if rest == ["status"]:
            return _expect(method, "GET", lambda: _json(regions.status(name)))
        if rest == ["unregister"] or (rest == ["register"] and name is not None):
            if method != "POST":
                raise _method_not_allowed("POST")
            # NOTE: the server writes outputs into whatever object a region names
            check_control_token(self._settings.control_token, headers.get("authorization"))
            if name is None or rest == ["unregister"]:
                regions.unregister(name)
            else:
                body = self._control_body(headers, body)
                doc = _json_object(body, "shared memory register request")
                regions.register(name, doc.get("key"), doc.get("offset", 0), doc.get("byte_size"))
            return _EMPTY_OK
        raise ModelNotFound(f"no such endpoint '/v2/{kind}/{_sent(rest)}'")

    def _logging(self, method: str, headers: Mapping[str, str], body: bytes) -> Reply:
        settings = self.log_settings
        files = self._settings.control_token is not None  # checked by _settings_call
        return self._settings_call(
            method, headers, body, "log settings", settings.current,
            lambda changes: settings.update(changes, files=files),
        )  # fmt: skip

    def _trace_setting(
        self, method: str, model: str | None, headers: Mapping[str, str], body: bytes
    ) -> Reply:
        settings = self.trace_settings
        return self._settings_call(
            method, headers, body, "trace settings", lambda: settings.current(model),
            lambda changes: settings.update(changes, model),
        )  # fmt: skip

    def _settings_call(
        self,
        method: str,
        headers: Mapping[str, str],
        body: bytes,
        what: str,
        current: Callable[[], Any],
        update: Callable[[dict[str, Any]], Any],
    ) -> Reply:
        """GET reads settings; POST (with the control token, when the server has one) updates
        them with the body's JSON object and answers the settings after."""
        if method == "GET":
            return _json(current())
        if method != "POST":
            raise _method_not_allowed("GET, POST")
        check_control_token(self._settings.control_token, headers.get("authorization"))
        body = self._control_body(headers, body)
        return _json(update(_json_object(body, what) if body.strip() else {}))

    # -- metadata ------------------------------------------------------------------------------

    def _server_metadata(self) -> Reply:
        return _json({"name": "duetime", "version": __version__, "extensions": EXTENSIONS})

    def _v1_route(
        self, method: str, rest: list[str], headers: Mapping[str, str], body: bytes
    ) -> Reply | PendingReply:
        """KServe's V1 protocol (see v1.py)."""
        if rest == ["models"]:
            return _expect(method, "GET", lambda: _json({"models": self._v1_models()}))
        if len(rest) != 2 or rest[0] != "models":
            raise ModelNotFound(f"no such endpoint '/v1/{_sent(rest)}'")
        name = rest[1]
        model, colon, verb = name.rpartition(":")
        if not colon or (method == "GET" and self._v1_names_model(name, verb)):
            # NOTE: V1 says "not ready" with a 503 (KServe's client reads it as False)
            return _expect(method, "GET", lambda: self._v1_ready(name))
        if verb not in _V1_VERBS:
            raise ModelNotFound(
                f"no such endpoint '/v1/models/{rest[1]}': only ':predict' and ':explain'"
            )
        if method != "POST":
            raise _method_not_allowed("POST")
        if verb == "explain":
            # NOTE: KServe routes :explain for every model and answers 501 for one without an
            # explainer (Model.explain raises NotImplementedError), after a 404 for an unknown
            # model and a 503 for one not ready (v1_endpoints.py, kserve 0.21)
            if self._v1_on_demand(model) is not None:
                # NOTE: a model lazy loading has not loaded yet is listed and not ready (see
                # `_v1_ready`): it was answered 404 "'m' is not found; served models: 'm'"
                # (found by a tester). Not loaded for this: it would answer 501 once it is.
                # One whose last load failed says why, as its ':predict' does (it said "not
                # loaded yet": a tester again)
                failed = self._engine.registry.snapshot.failures.get(model)
                why = (
                    f"its last load failed: {failed}"
                    if failed
                    else "not loaded yet (its first ':predict' loads it)"
                )
                raise ModelUnavailable(
                    f"model '{model}' is not ready: {why}, and it has no explainer: duetime "
                    "serves ':predict' only"
                )
            self._engine.registry.resolve(model, None)
            raise HttpError(
                501, f"model '{model}' has no explainer: duetime serves ':predict' only"
            )
        return self._v1_predict(model, headers, body)

    def _v1_names_model(self, name: str, verb: str) -> bool:
        """Whether `GET /v1/models/<name>` asks for the readiness of model `name`, though the
        name has a ':' (KServe routes `<m>:predict` for POST only: a GET names the model).

        NOTE: the path was split at its last ':' whatever the method, so the readiness of a
        served model 'lin:v2' was answered 404 "no such endpoint" (its ':predict' worked). A
        GET of '<m>:predict' is still told to use POST where no model has that whole name."""
        return verb not in _V1_VERBS or name in self._engine.registry.snapshot.models

    def _v1_on_demand(self, model: str) -> ModelManager | None:
        """The model manager, where `model` is not served but a request for it loads it first
        (lazy loading: a folder of the repository's); None otherwise. Changes nothing (unlike
        `ModelManager.can_load_lazily`, which spaces out the retries of a failed load)."""
        manager = self._engine.manager
        if manager is None or not manager.options.lazy:
            return None
        if manager.options.control_mode == "explicit":
            return None
        if model in self._engine.registry.snapshot.models:
            return None
        try:
            check_model_name(model)
        except InvalidInput:
            return None
        return manager if (manager.root / model).is_dir() else None

    def _v1_models(self) -> list[str]:
        """The models `GET /v1/models` lists: those served, those loading or whose load failed,
        and those a predict loads first: every model whose readiness (`_v1_ready`) is not 404.

        NOTE: KServe lists every model of its registry, ready or not (`V1Endpoints.models`),
        and its readiness route answers 503 for one not ready: so are the models lazy loading
        has not loaded yet (or evicted to make room) listed here, and not ready (`_v1_ready`).
        A model a predict would not load (explicit mode: not loaded) is not listed, as KServe
        drops a model it unloads from its registry.

        NOTE: a model whose load failed (or whose first load is under way) was left out, while
        its readiness answered 503 (the registry knows it, not ready): a client that lists the
        models, then polls each, never saw it (found by a tester)."""
        snapshot = self._engine.registry.snapshot
        names = {*snapshot.models, *snapshot.failures, *snapshot.loading}
        manager = self._engine.manager
        if manager is not None and manager.options.lazy:
            with contextlib.suppress(OSError):
                names |= {
                    folder.name
                    for folder in model_folders(manager.root)
                    if self._v1_on_demand(folder.name) is not None
                }
        return sorted(names)

    def _v1_ready(self, model: str) -> Reply:
        """KServe's readiness of `model`: 503 for one not ready, a model a predict would load
        first among them (see `_v1_models`); 404 for a model unknown.

        NOTE: a model lazy loading had not loaded yet was answered 404 "unknown model", as if
        a predict for it would fail (it loads it)."""
        if self._v1_on_demand(model) is not None:
            return Reply(503, orjson.dumps({"name": model, "ready": False}), (_JSON,))
        # NOTE: V1 says "not ready" with a 503 (KServe's client reads it as False)
        return self._model_ready(model, None, 503)

    def _v1_predict(
        self, model: str, headers: Mapping[str, str], body: bytes, received: int | None = None,
        arrival_ns: int | None = None,
    ) -> Reply | PendingReply:  # fmt: skip
        """A V1 predict, traced and logged as a v2 inference is (`_refused`, `_answered`): its
        span, `x-trace-id`, a failure's log line and the sampled access log. A model not loaded
        yet that a request loads first (lazy loading) is loaded, then the request decoded (see
        `_v1_after_load`); `received` and `arrival_ns` are such a request's, from before."""
        if received is None:
            received = self._engine.clock.now_ns() if self._tracing is not None else 0
        try:
            if arrival_ns is None:  # (one after a load has its body decoded and checked)
                body = _inflated_here(
                    body, headers.get("content-encoding"), self._settings.max_body_bytes
                )
                self._check_json_size(len(body))
            try:
                signature = self._engine.registry.resolve(model, None).model.signature
            except (ModelNotFound, ModelUnavailable):
                manager = self._engine.manager
                if arrival_ns is not None or manager is None:
                    raise
                if not manager.can_load_lazily(model):
                    raise
                arrival = self.turn.arrival_ns(self._engine.clock.now_ns())
                return self._v1_after_load(model, manager, headers, body, received, arrival)
            doc = _json_object(body, "predict request")
            request = InferRequest(model, v1_inputs(doc, signature, model), headers=headers)
            request.protocol = "http"
            now = self._engine.clock.now_ns()
            if self._tracing is not None:
                request.timing = RequestTiming(received, decoded_ns=now)
            request.arrival_ns = self.turn.arrival_ns(now) if arrival_ns is None else arrival_ns
            ticket = self._engine.submit(request)
        except DuetimeError as exc:
            if self._tracing is None and arrival_ns is None:
                raise
            return self._not_queued(exc, model, None, headers, received, v1=True)
        batched = signature.max_batch_size > 0
        return PendingReply(
            ticket, lambda done: self._v1_reply(done, request, batched), headers,
            self._withdrawn_span(request, v1=True),
        )  # fmt: skip

    def _v1_after_load(
        self, model: str, manager: ModelManager, headers: Mapping[str, str], body: bytes,
        received: int, arrival_ns: int,
    ) -> PendingReply:  # fmt: skip
        """A V1 predict for a model that lazy loading has not loaded (or evicted): the model is
        loaded first, as the engine loads it for a v2 request, then the request is decoded
        against its signature and submitted; its answer is the pending reply's.

        NOTE: the request's inputs are decoded with the model's signature, which only a loaded
        model has: the predict looked it up first, so a V1 client was told 404 "unknown model
        ... served models: none" where a v2 /infer loaded the model and answered."""
        loop = asyncio.get_running_loop()
        call = AfterLoad(loop.create_future())

        def settle(outcome: Reply | PendingReply) -> None:
            if not call.future.done():
                call.future.set_result(outcome)
                if call.on_done is not None:
                    call.on_done()

        async def run() -> None:
            cancelled = False
            outcome: Reply | PendingReply
            try:
                await manager.load(model, explicit=False)  # (joins a load under way: its lock)
            except DuetimeError as exc:
                outcome = self._not_queued(exc, model, None, headers, received, v1=True)
            except asyncio.CancelledError:  # (the server's shutdown: see ControlCall.start)
                what = f"the load of model '{model}' for this request"
                error = ModelUnavailable(shut_down_during(what))
                outcome = self._not_queued(error, model, None, headers, received, v1=True)
                task = asyncio.current_task()
                cancelled = task is not None and task.cancelling() > 0
            else:
                if call.future.done():  # (its client left while it loaded)
                    return
                try:
                    outcome = self._v1_predict(model, headers, body, received, arrival_ns)
                except Exception as exc:  # (a bug of ours: answered 500, as `handle` does)
                    outcome = self._not_queued(exc, model, None, headers, received, v1=True)
            if isinstance(outcome, PendingReply):
                made = outcome
                inner = made.ticket

                def withdrawn(done: asyncio.Future[Any]) -> None:
                    if done.cancelled() and inner.future.cancel():
                        made.withdrawn_span()  # (its client withdrew it: as `_withdraw`'s)

                call.future.add_done_callback(withdrawn)
                inner.when_done(lambda: settle(made))
            else:
                settle(outcome)
            if cancelled:
                raise asyncio.CancelledError

        task = loop.create_task(run())
        _CONTROL_TASKS.add(task)
        task.add_done_callback(_CONTROL_TASKS.discard)
        return PendingReply(call, self._after_load_reply, headers)

    def _after_load_reply(self, call: AfterLoad) -> Reply | BulkReply:
        """The reply of a V1 predict that loaded its model first (see `_v1_after_load`)."""
        outcome = call.future.result()
        return outcome if isinstance(outcome, Reply) else self.encode(outcome)

    def _v1_reply(self, ticket: Ticket, request: InferRequest, batched: bool) -> Reply | BulkReply:
        """The answer (or error) of a finished V1 predict; one over `max_json_answer_bytes` is
        refused before it is encoded, and a big one is built off the loop, as v2 JSON answers
        are (see `_check_json_answer`, BulkReply).

        NOTE: V1 answers were built on the loop whatever their size, and never refused: a 40 MB
        answer v2 refused ("too big to answer as JSON") was made, and every other client of the
        server (a health check) waited 0.8-2.5 s while it was.

        NOTE: compressed as the client's `Accept-Encoding` asks, as `_infer_reply` compresses a
        v2 answer (and off the loop where big): V1 answers, JSON only, went uncompressed
        whatever was asked, 160 KB where v2 answered the same tensor in 1 KB of gzip (found by
        a tester)."""
        error = self._ticket_error(ticket, request)
        if error is not None:
            return self._answered(ticket, request, error, v1=True)
        outputs = ticket.response(request.id).outputs
        try:
            _check_v1_answer(outputs, self._settings.max_json_answer_bytes)
        except DuetimeError as exc:
            unmade = self._made(ticket, request, exc.with_traceback(None))
            return self._answered(ticket, request, unmade, v1=True)
        coding = _coding_of(request.headers)
        if sum(array.size for array in outputs.values()) > BULK_JSON_VALUES:
            return BulkReply(
                lambda: _in_coding(Reply(200, v1_predictions(outputs, batched)), coding),
                lambda built: self._answered(ticket, request, built, v1=True),
            )
        return self._coded(
            ticket, request, Reply(200, v1_predictions(outputs, batched)), coding, v1=True
        )

    def _health(self, which: str) -> Reply:
        if which == "live":
            return _LIVE
        return _READY if self.accepting and self._engine.ready else _NOT_READY

    def _metadata(self, model: str, version: str | None) -> Reply:
        deployment = self._engine.registry.resolve(model, version)
        served = self._engine.registry.snapshot.models[model]
        return _json(model_metadata_json(deployment.model, sorted(served.versions, key=int)))

    def _model_ready(self, model: str, version: str | None, unready_status: int = 400) -> Reply:
        """The readiness of `model` (`unready_status`, 400 as Triton's, when it is not).

        NOTE: a model known but not serving (its load failed, or is under way) was answered 503
        with the reason as an error, where v2 says "not ready" with a 4xx (Triton: 400) and the
        gRPC ModelReady answered ready=false (found by a tester). An unknown one is 404."""
        engine = self._engine
        try:
            engine.registry.resolve(model, version)
        except ModelUnavailable:
            ready = False
        else:
            # (a model whose every instance's breaker is open takes no work: not ready until its
            # probe can go; the server's readiness is not tied to any one model's breakers)
            ready = self.accepting and engine.registry.takes_work(
                model, version, engine.clock.now_ns()
            )
        status = 200 if ready else unready_status
        return Reply(status, orjson.dumps({"name": model, "ready": ready}), (_JSON,))

    def _config(self, model: str, version: str | None) -> Reply:
        return _json(model_config_json(self._engine.registry.resolve(model, version).model))

    def _statistics(self, model: str | None, version: str | None) -> Reply:
        return _json(self._engine.statistics(model, version))

    # -- inference -----------------------------------------------------------------------------

    def _check_json_size(self, json_bytes: int) -> None:
        """PayloadTooLarge for JSON over `max_json_bytes`.

        NOTE: JSON is decoded on the event loop (~15 ms a megabyte): a big one would stall every
        other client; binary tensors are views, whatever their size."""
        if json_bytes > self._settings.max_json_bytes:
            raise PayloadTooLarge(
                f"the JSON part of the request is {json_bytes} bytes, over the "
                f"{self._settings.max_json_bytes}-byte limit for JSON (server flag "
                "--max-json-bytes); send large tensors with the v2 binary tensor extension "
                "(binary_data_size)"
            )

    def _infer(
        self, model: str, version: str | None, headers: Mapping[str, str], body: bytes
    ) -> Reply | PendingReply:
        received = self._engine.clock.now_ns() if self._tracing is not None else 0
        request: InferRequest | None = None
        try:
            request, plan = self._read_infer(model, version, headers, body, received)
            ticket = self._engine.submit(request)
        except DuetimeError as exc:
            if self._tracing is None:
                raise
            timing = request.timing if request is not None else None
            return self._refused(exc, model, version, headers, received, timing)
        return PendingReply(
            ticket, lambda done: self._infer_reply(done, request, plan), headers,
            self._withdrawn_span(request), request, plan,
        )  # fmt: skip

    def answer_estimate(self, pending: PendingReply) -> tuple[int, tuple[OutputSizes, ...]] | None:
        """What the answer of `pending`, a v2 inference just handed to the engine, will weigh
        at most as written, from its request's shapes, where its model's graph gives its
        outputs' sizes from them (`Engine.answer_sizes`), and the sizes that said so; None
        where they do not (not a v2 inference; a model without them; outputs asked for as
        their top classes, texts whose length the labels set). Each output counts as binary
        data or as JSON text (`codec.json_value_bytes_at_most` a value), as it goes back.

        NOTE: asked by the connection of a request whose model has no size known at load
        (`Engine.answer_guess` None: its answers follow its requests' shapes), which holds the
        most an answer may weigh until then: under a 100 MB bound 2 of 16 requests for
        [B,256,256] answers ran at once (found by a tester; gRPC sized them already)."""
        request, plan = pending.request, pending.plan
        if request is None or plan is None or request.classes:
            return None
        sizes = self._engine.answer_sizes(request.model)
        if sizes is None:
            return None
        shapes = {name: array.shape for name, array in request.inputs.items()}

        def weigh(output: OutputSize, count: int) -> int:
            binary = plan.is_binary(output.name)
            each = output.itemsize if binary else codec.json_value_bytes_at_most(output.datatype)
            # (its entry's words: name escaped, up to 6 bytes a character; a dim up to 21)
            return count * each + _ESCAPED * len(output.name) + 21 * len(output.dims) + 96

        made = shaped_bytes(sizes, shapes, request.outputs or (), weigh)
        if made is None:
            return None
        accepted = request.headers.get("accept-encoding")
        if accepted is not None and response_coding(accepted) is not None:
            # NOTE: deflate adds 5 bytes a stored block of 16 KB (and gzip's 18): random binary
            # outputs of 16 MB were written 3 KB over the estimate (found by a tester)
            made += made // 1024 + 64
        return made + _ESCAPED * (len(request.id) + len(request.model)) + ANSWER_WORDS_BYTES, sizes

    def _read_infer(
        self, model: str, version: str | None, headers: Mapping[str, str], body: bytes,
        received: int, arrival_ns: int | None = None,
    ) -> tuple[InferRequest, OutputPlan]:  # fmt: skip
        """`body` decoded into a request, dated: it arrived at `arrival_ns` if given (read
        earlier), else at the start of the loop turn that read it (see `ReadTurn`), and is due
        its `timeout` parameter after that."""
        body = _inflated_here(body, headers.get("content-encoding"), self._settings.max_body_bytes)
        header = parse_header_length(headers.get(_HEADER_LENGTH), len(body))
        self._check_json_size(len(body) if header is None else header)
        request, plan = parse_infer_request(
            body, header, model, version, self.shared_memory, self._recipes, strict=True,
            signatures=self.signatures,
        )  # fmt: skip
        request.headers = headers
        request.protocol = "http"
        request.wire = (body, header)
        now = self._engine.clock.now_ns()
        if self._tracing is not None:
            request.timing = RequestTiming(received, decoded_ns=now)
        arrival = self.turn.arrival_ns(now) if arrival_ns is None else arrival_ns
        request.arrival_ns = arrival
        check_http_parameters(request.parameters)
        request.due_ns = due_from_timeout_us(request.parameters, arrival)
        request.priority = priority_of(request.parameters)
        return request, plan

    def _refused(
        self, exc: DuetimeError, model: str, version: str | None, headers: Mapping[str, str],
        received: int, timing: RequestTiming | None = None, *, v1: bool = False,
    ) -> Reply:  # fmt: skip
        """The error reply of an inference request that never got a ticket (invalid, refused at
        admission, due before it was queued), with its span: those are the most worth a look.
        `timing`: the request's, if it was decoded (its span then has its `decode` child);
        `v1`: a KServe V1 predict's."""
        assert self._tracing is not None
        served, variant = self._engine.registry.attribution(
            model, version, invalid=isinstance(exc, InvalidInput)
        )
        trace_id = self._tracing.record(
            timing or RequestTiming(received), _parent(headers),
            protocol="http", model=model, version=served, variant=variant, error=exc,
            done_ns=self._engine.clock.now_ns(), target=http_target(model, version, v1=v1),
        )  # fmt: skip
        parts = _model_parts(model, version)
        return self._failed(exc, headers, parts, trace_id or "", inference=True)

    def _withdrawn_span(
        self, request: InferRequest, *, v1: bool = False
    ) -> Callable[[Ticket], str | None] | None:
        """What records a traced request's span should its client withdraw it (its connection
        closed before its answer: see `PendingReply.withdrawn_span`); None untraced.

        NOTE: such a request was counted cancelled and logged 499 but had no span, where every
        other failed request has one (found by a tester). A callback on every traced ticket's
        future recorded it (a call on the loop each settle, for the rare cancellation): the
        connection that cancels the ticket records it now."""
        if self._tracing is None or request.timing is None:
            return None
        return functools.partial(self._record_withdrawn, request, v1)

    def _record_withdrawn(self, request: InferRequest, v1: bool, ticket: Ticket) -> str | None:
        """The span of a traced request its client withdrew (`_withdrawn_span`); its trace id."""
        timing = request.timing
        tracing = self._tracing
        assert tracing is not None
        assert timing is not None
        now = self._engine.clock.now_ns()
        if not timing.finished_ns:  # (its wait, or its run, ends here)
            timing.finished_ns = now
        return tracing.record(
            timing, _parent(request.headers), protocol="http", model=ticket.model,
            version=ticket.version, variant=ticket.variant, error=ClientWithdrew(),
            done_ns=now, target=http_target(request.model, request.version, v1=v1),
        )  # fmt: skip

    def _infer_reply(
        self, ticket: Ticket, request: InferRequest, plan: OutputPlan
    ) -> Reply | BulkReply:
        """The answer (or error) of a finished inference, traced and logged, compressed as the
        client accepts; a big one is built or compressed off the loop (see BulkReply)."""
        error = self._ticket_error(ticket, request)
        if error is not None:
            return self._answered(ticket, request, error)
        coding = _coding_of(request.headers)
        limit = self._settings.max_json_answer_bytes
        if _bulky(ticket, plan):
            return BulkReply(
                lambda: _built(ticket, request.id, plan, coding, limit),
                lambda built: self._answered(ticket, request, self._made(ticket, request, built)),
            )
        built = self._made(ticket, request, _built(ticket, request.id, plan, json_limit=limit))
        if isinstance(built, Reply):
            return self._coded(ticket, request, built, coding)
        return self._answered(ticket, request, built)

    def _coded(
        self, ticket: Ticket, request: InferRequest, reply: Reply, coding: str | None,
        v1: bool = False,
    ) -> Reply | BulkReply:  # fmt: skip
        """`reply`, an answer built on the loop, compressed in `coding` (None: as it is) and
        answered; compressed off the loop where it is big (see BulkReply)."""
        if coding is None:
            return self._answered(ticket, request, reply, v1=v1)
        if _size(reply) > BULK_COMPRESS_BYTES:
            return BulkReply(
                lambda: compressed(reply, coding),
                lambda done: self._answered(ticket, request, done, v1=v1),
            )
        return self._answered(ticket, request, compressed(reply, coding), v1=v1)

    def _made(
        self, ticket: Ticket, request: InferRequest, built: Reply | DuetimeError
    ) -> Reply | DuetimeError:
        """`built`, the answer of a request the model ran; its scheduler told where it could
        not be made (see `answer_failed`): a success of the model, an answer failed."""
        if isinstance(built, DuetimeError):
            answer_failed(self._engine, ticket, request)
        return built

    def _answered(
        self, ticket: Ticket, request: InferRequest, outcome: Reply | DuetimeError,
        *, v1: bool = False,
    ) -> Reply:  # fmt: skip
        error = outcome if isinstance(outcome, DuetimeError) else None
        parent = _parent(request.headers)
        trace_id = parent.trace_id_hex if parent is not None else None
        timing = request.timing
        if self._tracing is not None and timing is not None:
            trace_id = self._tracing.record(
                timing, parent, protocol="http", model=ticket.model, version=ticket.version,
                variant=ticket.variant, error=error, done_ns=self._engine.clock.now_ns(),
                target=http_target(request.model, request.version, v1=v1),
            )  # fmt: skip
        if error is not None:  # (its model's counts have it: not a refusal)
            return failed_reply(
                error, request.headers, request.model, ticket.version, trace_id or ""
            )
        reply = outcome
        assert isinstance(reply, Reply)
        if trace_id is not None:
            reply.headers += ((b"x-trace-id", trace_id.encode()),)
        if self._access.take():
            log_request(
                protocol="http", model=ticket.model, version=ticket.version, status=200,
                reason=None, trace_id=trace_id,
            )  # fmt: skip
        return reply


# -- request parsing -----------------------------------------------------------------------------


def _parent(headers: Mapping[str, str]) -> TraceParent | None:
    """The caller's trace context, its `tracestate` with it (see parse_traceparent)."""
    return parse_traceparent(headers.get("traceparent"), headers.get("tracestate"))


def _model_parts(model: str, version: str | None) -> list[str]:
    """The path segments of `model`'s (`version`'s) inference, for `RestApi._failed`."""
    return ["v2", "models", model, *(["versions", version] if version else [])]


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        doc = codec.loads_json(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"{what}: {codec.json_fault(exc, body)}") from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"{what}: expected a JSON object")
    return doc


def _too_deep() -> InvalidInput:
    """The refusal of a request whose JSON nests a value deeper than the server can handle it:
    orjson reads 1,024 levels, and Python's stack takes fewer where a value is gone through
    recursively (quoted in a message, compared).

    NOTE: a guard for every field: values nested 995 deep where a message quoted them (an
    input's name, a shared-memory key, 'unload_dependents') raised RecursionError, answered 500
    with a traceback logged each time (found by a tester); those fields are named now."""
    return InvalidInput(
        "the request's JSON nests a value too deeply to be read (some 1,000 levels); no field "
        "of the API takes more than a few: nest it less"
    )


def _control_parameters(body: bytes, what: str) -> dict[str, Any]:
    doc = _json_object(body, what) if body.strip() else {}
    return _parameters(doc.get("parameters"), f"{what} 'parameters'")


HTTP_TOKEN = "header 'Authorization: Bearer <token>'"
"""How an HTTP caller sends the control token (`check_control_token`'s hint)."""


def check_control_token(
    expected: str | None, authorization: str | None, send: str = HTTP_TOKEN
) -> None:
    """Raise Unauthorized unless `authorization` is `Bearer <expected>` (when a token is set);
    the message tells the caller to send it as `send` says (the gRPC front end names its
    metadata key)."""
    if expected is None:
        return
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), expected.encode()
    ):
        raise Unauthorized(
            "this call changes the server (repository load and unload, log and trace settings, "
            f"shared-memory registration) and needs the server's control token: send {send}"
        )


class LoadRequest(NamedTuple):
    """What a repository load request asks for: a config override and uploaded files."""

    config: ModelConfig | None
    files: dict[str, bytes]


def _load_asked(body: bytes, name: str, coding: str | None, limit: int) -> LoadRequest:
    """A load request's body, its Content-Encoding `coding` undone (within `limit` bytes), read."""
    body = _decoded(body, coding, limit)
    return load_request(_control_parameters(body, "load request"), name)


def load_request(parameters: Mapping[str, Any], name: str) -> LoadRequest:
    """The parameters of a load request: `config` (JSON text) in place of the model's config
    file, and `file:<path>` entries, the files of a model folder to load instead of the
    repository's (base64 text over HTTP, bytes over gRPC; Triton's model upload).

    InvalidInput for parameters that cannot be used, said as Triton says a load of a model it
    cannot read failed (`load_failed`: its clients look for "failed to load 'x'")."""
    try:
        return _load_request(parameters, name)
    except InvalidInput as exc:
        raise InvalidInput(load_failed(name, exc.message, polled=False)) from None


def _load_request(parameters: Mapping[str, Any], name: str) -> LoadRequest:
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if not key.startswith("file:"):
            if key != "config":
                # NOTE: taken without a word, a parameter meant as a file upload ("files:...",
                # "1/model.onnx") loaded the repository's model and said it loaded (found by a
                # tester; Triton refuses a load parameter it does not know)
                shown = key if len(key) <= 60 else f"{key[:60]}..."
                raise InvalidInput(
                    f"unrecognized load parameter {shown!r}: expected 'config' (the model's "
                    "config as JSON) or 'file:<path>' (a file of the model folder: base64 "
                    "text over HTTP, bytes over gRPC)"
                )
            continue
        path = key.removeprefix("file:")
        check_upload_path(path)
        if isinstance(value, bytes):
            files[path] = value
        elif isinstance(value, str):
            try:
                files[path] = base64.b64decode(value, validate=True)
            except binascii.Error:
                raise InvalidInput(f"load parameter '{key}': expected base64 text") from None
        else:
            raise InvalidInput(f"load parameter '{key}': expected the file's bytes (base64)")
    text = parameters.get("config")
    if text is None:
        return LoadRequest(None, files)
    if not isinstance(text, str):
        raise InvalidInput("load parameter 'config' must be a string of JSON")
    return LoadRequest(parse_config_override(text, name), files)


def check_unload_request(parameters: Mapping[str, Any]) -> None:
    """Refuse an unload request whose `unload_dependents` is not a boolean, before anything is
    unloaded (as Triton: INVALID_ARGUMENT over gRPC, 400 over HTTP). duetime serves no
    ensembles, so no model depends on another and the flag changes nothing; a value of another
    type is a client's mistake all the same, not a yes."""
    value = parameters.get("unload_dependents", False)
    if not isinstance(value, bool):
        # (as JSON, the request's form: `null`, not Python's None; a gRPC parameter with no
        # value set is None too)
        try:
            text = orjson.dumps(value, default=repr).decode()
        except TypeError:  # (nested past orjson's 254 levels: a 500 it was, found by a tester)
            text = shown(value)
        text = text if len(text) <= 40 else f"{text[:40]}..."
        raise InvalidInput(
            "unload parameter 'unload_dependents': expected a boolean (true or false; "
            f"bool_param over gRPC), got {text}"
        )


def parse_config_override(text: str, name: str) -> ModelConfig:
    """A load request's `config` parameter: JSON in duetime's model config schema, or Triton's
    ModelConfig as JSON (as `get_model_config` returns it, over HTTP or gRPC: edit, load); see
    `tritonconfig.read_json_config`."""
    source = "load parameter 'config'"
    data = _json_object(text.encode(), source)
    twice = _key_given_twice(text)
    if twice is not None:
        # NOTE: as a config.yaml or config.toml giving a key twice is refused: JSON readers
        # kept the last without a word (two "max_batch_size" served the second)
        raise InvalidInput(f"{source}: key '{twice}' is given twice in one object; give it once")
    try:
        return read_json_config(data, source=source, model_name=name)
    except ConfigError as exc:
        raise InvalidInput(exc.message) from None


class _Twice(Exception):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Twice(key)
        seen[key] = value
    return seen


def _key_given_twice(text: str) -> str | None:
    """The first key `text` (a JSON document already read) gives twice in one object."""
    try:
        json.loads(text, object_pairs_hook=_unique_pairs)
    except _Twice as exc:
        return str(exc.args[0])
    except (ValueError, RecursionError):  # (read by loads_json: a spelling `json` lacks)
        pass
    return None


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """How each output goes back: as binary data (True) or JSON values (False)."""

    default_binary: bool
    binary: Mapping[str, bool]
    classes: Mapping[str, int] | None = None
    """Outputs asked for as their top classes (the classification extension), and how many."""
    shared: Mapping[str, sharedmemory.Window] | None = None
    """Outputs to write into shared memory, and where."""
    regions: SharedMemoryRegions | None = None

    def is_binary(self, name: str) -> bool:
        return self.binary.get(name, self.default_binary)


def parse_header_length(value: str | None, body_length: int) -> int | None:
    if value is None:
        return None
    digits = value.strip()
    # (a length of thousands of digits is no length: Python refuses to convert past 4,300)
    valid = digits.isascii() and digits.isdigit() and len(digits) <= 20
    length = int(digits) if valid else -1
    if not 0 <= length <= body_length:
        shown = value if len(value) <= 40 else f"{value[:40]}... ({len(value)} characters)"
        raise InvalidInput(
            f"header Inference-Header-Content-Length: {shown!r} must be an integer between 0 "
            f"and the body length {body_length}"
        )
    return length


RECIPES_MAX = 256
"""JSON headers of binary requests kept parsed per server (`Recipes`); all are dropped when full."""

RECIPE_MAX_BYTES = 2048
"""The longest JSON header kept parsed."""

_TIMEOUT_VALUE = re.compile(rb'"timeout"[ \t\n\r]*:[ \t\n\r]*([0-9]+)')
"""Where a JSON header may give its `timeout` parameter (see `_timeout_slot`)."""
_UINT64_MAX = 2**64 - 1


@dataclass(frozen=True, slots=True, eq=False)
class _Recipe:
    """What a binary request's JSON header decodes to, read and checked once: every request that
    sends the same header bytes differs from it only in its tensor bytes.

    NOTE: clients send one header for every request of one shape (tritonclient, perf_analyzer,
    `duetime bench`); decoding it again (JSON, then each tensor's name, datatype, shape and
    parameters) was a tenth of the loop's time per `mlp` request over HTTP binary."""

    parameters: dict[str, Any]
    """The request's parameters: shared by every request made from the recipe, never changed."""
    inputs: tuple[tuple[str, np.dtype[Any] | None, str, tuple[int, ...], int], ...]
    """Per input: name, numpy dtype (None: decoded by `codec.from_raw`), datatype, shape, size."""
    size: int
    """The binary bytes after the header (the sum of the sizes)."""
    outputs: tuple[str, ...] | None
    plan: OutputPlan


Recipes = dict[bytes | tuple[bytes, bytes], _Recipe]


def _sent(segments: list[str]) -> str:
    """Path segments (decoded) joined as a path, a '/' or '%' in one percent-encoded as it
    came: an error that joined them named '/v2/health/live' as the endpoint not found for
    '/v2%2Fhealth%2Flive' (found by a tester)."""
    return "/".join(s.replace("%", "%25").replace("/", "%2F") for s in segments)


def parse_infer_request(
    body: bytes,
    header_length: int | None,
    model: str,
    version: str | None,
    regions: SharedMemoryRegions | None = None,
    recipes: Recipes | None = None,
    *,
    strict: bool = False,
    signatures: Signatures | None = None,
) -> tuple[InferRequest, OutputPlan]:
    """Decode a v2 JSON (or JSON + binary) inference request into an InferRequest; `regions`:
    the shared memory its tensors may name; `recipes`: the JSON headers of binary requests
    decoded before (read and extended); `strict`: refuse what decodes but the protocol does not
    allow (parameters that are no string, number or boolean), as the server does (a capture
    reader reads what was sent); `signatures`: what the served models take, each tensor checked
    against it before its data is decoded (see `codec.Expected`)."""
    view = memoryview(body)
    json_part = view if header_length is None else view[:header_length]
    binary = view[len(json_part) :]
    key: bytes | memoryview | None = None
    split: _TimeoutSplit | None = None
    if recipes is not None and header_length is not None and header_length <= RECIPE_MAX_BYTES:
        # NOTE: a read-only view hashes and compares as its bytes: looked up without a copy
        key = json_part if json_part.readonly else bytes(json_part)
        recipe = recipes.get(key)  # type: ignore[arg-type]
        parameters = None
        if recipe is None:
            split = _timeout_split(key)
            if split is not None:
                recipe = recipes.get(split[0])
                if recipe is not None:  # (its own timeout: see `_timeout_slot`)
                    parameters = {**recipe.parameters, "timeout": split[1]}
        if recipe is not None and len(binary) == recipe.size:
            address = codec.data_address(body) + header_length
            request = _from_recipe(recipe, binary, address, model, version, signatures, parameters)
            return request, recipe.plan
    expected = None if signatures is None else signatures.expected(model, version)
    try:
        doc = codec.loads_json(json_part)
    except orjson.JSONDecodeError as exc:
        number = codec.number_fault(exc, json_part)
        if number is not None:  # (well-formed: where the JSON ends is not in question)
            raise InvalidInput(f"request body: {number}") from None
        fault = codec.utf8_fault(json_part)
        if header_length is not None:
            # NOTE: a header length past the JSON's end said "not valid UTF-8 (byte 0xcd at
            # offset 110)" (the binary data's first bytes), one short of it "unexpected end of
            # data", neither naming the header that set the cut; one of the whole body said
            # the header was needed, though sent, or nothing of it (found by testers)
            if header_length != len(view):
                where = (
                    f"; its JSON part is the body's first {header_length} bytes, as header "
                    "Inference-Header-Content-Length says: is that the JSON's length in bytes?"
                )
            else:
                where = (
                    f"; header Inference-Header-Content-Length says its JSON part is all its "
                    f"{header_length} bytes: binary data after the JSON needs the JSON's "
                    "length there"
                )
            raise InvalidInput(
                f"request body is {fault or f'not valid JSON: {exc}'}{where}"
            ) from None
        if fault is None:
            raise InvalidInput(f"request body is not valid JSON: {exc}") from None
        # (binary data sent without saying where the JSON ends?)
        fault += "; binary data after the JSON needs header Inference-Header-Content-Length"
        raise InvalidInput(f"request body is {fault}") from None
    if not isinstance(doc, dict):
        raise InvalidInput("request body must be a JSON object with an 'inputs' list")
    if expected is not None and isinstance(doc.get("outputs"), list):
        expected.outputs(len(doc["outputs"]))
    if strict:
        _check_parameter_types(doc)
    parameters = _inference_parameters(doc.get("parameters"), "request")
    if any(_rounded(value) for value in parameters.values()):
        parameters = _exact_parameters(json_part, parameters)
    if sharedmemory.REGION in parameters:
        raise InvalidInput(
            "request 'parameters': shared memory is named per input and output, not per request"
        )
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidInput("request 'id' must be a string")
    # (outputs first: they are only names and parameters, the inputs' data may be big)
    outputs, plan = _outputs(doc.get("outputs"), parameters, regions, expected)
    inputs = _inputs(doc.get("inputs"), binary, regions, expected)
    request = InferRequest(
        model=model, inputs=inputs, version=version, outputs=outputs, id=request_id,
        parameters=parameters, classes=plan.classes,
    )  # fmt: skip
    if recipes is not None and key is not None and not request_id:  # (an id: new every time)
        recipe = _recipe_of(doc, parameters, inputs, len(binary), outputs, plan)
        if recipe is not None:
            if len(recipes) >= RECIPES_MAX:
                recipes.clear()
            recipes[bytes(key)] = recipe  # (a view would pin the whole request body)
            if split is not None and _timeout_slot(split, doc):
                recipes[split[0]] = recipe
    return request, plan


def _recipe_of(
    doc: dict[str, Any],
    parameters: dict[str, Any],
    inputs: dict[str, np.ndarray],
    size: int,
    outputs: tuple[str, ...] | None,
    plan: OutputPlan,
) -> _Recipe | None:
    """The recipe of a decoded request whose every input is binary; None for one with JSON data
    or shared memory (their values are in the header, or elsewhere)."""
    if plan.shared:
        return None
    entries = []
    for item, (name, array) in zip(doc.get("inputs") or (), inputs.items(), strict=True):
        given = item.get("parameters") or {}
        if "binary_data_size" not in given or sharedmemory.REGION in given:
            return None
        datatype = item["datatype"]
        dtype = WIRE_DTYPE_OF.get(datatype)
        plain = dtype is not None and dtype.isnative and datatype not in ("BOOL", "BYTES")
        shape = tuple(array.shape)
        entries.append((name, dtype if plain else None, datatype, shape, given["binary_data_size"]))
    # NOTE: the parameters decoded (`_exact_parameters`), not the document's: a kept header's
    # integer past 64 bits came back as the float orjson made of it (found by a fuzz test)
    return _Recipe(parameters, tuple(entries), size, outputs, plan)


def _from_recipe(
    recipe: _Recipe,
    binary: memoryview,
    address: int,
    model: str,
    version: str | None,
    signatures: Signatures | None,
    parameters: dict[str, Any] | None = None,
) -> InferRequest:
    """The request a recipe makes of its binary bytes (at `address` in memory): each input a
    view of them where it lies at a multiple of `codec.ALIGNMENT`, else an aligned copy;
    `parameters`: its own, where they are not the recipe's (see `_timeout_slot`)."""
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for name, dtype, datatype, shape, size in recipe.inputs:
        part = binary[offset : offset + size]
        if dtype is not None:
            array = np.frombuffer(part, dtype=dtype).reshape(shape)
            aligned = (address + offset) % codec.ALIGNMENT == 0
            inputs[name] = array if aligned else codec.aligned_copy(array)
        else:
            if datatype == "BYTES" and signatures is not None:
                # (a recipe is kept by its header's bytes, whichever model the URL names)
                expected = signatures.expected(model, version)
                if expected is not None:
                    expected.input(name, datatype, shape)
            inputs[name] = codec.from_raw(part, datatype, shape, f"input '{name}'")
        offset += size
    return InferRequest(
        model=model, inputs=inputs, version=version, outputs=recipe.outputs,
        parameters=recipe.parameters if parameters is None else parameters,
        classes=recipe.plan.classes, template=recipe,
    )  # fmt: skip


_TimeoutSplit = tuple[tuple[bytes, bytes], int]
"""A JSON header split around the digits of the first integer after a `"timeout":` key: the
bytes before and after them (the key it is kept under), and the integer (see `_timeout_split`).
NOTE: a plain tuple of copies: a NamedTuple's construction, or views of the body (which hash and
compare as their bytes), each took 5-10% longer to decode mlp's header from its recipe."""


def _timeout_split(header: bytes | memoryview) -> _TimeoutSplit | None:
    """`header` split around the first integer that follows a `"timeout":` key; None where there
    is none, or it is not a JSON integer that a uint64 holds (a leading zero, too many digits:
    the whole header is decoded then, and refused as it says).

    NOTE: the two parts are kept as a pair, apart from the headers kept whole (bytes): joined
    by a NUL, which valid JSON never holds raw, they were also the bytes of an invalid header,
    whose timeout was that NUL, and it was decoded from the recipe (found by a fuzz test)."""
    found = _TIMEOUT_VALUE.search(header)
    if found is None:
        return None
    digits = found.group(1)
    if (len(digits) > 1 and digits[0] == 0x30) or len(digits) > 20:  # (0x30: "0")
        return None
    value = int(digits)
    if value > _UINT64_MAX:
        return None
    start, end = found.span(1)
    return (bytes(header[:start]), bytes(header[end:])), value


def _timeout_slot(split: _TimeoutSplit, doc: dict[str, Any]) -> bool:
    """Whether a header decoded into `doc` may be kept under `split` too, for headers that differ
    from it only in the value of their top-level `timeout` parameter: its timeout is an integer,
    `split`'s, and no other bytes first match `_TIMEOUT_VALUE`. Checked by decoding the header
    again with another value in the slot: only that parameter may change.

    NOTE: a client that gives each request the time left of its own deadline sends a header of
    its own every time (`duetime bench` does, for a send late by a microsecond or more: 98% of
    them at 3,000-6,000 requests a second), and every one was decoded whole: 18-22 µs a header
    (mlp's, in a loop, hot) against 5.5 µs from its recipe this way, 4-5 µs for the same bytes."""
    parameters = doc.get("parameters")
    if not isinstance(parameters, dict):
        return False
    timeout = parameters.get("timeout")
    if type(timeout) is not int or timeout != split[1]:
        return False
    before, after = split[0]
    other = timeout + 1 if timeout < _UINT64_MAX else timeout - 1
    try:
        again = codec.loads_json(before + str(other).encode() + after)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(again, dict) or not isinstance(again.get("parameters"), dict):
        return False
    if again["parameters"].get("timeout") != other:
        return False
    again["parameters"]["timeout"] = timeout
    return bool(again == doc)


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} must be a JSON object")
    return value


def _inference_parameters(value: Any, where: str) -> dict[str, Any]:
    """The parameters of an inference request, or of one of its inputs or outputs (`where`:
    whose), within MAX_PARAMETERS (see `check_parameter_count`)."""
    parameters = _parameters(value, f"{where} 'parameters'")
    check_parameter_count(len(parameters), where)
    return parameters


EXACT_REREAD_BYTES = 64 << 10
"""JSON this small is read again when a request parameter needs it (see `_exact_parameters`)."""


def _rounded(value: Any) -> bool:
    """Whether `value` may be an integer of more than 64 bits that orjson read as a float (and
    rounded: -2**63 - 1 is read as -2**63)."""
    return isinstance(value, float) and value.is_integer() and not -(2**63) < value < 2**64


def _exact_parameters(json_part: memoryview, parameters: dict[str, Any]) -> dict[str, Any]:
    """The request's parameters with their integers as sent: orjson reads one of more than 64
    bits as a float (2**64 as 1.8446744073709552e+19), and a message about it (the `priority`
    or `timeout` out of range) would echo that. Read again by `json` where the JSON is small
    (its integers are exact); else, and if that fails, as orjson read them."""
    if len(json_part) > EXACT_REREAD_BYTES:
        return parameters
    try:
        exact = json.loads(bytes(json_part)).get("parameters")
    except (ValueError, RecursionError):  # (an integer of over 4,300 digits, or nesting
        return parameters  # deeper than Python's stack: orjson reads 1,024 levels)
    return exact if isinstance(exact, dict) else parameters


def _check_parameter_types(doc: dict[str, Any]) -> None:
    """InvalidInput for a parameter of the request, of an input or of an output that is no
    string, number or boolean: the v2 protocol's parameter values (Triton refuses others:
    "parameter '<p>' has invalid type"). What is no object where one belongs is left to the
    decoding to refuse."""
    _check_scalars(doc.get("parameters"), "request")
    for field in ("inputs", "outputs"):
        tensors = doc.get(field)
        for index, tensor in enumerate(tensors if isinstance(tensors, list) else ()):
            if isinstance(tensor, dict) and isinstance(tensor.get("parameters"), dict):
                # NOTE: a name of 995 nested lists was quoted with repr: RecursionError, a 500
                # (found by a tester); one that is no string is named as the decoding names it
                name = tensor.get("name")
                where = f"{field[:-1]} {name!r}" if isinstance(name, str) else f"{field}[{index}]"
                _check_scalars(tensor["parameters"], where)


def _check_scalars(parameters: Any, where: str) -> None:
    if isinstance(parameters, dict):
        check_parameter_count(len(parameters), where)  # (before the loop below)
        check_scalar_parameters(parameters, where)


def _inputs(
    value: Any,
    binary: memoryview,
    regions: SharedMemoryRegions | None,
    expected: codec.Expected | None = None,
) -> dict[str, np.ndarray]:
    """The request's input arrays. No `inputs` (or an empty list) is a request with none, as
    over gRPC: what a model with no inputs (a Constant, a generator) takes; the validator names
    the inputs missing from a request to a model that has some."""
    if value is None:
        value = []
    if not isinstance(value, list):
        raise InvalidInput(
            "request 'inputs' must be a list of tensors (JSON objects with name, datatype, "
            "shape, data)"
        )
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for index, item in enumerate(value):
        where = f"inputs[{index}]"
        if not isinstance(item, dict):
            raise InvalidInput(f"{where} must be a JSON object with name, datatype, shape, data")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"{where}: 'name' must be a non-empty string")
        where = f"input '{name}'"
        if name in arrays:
            raise InvalidInput(f"{where} appears more than once")
        datatype = codec.check_datatype(item.get("datatype"), where)
        shape = codec.parse_shape(item.get("shape"), where)
        if expected is not None:
            expected.input(name, datatype, shape)
        parameters = _inference_parameters(item.get("parameters"), where)
        window = sharedmemory.window_of(parameters, where)
        if window is not None:
            if "data" in item or "binary_data_size" in parameters:
                raise InvalidInput(
                    f"{where}: its data is in shared memory; send no 'data' or 'binary_data_size'"
                )
            data = _shared(regions, where).read(window, where, datatype, shape)
            arrays[name] = codec.from_raw(data, datatype, shape, where)
            continue
        size = _binary_size(parameters, where, len(binary))
        if size is None:
            if "data" not in item:
                raise InvalidInput(f"{where}: no 'data' and no 'binary_data_size' parameter")
            arrays[name] = codec.from_json(item["data"], datatype, shape, where)
            continue
        if "data" in item:  # (which would it be? as a raw entry beside typed contents in gRPC)
            raise InvalidInput(
                f"{where}: has both 'data' and a 'binary_data_size' parameter; send its values "
                "one way: in 'data', or as binary data after the JSON"
            )
        if offset + size > len(binary):
            raise InvalidInput(
                f"{where}: binary_data_size {size} runs past the end of the binary data "
                f"({len(binary)} bytes after the JSON header, {offset} already used)"
            )
        arrays[name] = codec.from_raw(binary[offset : offset + size], datatype, shape, where)
        offset += size
    if offset != len(binary):
        raise InvalidInput(
            f"the binary inputs use {offset} bytes but {len(binary)} follow the JSON header; "
            "check Inference-Header-Content-Length and each binary_data_size"
        )
    return arrays


def _binary_size(parameters: Mapping[str, Any], where: str, binary: int) -> int | None:
    """An input's `binary_data_size` (None: it has none); `binary`: the bytes after the JSON."""
    size = parameters.get("binary_data_size")
    if size is None:
        return None
    if isinstance(size, float) and size >= 2**64:
        # NOTE: orjson reads an integer past 2^64 - 1 as a float: 2^64 was refused as "must
        # be a non-negative integer", which it is
        raise InvalidInput(
            f"{where}: binary_data_size is 2^64 or more, past the end of the binary data "
            f"({binary} bytes after the JSON header)"
        )
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidInput(f"{where}: 'binary_data_size' must be a non-negative integer")
    return size


def _outputs(
    value: Any,
    parameters: Mapping[str, Any],
    regions: SharedMemoryRegions | None,
    expected: codec.Expected | None = None,
) -> tuple[tuple[str, ...] | None, OutputPlan]:
    default = parameters.get("binary_data_output", False)
    if not isinstance(default, bool):
        raise InvalidInput("request parameter 'binary_data_output' must be true or false")
    if value is None:
        return None, OutputPlan(default, {})
    if not isinstance(value, list):
        raise InvalidInput("request 'outputs' must be a list of {'name': ...} objects")
    names: list[str] = []
    binary: dict[str, bool] = {}
    classes: dict[str, int] = {}
    shared: dict[str, sharedmemory.Window] = {}
    for index, item in enumerate(value):
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"outputs[{index}]: 'name' must be a non-empty string")
        if expected is not None:
            expected.output(name)
        params = _inference_parameters(item.get("parameters"), f"output '{name}'")
        count = None
        if classification.PARAMETER in params:
            count = classification.class_count(params[classification.PARAMETER], name)
        window = sharedmemory.output_window_of(params, name, binary_data=True)
        if window is not None:
            window = _shared(regions, f"output '{name}'").check(window, f"output '{name}'")
        flag = params.get("binary_data", default)
        if not isinstance(flag, bool):
            raise InvalidInput(f"output '{name}': parameter 'binary_data' must be true or false")
        if name in binary:
            # NOTE: asked for again, it is answered once, as over gRPC (and as Triton, whose
            # core keeps the requested outputs in a set); but only one way
            first = _output_settings(binary[name], classes.get(name), shared.get(name))
            check_output_again(name, _output_settings(flag, count, window), first)
            continue
        names.append(name)
        binary[name] = flag
        if count is not None:
            classes[name] = count
        if window is not None:
            shared[name] = window
    plan = OutputPlan(default, binary, classes or None, shared or None, regions)
    return (tuple(names) if names else None), plan


def _output_settings(
    flag: bool, count: int | None, window: sharedmemory.Window | None
) -> dict[str, OutputSetting]:
    """An output's settings as `check_output_again` compares them, by parameter."""
    return {"binary_data": flag, classification.PARAMETER: count, "shared memory": window}


def _shared(regions: SharedMemoryRegions | None, where: str) -> SharedMemoryRegions:
    if regions is None:
        raise InvalidInput(f"{where}: shared memory is not available here; send the data inline")
    return regions


def _decoded(body: bytes, encoding: str | None, limit: int) -> bytes:
    """The body with its Content-Encoding (gzip or deflate) undone, within the size limit."""
    if encoding is None or encoding.strip().lower() in ("", "identity"):
        return body
    data = Inflation(body, encoding, limit).step(limit + 1)
    assert data is not None  # (a step as big as the limit ends, one way or the other)
    return data


INFLATE_INLINE_BYTES = 256 << 10
"""A compressed request body inflating to more than this is inflated on from there off the event
loop (see `HttpConnection._inflate`): ~1.5 ms of zlib on the 2-core VM (185 MB/s of tensors
out, 470 MB/s of zeros). The API inflates no more than this of a body itself (`_inflated_here`)."""


def _inflated_here(body: bytes, encoding: str | None, max_body: int) -> bytes:
    """The body with its Content-Encoding undone by the API, on the event loop: so to
    `INFLATE_INLINE_BYTES` at most (PayloadTooLarge past them), a control request's JSON. An
    inference body inflating to more is inflated off the loop before the API sees it (see
    `HttpConnection._inflate`).

    NOTE: the API inflated up to --max-body-bytes (64 MiB) on the loop: a control request's
    body, and an inference body on a path the front end did not take for one
    ('//v2/models/m/infer', '/v1/models/m%3Apredict'); 65 KB of gzip held every client of
    the server 0.3-0.5 s (found by a tester)."""
    if encoding is None:
        return body
    limit = min(INFLATE_INLINE_BYTES, max_body)
    try:
        return _decoded(body, encoding, limit)
    except PayloadTooLarge:
        if limit == max_body:
            raise  # (the server's body limit, said as before)
    raise PayloadTooLarge(
        f"the decompressed body is over the {limit}-byte limit for a compressed control "
        "request body (these are small JSON documents); send it uncompressed"
    )


class Inflation:
    """A request body's Content-Encoding (gzip or deflate) being undone within the size limit,
    in steps (`step`), so that the front end can do the first on the event loop and the rest,
    if any, on a thread; raises UnsupportedEncoding for another coding.

    NOTE: a compressed body was inflated whole on the loop: a 57 MB deflate request (53 MB on
    the wire) held every other client of the server 0.4-0.6 s; a 64 KB one can hold 64 MB of
    zeros. What a body inflates to is not known from its size (deflate's ratio goes to 1032),
    so the loop inflates a bounded part, and the rest goes on elsewhere."""

    def __init__(self, body: bytes, encoding: str, limit: int) -> None:
        kind = _coding(encoding)
        if kind not in ("gzip", "deflate"):
            raise UnsupportedEncoding(
                f"Content-Encoding '{encoding}' is not supported; use gzip or deflate"
            )
        self._kind = kind
        self._inflater = zlib.decompressobj(wbits=31 if kind == "gzip" else 15)
        self._limit = limit
        self._rest = body
        self._pieces: list[bytes] = []
        self._size = 0

    @property
    def size(self) -> int:
        """Bytes inflated so far."""
        return self._size

    def step(self, most: int) -> bytes | None:
        """Inflate up to `most` bytes more: the whole body once it ends, else None (more is
        left: step again); raises InvalidInput (not valid data, not one complete stream) or
        PayloadTooLarge (inflates past the limit)."""
        if not self.more(most):
            return None
        pieces = self.take()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def take(self) -> list[bytes]:
        """The pieces inflated so far (the whole body once `more` said it ended), given up."""
        pieces, self._pieces = self._pieces, []
        return pieces

    def more(self, most: int) -> bool:
        """Inflate up to `most` bytes more, kept (`take`); True once the body ends. Raises as
        `step` does.

        NOTE: a gzip body may be several members, one after the other (RFC 1952 2.2, as
        `gzip.decompress` reads it); one of two was refused as "not one complete stream" (a
        tester)."""
        kind = self._kind
        budget = most
        while True:
            inflater = self._inflater
            cap = min(budget, self._limit + 1 - self._size)  # (at least 1: see the limit)
            try:
                data = inflater.decompress(self._rest, cap)
            except zlib.error as exc:
                raise self._failed(InvalidInput(f"body is not valid {kind} data: {exc}")) from None
            self._rest = inflater.unconsumed_tail
            self._size += len(data)
            budget -= len(data)
            if self._size > self._limit:
                raise self._failed(
                    PayloadTooLarge(f"the decompressed body is over the {self._limit}-byte limit")
                )
            ended = inflater.eof
            if ended and inflater.unused_data and kind == "gzip":  # (the next member)
                self._rest = inflater.unused_data
                self._inflater = zlib.decompressobj(wbits=31)
                self._pieces.append(data)
                if budget <= 0:
                    return False
                continue
            if (not ended and len(data) < cap) or (ended and inflater.unused_data):
                # (every byte read, the stream not ended; or bytes after its end)
                raise self._failed(InvalidInput(
                    f"body is not one complete {kind} stream (truncated, or followed by other "
                    "bytes)"
                ))  # fmt: skip
            self._pieces.append(data)
            return ended

    def _failed(self, error: DuetimeError) -> DuetimeError:
        """`error`, the body refused: what was inflated of it is let go at once.

        NOTE: kept, a refused gzip bomb's 64 MiB stayed with the Inflation, which its error's
        traceback and the future holding the error kept in a reference cycle: the server grew
        ~68 MB for each one refused (413), 154 -> 2,265 MB after 30, the collector (tuned to
        run rarely) never freeing them (found by a tester)."""
        self._pieces, self._rest = [], b""
        return error

    def finish(self) -> bytes:
        """Inflate the rest (`step` to the limit)."""
        data = self.step(self._limit + 1)
        assert data is not None  # (a step as big as the limit ends, one way or the other)
        return data


# -- content codings ----------------------------------------------------------------------------

_CODINGS = ("identity", "gzip", "deflate")


def _coding(name: str) -> str:
    """A content coding's name as `_CODINGS` spell it: any case, spaces around it, and `x-gzip`
    (RFC 9110 8.4.1.3: to be read as gzip)."""
    name = name.strip().lower()
    return "gzip" if name == "x-gzip" else name


_COMPRESS_LEVEL = 1
"""zlib's fastest level: tensors compress little better at higher levels, and cost several
times more to compress (Triton uses zlib's default, 6; any level decodes the same)."""
_VARY = (b"Vary", b"Accept-Encoding")


@functools.lru_cache(maxsize=64)
def response_coding(accepted: str) -> str | None:
    """The coding of an inference answer for a request's `Accept-Encoding`: 'gzip', 'deflate' or
    None (identity), as Triton picks it (`HTTPAPIServer::GetResponseCompressionType`): of
    identity, gzip and deflate, the one with the highest q-value (1 when not given), the first
    listed on a tie; q=0 refuses a coding, and '*' or other codings name none of the three.

    NOTE: unlike Triton, names and the `q` parameter are read case-insensitively and with
    spaces around them (RFC 9110 12.5.3); a q-value that is no number in [0, 1] drops its entry.
    """
    best, weight = "identity", 0.0
    for entry in accepted.split(","):
        coding, *parameters = entry.split(";")
        coding = _coding(coding)
        if coding not in _CODINGS:
            continue
        quality = 1.0
        for parameter in parameters:
            name, _, value = parameter.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value.strip())
                except ValueError:
                    quality = -1.0
        if 0.0 <= quality <= 1.0 and quality > weight:
            best, weight = coding, quality
    return None if best == "identity" else best


def compressed(reply: Reply, coding: str) -> Reply:
    """`reply` with its body and tail compressed in `coding` (gzip or deflate, that is zlib's
    format: RFC 9110 8.4.1.2) and `Content-Encoding` set; the other headers are kept, so an
    `Inference-Header-Content-Length` still gives the JSON's length in the decompressed body (as
    Triton's, and as tritonclient reads it: it decompresses first, then splits).

    Runs on any thread: zlib releases the GIL while it compresses."""
    compressor = zlib.compressobj(_COMPRESS_LEVEL, zlib.DEFLATED, 31 if coding == "gzip" else 15)
    pieces = [compressor.compress(reply.body)]
    pieces.extend(compressor.compress(piece) for piece in reply.tail)
    pieces.append(compressor.flush())
    headers = (*reply.headers, (b"Content-Encoding", coding.encode()), _VARY)
    return Reply(reply.status, b"".join(pieces), headers)


# -- response encoding ---------------------------------------------------------------------------


def _built(
    ticket: Ticket,
    request_id: str,
    plan: OutputPlan,
    coding: str | None = None,
    json_limit: int | None = None,
) -> Reply | DuetimeError:
    """The answer, compressed in `coding` (gzip, deflate; None: not), or the request's error
    (or InvalidInput for an answer over `json_limit` bytes of JSON)."""
    try:
        reply = encode_infer_response(ticket, request_id, plan, json_limit)
    except DuetimeError as exc:
        return exc.with_traceback(None)  # this frame would hold its own traceback
    return _in_coding(reply, coding)


def _coding_of(headers: Mapping[str, str]) -> str | None:
    """The coding an answer goes in, as the request's `Accept-Encoding` asks (None: none)."""
    accepted = headers.get("accept-encoding")
    return None if accepted is None else response_coding(accepted)


def _in_coding(reply: Reply, coding: str | None) -> Reply:
    """`reply` compressed in `coding` (gzip, deflate; None: as it is)."""
    return reply if coding is None else compressed(reply, coding)


def _size(reply: Reply) -> int:
    return len(reply.body) + sum(len(piece) for piece in reply.tail)


def _bulky(ticket: Ticket, plan: OutputPlan) -> bool:
    """Whether the answer is big enough to build off the loop (see BulkReply)."""
    produced = ticket.future.result()
    shared = plan.shared or {}
    values = shared_bytes = 0
    for name in ticket.outputs:
        array = produced[name]
        if name in shared:
            shared_bytes += array.nbytes
        elif not plan.is_binary(name):
            values += array.size
    return values > BULK_JSON_VALUES or shared_bytes > BULK_SHARED_BYTES


def encode_infer_response(
    ticket: Ticket, request_id: str, plan: OutputPlan, json_limit: int | None = None
) -> Reply:
    """The v2 response: JSON, with binary outputs appended after it where the plan says so;
    raises the request's DuetimeError if it failed, and InvalidInput if its outputs in JSON
    would take more than `json_limit` bytes (see `_check_json_answer`)."""
    response = ticket.response(request_id)
    outputs = []
    blobs: list[bytes | memoryview] = []
    shared = plan.shared or {}
    if json_limit is not None:
        _check_json_answer(response.outputs, plan, json_limit)
    for name, array in response.outputs.items():
        window = shared.get(name)
        if window is not None:
            assert plan.regions is not None  # checked when the request was parsed
            outputs.append(_write_shared(name, array, window, plan.regions))
            continue
        binary = plan.is_binary(name)
        entry, raw = codec.encode_tensor(name, array, binary=binary)
        outputs.append(entry)
        if binary:
            blobs.append(raw)
    doc: dict[str, Any] = {"model_name": response.model, "model_version": response.version}
    if request_id:
        doc["id"] = request_id
    doc["parameters"] = {"variant": response.variant}
    doc["outputs"] = outputs
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return Reply(200, head)
    headers = (
        (b"Content-Type", b"application/octet-stream"),
        (b"Inference-Header-Content-Length", str(len(head)).encode()),
    )
    if sum(len(blob) for blob in blobs) > TAIL_BYTES:
        return Reply(200, head, headers, tuple(blobs))
    return Reply(200, b"".join([head, *blobs]), headers)


def _check_json_answer(outputs: Mapping[str, np.ndarray], plan: OutputPlan, limit: int) -> None:
    """InvalidInput, naming the biggest, when the outputs asked for as JSON would take more than
    `limit` bytes (`codec.json_size`), before any is encoded.

    NOTE: a JSON answer takes about 4 times its size in memory while it is made, and 20 ms a
    megabyte: one request to a model that expands its input (32 bytes in) made a 1 GB answer in
    20 s, the server 4 GB bigger. Binary data is the size of the tensor and written from it."""
    if sum(a.size for a in outputs.values()) * codec.JSON_VALUE_MAX_BYTES <= limit and not any(
        a.dtype.kind == "O" for a in outputs.values()
    ):
        return  # (every number at its longest fits: the usual answer, checked in 1 µs)
    shared = plan.shared or {}
    sizes = {
        name: codec.json_size(array, v2_datatype_of(array))
        for name, array in outputs.items()
        if name not in shared and not plan.is_binary(name)
    }
    _refuse_json_over(
        sizes, limit, "ask for it as binary data: output parameter 'binary_data': true, or "
        "request parameter 'binary_data_output': true",
    )  # fmt: skip


def _check_v1_answer(outputs: Mapping[str, np.ndarray], limit: int) -> None:
    """InvalidInput, naming the biggest, when a V1 answer (JSON only) would take more than
    `limit` bytes (see `_check_json_answer`), before any is encoded."""
    if sum(a.size for a in outputs.values()) * codec.JSON_VALUE_MAX_BYTES <= limit and not any(
        a.dtype.kind == "O" for a in outputs.values()
    ):
        return
    _refuse_json_over(
        v1_json_size(dict(outputs)), limit, "a V1 answer is JSON only: send fewer instances, "
        "or ask with the v2 protocol (POST /v2/models/<m>/infer) for the output as binary data",
    )  # fmt: skip


def _refuse_json_over(sizes: Mapping[str, int], limit: int, advice: str) -> None:
    """InvalidInput naming the biggest output when the outputs' JSON `sizes` (bytes) add up to
    more than `limit`, with `advice` on what to ask for instead."""
    total = sum(sizes.values())
    if total <= limit:
        return
    name = max(sizes, key=sizes.__getitem__)
    raise InvalidInput(
        f"output '{name}' is too big to answer as JSON: about {sizes[name]} bytes of JSON"
        + (f" ({total} with the other outputs)" if total != sizes[name] else "")
        + f", over the {limit}-byte limit for a JSON answer (server flag "
        f"--max-json-answer-bytes); {advice}"
    )


def _write_shared(
    name: str, array: np.ndarray, window: sharedmemory.Window, regions: SharedMemoryRegions
) -> dict[str, Any]:
    """Write an output into its shared-memory window; its JSON entry, which names the window."""
    datatype = v2_datatype_of(array)
    raw = codec.raw_view(array, datatype)
    regions.write(window, raw, f"output '{name}'")
    return {
        "name": name, "datatype": datatype, "shape": list(array.shape),
        "parameters": {sharedmemory.REGION: window.region, sharedmemory.BYTE_SIZE: len(raw)},
    }  # fmt: skip


@functools.cache
def _openapi() -> Reply:
    """The OpenAPI document of this API, shipped in the package (`frontend/openapi.json`)."""
    text = resources.files("duetime.frontend").joinpath("openapi.json").read_bytes()
    return Reply(200, text)


_MODEL_GETS = (["ready"], ["config"], ["stats"])
"""The resources under `/v2/models/<m>[/versions/<v>]` that take GET alone, but for the
model's metadata (the model's own path)."""


def _expect(method: str, allowed: str, answer: Callable[[], Reply]) -> Reply:
    if method != allowed:
        raise _method_not_allowed(allowed)
    return answer()


def _method_not_allowed(allowed: str) -> HttpError:
    """405 naming the methods `allowed` (a GET resource takes HEAD too: the server answers a
    HEAD as its GET without the body; NOTE: Allow left HEAD out, found by a tester)."""
    listed = allowed.replace("GET", "GET, HEAD")
    headers = ((b"Allow", listed.encode()),)
    return HttpError(405, f"method not allowed here; use {allowed}", headers=headers)


INFER_TARGETS_MAX = 256
"""Inference targets kept routed per server; all are dropped when full."""


def _infer_of(parts: list[str]) -> tuple[str, str | None]:
    """The model and version (None: the default) an inference path names (`_names_infer`)."""
    return parts[2], parts[4] if len(parts) == 6 else None


def _names_infer(parts: list[str]) -> bool:
    """Whether a path is `/v2/models/<m>[/versions/<v>]/infer`, which `_model_route` sends to
    `_infer` with model `parts[2]` and version `parts[4]` (if there)."""
    if parts[-1:] != ["infer"] or parts[:2] != ["v2", "models"]:
        return False
    return len(parts) == 4 or (len(parts) == 6 and parts[3] == "versions")


def _names_predict(parts: list[str]) -> bool:
    """Whether a path is `/v1/models/<m>:predict` (or `:explain`)."""
    return (
        len(parts) == 3
        and parts[:2] == ["v1", "models"]
        and parts[2].rpartition(":")[2] in _V1_VERBS
    )


def _segments(target: bytes) -> list[str]:
    """The segments of the target's path, decoded; empty ones ('//') are kept (see `_collapsed`)
    but for the one before the leading slash and the one after a trailing slash."""
    path = target.split(b"?", 1)[0].decode("latin-1")
    if not path.startswith("/") and "://" in path:  # absolute-form (RFC 9112 3.2.2), via a proxy
        path = "/" + path.split("://", 1)[1].partition("/")[2]
    parts = path.split("/")
    if not parts[0]:
        del parts[0]
    if parts and not parts[-1]:
        parts.pop()
    if "%" not in path:  # NOTE: the common case, without four calls to unquote per request
        return parts
    return [unquote(part) for part in parts]


_NAMED_SEGMENTS: dict[tuple[str, ...], tuple[int, str]] = {
    ("v2", "models"): (2, "model name"),
    ("v1", "models"): (2, "model name"),
    ("v2", "repository"): (3, "model name"),  # /v2/repository/models/<m>/...
    ("v2", "systemsharedmemory"): (3, "region name"),  # .../region/<r>/...
    ("v2", "cudasharedmemory"): (3, "region name"),
}
"""Where a path names something, by its first two segments: the name's segment and what it
names (the segment before it is one of `_NAMERS`)."""
_NAMERS = ("models", "region")


def _collapsed(parts: list[str], target: bytes) -> list[str]:
    """`parts` without their empty segments, as if each '//' in the path were one '/';
    InvalidInput where an empty segment stands for a model name, a version or a region name.

    NOTE: collapsed there, the path would name another endpoint ('/v2/models//infer': the
    metadata of a model 'infer'), or be refused for the wrong reason (405, use GET).
    Every step is linear in the segments: dropping the leading ones one slice at a time held
    the loop for 21 s on a request line of 60,000 slashes (under the 64 KiB head limit)."""
    first = next((i for i, part in enumerate(parts) if part), len(parts))
    parts = parts[first:]  # '//v2/...' (a client's base URL ending in '/')
    what = _empty_name(parts)
    if what is not None:
        path = target.split(b"?", 1)[0].decode("latin-1")
        raise InvalidInput(f"the {what} in '{path}' is empty (an empty path segment); name one")
    return [part for part in parts if part]


def _empty_name(parts: list[str]) -> str | None:
    """What the empty segment of `parts` stands for, if one names something."""
    index, what = _NAMED_SEGMENTS.get(tuple(parts[:2]), (0, ""))
    if what and len(parts) > index and not parts[index] and parts[index - 1] in _NAMERS:
        return what
    if parts[:2] == ["v2", "models"] and len(parts) > 4 and parts[3] == "versions":
        return None if parts[4] else "version"
    return None
