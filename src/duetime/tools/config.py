"""The settings of one load-generator run, checked once; errors name the `duetime bench` flag."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from duetime.errors import ConfigError
from duetime.tools.arrivals import ARRIVAL_KINDS, ArrivalKind, DueClass, due_classes
from duetime.tools.payloads import PROTOCOLS, WireProtocol

Mode = Literal["open", "closed"]

DEFAULT_HTTP_CONNECTIONS = 32
"""Connections an open-loop HTTP run opens first (a closed loop opens one per client); more
open while all are busy, up to `MAX_HTTP_CONNECTIONS`."""
MAX_HTTP_CONNECTIONS = 1024
"""Connections an HTTP run may open in all: a request never waits behind another's answer on a
connection, only for a free connection once this many are busy."""
MAX_SECONDS = 1_000_000.0
"""The longest --duration, --warmup or --drain (11.6 days): past it a run only overflows timers."""
MAX_SCHEDULED = 20_000_000
"""Requests one open-loop generator process may schedule (--rate x (--warmup + --duration)):
the schedule is built before the run, about 50 bytes a request."""
MAX_PROCESSES = 256
"""The most generator processes (--processes): each is a Python process with its own payload
pool and connections; a typo of 100000 forked until the machine ran out of memory."""
MAX_POOL_BYTES = 1 << 30
"""The most memory the payload pool of one generator process may take (its inputs and their
encoded requests): it is built before the run (`--pool` x due classes)."""
MAX_TIMEOUT_MS = 1e9
"""The longest --timeout-ms (11.6 days): its nanoseconds still fit an int64."""
MAX_PRIORITY = (1 << 63) - 1
"""The highest --priority: what the payloads and the capture format carry (int64)."""


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One run; each field is the `duetime bench` flag of the same name (see `add_arguments`).

    `address` is HOST:PORT for protocols http-* and grpc; `repository` is the model repository
    of protocol "engine" (unless `run_bench_async` is handed an Engine). Invalid values raise
    ConfigError naming the flag.
    """

    model: str
    protocol: WireProtocol = "http-binary"
    address: str | None = None
    repository: Path | None = None
    batch: int = 1
    mode: Mode = "open"
    rate: float = 100.0
    arrival: ArrivalKind = "poisson"
    concurrency: int = 1
    duration_s: float = 10.0
    warmup_s: float = 1.0
    timeouts_ms: tuple[float, ...] = ()
    mix: tuple[float, ...] = ()
    priority: int | None = None
    connections: int | None = None
    seed: int = 0
    processes: int = 1
    drain_s: float = 5.0
    pool_size: int = 16

    def __post_init__(self) -> None:
        # NOTE: lists are accepted from Python callers; the frozen config keeps tuples.
        object.__setattr__(self, "timeouts_ms", tuple(self.timeouts_ms))
        object.__setattr__(self, "mix", tuple(self.mix))
        problems = _problems(self)
        if problems:
            raise ConfigError("; ".join(problems))
        if self.protocol != "engine":
            self.host_port()  # raises if malformed

    @property
    def total_s(self) -> float:
        """Warm-up and measured time: how long requests are sent."""
        return self.warmup_s + self.duration_s

    @property
    def classes(self) -> tuple[DueClass, ...]:
        return due_classes(self.timeouts_ms, self.mix)

    def host_port(self) -> tuple[str, int]:
        """`address` as (host, port); ConfigError naming the flag if it is not HOST:PORT."""
        flag = "--grpc" if self.protocol == "grpc" else "--http"
        host, _, port = (self.address or "").rpartition(":")
        if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            raise ConfigError(
                f"{flag}: expected HOST:PORT such as 127.0.0.1:8000, got {self.address!r}"
            )
        return host.strip("[]"), int(port)

    def pool_size_used(self) -> int:
        """Distinct payloads built per due class: --pool, but in an open loop no more than the
        requests the run schedules (a bigger pool would only be built, never all sent)."""
        if self.mode != "open":
            return self.pool_size
        return max(1, min(self.pool_size, math.ceil(self.rate * self.total_s)))

    def lanes(self) -> int:
        """Connections (HTTP) or channels (gRPC) to open."""
        if self.protocol == "grpc":
            return self.connections or 1
        if self.mode == "closed":
            return self.concurrency
        return self.connections or DEFAULT_HTTP_CONNECTIONS


def _problems(c: BenchConfig) -> list[str]:
    found = []
    if not c.model:
        found.append("--model: give the name of a model the target serves")
    if c.protocol not in PROTOCOLS:
        found.append(f"--protocol: expected one of {', '.join(PROTOCOLS)}, got {c.protocol!r}")
    if c.batch < 1:
        found.append(f"--batch: expected rows per request >= 1, got {c.batch}")
    if c.mode not in ("open", "closed"):
        found.append(f"--mode: expected open or closed, got {c.mode!r}")
    if not (c.rate > 0 and math.isfinite(c.rate)):
        found.append(f"--rate: expected a finite number of requests per second > 0, got {c.rate}")
    if c.arrival not in ARRIVAL_KINDS:
        found.append(f"--arrival: expected poisson or constant, got {c.arrival!r}")
    if c.concurrency < 1:
        found.append(f"--concurrency: expected clients >= 1, got {c.concurrency}")
    # NOTE: written so that NaN fails every check (any comparison with it is False)
    if not 0 < c.duration_s <= MAX_SECONDS:
        found.append(f"--duration: expected seconds > 0 and <= {MAX_SECONDS:g}, got {c.duration_s}")
    for flag, seconds in (("--warmup", c.warmup_s), ("--drain", c.drain_s)):
        if not 0 <= seconds <= MAX_SECONDS:
            found.append(f"{flag}: expected seconds >= 0 and <= {MAX_SECONDS:g}, got {seconds}")
    if not 1 <= c.processes <= MAX_PROCESSES or (c.processes > 1 and c.protocol == "engine"):
        found.append(
            f"--processes: expected 1 to {MAX_PROCESSES} (and 1 with --repository), got "
            f"{c.processes}"
        )
    if c.mode == "closed" and 1 <= c.concurrency < c.processes:
        found.append(
            f"--processes {c.processes}: a closed loop splits its --concurrency {c.concurrency} "
            f"clients among the generator processes; give --processes {c.concurrency} or fewer"
        )
    if c.mode == "open" and not found and c.rate * c.total_s / c.processes > MAX_SCHEDULED:
        found.append(
            f"--rate x (--warmup + --duration): {c.rate * c.total_s:,.0f} requests to schedule, "
            f"over the {MAX_SCHEDULED:,} a generator process may; shorten the run or add "
            "--processes"
        )
    found += _due_problems(c)
    if c.priority is not None and not 0 <= c.priority <= MAX_PRIORITY:
        found.append(
            f"--priority: expected a level from 0 to {MAX_PRIORITY} (1 is highest), got "
            f"{c.priority}"
        )
    if c.seed < 0:
        found.append(f"--seed: expected a number >= 0, got {c.seed}")
    if c.connections is not None and not 1 <= c.connections <= MAX_HTTP_CONNECTIONS:
        # NOTE: 3000 was accepted, and opened before the run, though the help (and replay,
        # which refuses it) say up to 1024
        found.append(f"--connections: expected 1 to {MAX_HTTP_CONNECTIONS}, got {c.connections}")
    if c.pool_size < 1:
        found.append(f"--pool: expected distinct payloads per class >= 1, got {c.pool_size}")
    return found


def _due_problems(c: BenchConfig) -> list[str]:
    if any(not 0 < t <= MAX_TIMEOUT_MS for t in c.timeouts_ms):
        return [f"--timeout-ms: expected milliseconds > 0 and <= {MAX_TIMEOUT_MS:g}, got "
                f"{','.join(map(str, c.timeouts_ms))}"]  # fmt: skip
    if not c.mix:
        return []
    if not c.timeouts_ms:
        return ["--mix needs --timeout-ms: one share per timeout"]
    if len(c.mix) != len(c.timeouts_ms):
        return [f"--mix has {len(c.mix)} shares but --timeout-ms has {len(c.timeouts_ms)} values; "
                "give one share per timeout"]  # fmt: skip
    if any(not 0 <= s <= 1 for s in c.mix) or not abs(sum(c.mix) - 1) <= 1e-3:
        return [f"--mix: expected shares >= 0 adding up to 1, got {','.join(map(str, c.mix))}"]
    return []
