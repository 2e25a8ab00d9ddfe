"""Traffic capture: what does `duetime serve --record FILE` cost the server's throughput?

    python3 bench/record.py [--rounds 3] [--duration 8] [--concurrency 16] [--sample 1.0]
                            [--protocol http-binary] [--outputs] [--out bench/results/record.json]

The demo `mlp` (batch 1) under closed-loop load (`concurrency` clients, HTTP binary by default),
from a server without capture (A) and with `--record` at `--sample` (B), alternating A B, B A,
... so the machine's drift falls on both. Each run reports throughput and the server's CPU time
per request (from /proc: less noisy than throughput when the load generator shares the cores);
each B run's capture is read back (records, truncation) and its log gives the dropped count.
The headline: median throughput of B over A (target: at least 0.95) and server CPU per request.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import cpu_sample, logged_server_process, print_table, wait_for_quiet

from duetime.demo import write_demo_repository
from duetime.tools.capture import CaptureReader
from duetime.tools.config import BenchConfig
from duetime.tools.loadgen import run_bench

DROPPED = re.compile(r"capture \S+: (\d+) sampled requests were dropped")
"""The server's warning at shutdown when the capture writer fell behind (no line: none)."""


def one_run(
    repo: Path, tmp: Path, kind: str, index: int, args: argparse.Namespace
) -> dict[str, Any]:
    extra: list[str] = []
    capture = tmp / f"run{index}.cap"
    if kind == "record":
        extra += ["--record", str(capture), "--record-sample", str(args.sample)]
        if args.outputs:
            extra.append("--record-outputs")
    log = tmp / f"run{index}.log"
    with logged_server_process(repo, log, *extra) as server:
        pids = [os.getpid(), server.process.pid]
        wait_for_quiet(pids[1:], 5.0)
        address = f"{server.host}:{server.http_port}"
        config = BenchConfig(
            model="mlp", protocol=args.protocol, address=address, mode="closed",
            concurrency=args.concurrency, duration_s=args.duration, warmup_s=1.0, seed=index,
        )  # fmt: skip
        before = cpu_sample(pids[1:])
        overall = run_bench(config).overall
        after = cpu_sample(pids[1:])
    server_cpu_s = after.ours_s - before.ours_s
    answered = overall.ok + overall.late
    row: dict[str, Any] = {
        "server": kind, "run": index, "sent": overall.sent, "ok": overall.ok,
        "errors": overall.errors + overall.rejected + overall.expired,
        "throughput_rps": overall.throughput_rps, "p50_ms": overall.latency.p50_ms,
        "p99_ms": overall.latency.p99_ms,
        # The whole window (warm-up and drain too) over the measured requests: a ratio, A vs B.
        "server_cpu_us_per_req": 1e6 * server_cpu_s / answered if answered else None,
        "other_cores": after.other_cores(before),
    }  # fmt: skip
    if kind == "record":
        with CaptureReader(capture, allow_truncated=True) as reader:
            row["captured"] = sum(1 for _ in reader)
            row["capture_truncated"] = reader.truncated is not None
        row["capture_mb"] = capture.stat().st_size / 1e6
        dropped = DROPPED.search(log.read_text(errors="replace"))
        row["dropped"] = int(dropped[1]) if dropped else 0
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sample", type=float, default=1.0)
    parser.add_argument("--protocol", default="http-binary", choices=["http-binary", "http-json"])
    parser.add_argument("--outputs", action="store_true", help="B also records outputs")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results/record.json")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        repo = write_demo_repository(tmp / "demo")
        for round_ in range(args.rounds):
            order = ("plain", "record") if round_ % 2 == 0 else ("record", "plain")
            for kind in order:
                rows.append(one_run(repo, tmp, kind, len(rows), args))
                print(f"  {kind}: {rows[-1]['throughput_rps']:,.0f} req/s", flush=True)
    print_table(
        "Capture cost: the same closed-loop load with and without --record",
        rows, ["server", "run", "sent", "ok", "errors", "throughput_rps", "p50_ms", "p99_ms",
               "server_cpu_us_per_req", "other_cores", "captured", "dropped"],
    )  # fmt: skip
    median = {
        kind: {
            key: statistics.median(r[key] for r in rows if r["server"] == kind)
            for key in ("throughput_rps", "server_cpu_us_per_req", "p99_ms")
        }
        for kind in ("plain", "record")
    }
    ratio = median["record"]["throughput_rps"] / median["plain"]["throughput_rps"]
    cpu_ratio = median["record"]["server_cpu_us_per_req"] / median["plain"]["server_cpu_us_per_req"]
    summary = [{
        "sample": args.sample, "protocol": args.protocol, "outputs": args.outputs,
        "plain req/s": median["plain"]["throughput_rps"],
        "record req/s": median["record"]["throughput_rps"],
        "throughput ratio": round(ratio, 3),
        "cpu/req ratio": round(cpu_ratio, 3),
        "captured share": round(
            statistics.median(r["captured"] / r["sent"] for r in rows if r["server"] == "record"),
            3,
        ),  # the warm-up's requests are captured too: about 1 + warmup/duration at sample 1
        "dropped": sum(r["dropped"] for r in rows if r["server"] == "record"),
        "truncated": any(r["capture_truncated"] for r in rows if r["server"] == "record"),
    }]  # fmt: skip
    print_table("Summary (medians; target throughput ratio >= 0.95)", summary, list(summary[0]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"machine": platform.machine(), "cpus": len(os.sched_getaffinity(0))}
    settings = {k: str(v) for k, v in vars(args).items()}
    document = {
        "machine": machine, "settings": settings, "runs": rows, "medians": median,
        "throughput_ratio": ratio, "cpu_per_request_ratio": cpu_ratio,
    }  # fmt: skip
    args.out.write_text(json.dumps(document, indent=2))
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
