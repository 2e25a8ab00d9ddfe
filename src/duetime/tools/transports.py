"""Where the load generator's requests go: an HTTP pool, gRPC channels, or an in-process Engine.

Every transport reads the model's signature the way its clients would (v2 metadata and config
over HTTP or gRPC, the registry in process), sends pre-built payloads, and reports each request's
end through a `Completion` callback.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Coroutine, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import grpc
import orjson

from duetime.datatypes import NUMPY_OF
from duetime.engine import Engine
from duetime.errors import DuetimeError
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.frontend.proto import grpc_service_pb2_grpc as pb_grpc
from duetime.observability.logs import console
from duetime.tools.config import MAX_HTTP_CONNECTIONS
from duetime.tools.http_client import (
    CONNECT_TIMEOUT_S,
    DUE_UNSENT,
    ERROR_TEXT_CHARS,
    NO_CONNECTION,
    NO_STATUS,
    HttpPool,
    error_text,
    one_line,
    resolve,
)
from duetime.tools.outcomes import Outcome, outcome_of_grpc_code, outcome_of_http_status
from duetime.tools.payloads import (
    GRPC_DEADLINE_MARGIN_S,
    EnginePayload,
    GrpcPayload,
    restamp,
)
from duetime.types import ModelSignature, TensorSpec

_INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
_MAX_MESSAGE = 256 * 1024 * 1024


class Completion(Protocol):
    """Called once per request: its id, how it ended, the server's message when it failed (a
    message with LATE says the client stopped waiting, its own deadline fired, and why), and
    when its answer came if the transport knows it came before it was read
    (`time.perf_counter_ns`; None: now)."""

    def __call__(
        self, rid: int, outcome: Outcome, message: str | None, at_ns: int | None = None
    ) -> None: ...


class BenchError(Exception):
    """The run cannot go on: the target is unreachable, or does not serve the model as asked."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Transport(Protocol):
    """Carries pre-built payloads to the target and reports each request's end.

    `send` never reports synchronously (an immediate failure is reported from a later loop
    callback), so a closed-loop client that resends on completion cannot recurse.
    `waited` counts sends that could not go at once: every HTTP connection was busy and no more
    could be opened; `read_late` answers the generator read late, its loop busy (HTTP only,
    see `HttpPool.begin_turn`).
    """

    @property
    def waited(self) -> int: ...

    @property
    def read_late(self) -> int: ...

    async def open(self, lanes: int) -> None: ...

    async def signature(self, model: str, batch: int = 1) -> ModelSignature:
        """`model`'s inputs and outputs, for requests of `batch` rows (see
        `signature_without_config`)."""
        ...

    def send(self, rid: int, payload: Any, lane: int | None) -> None: ...

    async def aclose(self) -> None: ...


class BadMetadata(ValueError):
    """A model's metadata or config from the server that does not say what bench needs (the
    message names what is wrong); the transports turn it into a BenchError naming the source."""


def signature_from_metadata(
    metadata: Mapping[str, Any], max_batch_size: int, optional: Collection[str] = ()
) -> ModelSignature:
    """A ModelSignature from a v2 model metadata object and the config's max_batch_size and
    `optional` inputs (the v2 metadata does not say which are). BadMetadata when `metadata` is
    no such object: a tensor without its name, datatype or shape, an input of a datatype v2
    does not have (bench could not make one).

    NOTE: such metadata ended bench in a traceback (KeyError: 'datatype', KeyError: 'FP99'
    from the payloads, AttributeError of a JSON array; found by a tester)."""
    if not isinstance(metadata, Mapping):
        raise BadMetadata(f"expected a JSON object, got {_json_type(metadata)}")

    def specs(key: str) -> tuple[TensorSpec, ...]:
        tensors = metadata.get(key, [])
        if not isinstance(tensors, list):
            raise BadMetadata(f"'{key}' is {_json_type(tensors)}, not a list of tensors")
        return tuple(
            _tensor_spec(t, f"{key}[{i}]", known=key == "inputs", optional=optional)
            for i, t in enumerate(tensors)
        )

    return ModelSignature(specs("inputs"), specs("outputs"), max_batch_size)


def _tensor_spec(doc: Any, where: str, *, known: bool, optional: Collection[str]) -> TensorSpec:
    """One tensor of the metadata; `known`: its datatype must be one bench can make."""
    if not isinstance(doc, Mapping):
        raise BadMetadata(f"{where} is {_json_type(doc)}, not a tensor object")
    name, datatype, shape = doc.get("name"), doc.get("datatype"), doc.get("shape")
    if not isinstance(name, str) or not name:
        raise BadMetadata(f"{where} has no 'name'")
    where = f"{where} '{name}'"
    if not isinstance(datatype, str) or not datatype:
        raise BadMetadata(f"{where} has no 'datatype'")
    if known and datatype not in NUMPY_OF:
        raise BadMetadata(
            f"{where}: 'datatype' {datatype!r} is not a v2 datatype ({', '.join(NUMPY_OF)})"
        )
    dims = shape if isinstance(shape, list) else None
    if dims is None or not all(type(d) is int and d >= -1 for d in dims):
        shown = one_line(repr(shape), SHOWN_ANSWER_CHARS)
        state = "has no 'shape'" if shape is None else f"'shape' {shown} is not a list of dims"
        raise BadMetadata(f"{where} {state} (whole numbers, -1 for a free one)")
    return TensorSpec(name, datatype, tuple(dims), optional=name in optional)


def _json_type(value: Any) -> str:
    """`value` as an error names it: a JSON array or object, else the value itself."""
    if isinstance(value, list):
        return "a JSON array"
    if isinstance(value, Mapping):
        return "a JSON object"
    return one_line(repr(value), SHOWN_ANSWER_CHARS)


def signature_without_config(metadata: Mapping[str, Any], batch: int, where: str) -> ModelSignature:
    """A ModelSignature from the v2 metadata alone, of a server without Triton's model config
    extension (MLServer, KServe runtimes): whether an input's first dimension is a batch one is
    not known there, so it is taken as one only when `batch` > 1 needs it (and every input's
    first dimension is free, -1). Says so in one line on stderr; `where` names the missing
    endpoint."""
    signature = signature_from_metadata(metadata, 0)
    firsts = [spec.shape[:1] for spec in signature.required_inputs]
    batching = batch > 1 and bool(firsts) and all(first == (-1,) for first in firsts)
    assumed = (
        f"the first dimension is taken as the batch dimension (--batch {batch})"
        if batching
        else "no batch dimension is assumed"
    )
    console(
        f"duetime bench: the server has no model config ({where}); the model's metadata alone "
        f"gives its inputs, and {assumed}",
        logging.INFO,
    )
    return ModelSignature(signature.inputs, signature.outputs, batch if batching else 0)


# -- HTTP ----------------------------------------------------------------------------------------


class HttpTransport:
    """The tools' HTTP pool (a connection per request in flight, see `http_client`), plus model
    metadata read with one-off GETs before the run."""

    def __init__(
        self, host: str, port: int, complete: Completion,
        time_left_us: Callable[[int], int | None] | None = None,
    ) -> None:  # fmt: skip
        """`time_left_us`: a request's time left of its due time now (None: it has none); a
        request that waited for a free connection carries that, not its whole timeout, as a
        client with a deadline sends it.

        A request whose due time passed while it waited is not sent, as a client with a
        deadline does not send one: it ends EXPIRED (`DUE_UNSENT`).

        NOTE: requests queued for a connection (all busy: hundreds of answers owed, by the
        server or not yet read by the generator's own loop) went out with their whole timeout,
        so the server could answer "on time" by its clock what the generator, counting from
        the schedule, counted late. With client and server clocks joined (mlp at ~2x capacity,
        cold server, a fifth of the requests queued) they reached the server a median 159 ms
        after their schedule; carrying what was left, they were refused as expired."""
        self.host = host
        self.port = port
        self.complete = complete
        waited = None
        if time_left_us is not None:

            def waited(rid: int, payload: bytes) -> bytes | None:
                left = time_left_us(rid)
                if left is None:
                    return payload
                # NOTE: sent with 1 µs left, they were refused as expired, and the server read
                # a timeout shorter than a run as the client's, no sign of overload: mlp at
                # twice its capacity (19,000 requests/s, 2/10 ms due times), once the server
                # fell behind and every connection waited for an answer, sent only such
                # requests for the rest of the run, and the server, shedding none, refused
                # every one (0 answered in 2 of 3 runs of bench/scheduling.py)
                return None if left == 0 else restamp(payload, left)

        self._pool = HttpPool(
            host, port, self._answered, max_connections=MAX_HTTP_CONNECTIONS, waited=waited
        )

    @property
    def waited(self) -> int:
        return self._pool.waited

    @property
    def read_late(self) -> int:
        return self._pool.read_late

    async def open(self, lanes: int) -> None:
        try:
            await self._pool.open(lanes)  # within CONNECT_TIMEOUT_S
        except OSError as exc:
            raise BenchError(f"--http: {exc}") from None

    def send(self, rid: int, payload: bytes, lane: int | None) -> None:
        self._pool.send(rid, payload)

    async def aclose(self) -> None:
        await self._pool.aclose()

    def _answered(
        self, rid: int, status: int, body: bytes | None, head: int | None, message: str | None,
        came: int | None = None,
    ) -> None:  # fmt: skip
        if 200 <= status < 300:
            self.complete(rid, Outcome.OK, None, came)
        elif status == NO_STATUS:
            self.complete(rid, Outcome.ERROR, message)
        elif status == NO_CONNECTION:
            self.complete(rid, Outcome.UNSENT, message)
        elif status == DUE_UNSENT:
            self.complete(rid, Outcome.EXPIRED, message)
        else:
            outcome = outcome_of_http_status(status)
            self.complete(rid, outcome, error_text(status, body or b""), came)

    async def signature(self, model: str, batch: int = 1) -> ModelSignature:
        base = f"http://{self.host}:{self.port}/v2/models/{quote(model, safe='')}"
        metadata = await asyncio.to_thread(_get_json, base)
        config = await asyncio.to_thread(_get_json, f"{base}/config", missing_ok=True)
        if config is None:
            try:
                return signature_without_config(metadata, batch, f"GET {base}/config: not found")
            except BadMetadata as exc:
                raise BenchError(f"GET {base}: {exc}") from None
        try:
            max_batch_size, optional = _batch_and_optional(config)
        except BadMetadata as exc:
            raise BenchError(f"GET {base}/config: {exc}") from None
        try:
            return signature_from_metadata(metadata, max_batch_size, optional)
        except BadMetadata as exc:
            raise BenchError(f"GET {base}: {exc}") from None


def _batch_and_optional(config: Any) -> tuple[int, list[str]]:
    """A Triton-style model config's max_batch_size and optional inputs; BadMetadata if it is
    not one."""
    if not isinstance(config, Mapping):
        raise BadMetadata(f"expected a JSON object, got {_json_type(config)}")
    max_batch_size = config.get("max_batch_size", 0)
    if type(max_batch_size) is not int or max_batch_size < 0:
        raise BadMetadata(f"'max_batch_size' {max_batch_size!r} is not a whole number >= 0")
    inputs = config.get("input", [])
    if not isinstance(inputs, list) or not all(isinstance(t, Mapping) for t in inputs):
        raise BadMetadata(f"'input' is {_json_type(inputs)}, not a list of input objects")
    return max_batch_size, [t.get("name") for t in inputs if t.get("optional")]


_MISSING = frozenset({404, 501})
"""The statuses of an endpoint a server does not have."""


SHOWN_ANSWER_CHARS = 40
"""How much of an answer that is not HTTP an error shows (escaped: an HTTP/2 frame is binary)."""


def _get_json(url: str, *, missing_ok: bool = False) -> Any:
    """The JSON document at `url`; None if `missing_ok` and the server has no such endpoint."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    try:
        with opener.open(url, timeout=CONNECT_TIMEOUT_S) as response:
            return orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            if missing_ok and exc.code in _MISSING:
                return None
            raise BenchError(f"GET {url}: {error_text(exc.code, exc.read())}") from None
    except http.client.RemoteDisconnected:  # (a BadStatusLine too: no answer at all, here)
        raise BenchError(
            f"GET {url}: the server closed the connection without answering; is this the "
            "server's HTTP port?"
        ) from None
    except http.client.BadStatusLine as exc:  # not HTTP at all: a gRPC port, say
        raise BenchError(
            f"GET {url}: {NOT_HTTP}; its answer began '{one_line(str(exc), SHOWN_ANSWER_CHARS)}'"
        ) from None
    except http.client.HTTPException as exc:
        raise BenchError(
            f"GET {url}: no HTTP/1.1 answer ({type(exc).__name__}: "
            f"{one_line(str(exc), SHOWN_ANSWER_CHARS)}); is this the server's HTTP port?"
        ) from None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise BenchError(f"GET {url}: {one_line(str(exc), ERROR_TEXT_CHARS)}") from None


NOT_HTTP = "not an HTTP/1.1 server (is it the gRPC port?)"


async def why_not_http(host: str, port: int, path: str = "/v2/health/live") -> str | None:
    """Why `host`:`port` is no HTTP/1.1 server, when a GET of `path` there is answered in
    something else within PROBE_TIMEOUT_S (a gRPC port's HTTP/2 frames); None when it answers
    HTTP, whatever the status, or nothing that tells (no answer in time, none at all)."""
    try:
        connecting = asyncio.open_connection(host, port)
        reader, writer = await asyncio.wait_for(connecting, PROBE_TIMEOUT_S)
    except OSError:  # (a timeout too)
        return None
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.read(SHOWN_ANSWER_CHARS), PROBE_TIMEOUT_S)
    except OSError:  # (a timeout too)
        head = b""
    finally:
        writer.close()
    if not head or head.startswith(b"HTTP/") or b"HTTP/".startswith(head):
        return None
    return f"{NOT_HTTP}; its answer began '{one_line(head.decode('latin-1'), SHOWN_ANSWER_CHARS)}'"


# -- gRPC ----------------------------------------------------------------------------------------


PROBE_TIMEOUT_S = 1.0


async def _why_no_grpc(target: str) -> str:
    """Why a gRPC channel to `target` (host:port) never became ready, as far as one plain
    connection tells: nothing listens there, or an HTTP/1.1 server does (its HTTP port)."""
    host, _, port = target.rpartition(":")
    try:
        connecting = asyncio.open_connection(host.strip("[]"), int(port))
        reader, writer = await asyncio.wait_for(connecting, PROBE_TIMEOUT_S)
    except (TimeoutError, ValueError):  # (TimeoutError first: it is an OSError)
        return ""
    except OSError as exc:
        return f" ({exc.strerror or exc}: is the server running?)"
    try:
        writer.write(b"GET / HTTP/1.0\r\nHost: duetime\r\n\r\n")
        head = await asyncio.wait_for(reader.read(5), PROBE_TIMEOUT_S)
    except OSError:  # (a timeout too)
        head = b""
    finally:
        writer.close()
    if head.startswith(b"HTTP/"):
        return (
            "; it answers HTTP/1.1, not gRPC: is this the server's HTTP port? (duetime's gRPC "
            "port is 8001 by default)"
        )
    return "; it accepts connections but does not speak gRPC"


async def _refused(host: str, port: int) -> str | None:
    """Why a plain TCP connection to `host`:`port` failed at once ("Connection refused"), or
    None when one opened, or the attempt did not end within PROBE_TIMEOUT_S (no conclusion)."""
    try:
        connecting = asyncio.open_connection(host, port)
        _, writer = await asyncio.wait_for(connecting, PROBE_TIMEOUT_S)
    except TimeoutError:  # (before OSError: it is one)
        return None
    except OSError as exc:  # (asyncio's own strerror: "Connect call failed ('h', p)")
        return os.strerror(exc.errno) if exc.errno else str(exc)
    writer.close()
    return None


class _Calls:
    """The calls in flight of one transport: each is awaited or cancelled by `cancel_all`."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, call: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(call)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class GrpcTransport:
    """grpc.aio channels (one TCP connection each, used in turn) sending pre-serialised requests."""

    def __init__(self, target: str, complete: Completion, flag: str = "--grpc") -> None:
        self.target = target
        self.complete = complete
        self.flag = flag
        """The command-line flag that named the target (in error messages)."""
        self.waited = 0
        self.read_late = 0
        self._channels: list[Any] = []
        self._calls: list[Any] = []
        self._tasks = _Calls()
        self._turn = 0

    async def open(self, lanes: int) -> None:
        """Open `lanes` channels and wait until they are connected."""
        host, _, port = self.target.rpartition(":")
        try:
            await resolve(host.strip("[]"), int(port))  # (a channel would retry a name for ever)
        except OSError as exc:
            raise BenchError(f"{self.flag}: {exc}") from None
        # NOTE: a channel to a port where nothing listens is not refused: it retries with
        # backoff until channel_ready's CONNECT_TIMEOUT_S runs out (11 s to fail a typo), so
        # one plain connection first says at once what the channel would take seconds to
        refusal = await _refused(host.strip("[]"), int(port))
        if refusal is not None:
            raise BenchError(
                f"{self.flag}: cannot connect to {self.target} ({refusal}: is the server running?)"
            )
        options = [
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            ("grpc.use_local_subchannel_pool", 1),
        ]
        self._channels = [grpc.aio.insecure_channel(self.target, options) for _ in range(lanes)]
        ready = asyncio.gather(*(channel.channel_ready() for channel in self._channels))
        # NOTE: when the caller is cancelled (Ctrl-C while connecting), wait_for cancels the
        # gather, which then ends with an error nobody reads ("exception was never retrieved")
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            await asyncio.wait_for(ready, CONNECT_TIMEOUT_S)
        except TimeoutError:
            await self.aclose()
            message = f"{self.flag}: cannot connect to {self.target} within {CONNECT_TIMEOUT_S} s"
            raise BenchError(message + await _why_no_grpc(self.target)) from None
        self._calls = [channel.unary_unary(_INFER_METHOD) for channel in self._channels]

    async def signature(self, model: str, batch: int = 1) -> ModelSignature:
        stub = pb_grpc.GRPCInferenceServiceStub(self._channels[0])  # type: ignore[no-untyped-call]
        try:
            metadata = await stub.ModelMetadata(pb.ModelMetadataRequest(name=model))
            config = await self._config(stub, model)
        except grpc.aio.AioRpcError as exc:
            raise BenchError(
                f"{self.flag} {self.target}: model '{model}': {exc.details()}"
            ) from None
        inputs = [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
            for t in metadata.inputs
        ]
        doc = {"inputs": inputs, "outputs": []}
        try:
            if config is None:
                return signature_without_config(doc, batch, "gRPC ModelConfig: UNIMPLEMENTED")
            optional = [t.name for t in config.config.input if t.optional]
            return signature_from_metadata(doc, int(config.config.max_batch_size), optional)
        except BadMetadata as exc:
            raise BenchError(
                f"{self.flag} {self.target}: model '{model}' metadata: {exc}"
            ) from None

    @staticmethod
    async def _config(stub: Any, model: str) -> Any:
        """The model's config, or None from a server without Triton's ModelConfig RPC."""
        try:
            return await stub.ModelConfig(pb.ModelConfigRequest(name=model))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise

    def send(self, rid: int, payload: GrpcPayload, lane: int | None) -> None:
        turn = self._turn
        self._turn = (turn + 1) % len(self._calls)
        self._tasks.spawn(self._call(turn, rid, payload))

    async def _call(self, turn: int, rid: int, payload: GrpcPayload) -> None:
        began = time.perf_counter()
        try:
            await self._calls[turn](payload.data, timeout=payload.deadline_s)
        except grpc.aio.AioRpcError as exc:
            if gave_up(exc, payload.deadline_s, time.perf_counter() - began):
                # NOTE: the call's own deadline (timeout + margin), not the server's answer:
                # late, its latency counted till now (as HTTP counts a late answer's)
                self.complete(rid, Outcome.LATE, GAVE_UP)
                return
            self.complete(rid, *self.failure(exc, turn))
            return
        except Exception as exc:  # a fault of the client library: count it, keep going
            self.complete(rid, Outcome.ERROR, f"{type(exc).__name__}: {exc}")
            return
        self.complete(rid, Outcome.OK, None)

    def failure(self, exc: grpc.aio.AioRpcError, turn: int) -> tuple[Outcome, str]:
        """How a call on channel `turn` ended, and its message: as its status code says, but an
        UNAVAILABLE that is the connection failing (`connection_failed`) is an error, or UNSENT
        when the channel had no connection to send it on (`never_connected`)."""
        code, details = exc.code().name, exc.details() or ""
        message = f"gRPC {code}: {details}"
        if code == "UNAVAILABLE":
            if never_connected(details):
                return Outcome.UNSENT, message
            state = self._channels[turn].get_state(try_to_connect=False)
            if connection_failed(details, state):
                return Outcome.ERROR, message
        return outcome_of_grpc_code(code), message

    async def aclose(self) -> None:
        await self._tasks.cancel_all()
        await asyncio.gather(*(channel.close() for channel in self._channels))


GAVE_UP = f"no answer by the call's gRPC deadline (timeout + {GRPC_DEADLINE_MARGIN_S:g} s)"


def gave_up(exc: grpc.aio.AioRpcError, deadline_s: float | None, elapsed_s: float) -> bool:
    """Whether a call's DEADLINE_EXCEEDED is its own deadline firing in this client (`elapsed_s`
    after it began) rather than the server expiring the request by its due time, the margin
    earlier."""
    if deadline_s is None or exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
        return False
    return elapsed_s >= deadline_s - GRPC_DEADLINE_MARGIN_S / 2


_NEVER_CONNECTED = (
    "failed to connect to all addresses", "errors resolving", "DNS resolution failed",
)  # fmt: skip
"""What grpcio (its C core) says when it fails a call it had no connection to send on."""
_CONNECTION_FAILURES = (
    *_NEVER_CONNECTED, "Socket closed", "Connection reset", "Connection refused", "Broken pipe",
    "Stream removed", "GOAWAY", "Endpoint read failed", "keepalive watchdog timeout",
    "Cancelling all calls",
)  # fmt: skip
"""What grpcio (its C core) says when it fails a call for want of a connection."""


def never_connected(details: str) -> bool:
    """Whether grpcio failed a call with UNAVAILABLE without sending it: the channel could not
    connect (nothing listening, a name that does not resolve)."""
    return any(phrase in details for phrase in _NEVER_CONNECTED)


def connection_failed(details: str, state: grpc.ChannelConnectivity) -> bool:
    """Whether a call's UNAVAILABLE came from the client's connection (nothing listening, the
    server gone or unreachable) rather than from the server, which says UNAVAILABLE to turn a
    request away (duetime's 503: a model still loading, say). grpcio reports both with the same
    code: its own have details of its own, and leave the channel not READY (by the time a call
    fails, the channel may not have seen its connection go yet, hence both)."""
    if state != grpc.ChannelConnectivity.READY:
        return True
    return any(phrase in details for phrase in _CONNECTION_FAILURES)


# -- in process ----------------------------------------------------------------------------------


class EngineTransport:
    """Calls `Engine.infer_async` on the running loop: a given engine, or one it loads (owns)."""

    def __init__(
        self, complete: Completion, engine: Engine | None, repository: Path | None = None
    ) -> None:
        self.complete = complete
        self.waited = 0
        self.read_late = 0
        self._engine = engine
        self._owned = engine is None
        self._repository = repository
        self._tasks = _Calls()
        self._model = ""

    async def open(self, lanes: int) -> None:
        if self._engine is None:
            if self._repository is None:
                raise BenchError("--repository: give the model repository to load in process")
            engine = Engine()
            try:
                await engine.load_repository(self._repository)
            except DuetimeError as exc:
                await engine.aclose()
                raise BenchError(f"--repository {self._repository}: {exc.message}") from None
            self._engine = engine

    async def signature(self, model: str, batch: int = 1) -> ModelSignature:
        assert self._engine is not None, "open() first"
        try:
            deployment = self._engine.registry.resolve(model, None)
        except DuetimeError as exc:
            raise BenchError(f"--model {model}: {exc.message}") from None
        self._model = model
        return deployment.model.signature

    def send(self, rid: int, payload: EnginePayload, lane: int | None) -> None:
        self._tasks.spawn(self._call(rid, payload))

    async def _call(self, rid: int, payload: EnginePayload) -> None:
        assert self._engine is not None
        try:
            await self._engine.infer_async(
                self._model, payload.inputs, timeout=payload.timeout_s, priority=payload.priority
            )
        except DuetimeError as exc:
            self.complete(rid, outcome_of_http_status(exc.http_status), exc.message)
            return
        except Exception as exc:  # a bug in the engine: count it as an error, keep going
            self.complete(rid, Outcome.ERROR, f"{type(exc).__name__}: {exc}")
            return
        self.complete(rid, Outcome.OK, None)

    async def aclose(self) -> None:
        await self._tasks.cancel_all()
        if self._owned and self._engine is not None:
            await self._engine.aclose()
            self._engine = None
