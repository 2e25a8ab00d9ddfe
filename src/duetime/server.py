"""Server: the composition root; builds the engine and front ends, starts and stops them."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from duetime.config import ServerSettings, url_host
from duetime.engine import Engine
from duetime.errors import ConfigError
from duetime.execution.affinity import (
    CpuLatencyLimit,
    CpuPlan,
    confine_threads,
    parse_cpus,
    pin_current_thread,
    request_time_slice,
)
from duetime.frontend.grpc import InferenceService, serve_grpc
from duetime.frontend.http import HttpConnection, Intake, connection_factory, serve_http
from duetime.frontend.rest import RestApi
from duetime.frontend.sharedmemory import SharedMemoryRegions
from duetime.loops import BusyPoll
from duetime.observability.exporter import MetricsExporter, port_taken
from duetime.observability.logsettings import LogSettings
from duetime.observability.metrics import CaptureCollector, GrpcCollector, RefusedCollector
from duetime.observability.tracesettings import trace_settings_of
from duetime.observability.tracing import SHUTDOWN_EXPORT_S, Tracing, tracing_from_env
from duetime.overload import LoadShedder
from duetime.repository.manager import RepositoryOptions
from duetime.tools.capture.recorder import Recorder

log = logging.getLogger("duetime.server")

_GRPC_GRACE_EXTRA_S = 1.0
"""gRPC's shutdown grace beyond the engine's (see `Server.stop`)."""
_MOST_WAITING = 65_536
"""Connections a stopping server takes from its listener's backlog at most (the kernel holds
`somaxconn` at most: 4,096 by default)."""
_DRAIN_QUIET_NS = 50_000_000
"""A stopping server serves on (its models take requests) until none has had a request for this
long, with nothing queued or running, and no HTTP request is half read (or the grace ends)."""
_CLOSE_WAIT_S = 1.0
"""How long a stopping server waits for its HTTP connections to close after their last answers
(a lingering one drains its client's bytes: see `HttpConnection._linger`); those still open
then are closed at once."""


@dataclass(frozen=True, slots=True)
class Addresses:
    """Where a started server listens."""

    host: str
    http_port: int
    grpc_port: int
    metrics_port: int | None = None
    """None: no metrics endpoint."""

    def describe(self) -> str:
        """The one line a started server prints: `duetime ready: http://H:P grpc://H:P`, then
        ` metrics://H:P` when the metrics endpoint is on."""
        host = url_host(self.host)
        line = f"duetime ready: http://{host}:{self.http_port} grpc://{host}:{self.grpc_port}"
        if self.metrics_port is not None:
            line += f" metrics://{host}:{self.metrics_port}"
        return line


SHED_PERIOD_S = 0.01
"""How often the load shedder measures the event loop's CPU use."""
IDLE_SAMPLE_S = 0.05
"""...and how often while the loop is idle (`IDLE_UTILIZATION`, nothing refused, no gRPC
call waiting): an overload starting then is measured within this, then every SHED_PERIOD_S.

NOTE: an idle server used 1.4% of a core (measured on the 2-core VM), nearly all of it the
loop's 100 wake-ups a second for this timer (each also reads /proc for the run-queue wait)."""
IDLE_UTILIZATION = 0.05
"""The event loop's CPU use below which it samples every IDLE_SAMPLE_S."""
QUEUED_S = 0.001
"""gRPC calls waiting in its core this long (estimated) make the load shedder act as on a busy
loop (see `LoadShedder.sample`)."""
SATURATED_NS = 20_000_000
"""An HTTP loop reading turn after turn this long without sleeping makes the load shedder act
as on a busy loop, whatever its CPU use (see `ReadTurn.busy_for_ns`)."""
QUEUE_WATCH_UTILIZATION = 0.5
"""The event loop's CPU use above which calls waiting in gRPC's core are looked for.

NOTE: not the shedder's target: at 1,200 calls/s the loop thread used 67-80% of a core (gRPC's
poller thread and the GIL took the rest) while 300-800 calls waited in the core. Below, the
loop has time to take calls as they come; reading the core's counts (`CoreBacklog`) costs
100-700 µs, 3% of a core at 50 readings a second, measured under cProfile."""


def sample_period(meter: LoadShedder, waiting_calls: int) -> float:
    """When the load shedder (`meter`) measures next: IDLE_SAMPLE_S while the loop is idle
    (`meter`'s CPU use below IDLE_UTILIZATION, nothing refused, no gRPC call waiting in its
    core), else SHED_PERIOD_S."""
    if meter.utilization < IDLE_UTILIZATION and not meter.share and not waiting_calls:
        return IDLE_SAMPLE_S
    return SHED_PERIOD_S


def tune_gc(threshold: int) -> None:
    """Move everything loaded so far out of the collector's sight and make gen-0 runs rare.

    Requests free almost all they allocate by reference counting; what the cyclic collector
    would scan is the long-lived state loaded at start, so freezing it keeps collections short.
    """
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(threshold, gen1, gen2)


def repository_options(settings: ServerSettings) -> RepositoryOptions:
    """The repository watcher's options out of the server settings."""
    return RepositoryOptions(
        control_mode=settings.model_control_mode,
        poll_s=settings.repository_poll_secs,
        stable_s=settings.repository_stable_secs,
        startup_models=settings.load_model,
        max_loaded_models=settings.max_loaded_models,
        max_loaded_bytes=settings.max_loaded_bytes,
        lazy=settings.lazy_load,
        strict_readiness=settings.strict_readiness,
        drain_s=settings.unload_drain_secs,
        max_run_memory_bytes=settings.max_run_memory_bytes,
    )


FILES_BESIDE_CONNECTIONS = 256
"""Descriptors a server needs beside its HTTP and gRPC connections: listening sockets, pipes,
model and log files."""


def open_files_for(max_connections: int) -> int:
    """Raise the process's soft limit on open files towards its hard limit, far enough for
    `max_connections` connections (HTTP's and gRPC's) and the rest (`FILES_BESIDE_CONNECTIONS`);
    returns the limit now. Below that, connections past it are reset at accept (EMFILE), not
    answered with the 503 `max_connections` promises: say so.

    NOTE: the usual soft limit is 1024, the default `max_connections` 4096; the hard limit is
    the administrator's ceiling, which a process may raise its soft limit to (Go's runtime
    does so at every start)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return max_connections
    wanted = max_connections + FILES_BESIDE_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d: %s", soft, exc)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "the open-files limit is %d (hard limit %d), below %d connections "
            "(--max-connections and --max-grpc-connections) plus %d "
            "for the rest: connections past about %d are reset at accept instead of answered "
            "503; raise `ulimit -n` or lower those limits",
            soft, hard, max_connections, FILES_BESIDE_CONNECTIONS,
            max(0, soft - FILES_BESIDE_CONNECTIONS),
        )  # fmt: skip
    return int(soft)


def check_ports_free(settings: ServerSettings) -> None:
    """ConfigError naming the flag where the HTTP or gRPC port is taken now, or the host is
    none of this machine's, before the models load (the listeners take them after; one taken
    meanwhile is refused there as ever).

    NOTE: a taken port was told only once every model had loaded (seconds, or minutes for big
    models), where the metrics port was told at once (found by a tester)."""
    for flag, port in (("http_port", settings.http_port), ("grpc_port", settings.grpc_port)):
        endpoint = f"{url_host(settings.host)}:{port} ({flag.split('_')[0].upper()})"
        try:
            addresses = socket.getaddrinfo(
                settings.host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except OSError as exc:
            raise _host_refused(endpoint, exc) from None
        family, kind, proto, _, address = addresses[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:
                    raise _host_refused(endpoint, exc) from None
                if exc.errno != errno.EADDRINUSE:
                    continue  # (its listener says what is wrong)
                name = f"--{flag.replace('_', '-')}"
                raise ConfigError(
                    f"server settings: field '{flag}': cannot listen on "
                    f"{url_host(settings.host)}:{port}: {exc.strerror}; pass {name} with a free "
                    "port (0 picks one)"
                ) from None


def _host_refused(endpoint: str, error: OSError) -> ConfigError:
    """The start's error for a host it cannot listen on: not an address of this machine, or a
    name that resolves to none.

    NOTE: checked before the metrics endpoint starts, which told it first, on its own port:
    "cannot listen on bad!host:8002" for a server asked for HTTP on 8000 (found by a tester)."""
    return ConfigError(
        f"server settings: field 'host': cannot listen on {endpoint}: "
        f"{error.strerror or error}; pass --host with an address of this host (127.0.0.1, "
        "0.0.0.0 or :: for every one)"
    )


def grpc_connections_within(settings: ServerSettings, files: int) -> int:
    """The gRPC connections the server takes where `files` descriptors are all it may open:
    `max_grpc_connections`, or what is left of `files` beside the rest and HTTP's connections
    (at most half of it), said in a warning.

    NOTE: bounded by its setting alone, gRPC took every descriptor a server with a lower limit
    had (1,280: 1,300 idle connections), and new HTTP clients were reset (found by a tester)."""
    wanted = settings.max_grpc_connections
    room = files - FILES_BESIDE_CONNECTIONS
    if room >= settings.max_connections + wanted:
        return wanted
    left = max(1, min(wanted, room - min(settings.max_connections, room // 2)))
    log.warning(
        "gRPC takes %d connections at most (not --max-grpc-connections %d): the open-files "
        "limit is %d", left, wanted, files,
    )  # fmt: skip
    return left


def _warn_of_unused(settings: ServerSettings, env: Mapping[str, str] | None = None) -> None:
    """Warn of settings given that the others turn off (they were ignored without a word), as
    `--load-model` without explicit mode is; `env`: the `DUETIME_*` variables that may have
    given them (None: the process's)."""
    env = os.environ if env is None else env
    given = settings.model_fields_set
    unused: list[tuple[str, str]] = []
    if settings.record_path is None:
        unused += [(f"--{n.replace('_', '-')}", "--record") for n in
                   ("record_outputs", "record_sample", "record_buffer") if n in given]  # fmt: skip
    if not settings.metrics and "metrics_port" in given:
        # NOTE: "(it is given with --no-metrics)" also where DUETIME_METRICS=false had turned
        # metrics off: a flag the user never gave (found by a tester)
        port = _from_env(env, "DUETIME_METRICS_PORT", settings.metrics_port) or "--metrics-port"
        off = _from_env(env, "DUETIME_METRICS", False) or "--no-metrics"
        unused.append((port, f"metrics on ({off} turns them off)"))
    # NOTE: these two were ignored without a word, as the ones above had been (found by a
    # tester); each is named as it was given, a flag or a variable
    mode = settings.model_control_mode
    if mode != "poll" and "repository_poll_secs" in given:
        poll = _given_as(env, "repository_poll_secs", settings.repository_poll_secs)
        unused.append((poll, f"--model-control-mode poll (this server runs with {mode})"))
    if not settings.tune_runtime:
        off = _from_env(env, "DUETIME_TUNE_RUNTIME", False) or "--no-tune-runtime"
        tuned = [n for n in ("gc_threshold", "switch_interval_us", "loop_slice_us") if n in given]
        for name in tuned:
            flag = _given_as(env, name, getattr(settings, name))
            unused.append((flag, f"runtime tuning on ({off} turns it off)"))
    for flag, needs in unused:
        log.warning("%s is ignored: it only takes effect with %s", flag, needs)


def _given_as(env: Mapping[str, str], name: str, value: str | float) -> str:
    """How the setting `name` (of `value`) was given, for a warning to name: `VARIABLE=...`
    where `env` gave it (see `_from_env`), else its flag."""
    return _from_env(env, f"DUETIME_{name.upper()}", value) or f"--{name.replace('_', '-')}"


def _from_env(env: Mapping[str, str], variable: str, value: str | float) -> str | None:
    """`variable=...` where `env` gives the setting `value` (its flag, given too, would give
    the same), for a warning to name; None where it does not: its flag gave it."""
    text = env.get(variable)
    if text is None:
        return None
    try:
        if TypeAdapter(type(value)).validate_python(text) != value:
            return None
    except ValidationError:
        return None
    return f"{variable}={text}"


class Server:
    """One duetime process: the engine with its models, the HTTP and the gRPC front ends."""

    def __init__(
        self,
        settings: ServerSettings,
        engine: Engine | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """`tracing` (tests, embedding) replaces what the `OTEL_*` variables configure."""
        self.settings = settings
        try:
            self.cpus = CpuPlan(parse_cpus(settings.cpus))
        except ValueError as exc:
            raise ConfigError(f"server settings: field 'cpus': {exc}") from None
        self.engine = engine or Engine(cpus=self.cpus, options=repository_options(settings))
        share = settings.overload_utilization
        self.shedder = (
            LoadShedder(target=share, period=SHED_PERIOD_S, idle=self.engine.has_idle_capacity)
            if share > 0
            else None
        )
        self._meter = self.shedder or LoadShedder(period=SHED_PERIOD_S)
        """What measures the loop's CPU use: the shedder, or (shedding off) one that only
        measures (calls waiting in gRPC's core are looked for while the loop is busy)."""
        self._shed_timer: asyncio.TimerHandle | None = None
        self.tracing = tracing or tracing_from_env()
        self.log_settings = LogSettings()
        trace_settings = trace_settings_of(self.tracing)
        # (an input read from shared memory is bounded as one sent inline is)
        inline_limit = max(settings.max_body_bytes, settings.max_grpc_message_bytes)
        self.shared_memory = SharedMemoryRegions(max_read_bytes=inline_limit)
        self._rest = RestApi(
            self.engine, settings, self.tracing, self.log_settings, trace_settings,
            self.shared_memory,
        )  # fmt: skip
        self._intake = Intake(settings)
        """What the HTTP connections take in (see `Intake`), and what gRPC's requests read
        from shared memory (held within the same limits)."""
        self._grpc_service = InferenceService(
            self.engine, self.shedder, settings.control_token, self.tracing,
            settings.access_log_sample, self.log_settings, trace_settings, self.shared_memory,
            settings.max_grpc_message_bytes, self._intake,
        )  # fmt: skip
        self.cpu_latency = (
            None
            if settings.cpu_dma_latency_us is None
            else CpuLatencyLimit(settings.cpu_dma_latency_us)
        )
        self._connections: set[HttpConnection] = set()
        self._http: asyncio.Server | None = None
        self._grpc: Any = None
        self._metrics: MetricsExporter | None = None
        self.addresses: Addresses | None = None
        self.recorder: Recorder | None = None
        if settings.record_path is not None:
            self.recorder = Recorder(
                settings.record_path, sample=settings.record_sample,
                outputs=settings.record_outputs, buffer=settings.record_buffer,
                clock=self.engine.clock,
            )  # fmt: skip
        _warn_of_unused(settings)

    async def start(self) -> Addresses:
        """Load the repository, then listen; returns once both front ends accept connections."""
        repository = self.settings.model_repository
        if repository is None:
            raise ConfigError("no model repository given: pass a folder, or --demo")
        if self.cpu_latency is not None:
            self.cpu_latency.hold()  # first: a refusal fails before anything starts
            log.info("idle CPUs held to a %d µs wake-up latency", self.cpu_latency.limit_us)
        try:
            return await self._start(repository)
        except BaseException:  # (a taken port, a bad capture file): nothing it took stays
            await self.stop()
            raise

    async def _start(self, repository: Path) -> Addresses:
        check_ports_free(self.settings)  # (the host first: the HTTP port's error names it)
        metrics_port = await self._start_metrics()  # a taken port fails before loading
        if self.recorder is not None:
            # NOTE: started after the models had loaded, a capture file that could not be made
            # failed seconds later (found by a tester); a check ahead of making it was passed
            # by what only making it tells (root may write anywhere, /proc takes no file)
            self._start_recorder(self.recorder)
        if self.cpus.cpus:
            confine_threads(frozenset(self.cpus.cpus))
        if self.cpus.loop_cpu is not None:
            pin_current_thread(frozenset({self.cpus.loop_cpu}))
        if self.engine.repository is None:
            await self.engine.load_repository(repository)
        if self.settings.tune_runtime:
            tune_gc(self.settings.gc_threshold)
            sys.setswitchinterval(self.settings.switch_interval_us / 1e6)
            if self.settings.loop_slice_us:
                granted = request_time_slice(self.settings.loop_slice_us * 1000)
                log.info(
                    "event loop time slice: %s",
                    f"{granted / 1000:g} µs"
                    if granted
                    else "the system's (no slice request on this kernel or policy)",
                )
        settings = self.settings
        files = open_files_for(settings.max_connections + settings.max_grpc_connections)
        grpc_settings = settings.model_copy(
            update={"max_grpc_connections": grpc_connections_within(settings, files)}
        )
        if self.settings.busy_poll_us:
            self._rest.turn.busy_poll = BusyPoll(
                asyncio.get_running_loop(), self.settings.busy_poll_us / 1e6
            )
        self._http = await serve_http(
            self._rest, self.settings, self._connections, self._intake, self.shedder
        )
        self._grpc, grpc_port = await serve_grpc(self._grpc_service, grpc_settings)
        backlog = self._grpc_service.backlog
        if backlog is not None:  # (a gRPC call is at least as old as the HTTP read beside it)
            turn, clock = self._rest.turn, self.engine.clock
            backlog.turn_age_ns = lambda: (now := clock.now_ns()) - turn.arrival_ns(now)
        self._meter.sample()  # start measuring from now
        self._shed_timer = asyncio.get_running_loop().call_later(SHED_PERIOD_S, self._sample)
        http_port = self._http.sockets[0].getsockname()[1]
        self.addresses = Addresses(self.settings.host, http_port, grpc_port, metrics_port)
        return self.addresses

    def _start_recorder(self, recorder: Recorder) -> None:
        try:
            recorder.start()
        except OSError as exc:
            why = f"{exc.strerror or exc}"
            if isinstance(exc, FileExistsError):
                why = (
                    "it is a folder; give a file name"
                    if recorder.path.is_dir()
                    else f"{why} (a capture is never overwritten: choose a new file name)"
                )
            raise ConfigError(
                f"server settings: field 'record_path' (--record): cannot create the capture file "
                f"{recorder.path}: {why}"
            ) from None
        self.engine.recorder = recorder
        if self._metrics is not None:
            self._metrics.registry.register(CaptureCollector(recorder))

    async def _start_metrics(self) -> int | None:
        """Serve /metrics on its own threads, off the event loop's CPU where there is another."""
        settings = self.settings
        if not settings.metrics:
            return None
        exporter = MetricsExporter(self.engine, self.shedder)
        try:
            # (the loop's CPU where it is the only one: within --cpus still)
            cpus = self.cpus.cpus
            spare = (frozenset(cpus[1:]) or frozenset(cpus)) if cpus else None
            port = await exporter.start(settings.host, settings.metrics_port, spare)
        except ConfigError as exc:
            if "metrics_port" in settings.model_fields_set or not port_taken(exc):
                raise  # (a host that is not this one's fails everything: say so first)
            # NOTE: the default port is a convenience, not a demand: a second server on the
            # host (a test, a benchmark, another replica) still serves inference.
            log.warning("%s; serving without metrics", exc.message)
            return None
        exporter.registry.register(GrpcCollector(self._grpc_service))
        exporter.registry.register(RefusedCollector(self._rest, self._grpc_service))
        self._metrics = exporter
        return port

    def _sample(self) -> None:
        meter = self._meter
        backlog = self._grpc_service.backlog
        if backlog is not None:
            backlog.sample(meter.utilization > QUEUE_WATCH_UTILIZATION)
        if self.shedder is None:
            meter.sample()
        else:
            queued = (backlog is not None and backlog.wait_s > QUEUED_S) or (
                self._rest.turn.busy_for_ns(self.engine.clock.now_ns()) > SATURATED_NS
            )
            meter.sample(self._outcomes, queued=queued)
        period = sample_period(meter, 0 if backlog is None else backlog.calls)
        self._shed_timer = asyncio.get_running_loop().call_later(period, self._sample)

    def _outcomes(self) -> tuple[int, int]:
        """`(missed, seen)` over every served variant (see `LoadShedder.sample`)."""
        missed = seen = 0
        for deployment in self.engine.registry.snapshot.deployments():
            missed_here, seen_here = deployment.scheduler.outcomes()
            missed += missed_here
            seen += seen_here
        return missed, seen

    async def _accept_waiting(self, listener: asyncio.Server) -> None:
        """Take the connections the kernel holds in `listener`'s backlog, as the stop closes it:
        their requests are read and answered as the others' (see `HttpConnection.shutdown`).

        NOTE: closing the listener reset them, requests and all: 18 of 20 clients whose
        connections and whole requests waited there (the loop busy) got no answer (found by a
        tester). All of them, past `max_connections` too (the Intake takes them while the
        server stops): taken up to that limit, the rest were reset (found by another)."""
        loop = asyncio.get_running_loop()
        factory = connection_factory(
            self._rest, self.settings, self._connections, self._intake, self.shedder
        )
        for server_socket in listener.sockets:
            # (a socket of its own over the listener's descriptor, closed after: the server's
            # stays the server's to close)
            waiting = socket.socket(fileno=os.dup(server_socket.fileno()))
            waiting.setblocking(False)
            try:
                for _ in range(_MOST_WAITING):
                    try:
                        accepted, _ = waiting.accept()
                    except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                        break
                    except OSError as exc:  # (EMFILE: no descriptor left for it)
                        log.warning("stopping: could not take a waiting connection: %s", exc)
                        break
                    accepted.setblocking(False)
                    with contextlib.suppress(OSError):  # (its client reset it meanwhile)
                        await loop.connect_accepted_socket(factory, accepted)
            finally:
                waiting.close()

    async def _connections_closed(self, wait_s: float, reading_until: float) -> None:
        """Wait until `reading_until` (loop time) while a connection still reads a request
        (`HttpConnection.receiving`), refuse those still coming then (`cut_short`), wait up to
        `wait_s` for the HTTP connections to close, then close the rest at once.

        NOTE: a connection closes a loop turn or two after its last answer is written (uvloop
        ends the transport's handle in a later turn): one half-closed by its client, answered
        (503) as the engine closed, was still open when the server's loop closed, which then
        failed (EBUSY, an unclosed-transport warning) one test run in ten."""
        connections = self._connections
        # (the connections leave the set themselves, as they close: polled, at shutdown only)
        while self._loop_time() < reading_until:
            if not any(connection.receiving for connection in connections):
                break
            await asyncio.sleep(0.005)
        for connection in list(connections):
            connection.cut_short()
        deadline = self._loop_time() + wait_s
        while connections and self._loop_time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        for connection in list(connections):
            connection.close_now()
        for _ in range(100):  # (a turn or two each)
            if not connections:
                break
            await asyncio.sleep(0)

    @staticmethod
    def _loop_time() -> float:
        return asyncio.get_running_loop().time()

    async def _drain_models(self, until: float) -> None:
        """Serve on while requests sent before the stop still come: until every model has had
        none for `_DRAIN_QUIET_NS`, with nothing queued or running, and no HTTP request is half
        read, or `until` (loop time).

        NOTE: the engine stopped serving at the stop: a request whose body came 20 ms after
        SIGTERM, while resnet still ran 20 batches queued before it, got 503 "shutting down",
        where the README has it run while the models drain (found by a tester)."""
        registry = self.engine.registry
        while self._loop_time() < until:
            if not self._intake.reading and all(
                (quiet := d.scheduler.quiet_ns()) is not None and quiet >= _DRAIN_QUIET_NS
                for d in registry.snapshot.deployments()
            ):
                return
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        """Stop accepting, report not-ready, drain queued work, close connections and models."""
        grace = self.settings.shutdown_grace_s
        grace_end = self._loop_time() + grace
        if self._shed_timer is not None:
            self._shed_timer.cancel()
        self._rest.accepting = False
        self._intake.stopping = True
        self._grpc_service.stop_accepting()
        if self._http is not None:
            await self._accept_waiting(self._http)
            self._http.close()
        # NOTE: counted at the end, once they were closed, the log line said 0 with connections
        # open at the signal; these are those open as the stop starts (no others come)
        open_connections = len(self._connections)
        # NOTE: gRPC cancels the calls still running when its grace ends, with a bare CANCELLED
        # (which clients read as their own doing, and do not retry); a little longer, it lets
        # the engine fail what is left first, with UNAVAILABLE "shut down before it ran"
        grpc_grace = grace + _GRPC_GRACE_EXTRA_S
        # NOTE: begun (a task), not only made: its coroutine waited until the models had
        # drained, and gRPC took new connections and calls meanwhile, its grace counted from
        # then: a half-sent call kept a server with a 2 s grace 5.4 s (found by a tester)
        grpc_stopped = (
            asyncio.ensure_future(self._grpc.stop(grpc_grace)) if self._grpc is not None else None
        )
        await self._drain_models(grace_end)
        await self.engine.aclose(max(grace_end - self._loop_time(), 0.0))
        for connection in list(self._connections):
            connection.shutdown()
        await self._connections_closed(min(grace, _CLOSE_WAIT_S), grace_end)
        if grpc_stopped is not None:
            await grpc_stopped
        if self._http is not None:
            await self._http.wait_closed()
        if self.recorder is not None and self.engine.recorder is not None:
            self.engine.recorder = None
            await asyncio.to_thread(self.recorder.stop)
        if self._metrics is not None:
            await self._metrics.aclose()
        if self.tracing is not None:
            # exports the spans still buffered, within the grace (see Tracing.shutdown)
            export_s = min(grace, SHUTDOWN_EXPORT_S)
            await asyncio.to_thread(self.tracing.shutdown, export_s)
        if self.cpu_latency is not None:
            self.cpu_latency.release()
        log.info("stopped; %d HTTP connections were open", open_connections)
        self.log_settings.close()
        self.shared_memory.close()
