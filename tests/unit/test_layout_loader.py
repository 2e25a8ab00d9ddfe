"""Unit tests for `duetime.repository.layout` (scanning) and `duetime.repository.loader`."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from duetime.config import ModelConfig, parse_model_config
from duetime.demo import write_demo_repository
from duetime.errors import ConfigError, InvalidInput
from duetime.repository import loader
from duetime.repository.layout import MODEL_FILENAME, ModelSource, scan_model, scan_repository
from duetime.repository.loader import (
    DEFAULT_MAX_BATCH_SIZE,
    INLINE_BATCH1_NS,
    INLINE_LONGEST_NS,
    LoadedModel,
    load_version,
    reconcile,
    runs_inline,
    sample_inputs,
    warm_up,
)
from duetime.scheduling.profile import LatencyProfile, ProfilePoint
from duetime.types import ModelSignature, TensorSpec
from duetime.validation import Validator


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_repository(tmp_path_factory.mktemp("demo"))


def identity_model(dtype: int, shape: list[int | str]) -> bytes:
    """An ONNX graph y = Identity(x) with the given element type and shape."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("y", dtype, shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def model_dir(root: Path, name: str, onnx_bytes: bytes, config: str | None = None) -> ModelSource:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / MODEL_FILENAME).write_bytes(onnx_bytes)
    if config is not None:
        (root / name / "config.toml").write_text(config, encoding="utf-8")
    return scan_model(root / name)


# -- layout -------------------------------------------------------------------------------------


def test_scan_finds_models_and_versions(demo: Path) -> None:
    scan = scan_repository(demo)
    assert [m.name for m in scan.models] == ["deeplob", "mlp", "orderbook", "resnet"]
    assert scan.errors == {}
    mlp = scan.models[1]
    assert mlp.directory == demo / "mlp"
    assert mlp.versions == {1: demo / "mlp" / "1" / MODEL_FILENAME}
    assert mlp.latest == 1


def test_scan_versions_and_what_is_not_a_version(tmp_path: Path) -> None:
    for version in ("1", "3", "10"):
        (tmp_path / "m" / version).mkdir(parents=True)
        (tmp_path / "m" / version / MODEL_FILENAME).write_bytes(b"")
    (tmp_path / "m" / "7").mkdir()  # no model file
    (tmp_path / "m" / "v2").mkdir()  # not an integer
    (tmp_path / "m" / "v2" / MODEL_FILENAME).write_bytes(b"")
    (tmp_path / "m" / "²").mkdir()  # a digit to str.isdigit, but not to int()
    (tmp_path / "m" / "²" / MODEL_FILENAME).write_bytes(b"")
    (tmp_path / "m" / "5").write_text("a file, not a folder")
    (tmp_path / "m" / "2" / MODEL_FILENAME).mkdir(parents=True)  # a folder named model.onnx
    source = scan_model(tmp_path / "m")
    assert sorted(source.versions) == [1, 3, 10]
    assert source.latest == 10
    assert source.versions[10] == tmp_path / "m" / "10" / MODEL_FILENAME


def test_scan_reports_folders_without_versions_and_ignores_hidden(tmp_path: Path) -> None:
    (tmp_path / "good" / "1").mkdir(parents=True)
    (tmp_path / "good" / "1" / MODEL_FILENAME).write_bytes(b"")
    (tmp_path / "empty").mkdir()
    (tmp_path / "no_model" / "1").mkdir(parents=True)
    for folder in (".git", "_staging"):  # (hidden; a leading '_' is a model, as in Triton)
        (tmp_path / folder / "1").mkdir(parents=True)
        (tmp_path / folder / "1" / MODEL_FILENAME).write_bytes(b"")
    (tmp_path / "README.md").write_text("not a model")
    scan = scan_repository(tmp_path)
    assert [m.name for m in scan.models] == ["_staging", "good"]
    assert sorted(scan.errors) == ["empty", "no_model"]
    assert str(tmp_path / "empty") in scan.errors["empty"]
    assert "no version folder holds a model.onnx" in scan.errors["empty"]


@pytest.mark.parametrize(
    ("make", "what"),
    [(lambda p: None, "does not exist"), (lambda p: p.write_text("x"), "is not a folder")],
)
def test_scan_root_must_be_a_folder(tmp_path: Path, make: Any, what: str) -> None:
    root = tmp_path / "repo"
    make(root)
    with pytest.raises(ConfigError, match=f"model repository {re.escape(str(root))} {what}"):
        scan_repository(root)


def test_a_model_folder_given_as_the_repository_points_to_its_parent(tmp_path: Path) -> None:
    model = tmp_path / "repo1" / "mymodel"
    (model / "1").mkdir(parents=True)
    (model / "1" / MODEL_FILENAME).write_bytes(b"")
    (model / "config.toml").write_text("")
    with pytest.raises(ConfigError) as raised:
        scan_repository(model)
    message = raised.value.message
    assert "looks like a model folder" in message
    assert f"serve its parent folder, {tmp_path / 'repo1'} " in message
    with pytest.raises(ConfigError, match="looks like a version folder") as raised:
        scan_repository(model / "1")
    assert f"two levels up, {tmp_path / 'repo1'} " in raised.value.message


def test_a_repository_with_models_is_never_taken_for_a_model_folder(tmp_path: Path) -> None:
    for name in ("m", "7"):  # ("7": a model folder named like a version, its files misplaced)
        (tmp_path / name / ("1" if name == "m" else "")).mkdir(parents=True, exist_ok=True)
    (tmp_path / "m" / "1" / MODEL_FILENAME).write_bytes(b"")
    (tmp_path / "7" / MODEL_FILENAME).write_bytes(b"")
    scan = scan_repository(tmp_path)
    assert [m.name for m in scan.models] == ["m"]
    assert sorted(scan.errors) == ["7"]


# -- reconcile ----------------------------------------------------------------------------------

FREE_IN = [TensorSpec("x", "FP32", (-1, 4)), TensorSpec("mask", "BOOL", (-1, -1))]
FREE_OUT = [TensorSpec("y", "FP32", (-1, 2))]
FIXED_IN = [TensorSpec("x", "FP32", (3, 4))]
FIXED_OUT = [TensorSpec("y", "FP32", (3, 2))]


def config(**fields: Any) -> ModelConfig:
    return parse_model_config(fields, source="test")


@pytest.mark.parametrize(
    ("fields", "graph_in", "graph_out", "max_batch"),
    [
        pytest.param({}, FREE_IN, FREE_OUT, DEFAULT_MAX_BATCH_SIZE, id="free-first-dim-default"),
        pytest.param({}, FIXED_IN, FIXED_OUT, 0, id="fixed-first-dim-default"),
        pytest.param({}, FREE_IN, FIXED_OUT, 0, id="fixed-output-default"),
        pytest.param({}, [TensorSpec("s", "FP32", ())], FREE_OUT, 0, id="scalar-input-default"),
        pytest.param({"max_batch_size": 4}, FREE_IN, FREE_OUT, 4, id="explicit"),
        pytest.param({"max_batch_size": 0}, FREE_IN, FREE_OUT, 0, id="explicit-off"),
        pytest.param({"max_batch_size": 0}, FIXED_IN, FIXED_OUT, 0, id="explicit-off-fixed"),
    ],
)
def test_reconcile_batch_policy(
    fields: dict[str, Any], graph_in: list[TensorSpec], graph_out: list[TensorSpec], max_batch: int
) -> None:
    signature = reconcile(config(**fields), graph_in, graph_out, source="m")
    assert signature == ModelSignature(tuple(graph_in), tuple(graph_out), max_batch)


@pytest.mark.parametrize(
    ("graph_in", "graph_out", "culprit"),
    [
        (FIXED_IN, FIXED_OUT, r"'x' has shape \[3, 4\]"),
        (FREE_IN, FIXED_OUT, r"'y' has shape \[3, 2\]"),
        ([TensorSpec("s", "FP32", ())], FREE_OUT, r"'s' has shape \[\]"),
    ],
)
def test_reconcile_explicit_batch_needs_free_first_dims(
    graph_in: list[TensorSpec], graph_out: list[TensorSpec], culprit: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        reconcile(config(max_batch_size=8), graph_in, graph_out, source="repo/m")
    message = caught.value.message
    assert message.startswith("repo/m: field 'max_batch_size' = 8 needs a free first dim")
    assert re.search(culprit, message)
    assert message.endswith("set max_batch_size = 0")


@pytest.mark.parametrize(
    ("fields", "expected_in", "expected_out"),
    [
        pytest.param(
            {"inputs": [{"name": "x"}, {"name": "mask", "dims": [7]}]},
            [FREE_IN[0], TensorSpec("mask", "BOOL", (-1, 7))],
            FREE_OUT,
            id="narrow-free-dim",
        ),
        pytest.param(
            {
                "inputs": [
                    {"name": "x", "datatype": "FP32", "dims": [-1]},
                    {"name": "mask", "dims": [-1]},
                ]
            },
            FREE_IN,
            FREE_OUT,
            id="restate-graph",
        ),
        pytest.param(
            {"inputs": [{"name": "mask"}, {"name": "x", "dims": [4]}]},
            FREE_IN,
            FREE_OUT,
            id="order-follows-graph",
        ),
        pytest.param(
            {"outputs": [{"name": "y", "dims": [2]}]},
            FREE_IN,
            FREE_OUT,
            id="outputs",
        ),
    ],
)
def test_reconcile_config_narrows_dims(
    fields: dict[str, Any], expected_in: list[TensorSpec], expected_out: list[TensorSpec]
) -> None:
    signature = reconcile(config(**fields), FREE_IN, FREE_OUT, source="m")
    assert signature.inputs == tuple(expected_in)
    assert signature.outputs == tuple(expected_out)
    assert signature.max_batch_size == DEFAULT_MAX_BATCH_SIZE


def test_reconcile_non_batched_dims_include_the_first_dim() -> None:
    fields = {"max_batch_size": 0, "inputs": [{"name": "x", "dims": [5, 4]}]}
    signature = reconcile(config(**fields), FREE_IN[:1], FREE_OUT, source="m")
    assert signature.inputs == (TensorSpec("x", "FP32", (5, 4)),)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param(
            {"inputs": [{"name": "x"}, {"name": "z"}]},
            "m: field 'inputs.1.name': 'z' is not in the graph; it has 'x', 'mask'",
            id="unknown-input",
        ),
        pytest.param(
            {"outputs": [{"name": "x"}]},
            "m: field 'outputs.0.name': 'x' is not in the graph; it has 'y'",
            id="input-name-as-output",
        ),
        pytest.param(
            {"inputs": [{"name": "x", "datatype": "FP16"}]},
            "m: field 'inputs.0.datatype': FP16 does not match the graph's FP32",
            id="datatype",
        ),
        pytest.param(
            {"inputs": [{"name": "x", "dims": [5]}]},
            "m: field 'inputs.0.dims': [5] does not fit the graph's [4]",
            id="fixed-dim-changed",
        ),
        pytest.param(
            {"inputs": [{"name": "x", "dims": [-1, 4]}]},
            "m: field 'inputs.0.dims': [-1, 4] does not fit the graph's [4]",
            id="dims-with-batch-dim",
        ),
        pytest.param(
            {"outputs": [{"name": "y", "dims": []}]},
            "m: field 'outputs.0.dims': [] does not fit the graph's [2]",
            id="output-rank",
        ),
    ],
)
def test_reconcile_config_errors(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        reconcile(config(**fields), FREE_IN, FREE_OUT, source="m")
    assert caught.value.message.startswith(message)


@pytest.mark.parametrize(
    ("max_batch_size", "dims", "hint"),
    [
        (8, [5], "(dims exclude the batch dim; -1 keeps a dim free)"),
        (0, [4], "(with max_batch_size 0 (no batching) dims are the whole shape; -1 keeps a dim "
                 "free: [-1, 4], or a max_batch_size above 0 to batch its first dim)"),
        (0, [5], "(with max_batch_size 0 (no batching) dims are the whole shape; -1 keeps a dim "
                 "free)"),
    ],
)  # fmt: skip
def test_the_dims_refusal_gives_the_rule_of_the_model_s_batching(
    max_batch_size: int, dims: list[int], hint: str
) -> None:
    """A model with max_batch_size 0 was told "dims exclude the batch dim", the opposite of
    its rule (found by a tester: Triton users write [4] for a graph's [-1, 4])."""
    fields = {"max_batch_size": max_batch_size, "inputs": [{"name": "x", "dims": dims}]}
    spec = TensorSpec("x", "FP32", (-1, 4))
    with pytest.raises(ConfigError) as caught:
        reconcile(config(**fields), [spec], FREE_OUT, source="m")
    assert caught.value.message.endswith(hint)


# -- load_version -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "inputs", "outputs", "max_batch"),
    [
        ("mlp", [TensorSpec("x", "FP32", (-1, 40))], [TensorSpec("y", "FP32", (-1, 3))], 64),
        (
            "resnet",
            [TensorSpec("image", "FP32", (-1, 3, 64, 64))],
            [TensorSpec("logits", "FP32", (-1, 10))],
            32,
        ),
    ],
)
def test_load_demo_models(
    demo: Path,
    loaded: list[LoadedModel],
    name: str,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    max_batch: int,
) -> None:
    source = scan_model(demo / name)
    model = load_version(source, 1)
    loaded.append(model)
    assert (model.name, model.version, model.path) == (name, "1", source.versions[1])
    assert model.config.max_batch_size == max_batch
    assert model.signature == ModelSignature(tuple(inputs), tuple(outputs), max_batch)
    assert model.executor.instances == 1
    feeds = sample_inputs(model.signature, rows=2)
    prepared = model.validator.prepare(feeds, None)
    assert prepared.rows == 2
    (result,) = model.executor.run_sync(prepared.feeds)
    assert result.shape == (2, outputs[0].shape[1])


def test_load_with_config_instances_and_narrowing(
    tmp_path: Path, demo: Path, loaded: list[LoadedModel]
) -> None:
    config = 'instances = 2\n[[outputs]]\nname = "y"\ndims = [3]\n'
    source = model_dir(tmp_path, "m", (demo / "mlp" / "1" / MODEL_FILENAME).read_bytes(), config)
    model = load_version(source, 1)
    loaded.append(model)
    assert model.executor.instances == 2
    assert model.signature.max_batch_size == DEFAULT_MAX_BATCH_SIZE
    assert model.validator.prepare(sample_inputs(model.signature, 1), ["y"]).outputs == ("y",)


def test_load_corrupt_model_names_the_file(tmp_path: Path) -> None:
    source = model_dir(tmp_path, "broken", b"this is not a protobuf")
    with pytest.raises(ConfigError) as caught:
        load_version(source, 1)
    assert caught.value.message.startswith(f"{source.versions[1]}: ONNX Runtime cannot load it")


def test_load_bad_config_names_the_config_file(tmp_path: Path, demo: Path) -> None:
    source = model_dir(
        tmp_path, "m", (demo / "mlp" / "1" / MODEL_FILENAME).read_bytes(), "instances = 0\n"
    )
    with pytest.raises(
        ConfigError, match=re.escape(f"{tmp_path / 'm' / 'config.toml'}: field 'instances'")
    ):
        load_version(source, 1)


def test_load_config_that_does_not_fit_the_graph_names_the_model_and_field(
    tmp_path: Path, demo: Path
) -> None:
    onnx_bytes = (demo / "mlp" / "1" / MODEL_FILENAME).read_bytes()
    source = model_dir(tmp_path, "m", onnx_bytes, '[[inputs]]\nname = "input"\n')
    with pytest.raises(ConfigError, match=re.escape(f"{source.directory}: field 'inputs.0.name'")):
        load_version(source, 1)


def test_load_fixed_shape_model_does_not_batch(tmp_path: Path, loaded: list[LoadedModel]) -> None:
    source = model_dir(tmp_path, "fixed", identity_model(TensorProto.FLOAT, [2, 3]))
    model = load_version(source, 1)
    loaded.append(model)
    assert model.signature.max_batch_size == 0
    assert model.signature.inputs == (TensorSpec("x", "FP32", (2, 3)),)


def test_a_tensor_without_a_shape_takes_any_shape_or_the_configs(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    """ONNX Runtime reports a graph input declared without a shape as [], as it does a scalar:
    it is served taking any shape, not scalars only, and a config's dims give it one."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "shapeless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    shapeless = model.SerializeToString()  # (onnx's checker wants shapes; ORT does not)
    scalar = load_version(model_dir(tmp_path, "scalar", identity_model(TensorProto.FLOAT, [])), 1)
    free = load_version(model_dir(tmp_path, "free", shapeless), 1)
    config = 'max_batch_size = 8\ninputs = [{name = "x", dims = [3]}]\n'
    config += 'outputs = [{name = "y", dims = [3]}]\n'
    ranked = load_version(model_dir(tmp_path, "ranked", shapeless, config), 1)
    batched_blind = model_dir(tmp_path, "blind", shapeless, "max_batch_size = 8\n")
    with pytest.raises(ConfigError, match="'x' has no shape in the graph, so it has no batch"):
        load_version(batched_blind, 1)
    loaded.extend((scalar, free, ranked))
    assert scalar.signature.inputs == (TensorSpec("x", "FP32", ()),)
    assert free.signature.inputs == (TensorSpec("x", "FP32", (), any_rank=True),)
    assert free.signature.inputs[0].describe() == "FP32[any shape]"
    assert free.signature.max_batch_size == 0
    for shape in ((), (2, 3), (1, 2, 3)):
        x = np.ones(shape, dtype=np.float32)
        (y,) = free.executor.run_sync(free.validator.prepare({"x": x}, None).feeds)
        assert y.shape == shape
    with pytest.raises(InvalidInput, match=r"Expected \[\] or \[1\], got \[2\]"):
        scalar.validator.prepare({"x": np.ones(2, dtype=np.float32)}, None)
    assert ranked.signature.inputs == (TensorSpec("x", "FP32", (-1, 3)),)
    assert ranked.signature.max_batch_size == 8
    with pytest.raises(InvalidInput, match=r"Expected \[-1,3\], got \[2,4\]"):
        ranked.validator.prepare({"x": np.ones((2, 4), dtype=np.float32)}, None)


def test_load_string_model(tmp_path: Path, loaded: list[LoadedModel]) -> None:
    source = model_dir(tmp_path, "text", identity_model(TensorProto.STRING, ["n"]))
    model = load_version(source, 1)
    loaded.append(model)
    assert model.signature.inputs == (TensorSpec("x", "BYTES", (-1,)),)
    assert model.signature.max_batch_size == DEFAULT_MAX_BATCH_SIZE
    prepared = model.validator.prepare({"x": np.array([b"a", b"bc"], dtype=object)}, None)
    (result,) = model.executor.run_sync(prepared.feeds)
    assert result.tolist() == ["a", "bc"]


def test_load_unsupported_graph_type_names_the_file(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], "f8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    source = model_dir(tmp_path, "f8", bytes(model.SerializeToString()))
    with pytest.raises(
        ConfigError,
        match=re.escape(f"{source.versions[1]}: input 'x' has type tensor(float8e4m3fn)"),
    ):
        load_version(source, 1)


def classifier_model(with_label: bool = True) -> bytes:
    """A scikit-learn-style classifier as skl2onnx exports it: a label tensor and the class
    probabilities through ZipMap, a sequence of maps (not a tensor)."""
    seq_of_maps = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(1, []))
    )
    nodes = [
        helper.make_node("Softmax", ["x"], ["p"], axis=1),
        helper.make_node(
            "ZipMap", ["p"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2]
        ),
    ]
    outputs = [helper.make_value_info("probabilities", seq_of_maps)]
    if with_label:
        nodes.append(helper.make_node("ArgMax", ["p"], ["label"], axis=1, keepdims=0))
        outputs.insert(0, helper.make_tensor_value_info("label", TensorProto.INT64, ["n"]))
    graph = helper.make_graph(
        nodes, "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        outputs,
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    )
    model.ir_version = 8
    return bytes(model.SerializeToString())


def test_load_serves_the_tensor_outputs_of_a_model_with_a_zipmap(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    source = model_dir(tmp_path, "classifier", classifier_model())
    with caplog.at_level(logging.WARNING, logger="duetime.ort"):
        model = load_version(source, 1)
    loaded.append(model)
    assert model.signature.outputs == (TensorSpec("label", "INT64", (-1,)),)
    assert "output 'probabilities' has type seq(map(int64,tensor(float)))" in caplog.text
    assert "zipmap" in caplog.text
    x = np.array([[0.0, 5.0, 1.0], [9.0, 0.0, 0.0]], dtype=np.float32)
    (label,) = model.executor.run_sync(model.validator.prepare({"x": x}, None).feeds)
    assert label.tolist() == [1, 0]


def test_load_refuses_a_model_without_a_tensor_output(tmp_path: Path) -> None:
    source = model_dir(tmp_path, "maps", classifier_model(with_label=False))
    with pytest.raises(ConfigError, match=r"no output is a tensor \('probabilities' seq\(map"):
        load_version(source, 1)


# -- sample inputs and warm-up ------------------------------------------------------------------

MIXED = ModelSignature(
    inputs=(
        TensorSpec("f", "FP32", (-1, 3, -1)),
        TensorSpec("h", "FP16", (-1, 2)),
        TensorSpec("i", "INT64", (-1,)),
        TensorSpec("b", "BOOL", (-1, 2)),
        TensorSpec("s", "BYTES", (-1, 2)),
    ),
    outputs=(TensorSpec("y", "FP32", (-1,)),),
    max_batch_size=8,
)


def test_sample_inputs_batched() -> None:
    feeds = sample_inputs(MIXED, rows=5)
    assert {name: (a.shape, a.dtype) for name, a in feeds.items()} == {
        "f": ((5, 3, 1), np.dtype(np.float32)),
        "h": ((5, 2), np.dtype(np.float16)),
        "i": ((5,), np.dtype(np.int64)),
        "b": ((5, 2), np.dtype(np.bool_)),
        "s": ((5, 2), np.dtype(object)),
    }
    assert all(type(item) is str for item in feeds["s"].reshape(-1))
    # Every sample passes the model's own validation.
    assert Validator("m", MIXED).prepare(feeds, None).rows == 5


def test_sample_inputs_non_batched_ignores_rows() -> None:
    signature = ModelSignature((TensorSpec("x", "FP32", (-1, 4)),), (), max_batch_size=0)
    assert sample_inputs(signature, rows=7)["x"].shape == (1, 4)


def test_sample_inputs_are_deterministic() -> None:
    one, two = sample_inputs(MIXED, 3, seed=1), sample_inputs(MIXED, 3, seed=1)
    assert np.array_equal(one["f"], two["f"])
    assert not np.array_equal(one["f"], sample_inputs(MIXED, 3, seed=2)["f"])


class _RecordingExecutor:
    """Stands in for an Executor in warm_up: records the batch sizes run, or raises."""

    def __init__(self, instances: int, error: Exception | None = None) -> None:
        self.instances = instances
        self.error = error
        self.runs: list[tuple[int, int]] = []

    def run_sync(self, feeds: dict[str, np.ndarray], instance: int = 0) -> list[np.ndarray]:
        if self.error is not None:
            raise self.error
        self.runs.append((instance, len(feeds["x"])))
        return []


def test_warm_up_runs_each_instance_at_batch_1(tmp_path: Path) -> None:
    """The max batch is warmed up once profiled, if at all (see test_load_budget)."""
    signature = ModelSignature((TensorSpec("x", "FP32", (-1, 4)),), (), max_batch_size=6)
    executor = _RecordingExecutor(instances=2)
    warm_up(executor, signature, tmp_path / "model.onnx", runs=2)  # type: ignore[arg-type]
    assert executor.runs == [(0, 1), (0, 1), (1, 1), (1, 1)]


@pytest.mark.parametrize("error", [RuntimeError("bad index"), InvalidInput("bad")])
def test_warm_up_failure_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    signature = ModelSignature((TensorSpec("x", "FP32", (-1, 4)),), (), max_batch_size=2)
    with caplog.at_level(logging.WARNING, logger="duetime.loader"):
        warm_up(_RecordingExecutor(1, error), signature, tmp_path / "model.onnx")  # type: ignore[arg-type]
    assert "warm-up on sample inputs failed" in caplog.text
    assert str(tmp_path / "model.onnx") in caplog.text


# -- execution = "auto" --------------------------------------------------------------------------


def profile_of(*medians_ns: tuple[int, int]) -> LatencyProfile:
    return LatencyProfile([ProfilePoint(rows, ns, ns) for rows, ns in medians_ns])


@pytest.mark.parametrize(
    ("points", "instances", "inline"),
    [
        (((1, 10_000), (64, 137_000)), 1, True),  # the demo mlp
        (((1, INLINE_BATCH1_NS), (32, INLINE_LONGEST_NS)), 1, True),  # both limits inclusive
        (((1, INLINE_BATCH1_NS + 1), (32, 60_000)), 1, False),  # batch 1 too long
        (((1, 10_000), (64, INLINE_LONGEST_NS + 1)), 1, False),  # a full batch holds the loop
        (((1, 10_000), (64, 137_000)), 2, False),  # inline has one instance
        (((1, 960_000), (32, 30_000_000)), 1, False),  # the demo resnet
        (((1, 5_000),), 1, True),  # a model that does not batch
    ],
)
def test_auto_execution_is_inline_only_for_short_single_instance_models(
    points: tuple[tuple[int, int], ...], instances: int, inline: bool
) -> None:
    assert runs_inline(profile_of(*points), instances) is inline


FAST = ((1, 5_000), (32, 20_000))
SLOW = ((1, 900_000), (32, 9_000_000))


@pytest.mark.parametrize(
    ("config", "measured", "inline"),
    [
        (None, FAST, True),  # auto follows the measured profile...
        (None, SLOW, False),
        ('execution = "thread"\n', FAST, False),  # ...unless the config says otherwise
        ('execution = "auto"\ninstances = 2\n', FAST, False),
        ('execution = "inline"\n', SLOW, True),
    ],
)
def test_load_decides_execution_from_config_and_profile(
    tmp_path: Path,
    loaded: list[LoadedModel],
    monkeypatch: pytest.MonkeyPatch,
    config: str | None,
    measured: tuple[tuple[int, int], ...],
    inline: bool,
) -> None:
    # The profile is fixed: a measured one depends on how busy the machine is (an Identity
    # measured over 50 µs at batch 1 on a loaded CI runner).
    monkeypatch.setattr(loader, "measure_profile", lambda *args, **kwargs: profile_of(*measured))
    source = model_dir(tmp_path, "m", identity_model(TensorProto.FLOAT, ["n", 4]), config)
    model = load_version(source, 1)
    loaded.append(model)
    assert model.executor.inline is inline
