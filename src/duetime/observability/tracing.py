"""Tracing: an OpenTelemetry span per request, with child spans for its stages.

Configured by the standard environment variables: tracing is on when `OTEL_TRACES_EXPORTER`
names `otlp`, `console` or both (a comma-separated list: spans go to each), or an OTLP endpoint
(`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, and `OTEL_SDK_DISABLED` is not true; the SDK
reads the rest (`OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, the exporter's settings). When off,
requests carry no timing object and nothing here runs.

Spans are made after the answer is encoded, from monotonic timestamps the request collected on
its way (decode, queue, batch, execute, encode): the request path only writes a few integers.
A W3C `traceparent` (HTTP header or gRPC metadata) makes the request's span its child; its trace
id is returned in `x-trace-id` and in every error message, also when tracing is off.
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from duetime.errors import ConfigError, DuetimeError
from duetime.observability.tracesettings import TraceSettings
from duetime.types import RequestTiming

log = logging.getLogger("duetime.tracing")

__all__ = ["AbandonableExporter", "HttpTarget", "RequestTiming", "TraceParent", "Tracing",
           "http_target", "new_trace_id", "parse_traceparent", "tracing_from_env"]  # fmt: skip

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A W3C trace context from the caller."""

    trace_id: int
    span_id: int
    sampled: bool
    state: TraceState = field(default_factory=TraceState)
    """The caller's W3C `tracestate` (vendors' entries), carried on unchanged."""

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}"


def parse_traceparent(value: str | None, tracestate: str | None = None) -> TraceParent | None:
    """The caller's trace context, or None when absent or malformed (then ignored, as W3C says);
    `tracestate` (its header or metadata, if any) rides along: a malformed one is dropped alone.

    NOTE: `tracestate` was not read, and the server's span had an empty trace state: W3C Trace
    Context has a participant that receives it propagate it (found by a tester)."""
    if not value:
        return None
    value = value.strip(" \t")  # (optional whitespace around a header value)
    match = _TRACEPARENT.fullmatch(value[:55])  # (lowercase hex only, as W3C has it)
    if match is None or match[1] == "ff":
        return None
    if len(value) > 55 and (match[1] == "00" or value[55] != "-"):
        return None  # (version 00 is exactly 55 characters; a later one may add '-' fields)
    trace_id, span_id = int(match[2], 16), int(match[3], 16)
    if trace_id == 0 or span_id == 0:
        return None
    state = TraceState.from_header([tracestate]) if tracestate else TraceState()
    return TraceParent(trace_id, span_id, bool(int(match[4], 16) & 1), state)


class _DroppedTraceState(logging.Filter):
    """Drops OpenTelemetry's warning of a malformed `tracestate` member: W3C Trace Context has
    such a header discarded, and it comes from the client, once per request.

    NOTE: 20 requests with `tracestate: =x` logged 20 warnings, from a logger the log settings
    API does not reach (found by a tester)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Member doesn't match the w3c")


logging.getLogger("opentelemetry.trace.span").addFilter(_DroppedTraceState())


def new_trace_id() -> str:
    """A fresh trace id (for errors of requests that came without one while tracing is off):
    random, not secret, as OpenTelemetry's RandomIdGenerator makes them (never all zeros: W3C
    Trace Context's invalid id).

    NOTE: `os.urandom` is a system call; at overload every refusal the load shedder writes
    takes one, and this was 5% of a refusal's cost."""
    return "%032x" % (_random_bits(128) or 1)


_random_bits = random.getrandbits

SHUTDOWN_EXPORT_S = 2.0
"""How long `Tracing.shutdown` waits by default for the spans still buffered to be exported."""


class Tracing:
    """Turns finished requests' timings into spans, exported in the background."""

    def __init__(
        self, provider: TracerProvider, exporters: Sequence[AbandonableExporter] = ()
    ) -> None:
        self.provider = provider
        self._exporters = tuple(exporters)
        """The provider's exporters, stopped by `shutdown` when it overruns (none: not known)."""
        self.settings = TraceSettings(exporting=True)
        """Which requests get spans (Triton's trace settings API)."""
        self._tracer = provider.get_tracer("duetime")
        self._epoch_offset_ns = time.time_ns() - time.monotonic_ns()

    def record(
        self,
        timing: RequestTiming,
        parent: TraceParent | None,
        *,
        protocol: str,
        model: str,
        version: str,
        variant: str,
        error: DuetimeError | str | None,
        done_ns: int,
        target: HttpTarget | None = None,
    ) -> str | None:
        """Emit the request's span and its stage spans; the trace id (not sampled: the caller's,
        else None). `error`: what it failed with (a message alone: its status code is not
        known); `target`: an HTTP request's path and route (see `http_target`).

        NOTE: a span the tracer's sampler dropped (`OTEL_TRACES_SAMPLER=always_off`,
        `traceidratio`) gave its own trace id, sent in `x-trace-id` though no span of it was
        ever exported, where a request `trace_rate` skips gets none (found by a tester)."""
        if not self.settings.sample(model):
            return parent.trace_id_hex if parent is not None else None
        offset = self._epoch_offset_ns
        context = None
        if parent is not None:
            remote = SpanContext(
                parent.trace_id, parent.span_id, is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED if parent.sampled else 0),
                trace_state=parent.state,
            )  # fmt: skip
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        name, attributes = _server_span(protocol, error, target)
        attributes.update({
            "duetime.protocol": protocol, "duetime.model": model, "duetime.version": version,
            "duetime.variant": variant,
        })  # fmt: skip
        root = self._tracer.start_span(
            name, context=context, start_time=timing.received_ns + offset,
            kind=trace.SpanKind.SERVER, attributes=attributes,
        )  # fmt: skip
        if not root.is_recording():
            self.settings.unsampled(model)
            return parent.trace_id_hex if parent is not None else None
        span_context = root.get_span_context()
        inner = trace.set_span_in_context(root)
        # NOTE: a request failed by the scheduler has `finished_ns` where it was failed: one
        # that never left the queue (expired, say) has no `dispatched_ns` and its wait ends
        # there; one failed in a batch that never started has no `started_ns` (no `execute`);
        # one its run failed has them all. Its `encode` starts at that stamp: it started at
        # `decoded_ns`, so a 504 after 57 ms in the queue showed as 56.5 ms of encoding.
        finished = timing.finished_ns
        stages = [
            ("decode", timing.received_ns, timing.decoded_ns, {}),
            ("queue", timing.queued_ns, timing.dispatched_ns or finished, {}),
            ("batch", timing.dispatched_ns, timing.started_ns or finished,
             {"duetime.batch_rows": timing.batch_rows, "duetime.instance": timing.instance}),
            ("execute", timing.started_ns, finished, {"duetime.compute_ns": timing.compute_ns}),
            ("encode", finished or timing.decoded_ns, done_ns, {}),
        ]  # fmt: skip
        for name, start, end, extra in stages:
            if start and end >= start:
                child = self._tracer.start_span(
                    name, context=inner, start_time=start + offset, attributes=extra
                )
                child.end(end_time=end + offset)
        if error is not None:
            failure = error if isinstance(error, DuetimeError) else None
            message = str(error) if failure is None else failure.message
            root.set_attribute("error.type", _error_type(protocol, failure))
            # (the message of every failure, the client's included, as the semantic
            # conventions' exception event)
            kind = type(failure).__name__ if failure is not None else "DuetimeError"
            root.add_event(
                "exception", {"exception.type": kind, "exception.message": message},
                timestamp=done_ns + offset,
            )  # fmt: skip
            if failure is None or _server_fault(protocol, failure):
                root.set_status(Status(StatusCode.ERROR, message))
        root.end(end_time=done_ns + offset)
        return f"{span_context.trace_id:032x}"

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Export the spans still buffered, for at most `timeout_s` (None: SHUTDOWN_EXPORT_S);
        what is not exported by then is dropped, with one warning. Returns within `timeout_s`.

        NOTE: the SDK's own shutdown waits for the export in progress and then exports the
        rest, each batch up to the exporter's timeout (OTLP: 10 s) with retries: with the
        collector down or not answering, SIGTERM took 5-19 s to end the server, 0.3 s
        otherwise. It runs on a daemon thread here, waited for `timeout_s`; past that the
        exporter is stopped (its retries end, later batches are dropped), and the thread left
        to end with the process, as a request in flight cannot be interrupted."""
        stopping = threading.Thread(
            target=self.provider.shutdown, name="duetime-tracing-shutdown", daemon=True
        )
        if timeout_s is None:
            timeout_s = SHUTDOWN_EXPORT_S
        stopping.start()
        stopping.join(max(0.0, timeout_s))
        if not stopping.is_alive():
            return
        for exporter in self._exporters:
            exporter.abandon()
        log.warning(
            "tracing: the span exporter had not finished %.1f s into shutdown (is its collector "
            "down or not answering?); the spans not exported yet are dropped",
            timeout_s,
        )


GRPC_SERVICE = "inference.GRPCInferenceService"
"""The gRPC service of KServe's v2 protocol (Triton's), whose methods requests' spans name."""

_GRPC_CODES = {
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
    "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}  # fmt: skip
"""gRPC's status codes by name (`DuetimeError.grpc_code`), as `rpc.grpc.status_code` has them."""


@dataclass(frozen=True, slots=True)
class HttpTarget:
    """An HTTP inference request's `url.path` and `http.route` (OpenTelemetry's HTTP server
    span attributes; the route also names the span)."""

    path: str
    route: str


_V2_ROUTE = "/v2/models/{model_name}/infer"
_V2_VERSION_ROUTE = "/v2/models/{model_name}/versions/{model_version}/infer"
_V1_ROUTE = "/v1/models/{model_name}:predict"


def http_target(model: str, version: str | None, *, v1: bool = False) -> HttpTarget:
    """The path and route of an HTTP inference request for `model` (and `version`, as the path
    named it: None if it named none), or of a KServe V1 predict (`v1`). The path is the one
    the server routed, its names percent-encoded again (the query is not part of it)."""
    name = urllib.parse.quote(model, safe="")
    if v1:
        return HttpTarget(f"/v1/models/{name}:predict", _V1_ROUTE)
    if version is None:
        return HttpTarget(f"/v2/models/{name}/infer", _V2_ROUTE)
    named = urllib.parse.quote(version, safe="")
    return HttpTarget(f"/v2/models/{name}/versions/{named}/infer", _V2_VERSION_ROUTE)


def _server_span(
    protocol: str, error: DuetimeError | str | None, target: HttpTarget | None = None
) -> tuple[str, dict[str, Any]]:
    """The name and OpenTelemetry semantic-convention attributes of a request's server span.

    NOTE: the name was `infer <model>`, the model as the client named it: a client asking for
    many models that do not exist made as many span names, which tracing backends index (span
    names must be low-cardinality; the model is the `duetime.model` attribute). And
    `rpc.system` was "http", not one of its values. HTTP server spans are named by their
    method (`{method}`: the route, with or without a version, is not known here), gRPC ones
    `{rpc.service}/{rpc.method}` (found by a tester). With its `target` known, an HTTP span is
    named `{method} {http.route}` and has the conventions' required `url.path` and
    `url.scheme` (it lacked them: found by a tester)."""
    failure = error if isinstance(error, DuetimeError) else None
    if protocol == "http":
        attributes: dict[str, Any] = {"http.request.method": "POST"}
        if error is None:
            attributes["http.response.status_code"] = 200
        elif failure is not None:
            attributes["http.response.status_code"] = failure.http_status
        if target is None:
            return "POST", attributes
        attributes["url.scheme"] = "http"
        attributes["url.path"] = target.path
        attributes["http.route"] = target.route
        return f"POST {target.route}", attributes
    method = "ModelStreamInfer" if protocol == "grpc-stream" else "ModelInfer"
    attributes = {"rpc.system": "grpc", "rpc.service": GRPC_SERVICE, "rpc.method": method}
    # (a stream's call has one status for all its requests, and an answer's error rides in the
    # stream: only a unary call's status is the request's)
    if method == "ModelInfer" and (error is None or failure is not None):
        code = "OK" if failure is None else failure.grpc_code
        attributes["rpc.grpc.status_code"] = _GRPC_CODES.get(code, 2)
    return f"{GRPC_SERVICE}/{method}", attributes


_GRPC_SERVER_FAULTS = frozenset(
    ("UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS")
)
"""The gRPC codes whose server spans have an error status (OpenTelemetry's gRPC semantic
conventions); the others are the client's doing."""


def _server_fault(protocol: str, failure: DuetimeError) -> bool:
    """Whether a request that failed with `failure` has an error status on its server span, as
    OpenTelemetry's semantic conventions have it: over HTTP a 5xx answer (a 4xx is the client's
    doing, and leaves the status unset), over gRPC the codes of `_GRPC_SERVER_FAULTS`.

    NOTE: every failure had one, 400s and 404s included, against the conventions (found by a
    tester); `error.type` names each failure all the same."""
    if protocol == "http":  # (KServe V1's too)
        return failure.http_status >= 500
    return failure.grpc_code in _GRPC_SERVER_FAULTS


def _error_type(protocol: str, failure: DuetimeError | None) -> str:
    """The `error.type` attribute: the HTTP status code, or the gRPC code's name ("_OTHER"
    where only a message is known)."""
    if failure is None:
        return "_OTHER"
    return str(failure.http_status) if protocol == "http" else failure.grpc_code


def tracing_from_env(
    env: Mapping[str, str] | None = None, exporter: SpanExporter | None = None
) -> Tracing | None:
    """Tracing as the `OTEL_*` variables say, or None when they do not turn it on. `exporter`
    (tests, embedding) overrides the ones the variables name."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporters = [exporter] if exporter is not None else _exporters(env)
    if not exporters:
        return None
    service = env.get("OTEL_SERVICE_NAME") or _resource_attribute(env, "service.name") or "duetime"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    abandonable = [AbandonableExporter(each) for each in exporters]
    for each in abandonable:  # (a processor each: a slow collector holds back no other)
        provider.add_span_processor(BatchSpanProcessor(each))
    return Tracing(provider, abandonable)


def _resource_attribute(env: Mapping[str, str], key: str) -> str | None:
    """`key`'s value in `OTEL_RESOURCE_ATTRIBUTES` (key=value pairs, comma-separated, values
    percent-encoded), if given.

    NOTE: `service.name` given there was overridden by duetime's default: the SDK's spec has
    only `OTEL_SERVICE_NAME` take precedence over it (found by a tester)."""
    for pair in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        name, equals, value = pair.partition("=")
        if equals and name.strip() == key and value.strip():
            return urllib.parse.unquote(value.strip())
    return None


class AbandonableExporter(SpanExporter):
    """Passes spans to `inner` until `abandon`ed; after that, drops them (a shutdown that will
    not wait for a collector that does not answer)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.abandoned = False
        self._lock = threading.Lock()
        self._stopped = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.abandoned:
            return SpanExportResult.FAILURE
        return self.inner.export(spans)

    def abandon(self) -> None:
        """Drop every batch from now on, and stop `inner`: an OTLP exporter waiting to retry
        gives up at once (a request it has in flight still runs to its timeout)."""
        self.abandoned = True
        self.shutdown()

    def shutdown(self) -> None:
        with self._lock:  # (once: the SDK's shutdown calls it too, and OTLP warns of a second)
            if self._stopped:
                return
            self._stopped = True
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _exporters(env: Mapping[str, str]) -> list[SpanExporter]:
    """The exporters `OTEL_TRACES_EXPORTER` lists (each once), or OTLP when it is unset and an
    OTLP endpoint is; none for `none`.

    NOTE: the variable is a comma-separated list (the SDK environment spec, and the Python SDK
    reads it so): only its first name was read, and `console,otlp` sent nothing to the
    collector. `none` beside other names is refused, as the Python SDK (no exporter 'none')
    and Java's (`contains none along with other exporters`) refuse it: it cannot say both."""
    value = env.get("OTEL_TRACES_EXPORTER", "")
    names = list(dict.fromkeys(n.strip().lower() for n in value.split(",") if n.strip()))
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not names:
        names = ["otlp"] if endpoint else []
    if names == ["none"]:
        return []
    for name in names:
        if name == "none":
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER={value!r}: 'none' cannot be listed with other exporters; "
                "give none alone, or the exporters without it"
            )
        if name not in ("otlp", "console"):
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER={value!r}: {name!r} is not supported; use otlp, console "
                "(or both, comma-separated) or none"
            )
    return [ConsoleSpanExporter() if name == "console" else _otlp(env) for name in names]


def _otlp(env: Mapping[str, str]) -> SpanExporter:
    """The OTLP exporter of the protocol `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` (else
    `OTEL_EXPORTER_OTLP_PROTOCOL`) names: http/protobuf (the default, as the spec has it) or
    grpc; any other is refused.

    NOTE: the protocol was not read: `grpc` aimed at a collector's gRPC port (4317) sent
    http/protobuf there, and every span was lost without a word (found by a tester)."""
    variable = next(
        (v for v in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
         if env.get(v, "").strip()),
        None,
    )  # fmt: skip
    given = env[variable] if variable else "http/protobuf"
    protocol = given.strip().lower()
    if protocol not in ("http/protobuf", "grpc"):
        raise ConfigError(
            f"{variable}={given!r}: not supported; use http/protobuf (the default) or grpc"
        )
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )

            return GrpcSpanExporter()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise ConfigError(
            f"OTLP tracing over {protocol} is configured but its exporter is not installed: "
            "pip install 'duetime[otlp]'"
        ) from None
    return OTLPSpanExporter()
