"""ONNX Runtime writes nothing to stderr when a client's input makes a run fail: the client gets
the error, and the server's log stays the server's (plain or JSON lines, at its own level)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from duetime.execution.ort import open_session, session_options


def test_a_failing_run_writes_nothing_to_stderr(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # A Gather whose index the client sends: out of range, ORT's kernel fails (and used to log
    # a coloured "[E:onnxruntime:...] Non-zero status code" line per request, whatever
    # --log-level and --log-format said).
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "index"], ["y"])], "gather",
        [helper.make_tensor_value_info("index", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [helper.make_tensor("table", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    session = open_session(path, session_options(intra_op_threads=1, inter_op_threads=1))
    capfd.readouterr()
    with pytest.raises(Exception, match="out of data bounds"):
        session.run(None, {"index": np.array([1000], np.int64)})
    assert capfd.readouterr().err == ""
