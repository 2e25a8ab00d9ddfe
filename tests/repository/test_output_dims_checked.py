"""A config's dims of an output, where the graph leaves the dim free, are checked against what
the warm-up at load made of it, wherever that run settles it (every input of the one shape
requests may give). Found by a tester (repro_output_dims_unchecked): a Relu `v[n] -> w[m]`
with `inputs v dims [5]` and `outputs w dims [3]` loaded READY, its metadata said w is [3], and
every answer carried a w of [5]."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from duetime.errors import ConfigError
from duetime.repository.layout import scan_model
from duetime.repository.loader import LoadedModel, load_version

pytestmark = pytest.mark.timeout(60)


def relu_folder(repo: Path, config: str, *, batched: bool = False) -> Path:
    """Model `vec`: w = Relu(v), v [n] and w [m] (with a batch dim `b` first if `batched`)."""
    first = ["b"] if batched else []
    graph = helper.make_graph(
        [helper.make_node("Relu", ["v"], ["w"])], "g",
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, [*first, "n"])],
        [helper.make_tensor_value_info("w", TensorProto.FLOAT, [*first, "m"])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder = repo / "vec"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (folder / "config.toml").write_text(config)
    return folder


def tensors(v: str, w: str, max_batch_size: int = 0) -> str:
    return (
        f"max_batch_size = {max_batch_size}\n"
        f'[[inputs]]\nname = "v"\ndims = {v}\n[[outputs]]\nname = "w"\ndims = {w}\n'
    )


@pytest.mark.parametrize("max_batch_size", [0, 4])
def test_output_dims_the_warm_up_contradicts_are_refused(
    tmp_path: Path, max_batch_size: int
) -> None:
    folder = relu_folder(
        tmp_path, tensors("[5]", "[3]", max_batch_size), batched=max_batch_size > 0
    )
    with pytest.raises(ConfigError) as caught:
        load_version(scan_model(folder), 1, profile_budget_s=0.01)
    message = caught.value.message
    assert "field 'outputs.0.dims': [3]" in message
    assert "made 'w' [5]" in message  # (what the warm-up got: the batch dim left out)


@pytest.mark.parametrize(("v", "w"), [("[5]", "[5]"), ("[5]", "[-1]"), ("[-1]", "[3]")])
def test_output_dims_that_fit_or_cannot_be_told_load(
    tmp_path: Path, loaded: list[LoadedModel], v: str, w: str
) -> None:
    """[-1] keeps the dim free; with v free too, no load-time run settles w's size, and the
    config is taken at its word as before."""
    model = load_version(scan_model(relu_folder(tmp_path, tensors(v, w))), 1, profile_budget_s=0.01)
    loaded.append(model)
    assert model.signature.outputs[0].shape == tuple(int(d) for d in w.strip("[]").split(","))
    (answer,) = model.executor.run_sync({"v": np.ones(5, np.float32)})
    assert answer.shape == (5,)
