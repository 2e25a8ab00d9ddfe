"""Optional inputs: graph inputs that also have an initializer (ONNX Runtime's overridable
initializers, Triton's `optional: true`), from the graph through the config to a run."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from repo_models import WIDTH, heavy_model, inputs, scale_model, write_version

from duetime import Engine
from duetime.errors import ConfigError, DeadlineExceeded, InvalidInput, Overloaded
from duetime.execution.executor import BatchJob, BatchResult, InputPool
from duetime.frontend.metadata import model_config_json, model_metadata_json
from duetime.frontend.v1 import v1_inputs
from duetime.repository.layout import scan_model
from duetime.repository.loader import LoadedModel, load_version
from duetime.repository.tritonconfig import translate_json
from duetime.tools.optimize.samples import random_samples
from duetime.tools.payloads import random_inputs
from duetime.tools.transports import signature_from_metadata
from duetime.types import ModelSignature, TensorSpec

PROFILE_S = 0.05


def save(folder: Path, nodes: list[object], inputs: list[object], outputs: list[object],
         initializers: list[object], config: tuple[str, str] | None = None) -> Path:  # fmt: skip
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(model.SerializeToString())
    if config is not None:
        (folder / config[0]).write_text(config[1], encoding="utf-8")
    return folder


def add_model(folder: Path, config: tuple[str, str] | None = None) -> Path:
    """Triton's `initializer_as_input` test model: OUTPUT = INPUT + INITIALIZER (ones)."""
    value = helper.make_tensor_value_info
    return save(
        folder,
        [helper.make_node("Add", ["INPUT", "INITIALIZER"], ["OUTPUT"])],
        [
            value("INPUT", TensorProto.FLOAT, [5, 5]),
            value("INITIALIZER", TensorProto.FLOAT, [5, 5]),
        ],
        [value("OUTPUT", TensorProto.FLOAT, [5, 5])],
        [helper.make_tensor("INITIALIZER", TensorProto.FLOAT, [5, 5], np.ones(25))],
        config,
    )


def dense_model(folder: Path, config: tuple[str, str] | None = None) -> Path:
    """y[N, 3] = x[N, 4] @ W + b: a weight listed as an input, as older exporters list every
    weight (W, ones, no batch dim), and a per-row input with a default (b, zeros)."""
    value = helper.make_tensor_value_info
    return save(
        folder,
        [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
        [value("x", TensorProto.FLOAT, ["N", 4]), value("W", TensorProto.FLOAT, [4, 3]),
         value("b", TensorProto.FLOAT, ["N", 3])],
        [value("y", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor("W", TensorProto.FLOAT, [4, 3], np.ones(12)),
         helper.make_tensor("b", TensorProto.FLOAT, [1, 3], np.zeros(3))],
        config,
    )  # fmt: skip


def load(folder: Path, loaded: list[LoadedModel]) -> LoadedModel:
    model = load_version(scan_model(folder), 1, profile_budget_s=PROFILE_S)
    loaded.append(model)
    return model


def run(model: LoadedModel, inputs: dict[str, np.ndarray]) -> np.ndarray:
    prepared = model.validator.prepare(inputs, None)
    return model.executor.run_sync(prepared.feeds)[0]


X = np.zeros((5, 5), np.float32)
SEVENS = np.full((5, 5), 7, np.float32)


def test_an_input_with_an_initializer_is_optional(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    model = load(add_model(tmp_path / "m"), loaded)
    assert model.signature.inputs == (
        TensorSpec("INPUT", "FP32", (5, 5)),
        TensorSpec("INITIALIZER", "FP32", (5, 5), optional=True),
    )
    assert (run(model, {"INPUT": X}) == 1).all()
    assert (run(model, {"INPUT": X, "INITIALIZER": SEVENS}) == 7).all()
    with pytest.raises(InvalidInput, match=r"'INITIALIZER': datatype INT32 does not match"):
        model.validator.prepare({"INPUT": X, "INITIALIZER": SEVENS.astype(np.int32)}, None)
    with pytest.raises(InvalidInput, match=r"unexpected shape for input 'INITIALIZER'.*got \[5\]"):
        model.validator.prepare({"INPUT": X, "INITIALIZER": SEVENS[0]}, None)
    expects = "is missing; model 'm' expects 'INPUT' FP32[5, 5] (optional: 'INITIALIZER' FP32"
    with pytest.raises(InvalidInput, match=re.escape(f"'INPUT' (FP32[5, 5]) {expects}")):
        model.validator.prepare({"INITIALIZER": SEVENS}, None)
    # as Triton's: listed (metadata, config) only where the model's config names it: exporters
    # once listed every weight as a graph input
    assert [t["name"] for t in model_metadata_json(model, ["1"])["inputs"]] == ["INPUT"]
    assert [t["name"] for t in model_config_json(model)["input"]] == ["INPUT"]


def test_a_triton_config_may_list_it_as_optional(tmp_path: Path, loaded: list[LoadedModel]) -> None:
    pbtxt = (
        'name: "m"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [5, 5] },\n'
        '        { name: "INITIALIZER" data_type: TYPE_FP32 dims: [5, 5] optional: true } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [5, 5] } ]\n'
    )
    model = load(add_model(tmp_path / "m", ("config.pbtxt", pbtxt)), loaded)
    assert [spec.optional for spec in model.signature.inputs] == [False, True]
    metadata = model_metadata_json(model, ["1"])
    assert [tensor["name"] for tensor in metadata["inputs"]] == ["INPUT", "INITIALIZER"]
    config = model_config_json(model)
    assert [tensor.get("optional") for tensor in config["input"]] == [None, True]
    settings = translate_json(config, source="m", model_name="m")  # (get the config, load it)
    assert settings["inputs"][1] == {"name": "INITIALIZER", "datatype": "FP32", "dims": [5, 5],
                                     "optional": True}  # fmt: skip
    assert (run(model, {"INPUT": X, "INITIALIZER": SEVENS}) == 7).all()


def test_optional_on_an_input_without_an_initializer_changes_nothing(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    """ONNX Runtime cannot run without such an input: requests must still give it."""
    toml = '[[inputs]]\nname = "INPUT"\noptional = true\n'
    with caplog.at_level(logging.WARNING, logger="duetime.loader"):
        model = load(add_model(tmp_path / "m", ("config.toml", toml)), loaded)
    assert "field 'inputs.0.optional': 'INPUT' has no initializer in the graph" in caplog.text
    assert not model.signature.inputs[0].optional
    with pytest.raises(InvalidInput, match=r"input 'INPUT' \(FP32\[5, 5\]\) is missing"):
        model.validator.prepare({"INITIALIZER": SEVENS}, None)
    toml = '[[outputs]]\nname = "OUTPUT"\noptional = true\n'
    with pytest.raises(ConfigError, match=r"field 'outputs\.0\.optional': only an input can be"):
        load(add_model(tmp_path / "o", ("config.toml", toml)), loaded)


def test_a_batching_model_serves_only_optional_inputs_with_a_batch_dim(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    """A weight (no batch dim) neither stops the model batching nor is served; `b` is, and
    requests giving it are batched only with others giving it (their shape keys say so)."""
    model = load(dense_model(tmp_path / "m"), loaded)
    assert model.signature.max_batch_size == 32
    assert model.signature.inputs == (
        TensorSpec("x", "FP32", (-1, 4)),
        TensorSpec("b", "FP32", (-1, 3), optional=True),
    )
    validator = model.validator
    x = np.ones((2, 4), np.float32)
    b = np.arange(6, dtype=np.float32).reshape(2, 3)
    plain, given = validator.prepare({"x": x}, None), validator.prepare({"x": x, "b": b}, None)
    assert plain.shape_key != given.shape_key
    assert (validator.overrides(plain), validator.overrides(given)) == (False, True)
    with pytest.raises(InvalidInput, match="'b': batch size 1 differs from the other inputs' 2"):
        validator.prepare({"x": x, "b": b[:1]}, None)
    # (the second once the loader gives the validator `left_out_inputs`: see
    # tests/unit/test_left_out_inputs_validation.py)
    weight = r"input 'W' (is not an input of model 'm'|of model 'm': an initializer)"
    with pytest.raises(InvalidInput, match=weight):
        validator.prepare({"x": x, "W": np.ones((4, 3), np.float32)}, None)
    # Two requests giving `b`, batched together and padded to the bucket of 4 rows:
    other = validator.prepare({"x": x[:1], "b": b[:1] + 10}, None)
    assert other.shape_key == given.shape_key
    job = BatchJob([given.feeds, other.feeds], [2, 1], 4, lambda _: None)
    result = BatchResult(job, 0)
    model.executor._execute(model.executor._runs[0], job, result, InputPool())
    first, second = result.outputs
    assert isinstance(first, dict)
    assert isinstance(second, dict)
    assert first["y"].tolist() == (b + 4).tolist()
    assert second["y"].tolist() == [[14.0, 15.0, 16.0]]


def test_a_config_naming_a_weight_of_a_batching_model_is_refused(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    toml = 'max_batch_size = 8\n[[inputs]]\nname = "W"\n[[inputs]]\nname = "x"\n'
    with pytest.raises(ConfigError, match=r"field 'inputs.0.name': 'W' is an optional input .*"
                       r"no batch dim.*set max_batch_size = 0"):  # fmt: skip
        load(dense_model(tmp_path / "m", ("config.toml", toml)), loaded)
    toml = 'max_batch_size = 0\n[[inputs]]\nname = "W"\n[[inputs]]\nname = "x"\n'
    model = load(dense_model(tmp_path / "u", ("config.toml", toml)), loaded)
    x = np.ones((1, 4), np.float32)
    assert run(model, {"x": x, "W": np.full((4, 3), 2, np.float32)}).tolist() == [[8.0] * 3]


def test_v1_requests_may_leave_optional_inputs_out(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    signature = load(dense_model(tmp_path / "m"), loaded).signature
    assert list(v1_inputs({"instances": [[1, 2, 3, 4]]}, signature, "m")) == ["x"]
    columns = {"x": [[1, 2, 3, 4]], "b": [[1, 1, 1]]}
    assert list(v1_inputs({"inputs": columns}, signature, "m")) == ["x", "b"]
    rows = [{"x": [1, 2, 3, 4], "b": [1, 1, 1]}, {"x": [1, 2, 3, 4]}]
    with pytest.raises(InvalidInput, match="example 1 has no input 'b'"):
        v1_inputs({"instances": rows}, signature, "m")


def test_tools_send_no_value_for_optional_inputs() -> None:
    """`duetime bench` and `duetime optimize` leave optional inputs (weights, say) to their
    initializers; bench reads which are optional from the model config."""
    metadata = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]},
                           {"name": "b", "datatype": "FP32", "shape": [-1, 3]}]}  # fmt: skip
    signature = signature_from_metadata(metadata, 8, ["b"])
    assert signature == ModelSignature(
        (TensorSpec("x", "FP32", (-1, 4)), TensorSpec("b", "FP32", (-1, 3), optional=True)), (), 8
    )
    assert list(random_inputs(signature, 2, np.random.default_rng(0))) == ["x"]
    assert list(random_samples(signature, 2, 0)) == ["x"]


@pytest.mark.timeout(60)
def test_requests_give_or_leave_out_optional_inputs_through_the_engine(tmp_path: Path) -> None:
    add_model(tmp_path / "repo" / "m")
    with Engine.open(tmp_path / "repo") as engine:
        assert (engine.infer("m", {"INPUT": X}, timeout=10.0)["OUTPUT"] == 1).all()
        both = {"INPUT": X, "INITIALIZER": SEVENS}
        assert (engine.infer("m", both, timeout=10.0)["OUTPUT"] == 7).all()


def heavy_with_bias() -> bytes:
    """repo_models' heavy model (y = x after milliseconds of work), plus an optional input
    `bias` [batch, 4] (zeros) added to y."""
    model = onnx.load_from_string(heavy_model(1))
    graph = model.graph
    graph.input.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["batch", WIDTH]))
    graph.initializer.append(numpy_helper.from_array(np.zeros((1, WIDTH), np.float32), "bias"))
    graph.node[-1].output[0] = "unbiased"
    graph.node.append(helper.make_node("Add", ["unbiased", "bias"], ["y"]))
    return bytes(model.SerializeToString())


@pytest.mark.timeout(60)
def test_requests_giving_optional_inputs_stay_on_the_primary(tmp_path: Path) -> None:
    """A variant may lack an optional input (quantizing a weight drops its graph input): it
    still loads, and takes only the requests that give none."""
    write_version(tmp_path, "m", 1, heavy_with_bias())
    write_version(tmp_path, "m", 1, scale_model(2), name="model.small.onnx")
    (tmp_path / "m" / "config.toml").write_text(
        '[[variants]]\nname = "small"\nfile = "model.small.onnx"\n', encoding="utf-8"
    )
    x = inputs()["x"]
    given = {"x": x, "bias": np.ones((1, WIDTH), np.float32)}

    async def scenario(engine: Engine) -> None:
        version = engine.registry.snapshot.models["m"].versions["1"]
        assert [d.variant for d in version.variants] == ["default", "small"]
        tight = await engine.infer_async("m", {"x": x}, timeout=0.001)  # only the small one fits
        assert tight["y"].tolist() == (2 * x).tolist()
        assert (await engine.infer_async("m", given, timeout=10.0))["y"].tolist() == (
            x + 1
        ).tolist()
        try:  # the primary's answer, or its refusal: never the small one's invalid input
            out = await engine.infer_async("m", given, timeout=0.001)
            assert out["y"].tolist() == (x + 1).tolist()
        except (Overloaded, DeadlineExceeded):
            pass

    async def main() -> None:
        engine = await Engine.start(tmp_path)
        try:
            await scenario(engine)
        finally:
            await engine.aclose()

    asyncio.run(main())
