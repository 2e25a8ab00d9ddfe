"""A shadow whose inputs can never take the answering version's requests is named at load: in
the log and in the repository index, as a variant with another signature is.

Found by a tester (repro_shadow_signature): v1 took input `x`, its shadow v2 `q`; every copy
was skipped (mirrored 20, skipped 20), and neither the log nor the index said why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import TensorProto, helper
from repo_models import WIDTH, scale_model, served_with_traffic

pytestmark = pytest.mark.timeout(60)


def identity(name: str, datatype: int = TensorProto.FLOAT) -> bytes:
    """y = the input `name`, [batch, WIDTH] of `datatype`."""
    given = helper.make_tensor_value_info(name, datatype, ["batch", WIDTH])
    y = helper.make_tensor_value_info("y", datatype, ["batch", WIDTH])
    graph = helper.make_graph([helper.make_node("Identity", [name], ["y"])], "g", [given], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def index_and_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, shadow: bytes
) -> tuple[dict[str, str], list[str]]:
    """Version 1 (x) answers, version 2 (`shadow`) gets a copy of each request: the index's
    reason for each version, and the load's warnings about a shadow."""
    traffic = 'weights = { "1" = 1 }\nshadow = { "2" = 1.0 }\n'
    models = {1: scale_model(1.0), 2: shadow}
    answered, reasons, warnings = served_with_traffic(tmp_path, models, traffic, caplog, "shadow")
    assert answered == 1.0
    return reasons, warnings


@pytest.mark.parametrize(
    ("shadow", "named"),
    [(identity("q"), "q FP32"), (identity("x", TensorProto.DOUBLE), "x FP64")],
    ids=["other-name", "other-datatype"],
)
def test_a_shadow_that_cannot_take_the_copies_is_named_at_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, shadow: bytes, named: str
) -> None:
    reasons, warnings = index_and_warnings(tmp_path, caplog, shadow)
    [warning] = warnings
    assert "[traffic] shadow version 2 cannot take the copies of version 1's requests" in warning
    assert named in warning
    assert "version 1 x FP32" in warning
    assert reasons["1"] == ""
    assert "cannot take the copies of version 1's requests" in reasons["2"]


def test_a_shadow_with_the_same_inputs_is_not_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reasons, warnings = index_and_warnings(tmp_path, caplog, identity("x"))
    assert (warnings, reasons) == ([], {"1": "", "2": ""})
