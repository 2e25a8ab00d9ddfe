"""The KServe v2 gRPC front end (`inference.GRPCInferenceService`) on grpc.aio."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

import grpc
import numpy as np
from google.protobuf import json_format

from duetime import __version__, classification
from duetime.config import ServerSettings, url_host
from duetime.datatypes import NUMPY_OF, v2_datatype_of
from duetime.engine import SHUTTING_DOWN, Engine, Ticket, settled
from duetime.errors import (
    TIMEOUT_EXPIRED,
    ConfigError,
    DeadlineExceeded,
    DuetimeError,
    InternalError,
    InvalidInput,
    ModelUnavailable,
    PayloadTooLarge,
    Shed,
    Unsupported,
    fitted,
)
from duetime.frontend import codec, sharedmemory
from duetime.frontend.answersizes import LargestAnswers, distrust, shaped_bytes
from duetime.frontend.grpcbacklog import (
    CoreBacklog,
    CountingServer,
    core_counts_reader,
    server_ids,
)
from duetime.frontend.grpchealth import add_health_and_reflection
from duetime.frontend.grpcreads import FirstMessages, FirstMessageServer
from duetime.frontend.metadata import model_config_json, model_metadata_json
from duetime.frontend.parameters import (
    OutputSetting,
    check_grpc_parameters,
    check_output_again,
    check_parameter_count,
    due_from_timeout_us,
    priority_of,
)
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.frontend.proto import grpc_service_pb2_grpc as pb_grpc
from duetime.frontend.protowhere import undecodable_at
from duetime.frontend.rest import (
    BULK_SHARED_BYTES,
    EXTENSIONS,
    ClientWithdrew,
    Signatures,
    answer_failed,
    check_control_token,
    check_unload_request,
    count_unreturned,
    load_request,
    refused_unrun,
    shut_down_during,
)
from duetime.frontend.sharedmemory import CUDA_REGIONS, SharedMemoryRegions
from duetime.observability.logs import AccessSampler, log_cancelled, log_request
from duetime.observability.logsettings import LogSettings
from duetime.observability.tracesettings import TraceSettings, trace_settings_of
from duetime.observability.tracing import (
    RequestTiming,
    Tracing,
    new_trace_id,
    parse_traceparent,
)
from duetime.overload import LoadShedder
from duetime.repository.manager import check_model_name
from duetime.repository.registry import parse_version
from duetime.types import InferRequest, InferResponse

if TYPE_CHECKING:
    from duetime.repository.outputsizes import OutputSizes

log = logging.getLogger("duetime.grpc")

STREAM_WINDOW = 64
"""Requests of one ModelStreamInfer stream in flight at once (more wait to be read)."""
FINAL_RESPONSE = "triton_final_response"
"""The parameter Triton sets on every ModelStreamInfer response: true on a request's last one
(here every response: duetime serves no decoupled models)."""
MESSAGE_SLACK = 64 * 1024
"""An answer whose output bytes come this close to the message limit has its size checked."""

#: v2 datatype -> the InferTensorContents field that carries it (FP16 only travels raw).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip


class AnswerBudget:
    """Bytes of big gRPC answers being made or not yet sent, over all calls, within `limit`.

    grpc.aio holds an answer until its client takes it (a unary call ends once its message is
    sent or the call is cancelled; a stream's next answer waits for the one before): a client
    that reads nothing holds every answer it asked for (30 calls for 64 MiB answers, on a
    connection whose flow-control window stayed shut, grew the server by 1.6 GB). So a call
    holds, before its request is decoded, what its model's answers weigh (the largest it made
    so far; before any, `unknown`: the most an answer may weigh), from then until its answer is
    sent; one that would go over `limit` waits, in order, until others are sent, or until its
    due time, when it is refused (see `AnswerHold.taken`). Models whose answers are `small`
    bytes or less are not counted.

    NOTE: before a model's first answer, `guess` (what its load-time samples made, at its
    largest batch) stands in for `unknown`: with 64 MiB feared for every call, 5 calls filled
    the 1 GiB default and the sixth waited, undecoded, until an answer was sent: a fresh
    server's gRPC calls ran in turn past the fifth (a priority-1 request sent 175 ms before the
    running one ended reached the scheduler after it, and ran after a level-2 one).

    NOTE: a model with no guess whose answers follow its requests' shapes (free dims besides
    the batch's) held the largest message per call too, 5 calls at once under the 1 GiB
    default, the rest waiting in arrival order before the scheduler saw them (found by a
    tester): its graph's shapes give each call's answer from its request's (`sizes`, see
    repository/outputsizes.py; 15 of 16 such calls reach the scheduler at once now).

    NOTE: an answer counts `ANSWER_COPIES` times its outputs' bytes, what the server holds for
    it: the outputs, the message that carries them, and that message serialized, which grpc.aio
    keeps until sent (measured: 60 streams of 32 MiB answers none of which was read held 3.2 GB
    when each counted once, within 1 GiB).
    """

    def __init__(
        self, limit: int, unknown: int, small: int,
        guess: Callable[[str], int | None] | None = None,
        sizes: Callable[[str], tuple[OutputSizes, ...] | None] | None = None,
        class_bytes: Callable[[str], float] | None = None,
    ) -> None:  # fmt: skip
        self.limit = limit
        self.unknown = unknown
        self.small = small
        self._guess = guess
        self._sizes_of = sizes
        self._class_bytes = class_bytes
        self.held = 0
        self._sizes = LargestAnswers()
        self._waiting: deque[tuple[int, asyncio.Future[bool]]] = deque()

    @classmethod
    def of(
        cls,
        settings: ServerSettings,
        guess: Callable[[str], int | None] | None = None,
        sizes: Callable[[str], tuple[OutputSizes, ...] | None] | None = None,
        class_bytes: Callable[[str], float] | None = None,
    ) -> AnswerBudget:
        limit = settings.max_unsent_answer_bytes
        small = max(1, limit // settings.max_connections)
        return cls(limit, settings.max_grpc_message_bytes, small, guess, sizes, class_bytes)

    def hold(self, model: str, request: Any = None) -> AnswerHold:
        """A hold for an answer of `model` to `request` (a ModelInferRequest; its `taken`
        waits for room). Where nothing tells the model's answers' size (no guess: they follow
        its requests' shapes or values), its `sizes` (`Engine.answer_sizes`) give it from the
        request's shapes if they can; else it is the most an answer may weigh. Outputs asked
        for as their top classes count as texts (`class_bytes`).

        NOTE: an output's top classes are texts of up to ~70 bytes each where its values were
        4 bytes: held at their values' size, a tester's calls asking for classes made 65 times
        what they held (labels of 200 characters)."""
        size, shaped = self.estimate(model, request)
        # NOTE: the answer echoes the request's id, which no estimate of its outputs counted:
        # calls with 20 MB ids to a model of 4-byte answers held nothing, and 10 of 10 ran
        # under a 96 MiB bound, +1 GB (found by a tester)
        echoed = len(request.id.encode()) if request is not None and request.id else 0
        return AnswerHold(self, model, size, shaped, echoed)

    def estimate(
        self, model: str, request: Any = None
    ) -> tuple[int, tuple[OutputSizes, ...] | None]:
        """What an answer of `model` to `request` is expected to weigh (see `hold`), and the
        sizes that said so from its shapes (None: not those)."""
        size = self._sizes.expected(model, self._guess, self.unknown)
        shaped: tuple[OutputSizes, ...] | None = None
        if request is not None:
            if size >= self.unknown and self._sizes_of is not None:
                shaped = self._sizes_of(model)
                made = None if shaped is None else _shaped_bytes(shaped, request)
                if made is None:
                    shaped = None
                else:
                    size = made
            if self._class_bytes is not None and any(
                classification.PARAMETER in output.parameters for output in request.outputs
            ):
                size = math.ceil(size * self._class_bytes(model))
        return min(size, self.unknown), shaped

    def waits(self, size: int) -> bool:
        """Whether a call holding `size` more bytes would wait for room now (see `take`)."""
        return bool(self._waiting) or not (self.held == 0 or self.held + size <= self.limit)

    def learned(self, model: str, size: int) -> None:
        self._sizes.learned(model, size)

    async def take(self, size: int, within_s: float | None = None) -> bool:
        """Hold `size` more bytes once they fit (nothing else held, or within `limit`), after
        the calls that waited first; False (nothing held) where they did not fit within
        `within_s` seconds (None: no limit)."""
        if not self.waits(size):
            self.held += size
            return True
        if within_s is not None and within_s <= 0:
            return False
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        entry = (size, future)
        self._waiting.append(entry)
        timer = None if within_s is None else loop.call_later(within_s, self._expire, entry)
        try:
            return await entry[1]
        except asyncio.CancelledError:
            if entry[1].cancelled():
                if entry in self._waiting:  # (else `_let_in` dropped it)
                    self._waiting.remove(entry)
                self._let_in()  # (those behind it may fit)
            elif entry[1].result():  # (let in, then cancelled before it ran on)
                self.give(size)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, entry: tuple[int, asyncio.Future[bool]]) -> None:
        """`entry` waited as long as it may: out of the line, not let in."""
        if not entry[1].done():
            self._waiting.remove(entry)
            entry[1].set_result(False)
            self._let_in()

    def give(self, size: int) -> None:
        self.held -= size
        self._let_in()

    def _let_in(self) -> None:
        """Let in, in order, the calls waiting that fit now.

        NOTE: a call cancelled while it waits has its future cancelled at once, and leaves the
        line only when its task runs on: one here may be cancelled (set, it raised)."""
        waiting = self._waiting
        while waiting:
            size, future = waiting[0]
            if not future.done():
                if self.held and self.held + size > self.limit:
                    return
                self.held += size
                future.set_result(True)
            waiting.popleft()

    def resize(self, old: int, new: int) -> None:
        if new > old:
            self.held += new - old
        elif old > new:
            self.give(old - new)


ANSWER_COPIES = 3
"""How many times an answer's outputs the server holds until it is sent (see AnswerBudget)."""


def _shaped_bytes(sizes: tuple[OutputSizes, ...], request: Any) -> int | None:
    """`shaped_bytes` of a ModelInferRequest's answer."""
    shapes = {tensor.name: tensor.shape for tensor in request.inputs}
    return shaped_bytes(sizes, shapes, [output.name for output in request.outputs])


class AnswerHold:
    """One call's part of an `AnswerBudget`: the bytes it holds until `release`."""

    __slots__ = ("_budget", "_echoed", "_estimate", "_model", "_sizes", "reads", "size")

    def __init__(
        self,
        budget: AnswerBudget,
        model: str,
        estimate: int,
        sizes: tuple[OutputSizes, ...] | None = None,
        echoed: int = 0,
    ) -> None:
        """`estimate`: its outputs' bytes; `sizes`: what gave it from the request's shapes
        (None: not those); `echoed`: the bytes the answer carries besides (the request's id)."""
        self._budget = budget
        self._model = model
        self._estimate = estimate
        self._sizes = sizes
        self._echoed = echoed
        self.size = 0
        self.reads: sharedmemory.HeldReads | None = None
        """What its request copied out of shared memory, held until `release` too."""

    async def taken(self, within_s: float | None = None, request: Any = None) -> None:
        """Hold the model's estimate, once it fits, if big; DeadlineExceeded where it did not
        fit within `within_s` seconds (the time to the request's due time; None: none). Where
        it waited, the estimate for `request` (its ModelInferRequest) is made anew.

        NOTE: the request is not kept on the hold: the call's done callback holds the hold,
        and grpc.aio keeps a failed call's state in a cycle (see `_abort`); a request kept
        there lived until the cyclic collector ran (20 failed calls, 20 requests alive).

        NOTE: the wait had no end but the client's: with 200 MiB of answers unread by three
        streams, a call with a 100 ms `timeout` parameter waited 5 s, until its client's gRPC
        deadline (100 s with a 100 s one), neither answered nor refused."""
        budget = self._budget
        while self._estimate + self._echoed > budget.small:
            held = (self._estimate + self._echoed) * ANSWER_COPIES
            waits = budget.waits(held)
            started = time.monotonic() if waits else 0.0
            if not await budget.take(held, within_s):
                raise DeadlineExceeded(
                    f"{TIMEOUT_EXPIRED}: model '{self._model}': the request was due before its "
                    f"answer had room: answers not yet read by their clients fill the "
                    f"{budget.limit} bytes the server holds for them (server setting "
                    "max_unsent_answer_bytes, --max-unsent-answer-bytes); retry with a later "
                    "due time, or once clients read their answers"
                )
            self.size = held
            if not waits or request is None:
                return
            # NOTE: estimated before it waited: a model reloaded meanwhile with bigger answers
            # had every call that waited run at the old size (found by a tester: 24 of 24
            # calls ran under a 100 MB bound, +1.3 GB). Estimated anew, a bigger one waits
            # again for all it needs, behind those in line.
            estimate, sizes = budget.estimate(self._model, request)
            if estimate <= self._estimate:
                return
            self.release()
            self._estimate, self._sizes = estimate, sizes
            if within_s is not None:
                within_s -= time.monotonic() - started

    def made(self, size: int) -> None:
        """The answer is made and its outputs weigh `size` bytes: held from now on if big."""
        budget = self._budget
        budget.learned(self._model, size)
        if self._sizes is not None:
            distrust(self._sizes, self._model, size, self._estimate)
        size += self._echoed
        counted = size * ANSWER_COPIES if size > budget.small else 0
        if counted != self.size:
            budget.resize(self.size, counted)
            self.size = counted

    def release(self, _context: object = None) -> None:
        """The answer is sent, or never will be (a call's done callback)."""
        if self.size:
            size, self.size = self.size, 0
            self._budget.give(size)
        if self.reads is not None:
            self.reads.release()


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    """Answers v2 gRPC calls from the engine; every DuetimeError becomes its status code."""

    def __init__(
        self,
        engine: Engine,
        shedder: LoadShedder | None = None,
        control_token: str | None = None,
        tracing: Tracing | None = None,
        access_log_sample: float = 0.0,
        log_settings: LogSettings | None = None,
        trace_settings: TraceSettings | None = None,
        shared_memory: SharedMemoryRegions | None = None,
        max_message_bytes: int | None = None,
        intake: sharedmemory.Room | None = None,
    ) -> None:
        """`intake`: where the requests' bytes read from shared memory are held within the
        server's in-flight limits, with HTTP's request bodies (None: they are not counted)."""
        self._engine = engine
        self._max_message_bytes = max_message_bytes
        self._regions = shared_memory or SharedMemoryRegions()
        self._intake = intake
        self._read_by_peer: dict[str, int] = {}
        """Bytes read from shared memory held by each connection's requests (see `_reads`)."""
        self._log_settings = log_settings or LogSettings()
        self._trace_settings = trace_settings or trace_settings_of(tracing)
        self._control_token = control_token
        self._tracing = tracing
        self._access = AccessSampler(access_log_sample)
        self._shedder = shedder
        self._signatures = Signatures(engine)
        self.gone_calls = 0
        """ModelInfer calls whose client had gone (cancelled, or past its deadline) before their
        handler ran: left unanswered, undecoded."""
        self.shed = 0
        """Inference requests the load shedder refused unread (RESOURCE_EXHAUSTED; see
        `RestApi.shed`)."""
        self.refused: dict[tuple[str, str], int] = {}
        """Inference requests (ModelInfer calls, streamed requests) answered with an error
        before any model ran them, by (status code name, error class): undecodable, a bad
        parameter, an unknown model, refused at admission or due before they were queued, or
        refused by their scheduler once queued (`refused_unrun`: expired unrun, pushed out of a
        full queue; the load shedder's refusals count in its own metric). Bounded: no key comes
        from the client (see `RefusedCollector`)."""
        self.answers = self.budget(ServerSettings())
        """What answers not yet sent hold (`serve_grpc` sets the server's limits)."""
        self.backlog: CoreBacklog | None = None
        """The calls waiting in gRPC's core (`serve_grpc` sets it, where channelz is there)."""
        self.accepting = True
        self._intakes: set[_Intake] = set()
        """The open ModelStreamInfer streams' readers (`stop_accepting` stops them)."""

    def stop_accepting(self) -> None:
        """The server is shutting down: take no more inference requests. Each open stream
        reads no more, sends the answers of the requests it has, and ends UNAVAILABLE.

        NOTE: a stream went on reading: each request sent during the shutdown grace got its
        own "shutting down" error (and WARNING: 536 in one run), and an idle stream held the
        shutdown for the whole grace, until gRPC cancelled it."""
        self.accepting = False
        for intake in list(self._intakes):
            intake.stop()

    def answer_guess(self, model: str) -> int | None:
        """What `model`'s answers are expected to weigh before it made one (see `AnswerBudget`
        and `Engine.answer_guess`)."""
        return self._engine.answer_guess(model)

    def budget(self, settings: ServerSettings) -> AnswerBudget:
        """A budget for unsent answers within `settings`' limits, estimating from the engine."""
        engine = self._engine
        return AnswerBudget.of(
            settings, engine.answer_guess, engine.answer_sizes, engine.class_bytes
        )

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    def serving(self) -> bool:
        """Whether the server takes inference requests: accepting, with its models ready."""
        return self.accepting and self._engine.ready

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.serving())

    async def ModelReady(self, request: Any, context: Any) -> Any:
        try:
            self._engine.registry.resolve(request.name, request.version or None)
        except InvalidInput as exc:
            # (a version that is not a number: a malformed request, as HTTP's ready and
            # Triton's ModelReady answer it, not a version that is merely not ready)
            _abort(context, exc)
        except DuetimeError:
            return pb.ModelReadyResponse(ready=False)
        engine = self._engine  # (not ready while every instance's breaker is open)
        ready = self.accepting and engine.registry.takes_work(
            request.name, request.version or None, engine.clock.now_ns()
        )
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(name="duetime", version=__version__, extensions=EXTENSIONS)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        try:
            deployment = self._engine.registry.resolve(request.name, request.version or None)
            served = self._engine.registry.snapshot.models[request.name]
        except DuetimeError as exc:
            _abort(context, exc)
        doc = model_metadata_json(deployment.model, sorted(served.versions, key=int))
        return json_format.ParseDict(doc, pb.ModelMetadataResponse())

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        try:
            deployment = self._engine.registry.resolve(request.name, request.version or None)
        except DuetimeError as exc:
            _abort(context, exc)
        response = pb.ModelConfigResponse()
        json_format.ParseDict(model_config_json(deployment.model), response.config)
        return response

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        """The statistics of a model's versions (of `version` only), or of every model's.

        NOTE: with no name and a version, only each model's version of that number was given:
        Triton checks the version string, then gives every model's versions
        (TRITONSERVER_ServerModelStatistics reads the version only with a name), as
        `/v2/models/stats` does (found by a tester)."""
        name, version = request.name or None, request.version or None
        try:
            if name is None and version is not None:
                parse_version("", version)  # (refused if malformed, as Triton does)
                version = None
            doc = self._engine.statistics(name, version)
        except DuetimeError as exc:
            _abort(context, exc)
        for entry in doc["model_stats"]:
            del entry["duetime"]  # duetime's own figures have no field in the proto
        return json_format.ParseDict(doc, pb.ModelStatisticsResponse())

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        _one_repository(request, context)
        entries = self._engine.repository_index(request.ready)
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**entry) for entry in entries]
        )

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        _one_repository(request, context)
        try:
            self._check_token(context)
            name = _model_to_change(request)
            asked = load_request(_parameters(request.parameters), name)
            await self._engine.load_model(name, asked.config, asked.files)
        except DuetimeError as exc:
            _abort(context, exc)
        except asyncio.CancelledError:
            _shut_down_during(context, f"the load of model '{name}'")
        return _changed(pb.RepositoryModelLoadResponse(), name)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        _one_repository(request, context)
        try:
            self._check_token(context)
            name = _model_to_change(request)
            check_unload_request(_parameters(request.parameters))
            await self._engine.unload_model(name)
        except DuetimeError as exc:
            _abort(context, exc)
        except asyncio.CancelledError:
            _shut_down_during(context, f"the unload of model '{name}'")
        return _changed(pb.RepositoryModelUnloadResponse(), name)

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        try:
            regions = self._regions.status(request.name or None)
        except DuetimeError as exc:
            _abort(context, exc)
        response = pb.SystemSharedMemoryStatusResponse()
        for region in regions:
            response.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return response

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        register = self._regions.register
        await self._change(
            context, lambda: register(request.name, request.key, request.offset, request.byte_size)
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self._change(context, lambda: self._regions.unregister(request.name or None))
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        try:
            CUDA_REGIONS.status(request.name or None)
        except DuetimeError as exc:
            _abort(context, exc)
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await self._change(context, lambda: CUDA_REGIONS.register(request.name))
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self._change(context, lambda: CUDA_REGIONS.unregister(request.name or None))
        return pb.CudaSharedMemoryUnregisterResponse()

    def _check_token(self, context: Any) -> None:
        """Unauthorized unless the call carries the control token (when the server has one).

        NOTE: gRPC metadata keys are lower-case: a client given `Authorization` (tritonclient's
        `headers=`) fails in its own library with INTERNAL "Invalid metadata" before anything is
        sent, so the message names the key a gRPC client can send."""
        check_control_token(
            self._control_token,
            _Metadata(context).get("authorization"),
            send="metadata 'authorization: Bearer <token>' (the key in lower case)",
        )

    async def _change(self, context: Any, change: Callable[[], None]) -> None:
        """Make a change only a caller holding the control token may make; the call ends with
        the error's status if the token is missing or the change fails."""
        try:
            self._check_token(context)
            change()
        except DuetimeError as exc:
            _abort(context, exc)

    async def TraceSetting(self, request: Any, context: Any) -> Any:
        model = request.model_name or None
        try:
            if model is not None:
                self._engine.registry.resolve(model, None)
            if request.settings:
                self._check_token(context)
                changes = {name: list(value.value) for name, value in request.settings.items()}
                settings = self._trace_settings.update(changes, model)
            else:
                settings = self._trace_settings.current(model)
        except DuetimeError as exc:
            _abort(context, exc)
        response = pb.TraceSettingResponse()
        for name, value in settings.items():
            response.settings[name].value.extend(value if isinstance(value, list) else [value])
        return response

    async def LogSettings(self, request: Any, context: Any) -> Any:
        try:
            if request.settings:
                self._check_token(context)
                changes = _parameters(request.settings)  # (the same oneof as InferParameter)
                files = self._control_token is not None  # checked above
                settings = self._log_settings.update(changes, files=files)
            else:
                settings = self._log_settings.current()
        except DuetimeError as exc:
            _abort(context, exc)
        response = pb.LogSettingsResponse()
        for name, value in settings.items():
            setattr(response.settings[name], _LOG_SETTING_FIELD[type(value)], value)
        return response

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        tracing = self._tracing
        timing = RequestTiming(self._engine.clock.now_ns()) if tracing is not None else None
        ticket: Ticket | None = None
        submitted: _Submitted | None = None
        error: DuetimeError | None = None
        hold = self.answers.hold(request.model_name, request)
        context.add_done_callback(hold.release)
        arrived: int | None = None
        try:
            arrived, due = self._dated(request, context)
            try:
                await hold.taken(self._within(due), request)
            except DeadlineExceeded as late:
                raise self._late_for_room(late, request, context, arrived, due, timing) from None
            submitted = self._submit(request, context, arrived, due, timing, shed=False, hold=hold)
            ticket = submitted.ticket
            response = await self._response(submitted, request.id, hold)
        except DuetimeError as exc:
            error = exc.with_traceback(None)  # this frame would hold its own traceback
        except asyncio.CancelledError:
            self._withdrawn(context, "grpc", request, ticket, timing)
            if ticket is None and arrived is not None:
                # NOTE: withdrawn while it waited for room for its answer, it was counted
                # nowhere, where one withdrawn from the queue counts cancelled (found by a
                # tester)
                self._engine.cancelled_unqueued(
                    request.model_name, request.model_version or None, arrived
                )
            raise
        except Exception as exc:
            log.exception("internal error in ModelInfer")
            error = InternalError(f"internal error: {type(exc).__name__}: {exc}")
        trace_id = self._record(request, context, timing, ticket, error, "grpc")
        if error is not None:
            if ticket is None:
                self.count_refused(error)
                self._engine.router.count_invalid(error, request.model_name, request.model_version)
            # NOTE: no answer to hold: what it held went on holding room until its status was
            # sent, which a client that reads nothing may never let happen (found by a tester:
            # two invalid calls held 96 MiB, and others' calls waited past their due times)
            hold.release()
            if _gone(context):  # (an abort on a call gRPC has ended logs ExecuteBatchError)
                return _no_answer(context, error)
            _abort(context, error, trace_id, request.model_name, request.model_version)
        if trace_id is not None:
            context.set_trailing_metadata((("x-trace-id", trace_id),))
        if self._access.take():
            log_request(
                protocol="grpc", model=request.model_name, version=response.model_version,
                status=200, reason=None, trace_id=trace_id, grpc_code="OK",
            )  # fmt: skip
        return response

    def _record(
        self,
        request: Any,
        context: Any,
        timing: RequestTiming | None,
        ticket: Ticket | None,
        error: DuetimeError | None,
        protocol: str,
    ) -> str | None:
        """The request's span, whatever became of it (refused at admission, invalid, expired:
        those most worth a look); its trace id, or the caller's (None: neither)."""
        metadata = _Metadata(context)
        parent = parse_traceparent(metadata.get("traceparent"), metadata.get("tracestate"))
        tracing = self._tracing
        if tracing is None or timing is None:
            return parent.trace_id_hex if parent is not None else None
        if ticket is not None:
            model, version, variant = ticket.model, ticket.version, ticket.variant
        else:
            model = request.model_name
            version, variant = self._engine.registry.attribution(
                model, request.model_version, invalid=isinstance(error, InvalidInput)
            )
        return tracing.record(
            timing, parent, protocol=protocol, model=model, version=version, variant=variant,
            error=error, done_ns=self._engine.clock.now_ns(),
        )  # fmt: skip

    def _withdrawn(
        self, context: Any, protocol: str, request: Any, ticket: Ticket | None,
        timing: RequestTiming | None,
    ) -> None:  # fmt: skip
        """The span and the log line of a call (or a stream's request) its client ended before
        its answer: gRPC's CANCELLED (499 in the line), with its span's trace id, else the
        caller's.

        NOTE: it was only logged, with no span, where a withdrawn HTTP request has one (see
        `RestApi._withdrawn_span`) and every other failed call too (found by a tester)."""
        if ticket is not None and timing is not None and not timing.finished_ns:
            timing.finished_ns = self._engine.clock.now_ns()  # (its wait, or its run, ends here)
        withdrew = ClientWithdrew(
            "the client cancelled the call before its answer" if protocol == "grpc"
            else "the stream ended before its answer"
        )  # fmt: skip
        trace_id = self._record(request, context, timing, ticket, withdrew, protocol)
        model = ticket.model if ticket is not None else request.model_name
        version = ticket.version if ticket is not None else request.model_version
        log_cancelled(protocol, model, version, trace_id)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        """Requests of a stream run concurrently (they batch with each other and with other
        clients'); answers go back in request order, at most STREAM_WINDOW in flight, each
        holding its part of `answers` until it is sent. A request that fails gets its error in
        the stream (`error_message`), or, where the client asked with Triton's
        `triton_grpc_error: true` header, ends the stream with the error's status code. An
        answer ready by its due time but held past it behind earlier ones is sent as a
        DEADLINE_EXCEEDED error instead (see `_held_late`). Once the server stops accepting
        (`stop_accepting`), the stream reads no more requests, sends the answers of those it
        has, and ends UNAVAILABLE."""
        if not self.accepting:
            _abort(context, ModelUnavailable(STREAM_SHUT_DOWN))
        grpc_errors = _wants_grpc_errors(context)
        window: _Window = asyncio.Queue(STREAM_WINDOW)
        intake = _Intake()
        reader = asyncio.get_running_loop().create_task(
            self._read_stream(requests, context, window, intake)
        )
        intake.task = reader
        self._intakes.add(intake)
        try:
            while (item := await window.get()) is not None:
                request, submitted, timing, hold = item
                try:
                    answer = self._held_late(submitted)
                    if answer is None:
                        answer = await self._waited_answer(
                            submitted, request, context, hold, timing
                        )
                    ticket = None if isinstance(submitted, DuetimeError) else submitted.ticket
                    if not isinstance(answer, DuetimeError):
                        self._record(request, context, timing, ticket, None, STREAM)
                        yield answer
                        continue
                    trace_id = self._record(request, context, timing, ticket, answer, STREAM)
                    hold.release()  # (an error's message is small: see ModelInfer)
                    if grpc_errors:
                        model, version = request.model_name, request.model_version
                        _abort(context, answer, trace_id, model, version)
                    yield self._stream_error(request, answer, context, trace_id)
                finally:
                    hold.release()  # (sent: the next answer waited for it)
            if intake.stopped and not intake.finished:
                _abort(context, ModelUnavailable(STREAM_SHUT_DOWN))
        finally:
            self._intakes.discard(intake)
            intake.task = None  # (its frames hold `intake`: no cycle through its error)
            reader.cancel()
            while not window.empty():
                left = window.get_nowait()
                if left is not None:
                    left[3].release()
                    if isinstance(left[1], _Submitted) and left[1].ticket.future.cancel():
                        self._withdrawn(context, STREAM, left[0], left[1].ticket, left[2])

    async def _read_stream(
        self, requests: AsyncIterator[Any], context: Any, window: _Window, intake: _Intake
    ) -> None:
        """Submit a stream's requests as they come, each into `window` (None at the end: the
        client's, or the server's: `intake` stopped)."""
        clock = self._engine.clock
        incoming = aiter(requests)
        try:
            while not intake.stopped:
                intake.reading = True
                try:
                    request = await anext(incoming)
                except StopAsyncIteration:
                    intake.finished = True
                    return
                finally:
                    intake.reading = False
                hold = self.answers.hold(request.model_name, request)
                timing = RequestTiming(clock.now_ns()) if self._tracing is not None else None
                try:
                    arrived, due = self._dated(request, context, new_call=False)
                    try:
                        await hold.taken(self._within(due), request)
                    except DeadlineExceeded as late:
                        raise self._late_for_room(
                            late, request, context, arrived, due, timing, STREAM
                        ) from None
                    except asyncio.CancelledError:
                        # NOTE: the stream ended while it waited for room: counted nowhere,
                        # where a ModelInfer call's counts cancelled (found by a tester)
                        self._withdrawn(context, STREAM, request, None, timing)
                        self._engine.cancelled_unqueued(
                            request.model_name, request.model_version or None, arrived
                        )
                        raise
                    made = self._submit(
                        request, context, arrived, due, timing, protocol=STREAM, hold=hold
                    )
                    if made.ticket.stamp is None:  # (its settling time: see `_held_late`)
                        made.ticket.stamp = clock.now_ns
                    submitted: _Submitted | DuetimeError = made
                except DuetimeError as exc:
                    submitted = exc.with_traceback(None)  # see Ticket.failure
                    if not isinstance(exc, Shed):  # (the shedder counts its own)
                        self.count_refused(submitted)
                        self._engine.router.count_invalid(
                            submitted, request.model_name, request.model_version
                        )
                except Exception as exc:
                    log.exception("internal error in ModelStreamInfer")
                    submitted = InternalError(f"internal error: {type(exc).__name__}: {exc}")
                    self.count_refused(submitted)
                try:
                    await window.put((request, submitted, timing, hold))
                except BaseException:  # (the stream ended meanwhile)
                    hold.release()
                    if isinstance(submitted, _Submitted) and submitted.ticket.future.cancel():
                        self._withdrawn(context, STREAM, request, submitted.ticket, timing)
                    raise
        finally:
            await window.put(None)

    async def _waited_answer(
        self, submitted: _Submitted | DuetimeError, request: Any, context: Any,
        hold: AnswerHold, timing: RequestTiming | None,
    ) -> Any:  # fmt: skip
        """`_stream_answer`, the request cancelled, traced and logged if the stream ends
        meanwhile.

        NOTE: out of the window, it was neither cancelled there nor logged."""
        try:
            return await self._stream_answer(submitted, request.id, hold)
        except asyncio.CancelledError:
            if isinstance(submitted, _Submitted):
                waited = submitted.ticket
                if waited.future.cancel() or waited.future.cancelled():
                    self._withdrawn(context, STREAM, request, waited, timing)
            raise

    def _held_late(self, submitted: _Submitted | DuetimeError) -> DeadlineExceeded | None:
        """The error sent in place of a streamed request's answer that its model made by its
        due time but whose turn (answers go in request order, as Triton's for a model that is
        not decoupled) came after it, behind earlier answers; None: send what it has.

        NOTE: it went out as a success, 90-330 ms past a 5 ms timeout behind three resnet
        batches, and counted on time in its model's statistics. Its model counts it now as an
        answer not delivered, `held_late` (`answer_failed`); one its model answered late
        (counted late there) goes out as a unary call's would, a late success."""
        if isinstance(submitted, DuetimeError) or submitted.request is None:
            return None
        due = submitted.request.due_ns
        ticket = submitted.ticket
        future = ticket.future
        if due is None or not future.done() or future.cancelled() or future.exception():
            return None
        if not ticket.done_ns:
            # NOTE: settled inside `_submit` or never stamped: when its model answered is not
            # known, and an answer its model made late was sent as an error `held_late`
            return None
        now = self._engine.clock.now_ns()
        if now <= due or ticket.done_ns > due:
            return None
        answer_failed(self._engine, ticket, submitted.request, "held_late")
        return DeadlineExceeded(
            f"{TIMEOUT_EXPIRED}: model '{ticket.model}': its answer was ready by its due time "
            f"but held behind earlier answers on the stream (ModelStreamInfer answers go in "
            f"request order) until {(now - due) / 1e6:.1f} ms past it; send requests with "
            "due times on a stream of their own, or as ModelInfer calls"
        )

    async def _stream_answer(
        self, submitted: _Submitted | DuetimeError, request_id: str, hold: AnswerHold
    ) -> Any:
        """A streamed request's answer (a `ModelStreamInferResponse`), or its error."""
        if isinstance(submitted, DuetimeError):
            return submitted
        try:
            return await self._response(submitted, request_id, hold, stream=True)
        except DuetimeError as exc:
            return exc.with_traceback(None)  # (its traceback would hold the answer's frames)

    def _stream_error(
        self, request: Any, exc: DuetimeError, context: Any, trace_id: str | None = None
    ) -> Any:
        """A streamed request's error, as Triton sends it: its texts cut to fit the message
        limit where they would not (see `errors.fitted`).

        NOTE: it was never measured: a request id of 64 MiB less 60 bytes to an unknown model
        made an error of 67,108,995 bytes, and gRPC ended the whole stream with it."""
        trace_id = trace_id or _trace_id(context)
        texts: tuple[str, ...] = (
            request.id,
            request.model_name,
            request.model_version,
            exc.message,
        )
        limit = self._max_message_bytes
        if limit is not None and 4 * sum(map(len, texts)) + ERROR_ROOM > limit:  # (UTF-8)
            share = (limit - ERROR_ROOM) // len(texts)
            texts = tuple(fitted(text, share) for text in texts)
        request_id, model, version, message = texts
        log_request(
            protocol="grpc-stream", model=model, version=version, status=exc.http_status,
            reason=message, trace_id=trace_id, grpc_code=exc.grpc_code,
        )  # fmt: skip
        # (as Triton: the request's id, so that the client knows which one failed)
        response = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id)
        response.parameters[FINAL_RESPONSE].bool_param = True
        return pb.ModelStreamInferResponse(
            error_message=f"{message} (trace {trace_id})", infer_response=response
        )

    def count_refused(self, exc: DuetimeError) -> None:
        """Count an inference request answered with `exc` before any model ran it (`refused`).

        NOTE: only HTTP's refusals were counted (`duetime_requests_refused_total` had no gRPC
        series): a gRPC client's malformed calls or bad 'timeout's moved no metric. And only
        those raised as a request was submitted: one its scheduler refused later (dropped from
        the queue as hopeless: DEADLINE_EXCEEDED) counted nowhere; `_response` counts those
        (`refused_unrun`)."""
        key = (exc.grpc_code, type(exc).__name__)
        self.refused[key] = self.refused.get(key, 0) + 1

    def ended(self, context: Any, data: bytes = b"") -> bool:
        """Whether a ModelInfer call is ended before its request (`data`, serialised) is
        decoded: its client has gone (see ModelInfer), or the load shedder turns it away
        (RESOURCE_EXHAUSTED; a recording server records it, see `Recorder.refused_unread`).

        NOTE: above capacity most calls are refused, and a refusal that cost as much as an
        answer left too little of the loop for the rest (as HTTP found: see `_shed_reply`): it
        decodes nothing and raises nothing (an abort raises through the handler)."""
        if _gone(context):
            # NOTE: above capacity, calls wait in gRPC's own queue before this runs; a flood at
            # 3,000/s with 5 ms deadlines had the loop decode, then abort, call after call whose
            # client had given up (15% of its time in aborts alone, each logging
            # ExecuteBatchError), and answered almost none in time. Nothing to do for them.
            self.gone_calls += 1
            _no_answer(context)
            return True
        shedder = self._shedder
        # NOTE: weighed only once refusing (share > 0), gRPC had no class when the share first
        # rose, and HTTP's took all of it; and weighed at 4 KB a call, a flood of 48 KB calls
        # weighed 12x too light and a light HTTP model was refused in its place
        if shedder is None or not (shedder.share or shedder.watching):
            return False
        # NOTE: weighed as no model, a gRPC flood of one heavy model had every model's gRPC
        # calls refused alike, where HTTP's shedder refuses the costliest model's first
        named, version = _peeked_target(data)
        model = self._engine.registry.served_name(named, version)
        top = shedder.refusing(model) and _asks_priority_one(data)
        if self._shed(model, version, len(data), top):
            refusal = shedder.refusal()
        elif (
            model is not None
            and shedder.saturated
            and self._due_unread(context, model, version, data)
        ):
            shedder.refuse_due(model)
            self._count_shed(model, version)
            refusal = _DUE_SHED_ERROR
        else:
            return False
        recorder = self._engine.recorder
        if recorder is not None:
            left = context.time_remaining()
            due_in = None if left is None else max(int(left * 1e9), 1)
            recorder.refused_unread("grpc", b"", data, _Metadata(context), refusal, due_in)
        _refuse(context, refusal, model=named or "", version=version)
        return True

    def _shed(self, model: str | None, version: str, size: int, top: bool) -> bool:
        """Whether the load shedder refuses a request of `model` (one the server serves, or
        None), `size` bytes, priority 1 or not (`top`); a refusal counts against its model (as
        rejected: see `ModelScheduler.count_shed`), as HTTP's does."""
        shedder = self._shedder
        assert shedder is not None
        if not shedder.refuse(model, size, top, version or None):
            return False
        self._count_shed(model, version)
        return True

    def _count_shed(self, model: str | None, version: str) -> None:
        """Count a call of `model` the shedder refused (see `_shed`)."""
        self.shed += 1
        if model is not None:
            self._engine.registry.count_shed(model, version or None)

    def _due_unread(self, context: Any, model: str, version: str, data: bytes) -> bool:
        """Whether a ModelInfer call of `model` and `version` (served), its request `data` not
        decoded, is refused for its due time by a saturated loop (as HTTP's
        `HttpConnection._due`): its due time, the gRPC deadline's or its `timeout` parameter's
        from its arrival (estimated as `_dated` does), is no further off than what a turn of the
        loop lately kept requests of `model` waiting for their answers
        (`ModelScheduler.turn_wait_ns`: 0 where its instances run on threads). Priority 1 is
        spared."""
        now = self._engine.clock.now_ns()
        backlog = self.backlog
        arrived = now - backlog.waited_ns() if backlog is not None else now
        due = _with_deadline(_peeked_due(data, arrived), context, now)
        if due is None:
            return False
        wait = self._engine.registry.turn_wait_ns(model, version or None)
        return due - now <= wait and not _asks_priority_one(data)

    def _dated(self, request: Any, context: Any, new_call: bool = True) -> tuple[int, int | None]:
        """When the request arrived and when it is due (see `_due`), before it waits for room
        for its answer (`AnswerHold.taken`): the wait counts against its due time, as gRPC's
        deadline does. A `new_call`'s arrived in gRPC's core, its wait there estimated
        (`CoreBacklog`, as HTTP's `ReadTurn` dates requests its loop read late); a stream's
        messages come on a call already taken: now.

        NOTE: its due time counts from here, and a capture stamps its arrival here, as HTTP's:
        the capture's `due_in_ns` was short by the decoding, and each replay's due time shrank.

        NOTE: the arrival was the handler's start, also for a call that had waited in the
        core. Refused as due before it was taken, such a call then looked as if its timeout
        had been shorter than a run from its arrival: the client's fault, not a miss of a busy
        server (`ModelScheduler.outcomes`). The load shedder saw no misses and shed nothing:
        mlp over gRPC at 3,000 calls/s (2/10 ms timeouts, the 2-core VM) had its loop take
        ~2,400 a second, every one of them expired, 1 s old, and none answered."""
        now = self._engine.clock.now_ns()
        check_parameter_count(len(request.parameters), "request")
        parameters, kinds = _parameters_and_kinds(request.parameters)
        check_grpc_parameters(kinds)
        if None in kinds.values():
            _refuse_unset(kinds, "request")
        backlog = self.backlog
        arrived = now - backlog.waited_ns() if backlog is not None and new_call else now
        return arrived, self._due(parameters, context, now, arrived)

    def _within(self, due: int | None) -> float | None:
        """Seconds left until `due` (None: no due time)."""
        return None if due is None else (due - self._engine.clock.now_ns()) / 1e9

    def _submit(
        self,
        request: Any,
        context: Any,
        arrived: int,
        due: int | None,
        timing: RequestTiming | None = None,
        protocol: str = "grpc",
        shed: bool = True,
        hold: AnswerHold | None = None,
    ) -> _Submitted:
        """The request, `arrived` and `due` then (`_dated`), handed to the engine; `shed`:
        offered to the load shedder first (a ModelInfer call was, by `ended`); `hold`: its
        answer's, which holds what its inputs read from shared memory too (see `_reads`)."""
        shedder = self._shedder
        if shed and shedder is not None and (shedder.share or shedder.watching):
            # (weighed as `ended` weighs a call)
            model = self._engine.registry.served_name(request.model_name, request.model_version)
            top = shedder.refusing(model) and _priority(request.parameters) == 1
            size = sum(map(len, request.raw_input_contents))
            if self._shed(model, request.model_version, size, top):
                raise shedder.refusal()
        infer, shared = self._infer_request(request, context, arrived, due, timing, protocol, hold)
        return _Submitted(self._engine.submit(infer), shared, infer)

    def _infer_request(
        self,
        request: Any,
        context: Any,
        arrived: int,
        due: int | None,
        timing: RequestTiming | None,
        protocol: str,
        hold: AnswerHold | None = None,
    ) -> tuple[InferRequest, dict[str, sharedmemory.Window] | None]:
        """`request` decoded for the engine, and the outputs it wants in shared memory."""
        parameters = _parameters(request.parameters)
        expected = self._signatures.expected(request.model_name, request.model_version or None)
        if expected is not None:
            expected.outputs(len(request.outputs))
        requested = requested_outputs(request, expected)
        if requested.shared:
            held = {
                name: self._regions.check(window, f"output '{name}'")
                for name, window in requested.shared.items()
            }
            requested = requested._replace(shared=held)
        with self._regions.charged(self._reads(context, hold)):
            inputs = decode_inputs(request, self._regions, expected)
        infer = InferRequest(
            model=request.model_name,
            inputs=inputs,
            version=request.model_version or None,
            outputs=requested.names,
            classes=requested.classes,
            id=request.id,
            due_ns=due,
            arrival_ns=arrived,
            priority=priority_of(parameters),
            parameters=parameters,
            headers=_Metadata(context),
            timing=timing,
            protocol=protocol,
        )
        if timing is not None:
            timing.decoded_ns = self._engine.clock.now_ns()
        return infer, requested.shared

    def _reads(self, context: Any, hold: AnswerHold | None) -> sharedmemory.Reads | None:
        """What the bytes a request's inputs read from shared memory are charged to: held in
        the server's `intake` with HTTP's request bodies, and with those of the requests of
        its connection (its peer), until its answer is sent (`hold`'s release). None: not
        counted (no intake; no hold: a request decoded only to be refused).

        NOTE: uncounted, each call held its copy against no limit while it waited: over HTTP,
        20 requests each naming a 60 MiB input grew the server by 1 GiB under a 64 MiB limit
        (found by a tester), and calls on one channel were bounded by nothing at all."""
        intake = self._intake
        if intake is None or hold is None or not self._regions.any_registered:
            return None  # (none registered: every request's path, which builds no charge)

        def take(size: int, where: str) -> None:
            if hold.reads is None:  # (the peer is looked up only for a request that reads)
                hold.reads = sharedmemory.HeldReads(intake, self._read_by_peer, context.peer())
            hold.reads.take(size, where)

        return take

    def _late_for_room(
        self,
        late: DeadlineExceeded,
        request: Any,
        context: Any,
        arrived: int,
        due: int | None,
        timing: RequestTiming | None,
        protocol: str = "grpc",
    ) -> DuetimeError:
        """The refusal of a call whose answer found no room by its due time (`late`, saying
        why): the scheduler's for a request due before it is queued, which it is handed to for
        that (504 / DEADLINE_EXCEEDED, counted as expired in the model's statistics and
        metrics), or the error it meets first (a breaker open, bad input). It never runs.

        NOTE: refused before the engine saw it, it moved no statistic and no metric, where the
        same refusal over HTTP counts as an expiry."""
        try:
            infer, _ = self._infer_request(request, context, arrived, due, timing, protocol)
        except DuetimeError as exc:
            return exc.with_traceback(None)
        return self._engine.refuse_late(infer, late)

    async def _response(
        self, submitted: _Submitted, request_id: str, hold: AnswerHold | None = None,
        stream: bool = False,
    ) -> Any:  # fmt: skip
        """The request's ModelInferResponse (`stream`: its ModelStreamInferResponse)."""
        ticket = submitted.ticket
        await settled(ticket.future)
        unrun = refused_unrun(ticket)
        if unrun is not None:  # (unary calls and streamed requests alike: see `count_refused`)
            self.count_refused(unrun)
        try:
            result = ticket.response(request_id)
        except DuetimeError:
            if submitted.request is not None:
                count_unreturned(self._engine, ticket, submitted.request)
            raise
        try:
            if _shared_bytes(submitted, result) > BULK_SHARED_BYTES:
                # NOTE: written on the loop, a 960 MB output held every other client for the
                # write (found by a tester); HTTP's are written off the loop too (`_bulky`)
                return await asyncio.to_thread(
                    self._made, submitted, result, request_id, hold, stream
                )
            return self._made(submitted, result, request_id, hold, stream)
        except DuetimeError:
            # NOTE: a request whose answer could not be made (an output window too small, an
            # answer over the message limit) was counted a success in statistics and metrics
            if submitted.request is not None:
                answer_failed(self._engine, ticket, submitted.request)
            raise

    def _made(
        self, submitted: _Submitted, result: InferResponse, request_id: str,
        hold: AnswerHold | None, stream: bool = False,
    ) -> Any:  # fmt: skip
        """The ModelInferResponse of a request the model answered (`result`; `stream`: in a
        ModelStreamInferResponse, with Triton's final-response parameter): DuetimeError where
        it cannot be made (see `_response`)."""
        response = pb.ModelInferResponse(
            model_name=result.model, model_version=result.version, id=request_id
        )
        response.parameters["variant"].string_param = result.variant
        shared = submitted.shared or {}
        limit = self._max_message_bytes
        if limit is not None:
            carried = sum(
                array.nbytes for name, array in result.outputs.items()
                if name not in shared and array.dtype.kind != "O"
            )  # fmt: skip
            if carried >= limit:
                # NOTE: its outputs alone are too big (each costs a few bytes more in the
                # message): refused before they are copied (twice, then measured: 64 MiB
                # answers in probe a10 took half a second of the event loop)
                if hold is not None:
                    hold.made(carried)
                raise _too_large(f"more than {carried}", limit)
        carried = 0
        for name, array in result.outputs.items():
            datatype = v2_datatype_of(array)
            output = response.outputs.add(name=name, datatype=datatype, shape=array.shape)
            window = shared.get(name)
            if window is not None:
                data = codec.raw_view(array, datatype)  # (a view: no copy of a big output)
                self._regions.write(window, data, f"output '{name}'")
                output.parameters[sharedmemory.REGION].string_param = window.region
                output.parameters[sharedmemory.BYTE_SIZE].int64_param = len(data)
                raw = b""  # (an entry all the same: the others' entries keep their index)
            else:
                raw = codec.to_raw(array, datatype)
            response.raw_output_contents.append(raw)
            carried += len(raw)
        if hold is not None:
            hold.made(carried)
        message = response
        if stream:
            response.parameters[FINAL_RESPONSE].bool_param = True
            message = pb.ModelStreamInferResponse(infer_response=response)
        if limit is not None and carried + 4 * len(request_id) > limit - MESSAGE_SLACK:
            # NOTE: gRPC itself would fail the call with a bare "Sent message larger than max"
            # (and end a whole ModelStreamInfer stream with it). What is sent is measured: a
            # stream's answer was measured before its parameter and wrapper (~35 bytes) were
            # added, and one that fitted by less went to gRPC and ended its stream
            size = message.ByteSize()
            if size > limit:
                raise _too_large(str(size), limit)
        return message

    def _due(
        self, parameters: Mapping[str, Any], context: Any, now: int, arrived: int
    ) -> int | None:
        """The due time from the `timeout` parameter, counted from the call's arrival (see
        `_dated`), and the gRPC deadline (the core's own: exact)."""
        return _with_deadline(due_from_timeout_us(parameters, arrived), context, now)


def _with_deadline(due: int | None, context: Any, now: int) -> int | None:
    """`due` (None: none), or the call's gRPC deadline (`context`'s, the core's own: exact)
    where that comes first."""
    remaining = context.time_remaining()
    if remaining is None:
        return due
    grpc_due = now + int(remaining * 1e9)
    return grpc_due if due is None else min(due, grpc_due)


_DUE_SHED_ERROR = Shed(
    "the server is saturated and its event loop is behind: this request's due time (its "
    "timeout, or the call's deadline) is no further off than requests wait to be read and "
    "answered now, so it was refused unread; retry later, on another replica, or with a "
    "larger timeout",
    retry_after_s=1.0,
)
"""The refusal of a call due before the saturated loop could answer it (see
`InferenceService._due_unread`)."""
ERROR_ROOM = 256
"""Bytes of a stream's error message beside its texts (id, model, version, error): their tags
and lengths, the final-response parameter, the wrapper, the trace id."""
MAX_DETAILS_BYTES = 2048
"""A call's error message (its status details) at most, in UTF-8: sent percent-encoded (a
non-ASCII byte takes 3), it stays under grpc-core's 8 KB soft limit on received metadata."""


def _too_large(size: str, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the answer is {size} bytes, over the gRPC message limit of {limit} bytes (server "
        "setting max_grpc_message_bytes, --max-grpc-message-bytes); ask for fewer rows or "
        "outputs, or have outputs written to shared memory"
    )


def decode_inputs(
    request: Any,
    regions: SharedMemoryRegions | None = None,
    expected: codec.Expected | None = None,
) -> dict[str, np.ndarray]:
    """Input arrays from `raw_input_contents` (zero-copy), typed `contents`, or shared memory
    (`regions`; such inputs have no raw entry); each input checked against `expected` (what
    the model takes) before its data is decoded."""
    raw = request.raw_input_contents
    if raw and expected is None:  # (else each input is checked first: see codec.Expected)
        _check_raw_count(request)
    arrays: dict[str, np.ndarray] = {}
    next_raw = 0
    for index, tensor in enumerate(request.inputs):
        if not tensor.name:
            raise InvalidInput(f"inputs[{index}]: 'name' must be a non-empty string")
        where = f"input '{tensor.name}'"
        check_parameter_count(len(tensor.parameters), where)
        if tensor.parameters:
            _refuse_unset(_parameters_and_kinds(tensor.parameters)[1], where)
        if tensor.name in arrays:
            raise InvalidInput(f"{where} appears more than once")
        datatype = codec.check_datatype(tensor.datatype, where)
        shape = codec.parse_shape(list(tensor.shape), where)
        if expected is not None:
            expected.input(tensor.name, datatype, shape)
        window = _window(tensor.parameters, where)
        if window is not None:
            if tensor.HasField("contents"):
                raise InvalidInput(f"{where}: its data is in shared memory; send no contents")
            if regions is None:
                raise InvalidInput(f"{where}: shared memory is not available here")
            arrays[tensor.name] = codec.from_raw(
                regions.read(window, where, datatype, shape), datatype, shape, where
            )
        elif raw:
            if tensor.HasField("contents"):
                raise InvalidInput(f"{where}: has typed contents and raw_input_contents; use one")
            if next_raw == len(raw):
                _check_raw_count(request)
            arrays[tensor.name] = codec.from_raw(raw[next_raw], datatype, shape, where)
            next_raw += 1
        else:
            arrays[tensor.name] = _from_contents(tensor, datatype, shape, where)
    if next_raw != len(raw):
        _check_raw_count(request)
    return arrays


def unread_infer_request(data: bytes) -> InferRequest:
    """A ModelInfer call's serialised request as the engine would be handed it, for a capture
    of a call refused before it was decoded (`InferenceService.ended`); decoded off the loop,
    so without shared memory. DuetimeError where it does not decode (or names a region)."""
    try:
        request = pb.ModelInferRequest.FromString(data)
    except Exception as exc:  # (protobuf's DecodeError, and whatever else bad bytes raise)
        raise InvalidInput(_not_a_message(data, pb.ModelInferRequest, exc)) from None
    parameters = _parameters(request.parameters)
    requested = requested_outputs(request)
    if requested.shared:
        raise InvalidInput("an output is written to shared memory, which is not available here")
    return InferRequest(
        model=request.model_name, inputs=decode_inputs(request),
        version=request.model_version or None, outputs=requested.names,
        classes=requested.classes, id=request.id, priority=priority_of(parameters),
        parameters=parameters, protocol="grpc",
    )  # fmt: skip


def _check_raw_count(request: Any) -> None:
    """InvalidInput unless `raw_input_contents` has one entry per input not in shared memory.

    NOTE: a scan of every input (200k in one probe): the model's inputs are checked before it
    where the model is known, and past them an input is refused."""
    raw = request.raw_input_contents
    inline = sum(1 for t in request.inputs if sharedmemory.REGION not in t.parameters)
    if len(raw) != inline:
        raise InvalidInput(
            f"raw_input_contents has {len(raw)} entries but {inline} inputs carry their data; "
            "send one raw entry per such input, in order, or use typed contents for all"
        )


_LOG_SETTING_FIELD = {bool: "bool_param", int: "uint32_param", str: "string_param"}
"""The field of a `LogSettingsResponse.SettingValue` that holds a setting of each type."""


class _Submitted(NamedTuple):
    """A request handed to the engine, and the outputs it wants written into shared memory."""

    ticket: Ticket
    shared: dict[str, sharedmemory.Window] | None
    request: InferRequest | None = None
    """The request as handed to the engine (its arrival and due time)."""


class Requested(NamedTuple):
    """What a request asks of its outputs."""

    names: tuple[str, ...] | None
    """The outputs asked for (None: all)."""
    classes: dict[str, int] | None
    """Those asked for as their top classes (the classification extension), and how many."""
    shared: dict[str, sharedmemory.Window] | None
    """Those to write into shared memory, and where."""


def requested_outputs(request: Any, expected: codec.Expected | None = None) -> Requested:
    """What `request` asks of its outputs (see `Requested`); each checked against `expected`
    (what the model gives) before its parameters are read. An output asked for again must be
    asked for the same way (`check_output_again`, as over HTTP)."""
    classes: dict[str, int] = {}
    shared: dict[str, sharedmemory.Window] = {}
    seen: set[str] = set()
    for output in request.outputs:
        name = output.name
        if expected is not None:
            expected.output(name)
        count: int | None = None
        window: sharedmemory.Window | None = None
        if output.parameters:
            check_parameter_count(len(output.parameters), f"output '{name}'")
            parameters, kinds = _parameters_and_kinds(output.parameters)
            _refuse_unset(kinds, f"output '{name}'")
            if classification.PARAMETER in parameters:
                value = parameters[classification.PARAMETER]
                count = classification.class_count(value, name)
            window = sharedmemory.output_window_of(parameters, name)
        if name in seen:
            first = _output_settings(classes.get(name), shared.get(name))
            check_output_again(name, _output_settings(count, window), first)
            continue
        seen.add(name)
        if count is not None:
            classes[name] = count
        if window is not None:
            shared[name] = window
    names = tuple(output.name for output in request.outputs) or None
    return Requested(names, classes or None, shared or None)


def _output_settings(
    count: int | None, window: sharedmemory.Window | None
) -> dict[str, OutputSetting]:
    """An output's settings as `check_output_again` compares them, by parameter (gRPC has no
    `binary_data`: every answer is binary)."""
    return {classification.PARAMETER: count, "shared memory": window}


def _window(parameters: Mapping[str, Any], where: str) -> sharedmemory.Window | None:
    """The shared-memory window an input's gRPC parameters name (None: none)."""
    if not parameters:  # (one with a byte size or an offset but no region is refused)
        return None
    return sharedmemory.window_of(_parameters(parameters), where)


def _from_contents(tensor: Any, datatype: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidInput(f"{where}: {datatype} data must be sent in raw_input_contents")
    stray = next((f.name for f, _ in tensor.contents.ListFields() if f.name != field), None)
    if stray is not None:  # (as Triton refuses it; it was ignored)
        raise InvalidInput(
            f"{where}: contents.{stray} does not match its datatype {datatype}, whose values "
            f"go in contents.{field}"
        )
    values = getattr(tensor.contents, field)
    count = int(np.prod(shape))
    if len(values) != count:
        raise InvalidInput(
            f"{where}: contents.{field} holds {len(values)} values but shape {list(shape)} "
            f"needs {count}"
        )
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    dtype = NUMPY_OF[datatype]
    if dtype.kind in "iu" and count:
        info = np.iinfo(dtype)  # type: ignore[type-var]
        wide = np.asarray(values, dtype=np.int64 if dtype != np.uint64 else np.uint64)
        if wide.min() < info.min or wide.max() > info.max:
            raise InvalidInput(f"{where}: contents.{field} has values outside {datatype}")
    return np.asarray(values, dtype=dtype).reshape(shape)


class _Metadata(Mapping[str, str]):
    """A call's invocation metadata as a mapping, read only if the router asks for a key."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self._items: dict[str, str] | None = None

    def _read(self) -> dict[str, str]:
        """The metadata by key; a key given more than once has its values joined with commas,
        in order, as HTTP joins a header's lines (and the HTTP front end does).

        NOTE: the last value alone was kept: two `tracestate` entries (W3C Trace Context 3.3:
        combined, as one list) carried on only the second (found by a tester)."""
        if self._items is None:
            items: dict[str, str] = {}
            for key, value in self._context.invocation_metadata() or ():
                if isinstance(value, str):
                    key = key.lower()
                    items[key] = f"{items[key]}, {value}" if key in items else value
            self._items = items
        return self._items

    def __getitem__(self, key: str) -> str:
        return self._read()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


GRPC_ERROR_HEADER = "triton_grpc_error"
"""Triton's (24.08+) ModelStreamInfer header: `true` asks for a stream's first error as its
gRPC status code, which ends it, in place of an `error_message` in the stream."""


def _wants_grpc_errors(context: Any) -> bool:
    return _Metadata(context).get(GRPC_ERROR_HEADER, "").strip().lower() == "true"


def _one_repository(request: Any, context: Any) -> None:
    """Refuse a repository call naming a repository (`repository_name`), as Triton does
    (UNSUPPORTED): the server has one, which the call would change or list whatever it named.
    A load or unload naming no model is KServe's (its model name is field 1: see
    `_model_to_change`), and names none.

    NOTE: taken as if unnamed, an unload naming another repository unloaded the model of this
    one (found by a tester; over HTTP, /v2/repository/<name>/... is not found)."""
    named = request.repository_name
    if named and (not hasattr(request, "model_name") or request.model_name):
        _abort(context, Unsupported("'repository_name' specification is not supported"))


def _parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    return _parameters_and_kinds(parameters)[0]


def _parameters_and_kinds(
    parameters: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, str | None]]:
    """Each parameter's value, and its `InferParameter` field (`int64_param`, ...; None: none
    set), read in one pass."""
    values: dict[str, Any] = {}
    kinds: dict[str, str | None] = {}
    for key, parameter in parameters.items():
        choice = kinds[key] = parameter.WhichOneof("parameter_choice")
        values[key] = None if choice is None else getattr(parameter, choice)
    return values, kinds


def _refuse_unset(kinds: Mapping[str, str | None], where: str) -> None:
    """InvalidInput for an `InferParameter` of `where` (`request`, `input 'x'`, ...) with none of
    its values set (`kinds`: see `_parameters_and_kinds`): what HTTP's null is, which HTTP and
    the Engine refuse.

    NOTE: taken without a word at every level, where `timeout` and `priority` unset were
    refused (found by a tester)."""
    for key, kind in kinds.items():
        if kind is None:
            raise InvalidInput(
                f"{where} parameter '{key}' has no value: set one of bool_param, int64_param, "
                "double_param, uint64_param or string_param"
            )


STREAM = "grpc-stream"
"""The protocol a streamed request's span and log line name."""
STREAM_SHUT_DOWN = f"the stream is ended: {SHUTTING_DOWN}"
"""The status details of a stream ended by the server's shutdown (UNAVAILABLE)."""

_Window = asyncio.Queue[
    tuple[Any, "_Submitted | DuetimeError", RequestTiming | None, AnswerHold] | None
]
"""A stream's requests in flight, in order, each with its submission (or error), its timing
and its hold on the answer budget; None ends them."""


class _Intake:
    """The reading of one stream's requests (`task`), which the server's shutdown stops."""

    __slots__ = ("finished", "reading", "stopped", "task")

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.reading = False
        """Waiting for the client's next request (nothing of the stream's own in hand)."""
        self.stopped = False
        self.finished = False
        """The client ended its requests."""

    def stop(self) -> None:
        """Read no more requests: at once if waiting for one, else once the one in hand is
        in the window."""
        self.stopped = True
        if self.reading and self.task is not None:
            self.task.cancel()


def _trace_id(context: Any) -> str:
    """The caller's trace id (W3C `traceparent` metadata), else a new one."""
    parent = parse_traceparent(_Metadata(context).get("traceparent"))
    return parent.trace_id_hex if parent is not None else new_trace_id()


def _model_to_change(request: Any) -> str:
    """The model a load or unload request names, from Triton's proto or KServe's.

    NOTE: both define these calls on `inference.GRPCInferenceService`, with different messages:
    KServe's request is `model_name = 1`, where Triton's has `repository_name = 1` and
    `model_name = 2`. A KServe client's model name therefore arrives as the repository's; a
    Triton client always names the model, so the repository name stands in only without it."""
    return check_model_name(request.model_name or request.repository_name)


def _changed(response: Any, name: str) -> Any:
    """A load or unload response that both protos read: Triton's is empty, KServe's carries
    `model_name = 1` and `isLoaded` / `isUnloaded = 2` (true). The two fields ride as unknown
    fields of Triton's empty message, which Triton's clients skip. (`RepositoryIndexRequest` is
    a string at 1 and a bool at 2: it encodes them.)"""
    response.MergeFromString(
        pb.RepositoryIndexRequest(repository_name=name, ready=True).SerializeToString()
    )
    return response


def _gone(context: Any) -> bool:
    """Whether the call's client can no longer hear an answer: it cancelled, or its deadline
    passed (gRPC has answered DEADLINE_EXCEEDED for us)."""
    if context.cancelled():
        return True
    remaining = context.time_remaining()
    return remaining is not None and remaining <= 0


def _no_answer(context: Any, error: DuetimeError | None = None) -> Any:
    """What a handler returns for a call its client gave up: a status, not an answer (`error`:
    why the server ended it, where it took it).

    NOTE: past its deadline, a call may not be ended by gRPC yet: an empty message returned
    then went out as a successful answer (OK, no outputs). With its status set, the client
    hears DEADLINE_EXCEEDED if it still listens; on a call already ended, gRPC sends nothing.
    A call taken, then failed unrun in the queue at its due time, was said to have passed its
    deadline 'before the server could take it' (found by a tester): it gets its error's word."""
    if context.cancelled():
        context.set_code(grpc.StatusCode.CANCELLED)
    else:
        context.set_code(grpc.StatusCode.DEADLINE_EXCEEDED)
        context.set_details(
            fitted(error.message, MAX_DETAILS_BYTES)
            if isinstance(error, DeadlineExceeded)
            else "the call's deadline passed before the server could take it"
        )
    return _NO_ANSWER


_NO_ANSWER = pb.ModelInferResponse()


def _abort(
    context: Any, exc: DuetimeError, trace_id: str | None = None, model: str = "",
    version: str = "",
) -> NoReturn:  # fmt: skip
    """End the call with the error's status (see `_refuse`), here: raises `_Aborted`, which
    `_guarded` takes as the call's end.

    NOTE: not grpc.aio's `context.abort`: the AbortError it raises stays on the call's state
    (which the context holds) for as long as the call's objects live, and its traceback holds
    the frames of the handler, which hold the context: a cycle, with the request in it, that
    only the cyclic collector frees, and which the server's tuning (gc.freeze, a gen-0
    threshold of 50,000) makes rare. Every failed call kept its request: 60 failed 64 MiB
    calls grew the server from 161 MB to 4.3 GB, 600 resnet batches refused for their due
    time by 0.9 GB. `_Aborted` is dropped by `_guarded` as the call ends, and its frames with
    it; gRPC sends the status set here. A unary call's handler ends with grpc.aio's abort
    (`_guarded`), its AbortError's traceback dropped: returned, grpc.aio wrote an empty
    message ahead of a status that is not OK, which a caller reading the method as a stream
    (a proxy, a recorder) took for an answer; Triton sends none (found by a tester)."""
    _refuse(context, exc, trace_id, model, version)
    raise _Aborted


def _shut_down_during(context: Any, what: str) -> NoReturn:
    """In a repository call's `except CancelledError`: the call itself cancelled (its client
    gone, its deadline past) ends so; `what` (a load) cancelled by the server's shutdown
    (`ModelManager.aclose`) ends the call UNAVAILABLE, retry elsewhere.

    NOTE: it went up to gRPC, and the call hung until gRPC's grace ran out ("Cancelling all
    calls"), holding the shutdown that long."""
    task = asyncio.current_task()
    if task is not None and task.cancelling() > 0:
        raise asyncio.CancelledError
    _abort(context, ModelUnavailable(shut_down_during(what)))


class _Aborted(Exception):
    """A call ended by `_abort`: its status is set; `_guarded` ends the call."""


def _refuse(
    context: Any, exc: DuetimeError, trace_id: str | None = None, model: str = "",
    version: str = "",
) -> None:  # fmt: skip
    """Set the error's status as the call's; its trace id in the message, the trailing metadata
    and the log line. The call goes on (without raising) to its end. The message, and the names
    in the log line, are cut to `MAX_DETAILS_BYTES` where longer.

    NOTE: the message is sent in the call's trailers, which a client takes up to 8 KB of
    (grpc-core's soft limit; 16 KB its hard one): a ModelInfer naming a model of 20,000
    characters got RESOURCE_EXHAUSTED "Stream removed (received metadata size exceeds hard
    limit)" in place of NOT_FOUND."""
    trace_id = trace_id or _trace_id(context)
    message = fitted(exc.message, MAX_DETAILS_BYTES)
    log_request(
        protocol="grpc", model=fitted(model, MAX_DETAILS_BYTES),
        version=fitted(version, MAX_DETAILS_BYTES), status=exc.http_status, reason=message,
        trace_id=trace_id, grpc_code=exc.grpc_code,
    )  # fmt: skip
    context.set_trailing_metadata((("x-trace-id", trace_id),))
    context.set_code(getattr(grpc.StatusCode, exc.grpc_code))
    context.set_details(f"{message} (trace {trace_id})")


_INFER_METHODS = frozenset(("ModelInfer", "ModelStreamInfer"))
_MODEL_NAME_TAG = 0x0A
"""ModelInferRequest's field 1 (model_name), length-delimited..."""
_MODEL_VERSION_TAG = 0x12
"""...field 2 (model_version)..."""
_PARAMETERS_TAG = 0x22
"""...field 4 (parameters, a map: one length-delimited entry each)."""
_HEAD_TAGS = frozenset((_MODEL_NAME_TAG, _MODEL_VERSION_TAG, 0x1A, _PARAMETERS_TAG))
"""Fields 1 to 4, length-delimited: what a ModelInferRequest begins with (`_head_fields`)."""
_MAX_PEEKED = 4096
"""Longer names are not looked at (weighed with those of no model)."""


def _not_a_message(data: bytes, message: Any, exc: Exception) -> str:
    """The error of `data`, which did not decode as a `message` (a protobuf message class, or
    None where not known): the field at fault, where `protowhere` finds it.

    NOTE: protobuf says only "Error parsing message with type 'inference.ModelInferRequest'",
    whatever is wrong and wherever (found by a tester)."""
    descriptor = getattr(message, "DESCRIPTOR", None)
    where = undecodable_at(data, descriptor) if descriptor is not None else None
    what = descriptor.full_name if descriptor is not None else "protobuf"
    return f"the request is not a valid {what} message: {where or exc}"


class _Undecodable(NamedTuple):
    """What a request's bytes decode to when they are not its message."""

    message: str


def _method_handlers(service: InferenceService) -> dict[str, dict[str, Any]]:
    """The v2 service's method handlers, as the generated code registers them."""

    class Capture:
        handlers: dict[str, dict[str, Any]] = {}

        def add_generic_rpc_handlers(self, handlers: object) -> None:
            pass

        def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
            self.handlers[name] = handlers

    capture = Capture()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, capture)  # type: ignore[no-untyped-call]
    return capture.handlers


def _guarded(
    handler: Any,
    ended: Callable[[Any, bytes], bool] | None = None,
    refused: Callable[[DuetimeError], None] | None = None,
) -> Any:
    """`handler`, with bytes that are not its request message answered INVALID_ARGUMENT (and,
    where `refused` is given, counted with it), (where `ended` is given) each call first
    offered to `ended` with its bytes, which may end it before its request is decoded (True: it
    did), and a call its handler ends with `_abort` ended with the status it set. (Its calls
    are counted in the server's `CoreBacklog` by `CountingServer`.)

    NOTE: grpcio answers a request its deserializer cannot decode with UNKNOWN ("Unexpected
    <class 'DecodeError'>") and logs a traceback for each: a client sending garbage filled the
    log. On a stream, undecodable bytes end the requests (their id is unknown): those before
    them are answered, then the stream ends with INVALID_ARGUMENT. (An abort there, from the
    stream's reader, raced its answers: when the answer before it went out first, the stream's
    end was cancelled with the reader, and the stream stayed open until the client's
    deadline, in 11 to 20 runs of 20.)"""
    decode = handler.request_deserializer
    message = getattr(decode, "__self__", None)  # (the message class of its `FromString`)

    def decoded(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception as exc:  # (protobuf's DecodeError, and whatever else bad bytes raise)
            return _Undecodable(_not_a_message(data, message, exc))

    serialize = handler.response_serializer
    if handler.unary_unary is not None:
        call = handler.unary_unary

        async def unary(request: Any, context: Any) -> Any:
            if type(request) is bytes:
                if ended is not None and ended(context, request):
                    return _NO_ANSWER
                request = decoded(request)
            try:
                if isinstance(request, _Undecodable):
                    _abort(context, _undecodable(request, refused))
                return await call(request, context)
            except _Aborted:
                pass
            # NOTE: the status alone, with the trailers set (see `_abort`): the AbortError that
            # grpc.aio keeps on the call's state loses its traceback, which held these frames
            # (with the request) in a cycle
            try:
                await context.abort(context.code(), context.details() or "")
            except grpc.aio.AbortError as aborted:
                aborted.__traceback__ = None
            return None

        deserialize = _kept if ended is not None else decoded
        return grpc.unary_unary_rpc_method_handler(unary, deserialize, serialize)
    streamed = handler.stream_stream

    async def stream(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        async def messages() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, _Undecodable):
                    _refuse(context, _undecodable(request, refused))
                    return
                yield request

        try:
            async for response in streamed(messages(), context):
                yield response
        except _Aborted:
            return

    return grpc.stream_stream_rpc_method_handler(stream, decoded, serialize)


def _head_fields(data: bytes) -> Iterator[tuple[int, int, int, int]]:
    """The fields a serialized ModelInferRequest begins with, read without decoding it: those
    of numbers 1 to 4 (model_name, model_version, id, parameters: all length-delimited), which
    protobuf's serializers write first, in field order, before its tensors; each as (tag byte,
    where the field starts, where its value starts, where it ends). It stops at the first other
    field, or at bytes that are no such field."""
    at, size = 0, len(data)
    while at < size and data[at] in _HEAD_TAGS:
        tag, start = data[at], at
        length, shift, at = 0, 0, at + 1
        while at < size and shift < 35:  # (a varint of at most 5 bytes: a length < 2^32)
            byte = data[at]
            at += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        else:
            return
        if at + length > size:
            return
        yield tag, start, at, at + length
        at += length


def _shared_bytes(submitted: _Submitted, result: InferResponse) -> int:
    """Bytes of `result`'s outputs that go into shared memory."""
    shared = submitted.shared
    if not shared:
        return 0
    return sum(array.nbytes for name, array in result.outputs.items() if name in shared)


def _peeked_target(data: bytes) -> tuple[str | None, str]:
    """The model name and version of a serialized ModelInferRequest, read without decoding it
    (see `_head_fields`; None, "": not there, so not known; the call is weighed with those of
    no model)."""
    model: str | None = None
    version = ""
    for tag, _, start, end in _head_fields(data):
        if tag not in (_MODEL_NAME_TAG, _MODEL_VERSION_TAG):
            break
        if end - start > _MAX_PEEKED:
            break
        try:
            text = data[start:end].decode()
        except UnicodeDecodeError:
            break
        if tag == _MODEL_NAME_TAG:
            model = text
        else:
            version = text
    return model, version


def _peeked_entries(data: bytes, key: str) -> Iterator[Any]:
    """The `parameters` of each entry of a serialized ModelInferRequest's `parameters` map that
    names `key` (see `_head_fields`), each entry decoded alone; none after bytes that do not
    decode (the request is refused for them once decoded).

    NOTE: a scan of the whole call for the name, then a decode of all of it, cost a 600 KB
    resnet call 249 µs on a loop the shedder had found overloaded (found by a reviewer)."""
    name = key.encode()
    for tag, start, value, end in _head_fields(data):
        if tag != _PARAMETERS_TAG or name not in data[value:end]:
            continue
        try:  # (the entry alone is a request holding only it)
            parameters = pb.ModelInferRequest.FromString(data[start:end]).parameters
        except Exception:  # (bad bytes: refused as such once decoded)
            return
        if key in parameters:
            yield parameters


def _asks_priority_one(data: bytes) -> bool:
    """Whether a serialized ModelInferRequest asks for priority 1 (read undecoded: see
    `_peeked_entries`)."""
    return any(_priority(parameters) == 1 for parameters in _peeked_entries(data, "priority"))


def _peeked_due(data: bytes, arrived: int) -> int | None:
    """The due time the `timeout` parameter of a serialized ModelInferRequest sets from
    `arrived` (read undecoded: see `_peeked_entries`); None for none, or for one not valid (the
    request is refused for it once decoded)."""
    for parameters in _peeked_entries(data, "timeout"):
        try:
            return due_from_timeout_us(_parameters_and_kinds(parameters)[0], arrived)
        except DuetimeError:
            return None
    return None


def _priority(parameters: Any) -> int | None:
    """A request's 'priority' parameter, if it is an integer."""
    if "priority" not in parameters:
        return None
    parameter = parameters["priority"]
    kind = parameter.WhichOneof("parameter_choice")
    if kind in ("int64_param", "uint64_param"):
        value: int = getattr(parameter, kind)
        return value
    return None


def _undecodable(
    request: _Undecodable, refused: Callable[[DuetimeError], None] | None
) -> InvalidInput:
    """The error of bytes that are not a request message, counted with `refused` (if given)."""
    error = InvalidInput(request.message)
    if refused is not None:
        refused(error)
    return error


def _kept(data: bytes) -> bytes:
    """A request's bytes as they came, decoded by the handler once it knows the call goes on."""
    return data


COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 2, "high": 3}
"""Triton's `--grpc-infer-response-compression-level` -> gRPC core's `grpc_compression_level`."""


def server_options(settings: ServerSettings) -> list[tuple[str, int]]:
    """The gRPC server's channel arguments: message limits, then Triton's keepalive settings
    (always given, as Triton does; their defaults are gRPC's) and answer compression.

    NOTE: the compression level is the server's default for every call, where Triton sets it on
    inference calls only (grpc.aio has no per-call level, only an algorithm, which would ignore
    what the client accepts); the other answers are small."""
    limit = settings.max_grpc_message_bytes
    return [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
        ("grpc.so_reuseport", 0),
        ("grpc.max_allowed_incoming_connections", settings.max_grpc_connections),
        *(
            [("grpc.max_concurrent_streams", settings.grpc_max_concurrent_streams)]
            if settings.grpc_max_concurrent_streams
            else []
        ),
        # NOTE: as HTTP's connections: the bound above was held by connections that never
        # finished their HTTP/2 preface (gRPC's own limit: 120 s) or sat idle (none): 50 of
        # either had every new client refused "Socket closed" for minutes (found by a tester)
        ("grpc.server_handshake_timeout_ms", _ms(settings.request_read_timeout_s)),
        ("grpc.max_connection_idle_ms", _ms(settings.idle_timeout_s)),
        ("grpc.keepalive_time_ms", settings.grpc_keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", settings.grpc_keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(settings.grpc_keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", settings.grpc_http2_max_pings_without_data),
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            settings.grpc_http2_min_recv_ping_interval_without_data_ms,
        ),
        ("grpc.http2.max_ping_strikes", settings.grpc_http2_max_ping_strikes),
        (
            "grpc.default_compression_level",
            COMPRESSION_LEVELS[settings.grpc_infer_response_compression_level],
        ),
        # NOTE: gRPC's core holds at most 1,000 calls not yet taken by the service (3,000 hard)
        # and cancels the rest with a bare CANCELLED, which clients take for their own doing:
        # a burst of 3,000 concurrent ModelInfer calls with 2 s due times lost 20% so (found
        # by a tester); at 10,000 they wait, and those due meanwhile are refused as due (see
        # grpcbacklog). Bounded still: each holds its stream's window of bytes.
        ("grpc.server.max_pending_requests", GRPC_PENDING_CALLS),
        ("grpc.server.max_pending_requests_hard_limit", GRPC_PENDING_CALLS),
    ]


GRPC_PENDING_CALLS = 10_000
"""Calls gRPC's core may hold before the service takes them (see `server_options`)."""


def _ms(seconds: float) -> int:
    """`seconds` as a channel argument's milliseconds (a C int's range)."""
    return max(1, min(int(seconds * 1000), 2**31 - 1))


class _EndedCallFilter(logging.Filter):
    """Drops grpc.aio's ERROR and traceback for an answer to a call its client had ended.

    NOTE: a call whose client gives up (its deadline, a cancel) while its answer is being made
    cannot take the answer: grpc.aio logs each as "ExecuteBatchError raised in core by servicer
    method" with a traceback, at ERROR (1-52 of them a run in a tester's floods), in the very
    episodes operators read logs for. Nothing failed on the server's side."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return type(error).__name__ != "ExecuteBatchError"


def _quiet_ended_calls() -> None:
    """Install `_EndedCallFilter` on grpc.aio's logger, once."""
    logger = logging.getLogger("grpc._cython.cygrpc")
    if not any(isinstance(f, _EndedCallFilter) for f in logger.filters):
        logger.addFilter(_EndedCallFilter())


async def serve_grpc(service: InferenceService, settings: ServerSettings) -> tuple[Any, int]:
    """Start the gRPC server on `settings.host:grpc_port` (0: any free port); returns it and its
    port."""
    service.answers = service.budget(settings)
    _quiet_ended_calls()
    servers_before = server_ids()
    server = grpc.aio.server(options=server_options(settings))
    backlog = CoreBacklog(core_counts_reader(servers_before, server_ids()))
    # (every call's first request message due within the read timeout: see grpcreads)
    first_messages = FirstMessages(
        settings.request_read_timeout_s, idle_streams=settings.max_grpc_connections // 2
    )
    counting = FirstMessageServer(CountingServer(server, backlog), first_messages)
    for name, handlers in _method_handlers(service).items():
        guarded = {
            method: _guarded(
                handler,
                service.ended if method == "ModelInfer" else None,
                service.count_refused if method in _INFER_METHODS else None,
            )
            for method, handler in handlers.items()
        }
        counting.add_registered_method_handlers(name, guarded)
    add_health_and_reflection(counting, service.serving, lambda: not service.accepting)
    address = f"{url_host(settings.host)}:{settings.grpc_port}"
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:  # (grpcio raises this, or returns 0, for an address it cannot bind)
        port = 0
    if port == 0:
        raise ConfigError(
            f"server settings: field 'grpc_port': cannot listen for gRPC on {address} (in use, "
            "or not an address of this host); pass --grpc-port with a free port (0 picks one)"
        )
    await server.start()
    backlog.probe_target = f"{url_host(_loopback(settings.host))}:{port}"
    service.backlog = backlog
    return server, port


def _loopback(host: str) -> str:
    """The address this process reaches a server listening on `host` at: itself, or the
    loopback for a wildcard."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
