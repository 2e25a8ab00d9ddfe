"""Shadow traffic: does mirroring a share of requests to another version change the answers or
the primary's tail latency?

    python3 bench/shadow.py [--models resnet,mlp] [--share 0.05] [--duration 10] [--rounds 2]
                            [--out bench/results/shadow.json]

For each model, a repository with versions 1 and 2 (the same file) serves all requests from
version 1 (`traffic.weights = { "1" = 1 }`); the shadow runs add `traffic.shadow = { "2" = share }`.
The same open-loop load (HTTP binary, Poisson, a generous due time) runs against both servers,
alternating A, B, A, B to spread the machine's drift over both; the headline is the ratio of the
P99s (target: within 10%). Answers are checked directly: the same inputs give byte-identical
outputs from version 1 with and without the shadow, and the stats endpoint shows the mirrored
share and how far version 2's outputs diverged.
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import print_table, server_process

from duetime.demo import write_demo_repository
from duetime.tools.config import BenchConfig
from duetime.tools.loadgen import run_bench

LOAD = {  # model -> (requests per second, due time in ms): about half of capacity here
    "resnet": (300.0, 50.0),
    "mlp": (3000.0, 10.0),
}
SHAPES = {"resnet": [1, 3, 64, 64], "mlp": [1, 40]}
INPUT = {"resnet": "image", "mlp": "x"}


def make_repository(root: Path, demo: Path, model: str, share: float | None) -> Path:
    repo = root / ("shadow" if share else "plain")
    for version in ("1", "2"):
        target = repo / model / version
        target.mkdir(parents=True)
        shutil.copy(demo / model / "1" / "model.onnx", target / "model.onnx")
    config = (
        (demo / model / "config.toml").read_text()
        if (demo / model / "config.toml").exists()
        else ""
    )
    config += '\n[version_policy]\nall = {}\n\n[traffic]\nweights = { "1" = 1 }\n'
    if share:
        config += f'shadow = {{ "2" = {share} }}\n'
    (repo / model / "config.toml").write_text(config)
    return repo


def answers(port: int, model: str, count: int = 50) -> list[tuple[str, list[float]]]:
    """(model_version, outputs) for `count` fixed inputs, as JSON."""
    connection = http.client.HTTPConnection("127.0.0.1", port)
    rng = np.random.default_rng(1)
    found = []
    for _ in range(count):
        data = rng.standard_normal(SHAPES[model]).astype(np.float32)
        body = {"inputs": [{"name": INPUT[model], "datatype": "FP32", "shape": SHAPES[model],
                            "data": data.ravel().tolist()}]}  # fmt: skip
        connection.request("POST", f"/v2/models/{model}/infer", json.dumps(body))
        doc = json.loads(connection.getresponse().read())
        found.append((doc["model_version"], doc["outputs"][0]["data"]))
    connection.close()
    return found


def shadow_stats(port: int, model: str) -> dict[str, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port)
    connection.request("GET", f"/v2/models/{model}/stats")
    doc = json.loads(connection.getresponse().read())
    connection.close()
    versions = {entry["version"]: entry for entry in doc["model_stats"]}
    return {
        "version_1_inferences": versions["1"]["inference_count"],
        "version_2_inferences": versions["2"]["inference_count"],
        "shadow": versions["2"]["duetime"].get("shadow", {}),
    }


def run_load(port: int, model: str, duration: float, seed: int) -> dict[str, Any]:
    rate, due_ms = LOAD[model]
    config = BenchConfig(
        model=model, protocol="http-binary", address=f"127.0.0.1:{port}", mode="open",
        rate=rate, duration_s=duration, warmup_s=1.0, timeouts_ms=(due_ms,), mix=(1.0,),
        seed=seed,
    )  # fmt: skip
    overall = run_bench(config).overall
    return {
        "sent": overall.sent, "ok": overall.ok, "errors": overall.errors + overall.rejected
        + overall.expired + overall.late, "p50_ms": overall.latency.p50_ms,
        "p99_ms": overall.latency.p99_ms, "p999_ms": overall.latency.p999_ms,
    }  # fmt: skip


def bench_model(model: str, share: float, duration: float, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        demo = write_demo_repository(root / "demo")
        repos = {"plain": make_repository(root, demo, model, None),
                 "shadow": make_repository(root, demo, model, share)}  # fmt: skip
        runs: dict[str, list[dict[str, Any]]] = {"plain": [], "shadow": []}
        outputs: dict[str, list[tuple[str, list[float]]]] = {}
        extra: dict[str, Any] = {}
        for round_ in range(rounds):
            for kind in ("plain", "shadow"):
                with server_process(repos[kind]) as server:
                    if round_ == 0:
                        outputs[kind] = answers(server.http_port, model)
                    runs[kind].append(run_load(server.http_port, model, duration, seed=round_))
                    if kind == "shadow" and round_ == rounds - 1:
                        extra = shadow_stats(server.http_port, model)
    p99 = {kind: statistics.median(r["p99_ms"] for r in runs[kind]) for kind in runs}
    return {
        "model": model,
        "share": share,
        "runs": runs,
        "p99_ms": p99,
        "p99_ratio": p99["shadow"] / p99["plain"],
        "answers_identical": outputs["plain"] == outputs["shadow"],
        "answered_by_version_1": all(v == "1" for v, _ in outputs["shadow"]),
        "last_shadow_server": extra,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet,mlp")
    parser.add_argument("--share", type=float, default=0.05)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results/shadow.json")
    args = parser.parse_args()
    results = [
        bench_model(model, args.share, args.duration, args.rounds)
        for model in args.models.split(",")
    ]
    rows = []
    for result in results:
        for kind in ("plain", "shadow"):
            for index, run in enumerate(result["runs"][kind]):
                rows.append({"model": result["model"], "server": kind, "round": index, **run})
    print_table(
        "Shadow traffic: the same load with and without mirroring",
        rows, ["model", "server", "round", "sent", "ok", "errors", "p50_ms", "p99_ms", "p999_ms"],
    )  # fmt: skip
    summary = [
        {
            "model": r["model"],
            "share": f"{r['share']:.0%}",
            "p99 plain ms": r["p99_ms"]["plain"],
            "p99 shadow ms": r["p99_ms"]["shadow"],
            "p99 ratio": r["p99_ratio"],
            "answers identical": r["answers_identical"],
            "v1 answered all": r["answered_by_version_1"],
            "mirrored": r["last_shadow_server"].get("shadow", {}).get("mirrored"),
            "argmax disagreements": r["last_shadow_server"]
            .get("shadow", {})
            .get("argmax_disagreements"),
        }
        for r in results
    ]
    print_table("Summary (median P99 over rounds; target ratio <= 1.10)", summary, list(summary[0]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"machine": platform.machine(), "cpus": len(__import__("os").sched_getaffinity(0))}
    args.out.write_text(json.dumps({"machine": machine, "results": results}, indent=2))
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
