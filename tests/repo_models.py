"""Small ONNX graphs written on the fly, each answering in a way that tells them apart."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from duetime.engine import Engine
from duetime.repository.manager import RepositoryOptions

WIDTH = 4


def scale_model(factor: float) -> bytes:
    """y = factor * x for x FP32 [-1, 4]: the answer names the model."""
    scale = numpy_helper.from_array(np.array(factor, dtype=np.float32), "factor")
    return _graph([helper.make_node("Mul", ["x", "factor"], ["y"])], [scale])


def stacking_model() -> bytes:
    """y = Concat(x, x) on the first axis: a free first dim that is not the batch (2N rows)."""
    return _graph([helper.make_node("Concat", ["x", "x"], ["y"], axis=0)], [])


def mixing_model() -> bytes:
    """y = the running sum of x over the first axis: as many rows as x, each from those before."""
    axis = numpy_helper.from_array(np.array(0, dtype=np.int64), "axis")
    return _graph([helper.make_node("CumSum", ["x", "axis"], ["y"])], [axis])


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


def tiling_model() -> bytes:
    """y = x (FP32 [3]) tiled n (INT64 [1]) times along a new axis: [n, 3], an answer of any
    size from a request of 20 bytes."""
    graph = helper.make_graph(
        [helper.make_node("Concat", ["n", "three"], ["shape"], axis=0),
         helper.make_node("Expand", ["x", "shape"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["count", 3])],
        [helper.make_tensor("three", TensorProto.INT64, [1], [3])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def wide_tile_model() -> bytes:
    """y = Tile(x, [1, 25000]): 400 KB of answer (FP32 [n, 100000]) for each row of 4 floats."""
    repeats = numpy_helper.from_array(np.array([1, 25_000], dtype=np.int64), "repeats")
    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "repeats"], ["y"])], "tile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 100_000])], [repeats],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


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


def faulty_model(work: int = 256) -> bytes:
    """y = x for x FP32 [-1, 4], with a control input `k` INT64 [-1, 1]: any k = 1 in the batch
    makes ONNX Runtime fail (a Reshape to 5 columns), and max(k) = n > 1 runs n rounds of a
    `work`-square matrix product first (slows the model on demand)."""
    w = numpy_helper.from_array(np.eye(work, dtype=np.float32) * np.float32(0.5), "w")
    consts = [
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus_one"),
        numpy_helper.from_array(np.array([4], dtype=np.int64), "four"),
        numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
        numpy_helper.from_array(np.ones((1, work), dtype=np.float32), "h0"),
        numpy_helper.from_array(np.array(True), "true"),
        numpy_helper.from_array(np.array(0.0, dtype=np.float32), "nought"),
        w,
    ]
    # body of the loop: h <- h @ w (cond stays true)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["h_in", "w"], ["h_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, work]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, work]),
        ],
    )
    nodes = [
        helper.make_node("ReduceMax", ["k"], ["kmax"], keepdims=0),
        # fail: reshape x to [-1, 4 + (k == 1)]
        helper.make_node("Equal", ["kmax", "one"], ["is_one"]),
        helper.make_node("Cast", ["is_one"], ["extra"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["extra", "zero_axes"], ["extra1"]),
        helper.make_node("Add", ["four", "extra1"], ["cols"]),
        helper.make_node("Concat", ["minus_one", "cols"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["x2"]),
        # slow: max(k) rounds of h @ w when k > 1
        helper.make_node("Greater", ["kmax", "one"], ["is_slow"]),
        helper.make_node("Where", ["is_slow", "kmax", "zero"], ["trips"]),
        helper.make_node("Loop", ["trips", "true", "h0"], ["h"], body=body),
        helper.make_node("ReduceSum", ["h"], ["hsum"], keepdims=0),
        helper.make_node("Mul", ["hsum", "nought"], ["none"]),
        helper.make_node("Add", ["x2", "none"], ["y"]),
    ]
    consts.append(numpy_helper.from_array(np.array([0], dtype=np.int64), "zero_axes"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])
    k = helper.make_tensor_value_info("k", TensorProto.INT64, ["batch", 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])
    graph = helper.make_graph(nodes, "faulty", [x, k], [y], initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


Scenario = Callable[[Engine], Awaitable[None]]


def faulty_rounds(seconds: float) -> int:
    """The `k` that keeps `faulty_model` running about `seconds` on this machine: at least, as
    timed on a quiet CPU (the fastest of 3 runs).

    NOTE: timed once, a run slowed by other programs gave too small a `k`: the server's run
    then ended before the region changed (the suite beside another load, twice in one run)."""
    import onnxruntime as ort  # (only the tests that slow the model need it)

    session = ort.InferenceSession(faulty_model(), providers=["CPUExecutionProvider"])
    feeds = {"x": np.ones((1, 4), np.float32), "k": np.array([[2000]], np.int64)}
    session.run(None, feeds)
    fastest = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        session.run(None, feeds)
        fastest = min(fastest, time.perf_counter() - started)
    return max(2, int(2000 * seconds / max(fastest, 1e-6)))


def run_on_engine(
    repo: Path, scenario: Scenario, *, limit_s: float | None = None, **options: Any
) -> None:
    """`scenario` on an engine made by `Engine.start` on a loop of its own, closed after it
    (`limit_s`: a scenario that hangs fails after that long)."""

    async def main() -> None:
        engine = await Engine.start(repo, options=RepositoryOptions(**options))
        try:
            await asyncio.wait_for(scenario(engine), limit_s)
        finally:
            await engine.aclose()

    asyncio.run(main())


async def factor_of(engine: Engine, model: str = "m", **kwargs: Any) -> float:
    """Which scale model answered: y / x."""
    out = await engine.infer_async(model, inputs(), **kwargs)
    return float(out["y"][0, 0] / inputs()["x"][0, 0])


def served_with_traffic(
    repo: Path, models: dict[int, bytes], traffic: str, caplog: Any, about: str
) -> tuple[float, dict[str, str], list[str]]:
    """Model `m`'s versions `models` (version -> ONNX bytes), all served, with the `[traffic]`
    table `traffic`: which scale factor answered a request naming no version (see
    `factor_of`), the repository index's reason for each version, and the load's warnings
    (pytest's `caplog`) that mention `about`."""
    for version, model in models.items():
        write_version(repo, "m", version, model)
    path = repo / "m" / "config.toml"
    path.write_text("version_policy = { all = {} }\n[traffic]\n" + traffic)
    age(path)
    reasons: dict[str, str] = {}
    answered: list[float] = []

    async def scenario(engine: Engine) -> None:
        answered.append(await factor_of(engine))
        assert engine.manager is not None
        for entry in engine.manager.index():
            reasons[entry["version"]] = entry["reason"]

    with caplog.at_level(logging.WARNING, logger="duetime.manager"):
        run_on_engine(repo, scenario)
    warnings = [r.getMessage() for r in caplog.records if about in r.getMessage()]
    return answered[0], reasons, warnings
