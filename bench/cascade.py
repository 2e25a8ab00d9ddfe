"""Variants under overload: how much more on-time work does an int8 copy of resnet buy?

    python3 bench/cascade.py [--timeouts-ms 20] [--mix 1] [--loads 100,150,200,300]
                             [--duration 8] [--capacity RPS] [--no-int8-only] [--repeat N]
                             [--quick] [--out bench/results/cascade.json]

1. capacity of the fp32-only server (the plain demo resnet), as bench/scheduling.py defines it:
   closed-loop throughput, then open-loop runs at rising rates with these deadlines; capacity =
   the best goodput (answers on time per second) found;
2. `duetime optimize REPO/resnet --kinds int8-static` on a copy of the repository writes
   model.int8-static.onnx beside model.onnx and lists it under [[variants]] in config.toml
   (through the CLI when it has the command, else through the same code in process);
3. the three servers run side by side, each warmed up by a short closed-loop run (a fresh
   server's first run can be much slower); then for each load in turn, an open-loop run at
   --loads % of that capacity against (a) the plain resnet, (b) resnet with the int8 variant and
   (c) at the top load only, a resnet whose only model is the int8 file (the ceiling for (b):
   all work on the faster model). Interleaving keeps the machine's drift from favouring an arm.
   Per run: goodput, share of answers on time, share of requests answered on time, P50/P99,
   rejected, expired, late and unanswered; the share of answers each variant gave (deltas of
   the per-variant `succeeded` counts of `GET /v2/models/resnet/stats`, warm-up included); the
   cores other programs used meanwhile (the machine is shared; a run is repeated once when they
   used more than 0.3). --repeat N runs the loads N times; verdicts take medians.
Headline: goodput (b) / (a) at the highest load (target >= 2 at 300%).
The generator runs in this process, pinned as bench/scheduling.py pins it for resnet; the
servers' logs go to files, summarised in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import (
    ServerProcess,
    http_json,
    log_summary,
    logged_server_process,
    print_table,
    run_when_quiet,
)
from overhead import ALL_CPUS
from scheduling import ModelPlan, Runner, plans

from duetime.demo import write_demo_repository
from duetime.tools import optimize
from duetime.tools.config import BenchConfig
from duetime.tools.report import BenchResult

MODEL = "resnet"
ARMS = ("fp32 only", "with int8", "int8 only")
"""The servers: the plain demo resnet; with the int8 variant; the int8 file as its only model
(the ceiling of what shifting all work to int8 could reach)."""
INT8_FILE = "model.int8-static.onnx"
CAPACITY_FACTORS = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2)
"""Open-loop rates of the capacity search, as shares of the closed-loop throughput."""


class DeadlineRunner(Runner):
    """scheduling.py's Runner with this benchmark's deadlines and mix."""

    def __init__(
        self, plan: ModelPlan, duration: float, connections: int, args: argparse.Namespace
    ) -> None:
        super().__init__(plan, duration, connections)
        self.timeouts_ms = tuple(args.timeouts_ms)
        self.mix = tuple(args.mix) if args.mix else ()

    def open_loop(self, port: int, rate: float, *, deadlines: bool = True) -> BenchResult:
        config = BenchConfig(
            model=MODEL, protocol="http-binary", address=f"127.0.0.1:{port}", mode="open",
            rate=rate, duration_s=self.duration, warmup_s=1.0, timeouts_ms=self.timeouts_ms,
            mix=self.mix, connections=self.connections, seed=int(rate),
        )  # fmt: skip
        return self._run(config)


def find_capacity(
    runner: Runner, server: ServerProcess, args: argparse.Namespace
) -> tuple[float, list[dict[str, Any]]]:
    """Best goodput over open-loop rates around the closed-loop throughput (past the peak: stop);
    each run when the machine is quiet, again if other programs got busy meanwhile."""
    pids = [os.getpid(), server.process.pid]
    closed, _, _ = run_when_quiet(
        lambda: runner.closed_loop(server.http_port, 64), pids, wait_s=args.wait_quiet
    )
    saturated = closed.overall.throughput_rps
    rows, best = [], 0.0
    for factor in CAPACITY_FACTORS:
        result, others, attempts = run_when_quiet(
            partial(runner.open_loop, server.http_port, saturated * factor),
            pids, wait_s=args.wait_quiet,
        )  # fmt: skip
        label = f"search {factor:.0%} of closed-loop {saturated:,.0f}/s"
        rows.append(row("fp32 only", label, result, None, others, attempts))
        best = max(best, result.overall.goodput_rps)
        if result.overall.goodput_rps < 0.8 * best:
            break
    return best, rows


def variant_counts(server: ServerProcess) -> Counter[str]:
    """`succeeded` of each variant of the model, summed over its served versions."""
    stats = http_json(server.host, server.http_port, "GET", f"/v2/models/{MODEL}/stats")
    counts: Counter[str] = Counter()
    for entry in stats["model_stats"]:
        for variant in entry.get("duetime", {}).get("variants", []):
            counts[variant["variant"]] += variant["succeeded"]
    return counts


def row(
    server: str, load: str, result: BenchResult, shares: dict[str, float] | None,
    others_cpu: float, attempts: int,
) -> dict[str, Any]:  # fmt: skip
    o = result.overall
    answered = o.ok + o.late
    return {
        "server": server,
        "load": load,
        "offered/s": result.generator.offered_rps,
        "goodput/s": o.goodput_rps,
        "on_time_%_of_answers": 100.0 * o.ok / answered if answered else None,
        "on_time_%_of_sent": 100.0 * o.ok / o.sent if o.sent else None,
        "p50_ms": o.latency.p50_ms,
        "p99_ms": o.latency.p99_ms,
        "rejected": o.rejected,
        "expired": o.expired,
        "late": o.late,
        "errors": o.errors,
        "unanswered": o.unanswered,
        "answered_by_%": ", ".join(f"{k} {v:.1f}" for k, v in shares.items()) if shares else None,
        "gen_late_sends_%": 100.0 * (result.generator.late_send_fraction or 0.0),
        "gen_cpu_cores": result.generator.cpu_cores,
        "others_cpu": others_cpu,
        "attempts": attempts,
    }


def counted(server: ServerProcess, runner: Runner, rate: float) -> tuple[BenchResult, Counter[str]]:
    """An open-loop run, and how many answers each variant gave meanwhile."""
    before = variant_counts(server)
    result = runner.open_loop(server.http_port, rate)
    return result, variant_counts(server) - before


def run_loads(
    label: str, server: ServerProcess, runner: Runner, capacity: float, loads: list[float],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:  # fmt: skip
    """One open-loop run per load, each when the machine (and the server) is quiet, again if
    other programs got busy meanwhile."""
    rows = []
    pids = [os.getpid(), server.process.pid]
    for load in loads:
        rate = capacity * load / 100
        (result, delta), others, attempts = run_when_quiet(
            partial(counted, server, runner, rate), pids, wait_s=args.wait_quiet,
        )  # fmt: skip
        total = sum(delta.values())
        shares = {k: 100.0 * v / total for k, v in sorted(delta.items())} if total else None
        rows.append(row(label, f"{load:g}%", result, shares, others, attempts))
        rows[-1]["succeeded_by_variant"] = dict(delta)
        rows[-1]["error_messages"] = list(result.error_messages)
        print(f"  {label} {load:g}%: goodput {result.overall.goodput_rps:,.0f}/s, "
              f"answered by {rows[-1]['answered_by_%']}", flush=True)  # fmt: skip
    return rows


def server_args(plan: ModelPlan) -> list[str]:
    # NOTE: no metrics endpoint: its default port is shared by every server on the machine
    # (a second one serves without it), and its address line would come before the ready line.
    return ["--cpus", plan.server_cpus, "--no-metrics"]


def add_int8_variant(model_dir: Path) -> tuple[str, int]:
    """`duetime optimize MODEL_DIR --kinds int8-static`; how it was run and its exit status."""
    flags = [str(model_dir), "--kinds", "int8-static"]
    command = [sys.executable, "-m", "duetime", "optimize", *flags]
    done = subprocess.run(command, capture_output=True, text=True)
    if "invalid choice" not in done.stderr:
        print(done.stdout, end="")
        print(done.stderr, end="", file=sys.stderr)
        return " ".join(["duetime optimize", *flags]), done.returncode
    # NOTE: the CLI does not have the command yet; the same code, through its own flags.
    parser = argparse.ArgumentParser(prog="duetime optimize")
    optimize.add_arguments(parser)
    status = optimize.run(parser.parse_args(flags))
    return " ".join(["duetime.tools.optimize.run (in process)", *flags]), status


def verdicts(rows: list[dict[str, Any]], loads: list[float]) -> dict[str, Any]:
    """Goodput with the variant over fp32 only at each load (medians over repeats)."""

    def goodput(server: str, load: float) -> float | None:
        found = [r["goodput/s"] for r in rows if (r["server"], r["load"]) == (server, f"{load:g}%")]
        return float(np.median(found)) if found else None

    out: dict[str, Any] = {}
    for load in loads:
        plain, cascade = goodput("fp32 only", load), goodput("with int8", load)
        out[f"goodput_ratio_at_{load:g}%"] = (cascade or 0.0) / max(plain or 0.0, 1e-9)
    top = max(loads)
    out["headline_goodput_ratio"] = out[f"goodput_ratio_at_{top:g}%"]
    out["headline_target_met"] = top < 300 or out["headline_goodput_ratio"] >= 2.0
    ceiling = goodput("int8 only", top)
    if ceiling is not None:
        out[f"int8_only_over_fp32_at_{top:g}%"] = ceiling / max(
            goodput("fp32 only", top) or 0, 1e-9
        )
        out[f"with_int8_over_int8_only_at_{top:g}%"] = (goodput("with int8", top) or 0) / max(
            ceiling, 1e-9
        )
    return out


def build_repositories(root: Path) -> tuple[dict[str, Path], dict[str, Any]]:
    """One repository per arm (see ARMS) holding only resnet; what optimize did."""
    demo = write_demo_repository(root / "demo")
    repos = {label: root / label.replace(" ", "-") for label in ARMS}
    for repo in repos.values():
        shutil.copytree(demo / MODEL, repo / MODEL)
    variants = repos["with int8"] / MODEL
    command, status = add_int8_variant(variants)
    if status != 0:
        print(f"optimize failed (exit {status}); the variant runs are meaningless")
    shutil.copyfile(variants / "1" / INT8_FILE, repos["int8 only"] / MODEL / "1" / "model.onnx")
    info = {"command": command, "exit_status": status,
            "config": (variants / "config.toml").read_text()}  # fmt: skip
    return repos, info


def measure_arms(repos: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    """Capacity on the fp32-only server, then every load on each arm in turn (the ceiling at
    the top load only). The servers run side by side (idle ones cost next to nothing), so the
    arms of one load run minutes apart at most: the machine's drift hits them alike."""
    plan = plans()[MODEL]
    runner = DeadlineRunner(plan, args.capacity_duration, args.connections, args)
    labels = list(ARMS if args.int8_only else ARMS[:2])
    logs = {label: repos[label].with_suffix(".log") for label in labels}
    search: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        servers = {
            label: stack.enter_context(
                logged_server_process(repos[label], logs[label], *server_args(plan))
            )
            for label in labels
        }
        capacity = args.capacity
        if capacity is None:
            capacity, search = find_capacity(runner, servers["fp32 only"], args)
            print(f"fp32-only capacity: {capacity:,.0f} answers/s on time", flush=True)
        for server in servers.values():  # the same warm-up for each: a first run can be slow
            runner.closed_loop(server.http_port, 64)
        runner.duration = args.duration
        for _ in range(args.repeat):
            for load in args.loads:
                for label, server in servers.items():
                    if label != "int8 only" or load == max(args.loads):
                        rows += run_loads(label, server, runner, capacity, [load], args)
    return {"capacity_rps": capacity, "search": search, "runs": rows,
            "verdicts": verdicts(rows, args.loads),
            "server_logs": {label: log_summary(path) for label, path in logs.items()}}  # fmt: skip


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    deadlines = "/".join(f"{t:g}" for t in args.timeouts_ms)
    search, rows = results["search"], results["runs"]
    if search:
        print_table(f"{MODEL}: capacity search (fp32 only), due in {deadlines} ms", search,
                    [c for c in search[0] if c not in ("answered_by_%", "others_cpu")])  # fmt: skip
    print_table(
        f"{MODEL}: due in {deadlines} ms, fp32-only capacity {results['capacity_rps']:,.0f}/s, "
        f"{args.duration:g} s per run",
        rows, [c for c in rows[0] if c not in ("succeeded_by_variant", "error_messages")],
    )  # fmt: skip
    print(json.dumps(results["verdicts"], indent=2))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--timeouts-ms", type=_floats, default=[20.0], help="due times, comma list")
    parser.add_argument("--mix", type=_floats, help="share of each due time (default: equal)")
    parser.add_argument("--loads", type=_floats, default=[100.0, 150.0, 200.0, 300.0],
                        help="%% of the fp32 capacity, comma list")  # fmt: skip
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per run")
    parser.add_argument(
        "--capacity", type=float, help="fp32-only capacity in answers/s (default: search for it)"
    )
    parser.add_argument(
        "--capacity-duration", type=float, default=2.0, help="seconds per capacity-search run"
    )
    parser.add_argument("--connections", type=int, default=512, help="generator connections")
    parser.add_argument(
        "--wait-quiet", type=float, default=30.0,
        help="before each run, wait up to this many seconds for other programs to go idle",
    )  # fmt: skip
    parser.add_argument(
        "--no-int8-only", dest="int8_only", action="store_false",
        help="skip the third server, whose only model is the int8 file",
    )  # fmt: skip
    parser.add_argument(
        "--repeat", type=int, default=1, help="run the loads this many times (verdicts: medians)"
    )
    parser.add_argument("--quick", action="store_true", help="3 s runs (about a minute)")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "cascade.json"
    )
    args = parser.parse_args()
    if args.quick:
        args.duration, args.capacity_duration = 3.0, 1.0
    if args.mix is None and len(args.timeouts_ms) > 1:
        args.mix = [1 / len(args.timeouts_ms)] * len(args.timeouts_ms)
    return args


def main() -> int:
    args = parse_args()
    results: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "cpus": sorted(ALL_CPUS)},
        "command": " ".join(sys.argv),
        "timeouts_ms": args.timeouts_ms,
        "mix": args.mix,
    }
    with tempfile.TemporaryDirectory() as tmp:
        repos, results["optimize"] = build_repositories(Path(tmp))
        results.update(measure_arms(repos, args))
    report(results, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str))
    print(f"\nwrote {args.out}")
    return 0


def _floats(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of numbers, got {text!r}"
        ) from None


if __name__ == "__main__":
    raise SystemExit(main())
