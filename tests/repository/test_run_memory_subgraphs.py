"""`--max-run-memory-bytes` past the main graph's pass-through ops: a Loop's scan outputs (its
trip count M from the request), nodes in subgraphs (an If's branch, a Loop's body), and sizes
computed by arithmetic on the request's values; what it cannot bound is named at load.

Found by a tester (repro_loop_memory.py): with the limit at 64 MiB, a request with a Loop's
trip count M = 10**9 (4 GB of scan output) was run, its memory growing ~100 MB/s until its due
time (without one, until the OOM killer); a ConstantOfShape in an If's branch asking 512 MiB
was answered 200, and so was ConstantOfShape(Mul(n, 1024)). Nothing here is allocated big: the
sizes are computed, the refused requests never run.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from repo_models import write_version

from duetime.errors import InvalidInput
from duetime.repository.graphs import graph_facts, study_graph
from duetime.repository.layout import scan_model
from duetime.repository.loader import load_version

LIMIT = 64 * 2**20
V = helper.make_tensor_value_info


def model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: Any = ()) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    made.ir_version = 8
    return made.SerializeToString()


def looping(start: bool | None = True) -> bytes:
    """The tester's model: Loop(M, true, x) whose body stacks a float per iteration (`trace`);
    `start` the initial condition (None: the request's input `go`)."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["acc_in"], ["acc_out"]),
            helper.make_node("Cast", ["iter"], ["scan_o"], to=TensorProto.FLOAT),
        ],
        "body",
        [V("iter", TensorProto.INT64, []), V("cond_in", TensorProto.BOOL, []),
         V("acc_in", TensorProto.FLOAT, None)],
        [V("cond_out", TensorProto.BOOL, []), V("acc_out", TensorProto.FLOAT, None),
         V("scan_o", TensorProto.FLOAT, [])],
    )  # fmt: skip
    nodes = [helper.make_node("Loop", ["M", "go", "x"], ["y", "trace"], "loop", body=body)]
    inputs = [V("x", TensorProto.FLOAT, [1]), V("M", TensorProto.INT64, [])]
    if start is None:
        inputs.append(V("go", TensorProto.BOOL, []))
    else:
        value = helper.make_tensor("t", TensorProto.BOOL, [], [start])
        nodes.insert(0, helper.make_node("Constant", [], ["go"], value=value))
    return model(
        nodes, inputs, [V("y", TensorProto.FLOAT, [1]), V("trace", TensorProto.FLOAT, ["K"])]
    )


def branching() -> bytes:
    """If(c) then ConstantOfShape(shape) summed, else x summed: the shape and c the request's."""
    ones = numpy_helper.from_array(np.array([1.0], np.float32), "v")
    then = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["big"], "big", value=ones),
         helper.make_node("ReduceSum", ["big"], ["t"], keepdims=0)],
        "then", [], [V("t", TensorProto.FLOAT, [])],
    )  # fmt: skip
    other = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["e"], keepdims=0)],
        "else", [], [V("e", TensorProto.FLOAT, [])],
    )  # fmt: skip
    return model(
        [helper.make_node("If", ["c"], ["y"], "choose", then_branch=then, else_branch=other)],
        [V("c", TensorProto.BOOL, []), V("shape", TensorProto.INT64, [1]),
         V("x", TensorProto.FLOAT, [2])],
        [V("y", TensorProto.FLOAT, [])],
    )  # fmt: skip


def multiplied() -> bytes:
    """ConstantOfShape(Unsqueeze(Mul(n, 1024))) summed, n an int64 scalar, and a row count
    ConstantOfShape(Concat(Gather(Shape(x), 0), n)) beside it."""
    return model(
        [
            helper.make_node("Mul", ["n", "k"], ["nk"]),
            helper.make_node("Unsqueeze", ["nk", "axis"], ["dims"]),
            helper.make_node("ConstantOfShape", ["dims"], ["big"], "big"),
            helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0),
            helper.make_node("Shape", ["x"], ["xs"]),
            helper.make_node("Gather", ["xs", "first"], ["rows"]),
            helper.make_node("Unsqueeze", ["n", "axis"], ["n1"]),
            helper.make_node("Concat", ["rows", "n1"], ["grid"], axis=0),
            helper.make_node("ConstantOfShape", ["grid"], ["table"], "table"),
        ],
        [V("n", TensorProto.INT64, []), V("x", TensorProto.FLOAT, ["N", 3])],
        [V("y", TensorProto.FLOAT, []), V("table", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array(1024, np.int64), "k"),
            numpy_helper.from_array(np.array([0], np.int64), "axis"),
            numpy_helper.from_array(np.array([0], np.int64), "first"),
        ],
    )


def asked(data: bytes, **feeds: Any) -> dict[str, int | None]:
    facts = graph_facts(onnx.load_from_string(data))
    given = {name: np.asarray(value) for name, value in feeds.items()}
    return {node.described: node.bytes_asked(given) for node in facts.sized_nodes}


LOOP = "Loop node 'loop' (its scan outputs, at least 4 bytes an iteration)"


def test_a_loops_scan_outputs_are_its_trip_count_times_an_iteration() -> None:
    assert asked(looping(), x=np.ones(1, np.float32), M=np.array(10**9)) == {LOOP: 4 * 10**9}
    assert asked(looping(), x=np.ones(1, np.float32), M=np.array(10)) == {LOOP: 40}
    stopped = asked(looping(None), M=np.array(10**9), go=np.array(False))
    assert stopped == {LOOP: 0}  # (its condition false from the start: no iteration)
    assert asked(looping(False), M=np.array(10**9)) == {LOOP: 0}


def test_a_node_in_an_if_branch_counts_where_the_branch_runs() -> None:
    big = np.array([2**27], np.int64)  # 512 MiB of float32
    node = "ConstantOfShape node 'big'"
    assert asked(branching(), c=np.array(True), shape=big) == {node: 2**29}
    assert asked(branching(), c=np.array(False), shape=big) == {node: 0}


def test_sizes_computed_by_arithmetic_on_the_values() -> None:
    sizes = asked(multiplied(), n=np.array(2**20), x=np.ones((5, 3), np.float32))
    assert sizes == {
        "ConstantOfShape node 'big'": 2**30 * 4,
        "ConstantOfShape node 'table'": 5 * 2**20 * 4,
    }


@pytest.mark.parametrize(
    ("data", "feeds", "field"),
    [
        (looping(), {"x": np.ones(1, np.float32), "M": np.array(10**9)}, "input 'M'"),
        (branching(), {"c": np.array(True), "shape": np.array([2**27]),
                       "x": np.ones(2, np.float32)}, "input 'shape'"),
        (multiplied(), {"n": np.array(2**20), "x": np.ones((1, 3), np.float32)}, "input 'n'"),
    ],
    ids=["loop", "if", "mul"],
)  # fmt: skip
def test_the_loaded_model_refuses_the_request_before_it_runs(
    tmp_path: Path, data: bytes, feeds: dict[str, np.ndarray], field: str
) -> None:
    write_version(tmp_path, "m", 1, data)
    (tmp_path / "m" / "config.toml").write_text("max_batch_size = 0\n")
    loaded = load_version(scan_model(tmp_path / "m"), 1, max_run_memory_bytes=LIMIT)
    try:
        with pytest.raises(InvalidInput, match=f"{field}: its values ask .* over the {LIMIT}"):
            loaded.validator.prepare(feeds, None)
    finally:
        loaded.executor.close()


def while_loop() -> bytes:
    """A Loop without a trip count, its condition the request's (`x` > 0 each time), stacking
    a float per iteration; and ConstantOfShape of a count computed by ReduceSum."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["iter"], ["scan_o"], to=TensorProto.FLOAT)],
        "body", [V("iter", TensorProto.INT64, []), V("cond_in", TensorProto.BOOL, [])],
        [V("cond_out", TensorProto.BOOL, []), V("scan_o", TensorProto.FLOAT, [])],
    )  # fmt: skip
    return model(
        [
            helper.make_node("Loop", ["", "go"], ["trace"], "forever", body=body),
            helper.make_node("ReduceSum", ["n", "axis"], ["total"], keepdims=1),
            helper.make_node("ConstantOfShape", ["total"], ["z"], "summed"),
        ],
        [V("go", TensorProto.BOOL, []), V("n", TensorProto.INT64, [2])],
        [V("trace", TensorProto.FLOAT, ["K"]), V("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([0], np.int64), "axis")],
    )


def test_what_cannot_be_bounded_is_named_at_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    facts = graph_facts(onnx.load_from_string(while_loop()))
    assert facts.unbounded == ("Loop node 'forever'", "ConstantOfShape node 'summed'")
    assert facts.sized_nodes == ()
    path = write_version(tmp_path, "m", 1, while_loop())
    with caplog.at_level(logging.WARNING, logger="duetime.graphs"):
        study_graph(path)
    (record,) = [r for r in caplog.records if "max-run-memory-bytes" in r.getMessage()]
    assert "Loop node 'forever', ConstantOfShape node 'summed'" in record.getMessage()
    # what is bounded, or fixed, is not warned of
    assert graph_facts(onnx.load_from_string(looping())).unbounded == ()
    assert graph_facts(onnx.load_from_string(multiplied())).unbounded == ()


def unpooling() -> bytes:
    """The tester's model: MaxUnpool of a one-pixel x to the request's `output_shape`, summed."""
    return model(
        [helper.make_node("MaxUnpool", ["x", "i", "shape"], ["u"], "unpool",
                          kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("ReduceSum", ["u"], ["y"], keepdims=0)],
        [V("x", TensorProto.FLOAT, [1, 1, 1, 1]), V("i", TensorProto.INT64, [1, 1, 1, 1]),
         V("shape", TensorProto.INT64, [4])],
        [V("y", TensorProto.FLOAT, [])],
    )  # fmt: skip


def test_maxunpool_asks_its_output_shape() -> None:
    """Its output_shape input sizes its output (it was run: 6.4 GB for [1, 1, 40000, 40000])."""
    one = {"x": np.ones((1, 1, 1, 1), np.float32), "i": np.zeros((1, 1, 1, 1), np.int64)}
    shape = np.array([1, 1, 40000, 40000], np.int64)
    assert asked(unpooling(), **one, shape=shape) == {"MaxUnpool node 'unpool'": 4 * 40000**2}
    small = np.array([1, 1, 2, 2], np.int64)
    assert asked(unpooling(), **one, shape=small) == {"MaxUnpool node 'unpool'": 16}


def test_a_loaded_maxunpool_refuses_an_output_shape_over_the_limit(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, unpooling())
    (tmp_path / "m" / "config.toml").write_text("max_batch_size = 0\n")
    loaded = load_version(scan_model(tmp_path / "m"), 1, max_run_memory_bytes=LIMIT)
    one = {"x": np.ones((1, 1, 1, 1), np.float32), "i": np.zeros((1, 1, 1, 1), np.int64)}
    try:
        with pytest.raises(
            InvalidInput, match=f"input 'shape': its values ask .* over the {LIMIT}"
        ):
            loaded.validator.prepare({**one, "shape": np.array([1, 1, 40000, 40000])}, None)
        loaded.validator.prepare({**one, "shape": np.array([1, 1, 2, 2])}, None)  # (runs)
    finally:
        loaded.executor.close()
