"""A graph quantized dynamically takes one activation scale over its whole input tensor, so a
batch's rows change each other's answers: its requests never share a run. Unbatched by default;
batched as a config (or a batching primary, for an int8-dynamic variant) asks, each request then
run on its own rows, as ONNX Runtime alone runs it.

NOTE: such a model was batched (its rows compared within 20% on N(0, 1) samples): an ordinary
row batched with rows 1000 times larger came back [0, 0, 0, 0] where ORT gives
[-9.64, -8.19, 11.37, 9.99] (found by a tester)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from duetime.config import VariantConfig
from duetime.execution.executor import BatchJob
from duetime.repository.layout import MODEL_FILENAME, scan_model
from duetime.repository.loader import LoadedModel, load_version

pytestmark = pytest.mark.timeout(120)

FLOAT = TensorProto.FLOAT
INT8_FILE = "model.int8.onnx"


def mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])],
        "mlp",
        [helper.make_tensor_value_info("x", FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", FLOAT, ["N", 4])],
        [numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1"),
         numpy_helper.from_array(rng.standard_normal((32, 4)).astype(np.float32), "w2")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def scaled_quantizer() -> onnx.ModelProto:
    """int8 activations by a QuantizeLinear whose scale is the whole tensor's largest |x|
    (a ReduceMax over all axes), as static-looking exports of dynamic quantization do."""
    graph = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["a"]),
         helper.make_node("ReduceMax", ["a"], ["top"], keepdims=0),
         helper.make_node("Div", ["top", "levels"], ["scale"]),
         helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"])],
        "q",
        [helper.make_tensor_value_info("x", FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", FLOAT, ["N", 8])],
        [numpy_helper.from_array(np.array(127, np.float32), "levels"),
         numpy_helper.from_array(np.array(0, np.int8), "zero")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def write(root: Path, config: str = "") -> Path:
    """A model folder whose version 1 has the fp32 mlp and its int8-dynamic copy."""
    folder = root / "m"
    (folder / "1").mkdir(parents=True)
    fp32 = folder / "1" / MODEL_FILENAME
    onnx.save(mlp(), str(fp32))
    quantize_dynamic(str(fp32), str(fp32.with_name(INT8_FILE)), weight_type=QuantType.QInt8)
    if config:
        (folder / "config.toml").write_text(config)
    return folder


def load(folder: Path, loaded: list[LoadedModel], **kwargs: object) -> LoadedModel:
    model = load_version(scan_model(folder), 1, profile_budget_s=0.01, **kwargs)  # type: ignore[arg-type]
    loaded.append(model)
    return model


def ordinary_and_large() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    ordinary = rng.standard_normal((1, 16)).astype(np.float32)
    large = (rng.standard_normal((1, 16)) * 1000).astype(np.float32)
    two = rng.standard_normal((2, 16)).astype(np.float32)  # (a request's own rows share a scale)
    return [ordinary, large, two]


def assert_each_as_ort_alone(model: LoadedModel, path: Path) -> None:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = ordinary_and_large()
    job = BatchJob([{"x": f} for f in feeds], [len(f) for f in feeds], 4, lambda _: None)
    outputs = model.executor.run_now(0, job).outputs
    for got, f in zip(outputs, feeds, strict=True):
        assert isinstance(got, dict)
        np.testing.assert_array_equal(got["y"], session.run(["y"], {"x": f})[0])


def test_a_dynamically_quantized_model_is_served_unbatched(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    folder = write(tmp_path)
    (folder / "1" / MODEL_FILENAME).unlink()
    (folder / "1" / INT8_FILE).rename(folder / "1" / MODEL_FILENAME)
    with caplog.at_level(logging.WARNING, logger="duetime.loader"):
        model = load(folder, loaded)
    assert model.signature.max_batch_size == 0
    assert "quantized dynamically" in caplog.text
    assert "served unbatched" in caplog.text


def test_batched_as_its_config_asks_each_request_runs_alone(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    folder = write(tmp_path, "max_batch_size = 8\n")
    (folder / "1" / MODEL_FILENAME).unlink()
    (folder / "1" / INT8_FILE).rename(folder / "1" / MODEL_FILENAME)
    model = load(folder, loaded)
    assert model.signature.max_batch_size == 8
    assert model.executor.splits_batches
    assert "quantized dynamically" in caplog.text
    assert "each request runs on its own" in caplog.text
    assert_each_as_ort_alone(model, folder / "1" / MODEL_FILENAME)


def test_an_int8_dynamic_variant_of_a_batching_model_runs_each_request_alone(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    """The copy `duetime optimize` writes batches as its primary (max_batch_size 32) does."""
    folder = write(tmp_path)
    primary = load(folder, loaded)
    assert primary.signature.max_batch_size > 0
    assert not primary.executor.splits_batches
    variant = VariantConfig(name="int8", file=INT8_FILE, kind="int8-dynamic")
    model = load(folder, loaded, variant=variant, primary=primary.signature)
    assert model.signature.max_batch_size == primary.signature.max_batch_size
    assert model.executor.splits_batches
    assert_each_as_ort_alone(model, folder / "1" / INT8_FILE)


def test_a_quantizer_scaled_by_the_whole_tensor_is_not_batched(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    onnx.save(scaled_quantizer(), str(folder / "1" / MODEL_FILENAME))
    assert load(folder, loaded).signature.max_batch_size == 0


def test_a_whole_tensor_reduction_feeding_a_division_is_not_batched(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    graph = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["a"]),
         helper.make_node("ReduceMax", ["a"], ["top"], keepdims=0),
         helper.make_node("Div", ["x", "top"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", FLOAT, ["N", 8])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    onnx.save(model, str(folder / "1" / MODEL_FILENAME))
    assert load(folder, loaded).signature.max_batch_size == 0
    assert "its rows are not independent" in caplog.text


def test_a_variant_whose_rows_interact_runs_each_request_alone(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    """A variant batches as its primary does; one whose rows mix was batched 'as its config
    asks' (none did), and its answers took other requests' rows (found by a tester)."""
    folder = write(tmp_path)
    onnx.save(scaled_quantizer_of_mlp_shape(), str(folder / "1" / "model.mixed.onnx"))
    primary = load(folder, loaded)
    assert primary.signature.max_batch_size > 0
    variant = VariantConfig(name="mixed", file="model.mixed.onnx")
    with caplog.at_level(logging.WARNING, logger="duetime.loader"):
        model = load(folder, loaded, variant=variant, primary=primary.signature)
    assert model.signature.max_batch_size == primary.signature.max_batch_size
    assert model.executor.splits_batches
    (said,) = [r.getMessage() for r in caplog.records if "variant 'mixed'" in r.getMessage()]
    assert "(model.mixed.onnx)" in said
    assert said.endswith("batched anyway, as its primary is, but each request runs on its own")
    assert_each_as_ort_alone(model, folder / "1" / "model.mixed.onnx")


def scaled_quantizer_of_mlp_shape() -> onnx.ModelProto:
    """`mlp`'s signature, x [N, 16] -> y [N, 4], its output scaled by the whole batch's largest
    |x| (no quantizer node: the graph study does not flag it, the sample runs do)."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Abs", ["x"], ["a"]),
         helper.make_node("ReduceMax", ["a"], ["top"], keepdims=0),
         helper.make_node("Div", ["h", "top"], ["y"])],
        "mixed",
        [helper.make_tensor_value_info("x", FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", FLOAT, ["N", 4])],
        [numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
