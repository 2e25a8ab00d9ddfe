"""Where a feed's inference requests go: the in-process Engine, or a remote duetime over gRPC.

Both take one input tensor and a due time (a `time.monotonic_ns()` instant) and report the answer
through a callback on the loop that submitted it, without the feed ever waiting for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import grpc
import numpy as np

from duetime.datatypes import NUMPY_OF
from duetime.engine import Engine, Ticket
from duetime.errors import DuetimeError
from duetime.execution.executor import Feeds
from duetime.frontend import codec
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.frontend.proto import grpc_service_pb2_grpc as pb_grpc
from duetime.tools.outcomes import Outcome, outcome_of_grpc_code, outcome_of_http_status
from duetime.types import InferRequest, TensorSpec


class Failure(NamedTuple):
    """Why a request got no answer; `refused` when it was turned away for time (it could not
    finish by its due time, or the server was overloaded), not broken; `unanswered` when no
    answer came by its due time and the predictor gave up waiting (a stalled server)."""

    message: str
    refused: bool
    unanswered: bool = False


Answer = Callable[[np.ndarray | None, Failure | None], None]
"""Called once per request: (the model's first output, None) or (None, the failure)."""
REFUSED = frozenset({Outcome.REJECTED, Outcome.EXPIRED})
"""Outcomes of a request turned away for time: overloaded, unavailable, past its due time."""

CONNECT_TIMEOUT_S = 10.0
_GONE = frozenset({"UNAVAILABLE", "CANCELLED"})
"""gRPC codes of calls that failed for want of a connection (when the channel has none)."""
GONE_WAIT_S = 0.05
GIVE_UP_AFTER_DUE_NS = 100_000_000
"""A remote call's gRPC deadline: its request's due time plus this. An answer that comes in
between is counted late (never used); none by then, the call is abandoned and the request counted
unanswered, so a server that stops answering cannot hold the feed (or its end) forever."""
ENGINE_LEAD_NS = 20_000
"""From `EnginePredictor.submit` to the scheduler's admission of its request (the request made,
routed and validated): ~10 µs on the 2-core VM warm, twice that kept. A feed tests a batch's fit
as of then (`Predictor.lead_ns`)."""
REMOTE_MAX_IN_FLIGHT = 4
"""Requests a feed has out to a remote server at once, at most; the events that trigger
meanwhile wait and go together in the next request (see `Predictor.max_in_flight`)."""


def event_rows(spec: TensorSpec, rows: int) -> np.ndarray:
    """`rows` rows of zeros of one event's input (a variable dimension taken as 1), of the
    spec's datatype: what the warmers and `EnginePredictor.prime` run the model on."""
    shape = (rows, *(d if d > 0 else 1 for d in spec.shape))
    return np.zeros(shape, NUMPY_OF.get(getattr(spec, "datatype", ""), np.float32))


class PredictorError(Exception):
    """The run cannot start: the model is missing, or takes an input the feed cannot give."""


class Predictor(Protocol):
    """Runs one model on one input tensor per request, answering through a callback."""

    input: TensorSpec
    """The model's input (its shape without the batch dimension where the model batches)."""
    max_batch: int
    """Rows one request may carry (0: the model does not batch)."""
    answered_elsewhere: bool
    """Whether answers come back from outside the feed's own turns of the loop (a remote
    server's, read off a socket; an instance thread's): the feed must keep turning the loop
    while it waits for a message then, never spin on the clock."""
    max_in_flight: int
    """Requests out at once, at most, at the full pace (0: no limit): a feed that asks for
    each event at once as fast as it reads would otherwise swamp a remote server."""
    lead_ns: int
    """From `submit` to the request's admission where its predictor predicts it (`fits`): the
    feed tests a batch's fit as of then (0 or absent: at once)."""

    def submit(self, array: np.ndarray, due_ns: int, answer: Answer) -> None: ...

    def fits(self, now_ns: int, due_ns: int, rows: int) -> bool | None:
        """Whether a request of `rows` due at `due_ns`, asked at `now_ns`, is predicted to be
        answered in time (None: it cannot tell). The feed asks it while it gathers a burst, to
        ask for the burst while its first event can still be answered on time; a predictor
        without it is taken to tell nothing."""

    def warm(self, array: np.ndarray) -> None:
        """Run the model on `array` (one row) and drop the answer, if that is cheap and safe
        here (see `FeedRun`'s keep-warm); a remote model is not run."""

    async def aclose(self) -> None: ...


def only_input(inputs: tuple[TensorSpec, ...], model: str) -> TensorSpec:
    """The model's single input; a feed gives one tensor per event, never several."""
    if len(inputs) != 1:
        names = ", ".join(spec.name for spec in inputs)
        raise PredictorError(
            f"--model {model}: takes {len(inputs)} inputs ({names}); the feed gives one "
            "tensor per event (the feature vector or the DeepLOB window)"
        )
    return inputs[0]


def per_event(spec: TensorSpec, max_batch_size: int) -> TensorSpec:
    """`spec` without its batch dimension (v2 metadata lists it as -1 where the model batches):
    the shape of what one event gives."""
    if max_batch_size > 0 and spec.shape and spec.shape[0] == -1:
        return TensorSpec(spec.name, spec.datatype, spec.shape[1:])
    return spec


class EnginePredictor:
    """Submits straight to an Engine's scheduler on the engine's own loop (no thread hop)."""

    def __init__(self, engine: Engine, model: str, version: str | None = None) -> None:
        snapshot = engine.registry.snapshot
        try:
            deployment = engine.registry.resolve(model, version)
        except DuetimeError as exc:
            raise PredictorError(f"--model {model}: {exc.message}") from None
        signature = deployment.model.signature
        self.input = per_event(only_input(signature.inputs, model), signature.max_batch_size)
        self.max_batch = signature.max_batch_size
        self._output = signature.outputs[0].name
        self._engine = engine
        self._model = model
        self._version = version
        self._executor = deployment.model.executor
        self.answered_elsewhere = not self._executor.inline
        self.max_in_flight = 0  # (inline, each answer is back on the next turn)
        self.lead_ns = ENGINE_LEAD_NS
        self._resolved_in: object = snapshot
        """The registry snapshot `_scheduler` was resolved in (`fits`)."""
        self._scheduler = deployment.scheduler
        self._templates: dict[int, object] = {}
        """Per batch size, the template its requests are made from (see `InferRequest.template`):
        the feed's rows are always the same datatype and shape, so once one request of a size
        passed validation the others skip the checks."""

    def submit(self, array: np.ndarray, due_ns: int, answer: Answer) -> None:
        rows = len(array)
        template = self._templates.get(rows)
        if template is None:
            template = self._templates[rows] = object()
        request = InferRequest(
            self._model, {self.input.name: array}, version=self._version, due_ns=due_ns,
            template=template,
        )  # fmt: skip
        output = self._output
        delivered = False

        def deliver(outputs: Feeds) -> None:
            nonlocal delivered
            delivered = True
            answer(outputs[output], None)

        try:
            # (the feed makes its batches; run within the call, the answer goes to the feed
            # as the run ends, the scheduler's books after it: see `Engine.submit_now`)
            done = self._engine.submit_now(request, deliver)
        except DuetimeError as exc:
            if delivered:  # (`answer`'s own error: the request was answered, once)
                raise
            answer(None, _failure(exc))
            return
        if isinstance(done, Ticket):
            done.when_done(lambda: self._settled(done, answer))
            return
        outputs = done[1]  # (run within the call: no ticket; answered, it was delivered)
        if isinstance(outputs, DuetimeError):
            answer(None, _failure(outputs))

    async def prime(self, deadline_ns: int) -> None:
        """Run a request of each batch size through the Engine, due `deadline_ns` from its ask
        as the run's are (a refusal warms the path as well; answers dropped), so the run's first
        requests of each size find the path warm and their templates validated (see
        `run.FeedRun._ready`). The model's statistics count them, as requests."""
        rows = event_rows(self.input, max(1, self.max_batch))
        for count in range(1, len(rows) + 1):
            done = asyncio.get_running_loop().create_future()

            def settled(
                outputs: np.ndarray | None,
                failure: Failure | None,
                done: asyncio.Future[None] = done,
            ) -> None:
                if not done.done():
                    done.set_result(None)

            self.submit(rows[:count], time.monotonic_ns() + deadline_ns, settled)
            await done

    def fits(self, now_ns: int, due_ns: int, rows: int) -> bool | None:
        """The scheduler's own admission test (`ModelScheduler.fits`: the queue ahead, the
        model's run and the margins it keeps), as if the request were submitted at `now_ns`."""
        registry = self._engine.registry
        snapshot = registry.snapshot
        if snapshot is not self._resolved_in:  # (what is served changed: resolved again)
            try:
                self._scheduler = registry.resolve(self._model, self._version).scheduler
            except DuetimeError:
                return None  # (gone: the submit says why)
            self._resolved_in = snapshot
        return self._scheduler.fits(now_ns, due_ns, rows, 0)

    def warm(self, array: np.ndarray) -> None:
        """Run ONNX Runtime on `array` directly, its answer dropped (nothing counted): only a
        model run on the loop, which is then free (an instance thread may be running a batch)."""
        executor = self._executor
        if executor.inline and executor.instances:  # (none once closed)
            executor.run_sync({self.input.name: array})

    def _settled(self, ticket: Ticket, answer: Answer) -> None:
        future = ticket.future
        error = future.exception()
        if error is None:
            answer(future.result()[self._output], None)
        else:
            answer(None, _failure(error))

    async def aclose(self) -> None:
        return None


def _failure(error: BaseException) -> Failure:
    if isinstance(error, DuetimeError):
        return Failure(error.message, outcome_of_http_status(error.http_status) in REFUSED)
    return Failure(f"{type(error).__name__}: {error}", refused=False)


class GrpcPredictor:
    """Sends each request to a remote v2 server over one gRPC channel, with the time left until
    its due time as the `timeout` parameter (µs), so the remote scheduler plans for it too, and
    a gRPC deadline `GIVE_UP_AFTER_DUE_NS` after it: a request the server never answers is
    reported unanswered then. A server that goes away (no connection) is an error for each
    request, not a refusal: the run fails."""

    def __init__(
        self,
        channel: Any,
        model: str,
        input_spec: TensorSpec,
        output: str,
        max_batch: int,
        target: str = "",
    ) -> None:
        self.input = input_spec
        self.max_batch = max_batch
        self.answered_elsewhere = True
        self.max_in_flight = REMOTE_MAX_IN_FLIGHT
        self.lead_ns = 0  # (it tells no fit: `fits` absent)
        self._channel = channel
        self._call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        self._model = model
        self._output = output
        self._target = target
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    async def connect(cls, target: str, model: str) -> GrpcPredictor:
        channel = grpc.aio.insecure_channel(target)
        try:
            await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT_S)
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            metadata = await stub.ModelMetadata(
                pb.ModelMetadataRequest(name=model), timeout=CONNECT_TIMEOUT_S
            )
            config = await stub.ModelConfig(
                pb.ModelConfigRequest(name=model), timeout=CONNECT_TIMEOUT_S
            )
        except TimeoutError:
            await channel.close()
            raise PredictorError(f"--target {target}: no gRPC server answered") from None
        except grpc.aio.AioRpcError as exc:
            await channel.close()
            raise PredictorError(f"--target {target}: model '{model}': {exc.details()}") from None
        specs = tuple(
            TensorSpec(t.name, t.datatype, tuple(int(d) for d in t.shape)) for t in metadata.inputs
        )
        max_batch = int(config.config.max_batch_size)
        spec = per_event(only_input(specs, model), max_batch)
        return cls(channel, model, spec, metadata.outputs[0].name, max_batch, target)

    def submit(self, array: np.ndarray, due_ns: int, answer: Answer) -> None:
        request = pb.ModelInferRequest(model_name=self._model)
        request.inputs.add(name=self.input.name, datatype="FP32", shape=list(array.shape))
        request.raw_input_contents.append(codec.to_raw(array, "FP32"))
        left_ns = due_ns - time.monotonic_ns()
        request.parameters["timeout"].int64_param = max(1, left_ns // 1000)
        timeout_s = (max(0, left_ns) + GIVE_UP_AFTER_DUE_NS) / 1e9
        # NOTE: the call is made here, not in the task: its own task then sends the request on
        # the loop's next turn, one turn (a message's gap, for a feed between messages) sooner
        call = self._call(request, timeout=timeout_s)
        task = asyncio.get_running_loop().create_task(self._settle(call, due_ns, answer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, call: Any, due_ns: int, answer: Answer) -> None:
        try:
            response = await call
        except grpc.aio.AioRpcError as exc:
            answer(None, await self._failure(exc, due_ns))
            return
        for index, tensor in enumerate(response.outputs):
            if tensor.name == self._output:
                shape = tuple(tensor.shape)
                raw = response.raw_output_contents[index]
                answer(np.frombuffer(raw, dtype=np.float32).reshape(shape), None)
                return
        answer(None, Failure(f"the answer has no output '{self._output}'", refused=False))

    async def _failure(self, exc: grpc.aio.AioRpcError, due_ns: int) -> Failure:
        code = exc.code().name
        message = f"gRPC {code}: {exc.details()}"
        # NOTE: a server that expires the request sends DEADLINE_EXCEEDED by its due time; the
        # call's own deadline (GIVE_UP_AFTER_DUE_NS later) is this client giving up
        if code == "DEADLINE_EXCEEDED" and (
            time.monotonic_ns() >= due_ns + GIVE_UP_AFTER_DUE_NS // 2
        ):
            return Failure(message, refused=False, unanswered=True)
        # NOTE: UNAVAILABLE is a server turning a request away (a model loading: refused) or
        # no server at all (refused connection, the connection lost: an error, the run fails);
        # only the first leaves the channel connected. Calls in flight when the server goes
        # away end CANCELLED
        if code in _GONE and await self._disconnected():
            return Failure(f"{message} (the server at {self._target} went away)", refused=False)
        return Failure(message, outcome_of_grpc_code(code) in REFUSED)

    async def _disconnected(self) -> bool:
        """Whether the channel has lost its server: not connected now, nor `GONE_WAIT_S` on (a
        call fails a moment before the channel sees its connection go)."""
        ready = grpc.ChannelConnectivity.READY
        channel = self._channel
        if channel.get_state() == ready:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(channel.wait_for_state_change(ready), GONE_WAIT_S)
        return bool(channel.get_state() != ready)

    def fits(self, now_ns: int, due_ns: int, rows: int) -> bool | None:
        """The remote scheduler's plans are not known here."""
        return None

    def warm(self, array: np.ndarray) -> None:
        """The model is remote: nothing to warm here."""

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._channel.close()
