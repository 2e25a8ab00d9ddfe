"""`duetime_batch_size` keeps the same bucket bounds whatever sizes ran (Prometheus histograms
need fixed bounds per series)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from conftest import start_server, stop_server
from prometheus_client.parser import text_string_to_metric_families

from duetime.config import ServerSettings


def batch_size_buckets(metrics_port: int) -> dict[float, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    return {
        float(sample.labels["le"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "duetime_batch_size"
        for sample in family.samples
        if sample.name.endswith("_bucket") and sample.labels["model"] == "mlp"
    }


def test_batch_size_bounds_do_not_change_with_the_sizes_run(mlp_repo: Path) -> None:
    settings = ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0, metrics_port=0)
    running, thread = start_server(settings)
    try:
        port = running.addresses.metrics_port
        assert port is not None
        before = batch_size_buckets(port)
        tensor = {"name": "x", "datatype": "FP32", "shape": [5, 40], "data": [0.0] * 200}
        body = {"inputs": [tensor]}
        request = urllib.request.Request(
            f"http://{running.http}/v2/models/mlp/infer", data=json.dumps(body).encode(),
            method="POST", headers={"Content-Type": "application/json"},
        )  # fmt: skip
        urllib.request.urlopen(request).read()
        after = batch_size_buckets(port)
    finally:
        stop_server(running, thread)
    assert sorted(after) == sorted(before)
    assert 5.0 not in after, "5 is not one of mlp's batch buckets"
    assert set(before.values()) == {0.0}
    # (counted in the first bound at or above 5, and every bound above it)
    first = min(bound for bound in after if bound >= 5)
    assert after == {bound: 1.0 if bound >= first else 0.0 for bound in before}


def infer_rows(http: str, rows: int) -> None:
    tensor = {"name": "x", "datatype": "FP32", "shape": [rows, 40], "data": [0.0] * rows * 40}
    request = urllib.request.Request(
        f"http://{http}/v2/models/mlp/infer", data=json.dumps({"inputs": [tensor]}).encode(),
        method="POST", headers={"Content-Type": "application/json"},
    )  # fmt: skip
    urllib.request.urlopen(request, timeout=30).read()


def load_with(http: str, max_batch_size: int) -> None:
    config = json.dumps({"max_batch_size": max_batch_size})
    request = urllib.request.Request(
        f"http://{http}/v2/repository/models/mlp/load",
        data=json.dumps({"parameters": {"config": config}}).encode(), method="POST",
    )  # fmt: skip
    urllib.request.urlopen(request, timeout=60).read()


def test_a_reload_that_changes_the_bounds_starts_the_histogram_from_0(mlp_repo: Path) -> None:
    """Its counts summed the replaced version's, whatever their bounds (found by a tester):
    after a reload from max_batch_size 64 to 8, le="6" kept them and le="12"... were gone; and
    back at 64, those came back with every old count in their first sample."""
    settings = ServerSettings(
        model_repository=mlp_repo, http_port=0, grpc_port=0, metrics_port=0,
        model_control_mode="explicit", load_model=("mlp",),
    )  # fmt: skip
    running, thread = start_server(settings)
    try:
        port = running.addresses.metrics_port
        assert port is not None
        for _ in range(3):
            infer_rows(running.http, 5)
        wide = batch_size_buckets(port)
        load_with(running.http, 8)
        narrow = batch_size_buckets(port)
        infer_rows(running.http, 5)
        narrow_after = batch_size_buckets(port)
        load_with(running.http, 64)
        wide_again = batch_size_buckets(port)
    finally:
        stop_server(running, thread)
    assert wide[64.0] == wide[float("inf")] == 3.0
    assert max(narrow.keys() - {float("inf")}) == 8.0
    assert set(narrow.values()) == {0.0}, narrow
    assert narrow_after == {bound: 1.0 if bound >= 5 else 0.0 for bound in narrow}
    assert sorted(wide_again) == sorted(wide)
    assert set(wide_again.values()) == {0.0}, wide_again
