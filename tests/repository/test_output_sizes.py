"""OutputSizes: a graph's outputs' sizes from a request's shapes, by ONNX shape inference.

The front ends bound the answers they hold unsent; a model whose answers follow its requests'
shapes has no size known at load, and gRPC held each of its calls as the largest message (5 at
once under the 1 GiB default). Inference gives each output's dims as fixed numbers or input dims,
or says nothing; the property checked here is that it is never wrong: whatever ONNX Runtime
makes is what `bytes_for` said, or it said None.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from duetime.repository.outputsizes import OutputSizes, output_sizes


def model_of(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[str],
    initializers: list[onnx.TensorProto] = (),  # type: ignore[assignment]
    declared: list[int | str | None] | None = None,
) -> onnx.ModelProto:
    made = [helper.make_tensor_value_info(name, TensorProto.FLOAT, declared) for name in outputs]
    graph = helper.make_graph(nodes, "g", inputs, made, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def floats(name: str, dims: list[int | str | None]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def sized(model: onnx.ModelProto) -> OutputSizes:
    sizes = output_sizes(model)
    assert sizes is not None
    return sizes


def test_an_outer_product_grows_as_the_square_of_its_request() -> None:
    """x·xᵀ, [N,1] -> [N,N]: a share of the request's bytes (tried before) held it 1,000 times
    too small at N = 4,000 (a tester's: 24 answers of 16 MB held under a 100 MB bound)."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "xt"], ["y"]),
    ]
    sizes = sized(model_of(nodes, [floats("x", ["N", 1])], ["y"], declared=["N", 1]))
    assert sizes.bytes_for({"x": [4000, 1]}) == 4000 * 4000 * 4  # (not the declared [N, 1])
    assert sizes.bytes_for({"x": [0, 1]}) == 0


def test_outputs_follow_fixed_and_free_dims_each_in_its_own_type() -> None:
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["y"]),
        helper.make_node("Cast", ["x"], ["half"], to=TensorProto.FLOAT16),
        helper.make_node("Reshape", ["x", "flat"], ["flat_x"]),
    ]
    model = model_of(nodes, [floats("x", ["B", 256, "W"])], ["y", "flat_x"], [ints("flat", [-1])])
    model.graph.output.append(helper.make_tensor_value_info("half", TensorProto.FLOAT16, None))
    sizes = sized(model)
    assert sizes.bytes_for({"x": [3, 256, 5]}, ["y"]) == 3 * 256 * 5 * 4
    assert sizes.bytes_for({"x": [3, 256, 5]}, ["y", "half"]) == 3 * 256 * 5 * 6
    # (a flattening to [-1] is left unknown by inference: a request asking for it, or for
    # every output, is not sized)
    assert sizes.outputs["flat_x"] is None
    assert sizes.bytes_for({"x": [3, 256, 5]}) is None
    assert sizes.bytes_for({"x": [3, 256, 5]}, ["flat_x"]) is None
    assert sizes.bytes_for({"x": [3, 256, 5]}, ["absent"]) is None
    assert sizes.bytes_for({"x": [3, 256]}, ["y"]) is None  # (another rank: refused later)
    assert sizes.bytes_for({}, ["y"]) is None


def test_two_inputs_declared_with_one_name_are_not_taken_to_be_one_size() -> None:
    """[batch] + [batch] broadcasts a 1 to the other's size: taken as the first's, a request
    of a [1] and a [10⁶] would be held as 4 bytes."""
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    model = model_of(nodes, [floats("a", ["batch"]), floats("b", ["batch"])], ["y"])
    assert sized(model).bytes_for({"a": [1], "b": [10**6]}) is None


def test_an_optional_input_left_out_has_its_default_s_dims() -> None:
    bias = numpy_helper.from_array(np.zeros((1, 8), np.float32), "bias")
    nodes = [helper.make_node("Add", ["x", "bias"], ["y"])]
    model = model_of(nodes, [floats("x", ["n", 8]), floats("bias", [None, 8])], ["y"], [bias])
    sizes = sized(model)
    assert sizes.bytes_for({"x": [5, 8]}) is None or sizes.bytes_for({"x": [5, 8]}) == 5 * 8 * 4
    assert sizes.bytes_for({"x": [5, 8], "bias": [5, 8]}) in (None, 5 * 8 * 4)


def test_sizes_read_from_small_constants_are_kept() -> None:
    """A shape given as a constant (Expand to [2, 1, 1]) keeps its values for inference."""
    nodes = [helper.make_node("Expand", ["x", "shape"], ["y"])]
    model = model_of(nodes, [floats("x", ["n", 4])], ["y"], [ints("shape", [2, 1, 1])])
    assert sized(model).bytes_for({"x": [7, 4]}) == 2 * 7 * 4 * 4


def test_weights_held_by_constant_nodes_are_declared_not_copied() -> None:
    """Some exporters keep a model's weights in Constant nodes: each copy made for inference
    would be the model's size again. They are declared by type and dims, and still size."""
    weight = numpy_helper.from_array(np.ones((4, 3000), np.float32), "w")
    nodes = [
        helper.make_node("Constant", [], ["w"], value=weight),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    assert sized(model_of(nodes, [floats("x", ["n", 4])], ["y"])).bytes_for({"x": [5, 4]}) == (
        5 * 3000 * 4
    )


@pytest.mark.parametrize(
    ("node", "inputs", "feeds"),
    [
        (helper.make_node("Einsum", ["x", "y"], ["z"], equation="bij,bjk->bik"),
         [floats("x", ["B", 8, 8]), floats("y", ["C", 8, 8])], {"x": [1, 8, 8], "y": [500, 8, 8]}),
        (helper.make_node("PRelu", ["x", "y"], ["z"]),
         [floats("x", ["A", "B"]), floats("y", ["C", "D"])], {"x": [300, 1], "y": [1, 300]}),
        (helper.make_node("Reshape", ["x", "s"], ["z"]),  # (y [0, 1]: the 0 copies x's dim)
         [floats("x", ["A"]), floats("y", ["C", "D"])], {"x": [4000], "y": [0, 1]}),
    ],
    ids=["einsum", "prelu", "reshape-to-a-shape-taken"],
)  # fmt: skip
def test_ops_onnx_runtime_makes_bigger_than_inference_says_are_not_sized(
    node: onnx.NodeProto, inputs: list[onnx.ValueInfoProto], feeds: dict[str, list[int]]
) -> None:
    """Found by a tester: ORT broadcasts a 1 to the other operand's size where inference takes
    the first's dims (16 MB made, 16 KB inferred), and a 0 a request puts in a shape given to
    Reshape copies the input's dim (inferred: 0 bytes). Nor is anything that follows sized."""
    nodes = [
        helper.make_node("Shape", ["y"], ["s"]),
        node,
        helper.make_node("Flatten", ["z"], ["flat"], axis=0),
        helper.make_node("Shape", ["z"], ["z_shape"]),
        helper.make_node("ConstantOfShape", ["z_shape"], ["ones"]),
    ]
    model = model_of(nodes, inputs, ["z", "flat", "ones"])
    sizes = sized(model)
    assert sizes.outputs == {"z": None, "flat": None, "ones": None}
    made = ort.InferenceSession(model.SerializeToString()).run(
        None, {name: np.ones(shape, np.float32) for name, shape in feeds.items()}
    )
    assert made[0].nbytes >= 4 * 4000  # (what inference would have taken as at most 2 KB)


def test_a_reshape_to_a_constant_shape_and_a_subgraph_holding_an_unsound_op() -> None:
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    model = model_of(nodes, [floats("x", ["n", 4])], ["y"], [ints("shape", [0, 2, 2])])
    assert sized(model).bytes_for({"x": [5, 4]}) == 5 * 4 * 4
    branch = helper.make_graph(
        [helper.make_node("PRelu", ["x", "x"], ["inner"])], "b", [],
        [helper.make_tensor_value_info("inner", TensorProto.FLOAT, None)],
    )  # fmt: skip
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Cast", ["total"], ["cond"], to=TensorProto.BOOL),
        helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch),
    ]
    assert sized(model_of(nodes, [floats("x", ["n"])], ["y"])).outputs["y"] is None


def test_shapes_a_subgraph_declares_are_not_taken() -> None:
    """ONNX Runtime does not check them: an If whose branches said [1] made [2000, 2000] (found
    by a tester: 16 MB held as 4 bytes)."""
    declared = [helper.make_tensor_value_info("inner", TensorProto.FLOAT, [1])]
    square = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
         helper.make_node("MatMul", ["x", "xt"], ["inner"])], "square", [], declared,
    )  # fmt: skip
    same = helper.make_graph([helper.make_node("Relu", ["x"], ["inner"])], "same", [], declared)
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Cast", ["total"], ["cond"], to=TensorProto.BOOL),
        helper.make_node("If", ["cond"], ["y"], then_branch=same, else_branch=square),
    ]
    sizes = sized(model_of(nodes, [floats("x", ["n", 1])], ["y"]))
    assert sizes.bytes_for({"x": [2000, 1]}) is None


def test_shapes_a_subgraph_in_a_local_function_declares_are_not_taken() -> None:
    """As in the main graph's subgraphs (found by a tester: sized 4 bytes, 16 MB made)."""
    declared = [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1, 1])]
    square = helper.make_graph(
        [helper.make_node("Transpose", ["xo"], ["t"], perm=[1, 0]),
         helper.make_node("MatMul", ["xo", "t"], ["o"])], "square", [], declared,
    )  # fmt: skip
    function = helper.make_function(
        "local", "F", ["c", "xo"], ["y"],
        [helper.make_node("If", ["c"], ["y"], then_branch=square, else_branch=square)],
        opset_imports=[helper.make_opsetid("", 17)],
    )  # fmt: skip
    nodes = [helper.make_node("F", ["c", "x"], ["y"], domain="local")]
    inputs = [helper.make_tensor_value_info("c", TensorProto.BOOL, [1]), floats("x", ["n", 1])]
    model = model_of(nodes, inputs, ["y"])
    model.opset_import.append(helper.make_opsetid("local", 1))
    model.functions.append(function)
    assert sized(model).bytes_for({"c": [1], "x": [2000, 1]}) in (None, 2000 * 2000 * 4)


def test_what_follows_an_unsound_op_is_found_whatever_the_nodes_order() -> None:
    """Nodes may come in any order (ORT sorts them): passes over the graph until none marked
    more took 18 s for 3,000 stored last to first (found by a tester)."""
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(3000)]
    nodes.append(helper.make_node("PRelu", ["x", "x"], ["t0"]))  # (last: read first)
    assert sized(model_of(nodes, [floats("x", ["n"])], ["t3000"])).outputs["t3000"] is None


def test_a_string_output_or_an_input_without_a_tensor_type_is_not_sized() -> None:
    nodes = [helper.make_node("Cast", ["x"], ["s"], to=TensorProto.STRING)]
    model = model_of(nodes, [floats("x", ["n"])], [])
    model.graph.output.append(helper.make_tensor_value_info("s", TensorProto.STRING, None))
    assert sized(model).bytes_for({"x": [3]}) is None
    sequence = helper.make_tensor_sequence_value_info("q", TensorProto.FLOAT, None)
    nodes = [helper.make_node("SequenceLength", ["q"], ["y"])]
    assert output_sizes(model_of(nodes, [sequence], ["y"])) is None


# -- the property: never wrong, against ONNX Runtime ----------------------------------------------


Maker = Callable[[random.Random, str, list[onnx.NodeProto], list[onnx.TensorProto]], str]
"""Adds nodes taking tensor `name` to one of the same rank (2) or an output; returns its name."""


def _fresh(nodes: list[onnx.NodeProto]) -> str:
    return f"t{len(nodes)}"


def _unary(rng: random.Random, name: str, nodes: list, inits: list) -> str:
    out = _fresh(nodes)
    nodes.append(helper.make_node(rng.choice(["Relu", "Neg", "Abs", "Sigmoid"]), [name], [out]))
    return out


def _transpose(rng: random.Random, name: str, nodes: list, inits: list) -> str:
    out = _fresh(nodes)
    nodes.append(helper.make_node("Transpose", [name], [out], perm=[1, 0]))
    return out


def _gram(rng: random.Random, name: str, nodes: list, inits: list) -> str:
    t, out = _fresh(nodes) + "t", _fresh(nodes)
    nodes.append(helper.make_node("Transpose", [name], [t], perm=[1, 0]))
    pair = [name, t] if rng.random() < 0.5 else [t, name]
    nodes.append(helper.make_node("MatMul", pair, [out]))
    return out


def _concat(rng: random.Random, name: str, nodes: list, inits: list) -> str:
    out = _fresh(nodes)
    nodes.append(helper.make_node("Concat", [name, name], [out], axis=rng.choice([0, 1, -1])))
    return out


def _with_other(rng: random.Random, name: str, nodes: list, inits: list) -> str:
    out = _fresh(nodes)
    nodes.append(helper.make_node(rng.choice(["Add", "Mul", "Max"]), [name, "b"], [out]))
    return out


def _reduce(rng: random.Random, name: str, nodes: list, inits: list) -> str:
    out, axes = _fresh(nodes), f"axes{len(inits)}"
    inits.append(ints(axes, [rng.choice([0, 1])]))
    nodes.append(helper.make_node("ReduceSum", [name, axes], [out], keepdims=1))
    return out


def _expand(rng: random.Random, name: str, nodes: list, inits: list) -> str:
    out, shape = _fresh(nodes), f"shape{len(inits)}"
    inits.append(ints(shape, [rng.choice([1, 2, 3]), 1]))
    nodes.append(helper.make_node("Expand", [name, shape], [out]))
    return out


def _reshape(rng: random.Random, name: str, nodes: list, inits: list) -> str:
    out, shape = _fresh(nodes), f"shape{len(inits)}"
    inits.append(ints(shape, rng.choice([[-1, 1], [1, -1], [0, -1]])))
    nodes.append(helper.make_node("Reshape", [name, shape], [out]))
    return out


def _by_shape(rng: random.Random, name: str, nodes: list, inits: list) -> str:
    """ConstantOfShape(Shape(x)): a shape taken from a tensor, not from the request's values."""
    s, out = _fresh(nodes) + "s", _fresh(nodes)
    nodes.append(helper.make_node("Shape", [name], [s]))
    nodes.append(helper.make_node("ConstantOfShape", [s], [out], value=helper.make_tensor(
        "v", TensorProto.FLOAT, [1], [1.0])))  # fmt: skip
    return out


def _gather(rng: random.Random, name: str, nodes: list, inits: list) -> str:
    out, index = _fresh(nodes), f"index{len(inits)}"
    inits.append(ints(index, [0] * rng.choice([1, 3])))
    nodes.append(helper.make_node("Gather", [name, index], [out], axis=rng.choice([0, 1])))
    return out


def _unsound(rng: random.Random, name: str, nodes: list, inits: list) -> str:
    """Ops ONNX Runtime broadcasts further than inference says (see UNSOUND_OPS), and a
    Reshape to the shape of another tensor."""
    out, kind = _fresh(nodes), rng.choice(["Einsum", "PRelu", "Reshape"])
    if kind == "Einsum":
        nodes.append(helper.make_node("Einsum", [name, "b"], [out], equation="ij,ij->ij"))
    elif kind == "PRelu":
        nodes.append(helper.make_node("PRelu", [name, "b"], [out]))
    else:
        shape = _fresh(nodes) + "s"
        nodes.append(helper.make_node("Shape", ["b"], [shape]))
        nodes.append(helper.make_node("Reshape", [name, shape], [out]))
    return out


MAKERS: list[Maker] = [
    _unary, _transpose, _gram, _concat, _with_other, _reduce, _expand, _reshape, _by_shape,
    _gather, _unsound,
]  # fmt: skip


def random_model(rng: random.Random) -> tuple[onnx.ModelProto, list[str]]:
    dims = [rng.choice(["n", "m", None, 3]) for _ in range(2)]
    other = [rng.choice(["n", "k", None, 1, 3]) for _ in range(2)]
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    tensors = ["x"]
    for _ in range(rng.randint(1, 5)):
        tensors.append(rng.choice(MAKERS)(rng, rng.choice(tensors), nodes, inits))
    outputs = sorted(set(rng.sample(tensors[1:], min(2, len(tensors) - 1))))
    model = model_of(nodes, [floats("x", dims), floats("b", other)], outputs, inits)
    return model, outputs


def feeds_for(rng: random.Random, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    feeds = {}
    for value in model.graph.input:
        shape = [
            d.dim_value if d.HasField("dim_value") else rng.choice([0, 1, 2, 3, 5])
            for d in value.type.tensor_type.shape.dim
        ]
        feeds[value.name] = np.ones(shape, np.float32)
    return feeds


def test_what_onnx_runtime_makes_is_what_the_sizes_said_or_they_said_nothing() -> None:
    rng = random.Random(1729)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    sized_runs = unsized_runs = 0
    for _ in range(120):
        model, outputs = random_model(rng)
        sizes = output_sizes(model)
        assert sizes is not None
        try:
            session = ort.InferenceSession(model.SerializeToString(), options)
        except Exception:  # (a graph ORT refuses is no model to serve)
            continue
        for _ in range(4):
            feeds = feeds_for(rng, model)
            try:
                made = session.run(outputs, feeds)
            except Exception:  # (shapes ORT refuses make no answer)
                continue
            said = sizes.bytes_for({k: v.shape for k, v in feeds.items()}, outputs)
            if said is None:
                unsized_runs += 1
            else:
                sized_runs += 1
                assert said == sum(a.nbytes for a in made), (
                    onnx.printer.to_text(model.graph),
                    {k: v.shape for k, v in feeds.items()},
                )
    assert sized_runs > 100  # (the cases were of both kinds)
    assert unsized_runs > 20


@pytest.mark.parametrize("rank", [None, 1])
def test_an_input_of_any_rank_checks_no_rank(rank: int | None) -> None:
    dims = None if rank is None else ["n"]
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    sizes = output_sizes(model_of(nodes, [floats("x", dims)], ["y"]))
    assert sizes is not None
    assert sizes.bytes_for({"x": [4]}) == (None if rank is None else 16)
