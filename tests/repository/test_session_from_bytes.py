"""Sessions on a model's rewritten bytes: its external data still found, its cache keyed on them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from duetime.execution.ort import CACHE_DIR, cached_session, open_session, session_options


def add_model(path: Path, *, external: bool) -> onnx.ModelProto:
    """y = x + w, w (FP32 [1, 2048]) in `model.onnx.data` beside the file when `external`."""
    weight = numpy_helper.from_array(np.arange(2048, dtype=np.float32).reshape(1, 2048), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2048])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2048])], [weight],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    if external:
        onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data")
    else:
        onnx.save(model, str(path))
    return onnx.load(str(path), load_external_data=False)


def times_two(model: onnx.ModelProto) -> bytes:
    """`model` rewritten to answer 2 * (x + w): bytes no file on disk holds."""
    model.graph.node[0].output[0] = "sum"
    model.graph.node.append(helper.make_node("Add", ["sum", "sum"], ["y"]))
    return bytes(model.SerializeToString())


def test_a_session_on_rewritten_bytes_reads_external_data_beside_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m" / "1" / "model.onnx"
    graph = times_two(add_model(path, external=True))
    monkeypatch.chdir(tmp_path)  # (ORT would look for the data here, and refuse it)
    options = session_options(intra_op_threads=1, inter_op_threads=1)
    session = cached_session(path, options, graph)
    (y,) = session.run(None, {"x": np.ones((1, 2048), dtype=np.float32)})
    assert np.array_equal(y[0], 2 * (1 + np.arange(2048, dtype=np.float32)))
    assert not (path.parent / CACHE_DIR).exists()  # (external data: never cached)


def test_the_optimised_graph_cache_is_keyed_on_the_bytes_served(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    graph = times_two(add_model(path, external=False))
    options = session_options(intra_op_threads=1, inter_op_threads=1)
    x = np.ones((1, 2048), dtype=np.float32)
    plain = cached_session(path, options).run(None, {"x": x})[0]
    cached_session(path, options, graph)
    assert len(os.listdir(path.parent / CACHE_DIR)) == 2  # one graph each
    again = cached_session(path, options, graph).run(None, {"x": x})[0]  # (from the cache)
    assert np.array_equal(again, 2 * plain)
    assert np.array_equal(cached_session(path, options).run(None, {"x": x})[0], plain)


@pytest.mark.parametrize("cache", [True, False])
def test_a_session_on_rewritten_bytes_keeps_no_copy_of_them(tmp_path: Path, cache: bool) -> None:
    """ORT's Python session held the bytes it was made from for its whole life: a second copy
    of every guarded model, weights and all (905 vs 514 MB for a 400 MB model)."""
    path = tmp_path / "m" / "1" / "model.onnx"
    graph = times_two(add_model(path, external=False))
    before = sys.getrefcount(graph)
    make = cached_session if cache else open_session
    session = make(path, session_options(intra_op_threads=1, inter_op_threads=1), graph)
    assert sys.getrefcount(graph) == before
    x = np.ones((1, 2048), np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], 2 * (x + np.arange(2048)))
