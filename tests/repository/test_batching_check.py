"""The load-time check that a free first dim is a batch: rows that interact, however little, and
outputs sized by the values are served unbatched; the demo models batch (their int8 variants run
each request alone: see test_quantized_rows_alone)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import quantize_dynamic

from duetime.config import ModelConfig
from duetime.demo import write_demo_repository
from duetime.execution.executor import BatchJob
from duetime.execution.ort import graph_specs
from duetime.repository.graphs import GraphFacts, graph_facts, study_graph
from duetime.repository.layout import MODEL_FILENAME, scan_model
from duetime.repository.loader import (
    LoadedModel,
    batching_problem,
    load_version,
    reconcile,
    sample_inputs,
)
from duetime.types import ModelSignature, TensorSpec

pytestmark = pytest.mark.timeout(120)


def model_of(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, list[int | str]]],
    outputs: list[tuple[str, int, list[int | str]]],
    initializers: tuple[tuple[str, np.ndarray], ...] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(name, kind, shape) for name, kind, shape in inputs],
        [helper.make_tensor_value_info(name, kind, shape) for name, kind, shape in outputs],
        [numpy_helper.from_array(array, name) for name, array in initializers],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


INT64, FLOAT, BOOL, STRING = (
    TensorProto.INT64,
    TensorProto.FLOAT,
    TensorProto.BOOL,
    TensorProto.STRING,
)
AXIS0 = (("axis", np.array(0, dtype=np.int64)),)

MIXING_MODELS = {
    # (the testers' cumsum_int: all-zero integer samples sum to zeros)
    "int running sum": model_of(
        [helper.make_node("CumSum", ["x", "axis"], ["y"])],
        [("x", INT64, ["N", 2])], [("y", INT64, ["N", 2])], AXIS0,
    ),
    # (the testers' center_small: moves each row by 0.15 of the rows' mean, under 20% of scale)
    "slight centring": model_of(
        [helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
         helper.make_node("Mul", ["m", "w"], ["mw"]), helper.make_node("Sub", ["x", "mw"], ["y"])],
        [("x", FLOAT, ["N", 4])], [("y", FLOAT, ["N", 4])],
        (("w", np.array(0.15, dtype=np.float32)),),
    ),
    # (all-False samples: a running count of them is zeros)
    "bool running count": model_of(
        [helper.make_node("Cast", ["x"], ["n"], to=INT64),
         helper.make_node("CumSum", ["n", "axis"], ["y"])],
        [("x", BOOL, ["N", 3])], [("y", INT64, ["N", 3])], AXIS0,
    ),
    # (all-empty string samples: every row is the first)
    "strings of the first row": model_of(
        [helper.make_node("Shape", ["x"], ["rows"], end=1),
         helper.make_node("ConstantOfShape", ["rows"], ["firsts"],
                          value=numpy_helper.from_array(np.array([0], dtype=np.int64))),
         helper.make_node("Gather", ["x", "firsts"], ["y"], axis=0)],
        [("x", STRING, ["N", 2])], [("y", STRING, ["N", 2])],
    ),
    # (the testers' slice3: row 2 of the batch, empty below 3 rows, added to every row)
    "row 2 added": model_of(
        [helper.make_node("Slice", ["x", "two", "three", "zero"], ["r2"]),
         helper.make_node("ReduceSum", ["r2", "zero"], ["s"], keepdims=1),
         helper.make_node("Add", ["x", "s"], ["y"])],
        [("x", FLOAT, ["N", 4])], [("y", FLOAT, ["N", 4])],
        (("two", np.array([2], dtype=np.int64)), ("three", np.array([3], dtype=np.int64)),
         ("zero", np.array([0], dtype=np.int64))),
    ),
    # (the testers' ifn3: centred on the rows' mean from 3 rows on; a 5-row request padded to
    # 6 was moved by its padding)
    "centred from 3 rows": model_of(
        [helper.make_node("Shape", ["x"], ["shape"]),
         helper.make_node("Gather", ["shape", "first"], ["n"], axis=0),
         helper.make_node("GreaterOrEqual", ["n", "three"], ["c"]),
         helper.make_node("If", ["c"], ["y"], then_branch=helper.make_graph(
             [helper.make_node("ReduceMean", ["x"], ["m"], axes=[0], keepdims=1),
              helper.make_node("Sub", ["x", "m"], ["t"])], "then", [],
             [helper.make_tensor_value_info("t", FLOAT, ["N", 4])]),
             else_branch=helper.make_graph(
             [helper.make_node("Identity", ["x"], ["e"])], "else", [],
             [helper.make_tensor_value_info("e", FLOAT, ["N", 4])]))],
        [("x", FLOAT, ["N", 4])], [("y", FLOAT, ["N", 4])],
        (("first", np.array(0, dtype=np.int64)), ("three", np.array(3, dtype=np.int64))),
    ),
    # (the testers' thresh: the rows' maximum past 10 added, never so on N(0, 1) samples)
    "maximum past a threshold": model_of(
        [helper.make_node("ReduceMax", ["x"], ["m"], axes=[0], keepdims=1),
         helper.make_node("Sub", ["m", "ten"], ["d"]), helper.make_node("Relu", ["d"], ["r"]),
         helper.make_node("Add", ["x", "r"], ["y"])],
        [("x", FLOAT, ["N", 4])], [("y", FLOAT, ["N", 4])],
        (("ten", np.array(10, dtype=np.float32)),),
    ),
}  # fmt: skip


def load(
    root: Path, model: onnx.ModelProto, loaded: list[LoadedModel], config: str = ""
) -> LoadedModel:
    folder = root / "m"
    (folder / "1").mkdir(parents=True)
    onnx.save(model, str(folder / "1" / MODEL_FILENAME))
    if config:
        (folder / "config.toml").write_text(config)
    result = load_version(scan_model(folder), 1, profile_budget_s=0.01)
    loaded.append(result)
    return result


@pytest.mark.parametrize("name", list(MIXING_MODELS))
def test_a_model_whose_rows_interact_is_served_unbatched(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture, name: str
) -> None:
    model = load(tmp_path, MIXING_MODELS[name], loaded)
    assert model.signature.max_batch_size == 0
    assert "its rows are not independent" in caplog.text


def test_a_model_taking_integer_inputs_as_indices_into_a_small_table_still_batches(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    # (the distinct samples 1 and 2 are out of a 2-row table: the zeros-and-ones sample is not)
    gather = model_of(
        [helper.make_node("Gather", ["table", "index"], ["y"], axis=0)],
        [("index", INT64, ["N"])], [("y", FLOAT, ["N", 3])],
        (("table", np.arange(6, dtype=np.float32).reshape(2, 3)),),
    )  # fmt: skip
    assert load(tmp_path, gather, loaded).signature.max_batch_size > 0


def test_integer_bool_and_string_samples_differ_from_row_to_row() -> None:
    signature = ModelSignature(
        tuple(TensorSpec(n, t, (-1, 3)) for n, t in (("i", "INT8"), ("b", "BOOL"), ("s", "BYTES"))),
        (), max_batch_size=4,
    )  # fmt: skip
    for fill in ("distinct", "binary"):
        feeds = sample_inputs(signature, 2, fill=fill)  # type: ignore[arg-type]
        assert all(not np.array_equal(array[0], array[1]) for array in feeds.values())
    distinct = sample_inputs(signature, 2, fill="distinct")
    assert (distinct["i"] != 0).all()
    assert sample_inputs(signature, 2, fill="binary")["i"].tolist() == [[0, 0, 0], [1, 1, 1]]
    zeros = sample_inputs(signature, 2)  # (warm-up and profiling: an index any table has)
    assert not zeros["i"].any()
    assert not zeros["b"].any()


def test_samples_of_scalar_inputs_are_arrays_of_every_datatype() -> None:
    """A scalar BOOL input's sample was a numpy.bool_, which ORT refuses: warm-up and profiling
    failed, and the model got a made-up 1 ms per row that refused requests it answers in µs."""
    types = ("BOOL", "INT32", "UINT8", "FP32", "FP16", "BYTES")
    signature = ModelSignature(
        tuple(TensorSpec(f"x{i}", t, ()) for i, t in enumerate(types)), (), max_batch_size=0
    )
    for fill in ("zeros", "distinct", "binary"):
        feeds = sample_inputs(signature, 1, fill=fill)  # type: ignore[arg-type]
        assert all(type(array) is np.ndarray and array.shape == () for array in feeds.values())


def test_the_demo_models_batch_and_their_dynamically_quantized_variants_run_alone(
    tmp_path: Path,
) -> None:
    """Quantized dynamically, rows share their batch's activation scale: `coupled`, whatever
    the N(0, 1) samples show (see test_quantized_rows_alone)."""
    root = write_demo_repository(tmp_path / "demo")
    for name in ("mlp", "orderbook", "deeplob"):
        path = root / name / "1" / MODEL_FILENAME
        int8 = path.with_name("int8.onnx")
        quantize_dynamic(str(path), str(int8))
        for file in (path, int8):
            facts = study_graph(file).facts
            assert facts is not None
            assert facts.dynamically_quantized is (file == int8)
            session = ort.InferenceSession(str(file), providers=["CPUExecutionProvider"])
            signature = reconcile(ModelConfig(), *graph_specs(session, file), source=name)
            assert signature.max_batch_size > 0
            problem = batching_problem(session, signature, facts)
            if file == int8:
                assert problem is not None, file
                assert problem.coupled
                assert not problem.rows_differ
                assert not problem.sized_by_values
            else:
                assert problem is None, file


# -- outputs sized by the values ------------------------------------------------------------------


def test_a_unique_model_is_served_unbatched(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    # (the testers' unique0: random float rows never repeat, so two rows gave two)
    unique = model_of(
        [helper.make_node("Unique", ["x"], ["u"], sorted=0)],
        [("x", FLOAT, ["N"])], [("u", FLOAT, ["U"])],
    )  # fmt: skip
    assert load(tmp_path, unique, loaded).signature.max_batch_size == 0
    assert "output 'u'" in caplog.text


VALUE_SIZED = {
    "Unique": ([helper.make_node("Unique", ["x"], ["y"])], "Unique"),
    "NonZero": ([helper.make_node("NonZero", ["x"], ["y"])], "NonZero"),
    "Compress": (
        [helper.make_node("Greater", ["x", "zero"], ["keep"]),
         helper.make_node("Compress", ["x", "keep"], ["y"], axis=0)], "Compress",
    ),
    "TopK of a count read from the input": (
        [helper.make_node("ReduceMax", ["x"], ["top"], keepdims=1),
         helper.make_node("Cast", ["top"], ["k"], to=INT64),
         helper.make_node("TopK", ["x", "k"], ["y", "i"], axis=0)], "TopK",
    ),
    "Expand to a shape read from the input": (
        [helper.make_node("Cast", ["x"], ["shape"], to=INT64),
         helper.make_node("Expand", ["x", "shape"], ["y"])], "Expand",
    ),
}  # fmt: skip


def facts_of(nodes: list[onnx.NodeProto], shape: list[int | str] | None = None) -> GraphFacts:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", FLOAT, shape or ["N"])],
        [helper.make_tensor_value_info("y", FLOAT, None)],
        [numpy_helper.from_array(np.array(0, dtype=np.float32), "zero")],
    )  # fmt: skip
    return graph_facts(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("case", list(VALUE_SIZED))
def test_an_output_from_an_op_sized_by_the_values_is_found_in_the_graph(case: str) -> None:
    nodes, op = VALUE_SIZED[case]
    facts = facts_of(nodes)
    assert op in facts.value_sized_outputs["y"]


SHAPE_SIZED = {
    "Reshape to the input's own rows": [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Concat", ["s", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ],
    "Range over the input's length": [
        helper.make_node("Size", ["x"], ["n"]),
        helper.make_node("Cast", ["n"], ["stop"], to=FLOAT),
        helper.make_node("Range", ["zero", "stop", "one"], ["y"]),
    ],
}


@pytest.mark.parametrize("case", list(SHAPE_SIZED))
def test_a_size_read_from_the_input_shape_is_not_a_value(case: str) -> None:
    graph = helper.make_graph(
        SHAPE_SIZED[case], "g", [helper.make_tensor_value_info("x", FLOAT, ["N"])],
        [helper.make_tensor_value_info("y", FLOAT, None)],
        [numpy_helper.from_array(np.array(v, dtype=t), n) for n, v, t in (
            ("minus_one", [-1], np.int64), ("zero", 0, np.float32), ("one", 1, np.float32))],
    )  # fmt: skip
    facts = graph_facts(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert facts.value_sized_outputs == {}
    assert not facts.cost_depends_on_values


def test_an_output_the_graph_sizes_by_the_values_is_a_batching_problem_even_if_samples_pass(
    tmp_path: Path,
) -> None:
    path = tmp_path / "identity.onnx"
    onnx.save(
        model_of([helper.make_node("Identity", ["x"], ["y"])], [("x", FLOAT, ["N", 2])],
                 [("y", FLOAT, ["N", 2])]), str(path),
    )  # fmt: skip
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    signature = reconcile(ModelConfig(), *graph_specs(session, path), source="m")
    assert batching_problem(session, signature, GraphFacts()) is None
    problem = batching_problem(session, signature, GraphFacts({"y": "Unique node 'u'"}))
    assert problem is not None
    assert not problem.rows_differ
    assert "Unique node 'u'" in problem.why


def _if_model(condition: list[onnx.NodeProto]) -> onnx.ModelProto:
    """y = If(c, Relu(x), Neg(x)), `condition` making c from x."""
    then = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"])], "then", [],
        [helper.make_tensor_value_info("t", FLOAT, ["N", 4])],
    )  # fmt: skip
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])], "else", [],
        [helper.make_tensor_value_info("e", FLOAT, ["N", 4])],
    )  # fmt: skip
    return model_of(
        [*condition, helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        [("x", FLOAT, ["N", 4])], [("y", FLOAT, ["N", 4])],
        (("one", np.array(1, dtype=np.int64)), ("two", np.array(2, dtype=np.int64)),
         ("zero", np.array(0.0, dtype=np.float32))),
    )  # fmt: skip


def test_an_if_on_a_shape_still_batches(tmp_path: Path, loaded: list[LoadedModel]) -> None:
    """The shape guard exporters write, If(Shape(x)[1] > 2, ...): any If counted as sized by the
    values, and such a model, whose rows are independent, lost its batching."""
    model = _if_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "one"], ["d"], axis=0),
            helper.make_node("Greater", ["d", "two"], ["c"]),
        ]
    )
    assert graph_facts(model) == GraphFacts()
    result = load(tmp_path, model, loaded)
    assert result.signature.max_batch_size > 0
    assert not result.cost_depends_on_values


def test_an_if_on_the_values_is_sized_by_them() -> None:
    model = _if_model(
        [
            helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
            helper.make_node("Greater", ["total", "zero"], ["c"]),
        ]
    )
    facts = graph_facts(model)
    assert facts.cost_depends_on_values
    assert "If node" in facts.value_sized_outputs["y"]


INNER_SIZED = {
    # (the testers' dynk: rows alone gave [1, 1] and [1, 2], which failed the load)
    "TopK of a count read from an input": model_of(
        [helper.make_node("ReduceMax", ["k"], ["top"], keepdims=1),
         helper.make_node("TopK", ["x", "top"], ["y", "i"], axis=1)],
        [("x", FLOAT, ["N", 6]), ("k", INT64, ["N"])],
        [("y", FLOAT, ["N", "K"]), ("i", INT64, ["N", "K"])],
    ),
    # (the testers' seqmask: mask[b, t] = t < lengths[b], t up to the longest)
    "a mask as long as the longest row": model_of(
        [helper.make_node("ReduceMax", ["lengths"], ["longest"], keepdims=0),
         helper.make_node("Range", ["zero", "longest", "one"], ["t"]),
         helper.make_node("Unsqueeze", ["lengths", "axis1"], ["column"]),
         helper.make_node("Less", ["t", "column"], ["y"])],
        [("lengths", INT64, ["N"])], [("y", BOOL, ["N", "T"])],
        (("zero", np.array(0, np.int64)), ("one", np.array(1, np.int64)),
         ("axis1", np.array([1], np.int64))),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(INNER_SIZED))
def test_outputs_whose_inner_dims_follow_the_row_values_are_served_unbatched(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture, name: str
) -> None:
    model = load(tmp_path, INNER_SIZED[name], loaded)
    assert model.signature.max_batch_size == 0
    assert "output 'y'" in caplog.text
    assert "served unbatched" in caplog.text


@pytest.mark.parametrize("name", list(INNER_SIZED))
def test_rows_alone_whose_outputs_differ_beyond_the_first_dim_are_sized_by_the_values(
    tmp_path: Path, name: str
) -> None:
    """Stacked, the rows' outputs ([1, 1] and [1, 2]) raised a ValueError: the load failed as an
    internal error. Shown by the samples alone (a graph the onnx package cannot read, say)."""
    path = tmp_path / "m.onnx"
    onnx.save(INNER_SIZED[name], str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    signature = reconcile(ModelConfig(), *graph_specs(session, path), source="m")
    problem = batching_problem(session, signature, GraphFacts())
    assert problem is not None
    assert not problem.rows_differ
    assert problem.sized_by_values
    assert "output 'y' has inner dims [1] for one row run alone and [2] for another" in problem.why


@pytest.mark.parametrize("name", list(INNER_SIZED))
def test_outputs_whose_inner_dims_follow_the_row_values_batch_if_the_config_asks(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture, name: str
) -> None:
    model = load(tmp_path, INNER_SIZED[name], loaded, config="max_batch_size = 8\n")
    assert model.signature.max_batch_size == 8
    assert "batched anyway, as its config asks" in caplog.text


POSITIONS = model_of(
    # (the testers' nzt: positions of each row's positive maximum, beside y = 2x)
    [helper.make_node("ReduceMax", ["x"], ["top"], axes=[1], keepdims=1),
     helper.make_node("Equal", ["x", "top"], ["is_top"]),
     helper.make_node("Greater", ["x", "zero"], ["positive"]),
     helper.make_node("And", ["is_top", "positive"], ["hit"]),
     helper.make_node("NonZero", ["hit"], ["found"]),
     helper.make_node("Transpose", ["found"], ["at"], perm=[1, 0]),
     helper.make_node("Add", ["x", "x"], ["y"])],
    [("x", FLOAT, ["N", 3])], [("at", INT64, ["K", 2]), ("y", FLOAT, ["N", 3])],
    (("zero", np.array(0.0, np.float32)),),
)  # fmt: skip


def test_a_value_sized_output_batched_as_the_config_asks_runs_each_request_alone(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    """A 5-row request padded to the 6-row bucket with a copy of its last row got the NonZero's
    entry for that padding row: the padded run's K happened to be 6, its rows'."""
    model = load(tmp_path, POSITIONS, loaded, config="max_batch_size = 8\n")
    assert model.signature.max_batch_size == 8
    assert "batched anyway, as its config asks, but each request runs on its own" in caplog.text
    assert model.executor.splits_batches
    x = np.array([[-1, -1, -1], [-1, -1, -1], [1, 0, 0], [1, 0, 0], [2, 2, 0]], np.float32)
    other = np.array([[0, 3, 0]], np.float32)
    session = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
    for feeds, bucket in (([x], 6), ([x, other], 6)):
        job = BatchJob([{"x": f} for f in feeds], [len(f) for f in feeds], bucket, lambda _: None)
        for got, f in zip(model.executor.run_now(0, job).outputs, feeds, strict=True):
            assert isinstance(got, dict)
            want = dict(zip(["at", "y"], session.run(None, {"x": f}), strict=True))
            for name, array in want.items():
                np.testing.assert_array_equal(got[name], array)


def test_a_model_whose_outputs_follow_the_batch_still_runs_batches_whole(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    identity = model_of(
        [helper.make_node("Identity", ["x"], ["y"])], [("x", FLOAT, ["N", 2])],
        [("y", FLOAT, ["N", 2])],
    )  # fmt: skip
    model = load(tmp_path, identity, loaded, config="max_batch_size = 8\n")
    assert model.signature.max_batch_size == 8
    assert not model.executor.splits_batches


def _time_conv() -> onnx.ModelProto:
    """y [T, 4] = x - the time mean of an unpadded Conv over x's first axis, time: it needs 3
    rows, and each row moves with the others (the tester's timeconv)."""
    weights = np.random.default_rng(0).standard_normal((4, 4, 3)).astype(np.float32)
    return model_of(
        [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
         helper.make_node("Unsqueeze", ["xt", "zero"], ["x3"]),
         helper.make_node("Conv", ["x3", "w"], ["c"], kernel_shape=[3]),
         helper.make_node("ReduceMean", ["c"], ["m"], axes=[0, 2], keepdims=0),
         helper.make_node("Sub", ["x", "m"], ["y"])],
        [("x", FLOAT, ["T", 4])], [("y", FLOAT, ["T", 4])],
        (("w", weights), ("zero", np.array([0], dtype=np.int64))),
    )  # fmt: skip


def test_a_model_that_runs_on_several_rows_and_not_on_one_is_served_unbatched(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    """No sample of 1 or 2 rows ran, and the graph was taken to batch: a 5-row request alone,
    padded to 6, was answered wrongly (200), and batched ones mixed with others' rows. A batch
    runs on one row: this first dim is none."""
    model = load(tmp_path, _time_conv(), loaded)
    assert model.signature.max_batch_size == 0
    assert "no sample input of one row ran" in caplog.text
    assert "Invalid input shape" in caplog.text  # (ONNX Runtime's word, cut to a line)
    assert "but one of 8 rows did: its first dim is no batch" in caplog.text
    assert "served unbatched" in caplog.text


def test_a_config_asking_for_batches_of_a_time_axis_gets_them(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    model = load(tmp_path, _time_conv(), loaded, config="max_batch_size = 8\n")
    assert model.signature.max_batch_size == 8
    assert "its first dim is no batch" in caplog.text
    assert "batched anyway, as its config asks" in caplog.text


def test_a_model_no_sample_runs_on_batches_as_its_dims_claim(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    """Every dim free, as Hugging Face's exporter marks an image input: 3 channels is no size
    the samples give (1, 8, 32), so no sample runs, and nothing shows the first dim is not a
    batch. Served unbatched, such models lost their batching (found by a tester)."""
    weights = np.random.default_rng(2).standard_normal((2, 3, 3, 3)).astype(np.float32)
    conv = model_of(
        [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3]),
         helper.make_node("ReduceMean", ["c"], ["y"], axes=[2, 3], keepdims=0)],
        [("x", FLOAT, ["N", "C", "H", "W"])], [("y", FLOAT, ["N", 2])], (("w", weights),),
    )  # fmt: skip
    assert load(tmp_path, conv, loaded).signature.max_batch_size > 0
    assert "no sample input ran, of one row or of several" in caplog.text
    assert "could not be checked" in caplog.text
    assert "batched, as its dims claim" in caplog.text


def test_an_image_model_too_small_at_one_pixel_still_batches(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    """Free height and width of 1 are under its kernel: bigger samples show it batches."""
    weights = np.random.default_rng(1).standard_normal((2, 3, 3, 3)).astype(np.float32)
    conv = model_of(
        [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3]),
         helper.make_node("ReduceMean", ["c"], ["y"], axes=[2, 3], keepdims=0)],
        [("x", FLOAT, ["N", 3, "H", "W"])], [("y", FLOAT, ["N", 2])], (("w", weights),),
    )  # fmt: skip
    assert load(tmp_path, conv, loaded).signature.max_batch_size > 0


def test_rows_mixed_through_an_optional_input_are_caught(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    """y = x + the mean of optional b over the batch (b defaults to zeros): requests giving b
    batch together, and the check gave none (the tester's optmix, batched: wrong answers)."""
    model = model_of(
        [helper.make_node("ReduceMean", ["b"], ["m"], axes=[0], keepdims=1),
         helper.make_node("Add", ["x", "m"], ["y"])],
        [("x", FLOAT, ["N", 4]), ("b", FLOAT, ["N", 4])], [("y", FLOAT, ["N", 4])],
        (("b", np.zeros((1, 4), dtype=np.float32)),),
    )  # fmt: skip
    served = load(tmp_path, model, loaded)
    assert served.signature.max_batch_size == 0
    assert "its rows are not independent" in caplog.text


def test_an_optional_input_the_graph_takes_unbatched_leaves_the_check_to_the_others(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    """b is declared [N, 4] but only [1, 4] runs (an Add to a [1, 4] constant reshaped): the
    wide check runs without it, and the independent rows batch."""
    model = model_of(
        [helper.make_node("Reshape", ["b", "one_by_4"], ["b1"]),
         helper.make_node("Add", ["x", "b1"], ["y"])],
        [("x", FLOAT, ["N", 4]), ("b", FLOAT, ["N", 4])], [("y", FLOAT, ["N", 4])],
        (("b", np.zeros((1, 4), dtype=np.float32)),
         ("one_by_4", np.array([1, 4], dtype=np.int64))),
    )  # fmt: skip
    assert load(tmp_path, model, loaded).signature.max_batch_size > 0


def test_a_graph_whose_output_does_not_follow_its_free_first_dims_says_it_is_unbatched(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    """Found by a tester: a ReduceSum over the first dim, its output declared ["M", 4], which
    the graph gives as [1, 4], was served unbatched with nothing said (the sample check, which
    warns, never ran: the dims already said no batch)."""
    reduced = model_of(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
        [("x", FLOAT, ["N", 4])], [("y", FLOAT, ["M", 4])],
        (("axes", np.array([0], np.int64)),),
    )  # fmt: skip
    model = load(tmp_path, reduced, loaded)
    assert model.signature.max_batch_size == 0
    assert "every input has a free first dim, but output 'y' has shape [1, 4]" in caplog.text
    assert "served unbatched" in caplog.text


def test_a_graph_with_a_fixed_input_is_unbatched_without_a_word(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    """Its dims say there is no batch: nothing to warn of."""
    fixed = model_of(
        [helper.make_node("Add", ["x", "b"], ["y"])],
        [("x", FLOAT, ["N", 4]), ("b", FLOAT, [1, 4])], [("y", FLOAT, [1, 4])],
    )  # fmt: skip
    model = load(tmp_path, fixed, loaded)
    assert model.signature.max_batch_size == 0
    assert "served unbatched" not in caplog.text
