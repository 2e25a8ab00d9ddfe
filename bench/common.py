"""Helpers the benchmarks share: a server subprocess, a minimal keep-alive HTTP client, stats."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from duetime.tools.payloads import PayloadSpec, http_request_bytes

READY = re.compile(rb"duetime ready: http://([\d.]+):(\d+) grpc://([\d.]+):(\d+)")


@dataclass(frozen=True)
class ServerProcess:
    process: subprocess.Popen[bytes]
    host: str
    http_port: int
    grpc_port: int


@contextmanager
def server_process(
    repository: Path, *extra: str, env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    """`duetime serve REPO` on free ports, stopped with SIGTERM when the block ends."""
    command = [sys.executable, "-m", "duetime", "serve", str(repository), "--http-port", "0",
               "--grpc-port", "0", *extra]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, env={**os.environ, **(env or {})})
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = READY.search(line)
        if match is None:
            raise RuntimeError(f"server did not start: {line!r}")
        yield ServerProcess(process, match[1].decode(), int(match[2]), int(match[4]))
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
    protocol = "http-binary" if binary else "http-json"
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
