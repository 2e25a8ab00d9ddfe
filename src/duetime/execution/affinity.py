"""CPU affinity: which cores the event loop and each model instance thread run on.

Measured on a 2-core VM: handing work between two threads on the same core costs ~13 µs per
round trip, across cores ~44 µs (waking an idle core is slow), so a model whose batch takes
microseconds runs best on the loop's core, and a model whose batch takes milliseconds on another
core, where it does not stall the loop. `CpuPlan` makes that choice from the latency profile.
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from duetime.errors import ConfigError

SMALL_MODEL_NS = 300_000
"""A batch-1 execution shorter than this shares the loop's core (see the module docstring)."""


def parse_cpus(spec: str) -> tuple[int, ...] | None:
    """`auto` (every CPU this process may use), `none` (no pinning) or a list like `0,2-3`."""
    spec = spec.strip().lower()
    if spec == "none":
        return None
    if spec == "auto":
        return tuple(sorted(os.sched_getaffinity(0)))
    cpus: set[int] = set()
    for part in spec.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"'{spec}' is not a CPU list; expected auto, none, or e.g. 0,2-3")
        if dash and int(high) < int(low):
            # (an empty range would mean no pinning, with no word; taskset refuses it too)
            raise ValueError(
                f"'{spec}' is not a CPU list: {part.strip()} runs backwards (low-high)"
            )
        cpus.update(range(int(low), int(high or low) + 1))
    allowed = os.sched_getaffinity(0)
    if not cpus <= allowed:
        raise ValueError(
            f"CPUs {sorted(cpus - allowed)} are not available; usable: {sorted(allowed)}"
        )
    return tuple(sorted(cpus))


@dataclass(frozen=True, slots=True)
class CpuPlan:
    """The CPUs of this process: the first runs the event loop, the rest run big models."""

    cpus: tuple[int, ...] | None

    @property
    def loop_cpu(self) -> int | None:
        return self.cpus[0] if self.cpus else None

    def for_instances(
        self, count: int, batch1_ns: int, offset: int = 0, *, cost_varies: bool = False
    ) -> list[frozenset[int] | None]:
        """CPUs for each of `count` instance threads of a model whose batch 1 takes `batch1_ns`
        (`cost_varies`: its runs' cost follows its inputs' values, whatever its profile says).

        NOTE: the profile of a model whose cost varies, taken on small samples, says nothing of
        a request's run (a Loop of 2,000 trips took 95 ms where it said 10 µs): placed by it,
        such a model ran on the event loop's core, its long runs taking turns with the loop
        (found by a tester). It goes with the big models."""
        if not self.cpus:
            return [None] * count
        others = self.cpus[1:]
        if (batch1_ns < SMALL_MODEL_NS and not cost_varies) or not others:
            return [frozenset({self.cpus[0]})] * count
        return [frozenset({others[(offset + i) % len(others)]}) for i in range(count)]


def pin_current_thread(cpus: frozenset[int] | None) -> None:
    """Restrict the calling thread to `cpus` (Linux: pid 0 means the calling thread)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def confine_threads(cpus: frozenset[int]) -> None:
    """Keep every thread this process runs now within `cpus` (Linux), as narrowly as it is
    pinned already where that is within them; threads started later take their starter's.

    NOTE: `--cpus` pinned the threads duetime starts for itself, and the others kept every CPU:
    threads of libraries started before the loop was pinned (uvloop's resolver, native ones at
    import), and the metrics exporter's where the list had one CPU (found by a tester)."""
    if not hasattr(os, "sched_setaffinity"):
        return
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        threads = ["0"]  # (no /proc: this thread at least)
    for thread in threads:
        with contextlib.suppress(OSError, ValueError):  # (a thread that ended meanwhile)
            tid = int(thread)
            os.sched_setaffinity(tid, (os.sched_getaffinity(tid) & cpus) or cpus)


BACKGROUND_NICENESS = 19
"""Niceness of background work (shadow instances): Linux then gives it about 1/70 of a core
that real work also wants, and all of a core nobody else wants."""


def lower_thread_priority(niceness: int) -> None:
    """Lower the calling thread's CPU priority (Linux niceness is per thread); best effort."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)


CPU_DMA_LATENCY = Path("/dev/cpu_dma_latency")
"""Linux's PM QoS interface for the CPU wake-up latency the system tolerates (all CPUs)."""


class CpuLatencyLimit:
    """Keeps idle CPUs out of the idle states slower to leave than `limit_us`, while held.

    Linux applies the lowest limit any process holds open on `/dev/cpu_dma_latency` to every
    CPU, and drops it when the file is closed (also when the process dies). At 0 an idle CPU
    polls instead of halting: a packet, or a thread handing work over, finds its core awake.

    NOTE: on a KVM guest whose halt-polling is off (`haltpoll` with `guest_halt_poll_ns` 0, as
    on the 2-core VM this was measured on) an idle vCPU halts into the host, and the wake-up
    that follows costs tens of µs and comes back to cold caches: a bare echo server's round
    trip took 63 µs with the CPUs halting and 16.5 µs with them polling, the `mlp` round trip
    over HTTP binary 173 and 124 µs. The price is every idle CPU of the machine kept busy, so
    it is a deployment's choice (as tuned's latency-performance profile makes it), not a
    default. Writing the device needs root (or a granted file mode).
    """

    def __init__(self, limit_us: int, device: Path = CPU_DMA_LATENCY) -> None:
        self.limit_us = limit_us
        self.device = device
        self._fd: int | None = None

    def hold(self) -> None:
        """Ask for the limit; a `ConfigError` names the setting if the system refuses."""
        if self._fd is not None:
            return
        try:
            fd = os.open(self.device, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise ConfigError(self._refused(exc)) from None
        try:
            os.write(fd, struct.pack("=i", self.limit_us))  # the device takes a native s32
        except OSError as exc:
            os.close(fd)
            raise ConfigError(self._refused(exc)) from None
        self._fd = fd

    def release(self) -> None:
        """Drop the limit (the system's own idle policy applies again)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> CpuLatencyLimit:
        self.hold()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _refused(self, exc: OSError) -> str:
        return (
            f"setting 'cpu_dma_latency_us' (--cpu-dma-latency-us): cannot hold a CPU wake-up "
            f"latency limit of {self.limit_us} µs through {self.device}: {exc.strerror or exc} (it "
            "needs a Linux kernel with PM QoS and write access to the device, normally root; "
            "leave the setting out to run with the system's own idle policy)"
        )


_SCHED_ATTR = struct.Struct("=IIQiIQQQII")
"""Linux's `struct sched_attr` as of 4.13 (`SCHED_ATTR_SIZE_VER1`, 56 bytes): size, policy,
flags, nice, priority, runtime, deadline, period, util_min, util_max."""
_SCHED_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275), "arm64": (274, 275)}
"""(sched_setattr, sched_getattr) by machine; glibc has no wrapper for either."""
_FAIR_POLICIES = (0, 3)  # SCHED_OTHER, SCHED_BATCH: the policies a slice applies to
_SCHED_FLAG_RESET_ON_FORK = 0x01
"""Threads and processes the thread starts afterwards get the kernel's slice, not its own."""
MIN_SLICE_NS = 100_000
"""The shortest slice Linux grants (it clamps requests to 0.1-100 ms)."""


def _sched_calls() -> tuple[Any, int, int] | None:
    """libc and the (sched_setattr, sched_getattr) numbers of this machine; None off Linux or on
    a machine not listed."""
    import ctypes  # (here: only servers that tune their runtime load it)
    import platform

    calls = _SCHED_SYSCALLS.get(platform.machine())
    if calls is None or sys.platform != "linux":
        return None
    return ctypes.CDLL(None, use_errno=True), *calls


def _read_sched_attr(libc: Any, get_call: int) -> list[int] | None:
    """The calling thread's `struct sched_attr` fields; None if the kernel refuses."""
    import ctypes

    buffer = ctypes.create_string_buffer(_SCHED_ATTR.size)
    if libc.syscall(get_call, 0, buffer, _SCHED_ATTR.size, 0) != 0:
        return None
    return list(_SCHED_ATTR.unpack(buffer.raw))


def time_slice() -> int | None:
    """The calling thread's time slice (ns) under a fair policy on Linux 6.12+; None where the
    system keeps none (another OS or machine, an older kernel, a real-time policy)."""
    try:
        found = _sched_calls()
        fields = None if found is None else _read_sched_attr(found[0], found[2])
    except (OSError, AttributeError):
        return None
    if fields is None or fields[1] not in _FAIR_POLICIES:
        return None
    return fields[5] or None  # (a kernel before 6.12 keeps no slice for a fair policy: 0)


def request_time_slice(slice_ns: int) -> int | None:
    """Ask Linux to run the calling thread in slices of `slice_ns` (EEVDF's request length,
    `sched_attr.sched_runtime` for a fair policy, Linux 6.12+; 0: the kernel's); best effort.
    Returns the slice in effect (`time_slice`), or None where the system has no such request.
    Nice value and policy are kept; threads it starts afterwards (instance threads of models
    loaded later, ONNX Runtime's pools) get the kernel's slice, as they would without it
    (SCHED_FLAG_RESET_ON_FORK; not where the thread's nice value is negative, which it would
    reset too): a short slice is for a thread whose every wake-up is urgent, and one on a
    compute thread would take that edge from the loop on a shared core.

    A shorter slice gives the thread an earlier virtual deadline: woken while another process
    runs on its core, it runs at once instead of after that process's slice (1.4 ms by
    default on a 2-core machine), at the same share of the core as before.
    """
    import ctypes

    try:
        found = _sched_calls()
        if found is None:
            return None
        libc, set_call, get_call = found
        fields = _read_sched_attr(libc, get_call)
        if fields is None or fields[1] not in _FAIR_POLICIES:
            return None
        # (reset on fork also resets a negative nice value: there the threads keep both)
        fields[0], fields[2] = _SCHED_ATTR.size, _SCHED_FLAG_RESET_ON_FORK if fields[3] >= 0 else 0
        fields[5] = slice_ns
        if libc.syscall(set_call, 0, ctypes.create_string_buffer(_SCHED_ATTR.pack(*fields)), 0):
            return None
    except (OSError, AttributeError):
        return None
    return time_slice()
