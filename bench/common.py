"""Helpers the benchmarks share: a server subprocess, a minimal keep-alive HTTP client, stats."""

from __future__ import annotations

import functools
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from duetime.execution.affinity import pin_current_thread
from duetime.tools.payloads import PayloadSpec, http_request_bytes

T = TypeVar("T")

READY = re.compile(
    rb"duetime ready: http://([\d.]+):(\d+) grpc://([\d.]+):(\d+)(?: metrics://([\d.]+):(\d+))?"
)


@dataclass(frozen=True)
class ServerProcess:
    process: subprocess.Popen[bytes]
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int | None = None

    @property
    def metrics_url(self) -> str | None:
        """Its Prometheus /metrics (None: it serves none)."""
        if self.metrics_port is None:
            return None
        return f"http://{self.host}:{self.metrics_port}/metrics"


@contextmanager
def server_process(
    repository: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    cpus: frozenset[int] | None = None,
) -> Iterator[ServerProcess]:
    """`duetime serve REPO` on free ports, stopped with SIGTERM when the block ends; `cpus`: the
    CPUs the whole process may use (its affinity from the start, as `taskset` sets it), where
    the server is not to place its threads itself (`--cpus none`)."""
    command = [sys.executable, "-m", "duetime", "serve", str(repository), "--http-port", "0",
               "--grpc-port", "0", "--metrics-port", "0", *extra]  # fmt: skip
    confine = None if cpus is None else functools.partial(os.sched_setaffinity, 0, cpus)
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, env={**os.environ, **(env or {})}, preexec_fn=confine
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = READY.search(line)
        if match is None:
            raise RuntimeError(f"server did not start: {line!r}")
        metrics = None if match[6] is None else int(match[6])
        yield ServerProcess(process, match[1].decode(), int(match[2]), int(match[4]), metrics)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


class KeepAliveClient:
    """One keep-alive HTTP/1.1 connection sending a prebuilt request and reading its response."""

    def __init__(self, host: str, port: int, *, spin: bool = False) -> None:
        self.spin = spin
        """Poll the socket instead of sleeping in recv: an idle (halted) vCPU takes tens of µs
        to wake on a VM, which would be counted as the server's latency."""
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""

    def close(self) -> None:
        self.sock.close()

    def roundtrip(self, request: bytes) -> tuple[int, bytes]:
        self.sock.sendall(request)
        while b"\r\n\r\n" not in self._buffer:
            self._buffer += self._recv()
        head, _, rest = self._buffer.partition(b"\r\n\r\n")
        status = int(head[9:12])
        length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
        while len(rest) < length:
            rest += self._recv()
        self._buffer = rest[length:]
        return status, rest[:length]

    def _recv(self) -> bytes:
        if self.spin:
            while True:
                try:
                    data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
                    break
                except BlockingIOError:
                    continue
        else:
            data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("server closed the connection")
        return data


def infer_request_bytes(
    host: str, port: int, model: str, name: str, array: np.ndarray, *, binary: bool
) -> bytes:
    """A complete HTTP request for a v2 infer call with one input (the load generator's)."""
    protocol: Literal["http-binary", "http-json"] = "http-binary" if binary else "http-json"
    spec = PayloadSpec(protocol, model, array.shape[0], None, host, port)
    return http_request_bytes(spec, {name: array}, {}, binary=binary)


def percentiles_us(samples_ns: list[int] | np.ndarray) -> dict[str, float]:
    data = np.asarray(samples_ns, dtype=np.float64) / 1e3
    return {
        "p50_us": float(np.percentile(data, 50)),
        "p90_us": float(np.percentile(data, 90)),
        "p99_us": float(np.percentile(data, 99)),
        "mean_us": float(data.mean()),
        "n": int(data.size),
    }


def timed(fn: object, count: int) -> list[int]:
    call = fn  # a zero-argument callable
    samples = []
    for _ in range(count):
        started = time.perf_counter_ns()
        call()  # type: ignore[operator]
        samples.append(time.perf_counter_ns() - started)
    return samples


def print_table(title: str, rows: list[dict[str, object]], columns: list[str]) -> None:
    print(f"\n{title}")
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(_fmt(row.get(c)).ljust(w) for c, w in zip(columns, widths, strict=True)))


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    return "" if value is None else str(value)


def http_json(
    host: str, port: int, method: str, path: str, body: object = None, *, timeout_s: float = 30.0
) -> Any:
    """One JSON request on a fresh connection; the decoded answer. RuntimeError on a non-2xx
    status, with the server's message."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {} if data is None else {"Content-Type": "application/json"}
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        text = response.read()
    finally:
        connection.close()
    if not 200 <= response.status < 300:
        raise RuntimeError(f"{method} {path}: HTTP {response.status}: {text[:300]!r}")
    return json.loads(text) if text else None


@contextmanager
def pinned(cpus: frozenset[int]) -> Iterator[None]:
    """Run the block with the calling thread pinned to `cpus`, then restore its affinity."""
    before = frozenset(os.sched_getaffinity(0))
    pin_current_thread(cpus)
    try:
        yield
    finally:
        pin_current_thread(before)


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds used so far: by the whole machine (busy, and stolen by the hypervisor) and by
    the processes `cpu_sample` was given; busy minus ours is what other programs used."""

    at_s: float
    busy_s: float
    steal_s: float
    ours_s: float

    def other_cores(self, earlier: CpuSample) -> float:
        """Cores' worth of CPU that other programs used since `earlier`."""
        span = self.at_s - earlier.at_s
        used = (self.busy_s - earlier.busy_s) - (self.ours_s - earlier.ours_s)
        return max(0.0, used / span) if span > 0 else 0.0

    def steal_cores(self, earlier: CpuSample) -> float:
        span = self.at_s - earlier.at_s
        return (self.steal_s - earlier.steal_s) / span if span > 0 else 0.0


def cpu_sample(pids: list[int]) -> CpuSample:
    """A CpuSample from /proc (Linux) for `pids` (threads included)."""
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as file:
        fields = [int(v) for v in file.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice, inside user and nice]
    busy = sum(fields[:8]) - fields[3] - fields[4] - fields[7]
    ours = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as file:
                stat = file.read().rpartition(")")[2].split()
        except OSError:
            continue
        ours += int(stat[11]) + int(stat[12])  # utime, stime
    return CpuSample(time.monotonic(), busy / tick, fields[7] / tick, ours / tick)


def wait_for_quiet(pids: list[int], limit_s: float, threshold: float = 0.25) -> float:
    """Wait (up to `limit_s`) for a second in which programs other than `pids` used under
    `threshold` cores; returns the last second's figure. The benchmarks share a small machine
    with other work (and a server may still be digesting an overload)."""
    waited = time.monotonic()
    while True:
        before = cpu_sample(pids)
        time.sleep(1.0)
        other = cpu_sample(pids).other_cores(before)
        if other < threshold or time.monotonic() - waited >= limit_s:
            return other


@contextmanager
def logged_server_process(repository: Path, log: Path, *extra: str) -> Iterator[ServerProcess]:
    """`server_process` with the server's stderr (its log) appended to `log` instead of ours:
    under overload the server may log a line per failed request."""
    with ExitStack() as stack:
        saved = os.dup(2)
        try:
            with log.open("ab") as file:
                os.dup2(file.fileno(), 2)  # the child inherits fd 2 when it is spawned
                server = stack.enter_context(server_process(repository, *extra))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        yield server


def log_summary(log: Path, keep: int = 5) -> dict[str, Any]:
    """Lines of a server log by level, and the first `keep` distinct messages (trace ids cut)."""
    levels: dict[str, int] = {}
    first: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        match = re.match(r"\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) (.*)", line)
        if match is None:
            continue
        levels[match[1]] = levels.get(match[1], 0) + 1
        message = re.sub(r"\(trace \w+\)|\d+ µs", "…", match[2])
        if len(first) < keep and message not in first:
            first.append(message)
    return {"lines_by_level": levels, "first_messages": first}


def run_when_quiet(
    run: Callable[[], T], pids: list[int], *, wait_s: float, retries: int = 1,
    threshold: float = 0.3,
) -> tuple[T, float, int]:  # fmt: skip
    """`run()` once other programs are idle (see `wait_for_quiet`); run again, up to `retries`
    times, when they used more than `threshold` cores meanwhile. Returns the last result, the
    cores other programs used during it, and the number of attempts. `pids` are ours (this
    process, the server): their CPU is not counted as others'."""
    attempts = 0
    while True:
        attempts += 1
        wait_for_quiet(pids[:1], wait_s)  # the server idle too
        before = cpu_sample(pids)
        result = run()
        others = cpu_sample(pids).other_cores(before)
        if others <= threshold or attempts > retries:
            return result, others, attempts
