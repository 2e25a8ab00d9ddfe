"""A request the model ran whose answer could not be delivered (its JSON over
--max-json-answer-bytes, an output window too small) stays a success of the model, as Triton's
statistics count an inference as it ran, and counts in `duetime_answers_failed_total`. It was
counted a success, then taken back: success counts, the latency histogram and its sum went DOWN
(a counter reset to Prometheus), while its rows and its execution stayed counted, so that
Triton's invariants (sum of batch_size * count == inference_count, queue.count ==
success.count) broke."""

from __future__ import annotations

import http.client
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RunningServer, serving
from test_triton_accounting import harness, run

from duetime.config import ServerSettings

pytestmark = pytest.mark.timeout(120)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def server(mlp_repo: Path) -> Iterator[RunningServer]:
    settings = ServerSettings(
        model_repository=mlp_repo, http_port=0, grpc_port=0, max_json_answer_bytes=1024
    )
    with serving(settings) as running:
        yield running


def infer_mlp(server: RunningServer, rows: int) -> int:
    x = np.random.default_rng(rows).random((rows, 40), np.float32)
    body = {
        "inputs": [
            {"name": "x", "shape": [rows, 40], "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", "/v2/models/mlp/infer", json.dumps(body))
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def counters(server: RunningServer) -> Samples:
    """Every sample of a counter or histogram family, by name and labels (read from the text:
    prometheus_client's parser renames Triton's counters `<name>_total`)."""
    port = server.addresses.metrics_port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    kinds = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    samples: Samples = {}
    for name, labels, number in re.findall(r"^([^#\s{]+)(?:\{(.*)\})? (\S+)$", text, re.M):
        family = re.sub(r"_(total|count|sum|bucket)$", "", name)
        if kinds.get(family, kinds.get(name)) in ("counter", "histogram"):
            pairs = tuple(sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels)))
            samples[(name, pairs)] = float(number)
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()
    )


def triton_stats(server: RunningServer) -> dict[str, Any]:
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("GET", "/v2/models/mlp/stats")
        doc: dict[str, Any] = json.loads(connection.getresponse().read())["model_stats"][0]
        return doc
    finally:
        connection.close()


def test_an_answer_too_big_counts_no_counter_down(server: RunningServer) -> None:
    assert infer_mlp(server, 1) == 200
    before = counters(server)
    assert infer_mlp(server, 64) == 400  # (64 x 10 outputs of JSON: over 1024 bytes)
    after = counters(server)
    went_down = {key: (before[key], v) for key, v in after.items() if v < before.get(key, 0)}
    assert not went_down
    assert value(after, "nv_inference_request_success", model="mlp") == 2
    assert value(after, "duetime_requests_total", model="mlp", outcome="success") == 2
    assert value(after, "duetime_requests_total", model="mlp", outcome="failed") == 0
    assert value(after, "duetime_request_duration_seconds_count", model="mlp") == 2
    assert value(after, "duetime_answers_failed_total", model="mlp", reason="unmade") == 1
    assert value(after, "nv_inference_request_failure", model="mlp") == 0


def test_triton_invariants_hold_with_an_answer_failed(server: RunningServer) -> None:
    assert infer_mlp(server, 1) == 200
    assert infer_mlp(server, 64) == 400
    stats = triton_stats(server)
    inference = stats["inference_stats"]
    assert inference["success"]["count"] == 2
    assert inference["fail"]["count"] == 0
    for field in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inference[field]["count"] == inference["success"]["count"]
    batches = stats["batch_stats"]
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches) == 65
    assert stats["inference_count"] == 65
    assert stats["execution_count"] == sum(b["compute_infer"]["count"] for b in batches)
    (variant,) = stats["duetime"]["variants"]
    assert variant["answers_failed"] == {"unmade": 1}


def test_the_scheduler_counts_an_answer_failed_apart() -> None:
    """Its counts only ever grow: the answer failed moves `answers_failed` and nothing else."""

    async def body() -> None:
        h = harness()
        future = h.submit()
        h.executor.finish(0)
        await future
        before = h.scheduler.statistics()
        h.scheduler.answer_failed()
        h.scheduler.answer_failed("held_late")
        after = h.scheduler.statistics()
        assert after.answers_failed == {"unmade": 1, "held_late": 1}
        assert after.succeeded == before.succeeded == 1
        assert (after.on_time, after.failed, after.fail_ns) == (1, 0, 0)
        assert after.request_time == before.request_time

    run(body)
