"""Config dims that give one named free dim of the graph two sizes are refused at load. Found by
a tester (repro_conflicting_symbolic_dims): `Add(a[n, k], b[n, k])` with `a` dims [4] and `b`
dims [5] loaded READY with an empty index reason, its warm-up and profiling failed (logged
only), and every request shaped as the metadata said failed in ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import TensorProto, helper

from duetime.errors import ConfigError
from duetime.repository.layout import scan_model
from duetime.repository.loader import LoadedModel, load_version

pytestmark = pytest.mark.timeout(60)


def add_folder(repo: Path, config: str) -> Path:
    """Model `add`: y = a + b, all three [n, k]."""
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])], "g",
        [value("a", TensorProto.FLOAT, ["n", "k"]), value("b", TensorProto.FLOAT, ["n", "k"])],
        [value("y", TensorProto.FLOAT, ["n", "k"])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder = repo / "add"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (folder / "config.toml").write_text("max_batch_size = 8\n" + config)
    return folder


def tensor(kind: str, name: str, dims: str) -> str:
    return f'[[{kind}]]\nname = "{name}"\ndims = {dims}\n'


def test_two_inputs_giving_one_named_dim_two_sizes_are_refused(tmp_path: Path) -> None:
    config = tensor("inputs", "a", "[4]") + tensor("inputs", "b", "[5]")
    with pytest.raises(ConfigError) as caught:
        load_version(scan_model(add_folder(tmp_path, config)), 1, profile_budget_s=0.01)
    message = caught.value.message
    assert (
        "field 'inputs.1.dims': [5] gives the graph's dim 'k' of 'b' [n, k] the size 5" in message
    )
    assert "field 'inputs.0.dims' gives it 4 for 'a'" in message


def test_an_output_giving_a_named_dim_another_size_is_refused(tmp_path: Path) -> None:
    config = tensor("inputs", "a", "[4]") + tensor("inputs", "b", "[-1]")
    config += tensor("outputs", "y", "[3]")
    with pytest.raises(
        ConfigError, match=r"field 'outputs.0.dims': \[3\] gives the graph's dim 'k'"
    ):
        load_version(scan_model(add_folder(tmp_path, config)), 1, profile_budget_s=0.01)


def test_one_size_for_a_named_dim_loads(tmp_path: Path, loaded: list[LoadedModel]) -> None:
    config = tensor("inputs", "a", "[4]") + tensor("inputs", "b", "[4]")
    model = load_version(scan_model(add_folder(tmp_path, config)), 1, profile_budget_s=0.01)
    loaded.append(model)
    assert [spec.shape for spec in model.signature.inputs] == [(-1, 4), (-1, 4)]
