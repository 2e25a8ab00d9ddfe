"""Small ONNX graphs written on the fly, each answering in a way that tells them apart."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH = 4


def scale_model(factor: float) -> bytes:
    """y = factor * x for x FP32 [-1, 4]: the answer names the model."""
    scale = numpy_helper.from_array(np.array(factor, dtype=np.float32), "factor")
    return _graph([helper.make_node("Mul", ["x", "factor"], ["y"])], [scale])


def heavy_model(factor: float, width: int = 1024, depth: int = 24) -> bytes:
    """y = factor * x, after `depth` products with a `width`-square matrix (milliseconds)."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((WIDTH, width)).astype(np.float32) / 2
    w2 = rng.standard_normal((width, width)).astype(np.float32) / width
    w3 = np.zeros((width, WIDTH), dtype=np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (w3, "w3"))]
    inits.append(numpy_helper.from_array(np.array(factor, dtype=np.float32), "factor"))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"])]
    nodes += [helper.make_node("MatMul", [f"h{i}", "w2"], [f"h{i + 1}"]) for i in range(depth)]
    nodes += [
        helper.make_node("MatMul", [f"h{depth}", "w3"], ["z"]),  # zeros: keeps y exact
        helper.make_node("Mul", ["x", "factor"], ["s"]),
        helper.make_node("Add", ["s", "z"], ["y"]),
    ]
    return _graph(nodes, inits)


def _graph(nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto]) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def write_version(
    repo: Path,
    model: str,
    version: int,
    data: bytes,
    *,
    name: str = "model.onnx",
    aged: bool = True,
) -> Path:
    """Write a version's file; `aged` back-dates it so the settle rule sees it as complete."""
    path = repo / model / str(version) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if aged:
        age(path)
    return path


def age(path: Path, seconds: float = 60.0) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def inputs(rows: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.arange(rows * WIDTH, dtype=np.float32).reshape(rows, WIDTH) + 1}
