"""Hot reload under steady load: does swapping in new model versions cost errors or tail latency?

    python3 bench/reload.py [--models mlp,resnet] [--duration 30] [--swap-every 5] [--rate R]
                            [--load 50] [--timeout-ms 100] [--quick]
                            [--out bench/results/reload.json]

For each model one server runs in poll mode (rescan every 1 s, files unchanged for 0.5 s before
a load) with the default `latest` version policy. An open-loop generator sends a steady load over
HTTP binary, each request due in --timeout-ms: --load % (50) of the model's capacity as
bench/scheduling.py finds it (the best goodput of a rate search with the model's tight deadline
mix), or --rate. Twice, on the same server:
(a) baseline: nothing changes on disk;
(b) swaps: every --swap-every s, model.onnx is copied into a new version folder REPO/MODEL/<N>/
    (written in place, so the settle rule has to wait out the copy); the server loads it in the
    background, publishes it, then drains and unloads the version it replaces.
A watcher thread polls `POST /v2/repository/index` every 0.25 s: when each copied version turned
READY (a swap counts once it did) and when the one it replaced was unloaded. A probe thread sends
one JSON request every 50 ms on its own connection: latency inside and outside swap windows,
stalls over 50 ms, and the version that answered. The CPU other programs used is sampled too
(the machine is shared): each stall lists it, so a server stall can be told from a neighbour's.
Verdicts: errors in (b) (target 0) and P99(b) / P99(a) (target <= 2).
The generator runs in this process, pinned as bench/scheduling.py pins it for the model; the
server's log goes to a file, summarised in the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import (
    KeepAliveClient,
    ServerProcess,
    cpu_sample,
    http_json,
    infer_request_bytes,
    log_summary,
    logged_server_process,
    pinned,
    print_table,
    wait_for_quiet,
)
from overhead import ALL_CPUS
from scheduling import ModelPlan, Runner, find_capacity, plans

from duetime.demo import write_demo_repository
from duetime.execution.affinity import pin_current_thread
from duetime.loops import new_event_loop
from duetime.tools.config import BenchConfig
from duetime.tools.loadgen import collect_records
from duetime.tools.report import BenchResult, result_of

POLL_ARGS = ("--model-control-mode", "poll", "--repository-poll-secs", "1",
             "--repository-stable-secs", "0.5")  # fmt: skip
WATCH_S = 0.25
"""How often the watcher reads the repository index."""
SETTLE_S = 15.0
"""After the load ends, how long to wait for the last swap to finish (READY, old unloaded)."""
WARMUP_S = 1.0
PROBE_S = 0.05
"""Interval of the probe's requests."""
STALL_MS = 50.0
"""A probe answer slower than this is listed as a stall."""


@dataclass
class Swap:
    """One version copied in: seconds after the load's start at which it was copied, turned
    READY, and at which the version it replaced was no longer listed as serving."""

    version: int
    copied_s: float
    ready_s: float | None = None
    previous_unloaded_s: float | None = None
    states: list[str] = field(default_factory=list)
    """Each distinct (state: reason) the index showed for this version, in order."""


class Swapper(threading.Thread):
    """Copies a new version in every `every_s` inside the measured window, watches the index
    and samples the CPU other programs use.

    Waits for `started` (set when the generator's schedule starts) so swaps line up with the
    measured window: the first at warm-up + `every_s`, the last before the window ends.
    """

    def __init__(
        self,
        server: ServerProcess,
        model_dir: Path,
        every_s: float | None,
        window_s: tuple[float, float],
        cpus: frozenset[int],
    ) -> None:
        super().__init__(name="swapper", daemon=True)
        self.server = server
        self.model_dir = model_dir
        self.every_s = every_s
        self.window_s = window_s
        self.cpus = cpus
        self.started = threading.Event()
        self.stop = threading.Event()
        self.swaps: list[Swap] = []
        self.index_errors: list[str] = []
        self.t0 = 0.0
        self.pids = [os.getpid(), server.process.pid]
        self.other_cpu: list[tuple[float, float]] = []
        """(seconds, cores other programs used since the previous entry)."""

    def begin(self) -> None:
        """The generator's schedule starts now: the clock of swaps and probes starts."""
        self.t0 = time.monotonic()
        self.started.set()

    def run(self) -> None:
        pin_current_thread(self.cpus)  # with the generator, off the server's cores
        self.started.wait()
        next_swap = self.window_s[0] + (self.every_s or float("inf"))
        cpu = cpu_sample(self.pids)
        while not self.stop.is_set():
            now = self.elapsed()
            cpu, earlier = cpu_sample(self.pids), cpu
            self.other_cpu.append((round(now, 2), round(cpu.other_cores(earlier), 3)))
            if next_swap <= now and now < self.window_s[1]:
                self.copy_version(round(now, 2))
                next_swap += self.every_s or float("inf")
            self.watch()
            self.stop.wait(WATCH_S)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def copy_version(self, now: float) -> None:
        versions = [int(p.name) for p in self.model_dir.iterdir() if p.name.isdigit()]
        number = max(versions) + 1
        folder = self.model_dir / str(number)
        folder.mkdir()
        shutil.copyfile(self.model_dir / str(min(versions)) / "model.onnx", folder / "model.onnx")
        self.swaps.append(Swap(number, now))

    def watch(self) -> None:
        try:
            index = http_json(self.server.host, self.server.http_port, "POST",
                              "/v2/repository/index", {}, timeout_s=5)  # fmt: skip
        except (OSError, RuntimeError) as exc:
            self.index_errors.append(f"{self.elapsed():.2f} s: {exc}")
            return
        now = round(self.elapsed(), 2)
        mine = {
            int(e["version"]): e
            for e in index
            if e.get("name") == self.model_dir.name and "version" in e
        }
        for swap in self.swaps:
            entry = mine.get(swap.version)
            if entry is None:
                continue
            state = f"{entry.get('state')}: {entry.get('reason', '')}".rstrip(": ")
            if not swap.states or swap.states[-1] != state:
                swap.states.append(state)
            if swap.ready_s is None and entry.get("state") == "READY":
                swap.ready_s = now
            previous = mine.get(swap.version - 1)
            if (
                swap.ready_s is not None
                and swap.previous_unloaded_s is None
                and (previous is None or previous.get("state") == "UNAVAILABLE")
            ):
                swap.previous_unloaded_s = now

    def settled(self) -> bool:
        return all(s.previous_unloaded_s is not None for s in self.swaps)


class Probe(threading.Thread):
    """One JSON request every PROBE_S on a connection of its own, sent once `swapper` starts:
    latency and the version that answered, over time (seconds on the swapper's clock)."""

    def __init__(self, server: ServerProcess, model: str, swapper: Swapper) -> None:
        super().__init__(name="probe", daemon=True)
        self.server = server
        self.swapper = swapper
        meta = http_json(server.host, server.http_port, "GET", f"/v2/models/{model}")
        spec = meta["inputs"][0]
        shape = [d if d > 0 else 1 for d in spec["shape"]]
        array = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        self.request = infer_request_bytes(
            server.host, server.http_port, model, spec["name"], array, binary=False
        )
        self.samples: list[tuple[float, float, int, str | None]] = []
        """(sent at s, latency ms, HTTP status or 0 for a broken connection, version)."""

    def run(self) -> None:
        pin_current_thread(self.swapper.cpus)
        self.swapper.started.wait()
        client = KeepAliveClient(self.server.host, self.server.http_port)
        while not self.swapper.stop.is_set():
            at = self.swapper.elapsed()
            started = time.perf_counter()
            try:
                status, body = client.roundtrip(self.request)
            except OSError:
                status, body = 0, b""
                client.close()
                client = KeepAliveClient(self.server.host, self.server.http_port)
            latency_ms = (time.perf_counter() - started) * 1e3
            version = json.loads(body).get("model_version") if status == 200 else None
            self.samples.append((round(at, 3), round(latency_ms, 3), status, version))
            self.swapper.stop.wait(max(0.0, PROBE_S - latency_ms / 1e3))
        client.close()

    def summary(self, swaps: list[Swap]) -> dict[str, Any]:
        """Probe latency inside swap windows (copy until READY + 1 s) and outside them, and
        when each version first answered."""
        windows = [(s.copied_s, (s.ready_s or s.copied_s + 5) + 1) for s in swaps]
        inside: list[float] = []
        outside: list[float] = []
        first_seen: dict[str, float] = {}
        for at, latency_ms, status, version in self.samples:
            if status != 200:
                continue
            during = any(start <= at <= end for start, end in windows)
            (inside if during else outside).append(latency_ms)
            if version is not None:
                first_seen.setdefault(version, at)
        return {
            "requests": len(self.samples),
            "failed": sum(status != 200 for _, _, status, _ in self.samples),
            "in_swap_windows": _latency(inside),
            "outside_swap_windows": _latency(outside),
            "version_first_answered_s": first_seen,
        }


def _latency(samples_ms: list[float]) -> dict[str, float | int | None]:
    if not samples_ms:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    data = np.asarray(samples_ms)
    return {"n": int(data.size), "p50_ms": round(float(np.percentile(data, 50)), 3),
            "p99_ms": round(float(np.percentile(data, 99)), 3),
            "max_ms": round(float(data.max()), 3)}  # fmt: skip


def run_with_swapper(config: BenchConfig, swapper: Swapper, cpus: frozenset[int]) -> BenchResult:
    """`run_bench`, starting the swapper's clock when the generator's schedule starts."""

    async def start() -> None:
        swapper.begin()

    async def bench() -> BenchResult:
        return result_of(config, await collect_records(config, before_start=start))

    with pinned(cpus), asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(bench())


def steady_config(model: str, port: int, rate: float, args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(
        model=model, protocol="http-binary", address=f"127.0.0.1:{port}", mode="open",
        rate=rate, duration_s=args.duration, warmup_s=WARMUP_S, timeouts_ms=(args.timeout_ms,),
        connections=args.connections, seed=7,
    )  # fmt: skip


def row(label: str, result: BenchResult, swapper: Swapper) -> dict[str, Any]:
    o, latency = result.overall, result.overall.latency
    swaps = swapper.swaps if swapper.every_s else None
    others = [cores for at, cores in swapper.other_cpu if at <= swapper.window_s[1]]
    return {
        "run": label,
        "offered/s": result.generator.offered_rps,
        "sent": o.sent,
        "ok": o.ok,
        "late": o.late,
        "rejected": o.rejected,
        "expired": o.expired,
        "errors": o.errors,
        "p50_ms": latency.p50_ms,
        "p99_ms": latency.p99_ms,
        "p99.9_ms": latency.p999_ms,
        "max_ms": latency.max_ms,
        "swaps_copied": None if swaps is None else len(swaps),
        "swaps_ready": None if swaps is None else sum(s.ready_s is not None for s in swaps),
        "gen_late_sends_%": 100.0 * (result.generator.late_send_fraction or 0.0),
        "others_cpu_mean": float(np.mean(others)) if others else None,
        "others_cpu_max": max(others, default=None),
    }


def load_profiles(server: ServerProcess, model: str) -> dict[str, dict[str, dict[int, float]]]:
    """Each served version's latency profile, batch -> µs: the median measured when it loaded
    (a version loaded while another serves is profiled on a busy machine) and the current
    estimate, corrected by real executions since."""
    stats = http_json(server.host, server.http_port, "GET", f"/v2/models/{model}/stats")
    out = {}
    for entry in stats["model_stats"]:
        points = entry["duetime"]["variants"][0]["latency_profile"]
        out[entry["version"]] = {
            key: {p["batch_size"]: round(p[f"{key}_us"], 1) for p in points}
            for key in ("measured_median", "estimate")
        }
    return out


def stalls(probe: Probe, swapper: Swapper, over_ms: float) -> list[dict[str, Any]]:
    """Probe requests slower than `over_ms`, each with the nearest swap and the CPU that other
    programs used around it (to tell the server's stalls from the machine's)."""
    found = []
    for at, latency_ms, status, version in probe.samples:
        if latency_ms < over_ms and status == 200:
            continue
        near = [
            cores for t, cores in swapper.other_cpu if at - 0.5 <= t <= at + latency_ms / 1e3 + 0.5
        ]
        swap = min(swapper.swaps, key=lambda s: abs(s.copied_s - at), default=None)
        found.append({
            "at_s": at, "latency_ms": latency_ms, "status": status, "version": version,
            "others_cpu_max_around": max(near, default=None),
            "nearest_swap": None if swap is None else
            f"v{swap.version}: copied {swap.copied_s} s, ready {swap.ready_s} s",
        })  # fmt: skip
    return found


def measure(
    name: str, plan: ModelPlan, server: ServerProcess, model_dir: Path, rate: float,
    args: argparse.Namespace,
) -> tuple[list[dict[str, Any]], list[Swap], dict[str, Any]]:  # fmt: skip
    """Runs (a) and (b) on one server; the rows, the swaps of (b), and each run's details."""
    rows, details = [], {}
    window = (WARMUP_S, WARMUP_S + args.duration)
    runs = [("a: no swaps", None), (f"b: swap every {args.swap_every:g} s", args.swap_every)]
    for label, every in runs:
        swapper = Swapper(server, model_dir, every, window, plan.generator_cpus)
        quiet = wait_for_quiet([os.getpid()], args.wait_quiet)  # the server idle too
        probe = Probe(server, model_dir.name, swapper)
        swapper.start()
        probe.start()
        config = steady_config(name, server.http_port, rate, args)
        result = run_with_swapper(config, swapper, plan.generator_cpus)
        waited = time.monotonic()
        while not swapper.settled() and time.monotonic() - waited < SETTLE_S:
            time.sleep(WATCH_S)
        swapper.stop.set()
        swapper.join()
        probe.join()
        rows.append(row(label, result, swapper))
        details[label] = {
            "load_profiles_median_us": load_profiles(server, model_dir.name),
            "others_cpu_before": quiet,
            "errors": list(result.error_messages),
            "warnings": list(result.warnings),
            "index_errors": swapper.index_errors,
            "probe": probe.summary(swapper.swaps),
            "stalls": stalls(probe, swapper, STALL_MS),
            "probe_samples": probe.samples,
            "others_cpu": swapper.other_cpu,
        }
        print(result.format(), flush=True)
    return rows, swapper.swaps, details


def bench_model(name: str, demo: Path, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    plan = plans()[name]
    repo = root / f"reload-{name}"
    shutil.copytree(demo / name, repo / name)
    log = root / f"server-{name}.log"
    # NOTE: no metrics endpoint: its default port is shared by every server on the machine (a
    # second one serves without it), and its address line would come before the ready line.
    extra = ("--cpus", plan.server_cpus, "--no-metrics", *POLL_ARGS)
    with logged_server_process(repo, log, *extra) as server:
        capacity, rate = None, args.rate
        search: list[dict[str, Any]] = []
        if rate is None:
            # scheduling.py's capacity: the best goodput with the model's tight deadline mix
            runner = Runner(plan, args.capacity_duration, connections=512)
            capacity, search = find_capacity(runner, server.http_port)
            rate = capacity * args.load / 100
        print(f"\n{name}: steady load {rate:,.0f} req/s"
              + (f" ({args.load:g}% of capacity {capacity:,.0f}/s)" if capacity else ""),
              flush=True)  # fmt: skip
        rows, swaps, details = measure(name, plan, server, repo / name, rate, args)
        final_index = http_json(server.host, server.http_port, "POST", "/v2/repository/index", {})
    base, swapped = rows
    ratio = (swapped["p99_ms"] or 0) / max(base["p99_ms"] or 0, 1e-9)
    ready = [s for s in swaps if s.ready_s is not None]
    return {
        "model": name, "rate_rps": rate, "capacity_rps": capacity, "capacity_search": search,
        "timeout_ms": args.timeout_ms, "duration_s": args.duration, "swap_every_s": args.swap_every,
        "runs": rows,
        "swaps": [asdict(s) for s in swaps],
        "final_index": [e for e in final_index if e.get("name") == name],
        "server_log": log_summary(log),
        "details": details,
        "verdicts": {
            "errors_during_swaps": swapped["errors"],
            "not_ok_during_swaps": swapped["sent"] - swapped["ok"],
            "p99_ratio_b_over_a": ratio,
            "p99_ratio_target_met": ratio <= 2.0,
            "swaps_done": len(ready),
            "probe_b": details[swapped["run"]]["probe"],
            "probe_stalls_a_b": [len(d["stalls"]) for d in details.values()],
            "load_profile_median_us_after_a_b": [
                d["load_profiles_median_us"] for d in details.values()
            ],
            "copy_to_ready_s": [_span(s.copied_s, s.ready_s) for s in ready],
            "ready_to_previous_unloaded_s": [
                _span(s.ready_s, s.previous_unloaded_s) for s in ready
            ],
        },
    }  # fmt: skip


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(end - start, 2)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="mlp", help="comma list of demo models (mlp,resnet)")
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds per run")
    parser.add_argument("--swap-every", type=float, default=5.0, help="seconds between swaps")
    parser.add_argument("--rate", type=float, help="requests/s (default: --load of capacity)")
    parser.add_argument(
        "--load", type=float, default=50.0,
        help="%% of capacity (default 50): the best goodput of a rate search as in scheduling.py",
    )  # fmt: skip
    parser.add_argument(
        "--capacity-duration", type=float, default=2.0, help="seconds per capacity-search run"
    )
    parser.add_argument("--timeout-ms", type=float, default=100.0, help="every request's due time")
    parser.add_argument("--connections", type=int, default=64, help="generator HTTP connections")
    parser.add_argument(
        "--wait-quiet", type=float, default=60.0,
        help="before each run, wait up to this many seconds for other programs to go idle",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true", help="12 s runs, a swap every 3 s (about a minute)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "reload.json"
    )
    args = parser.parse_args()
    if args.quick:
        args.duration, args.swap_every, args.capacity_duration = 12.0, 3.0, 1.0
    results: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "cpus": sorted(ALL_CPUS)},
        "command": " ".join(sys.argv),
    }
    with tempfile.TemporaryDirectory() as tmp:
        demo = write_demo_repository(Path(tmp) / "demo")
        for name in args.models.split(","):
            r = results[name] = bench_model(name, demo, Path(tmp), args)
            print_table(
                f"{name}: {r['rate_rps']:,.0f} req/s open loop, due in {args.timeout_ms:g} ms, "
                f"{args.duration:g} s per run",
                r["runs"], list(r["runs"][0]),
            )  # fmt: skip
            print_table(
                "swaps (seconds after the load started)",
                [{**s, "states": " -> ".join(s["states"])} for s in r["swaps"]],
                ["version", "copied_s", "ready_s", "previous_unloaded_s", "states"],
            )
            for label, detail in r["details"].items():
                if detail["stalls"]:
                    print_table(
                        f"{label}: probe answers over {STALL_MS:g} ms (or failed)",
                        detail["stalls"], list(detail["stalls"][0]),
                    )  # fmt: skip
            print(json.dumps(r["verdicts"], indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
