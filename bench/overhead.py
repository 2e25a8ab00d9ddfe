"""What each layer adds to ONNX Runtime for `mlp` at batch 1, and closed-loop HTTP throughput.

    python3 bench/overhead.py [--requests 3000] [--duration 10] [--out bench/results/overhead.json]

Sequential requests (after a warm-up) measure P50/P99 latency of: ORT in-process, Engine.infer,
Engine.infer_async, HTTP binary, HTTP JSON (a minimal keep-alive socket client, so the client's
own cost stays small) and gRPC (a bare grpc channel with a pre-serialised request). Throughput is
closed-loop over HTTP binary with 16 keep-alive connections, driven by wrk (a Lua script posts
the binary body) when it is installed. The server runs in its own process; a second one with
`--busy-poll-us` gives two HTTP rows (blocking and polling client), and where the bench may write
/dev/cpu_dma_latency (root) a third with `--cpu-dma-latency-us 0` gives the rows so marked: the
machine's idle CPUs poll instead of halting while it runs, and the echo floor is measured again
under that limit.

Each row's `added_p50_us` is over ONNX Runtime timed in alternation with it (blocks of
`BLOCK` calls, or call by call for the Engine rows), in the same process and thread: the host
of a shared VM speeds up and slows down by half within a minute, and a baseline measured once
at the start made the added figures swing by more than they measure (`ort_p50_us`: that
row's own baseline).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).parent))
from common import (
    KeepAliveClient,
    infer_request_bytes,
    percentiles_us,
    print_table,
    server_process,
    timed,
)

from duetime import Engine
from duetime.demo import write_demo_repository
from duetime.execution.affinity import (
    CPU_DMA_LATENCY,
    CpuPlan,
    parse_cpus,
    pin_current_thread,
)
from duetime.execution.ort import session_options
from duetime.loops import new_event_loop
from duetime.tools.payloads import grpc_request_bytes

WARMUP = 500
BLOCK = 100
"""Calls of a path timed before as many of ONNX Runtime alone, and so on (see the docstring)."""
ALL_CPUS = frozenset(os.sched_getaffinity(0))


Samples = tuple[list[int], list[int]]
"""A path's latencies and those of ONNX Runtime alone, timed in alternation with them."""


def ort_call(model: Path, x: np.ndarray) -> Callable[[], object]:
    """One mlp run on ONNX Runtime alone, one thread, warmed up."""
    options = session_options(intra_op_threads=1, inter_op_threads=1)
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    feeds = {"x": x}

    def run() -> object:
        return session.run(None, feeds)

    timed(run, WARMUP)
    return run


def alternated(call: Callable[[], object], baseline: Callable[[], object], n: int) -> Samples:
    """`n` timed calls of `call` and of `baseline`, in alternating blocks of `BLOCK`."""
    samples: list[int] = []
    base: list[int] = []
    while len(samples) < n:
        count = min(BLOCK, n - len(samples))
        samples += timed(call, count)
        base += timed(baseline, count)
    return samples, base


def pinned_plan() -> CpuPlan:
    """The server's default CPU plan, applied to this process's in-process measurements."""
    plan = CpuPlan(parse_cpus("auto"))
    pin_current_thread(frozenset({plan.loop_cpu}) if plan.loop_cpu is not None else None)
    return plan


def bench_engine_sync(repo: Path, x: np.ndarray, n: int, ort_run: Callable[[], object]) -> Samples:
    with Engine.open(repo) as engine:
        timed(lambda: engine.infer("mlp", {"x": x}), WARMUP)
        return alternated(lambda: engine.infer("mlp", {"x": x}), ort_run, n)


def bench_engine_async(repo: Path, x: np.ndarray, n: int, ort_run: Callable[[], object]) -> Samples:
    async def run() -> Samples:
        engine = Engine(cpus=pinned_plan())
        await engine.load_repository(repo)
        samples, base = [], []
        clock = time.perf_counter_ns
        for i in range(WARMUP + n):  # call by call: one ORT run, one request
            started = clock()
            ort_run()
            ran = clock()
            await engine.infer_async("mlp", {"x": x})
            if i >= WARMUP:
                base.append(ran - started)
                samples.append(clock() - ran)
        await engine.aclose()
        return samples, base

    loop = new_event_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


BUSY_POLL_US = 500
"""The server's loop polls this long after each read instead of sleeping (the last HTTP row): a
blocking client's next request then finds it awake."""


def bench_http(
    host: str, port: int, x: np.ndarray, n: int, ort_run: Callable[[], object], *,
    binary: bool, spin: bool = False,
) -> Samples:  # fmt: skip
    request = infer_request_bytes(host, port, "mlp", "x", x, binary=binary)
    client = KeepAliveClient(host, port, spin=spin)
    try:
        status, _ = client.roundtrip(request)
        assert status == 200, status
        timed(lambda: client.roundtrip(request), WARMUP)
        return alternated(lambda: client.roundtrip(request), ort_run, n)
    finally:
        client.close()


def bench_grpc(
    host: str, port: int, x: np.ndarray, n: int, ort_run: Callable[[], object]
) -> Samples:
    payload = grpc_request_bytes("mlp", {"x": x}, {})
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        call(payload)
        timed(lambda: call(payload), WARMUP)
        return alternated(lambda: call(payload), ort_run, n)


@contextlib.contextmanager
def echo_process(cpu: int) -> Iterator[int]:
    """bench/echo_server.py on `cpu` (the duetime server's loop CPU); yields its port."""
    with echo_server(cpu) as (port, _):
        yield port


@contextlib.contextmanager
def echo_server(cpu: int, answers_from: int | None = None) -> Iterator[tuple[int, int]]:
    """bench/echo_server.py on `cpu`, with `--answers-from` where given; yields its port and
    pid."""
    script = Path(__file__).parent / "echo_server.py"
    extra = [] if answers_from is None else ["--answers-from", str(answers_from)]
    process = subprocess.Popen(
        [sys.executable, str(script), "--cpu", str(cpu), *extra], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        yield int(process.stdout.readline().split()[1]), process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


LATENCY_TAG = ", --cpu-dma-latency-us 0"


def bench_polling_cpus(
    repo: Path, x: np.ndarray, n: int, ort_run: Callable[[], object]
) -> dict[str, Samples]:
    """The server holding idle CPUs to a 0 µs wake-up (they poll instead of halting), and the
    echo floor measured while it holds it (the limit is the whole machine's)."""
    paired: dict[str, Samples] = {}
    with server_process(repo, "--cpu-dma-latency-us", "0") as server:
        pin_current_thread(ALL_CPUS - {min(ALL_CPUS)} or None)
        h, hp, gp = server.host, server.http_port, server.grpc_port
        paired["HTTP binary" + LATENCY_TAG] = bench_http(h, hp, x, n, ort_run, binary=True)
        paired["HTTP JSON" + LATENCY_TAG] = bench_http(h, hp, x, n, ort_run, binary=False)
        paired["gRPC" + LATENCY_TAG] = bench_grpc(h, gp, x, n, ort_run)
        pin_current_thread(ALL_CPUS)
        with echo_process(min(ALL_CPUS)) as port:
            pin_current_thread(ALL_CPUS - {min(ALL_CPUS)} or None)
            echo = bench_http("127.0.0.1", port, x, n, ort_run, binary=True)
            paired["echo floor" + LATENCY_TAG] = echo
    pin_current_thread(ALL_CPUS)
    return paired


def wrk_throughput(host: str, port: int, x: np.ndarray, duration: int) -> dict[str, Any]:
    wrk = shutil.which("wrk")
    if wrk is None:
        return {"error": "wrk not installed (apt-get install wrk)"}
    raw = infer_request_bytes(host, port, "mlp", "x", x, binary=True)
    head, _, body = raw.partition(b"\r\n\r\n")
    header_len = re.search(rb"Inference-Header-Content-Length: (\d+)", head)[1].decode()  # type: ignore[index]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "body.bin").write_bytes(body)
        script = Path(tmp) / "post.lua"
        script.write_text(
            f'local f = io.open("{tmp}/body.bin", "rb")\n'
            'wrk.body = f:read("*all")\nf:close()\n'
            'wrk.method = "POST"\n'
            f'wrk.headers["Inference-Header-Content-Length"] = "{header_len}"\n'
            'wrk.headers["Content-Type"] = "application/octet-stream"\n'
            "done = function(summary, latency, requests)\n"
            '  io.write(string.format("non2xx=%d\\n", summary.errors.status))\nend\n'
        )
        url = f"http://{host}:{port}/v2/models/mlp/infer"
        out = subprocess.run(
            [wrk, "-t1", "-c16", f"-d{duration}s", "--latency", "-s", str(script), url],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    non2xx = int(re.search(r"non2xx=(\d+)", out)[1])  # type: ignore[index]
    latency = dict(re.findall(r"\s+(50|99)%\s+([\d.]+\w+)", out))
    return {
        "requests_per_s": rps,
        "non_2xx": non2xx,
        "p50": latency.get("50"),
        "p99": latency.get("99"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--duration", type=int, default=10, help="seconds of wrk load")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "overhead.json"
    )
    args = parser.parse_args()
    n = args.requests
    x = np.random.default_rng(0).standard_normal((1, 40), dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_demo_repository(Path(tmp) / "repo")
        ort_run = ort_call(repo / "mlp/1/model.onnx", x)
        rows: list[dict[str, Any]] = [
            {"path": "ORT in-process", **percentiles_us(timed(ort_run, n))}
        ]
        paired: dict[str, Samples] = {
            "Engine.infer_async": bench_engine_async(repo, x, n, ort_run),
            "Engine.infer (sync)": bench_engine_sync(repo, x, n, ort_run),
        }
        pin_current_thread(ALL_CPUS)
        with server_process(repo) as server:
            # The clients run on the CPUs the server's loop does not use, as a remote client would.
            pin_current_thread(ALL_CPUS - {min(ALL_CPUS)} or None)
            h, hp, gp = server.host, server.http_port, server.grpc_port
            paired["HTTP binary"] = bench_http(h, hp, x, n, ort_run, binary=True)
            paired["HTTP JSON"] = bench_http(h, hp, x, n, ort_run, binary=False)
            # A client that polls its socket instead of sleeping: on a VM, waking an idle vCPU
            # costs tens of µs that belong to the client's machine, not to the server.
            paired["HTTP binary, polling client"] = bench_http(
                h, hp, x, n, ort_run, binary=True, spin=True
            )
            paired["gRPC"] = bench_grpc(h, gp, x, n, ort_run)
            throughput = wrk_throughput(h, hp, x, args.duration)
        pin_current_thread(ALL_CPUS)
        with server_process(repo, "--busy-poll-us", str(BUSY_POLL_US)) as server:
            pin_current_thread(ALL_CPUS - {min(ALL_CPUS)} or None)
            h, hp = server.host, server.http_port
            spun = f"HTTP binary, --busy-poll-us {BUSY_POLL_US}"
            paired[spun] = bench_http(h, hp, x, n, ort_run, binary=True)
            paired[f"HTTP binary, polling client, --busy-poll-us {BUSY_POLL_US}"] = bench_http(
                h, hp, x, n, ort_run, binary=True, spin=True
            )
        pin_current_thread(ALL_CPUS)
        with echo_process(min(ALL_CPUS)) as port:
            pin_current_thread(ALL_CPUS - {min(ALL_CPUS)} or None)
            for spin, label in ((False, "echo floor"), (True, "echo floor, polling client")):
                paired[label] = bench_http("127.0.0.1", port, x, n, ort_run, binary=True, spin=spin)
        pin_current_thread(ALL_CPUS)
        if os.access(CPU_DMA_LATENCY, os.W_OK):
            paired.update(bench_polling_cpus(repo, x, n, ort_run))
        else:
            print(f"(no {LATENCY_TAG.lstrip(', ')} rows: {CPU_DMA_LATENCY} is not writable here)")
    rows[0]["ort_p50_us"] = rows[0]["p50_us"]
    for path, (samples, base) in paired.items():
        ort_p50 = percentiles_us(base)["p50_us"]
        rows.append({"path": path, **percentiles_us(samples), "ort_p50_us": ort_p50})
    floors = {row["path"]: row["p50_us"] for row in rows if row["path"].startswith("echo")}
    for row in rows:
        row["added_p50_us"] = row["p50_us"] - row["ort_p50_us"]
        if row["path"].startswith("HTTP binary"):
            if row["path"].endswith(LATENCY_TAG):
                floor = floors["echo floor" + LATENCY_TAG]
            else:
                polling = "polling" in row["path"]
                floor = floors["echo floor, polling client" if polling else "echo floor"]
            row["over_echo_p50_us"] = row["p50_us"] - floor
    print_table(
        f"mlp, batch 1, {n} sequential requests after {WARMUP} warm-up (latency in µs; echo "
        "floor: a bare uvloop + httptools server answering a fixed 200, same client and CPUs)",
        rows,
        ["path", "p50_us", "p90_us", "p99_us", "ort_p50_us", "added_p50_us", "over_echo_p50_us"],
    )  # fmt: skip
    print_table("closed loop, HTTP binary, wrk -t1 -c16", [throughput], list(throughput))
    result = {
        "machine": {"platform": platform.platform(), "cpus": len(ALL_CPUS)},
        "latency": rows,
        "throughput_http_binary_c16": throughput,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
