"""Warm-up and profiling take non-zero integer samples where zeros fail (a model dividing by an
input): such a model was profiled at a made-up 1 ms a row and run on a thread, and an idle ~20 µs
model refused requests due in 1.5 ms (found by a tester)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from duetime.repository.layout import MODEL_FILENAME, scan_model
from duetime.repository.loader import LoadedModel, load_version, warm_up
from duetime.types import ModelSignature, TensorSpec

pytestmark = pytest.mark.timeout(120)


def ratio_model() -> onnx.ModelProto:
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Div", ["amount", "count"], ["ratio"])],
        "g",
        [info("amount", TensorProto.INT64, ["N", 1]), info("count", TensorProto.INT64, ["N", 1])],
        [info("ratio", TensorProto.INT64, ["N", 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_model_dividing_by_an_input_is_warmed_up_and_profiled(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "ratio"
    (folder / "1").mkdir(parents=True)
    onnx.save(ratio_model(), str(folder / "1" / MODEL_FILENAME))
    with caplog.at_level(logging.INFO, logger="duetime.loader"):
        model = load_version(scan_model(folder), 1, profile_budget_s=0.01)
    loaded.append(model)
    assert not model.profile.guessed
    assert "on sample inputs failed" not in caplog.text
    assert "ran on distinct samples" in caplog.text


class _ZeroShy:
    """Stands in for an Executor: refuses a zero integer, as a Div by it does (or any input)."""

    instances = 1

    def __init__(self) -> None:
        self.fed: list[int] = []
        self.refuse_all = False

    def run_sync(self, feeds: dict[str, np.ndarray], instance: int = 0) -> list[np.ndarray]:
        self.fed.append(int(feeds["n"].min()))
        if self.refuse_all or not feeds["n"].all():
            raise RuntimeError("Integer division by zero")
        return [feeds["n"]]


def test_warm_up_tries_non_zero_samples_where_zeros_fail(tmp_path: Path) -> None:
    signature = ModelSignature((TensorSpec("n", "INT32", (-1, 2)),), (), max_batch_size=4)
    executor = _ZeroShy()
    produced, fill, free = warm_up(executor, signature, tmp_path / "m.onnx", runs=2)  # type: ignore[arg-type]
    assert (fill, free) == ("distinct", 1)
    assert produced is not None
    assert produced[0].all()
    assert executor.fed[0] == 0
    assert len(executor.fed) == 3


def test_a_float_model_failing_warm_up_is_not_run_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Other samples differ in integers, booleans and strings alone: nothing more to try."""
    signature = ModelSignature((TensorSpec("n", "FP32", (-1, 2)),), (), max_batch_size=4)
    executor = _ZeroShy()
    executor.refuse_all = True
    with caplog.at_level(logging.WARNING, logger="duetime.loader"):
        produced, fill, _ = warm_up(executor, signature, tmp_path / "m.onnx")  # type: ignore[arg-type]
    assert produced is None
    assert fill == "zeros"
    assert len(executor.fed) == 1
    assert "warm-up on sample inputs failed (Integer division by zero)" in caplog.text


def conv_model(kernel: int) -> onnx.ModelProto:
    """An image model over free height and width: a Conv of `kernel` x `kernel`, no padding."""
    info = helper.make_tensor_value_info
    weights = helper.make_tensor(
        "w", TensorProto.FLOAT, [2, 3, kernel, kernel], [0.5] * (6 * kernel * kernel)
    )
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        "g",
        [info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [info("y", TensorProto.FLOAT, ["N", 2, "h", "w"])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_free_dims_too_small_for_the_graph_are_sampled_bigger(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    """A 3x3 kernel needs 3 pixels at least: warm-up and profiling take the free dims the
    batching check takes, 8 where 1 fails (they stopped at 1: profiled at a made-up 1 ms a
    row, requests the model answers in microseconds were refused 429, found by a tester)."""
    folder = tmp_path / "conv"
    (folder / "1").mkdir(parents=True)
    onnx.save(conv_model(3), str(folder / "1" / MODEL_FILENAME))
    with caplog.at_level(logging.INFO, logger="duetime.loader"):
        model = load_version(scan_model(folder), 1, profile_budget_s=0.01)
    loaded.append(model)
    assert model.signature.max_batch_size > 0
    assert not model.profile.guessed
    assert model.sample_free == 8
    assert "on sample inputs failed" not in caplog.text
    assert "with free dims of 8, as smaller ones failed" in caplog.text
    assert model.profile.predict(1) < 1_000_000  # (not the made-up 1 ms)


def test_free_dims_a_graph_takes_at_1_stay_1(tmp_path: Path, loaded: list[LoadedModel]) -> None:
    folder = tmp_path / "conv"
    (folder / "1").mkdir(parents=True)
    onnx.save(conv_model(1), str(folder / "1" / MODEL_FILENAME))
    model = load_version(scan_model(folder), 1, profile_budget_s=0.01)
    loaded.append(model)
    assert (model.sample_free, model.profile.guessed) == (1, False)
