"""Integer Div and Mod as served: INT_MIN / -1 answers (numpy's wrap) instead of killing the
process with SIGFPE, and every other answer is ONNX Runtime's own, bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from duetime.repository.graphs import guard_integer_division, study_graph
from duetime.repository.layout import MODEL_FILENAME, scan_model
from duetime.repository.loader import load_version

pytestmark = pytest.mark.timeout(120)

ONNX_OF = {np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int64): TensorProto.INT64}


def division_model(
    op: str, dtype: type[np.signedinteger], *, b_shape: list[int | str] | None = None, **attrs: int
) -> onnx.ModelProto:
    """y = op(a, b) for a [N, 3] and b of `b_shape` (a's shape by default)."""
    kind = ONNX_OF[np.dtype(dtype)]
    graph = helper.make_graph(
        [helper.make_node(op, ["a", "b"], ["y"], **attrs)], "division",
        [helper.make_tensor_value_info("a", kind, ["N", 3]),
         helper.make_tensor_value_info("b", kind, b_shape or ["N", 3])],
        [helper.make_tensor_value_info("y", kind, ["N", 3])],
    )  # fmt: skip
    return finished(graph)


def finished(graph: onnx.GraphProto, opset: int = 17) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def guarded(model: onnx.ModelProto) -> ort.InferenceSession:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assert guard_integer_division(copy) > 0
    onnx.checker.check_model(copy, full_check=True)
    return session_of(copy)


def session_of(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def operands(dtype: type[np.signedinteger], rows: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Pairs that cannot trap unguarded (no INT_MIN over -1, no zero divisor), edges included:
    -1 divisors, INT_MIN and INT_MAX dividends, both signs."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(7)
    a = rng.integers(info.min, info.max, (rows, 3), dtype=dtype, endpoint=True)
    b = rng.integers(-9, 10, (rows, 3), dtype=dtype)
    a[:40] = rng.choice(
        np.array([info.min, info.max, info.min + 1, -1, 0, 1], dtype=dtype), (40, 3)
    )
    b[40:80] = -1
    b[b == 0] = 3
    a[(a == info.min) & (b == -1)] = info.min + 1
    return a, b


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize(
    ("op", "attrs"), [("Div", {}), ("Mod", {}), ("Mod", {"fmod": 1})], ids=["div", "mod", "fmod"]
)
def test_guarded_integer_division_answers_what_onnx_runtime_does_bit_for_bit(
    dtype: type[np.signedinteger], op: str, attrs: dict[str, int]
) -> None:
    model = division_model(op, dtype, **attrs)
    a, b = operands(dtype)
    (want,) = session_of(model).run(None, {"a": a, "b": b})
    (got,) = guarded(model).run(None, {"a": a, "b": b})
    assert got.dtype == want.dtype
    assert np.array_equal(got, want)


@pytest.mark.parametrize("b_shape", [[1], [3], ["N", 1]])
def test_a_broadcast_divisor_is_guarded_with_its_own_shape(b_shape: list[int | str]) -> None:
    model = division_model("Div", np.int64, b_shape=b_shape)
    a, _ = operands(np.int64)
    a[a == np.iinfo(np.int64).min] = 5  # (unguarded, over -1 it traps)
    b = np.full([len(a) if d == "N" else d for d in b_shape], -1, dtype=np.int64)
    (want,) = session_of(model).run(None, {"a": a, "b": b})
    (got,) = guarded(model).run(None, {"a": a, "b": b})
    assert np.array_equal(got, want)


def test_division_by_zero_is_still_onnx_runtimes_error() -> None:
    session = guarded(division_model("Div", np.int32))
    with pytest.raises(Exception, match="division by zero"):
        session.run(None, {"a": np.ones((1, 3), np.int32), "b": np.zeros((1, 3), np.int32)})


def test_float_division_and_constant_divisors_without_minus_one_are_left_alone() -> None:
    graph = helper.make_graph(
        [helper.make_node("Div", ["x", "x"], ["y"]),
         helper.make_node("Div", ["n", "two"], ["half"]),
         helper.make_node("Mod", ["n", "two"], ["odd"])], "alone",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("n", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info(name, kind, shape) for name, kind, shape in (
            ("y", TensorProto.FLOAT, ["N", 3]), ("half", TensorProto.INT64, ["N"]),
            ("odd", TensorProto.INT64, ["N"]))],
        [numpy_helper.from_array(np.array(2, dtype=np.int64), "two")],
    )  # fmt: skip
    model = finished(graph)
    before = model.SerializeToString()
    assert guard_integer_division(model) == 0
    assert model.SerializeToString() == before


def loop_and_branch_model() -> onnx.ModelProto:
    """y = a Div b inside an If's then-branch, inside a Loop's body (one trip); Mod in else."""
    kind = TensorProto.INT32

    def branch(op: str) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node(op, ["a", "b"], [f"{op}_out"])], f"{op}_branch", [],
            [helper.make_tensor_value_info(f"{op}_out", kind, None)],
        )  # fmt: skip

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("If", ["flag"], ["picked"], then_branch=branch("Div"),
                          else_branch=branch("Mod"))], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("picked", kind, None)],
    )  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", ""], ["ys"], body=body)], "nested",
        [helper.make_tensor_value_info("a", kind, [3]),
         helper.make_tensor_value_info("b", kind, [3]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("ys", kind, [1, 3])],
        [numpy_helper.from_array(np.array(1, dtype=np.int64), "trips")],
    )  # fmt: skip
    return finished(graph)


def test_divisions_inside_loop_and_if_bodies_are_guarded() -> None:
    model = loop_and_branch_model()
    a, b = np.array([7, -7, 9], np.int32), np.array([-1, 2, -1], np.int32)
    session = guarded(model)
    for flag in (True, False):
        feeds = {"a": a, "b": b, "flag": np.array(flag)}
        assert np.array_equal(session.run(None, feeds)[0], session_of(model).run(None, feeds)[0])


def test_a_division_in_a_model_local_function_is_guarded() -> None:
    kind = TensorProto.INT64
    function = helper.make_function(
        "local", "quotient", ["p", "q"], ["r"], [helper.make_node("Div", ["p", "q"], ["r"])],
        [helper.make_opsetid("", 17)],
    )  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("quotient", ["a", "b"], ["y"], domain="local")], "functions",
        [helper.make_tensor_value_info(name, kind, [3]) for name in ("a", "b")],
        [helper.make_tensor_value_info("y", kind, [3])],
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
        functions=[function],
    )  # fmt: skip
    model.ir_version = 8
    a, b = np.array([7, -7, 9], np.int64), np.array([-1, 2, -1], np.int64)
    assert np.array_equal(guarded(model).run(None, {"a": a, "b": b})[0], [-7, -3, -9])


def write_version(root: Path, model: onnx.ModelProto, *, external: bool = False) -> Path:
    folder = root / "div" / "1"
    folder.mkdir(parents=True)
    path = folder / MODEL_FILENAME
    if external:
        onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data",
                  size_threshold=0)  # fmt: skip
    else:
        onnx.save(model, str(path))
    return root / "div"


TRAP = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    from duetime.repository.layout import scan_model
    from duetime.repository.loader import load_version

    model = load_version(scan_model(Path(sys.argv[1])), 1)
    dtype = np.dtype(sys.argv[2])
    a = np.array([[np.iinfo(dtype).min, 9, np.iinfo(dtype).min]], dtype=dtype)
    b = np.array([[-1, -1, 1]], dtype=dtype)
    answers = [model.executor.run_sync({"a": a, "b": b})[0].tolist()]
    model.executor.close()
    print(json.dumps(answers))
    """
)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("op", ["Div", "Mod"])
def test_int_min_over_minus_one_answers_as_numpy_instead_of_killing_the_process(
    tmp_path: Path, dtype: str, op: str
) -> None:
    # (in a process of its own: unguarded, SIGFPE kills it, and would kill pytest)
    folder = write_version(tmp_path, division_model(op, np.dtype(dtype).type))
    command = [sys.executable, "-c", TRAP, str(folder), dtype]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]
    low = int(np.iinfo(dtype).min)  # (INT_MIN // -1 wraps to INT_MIN in numpy too)
    assert json.loads(done.stdout) == [[[low, -9, low] if op == "Div" else [0, 0, 0]]]


def test_a_guarded_model_with_external_data_loads_and_answers(tmp_path: Path) -> None:
    kind = TensorProto.INT64
    divisors = np.array([[-1, 2, -3]], dtype=np.int64)
    weights = np.arange(3000, dtype=np.int64)  # (bulk for the data file)
    graph = helper.make_graph(
        [helper.make_node("Div", ["a", "divisors"], ["y"]),
         helper.make_node("ReduceSum", ["weights"], ["total"], keepdims=0)], "external",
        [helper.make_tensor_value_info("a", kind, ["N", 3])],
        [helper.make_tensor_value_info("y", kind, ["N", 3]),
         helper.make_tensor_value_info("total", kind, [])],
        [numpy_helper.from_array(divisors, "divisors"),
         numpy_helper.from_array(weights, "weights")],
    )  # fmt: skip
    folder = write_version(tmp_path, finished(graph), external=True)
    assert (folder / "1" / "model.onnx.data").is_file()
    assert study_graph(folder / "1" / MODEL_FILENAME).guarded is not None
    loaded = load_version(scan_model(folder), 1)
    try:
        y, total = loaded.executor.run_sync({"a": np.array([[5, 7, 9]], dtype=np.int64)})
        assert y.tolist() == [[-5, 3, -3]]
        assert int(total) == int(weights.sum())
    finally:
        loaded.executor.close()
