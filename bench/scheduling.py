"""EDF vs FIFO under load, built on `duetime bench`: does duetime keep answering on time above
capacity, and what does batching and runtime tuning cost or buy?

    python3 bench/scheduling.py [--models resnet,mlp] [--duration 5] [--pairs 5]
                                [--protocol http-binary|grpc]
                                [--out bench/results/scheduling.json]

For each model the same server build runs three ways (one config file apart): EDF (default),
FIFO (`scheduling.policy = "fifo"`, a Triton-style batcher), and unbatched (`max_batch_size = 0`).
1. capacity: open-loop runs at rising rates on EDF; capacity = the highest goodput found;
2. EDF and FIFO at 50/100/150/200% of capacity (both servers up, each load run on one then
   the other), deadlines mixed 10/50 ms (resnet) or 2/10 ms
   (mlp), half each: goodput, share of answers on time, P50/P99, rejections, misses; then
   `--pairs` - 1 more EDF runs at 100% and 200% back to back: the goodput verdict is the median
   of the pairs' ratios, the on-time one pools every 200% run.
   Over HTTP, the echo floor follows: the 200% load on bench/echo_server.py answering as the
   EDF server does, at once (no work, no refusals): the share on time this machine's loopback,
   wake-ups and generator allow (`echo_floor`; verdict `echo_floor_on_time_at_200_%`);
3. unbatched at 50%: the P50 that batching must not worsen by more than 1 ms;
4. resnet: saturated throughput (closed loop, 64 clients) vs the bare-ORT limit (best
   in-process batched rows/s with one intra-op thread, the instance's thread count, on the
   instance's core: the best batch size picked by short runs, then measured for half the run's
   duration just before and just after it, and averaged, so a drift of the VM's speed during
   the run cancels instead of landing on one side of the ratio);
5. mlp: Engine.infer_async P50 added over calling ORT directly;
6. runtime tuning: EDF at 100% with the server's tuning (`--cpus` as planned, GC frozen and
   its thresholds raised, the GIL switch interval and the loop's time slice shortened) vs
   without it (`--cpus none --no-tune-runtime`, the whole process confined to the same CPUs:
   the OS places its threads), both servers up, `TUNING_ROUNDS` runs each in alternation: the
   median P99 of each.
Every run goes over `--protocol`: HTTP binary (the default: 512 connections) or gRPC (4
channels, as tritonclient's few).
The generator runs in this process, pinned to the core the model's instance does not use (on
a machine of three or more cores, to one the server does not use: see `plans`).
`late` counts answers late by the generator's clock; `srv_late` those the server counted late
by its own, and `srv_late_by` why (`duetime_late_answers_total`: start, its batch started later
than planned; run, the run overran the latency profile; delivery, the result reached the event
loop late; plan, none of these).
`srv_cpu_us_per_req` is the server's CPU per request offered; from each EDF pair at 100% and
200% the verdicts solve what an answer and a refusal cost it, and the 200%/100% goodput ratio
those costs allow a server whose CPU is full (`edf_cost_model`, the pairs' medians; see
`cost_model`).
A run answering over 110% of the capacity on time says the search missed the peak: its
goodput becomes the capacity and step 2 is run again at the new one (`CAPACITY_ROUNDS` in
all; the runs replaced are kept under `superseded`). Should the last round's runs still find
one, the verdicts' `capacity_underestimated` is true, and a warning says to rerun.
A run during which the hypervisor took over 0.2 cores from the VM (`steal_cores`) is the
machine's, not the server's: a warning says to rerun.
Each run starts once other programs (and the server) are idle (`--wait-quiet`), and is run
again once if they used over 0.3 cores meanwhile; each row shows the cores they used
(`others_cores`) and the attempts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).parent))
from common import ServerProcess, cpu_sample, print_table, run_when_quiet, server_process
from overhead import ALL_CPUS, bench_engine_async, echo_server, ort_call

from duetime.demo import write_demo_repository
from duetime.execution.affinity import parse_cpus, pin_current_thread
from duetime.execution.ort import session_options
from duetime.scheduling.profile import batch_buckets
from duetime.tools.argtypes import real, whole
from duetime.tools.config import BenchConfig
from duetime.tools.loadgen import run_bench
from duetime.tools.payloads import WireProtocol
from duetime.tools.report import BenchResult
from duetime.tools.server_metrics import counted_between, scrape

TUNING_ROUNDS = 2
"""Runs at 100% with runtime tuning on, and as many with it off, alternated (see
`bench_model`)."""


@dataclass(frozen=True)
class ModelPlan:
    """How one model is benchmarked: its input, deadline mix and CPU placement."""

    name: str
    timeouts_ms: tuple[float, float]
    server_cpus: str
    """The server's --cpus: mlp shares the loop's core, resnet's instance gets the other."""
    generator_cpus: frozenset[int]
    max_batch_size: int
    instance_cpus: frozenset[int]
    """Where the server runs the model's instance thread (the bare-ORT limit runs there)."""


def plans() -> dict[str, ModelPlan]:
    """Two cores or one: the generator shares the loop's core with resnet (its instance has the
    other). With three or more, resnet's server gets two and the generator a third of its own,
    as a client on another machine would be (mlp's server has one core either way)."""
    cpus = sorted(ALL_CPUS)
    first, last = cpus[0], cpus[-1]
    if len(cpus) >= 3:  # (server, generator, instance)
        server, generator, instance = f"{first},{cpus[1]}", cpus[2], cpus[1]
    else:
        server, generator, instance = ",".join(map(str, cpus)), first, last
    return {
        "resnet": ModelPlan(
            "resnet", (10.0, 50.0), server, frozenset({generator}), 32, frozenset({instance})
        ),
        "mlp": ModelPlan(
            "mlp",
            (2.0, 10.0),
            str(first),
            frozenset({last}) if last != first else frozenset({first}),
            64,
            frozenset({first}),
        ),
    }


def variant_repository(demo: Path, root: Path, model: str, label: str, config: str) -> Path:
    """A repository holding only `model`, with `config` as its config.toml."""
    repo = root / label / model
    shutil.copytree(demo / model / "1", repo / model / "1")
    (repo / model / "config.toml").write_text(config)
    return repo


def configs(plan: ModelPlan) -> dict[str, str]:
    batch = f"max_batch_size = {plan.max_batch_size}\n"
    return {
        "edf": batch + '[scheduling]\npolicy = "edf"\n',
        "fifo": batch + '[scheduling]\npolicy = "fifo"\n',
        "unbatched": 'max_batch_size = 0\n[scheduling]\npolicy = "edf"\n',
    }


class Runner:
    """Runs `duetime bench` against servers, pinned as the model's plan says."""

    def __init__(
        self,
        plan: ModelPlan,
        duration: float,
        connections: int,
        wait_quiet_s: float = 30.0,
        protocol: WireProtocol = "http-binary",
    ) -> None:
        self.plan = plan
        self.duration = duration
        self.connections = connections
        self.protocol = protocol
        self.wait_quiet_s = wait_quiet_s
        self.pids: list[int] = []
        """This process and the server's: their CPU is not other programs'."""
        self.others = 0.0
        """Cores other programs used during the last run (see `run_when_quiet`)."""
        self.attempts = 0
        self.steal = 0.0
        """Cores' worth of CPU the hypervisor took from this VM during the last run (steal): a
        run with some is the machine's, not the server's."""
        self.metrics_url: str | None = None
        self.server_cpu_s = 0.0
        """CPU seconds the driven server used during the last run (warm-up and drain too)."""
        self.server_late: dict[str, int] = {}
        """The answers the server counted late during the last run, by cause (its
        `duetime_late_answers_total`: start, run, delivery, plan)."""

    def serving(self, server: ServerProcess, *idle: ServerProcess) -> None:
        """The runs that follow drive `server` (`idle`: servers of this benchmark left idle
        meanwhile, whose CPU is not other programs')."""
        self.pids = [os.getpid(), server.process.pid, *(other.process.pid for other in idle)]
        self.metrics_url = server.metrics_url

    def serving_echo(self, pid: int, *idle: ServerProcess) -> None:
        """As `serving`, for the echo server of process `pid` (no metrics)."""
        self.pids = [os.getpid(), pid, *(other.process.pid for other in idle)]
        self.metrics_url = None

    def port(self, server: ServerProcess) -> int:
        """`server`'s port for this runner's protocol."""
        return server.grpc_port if self.protocol == "grpc" else server.http_port

    def open_loop(self, port: int, rate: float, *, deadlines: bool = True) -> BenchResult:
        plan = self.plan
        config = BenchConfig(
            model=plan.name, protocol=self.protocol, address=f"127.0.0.1:{port}", mode="open",
            rate=rate, duration_s=self.duration, warmup_s=1.0,
            timeouts_ms=plan.timeouts_ms if deadlines else (), mix=(0.5, 0.5) if deadlines else (),
            connections=self.connections, seed=int(rate),
        )  # fmt: skip
        return self._run(config)

    def closed_loop(self, port: int, clients: int) -> BenchResult:
        config = BenchConfig(
            model=self.plan.name, protocol=self.protocol, address=f"127.0.0.1:{port}",
            mode="closed", concurrency=clients, duration_s=self.duration, warmup_s=1.0,
            connections=self.connections,
        )  # fmt: skip
        return self._run(config)

    def _run(self, config: BenchConfig) -> BenchResult:
        """One run once other programs are idle, again if they got busy meanwhile.

        NOTE: the machine is shared, and resnet's answers late at 200% came when other
        programs took its cores (the 2-core VM, one build, 6 s runs: 99.94-99.98% on time in
        3 runs where they used under 0.1 cores, 99.77-99.92% in 4 where they used 0.3-0.5;
        the late batches ran 3-10x their prediction on the instance's core, or their results
        waited 2-80 ms for the loop, past any margin learnt from the second before)."""

        def run() -> BenchResult:
            pin_current_thread(self.plan.generator_cpus)
            server = self.pids[1:2]  # (the driven server's pid, where known)
            before = cpu_sample(server)
            counted = scrape(self.metrics_url) if self.metrics_url else None
            try:
                return run_bench(config)
            finally:
                after_cpu = cpu_sample(server)
                self.server_cpu_s = after_cpu.ours_s - before.ours_s
                self.steal = after_cpu.steal_cores(before)
                pin_current_thread(ALL_CPUS)
                after = scrape(self.metrics_url) if self.metrics_url else None
                self.server_late = counted_between(counted, after).late.get(self.plan.name, {})

        if not self.pids:
            self.others, self.attempts = 0.0, 1
            return run()
        result, self.others, self.attempts = run_when_quiet(
            run, self.pids, wait_s=self.wait_quiet_s
        )
        return result


def row(label: str, load: str, result: BenchResult, runner: Runner) -> dict[str, Any]:
    """A table row of `result`, the last run of `runner`."""
    o = result.overall
    answered = o.ok + o.late
    return {
        "policy": label,
        "load": load,
        "offered/s": result.generator.offered_rps,
        "goodput/s": o.goodput_rps,
        "on_time_%": 100.0 * o.ok / answered if answered else None,
        "ok": o.ok,
        "p50_ms": o.latency.p50_ms,
        "p99_ms": o.latency.p99_ms,
        "rejected": o.rejected,
        "expired": o.expired,
        "late": o.late,
        "errors": o.errors,
        "gen_late_sends_%": 100.0 * (result.generator.late_send_fraction or 0.0),
        "gen_late_reads_%": 100.0 * result.generator.late_read_fraction,
        "srv_cpu_us_per_req": _cpu_per_request(result, runner),
        "srv_late": sum(runner.server_late.values()),
        "srv_late_by": " ".join(f"{c}:{n}" for c, n in sorted(runner.server_late.items())),
        "others_cores": runner.others,
        "steal_cores": runner.steal,
        "attempts": runner.attempts,
    }


def _cpu_per_request(result: BenchResult, runner: Runner) -> float | None:
    """The server's CPU per request offered (µs), over the whole run: warm-up at the same rate,
    the measured window, the drain (its few answers)."""
    config = result.config
    sent = result.generator.offered_rps * (config.warmup_s + config.duration_s)
    return 1e6 * runner.server_cpu_s / sent if sent and runner.server_cpu_s else None


def cost_model(r100: dict[str, Any], r200: dict[str, Any]) -> dict[str, float] | None:
    """What an answer and a refusal cost the server (µs of CPU), solved from one run at 100%
    and one at 200% (CPU per request offered = f * answer + (1 - f) * refusal, f the share
    answered), and the goodput ratio at twice capacity those costs allow a server whose CPU is
    full: (1 - 2 r) / (1 - r), r = refusal / answer.

    NOTE: mlp's server has one core, and at 200% it spends it on answers and refusals alike:
    with a refusal costing a third of an answer the ratio cannot pass about 0.5, whatever the
    policy (measured, session 44: answer 113 µs, refusal 37 µs, 17 of them the kernel's read,
    write and poll; a bare uvloop + httptools server answering 429 to everything took 16)."""
    cost = []
    for r in (r100, r200):
        answered = r["ok"] + r["late"]
        sent = answered + r.get("rejected", 0) + r.get("expired", 0)
        per_request = r.get("srv_cpu_us_per_req")
        if not sent or per_request is None:
            return None
        cost.append((answered / sent, per_request))
    (f1, c1), (f2, c2) = cost
    if f1 - f2 < 0.05:  # (too alike to tell the two apart)
        return None
    answer = (c1 * (1 - f2) - c2 * (1 - f1)) / (f1 - f2)
    refusal = (c2 * f1 - c1 * f2) / (f1 - f2)
    if answer <= 0 or refusal < 0:
        return None
    rho = refusal / answer
    return {
        "answer_us": answer, "refusal_us": refusal, "refusal_over_answer": rho,
        "ratio_at_2x_bound": (1 - 2 * rho) / (1 - rho) if rho < 0.5 else 0.0,
    }  # fmt: skip


CAPACITY_ROUNDS = 3
"""Times the loads may be run: again at a higher capacity while a load run finds a goodput
over `UNDERESTIMATED` times the capacity they were run at (see `bench_model`)."""


def load_runs(
    runner: Runner, server: ServerProcess, fifo: ServerProcess, capacity: float, pairs: int
) -> list[dict[str, Any]]:
    """EDF and FIFO at 50/100/150/200% of `capacity`, then `pairs` - 1 more EDF 100%/200%
    pairs; `runner` left serving `server`."""
    rows = []
    # NOTE: EDF and FIFO take each load in turn, back to back (the idle server costs next to
    # nothing): FIFO's runs, made after all of EDF's, once answered 2x EDF's goodput at 200%
    # on the 2-core VM, its speed having drifted meanwhile; alternated (8,500/s, 6 rounds),
    # the two answered 6,122 and 6,304 a second on time
    for p in (50, 100, 150, 200):
        for label, target, idle in (("edf", server, fifo), ("fifo", fifo, server)):
            runner.serving(target, idle)
            result = runner.open_loop(runner.port(target), capacity * p / 100)
            rows.append(row(label, f"{p}%", result, runner))
    runner.serving(server, fifo)
    # NOTE: the 100%/200% verdict compares runs minutes apart, and this VM's speed drifts
    # by up to 2x in that time: more pairs, each run back to back, and the median ratio.
    # Five, not three: mlp's three pairs of one run read 1.46, 1.12 and 0.51 (the 2-core
    # VM; a core's speed there swings by 1.8x for seconds at a time, and more when the
    # other core is busy), and its median moved by a third between full runs of one build
    for pair in range(2, pairs + 1):
        rows += [row("edf", f"{p}% (pair {pair})",
                     runner.open_loop(runner.port(server), capacity * p / 100), runner)
                 for p in (100, 200)]  # fmt: skip
    return rows


ECHO_FLOOR = "echo floor"
"""The policy label of the echo floor's row (see `echo_floor`)."""


def echo_floor(
    runner: Runner, server: ServerProcess, fifo: ServerProcess, capacity: float
) -> dict[str, Any]:
    """The 200% run's load (due times, rate, connections) on bench/echo_server.py answering
    as `server` does, at once, on the server's loop CPU: the share of answers this machine's
    loopback, wake-ups and generator deliver on time from a server that does no work.

    NOTE: the issue's on-time target (99.9% at 200%) reads the generator's clock, on the
    machine the server shares. On the 2-core VM at 1,000-2,000 requests/s (2/10 ms due
    times) a server answering every request at once from a cache answered 0.11-0.22% of them
    over 2 ms after the generator sent them, and 0.14-0.55% of the 2 ms ones after their
    due time (the generator's late sends too: it does not refuse them as duetime does). The
    row says how much of duetime's lateness the machine alone would have made."""
    cpu = min(parse_cpus(runner.plan.server_cpus) or ALL_CPUS)
    with echo_server(cpu, answers_from=server.http_port) as (port, pid):
        runner.serving_echo(pid, server, fifo)
        return row(ECHO_FLOOR, "200%", runner.open_loop(port, capacity * 2), runner)


def find_capacity(runner: Runner, port: int) -> tuple[float, list[dict[str, Any]]]:
    """Highest goodput over open-loop rates around the closed-loop throughput."""
    saturated = runner.closed_loop(port, 64).overall.throughput_rps
    rows, best = [], 0.0
    for factor in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2):
        result = runner.open_loop(port, saturated * factor)
        rows.append(
            row("edf", f"search {factor:.0%} of closed-loop {saturated:,.0f}/s", result, runner)
        )
        goodput = result.overall.goodput_rps
        best = max(best, goodput)
        if goodput < 0.8 * best:  # past the peak
            break
    return best, rows


class BareOrt:
    """One ORT session with one intra-op thread on `cpus`: the rows/s of the best batch size."""

    def __init__(self, model_path: Path, max_batch: int, cpus: frozenset[int]) -> None:
        self.cpus = cpus
        self.session = ort.InferenceSession(
            str(model_path), session_options(intra_op_threads=1, inter_op_threads=1),
            providers=["CPUExecutionProvider"],
        )  # fmt: skip
        self.name = self.session.get_inputs()[0].name
        shape = [d if isinstance(d, int) else 1 for d in self.session.get_inputs()[0].shape]
        self.inputs = {
            rows: np.random.default_rng(rows).standard_normal([rows, *shape[1:]]).astype(np.float32)
            for rows in batch_buckets(max_batch)
        }
        # NOTE: short runs of each size, interleaved over rounds: one run each picked batch 3
        # over 32 once (a slow moment of the VM on the larger sizes)
        rates: dict[int, list[float]] = {rows: [] for rows in self.inputs}
        for _ in range(3):
            for rows in self.inputs:
                rates[rows].append(self.rows_per_s(rows, 0.2))
        self.best = max(rates, key=lambda rows: float(np.median(rates[rows])))

    def rows_per_s(self, rows: int, seconds: float) -> float:
        pin_current_thread(self.cpus)
        try:
            feeds = {self.name: self.inputs[rows]}
            self.session.run(None, feeds)
            runs, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                self.session.run(None, feeds)
                runs += 1
            return runs * rows / (time.perf_counter() - started)
        finally:
            pin_current_thread(ALL_CPUS)


def bench_model(
    plan: ModelPlan, demo: Path, root: Path, args: argparse.Namespace
) -> dict[str, Any]:
    connections = args.connections or (4 if args.protocol == "grpc" else 512)
    runner = Runner(plan, args.duration, connections, args.wait_quiet, args.protocol)
    repos = {label: variant_repository(demo, root, plan.name, label, text)
             for label, text in configs(plan).items()}  # fmt: skip
    out: dict[str, Any] = {
        "model": plan.name, "deadlines_ms": plan.timeouts_ms, "protocol": args.protocol,
    }  # fmt: skip
    with (
        server_process(repos["edf"], "--cpus", plan.server_cpus) as server,
        server_process(repos["fifo"], "--cpus", plan.server_cpus) as fifo,
    ):
        runner.serving(server, fifo)
        capacity, search = find_capacity(runner, runner.port(server))
        out["superseded"] = []
        for attempt in range(1, CAPACITY_ROUNDS + 1):
            rows = load_runs(runner, server, fifo, capacity, args.pairs)
            best = max(r["goodput/s"] for r in rows)
            if best <= UNDERESTIMATED * capacity or attempt == CAPACITY_ROUNDS:
                break
            # NOTE: capacity is the highest goodput found (the definition); a load run
            # that found a higher one than the search makes it the capacity, and the loads are
            # run again at their percentages of it (on the 2-core VM mlp's search peaked at
            # 1,685/s and its 200% runs then answered 1,869-2,000 on time: each run's goodput
            # is noisy, and the search's rates are 10% of the closed-loop throughput apart)
            out["superseded"].append({"capacity_rps": capacity, "runs": rows})
            capacity = best
        out["capacity_rps"] = capacity
        if args.protocol == "http-binary":
            rows.append(echo_floor(runner, server, fifo, capacity))
            runner.serving(server, fifo)
        if plan.name == "resnet":
            bare = BareOrt(demo / "resnet/1/model.onnx", plan.max_batch_size, plan.instance_cpus)
            before = bare.rows_per_s(bare.best, args.duration / 2)
            saturated = runner.closed_loop(runner.port(server), 64).overall.throughput_rps
            after = bare.rows_per_s(bare.best, args.duration / 2)
            limit = (before + after) / 2
            out["saturated_rps"] = saturated
            out["bare_ort_limit"] = {
                "rows_per_s": limit, "batch": float(bare.best),
                "before_rows_per_s": before, "after_rows_per_s": after,
            }  # fmt: skip
            out["saturated_vs_bare"] = saturated / limit
    with server_process(repos["unbatched"], "--cpus", plan.server_cpus) as server:
        runner.serving(server)
        rows.append(
            row("unbatched", "50%", runner.open_loop(runner.port(server), capacity / 2), runner)
        )
    # NOTE: tuning off ran on every CPU (`--cpus none` alone) while tuning on had the plan's:
    # mlp's untuned server took the generator's core too, and its P99 at 100% read lower than
    # the tuned one's (2.1-2.6 ms against 3.3-4.2) for having two cores, not for the tuning. It
    # is confined to the plan's CPUs now, and the two alternate, both up, as EDF and FIFO do
    cpus = frozenset(parse_cpus(plan.server_cpus) or ALL_CPUS)  # (as the tuned one reads it)
    with (
        server_process(repos["edf"], "--cpus", plan.server_cpus) as tuned,
        server_process(repos["edf"], "--cpus", "none", "--no-tune-runtime", cpus=cpus) as untuned,
    ):
        for round_ in range(1, TUNING_ROUNDS + 1):
            for label, target, idle in (("on", tuned, untuned), ("off", untuned, tuned)):
                runner.serving(target, idle)
                result = runner.open_loop(runner.port(target), capacity)
                rows.append(row(f"edf, tuning {label}", f"100% (round {round_})", result, runner))
    out["search"] = search
    out["runs"] = rows
    out["verdicts"] = verdicts(rows, capacity)
    return out


UNDERESTIMATED = 1.1
"""A run answering this many times the capacity on time says the search missed the peak."""


STOLEN = 0.2
"""Cores' worth of CPU the hypervisor may take from the VM during a run before the figures are
said to be the machine's (resnet's runs on the 2-core VM with 0.7-1.0 cores stolen: its
generator sent 20-70% of its requests over 1 ms late, and EDF at 150% answered 5 a second)."""


def verdicts(rows: list[dict[str, Any]], capacity: float) -> dict[str, Any]:
    """The figures the issue's targets read. `capacity_underestimated`: a run's goodput
    exceeded the search's highest by over 10% (the VM's speed drifted during the search, or
    goodput is not single-peaked there), so the loads are not the percentages they are named,
    and the 200%/100% ratio says nothing: rerun.

    NOTE: on a VM running slow, the search's goodput peaked at 2,613/s and its next rate gave
    1,814; the runs named 200% then answered 3,189-3,811 on time, and the ratio read 1.52."""
    by = {(r["policy"], r["load"]): r for r in rows}
    # (the echo floor answers everything at once: no measure of the server's capacity)
    best = max(r["goodput/s"] for r in rows if r["policy"] != ECHO_FLOOR)
    edf50 = by[("edf", "50%")]
    unbatched = by[("unbatched", "50%")]
    at_200 = [r for r in rows if r["policy"] == "edf" and r["load"].startswith("200%")]
    pairs = [
        r200["goodput/s"] / max(r100["goodput/s"], 1e-9)
        for r100, r200 in zip(
            (r for r in rows if r["policy"] == "edf" and r["load"].startswith("100%")),
            at_200,
            strict=True,
        )
    ]
    ok, late = sum(r["ok"] for r in at_200), sum(r["late"] for r in at_200)
    models = [
        cost_model(r100, r200)
        for r100, r200 in zip(
            (r for r in rows if r["policy"] == "edf" and r["load"].startswith("100%")),
            at_200,
            strict=True,
        )
    ]
    known = [m for m in models if m is not None]
    floor = by.get((ECHO_FLOOR, "200%"))
    return {
        "capacity_underestimated": best > UNDERESTIMATED * capacity,
        "max_steal_cores": max(r["steal_cores"] for r in rows),
        "edf_cost_model": (
            {key: float(np.median([m[key] for m in known])) for key in known[0]} if known else None
        ),
        "edf_goodput_200_over_100": float(np.median(pairs)),
        "edf_goodput_200_over_100_pairs": pairs,
        "edf_on_time_at_200_%": 100.0 * ok / (ok + late) if ok + late else None,
        "echo_floor_on_time_at_200_%": floor["on_time_%"] if floor else None,
        "fifo_goodput_200_over_100": by[("fifo", "200%")]["goodput/s"]
        / max(by[("fifo", "100%")]["goodput/s"], 1e-9),
        "edf_p50_minus_unbatched_p50_ms_at_50": (edf50["p50_ms"] or 0) - (unbatched["p50_ms"] or 0),
        "tuning_p99_ms_on_vs_off": tuple(
            _median([r["p99_ms"] for r in rows if r["policy"] == f"edf, tuning {label}"])
            for label in ("on", "off")
        ),
    }


def _median(values: list[float | None]) -> float | None:
    """The median of the values a run measured (a run with no answers has no P99: None),
    None if none did."""
    known = [value for value in values if value is not None]
    return float(np.median(known)) if known else None


def _superseded(result: dict[str, Any]) -> str:
    """The capacities whose load runs found a higher goodput, for the table's title."""
    earlier = [f"{r['capacity_rps']:,.0f}" for r in result["superseded"]]
    return f" (loads run again: those at {', '.join(earlier)}/s found more)" if earlier else ""


def engine_overhead(demo: Path, requests: int) -> dict[str, float]:
    x = np.random.default_rng(0).standard_normal((1, 40), dtype=np.float32)
    # NOTE: the two timed call by call in alternation (see bench/overhead.py)
    samples, base = bench_engine_async(demo, x, requests, ort_call(demo / "mlp/1/model.onnx", x))
    ort_p50, engine_p50 = float(np.median(base)) / 1e3, float(np.median(samples)) / 1e3
    pin_current_thread(ALL_CPUS)
    return {"ort_p50_us": ort_p50, "engine_infer_async_p50_us": engine_p50,
            "added_p50_us": engine_p50 - ort_p50}  # fmt: skip


def _models(text: str) -> list[str]:
    """`--models`: demo models this benchmark has a plan for, comma-separated.

    NOTE: an unknown name ended in a traceback (KeyError), after the demo was written; so did
    --duration 0, and --pairs 0 ran on unchecked (found by a tester)."""
    names = [name.strip() for name in text.split(",")]
    known = plans()
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected demo models among {', '.join(known)}, comma-separated, got {text!r}"
        )
    return names


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", type=_models, default="resnet,mlp",
        help="which demo models, comma-separated: resnet, mlp (default both)",
    )  # fmt: skip
    parser.add_argument(
        "--duration", type=real(above=0), default=5.0, help="measured seconds per run (5)"
    )
    parser.add_argument(
        "--protocol", choices=("http-binary", "grpc"), default="http-binary",
        help="what every run goes over (default http-binary)",
    )  # fmt: skip
    parser.add_argument(
        "--connections", type=whole(at_least=1), default=None,
        help="the generator's HTTP connections (default 512) or gRPC channels (default 4)",
    )  # fmt: skip
    parser.add_argument(
        "--pairs",
        type=whole(at_least=1),
        default=5,
        help="EDF 100%%/200%% run pairs (the verdict's median; 5)",
    )
    parser.add_argument(
        "--wait-quiet", type=real(at_least=0), default=30.0,
        help="seconds to wait before each run for other programs to be idle (30)",
    )  # fmt: skip
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results" / "scheduling.json",
        help="the JSON file written (bench/results/scheduling.json)",
    )
    args = parser.parse_args()
    results: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "cpus": sorted(ALL_CPUS)}
    }
    with tempfile.TemporaryDirectory() as tmp:
        demo = write_demo_repository(Path(tmp) / "demo")
        for name in args.models:
            plan = plans()[name]
            results[name] = bench_model(plan, demo, Path(tmp), args)
            print_table(
                f"{name} over {args.protocol}: deadlines {plan.timeouts_ms[0]:g}/"
                f"{plan.timeouts_ms[1]:g} ms, capacity {results[name]['capacity_rps']:,.0f} "
                f"answers/s on time{_superseded(results[name])}",
                results[name]["runs"], list(results[name]["runs"][0]),
            )  # fmt: skip
            print(json.dumps(results[name]["verdicts"], indent=2))
            if results[name]["verdicts"]["capacity_underestimated"]:
                print(
                    f"WARNING: {name}: a run answered over {UNDERESTIMATED:.0%} of the capacity "
                    "on time: the search missed the peak (the VM's speed drifted), the loads "
                    "are not the percentages named, and the 200%/100% ratio says nothing; rerun"
                )
            if results[name]["verdicts"]["max_steal_cores"] > STOLEN:
                print(
                    f"WARNING: {name}: the hypervisor took up to "
                    f"{results[name]['verdicts']['max_steal_cores']:.1f} cores from this VM "
                    "during a run (steal_cores): its figures are the machine's, not the "
                    "server's; rerun"
                )
            if name == "resnet":
                r = results[name]
                print(
                    f"saturated {args.protocol} {r['saturated_rps']:,.0f} rows/s = "
                    f"{r['saturated_vs_bare']:.0%} of bare ORT "
                    f"{r['bare_ort_limit']['rows_per_s']:,.0f} rows/s"
                )
        if "mlp" in args.models:
            results["engine_overhead"] = engine_overhead(demo, 3000)
            print(f"\nEngine.infer_async on mlp: {results['engine_overhead']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
