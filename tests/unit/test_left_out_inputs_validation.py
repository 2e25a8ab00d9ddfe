"""A request giving an optional input (an overridable initializer) that a batching model does not
serve is told why, not that the graph has no such input.

Found by a tester (repro_optional_msg.py): to `y = x + b`, `b` FP32 [4] with an initializer,
served batched (no config: max_batch_size 32), a request giving `b` got 400 "input 'b' is not an
input of model 'initin'; it expects 'x' FP32[-1, 4]": false, and silent on the reason (no batch
dim) and the way out (max_batch_size = 0), which the load-time refusal in a config names.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from duetime.errors import InvalidInput
from duetime.frontend.codec import Expected
from duetime.types import ModelSignature, TensorSpec
from duetime.validation import Validator, left_out_inputs

X = TensorSpec("x", "FP32", (-1, 4))
B = TensorSpec("b", "FP32", (4,), optional=True)
ROWS = TensorSpec("r", "FP32", (-1, 4), optional=True)
GRAPH = [X, B, ROWS]
BATCHED = ModelSignature((X, ROWS), (TensorSpec("y", "FP32", (-1, 4)),), 32)


def request(**extra: np.ndarray) -> dict[str, np.ndarray]:
    return {"x": np.zeros((1, 4), np.float32), **extra}


def test_a_batching_model_says_why_it_takes_no_initializer_without_a_batch_dim() -> None:
    validator = Validator("initin", BATCHED, left_out=left_out_inputs(GRAPH, BATCHED))
    with pytest.raises(InvalidInput) as caught:
        validator.prepare(request(b=np.ones(4, np.float32)), None)
    message = caught.value.message
    assert message.startswith("input 'b' of model 'initin': an initializer (FP32[4]) the model's")
    assert "not an input" not in message
    assert "lets requests override, but not on a model that batches (max_batch_size = 32)" in (
        message
    )
    assert "max_batch_size = 0" in message
    # the served optional input (its first dim free) and unknown names are as they were
    assert validator.prepare(request(r=np.ones((1, 4), np.float32)), None).rows == 1
    with pytest.raises(InvalidInput, match="input 'c' is not an input of model 'initin'"):
        validator.prepare(request(c=np.ones(4, np.float32)), None)


def test_the_check_before_decoding_says_so_too() -> None:
    """HTTP's check of a tensor's header (codec.Expected) refuses before the validator does."""
    invalid: dict[tuple[str, str], int] = {}
    expected = Expected(
        "initin", BATCHED, ("initin", "1"), invalid, left_out=left_out_inputs(GRAPH, BATCHED)
    )
    with pytest.raises(InvalidInput, match="input 'b' of model 'initin': an initializer"):
        expected.input("b", "FP32", (4,))
    with pytest.raises(InvalidInput, match="input 'c' is not an input of model 'initin'"):
        expected.input("c", "FP32", (4,))
    assert invalid == {("initin", "1"): 2}


def test_only_a_batching_model_leaves_optional_inputs_out() -> None:
    unbatched = ModelSignature((TensorSpec("x", "FP32", (1, 4)), B), BATCHED.outputs, 0)
    assert left_out_inputs(GRAPH, unbatched) == {}
    assert list(left_out_inputs(GRAPH, BATCHED)) == ["b"]


def test_the_loaded_model_names_the_reason(tmp_path: Path) -> None:
    from duetime.repository.layout import scan_model
    from duetime.repository.loader import load_version

    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"])], "g",
        [value("x", TensorProto.FLOAT, ["N", 4]), value("b", TensorProto.FLOAT, [4])],
        [value("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[numpy_helper.from_array(np.arange(4, dtype=np.float32), "b")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / "initin" / "1").mkdir(parents=True)
    onnx.save(model, str(tmp_path / "initin" / "1" / "model.onnx"))
    loaded = load_version(scan_model(tmp_path / "initin"), 1, profile_budget_s=0.05)
    assert loaded.signature.max_batch_size > 0
    with pytest.raises(InvalidInput, match="not on a model that batches"):
        loaded.validator.prepare(request(b=np.ones(4, np.float32)), None)
