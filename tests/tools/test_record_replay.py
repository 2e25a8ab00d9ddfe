"""What a server records, a replay sends again: a capture written by `serve --record` from real
clients (HTTP binary, HTTP JSON, gRPC) replays against another server with every request
answered and every answer equal to the recorded one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, recording_server

from duetime.cli import main
from duetime.tools.capture import read_capture

REQUESTS = 12


def _send(server: RunningServer) -> None:
    rng = np.random.default_rng(3)
    http = httpclient.InferenceServerClient(server.http)
    grpc = grpcclient.InferenceServerClient(server.grpc)
    try:
        for i in range(REQUESTS):
            x = rng.standard_normal((1 + i % 3, 40), dtype=np.float32)
            headers = {"x-session": f"user-{i % 4}"}
            if i % 3 == 2:
                tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                grpc.infer("mlp", [tensor], request_id=f"r{i}", headers=headers)
                continue
            tensor = httpclient.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=i % 3 == 0)
            http.infer("mlp", [tensor], request_id=f"r{i}", headers=headers)
    finally:
        http.close()
        grpc.close()


@pytest.fixture(scope="module")
def capture(mlp_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("record") / "traffic.cap"
    with recording_server(mlp_repo, path) as running:
        _send(running)
    return path


def test_the_capture_holds_every_request(capture: Path) -> None:
    records = list(read_capture(capture))
    assert sorted(r.request_id for r in records) == sorted(f"r{i}" for i in range(REQUESTS))
    assert all(r.status == 200 for r in records)


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_a_server_capture_replays_with_the_same_answers(
    capture: Path, server: RunningServer, tmp_path: Path, scheme: str
) -> None:
    out = tmp_path / "replay.json"
    target = f"{scheme}://{server.http if scheme == 'http' else server.grpc}"
    code = main(["replay", str(capture), "--target", target, "--compare-outputs",
                 "--atol", "1e-5", "--json", str(out), "-q"])  # fmt: skip
    result = json.loads(out.read_text())
    assert (result["sent"], result["ok"], result["errors"]) == (REQUESTS, REQUESTS, 0)
    assert result["compare"]["mismatched"] == 0
    assert code == 0


def test_replay_reports_the_batch_sizes_the_server_ran(
    capture: Path, server: RunningServer, tmp_path: Path
) -> None:
    out, png = tmp_path / "replay.json", tmp_path / "report.png"
    metrics = f"http://127.0.0.1:{server.addresses.metrics_port}/metrics"
    argv = ["replay", str(capture), "--target", f"http://{server.http}", "--metrics", metrics,
            "--json", str(out), "--report", str(png), "-q"]  # fmt: skip
    assert main(argv) == 0
    ran = json.loads(out.read_text())["batch_sizes"]["mlp"]
    # every request ran in some batch: executions times rows cover the requests at least
    assert sum(int(size) * count for size, count in ran.items()) >= REQUESTS
    assert png.read_bytes().startswith(b"\x89PNG")


def test_batch_counts_come_from_the_histogram_between_two_scrapes() -> None:
    from duetime.tools.server_metrics import between, parse_batch_counts

    def scrape(one: int, four: int) -> str:
        lines = ["# TYPE duetime_batch_size histogram"]
        for version in ("1", "2"):
            lines += [
                f'duetime_batch_size_bucket{{model="m",version="{version}",le="1.0"}} {one}',
                f'duetime_batch_size_bucket{{model="m",version="{version}",le="2.0"}} {one}',
                f'duetime_batch_size_bucket{{model="m",version="{version}",le="4.0"}} {one + four}',
                f'duetime_batch_size_bucket{{model="m",version="{version}",le="+Inf"}} '
                f"{one + four}",
                f'duetime_batch_size_count{{model="m",version="{version}"}} {one + four}',
                f'duetime_batch_size_sum{{model="m",version="{version}"}} {one + 4 * four}',
            ]
        return "\n".join(lines) + "\n"

    before, after = parse_batch_counts(scrape(3, 1)), parse_batch_counts(scrape(10, 6))
    assert before == {"m": {1: 6, 4: 2}}  # two versions, summed
    assert between(before, after) == {"m": {1: 14, 4: 10}}
    assert between(None, after) == {}
    assert parse_batch_counts("# nothing here\n") == {}


def test_late_answers_by_cause_come_from_the_counter_between_two_scrapes() -> None:
    from duetime.tools.server_metrics import between, late_line, parse_late_counts

    def scrape(delivery: int, run: int) -> str:
        lines = ["# TYPE duetime_late_answers_total counter"]
        for version in ("1", "2"):
            labels = f'model="m",version="{version}",variant="default"'
            lines += [
                f'duetime_late_answers_total{{{labels},cause="delivery"}} {delivery}',
                f'duetime_late_answers_total{{{labels},cause="run"}} {run}',
            ]
        return "\n".join(lines) + "\n"

    before, after = parse_late_counts(scrape(1, 2)), parse_late_counts(scrape(4, 2))
    assert before == {"m": {"delivery": 2, "run": 4}}  # two versions, summed
    late = between(before, after)
    assert late == {"m": {"delivery": 6}}, "causes that did not move are left out"
    assert late_line(late) == "server: answers late by its own clock, by cause: m 6 (delivery 6)"
    assert late_line({}) == "server: no answer late by its own clock"
    assert between(None, after) == {}
