"""An output's fixed dim that the warm-up run does not make (an export traced at batch 2 declaring
y [2, 3] while y follows the input's N) is served free (-1), with a warning: its metadata said
[2, 3] while a 5-row request was answered [5, 3], without a word at load (found by a tester).
A fixed dim the run does make is real, and kept."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from duetime.config import VariantConfig
from duetime.repository.layout import MODEL_FILENAME, scan_model
from duetime.repository.loader import LoadedModel, load_version

pytestmark = pytest.mark.timeout(120)

FLOAT = TensorProto.FLOAT


def model_of(node: onnx.NodeProto, output_shape: list[int | str]) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", FLOAT, output_shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


TRACED = model_of(helper.make_node("Relu", ["x"], ["y"]), [2, 3])


def load(
    tmp_path: Path, model: onnx.ModelProto, loaded: list[LoadedModel], **kwargs: object
) -> LoadedModel:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    if not (folder / "1" / MODEL_FILENAME).exists():
        onnx.save(model, str(folder / "1" / MODEL_FILENAME))
    result = load_version(scan_model(folder), 1, profile_budget_s=0.01, **kwargs)  # type: ignore[arg-type]
    loaded.append(result)
    return result


def test_a_traced_output_dim_the_run_does_not_make_is_served_free(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="duetime.loader"):
        model = load(tmp_path, TRACED, loaded)
    assert model.signature.outputs[0].shape == (-1, 3)
    assert "output 'y' is declared [2, 3] by the graph" in caplog.text
    assert "served as [-1, 3]" in caplog.text


def test_a_fixed_output_dim_the_run_makes_is_kept(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    summed = model_of(helper.make_node("ReduceSum", ["x"], ["y"], keepdims=1), [1, 1])
    with caplog.at_level(logging.WARNING, logger="duetime.loader"):
        model = load(tmp_path, summed, loaded)
    assert model.signature.outputs[0].shape == (1, 1)
    assert "output 'y' is declared" not in caplog.text  # (its dims are the graph's)
    assert "but output 'y' has shape [1, 1]; served unbatched" in caplog.text


def test_a_variant_of_a_model_with_a_traced_dim_gives_what_it_does(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    primary = load(tmp_path, TRACED, loaded)
    onnx.save(TRACED, str(tmp_path / "m" / "1" / "model.copy.onnx"))
    variant = VariantConfig(name="copy", file="model.copy.onnx")
    model = load(tmp_path, TRACED, loaded, variant=variant, primary=primary.signature)
    assert model.signature.outputs == primary.signature.outputs
