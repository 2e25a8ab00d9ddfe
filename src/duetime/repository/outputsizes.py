"""OutputSizes: a graph's outputs' sizes as functions of its inputs' dims, read from ONNX shape
inference, for a model whose answers follow its requests' shapes (free dims besides the batch's)
and so have no size known at load.

The front ends bound the bytes of answers made and not yet read (`--max-unsent-answer-bytes`).
gRPC holds each call's part before decoding it; a model with no load-time guess held the largest
message per call, so 5 calls at once reached the scheduler under the 1 GiB default and the rest
waited in arrival order (EDF order and "refused at once" undone). Where shape inference gives
every dim of an output as a fixed number or one input's own dim, a request's shapes give its
answer's size exactly.

NOTE: a share of the request's bytes (the samples' answer bytes per request byte) stood in
before, and a tester's model whose answer grows faster than its request (x·xᵀ: [N,1] -> [N,N])
held 24 answers of 16 MB under a 100 MB bound. Inference gives that one [N,N].
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import onnx
import onnx.shape_inference
from onnx import TensorProto, helper

from duetime.datatypes import numeric_v2_datatype
from duetime.repository.graphs import subgraphs

log = logging.getLogger("duetime.outputsizes")

Dim = int | tuple[int, int]
"""An output's dim: a fixed size, or (input index, dim index) of the input dim it equals."""

KEPT_CONSTANT_ELEMENTS = 1024
"""Integer initializers of at most this many elements keep their values for inference (the
shapes a Reshape or an Expand is given); larger ones are declared by type and dims only."""

_SYMBOL = "__duetime_dim_{}_{}"


@dataclass(frozen=True)
class OutputSize:
    """One output's size: `itemsize` bytes an element, `dims` its shape (see `Dim`); its
    `datatype` is its v2 name (what its elements take as JSON: HTTP's answers)."""

    name: str
    itemsize: int
    dims: tuple[Dim, ...]
    datatype: str = ""


class OutputSizes:
    """A model's outputs' sizes as functions of its request's shapes (see `bytes_for`).

    `trusted` goes False, for good, when an answer comes out bigger than `bytes_for` said (a
    shape inference ONNX Runtime does not share): from then on the front ends hold the most an
    answer may weigh, as for a model without sizes."""

    __slots__ = ("inputs", "outputs", "trusted")

    def __init__(
        self, inputs: Sequence[InputShape], outputs: Mapping[str, OutputSize | None]
    ) -> None:
        self.inputs = tuple(inputs)
        """The graph's inputs, in the order `Dim`s index them."""
        self.outputs = dict(outputs)
        """Every output by name: its size, or None where inference does not set it."""
        self.trusted = True

    def bytes_for(
        self,
        shapes: Mapping[str, Sequence[int]],
        wanted: Collection[str] = (),
        weigh: Callable[[OutputSize, int], int] | None = None,
    ) -> int | None:
        """The bytes of the `wanted` outputs (empty: all) for inputs of these `shapes` (name ->
        dims, as the request gives them; an optional input left out has its default's); None
        where they do not say (a required input missing or of another rank, an output whose
        size they do not set). A request ONNX Runtime refuses makes no answer at all, so its
        shapes need not be valid. An output of n elements weighs n times its `itemsize`, or what
        `weigh(output, n)` says (one written as text, with its entry's words around it)."""
        given: list[Sequence[int]] = []
        for input_ in self.inputs:
            shape = shapes.get(input_.name, input_.default)
            if shape is None or (input_.rank is not None and len(shape) != input_.rank):
                return None
            given.append(shape)
        total = 0
        for name in wanted or self.outputs:
            output = self.outputs.get(name)
            if output is None:  # (one it cannot size, or one the graph does not give)
                return None
            count = 1
            for dim in output.dims:
                count *= dim if isinstance(dim, int) else max(0, given[dim[0]][dim[1]])
            total += count * output.itemsize if weigh is None else weigh(output, count)
        return total


@dataclass(frozen=True)
class InputShape:
    """One graph input: its `rank` (None: not declared) and, for an optional one (it has an
    initializer), the dims of its `default`."""

    name: str
    rank: int | None
    default: tuple[int, ...] | None


def output_sizes(model: onnx.ModelProto) -> OutputSizes | None:
    """`model`'s outputs' sizes from ONNX shape inference on its graph (without its weights),
    each input dim that is not fixed made a symbol of its own; None where the graph's inputs
    are not all tensors, or inference fails. Outputs it cannot size (a dim it leaves unknown or
    new, a string, a sequence) are None, and `bytes_for` says None for requests that ask for
    them.

    NOTE: each free dim gets its own symbol, not the graph's name for it: two inputs declared
    [batch] may come with different sizes (Add then broadcasts one to the other), and an output
    taken to be the first's size would be held too small. Declared output shapes and
    `value_info` are left out likewise: a graph's claim is not checked by ONNX Runtime."""
    try:
        return _inferred(model)
    except Exception as exc:  # (what ORT serves, inference may fail on: nothing is learned)
        log.debug("no output sizes from shape inference: %s", exc)
        return None


def _inferred(model: onnx.ModelProto) -> OutputSizes | None:
    graph = model.graph
    defaults = {init.name: init for init in graph.initializer}
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    for function in light.functions:  # (their subgraphs' declarations, as the graph's below)
        for node in function.node:
            for sub in subgraphs(node):
                _undeclared(sub)
    symbols: dict[str, Dim] = {}
    inputs: list[InputShape] = []
    for index, value in enumerate(graph.input):
        copy = light.graph.input.add()
        copy.CopyFrom(value)
        if copy.type.WhichOneof("value") != "tensor_type":
            return None
        default = defaults.get(value.name)
        rank = None
        if copy.type.tensor_type.HasField("shape"):
            dims = copy.type.tensor_type.shape.dim
            rank = len(dims)
            for position, dim in enumerate(dims):
                if not dim.HasField("dim_value"):
                    symbol = _SYMBOL.format(index, position)
                    dim.Clear()
                    dim.dim_param = symbol
                    symbols[symbol] = (index, position)
        inputs.append(
            InputShape(value.name, rank, None if default is None else tuple(default.dims))
        )
    for node in graph.node:
        weight = _weight(node)
        if weight is None:
            copied = light.graph.node.add()
            copied.CopyFrom(node)
            for sub in subgraphs(copied):
                _undeclared(sub)
        else:  # (declared by its type and dims, as the initializers below)
            light.graph.input.append(
                helper.make_tensor_value_info(node.output[0], weight.data_type, list(weight.dims))
            )
    declared = {value.name for value in graph.input}
    for init in graph.initializer:
        if init.name in declared:
            continue  # (a request's to give: an input above)
        if init.data_type in _INTEGERS and math.prod(init.dims) <= KEPT_CONSTANT_ELEMENTS:
            light.graph.initializer.append(init)
        else:
            light.graph.input.append(
                helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
    for output in graph.output:
        kind = output.type.WhichOneof("value")
        elem_type = output.type.tensor_type.elem_type if kind == "tensor_type" else 0
        light.graph.output.append(helper.make_tensor_value_info(output.name, elem_type, None))
    inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
    kept = {init.name for init in light.graph.initializer}
    unsound = _unsound_tensors(model, kept | _constants(graph))
    sizes = {
        output.name: None if output.name in unsound else _output_size(output, symbols)
        for output in inferred.graph.output
    }
    return OutputSizes(inputs, sizes)


UNSOUND_OPS = frozenset({"Einsum", "PRelu"})
"""Ops whose outputs ONNX Runtime makes bigger than ONNX shape inference says, for some inputs:
both broadcast a 1 to the other operand's size where inference takes the first's dims
(`bij,bjk->bik` of [1,64,64] and [1000,64,64]: 16 MB made, 16 KB inferred; PRelu of x [2000,1]
and a slope [1,2000]: [2000,2000]). Found by a tester; what depends on them is not sized."""


def _unsound_tensors(model: onnx.ModelProto, constants: set[str]) -> set[str]:
    """The tensors of `model`'s graph whose inferred shape may be smaller than the one ONNX
    Runtime makes: the outputs of `UNSOUND_OPS`, of a Reshape to a shape that is not one of
    the `constants` (a 0 that a request's dim puts in it copies the input's dim, where
    inference takes the 0: Reshape(x, Shape(y)) with y [0,1]), of a node whose subgraphs or
    function hold such a node, and all that follows from them, a shape taken included."""
    functions = {(f.domain, f.name): f for f in model.functions}
    unsound_functions: set[tuple[str, str]] = set()
    changed = True
    while changed:  # (a function may call another, declared after it)
        changed = False
        for key, function in functions.items():
            if key not in unsound_functions and any(
                _unsound(node, unsound_functions, set()) for node in function.node
            ):
                unsound_functions.add(key)
                changed = True
    readers: dict[str, list[onnx.NodeProto]] = {}
    marked: set[str] = set()
    for node in model.graph.node:
        for name in _read(node):
            readers.setdefault(name, []).append(node)
        if _unsound(node, unsound_functions, constants):
            marked.update(name for name in node.output if name)
    # NOTE: a walk from each marked tensor to its readers, not passes over the graph until
    # none marks more: nodes may come in any order (ORT sorts them), and a graph of 3,000
    # stored last to first took 18 s to load, a pass per node (found by a tester)
    pending = list(marked)
    while pending:
        for node in readers.get(pending.pop(), ()):
            for name in node.output:
                if name and name not in marked:
                    marked.add(name)
                    pending.append(name)
    return marked


def _unsound(node: onnx.NodeProto, functions: set[tuple[str, str]], constants: set[str]) -> bool:
    """Whether `node` (or a node in its subgraphs) may make more than inference says."""
    if node.domain in ("", "ai.onnx"):
        if node.op_type in UNSOUND_OPS:
            return True
        if node.op_type == "Reshape" and (len(node.input) < 2 or node.input[1] not in constants):
            return True
    if (node.domain, node.op_type) in functions:
        return True
    return any(_unsound(inner, functions, set()) for sub in subgraphs(node) for inner in sub.node)


def _undeclared(graph: onnx.GraphProto) -> None:
    """`graph` (a subgraph) without the shapes it declares for its outputs and its tensors, and
    so its subgraphs: ONNX Runtime does not check them, inference takes them (an If whose
    branches said [1] made [2000,2000]: 16 MB held as 4 bytes, found by a tester)."""
    del graph.value_info[:]
    for output in graph.output:
        if output.type.WhichOneof("value") == "tensor_type":
            output.type.tensor_type.ClearField("shape")
    for node in graph.node:
        for sub in subgraphs(node):
            _undeclared(sub)


def _read(node: onnx.NodeProto) -> list[str]:
    """The tensors `node` reads: its inputs and those its subgraphs take from outside them."""
    names = [name for name in node.input if name]
    for sub in subgraphs(node):
        for inner in sub.node:
            names.extend(_read(inner))
    return names


def _constants(graph: onnx.GraphProto) -> set[str]:
    """The outputs of the graph's Constant nodes whose values inference keeps (see `_weight`)."""
    return {node.output[0] for node in graph.node if _is_constant(node) and _weight(node) is None}


_INTEGERS = frozenset({TensorProto.INT64, TensorProto.INT32})


def _weight(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The tensor a Constant node holds, if it is too big to copy for inference (some exporters
    keep a model's weights so: each copy would be the model's size again)."""
    if not _is_constant(node):
        return None
    for attribute in node.attribute:
        if attribute.name == "value" and attribute.type == onnx.AttributeProto.TENSOR:
            tensor: onnx.TensorProto = attribute.t
            if tensor.data_type in _INTEGERS and math.prod(tensor.dims) <= KEPT_CONSTANT_ELEMENTS:
                return None
            return tensor
    return None


def _is_constant(node: onnx.NodeProto) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1


def _output_size(output: onnx.ValueInfoProto, symbols: Mapping[str, Dim]) -> OutputSize | None:
    if output.type.WhichOneof("value") != "tensor_type":
        return None
    tensor = output.type.tensor_type
    if tensor.elem_type in (TensorProto.STRING, TensorProto.UNDEFINED) or not tensor.HasField(
        "shape"
    ):
        return None
    try:
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
    except (KeyError, ValueError, TypeError):  # (a type numpy has none of)
        return None
    # (float8 and the like have none: no v2 datatype carries them)
    datatype = numeric_v2_datatype(dtype) or ""
    dims: list[Dim] = []
    for dim in tensor.shape.dim:
        if dim.HasField("dim_value") and dim.dim_value >= 0:
            dims.append(dim.dim_value)
        elif dim.HasField("dim_param") and dim.dim_param in symbols:
            dims.append(symbols[dim.dim_param])
        else:
            return None
    return OutputSize(output.name, dtype.itemsize, tuple(dims), datatype)
