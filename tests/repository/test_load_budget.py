"""A model's load keeps to its profiling budget whatever its max_batch_size: the buckets are
measured in rising order while the budget lasts, the larger ones estimated from the measured
cost per row, and the largest batch warmed up once (not at all where one run of it would take
far longer than the budget). Found by a tester (repro_mbs_load_cost): every bucket up to the
max was run at least 5 times and the max batch 3 times per instance, so the demo resnet took
~4 s to load at max_batch_size 32, 29 s at 512, and 65536 (accepted) about an hour."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper

from duetime.repository import loader
from duetime.repository.layout import scan_model
from duetime.repository.loader import (
    PROFILE_MIN_ROWS,
    LoadedModel,
    load_version,
    measure_profile,
    warm_up_largest,
)
from duetime.scheduling.profile import LatencyProfile, ProfilePoint, batch_buckets
from duetime.types import ModelSignature, TensorSpec

pytestmark = pytest.mark.timeout(60)

MS = 1_000_000


class RowTimedExecutor:
    """Stands in for an Executor: each run takes `row_ns` a row on a fake clock (`now`), and is
    recorded as (instance, rows)."""

    def __init__(self, instances: int = 1, row_ns: int = MS) -> None:
        self.instances = instances
        self.row_ns = row_ns
        self.now = 0
        self.runs: list[tuple[int, int]] = []

    def run_sync(self, feeds: dict[str, np.ndarray], instance: int = 0) -> list[np.ndarray]:
        rows = len(feeds["x"])
        self.runs.append((instance, rows))
        self.now += rows * self.row_ns
        return [feeds["x"]]


def signature(max_batch_size: int) -> ModelSignature:
    spec = TensorSpec("x", "FP32", (-1, 4))
    return ModelSignature((spec,), (TensorSpec("y", "FP32", (-1, 4)),), max_batch_size)


def profiled(
    monkeypatch: pytest.MonkeyPatch, max_batch_size: int, budget_s: float = 1.0
) -> tuple[LatencyProfile, RowTimedExecutor]:
    executor = RowTimedExecutor()
    monkeypatch.setattr(loader, "time", SimpleNamespace(perf_counter_ns=lambda: executor.now))
    profile = measure_profile(
        executor,  # type: ignore[arg-type]
        signature(max_batch_size),
        Path("model.onnx"),
        budget_s,
    )
    return profile, executor


@pytest.mark.parametrize("max_batch_size", [32, 256, 65536])
def test_profiling_takes_its_budget_whatever_the_max_batch(
    monkeypatch: pytest.MonkeyPatch, max_batch_size: int
) -> None:
    """1 ms a row, a budget of 1 s: with every bucket run once, then at least 5 times more,
    profiling took 1.2 s at 32, 5.6 s at 256, and hours at 65536."""
    _, executor = profiled(monkeypatch, max_batch_size)
    assert executor.now <= 1_000 * MS


def test_buckets_past_the_budget_are_estimated_at_the_measured_cost_per_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    profile, executor = profiled(monkeypatch, 65536)
    buckets = batch_buckets(65536)
    run = sorted({rows for _, rows in executor.runs})
    assert run == list(buckets[: len(run)])  # (in rising order, from the smallest)
    assert {b for b in buckets if b <= PROFILE_MIN_ROWS} <= set(run)
    assert profile.estimated == frozenset(buckets[len(run) :])
    assert 65536 in profile.estimated
    assert profile.buckets == buckets
    assert profile.predict(65536) == pytest.approx(65536 * MS, rel=0.01)


def test_buckets_up_to_4_rows_run_once_though_one_row_takes_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    profile, executor = profiled(monkeypatch, 32, budget_s=0.001)  # (a row: 1 ms)
    assert executor.runs == [(0, 1), (0, 2), (0, 3), (0, 4)]  # (no room for another run)
    assert profile.predict(4) == 4 * MS
    assert profile.predict(32) == 32 * MS
    assert profile.estimated == frozenset(b for b in batch_buckets(32) if b > 4)


def a_profile(max_rows: int, row_ns: int, estimated: bool) -> LatencyProfile:
    points = [ProfilePoint(1, row_ns, row_ns), ProfilePoint(max_rows, max_rows * row_ns, 0)]
    profile = LatencyProfile(points)
    profile.estimated = frozenset({max_rows} if estimated else ())
    return profile


@pytest.mark.parametrize(("estimated", "instances_run"), [(False, [1, 2]), (True, [0, 1, 2])])
def test_the_largest_batch_is_warmed_up_once_on_each_instance_profiling_did_not_run_it(
    estimated: bool, instances_run: list[int]
) -> None:
    executor = RowTimedExecutor(instances=3)
    profile = a_profile(64, 10_000, estimated)
    warm_up_largest(executor, signature(64), profile, Path("m.onnx"), 1.0)  # type: ignore[arg-type]
    assert executor.runs == [(instance, 64) for instance in instances_run]


def test_a_largest_batch_far_over_the_budget_is_not_warmed_up_and_the_log_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    executor = RowTimedExecutor(instances=2)
    profile = a_profile(65536, MS, estimated=True)  # (65 s a run)
    with caplog.at_level(logging.INFO, logger="duetime.loader"):
        warm_up_largest(executor, signature(65536), profile, Path("m.onnx"), 1.0)  # type: ignore[arg-type]
    assert executor.runs == []
    assert "m.onnx: not warmed up at its largest batch (65536 rows, 65.5 s a run" in caplog.text


def test_a_model_of_max_batch_size_65536_loads_and_runs_its_largest_batch(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    """Its larger buckets estimated (a budget of 0.1 ms), not run at load; a batch of the max
    then runs when it comes (ONNX Runtime allocates then)."""
    graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (tmp_path / "m" / "config.toml").write_text("max_batch_size = 65536\n")
    served = load_version(scan_model(tmp_path / "m"), 1, profile_budget_s=0.0001)
    loaded.append(served)
    assert 65536 in served.profile.estimated
    x = np.arange(65536 * 4, dtype=np.float32).reshape(65536, 4)
    (y,) = served.executor.run_sync({"x": x})
    assert np.array_equal(y, -x)
