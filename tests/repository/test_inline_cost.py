"""`execution = "auto"` never runs inline a model whose cost follows its inputs' values or free
non-batch dims, however short its load-time profile (the testers' Loop froze the server for
seconds, liveness included); the loader tells the scheduler so (`cost_depends_on_values`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from duetime.repository import loader
from duetime.repository.graphs import graph_facts
from duetime.repository.layout import MODEL_FILENAME, scan_model
from duetime.repository.loader import LoadedModel, load_version, runs_inline
from duetime.scheduling.profile import LatencyProfile, ProfilePoint

pytestmark = pytest.mark.timeout(120)

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def finished(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def loop_model() -> onnx.ModelProto:
    """y = x + n, by n trips of a Loop (n INT64 [1] from the request)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "one"], ["acc_out"])], "body",
        [helper.make_tensor_value_info("i", INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", FLOAT, [1])],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")],
    )  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["n", "scalar"], ["trips"]),
         helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body)], "loop",
        [helper.make_tensor_value_info("n", INT64, [1]),
         helper.make_tensor_value_info("x", FLOAT, [1])],
        [helper.make_tensor_value_info("y", FLOAT, [1])],
        [numpy_helper.from_array(np.zeros(0, np.int64), "scalar")],
    )  # fmt: skip
    return finished(graph)


def expand_model() -> onnx.ModelProto:
    """y = ones of the shape the request gives (INT64 [2])."""
    graph = helper.make_graph(
        [helper.make_node("Expand", ["one", "shape"], ["y"])], "expand",
        [helper.make_tensor_value_info("shape", INT64, [2])],
        [helper.make_tensor_value_info("y", FLOAT, ["a", "b"])],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")],
    )  # fmt: skip
    return finished(graph)


def square_model() -> onnx.ModelProto:
    """y = x @ x for x FP32 [n, n]: a free dim that is no batch's."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "x"], ["y"])], "square",
        [helper.make_tensor_value_info("x", FLOAT, ["n", "n"])],
        [helper.make_tensor_value_info("y", FLOAT, ["n", "n"])],
    )  # fmt: skip
    return finished(graph)


def scaled_model() -> onnx.ModelProto:
    """y = 2x for x FP32 [N, 4]: its cost follows its rows only."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])], "scaled",
        [helper.make_tensor_value_info("x", FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.array(2, np.float32), "two")],
    )  # fmt: skip
    return finished(graph)


FAST = LatencyProfile([ProfilePoint(1, 5_000, 5_000), ProfilePoint(32, 20_000, 20_000)])


@pytest.mark.parametrize(
    ("build", "varies"),
    [(loop_model, True), (expand_model, True), (square_model, True), (scaled_model, False)],
)
def test_auto_runs_inline_only_a_model_whose_cost_follows_its_rows_alone(
    tmp_path: Path,
    loaded: list[LoadedModel],
    monkeypatch: pytest.MonkeyPatch,
    build: Callable[[], onnx.ModelProto],
    varies: bool,
) -> None:
    # (a fixed, fast profile: the one measured on the samples is tiny, a Loop of 0 trips)
    monkeypatch.setattr(loader, "measure_profile", lambda *args, **kwargs: FAST)
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    onnx.save(build(), str(folder / "1" / MODEL_FILENAME))
    model = load_version(scan_model(folder), 1)
    loaded.append(model)
    assert model.cost_depends_on_values is varies
    assert model.executor.inline is not varies


@pytest.mark.parametrize(
    ("points_ns", "inline"),
    [
        # (a stretch of load while its largest batch was profiled: 2.3 ms, 220 µs at half)
        (((1, 40_000), (16, 220_000), (32, 2_300_000)), True),
        (((1, 150_000), (32, 300_000)), True),  # batch 1 over its bound, as busy
        (((1, 40_000), (32, 2_600_000)), False),  # over 5x the bound: not checked again
        (((1, 600_000), (32, 900_000)), False),
        # one run of the largest batch preempted for 8 ms: its p99, not its median
        (((1, 6_000, 8_600), (32, 45_000, 8_078_000)), True),
    ],
)
def test_a_profile_just_over_the_inline_bounds_is_checked_by_the_fastest_runs(
    tmp_path: Path,
    loaded: list[LoadedModel],
    monkeypatch: pytest.MonkeyPatch,
    points_ns: tuple[tuple[int, ...], ...],
    inline: bool,
) -> None:
    """A tiny model (2x, a few µs a run) whose profile, taken while the machine was busy, reads
    just over the bounds runs inline all the same: its fastest runs are within them. (Points:
    rows, median and p99, the median where no p99 is given.)"""
    profile = LatencyProfile([ProfilePoint(p[0], p[1], p[-1]) for p in points_ns])
    monkeypatch.setattr(loader, "measure_profile", lambda *args, **kwargs: profile)
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    onnx.save(scaled_model(), str(folder / "1" / MODEL_FILENAME))
    (folder / "config.toml").write_text("max_batch_size = 32\n")
    model = load_version(scan_model(folder), 1)
    loaded.append(model)
    assert not runs_inline(profile, 1)
    assert model.executor.inline is inline


def test_runs_inline_refuses_a_model_whose_cost_varies_however_fast_its_profile() -> None:
    assert runs_inline(FAST, 1)
    assert not runs_inline(FAST, 1, cost_varies=True)


def test_a_scan_over_a_fixed_body_costs_what_its_input_size_does() -> None:
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "row"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["row_out"])], "body",
        [helper.make_tensor_value_info("acc", FLOAT, [3]),
         helper.make_tensor_value_info("row", FLOAT, [3])],
        [helper.make_tensor_value_info("acc_out", FLOAT, [3]),
         helper.make_tensor_value_info("row_out", FLOAT, [3])],
    )  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Scan", ["init", "x"], ["total", "ys"], body=body,
                          num_scan_inputs=1)], "scan",
        [helper.make_tensor_value_info("init", FLOAT, [3]),
         helper.make_tensor_value_info("x", FLOAT, ["T", 3])],
        [helper.make_tensor_value_info("total", FLOAT, [3]),
         helper.make_tensor_value_info("ys", FLOAT, ["T", 3])],
    )  # fmt: skip
    assert not graph_facts(finished(graph)).cost_depends_on_values


def test_a_string_input_makes_the_cost_follow_the_values() -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["y"])], "strings",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, ["N"])],
    )  # fmt: skip
    facts = graph_facts(finished(graph))
    assert facts.cost_depends_on_values
    assert "text" in facts.cost_why
