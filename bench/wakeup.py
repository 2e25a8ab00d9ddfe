"""How long a woken thread waits for its core while another process uses it: the kernel's time
slice against the 100 µs one `duetime serve` asks for its event loop (`--loop-slice-us`).

    python3 bench/wakeup.py [--messages 3000] [--rounds 2] [--out bench/results/wakeup.json]

A writer process on a second CPU sends a timestamp down a pipe every millisecond; a reader
pinned to the first CPU reads each one and works 150 µs on it (an event loop's turn), its wake-up
latency being the time from the write to the read. A competitor process on the reader's CPU is
busy in 3 ms stretches for a share of the time (`duty`: 0 none, 0.3, 1 always). Each row runs
in fresh processes, the two slices alternated over `--rounds`. Needs Linux 6.12+ for the slice
(elsewhere both rows measure the kernel's own) and two CPUs for the writer to be apart.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import print_table

from duetime.execution.affinity import (
    MIN_SLICE_NS,
    pin_current_thread,
    request_time_slice,
    time_slice,
)

PERIOD_NS = 1_000_000
WORK_NS = 150_000
BURST_NS = 3_000_000
DUTIES = (0.0, 0.3, 1.0)
STAMP = struct.Struct("=q")


def spin(ns: int) -> None:
    started = time.perf_counter_ns()
    while time.perf_counter_ns() - started < ns:
        pass


def compete(cpu: int, duty: float) -> None:
    """Busy `duty` of the time on `cpu`, in bursts of `BURST_NS`, until killed."""
    pin_current_thread(frozenset({cpu}))
    pause = BURST_NS * (1 - duty) / duty / 1e9
    while True:
        spin(BURST_NS)
        if pause:
            time.sleep(pause)


def write(cpu: int, fd: int, messages: int) -> None:
    pin_current_thread(frozenset({cpu}))
    for _ in range(messages):
        os.write(fd, STAMP.pack(time.perf_counter_ns()))
        spin(PERIOD_NS)
    os.close(fd)


def probe(cpu: int, writer_cpu: int, slice_ns: int, duty: float, messages: int) -> dict[str, float]:
    """One measurement: the reader is this process's main thread."""
    me = [sys.executable, __file__]
    competitor = None
    if duty:
        competitor = subprocess.Popen([*me, "--compete", str(cpu), str(duty)])
    read_fd, write_fd = os.pipe()
    pin_current_thread(frozenset({cpu}))
    granted = request_time_slice(slice_ns) if slice_ns else time_slice()
    writer = subprocess.Popen(
        [*me, "--write", str(writer_cpu), str(write_fd), str(messages)], pass_fds=(write_fd,)
    )
    os.close(write_fd)
    waits: list[int] = []
    pending = b""
    try:
        while True:
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            now = time.perf_counter_ns()
            pending += chunk
            whole = len(pending) - len(pending) % STAMP.size
            waits.extend(now - sent for (sent,) in STAMP.iter_unpack(pending[:whole]))
            pending = pending[whole:]
            spin(WORK_NS)
    finally:
        writer.wait()
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    us = np.asarray(waits, dtype=np.float64) / 1e3
    return {
        "slice_us": (granted or 0) / 1e3,
        "p50_us": float(np.percentile(us, 50)),
        "p99_us": float(np.percentile(us, 99)),
        "p99.9_us": float(np.percentile(us, 99.9)),
        "max_us": float(us.max()),
        "n": int(us.size),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results/wakeup.json")
    parser.add_argument("--compete", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--write", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--probe", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compete:
        compete(int(args.compete[0]), float(args.compete[1]))
        return
    if args.write:
        write(*map(int, args.write))
        return
    if args.probe:
        cpu, writer_cpu, slice_ns = map(int, args.probe[:3])
        print(json.dumps(probe(cpu, writer_cpu, slice_ns, float(args.probe[3]), args.messages)))
        return

    cpus = sorted(os.sched_getaffinity(0))
    cpu, writer_cpu = cpus[0], cpus[-1]
    rows: list[dict[str, Any]] = []
    for duty in DUTIES:
        for round_ in range(args.rounds):
            slices = (0, MIN_SLICE_NS) if round_ % 2 == 0 else (MIN_SLICE_NS, 0)
            for slice_ns in slices:
                command = [sys.executable, __file__, "--messages", str(args.messages), "--probe",
                           str(cpu), str(writer_cpu), str(slice_ns), str(duty)]  # fmt: skip
                line = subprocess.run(command, check=True, capture_output=True, text=True).stdout
                asked = "100 µs" if slice_ns else "kernel's"
                rows.append({"duty": duty, "asked": asked, **json.loads(line)})
    rows.sort(key=lambda r: (r["duty"], r["asked"]))
    print_table(
        f"wake-up latency on CPU {cpu}, woken from CPU {writer_cpu} every 1 ms "
        f"({platform.platform()})",
        rows,
        ["duty", "asked", "slice_us", "p50_us", "p99_us", "p99.9_us", "max_us", "n"],
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"platform": platform.platform(), "cpus": cpus}
    args.out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
