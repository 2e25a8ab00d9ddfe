"""How closely `duetime replay` keeps a capture's schedule, and what that costs it.

Writes captures of DURATION s at RATE req/s of the demo `mlp` model (Poisson arrivals, and a
bursty schedule: bursts of 50 requests within 2 ms every 50 ms), serves the model in a server
process, replays each capture with this process as the replayer (so its CPU time is the
replay's alone), and reports the schedule error (sent minus scheduled), the share of sends
within 1 ms of schedule, the replayer's CPU share of a core, and latency percentiles.

    python bench/replay.py                 # 60 s at 1,000 req/s, both schedules
    python bench/replay.py --duration 10   # quicker
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import print_table, server_process

from duetime.demo import write_demo_repository
from duetime.tools.capture.format import CapturedRequest, CapturedTensor
from duetime.tools.capture.writer import CaptureWriter
from duetime.tools.replay import ReplayConfig, run_replay

RESULTS = Path(__file__).resolve().parent / "results" / "replay.json"
BURST = 50
BURST_SPREAD_NS = 2_000_000


def poisson_arrivals(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    gaps = rng.exponential(1e9 / rate, int(rate * duration_s * 1.2) + 100)
    times = np.cumsum(gaps)
    return times[times < duration_s * 1e9].astype(np.int64)


def bursty_arrivals(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Bursts of BURST requests, each spread over BURST_SPREAD_NS, at `rate` on average."""
    every_ns = BURST * 1e9 / rate
    starts = np.arange(0, duration_s * 1e9, every_ns)
    within = rng.uniform(0, BURST_SPREAD_NS, (starts.size, BURST))
    return np.sort((starts[:, None] + within).reshape(-1)).astype(np.int64)


def write_capture(path: Path, arrivals: np.ndarray, rng: np.random.Generator) -> None:
    """Requests to `mlp` (x FP32 [1, 40]); every other one with a 50 ms due time."""
    with CaptureWriter(path, meta={"written_by": "bench/replay.py"}) as writer:
        for i, arrival in enumerate(arrivals.tolist()):
            x = rng.standard_normal((1, 40)).astype(np.float32)
            writer.write(CapturedRequest(
                arrival_ns=arrival, protocol="http", model="mlp", version=None,
                request_id=f"r{i}", inputs=[CapturedTensor.of("x", x)], outputs_wanted=None,
                parameters={}, due_in_ns=50_000_000 if i % 2 else None, priority=0, headers={},
                trace_id=None, status=200, error=None, latency_ns=0, answered_version=None,
                variant=None, outputs=None,
            ))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--timers", default="thread,loop", help="timers to measure")
    parser.add_argument("--schedules", default="poisson,bursty")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows: list[dict[str, object]] = []
    runs: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        demo = write_demo_repository(root / "demo")
        repo = root / "repo"
        shutil.copytree(demo / "mlp", repo / "mlp")
        makers = {"poisson": poisson_arrivals, "bursty": bursty_arrivals}
        with server_process(repo) as server:
            target = f"http://{server.host}:{server.http_port}"
            for schedule in args.schedules.split(","):
                capture = root / f"{schedule}.cap"
                arrivals = makers[schedule](args.rate, args.duration, rng)
                write_capture(capture, arrivals, rng)
                for timer in args.timers.split(","):
                    config = ReplayConfig(capture, target, timer=timer)  # type: ignore[arg-type]
                    doc = run_replay(config).to_json()
                    name = f"{schedule}/{timer}"
                    lag, me, latency = doc["schedule_error_us"], doc["replayer"], doc["latency_us"]
                    rows.append({
                        "run": name, "sent": doc["sent"], "ok": doc["ok"],
                        "errors": doc["errors"], "rate/s": doc["sent"] / doc["duration_s"],
                        "lag p50 µs": lag["p50"], "lag p99 µs": lag["p99"],
                        "lag max µs": lag["max"], "within 1ms %": 100 * lag["within_1ms"],
                        "cpu %core": 100 * me["cpu_fraction"],
                        "conns": me["connections_opened"],
                        "p50 ms": latency["p50"] / 1000, "p99 ms": latency["p99"] / 1000,
                        "p99.9 ms": latency["p999"] / 1000,
                    })  # fmt: skip
                    for key in ("histogram", "timeline"):
                        doc.pop(key)
                    runs[name] = doc
    columns = list(rows[0])
    print_table(f"duetime replay: {args.duration:g} s captures at {args.rate:g} req/s", rows,
                columns)  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"duration_s": args.duration, "rate": args.rate, "rows": rows, "runs": runs}
    args.out.write_text(json.dumps(summary, indent=2, default=str))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
