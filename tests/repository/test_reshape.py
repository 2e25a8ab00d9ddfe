"""A config's `reshape` (Triton's): requests and answers carry the config's `dims`, the graph
takes and gives the reshape."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from duetime.engine import Engine
from duetime.errors import ConfigError, InvalidInput
from duetime.frontend.codec import Expected
from duetime.frontend.metadata import model_config_json, model_metadata_json
from duetime.repository.layout import scan_model
from duetime.repository.loader import load_version
from tests.repo_models import run_on_engine

SCALAR = """platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
"""


def _model(repo: Path, graph_shape: list[int | str], config: str, name: str = "m") -> Path:
    """y = x + 1 on a graph of `graph_shape`, with `config` as its config.pbtxt."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, graph_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, graph_shape)],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (repo / name / "config.pbtxt").write_text(config)
    return repo / name


def test_dims_1_reshape_empty_takes_and_answers_batch_by_1(tmp_path: Path) -> None:
    """Triton's form of a tensor without dims beyond the batch: requests carry [batch, 1] and
    get [batch, 1] back (model_configuration.md "Reshape"). [3, 1] was refused ("does not match
    the model's [-1]") and only [3] was taken, while the config endpoint said dims [1]. [3], as
    duetime's clients send it, is taken too (see test_tensors_without_dims), answered [3, 1]."""
    _model(tmp_path, ["n"], SCALAR)

    async def scenario(engine: Engine) -> None:
        x = np.array([[1.0], [2.0], [3.0]], np.float32)
        for given in (x, x.ravel()):
            y = (await engine.infer_async("m", {"x": given}))["y"]
            assert (y.shape, y.ravel().tolist()) == ((3, 1), [2.0, 3.0, 4.0])
        with pytest.raises(InvalidInput, match=r"Expected \[-1,1\] or \[-1\], got "
                           r"\[3,2\]"):  # fmt: skip
            await engine.infer_async("m", {"x": np.ones((3, 2), np.float32)})

    run_on_engine(tmp_path, scenario)


def test_metadata_and_the_config_endpoint_say_what_requests_carry(tmp_path: Path) -> None:
    loaded = load_version(scan_model(_model(tmp_path, ["n"], SCALAR)), 1)
    try:
        metadata = model_metadata_json(loaded, ["1"])
        config = model_config_json(loaded)
        expected = Expected("m", loaded.signature, ("m", "1"), {})
        expected.input("x", "FP32", (3, 1))  # (the front ends' check before decoding)
        with pytest.raises(InvalidInput, match="unexpected shape for input"):
            expected.input("x", "FP32", (3, 2))
    finally:
        loaded.executor.close()
    assert [t["shape"] for t in metadata["inputs"] + metadata["outputs"]] == [[-1, 1], [-1, 1]]
    for tensor in config["input"] + config["output"]:
        assert (tensor["dims"], tensor["reshape"]) == ([1], {"shape": []})


def test_any_reshape_of_as_many_elements_is_served_both_ways(tmp_path: Path) -> None:
    scalar = "dims: [ 1 ] reshape: { shape: [ ] }"
    _model(tmp_path, ["n", 6], SCALAR.replace(scalar, "dims: [ 2, 3 ] reshape: { shape: [ 6 ] }"))

    async def scenario(engine: Engine) -> None:
        x = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
        y = (await engine.infer_async("m", {"x": x}))["y"]
        assert y.shape == (2, 2, 3)
        assert np.array_equal(y, x + 1)

    run_on_engine(tmp_path, scenario)


def test_a_model_that_does_not_batch_takes_dims_for_its_scalar(tmp_path: Path) -> None:
    config = SCALAR.replace("max_batch_size: 8", "max_batch_size: 0")
    _model(tmp_path, [], config)

    async def scenario(engine: Engine) -> None:
        y = (await engine.infer_async("m", {"x": np.array([4.0], np.float32)}))["y"]
        assert (y.shape, y.tolist()) == ((1,), [5.0])

    run_on_engine(tmp_path, scenario)


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        ("dims: [ 4 ] reshape: { shape: [ 3 ] }",
         "field 'input[0]': Value error, dims [4] and reshape [3] hold different numbers"),
        ("dims: [ -1 ] reshape: { shape: [ -1 ] }",
         "field 'input[0]': Value error, dims [-1] with reshape [-1]: dims must be 1 or more"),
        ("reshape: { shape: [ 2 ] }", "field 'input[0]': Value error, a reshape needs dims"),
        ("dims: [ 2, 3 ] reshape: { shape: [ 3, 2 ] }",
         "field 'inputs.0.reshape': [3, 2] does not fit the graph's [6]"),
    ],
)  # fmt: skip
def test_a_reshape_that_cannot_be_served_is_refused_naming_it(
    tmp_path: Path, tensor: str, message: str
) -> None:
    config = f'max_batch_size: 8\ninput [ {{ name: "x" data_type: TYPE_FP32 {tensor} }} ]\n'
    folder = _model(tmp_path, ["n", 6], config)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_version(scan_model(folder), 1).executor.close()
