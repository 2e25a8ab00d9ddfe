"""`duetime bench`: a load generator with due times, open or closed loop, over HTTP, gRPC or in
process.

    duetime bench --http 127.0.0.1:8000 --model mlp --rate 2000 --duration 10 \
        --timeout-ms 10,50 --mix 0.5,0.5 --json out.json

Python API: `run_bench(BenchConfig(...))` runs on a loop of its own; `await run_bench_async(...)`
runs on the caller's loop (and can reuse an Engine). Both return a `BenchResult`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from queue import Empty
from types import FrameType
from typing import Any

import numpy as np

from duetime.engine import Engine
from duetime.errors import ConfigError
from duetime.loops import new_event_loop
from duetime.observability.logs import console
from duetime.tools.arrivals import ARRIVAL_KINDS, arrival_offsets_ns, choose_classes
from duetime.tools.bench_record import CaptureFailed, write_bench_capture
from duetime.tools.config import (
    DEFAULT_HTTP_CONNECTIONS,
    MAX_HTTP_CONNECTIONS,
    MAX_POOL_BYTES,
    BenchConfig,
)
from duetime.tools.drivers import (
    ClosedLoop,
    Dispatch,
    Ledger,
    OpenLoop,
    Sender,
    call_at,
    cpu_over,
    growth_over,
    paced_switching,
)
from duetime.tools.hdr import MissingHdr
from duetime.tools.interrupt import EXIT_CODE, Interrupt
from duetime.tools.outputs import (
    OutputError,
    check_apart,
    check_output,
    failed_write,
    strict_json,
    write_output,
)
from duetime.tools.payloads import (
    GrpcPayload,
    PayloadSpec,
    WireProtocol,
    check_batch,
    encode,
    random_inputs,
)
from duetime.tools.progress import Progress
from duetime.tools.report import EXIT_UNSENT, BenchResult, Records, merge_records, result_of
from duetime.tools.server_metrics import (
    batch_sizes_json,
    counted_between,
    counts_of,
    fetch,
    late_line,
    scrape,
)
from duetime.tools.transports import (
    BenchError,
    EngineTransport,
    GrpcTransport,
    HttpTransport,
    Transport,
)

CLOSED_LOOP_CLASS_DRAWS = 1 << 16
"""Length of the pre-drawn class sequence closed-loop clients cycle through."""
_LEAD_NS = 5_000_000
"""Time between building the schedule and its first request."""
_SETUP_TIMEOUT_S = 120.0
"""Longest wait for the other generator processes to be ready."""


# -- running -------------------------------------------------------------------------------------


def run_bench(
    config: BenchConfig,
    *,
    record: Path | None = None,
    progress: bool = False,
    at_start: Callable[[], object] | None = None,
) -> BenchResult:
    """Run on a fresh event loop (uvloop); never call it from a running loop. Blocks till done.

    With `processes` > 1, that many generator processes (spawned, not forked) share the rate
    and the clients, start together, and their records are merged into one result.
    `record`: write a capture of every request scheduled there, sent or not (`duetime replay`
    sends them again);
    `progress`: a live line on stderr (one process only); `at_start`: called once, in a thread
    of this process, as the measured window starts (after the warm-up; not if the run stops
    before): `--metrics` reads the server's counters then. It runs while requests go out, so
    it should only wait (on I/O), not compute.
    Raises ConfigError for a bad setting and BenchError when the target cannot be used, or
    CaptureFailed (a BenchError) when the run went to its end but `record` could not be
    written: its `result` is what the run measured.
    Ctrl-C while sending ends the run early: the result covers what was measured till then and
    says it was interrupted; Ctrl-C before sending starts raises KeyboardInterrupt.
    """
    if config.processes > 1:
        if record is not None:
            raise ConfigError("--record needs --processes 1 (one process writes the capture)")
        return _run_processes(config, at_start)
    loop = new_event_loop()
    interrupt = Interrupt()
    try:
        run = run_bench_async(
            config, record=record, progress=progress, interrupt=interrupt, at_start=at_start
        )
        return interrupt.run(loop, run)
    finally:
        _close(loop)


def _close(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()


async def run_bench_async(
    config: BenchConfig,
    *,
    engine: Engine | None = None,
    record: Path | None = None,
    progress: bool = False,
    interrupt: Interrupt | None = None,
    at_start: Callable[[], object] | None = None,
) -> BenchResult:
    """Run on the running loop. `engine`: an engine to drive (protocol "engine"), left open;
    `record`, `progress` and `at_start` as for `run_bench`; `interrupt.fire()` stops sending
    early."""
    if config.processes > 1:
        raise ConfigError(
            "--processes > 1 needs run_bench (it spawns processes), not run_bench_async"
        )
    try:
        records = await collect_records(
            config, engine=engine, record=record, progress=progress, interrupt=interrupt,
            at_start=at_start,
        )  # fmt: skip
    except CaptureFailed as exc:
        exc.result = result_of(config, exc.records)
        raise
    return result_of(config, records)


async def collect_records(
    config: BenchConfig,
    *,
    engine: Engine | None = None,
    before_start: Callable[[], Awaitable[int | None]] | None = None,
    record: Path | None = None,
    progress: bool = False,
    interrupt: Interrupt | None = None,
    phase_ns: int = 0,
    at_start: Callable[[], object] | None = None,
) -> Records:
    """Connect, read the model's signature, build payloads, then (after `before_start`) run;
    then write the capture of what was sent to `record`, if given.

    `before_start` may return the instant (`time.perf_counter_ns`) to start sending at, shared
    by generator processes; otherwise sending starts shortly after it. `phase_ns` delays the
    whole open-loop schedule (one process's share of a constant rate), within the same window.
    `at_start` as for `run_bench`.
    """
    ledger = Ledger(timeouts_ns=[due.timeout_ns for due in config.classes])
    transport = _transport(config, ledger, engine)
    await transport.open(config.lanes())
    try:
        signature = await transport.signature(config.model, config.batch)
        try:
            check_batch(signature, config.model, config.batch)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        spec = _payload_spec(config)
        rng = np.random.default_rng(config.seed)
        # the same draws as build_pool, with the inputs kept for the capture
        size, count = config.pool_size_used(), len(config.classes)
        drawn = [random_inputs(signature, config.batch, rng)]
        check_pool_bytes(config, size, drawn[0], encode(spec, drawn[0], config.classes[0]))
        drawn += [random_inputs(signature, config.batch, rng) for _ in range(size * count - 1)]
        pools = [drawn[c * size : (c + 1) * size] for c in range(count)]
        payloads = [
            [encode(spec, inputs, due) for inputs in pool]
            for pool, due in zip(pools, config.classes, strict=True)
        ]
        interrupt = interrupt or Interrupt()  # never fired: the run goes to its end
        # (frozen before the start instant is agreed: the collection that precedes the freeze
        # takes 10-20 ms, which after it would make a process's first sends late)
        with _collector_spares_setup():
            start_ns = None if before_start is None else await before_start()
            records = await _drive(
                config, ledger, transport, payloads, interrupt, progress=progress,
                start_ns=start_ns, phase_ns=phase_ns, at_start=at_start,
            )  # fmt: skip
        if record is not None:
            _write_capture(record, config, ledger, pools, payloads, records)
        return records
    finally:
        await transport.aclose()


@contextlib.contextmanager
def _collector_spares_setup() -> Iterator[None]:
    """While the run goes: what this process holds already (the payloads, the model's
    signature, the transport's connections, the modules) is out of the cyclic collector's
    sight (`gc.freeze`), so its collections scan only what the run itself keeps.

    NOTE: the generator's own pauses count as the server's lateness: a full collection
    scanning the payloads and all else took 12 ms in an 8 s run (resnet at 2,750 requests/s,
    the demo's payloads, 512 connections), and the 50 ms requests answered in the last 12 ms
    before it were read late: 44 late answers in that second, where the server counted none
    (the whole run: 51 late, 99.7% on time; the echo floor's 200% run: 99.9%).
    Thawed after the run unless something had frozen objects before it (a server tuned in
    this process, as `Engine` runs are: `gc.unfreeze` would thaw its objects too)."""
    frozen = gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if not frozen:
            gc.unfreeze()


def _write_capture(
    path: Path,
    config: BenchConfig,
    ledger: Ledger,
    pools: list[list[dict[str, np.ndarray]]],
    payloads: list[list[Any]],
    records: Records,
) -> None:
    """`write_bench_capture`, or CaptureFailed holding the run's `records`.

    NOTE: whatever goes wrong: a BF16 model's capture once failed (KeyError: 'BF16') after the
    whole run, which then printed no table and wrote no --json, leaving a capture of its
    header alone that a rerun refused to overwrite (found by a tester)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bench_capture(path, config, ledger, pools, payloads)
    except OSError as exc:
        message = failed_write(path, "--record", exc).message
        left = "" if isinstance(exc, FileExistsError) else "; nothing was left there"
        raise CaptureFailed(f"{message}{left}; the run's results are kept", records) from None
    except Exception as exc:
        raise CaptureFailed(
            f"--record {path}: the capture could not be written ({type(exc).__name__}: {exc}); "
            "nothing was left there, the run's results are kept",
            records,
        ) from None


def check_pool_bytes(
    config: BenchConfig, size: int, inputs: Mapping[str, np.ndarray], payload: Any
) -> None:
    """ConfigError naming --pool when `size` payloads per due class like `payload` (and their
    `inputs`, kept for --record) would take more than MAX_POOL_BYTES.

    NOTE: the pool had no bound: --batch 64 --pool 1000000 built every payload before the
    run (2.5 GB) and died of numpy's MemoryError with a traceback."""
    each = sum(a.nbytes for a in inputs.values()) + _payload_bytes(payload)
    total = each * size * len(config.classes)
    if total <= MAX_POOL_BYTES:
        return
    classes = f" x {len(config.classes)} due classes" if len(config.classes) > 1 else ""
    raise ConfigError(
        f"--pool {config.pool_size}: {size:,} payloads{classes} of about {each:,} bytes "
        f"(--batch {config.batch}) would take {total / 2**20:,.0f} MiB, over the "
        f"{MAX_POOL_BYTES >> 20} MiB the pool may; lower --pool or --batch"
    )


def _payload_bytes(payload: Any) -> int:
    """The bytes a payload holds besides its inputs (the engine's shares their arrays)."""
    if isinstance(payload, bytes):
        return len(payload)
    if isinstance(payload, GrpcPayload):
        return len(payload.data)
    return 0


def _transport(config: BenchConfig, ledger: Ledger, engine: Engine | None) -> Transport:
    if engine is not None and config.protocol != "engine":
        raise ConfigError(f"an Engine was given, but protocol is {config.protocol!r}, not 'engine'")
    if config.protocol == "engine":
        if engine is None and config.repository is None:
            raise ConfigError("--repository: give the model repository to load in process")
        return EngineTransport(ledger.finish, engine, config.repository)
    host, port = config.host_port()
    if config.protocol == "grpc":
        return GrpcTransport(f"{host}:{port}", ledger.finish)
    return HttpTransport(host, port, ledger.finish, ledger.time_left_us)


def _payload_spec(config: BenchConfig) -> PayloadSpec:
    host, port = ("", 0) if config.protocol == "engine" else config.host_port()
    return PayloadSpec(config.protocol, config.model, config.batch, config.priority, host, port)


async def _drive(
    config: BenchConfig,
    ledger: Ledger,
    transport: Transport,
    payloads: list[list[Any]],
    interrupt: Interrupt,
    *,
    progress: bool = False,
    start_ns: int | None = None,
    phase_ns: int = 0,
    at_start: Callable[[], object] | None = None,
) -> Records:
    """Send, then wait for the answers; Ctrl-C (`interrupt`) ends the measured window early;
    `at_start` is called as the measured window starts (see `run_bench`)."""
    rng = np.random.default_rng([config.seed, 1])
    sender = _sender(config, Dispatch(ledger, transport, payloads), rng, phase_ns)
    start = ledger.clock() + _LEAD_NS if start_ns is None else start_ns
    window = (start + round(config.warmup_s * 1e9), start + round(config.total_s * 1e9))
    stop = interrupt.stopped
    cpu = asyncio.create_task(cpu_over(window, ledger.clock, stop))
    waited = asyncio.create_task(growth_over(window, ledger.clock, lambda: transport.waited, stop))
    read_late = asyncio.create_task(
        growth_over(window, ledger.clock, lambda: transport.read_late, stop)
    )
    started = None if at_start is None else asyncio.create_task(
        call_at(window[0], ledger.clock, at_start, stop)
    )  # fmt: skip
    line = Progress("duetime bench", ledger.snapshot)
    if progress:
        line.start(config.total_s)
    interrupt.sending = True
    try:
        with paced_switching():
            if await interrupt.first(sender.run(start, window[1])):
                sender.stop()
                # the measured window ends now (or is empty, if still warming up)
                window = (window[0], min(window[1], max(window[0], ledger.clock())))
        cpu_s = await cpu
        waited_measured = await waited  # sends of the measured window, as `records` counts them
        read_late_measured = await read_late
        await interrupt.drain(ledger.drained(interrupt.drain_s(config.drain_s)))
        if started is not None:
            await started  # (what it read comes before what the caller reads after the run)
    finally:
        line.stop()
        cpu.cancel()
        waited.cancel()
        read_late.cancel()
        if started is not None:
            started.cancel()
        sender.stop()
    return ledger.records(
        window, cpu_s, waited_measured, interrupted=interrupt.fired, read_late=read_late_measured
    )


def _sender(
    config: BenchConfig, dispatch: Dispatch, rng: np.random.Generator, phase_ns: int = 0
) -> Sender:
    """The open loop's whole schedule, or closed-loop clients with a pre-drawn class sequence."""
    shares = [due.share for due in config.classes]
    if config.mode == "closed":
        draws = choose_classes(shares, CLOSED_LOOP_CLASS_DRAWS, rng)
        return ClosedLoop(dispatch, config.concurrency, draws)
    offsets = schedule_ns(config, rng, phase_ns)
    return OpenLoop(dispatch, offsets, choose_classes(shares, offsets.size, rng))


def schedule_ns(config: BenchConfig, rng: np.random.Generator, phase_ns: int = 0) -> np.ndarray:
    """The open loop's send instants after the start: its arrivals, `phase_ns` later, those
    still before the end of the run."""
    offsets = arrival_offsets_ns(config.rate, config.total_s, config.arrival, rng)
    if phase_ns:
        offsets = offsets + phase_ns
        offsets = offsets[offsets < round(config.total_s * 1e9)]
    return offsets


# -- several generator processes -----------------------------------------------------------------


def share(config: BenchConfig, index: int) -> BenchConfig:
    """The part of `config` that generator process `index` of `config.processes` runs: a share
    of the rate, or of the clients (each process at least one, see `BenchConfig`)."""
    n = config.processes
    clients = config.concurrency // n + (1 if index < config.concurrency % n else 0)
    connections = None if config.connections is None else max(1, config.connections // n)
    return replace(
        config, rate=config.rate / n, connections=connections,
        concurrency=clients if config.mode == "closed" else config.concurrency,
        seed=config.seed * 1000 + index, processes=1,
    )  # fmt: skip


def phase_of(config: BenchConfig, index: int) -> int:
    """How much later (ns) generator process `index` runs its share of a constant schedule, so
    that the processes' sends interleave one every 1/rate instead of going out together."""
    if config.mode != "open" or config.arrival != "constant":
        return 0  # (Poisson shares merge into a Poisson schedule as they are)
    return round(index * 1e9 / config.rate)


def _set_start(start_at: Any, started: Any) -> None:
    """The generator processes' barrier action (run by the last one ready): the instant they
    all start sending, and `started` set once it is there."""
    start_at.value = time.perf_counter_ns() + _LEAD_NS
    started.set()


def _call_at_start(
    warmup_s: float, start_at: Any, started: Any, over: threading.Event,
    interrupted: list[int], act: Callable[[], object],
) -> None:  # fmt: skip
    """`run_bench`'s `at_start` for generator processes, from a thread of the parent: waits for
    them to set their start (`_set_start`), then for the end of their warm-up (the clock is the
    machine's: `time.perf_counter_ns` is CLOCK_MONOTONIC), and calls `act`; not if the run is
    `over` or `interrupted` first, nor if they never started (`started` set by the parent)."""
    started.wait()
    if not start_at.value:
        return
    delay_ns = start_at.value + round(warmup_s * 1e9) - time.perf_counter_ns()
    if over.wait(max(0, delay_ns) / 1e9) or interrupted:
        return
    act()


def _run_processes(
    config: BenchConfig, at_start: Callable[[], object] | None = None
) -> BenchResult:
    context = multiprocessing.get_context("spawn")  # fork is unsafe once grpc has threads
    start_at = context.Value("q", 0, lock=False)
    started = context.Event()
    barrier = context.Barrier(
        config.processes, action=functools.partial(_set_start, start_at, started)
    )
    queue: Any = context.Queue()
    args = [
        (share(config, i), phase_of(config, i), barrier, start_at, queue, i, os.getpid())
        for i in range(config.processes)
    ]
    children = [context.Process(target=_child, args=a, daemon=True) for a in args]
    interrupted: list[int] = []
    over = threading.Event()
    caller = None
    if at_start is not None:
        caller = threading.Thread(
            target=_call_at_start, name="bench-at-start", daemon=True,
            args=(config.warmup_s, start_at, started, over, interrupted, at_start),
        )  # fmt: skip
        caller.start()
    try:
        with _forwarding_sigint(children, interrupted):
            with _sigint_held():
                for child in children:
                    child.start()
            limit_s = _SETUP_TIMEOUT_S + config.total_s + config.drain_s
            answers = _answers(children, queue, limit_s)
    finally:
        for child in children:
            if child.pid is None:
                continue  # never started
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
        if caller is not None:
            over.set()
            started.set()  # (if they never started: the caller then does nothing)
            caller.join()
    failures = [a for a in answers.values() if isinstance(a, str)]
    if failures and interrupted:
        raise KeyboardInterrupt  # a child stopped before sending: nothing to report
    if failures:
        raise BenchError("; ".join(failures))
    return result_of(config, merge_records([a for a in answers.values() if isinstance(a, Records)]))


@contextlib.contextmanager
def _forwarding_sigint(children: list[Any], interrupted: list[int]) -> Iterator[None]:
    """Ctrl-C while generator processes run goes to each of them (each then stops sending and
    reports what it measured, see `Interrupt`); the parent keeps waiting for their records."""
    # NOTE: a terminal sends SIGINT to the whole process group, children included; the one
    # forwarded here then only cuts their brief wait for answers short. `kill -INT` of the
    # parent alone reaches the children only this way.
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: FrameType | None) -> None:
        interrupted.append(signum)
        for child in children:
            if child.pid is not None and child.exitcode is None:
                with contextlib.suppress(OSError):
                    os.kill(child.pid, signal.SIGINT)

    def terminate(signum: int, frame: FrameType | None) -> None:
        """SIGTERM (a supervisor, `timeout`, `kill`): the children end with this process,
        which then dies of the signal as it would have.

        NOTE: only SIGINT was passed on: after `kill -TERM` of the parent its orphaned children
        kept sending until their run's end, and one hung for good writing its records to a
        parent that was gone (found by a tester)."""
        for child in children:
            if child.pid is not None and child.exitcode is None:
                with contextlib.suppress(OSError):
                    os.kill(child.pid, signal.SIGTERM)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGINT, forward)
    previous_term = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """SIGINT blocked (held pending) in this thread while generator processes start: they
    inherit the mask, so that a Ctrl-C cannot break into their imports (a traceback each); it
    reaches each of them once `_child` has its handler in place, and this process once
    `_forwarding_sigint`'s is."""
    if not hasattr(signal, "pthread_sigmask"):  # (Windows)
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _answers(children: list[Any], queue: Any, limit_s: float) -> dict[int, Records | str]:
    """What each child process put on `queue` (records or an error), by process index."""
    answers: dict[int, Records | str] = {}
    deadline = time.monotonic() + limit_s + 30
    while len(answers) < len(children):
        try:
            index, answer = queue.get(timeout=0.5)
            answers[index] = answer
            continue
        except Empty:
            pass
        for index, child in enumerate(children):
            if index not in answers and child.exitcode is not None:
                answers[index] = f"generator process {index} exited with code {child.exitcode}"
        if time.monotonic() > deadline:
            raise BenchError(f"generator processes gave no result within {limit_s + 30:.0f} s")
    return answers


def _die_with(parent: int) -> None:
    """End this generator process when the process that started it (`parent`) ends, however it
    ends (SIGKILL too): Linux's parent-death signal; elsewhere nothing."""
    with contextlib.suppress(Exception):  # (not Linux, or no libc to ask)
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # (it ended before the signal was asked for)
        os._exit(1)


_PR_SET_PDEATHSIG = 1


def _child(
    config: BenchConfig,
    phase_ns: int,
    barrier: Any,
    start_at: Any,
    queue: Any,
    index: int,
    parent: int,
) -> None:
    _die_with(parent)

    async def start_together() -> int:
        await asyncio.to_thread(barrier.wait, _SETUP_TIMEOUT_S)
        return int(start_at.value)

    async def run() -> Records:
        # Interrupt's handler is in place now: a Ctrl-C held since this process started (see
        # `_sigint_held`) arrives, and cancels the setup
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        return await collect_records(
            config, before_start=start_together, interrupt=interrupt, phase_ns=phase_ns
        )

    loop = new_event_loop()
    interrupt = Interrupt()
    try:
        records = interrupt.run(loop, run())
        queue.put((index, records))
    except BaseException as exc:
        barrier.abort()
        message = exc.message if isinstance(exc, BenchError | ConfigError) else repr(exc)
        queue.put((index, f"generator process {index}: {message}"))
    finally:
        _close(loop)


# -- command line --------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `duetime bench` flags."""
    parser.description = (
        "Send inference requests (open loop on a schedule, or closed-loop clients) with due "
        "times, and report per due class: ok, late, rejected, expired, errors, throughput, "
        "goodput, latency percentiles, and the generator's own CPU cost. Throughput and "
        "goodput are answers per second from the start of the measured window to the last "
        "answer counted (or the window's end, if later): answers during --drain count, over "
        "the time they took."
    )
    parser.epilog = (
        f"exit status: 0 the run went through; 1 it could not run (target unreachable, output "
        f"not written); 2 bad flags; {EXIT_UNSENT} some requests could not be sent (no "
        f"connection: the server died or stopped listening; the table's 'unsent' column); "
        f"{EXIT_CODE} interrupted (Ctrl-C)"
    )
    target = parser.add_argument_group("target (give one)").add_mutually_exclusive_group(
        required=True
    )
    target.add_argument("--http", metavar="HOST:PORT", help="a server's HTTP port")
    target.add_argument("--grpc", metavar="HOST:PORT", help="a server's gRPC port")
    target.add_argument(
        "--repository",
        metavar="PATH",
        type=Path,
        help="load this model repository in process and call the Engine",
    )
    parser.add_argument(
        "--protocol",
        choices=["http-binary", "http-json"],
        help="with --http: binary tensors (default) or JSON",
    )
    parser.add_argument("--model", required=True, help="the model to call")
    parser.add_argument("--batch", type=int, default=1, help="rows per request (default 1)")
    load = parser.add_argument_group("load")
    load.add_argument(
        "--mode",
        choices=["open", "closed"],
        default="open",
        help="open: send on a schedule (default); closed: clients wait for answers",
    )
    # (no argparse defaults: the other mode refuses them given, see `config_from_args`)
    load.add_argument("--rate", type=float, help="open loop: requests/s (default 100)")
    load.add_argument(
        "--arrival",
        choices=list(ARRIVAL_KINDS),
        help="open loop: poisson (default) or constant spacing",
    )
    load.add_argument("--concurrency", type=int, help="closed loop: clients (default 1)")
    load.add_argument("--duration", type=float, default=10.0, help="measured seconds (default 10)")
    load.add_argument(
        "--warmup", type=float, default=1.0, help="seconds sent first, not counted (default 1)"
    )
    load.add_argument(
        "--drain", type=float, default=5.0, help="seconds to wait for the last answers (default 5)"
    )
    load.add_argument(
        "--connections",
        type=int,
        help=f"HTTP connections opened first (open loop; default {DEFAULT_HTTP_CONNECTIONS}; "
        f"more open while all are busy, up to {MAX_HTTP_CONNECTIONS}: a request never waits "
        f"behind another's answer) or gRPC channels (default 1); 1 to {MAX_HTTP_CONNECTIONS}",
    )
    load.add_argument(
        "--processes", type=int, default=1, help="generator processes sharing the load"
    )
    load.add_argument("--seed", type=int, default=0, help="seed of arrivals, classes and inputs")
    load.add_argument(
        "--pool",
        type=int,
        default=16,
        help="distinct payloads per due class (default 16; an open loop builds no more than "
        f"it sends), built before the run: at most {MAX_POOL_BYTES >> 20} MiB in all",
    )
    due = parser.add_argument_group("due times")
    due.add_argument(
        "--timeout-ms",
        type=_numbers("--timeout-ms"),
        default=(),
        help="request timeouts, one per due class, e.g. 10,50 (default: none)",
    )
    due.add_argument(
        "--mix",
        type=_numbers("--mix"),
        default=(),
        help="share of each class, e.g. 0.5,0.5 (default: equal)",
    )
    due.add_argument("--priority", type=int, help="the v2 priority parameter (1 is highest)")
    parser.add_argument(
        "--metrics", metavar="URL", help="the server's Prometheus /metrics (duetime: "
        "http://HOST:METRICS_PORT/metrics): the result then holds the batch sizes it ran in "
        "the measured window (not the warm-up), and a line says how many answers it counted "
        "late by its own clock, and why",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    parser.add_argument(
        "--record", type=Path, metavar="FILE",
        help="write a capture of every request scheduled, sent or not (duetime replay sends "
        "them again)",
    )  # fmt: skip
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress line on stderr")


def _numbers(flag: str) -> Callable[[str], tuple[float, ...]]:
    def parse(text: str) -> tuple[float, ...]:
        try:
            return tuple(float(part) for part in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated numbers such as 10,50, got {text!r}"
            ) from None

    parse.__name__ = flag
    return parse


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    if args.protocol is not None and args.http is None:
        raise ConfigError(
            "--protocol applies to --http only (--grpc speaks gRPC, --repository calls the Engine)"
        )
    if args.mode == "closed":
        # NOTE: closed-loop clients send as fast as their answers come: a rate or an arrival
        # process would be silently ignored (a tester's --rate 5 ran at 1,674 requests/s)
        for flag, value in (("--rate", args.rate), ("--arrival", args.arrival)):
            if value is not None:
                raise ConfigError(
                    f"{flag} applies to --mode open only (closed-loop clients send each request "
                    "as the last is answered: set their number with --concurrency)"
                )
    elif args.concurrency is not None:
        # NOTE: an open loop sends on its schedule, however many answers are owed: --concurrency
        # was silently ignored (found by a tester)
        raise ConfigError(
            "--concurrency applies to --mode closed only (an open loop sends at --rate, "
            "whatever the answers do)"
        )
    protocol: WireProtocol = args.protocol or "http-binary"
    if args.grpc or args.repository:
        protocol = "grpc" if args.grpc else "engine"
    return BenchConfig(
        model=args.model, protocol=protocol, address=args.http or args.grpc,
        repository=args.repository, batch=args.batch, mode=args.mode,
        rate=100.0 if args.rate is None else args.rate, arrival=args.arrival or "poisson",
        concurrency=1 if args.concurrency is None else args.concurrency,
        duration_s=args.duration,
        warmup_s=args.warmup, timeouts_ms=args.timeout_ms, mix=args.mix, priority=args.priority,
        connections=args.connections, seed=args.seed, processes=args.processes,
        drain_s=args.drain, pool_size=args.pool,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """`duetime bench`: run, print the table, write --json; 2 for bad flags, 1 if it cannot run
    or --record could not be written (the table and --json all the same), EXIT_UNSENT if some
    requests found no connection, EXIT_CODE when interrupted."""
    capture_error = None
    try:
        config = config_from_args(args)
        check_output(args.json, "--json")
        check_output(args.record, "--record", new=True)
        # (one file for both: the capture was written, then the result over it; a tester)
        check_apart(args.record, "--record", args.json, "--json")
        # NOTE: the server's counters were read before the run, so that the batch sizes and
        # late answers reported counted the warm-up too (3x the requests of the table, with
        # --warmup 2 --duration 1; found by a tester): they are read as the measured window
        # starts, as the table counts
        fetched: list[str | None] = []
        at_start = (
            None if not args.metrics else functools.partial(_fetch_into, fetched, args.metrics)
        )
        try:
            result = run_bench(
                config, record=args.record, progress=not args.quiet, at_start=at_start
            )
        except CaptureFailed as exc:
            if exc.result is None:
                raise
            result, capture_error = exc.result, exc.message
    except ConfigError as exc:
        console(f"duetime bench: {exc.message}")
        return 2
    except BenchError as exc:
        console(f"duetime bench: {exc.message}")
        return 1
    except MissingHdr as exc:
        console(f"duetime bench: {exc}")
        return 1
    except KeyboardInterrupt:
        console("duetime bench: interrupted before sending started", logging.WARNING)
        return EXIT_CODE
    print(result.format())
    before = counts_of(args.metrics, fetched[0]) if fetched else None
    after = scrape(args.metrics) if args.metrics else None
    counted = counted_between(before, after)
    if before is not None and after is not None:
        print(late_line(counted.late))
    if capture_error is not None:
        console(f"duetime bench: {capture_error}")
    elif args.record is not None:
        print(f"wrote {args.record}")
    if args.json is not None:
        doc = result.to_json()
        if args.metrics:
            doc["batch_sizes"] = batch_sizes_json(counted.batches)
            doc["server_late"] = counted.late
        try:
            write_output(args.json, strict_json(doc), "--json")
        except OutputError as exc:
            console(f"duetime bench: {exc.message}")
            return 1
        print(f"wrote {args.json}")
    return 1 if capture_error is not None else exit_status(result)


def _fetch_into(fetched: list[str | None], url: str) -> None:
    """`--metrics`' read as the measured window starts: the text only (parsed after the run)."""
    fetched.append(fetch(url))


def exit_status(result: BenchResult) -> int:
    """EXIT_CODE for a run Ctrl-C stopped, EXIT_UNSENT for one where some requests found no
    connection (whatever the table says of the others, the run is broken), else 0."""
    if result.interrupted:
        return EXIT_CODE
    return EXIT_UNSENT if result.generator.unsent else 0


__all__ = ["BenchConfig", "BenchError", "BenchResult", "add_arguments", "run", "run_bench",
           "run_bench_async"]  # fmt: skip
