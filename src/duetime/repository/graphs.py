"""What the loader learns from a model's ONNX graph, and the one rewrite it makes before serving it.

Learned: which outputs have a size set by the input values (Unique, NonZero, ...), whether an
execution's cost follows the values (a Loop's trip count, an Expand to a requested shape), and
whether activations are quantized dynamically. Rewritten: signed-integer Div and Mod, so that no
request can trap the process with INT_MIN / -1 (see `guard_integer_division`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx.inliner
from onnx import TensorProto, helper, numpy_helper

log = logging.getLogger("duetime.graphs")

VALUE_SIZED_OPS = frozenset(
    {"NonZero", "Unique", "Compress", "NonMaxSuppression", "StringSplit", "StringNormalizer",
     "ImageDecoder", "Loop", "SequenceMap"}
)  # fmt: skip
"""Ops whose outputs' sizes follow their inputs' values (or a subgraph's runs), whatever those
are, but for those `_keeps_size` clears. (An If is judged by its condition and branches: see
`_mark`.)"""

SIZE_INPUTS: Mapping[str, tuple[int, ...]] = {
    "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Reshape": (1,), "Range": (0, 1, 2),
    "Resize": (1, 2, 3), "Upsample": (1,), "Pad": (1, 3), "Slice": (1, 2, 3, 4), "OneHot": (1,),
    "TopK": (1,), "Split": (1,), "SplitToSequence": (1,), "Squeeze": (1,), "Unsqueeze": (1,),
    "CenterCropPad": (1,), "Col2Im": (1, 2), "DFT": (1,), "STFT": (2, 3), "AffineGrid": (1,),
    "MelWeightMatrix": (0, 1), "BlackmanWindow": (0,), "HannWindow": (0,), "HammingWindow": (0,),
}  # fmt: skip
"""Ops whose outputs' sizes follow the values of these inputs (a shape, a count, bounds)."""

SHAPE_OPS = frozenset({"Shape", "Size"})
"""Ops whose output is a tensor's shape, not its values."""

DYNAMIC_QUANTIZERS = frozenset(
    {"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM"}
)
"""Ops that quantize activations with a scale taken from the activations themselves: those
`onnxruntime.quantization.quantize_dynamic` emits (uint8 activations: DynamicQuantizeLinear
feeding MatMulInteger/ConvInteger/QAttention; LSTMs: DynamicQuantizeLSTM) and the fused form ORT
saves (DynamicQuantizeMatMul). Its int8 activations are quantized by a QuantizeLinear whose scale
is computed from the input (ReduceMin/ReduceMax), which `GraphFacts` finds by the scale's flow."""

TRAPPING_INTEGERS = {TensorProto.INT32: "int32", TensorProto.INT64: "int64"}
"""Element types whose INT_MIN / -1 traps (SIGFPE) in ORT's CPU Div: the hardware's divide.

NOTE: int8 and int16 are divided after C's promotion to int, which cannot overflow (ORT 1.32
answers -128 / -1 with -128), and unsigned types have no -1."""

GUARD_MIN_OPSET = 9
"""The first opset with Where, which the guard needs (Equal and Neg of int32/int64 are older)."""


@dataclass(frozen=True)
class GraphFacts:
    """What a graph's structure says about serving it (see `graph_facts`)."""

    value_sized_outputs: Mapping[str, str] = field(default_factory=dict)
    """Outputs whose size follows the input values, each with the node that sizes it."""
    cost_depends_on_values: bool = False
    """Whether one execution's cost follows the input values, not only their shapes."""
    cost_why: str = ""
    """What makes it so, for the log."""
    dynamically_quantized: bool = False
    """Whether activations are quantized with a scale taken from the batch's own values."""


@dataclass(frozen=True)
class StudiedGraph:
    """A model file as the loader serves it."""

    facts: GraphFacts | None
    """None: the onnx package cannot read the file (ORT's own format), so nothing is known."""
    guarded: bytes | None = None
    """The model with its integer divisions guarded, to serve in place of the file; None: the
    file as it is (it has none, or they cannot be guarded: see the log)."""


def study_graph(path: Path) -> StudiedGraph:
    """Read `path` (without its external tensors' data: tensors in files of their own stay
    there) and learn what serving it needs to know."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # (ORT read it: a file this cannot read is one ORT's own format took)
        return StudiedGraph(None)
    facts = graph_facts(model)
    guarded = guard_integer_division(model, str(path))
    return StudiedGraph(facts, model.SerializeToString() if guarded else None)


# -- facts ----------------------------------------------------------------------------------------


@dataclass
class _Flow:
    """Marks on a graph's tensors, each only ever added (so a pass to a fixed point ends)."""

    values: set[str]
    """Tensors whose values follow the request's values."""
    sized: dict[str, str]
    """Tensors whose size follows the request's values, each with the node that made it so."""
    cost: str = ""
    """The first node whose cost follows the values ("": none)."""
    dynamic: bool = False


def graph_facts(model: onnx.ModelProto) -> GraphFacts:
    """What `model`'s graph says about serving it, by following the request's values through it.

    A tensor's size follows the values when an op sizes it by them (`VALUE_SIZED_OPS`, or a
    `SIZE_INPUTS` input fed by them) or when an input's size does. A shape taken with Shape or
    Size is not a value: `Range(0, Shape(x)[1])` or `Reshape(x, [Shape(x)[0], -1])` cost what
    `x`'s size does, which the scheduler weighs. Inputs of type string count too: their cost is
    their text's length, which no shape shows.

    NOTE: a judgement from the graph alone, and conservative: any Loop counts (its body can end
    it on the values), an If whose condition follows the values counts (one branch may give
    another size), and so does any op of the lists, even one whose size moves only a little (a
    Slice to requested bounds). An If on a shape (`If(Shape(x)[1] > 2, ...)`, as exporters guard
    shapes) counts only if a branch does: judged as any If, such models lost their batching.
    Ops of other domains are not judged.
    """
    graph = model.graph
    inputs = list(graph.input)  # (one with an initializer too is a request's to give)
    flow = _Flow(values={value.name for value in inputs}, sized={})
    _follow(graph, flow)
    strings = next(
        (v.name for v in inputs if v.type.tensor_type.elem_type == TensorProto.STRING), None
    )
    cost_why = flow.cost or (f"input '{strings}' is a string tensor" if strings else "")
    outputs = {v.name: flow.sized[v.name] for v in graph.output if v.name in flow.sized}
    return GraphFacts(outputs, bool(cost_why), cost_why, flow.dynamic)


def _follow(graph: onnx.GraphProto, flow: _Flow) -> None:
    """Mark `graph`'s tensors in `flow` until no node adds a mark (nodes out of order too)."""
    while True:
        before = (len(flow.values), len(flow.sized))
        for node in graph.node:
            _mark(node, flow)
        if (len(flow.values), len(flow.sized)) == before:
            return


def _mark(node: onnx.NodeProto, flow: _Flow) -> None:
    ours = node.domain in ("", "ai.onnx")
    op = node.op_type if ours else ""
    described = f"{node.op_type} node '{node.name or node.output[0]}'"
    inputs = [name for name in node.input if name]
    if op in SHAPE_OPS:
        valued = any(name in flow.sized for name in inputs)
    else:
        valued = any(name in flow.values or name in flow.sized for name in inputs)
    origin = next((flow.sized[name] for name in inputs if name in flow.sized), None)
    if op in SHAPE_OPS:
        origin = None  # (a shape's size is the rank)
    elif op in VALUE_SIZED_OPS and not _keeps_size(node):
        origin = described
    elif op == "Scan":
        origin = _scan_origin(node, flow) or origin
    elif op == "If":
        branches = _branches_origin(node, flow)
        origin = (described if node.input and node.input[0] in flow.values else None) or (
            branches or origin
        )
    elif any(
        index < len(node.input) and node.input[index] in flow.values
        for index in SIZE_INPUTS.get(op, ())
    ):
        origin = origin or described
    if ours and op == "QuantizeLinear" and len(node.input) > 1 and node.input[1] in flow.values:
        flow.dynamic = True
    if node.op_type in DYNAMIC_QUANTIZERS:  # (of this domain and Microsoft's)
        flow.dynamic = True
    for sub in _subgraphs(node):  # (quantizers in a branch count too)
        if op not in ("Scan", "If"):  # (followed above, by `_scan_origin`/`_branches_origin`)
            inner = _Flow(set(flow.values), dict(flow.sized))
            inner.values.update(value.name for value in sub.input)
            _follow(sub, inner)
            flow.dynamic = flow.dynamic or inner.dynamic
    if origin is not None and not flow.cost:
        flow.cost = origin
    for name in node.output:
        if not name:
            continue
        if valued:
            flow.values.add(name)
        if origin is not None:
            flow.sized.setdefault(name, origin)


def _keeps_size(node: onnx.NodeProto) -> bool:
    """Whether a node of `VALUE_SIZED_OPS` keeps its input's size, by its attributes.

    NOTE: a StringNormalizer removes only its `stopwords` ("If not set, no word would be
    removed from X", ONNX spec): without them it maps N strings to N. Counted as sizing by the
    values whatever its attributes, it had a TF-IDF text classifier (skl2onnx's
    TfidfVectorizer, whose StringNormalizer has no stop words unless the vectorizer has them)
    served unbatched, though its rows run as they do alone."""
    if node.op_type == "StringNormalizer":
        stopwords = next((a for a in node.attribute if a.name == "stopwords"), None)
        return stopwords is None or not stopwords.strings
    return False


def _scan_origin(node: onnx.NodeProto, flow: _Flow) -> str | None:
    """A Scan's trip count is its scanned inputs' length, a size: it follows the values only if
    its body does something that does (or a scanned input's size does)."""
    body = next(_subgraphs(node))
    inner = _Flow(set(flow.values), dict(flow.sized))
    inner.values.update(value.name for value in body.input)
    _follow(body, inner)
    flow.dynamic = flow.dynamic or inner.dynamic
    return inner.cost or None


def _branches_origin(node: onnx.NodeProto, flow: _Flow) -> str | None:
    """The first node of an If's branches whose size or cost follows the values, if any."""
    origin = None
    for branch in _subgraphs(node):
        inner = _Flow(set(flow.values), dict(flow.sized))
        _follow(branch, inner)
        flow.dynamic = flow.dynamic or inner.dynamic
        origin = origin or inner.cost or None
    return origin


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


# -- the guard ------------------------------------------------------------------------------------


def guard_integer_division(model: onnx.ModelProto, source: str = "model") -> int:
    """Rewrite `model` in place so that no int32/int64 Div or Mod, in its graph or any subgraph,
    divides by -1; return how many were rewritten.

    ORT's CPU kernels divide with the hardware's instruction, which traps on INT_MIN / -1: the
    whole server dies of SIGFPE on one request (plain onnxruntime does the same). Division by
    zero, the other trap, ORT checks itself (a clean error). So, with `m1 = Equal(b, -1)`:

        Div(a, b) -> Where(m1, Neg(a), Div(a, Where(m1, 1, b)))
        Mod(a, b) -> Mod(a, Where(m1, 1, b))

    `a / -1` is `-a` exactly, and INT_MIN's negation wraps to INT_MIN (numpy's INT_MIN // -1);
    `a mod -1` and `a mod 1` are both 0 (fmod or not). Every other answer is ORT's own, bit for
    bit. A divisor that is a constant without -1 (a shape's `// 2`) is left as it is. Float
    division does not trap and is left alone; element types come from ONNX shape inference.
    """
    if not any(_divisions(model)):
        return 0
    opset = next(
        (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), GUARD_MIN_OPSET
    )
    if opset < GUARD_MIN_OPSET:
        log.warning(
            "%s: integer Div/Mod cannot be guarded below opset %d (it has %d): a request "
            "dividing INT_MIN by -1 would crash the server", source, GUARD_MIN_OPSET, opset,
        )  # fmt: skip
        return 0
    if any(_divisions_in_functions(model)):
        # NOTE: local functions have no types of their own to read; ORT inlines them anyway.
        model.CopyFrom(onnx.inliner.inline_local_functions(model))
    types = _element_types(model)
    unknown = [
        node.output[0]
        for graph in _graphs(model.graph)
        for node in graph.node
        if _is_division(node) and types.get(node.input[0]) is None
    ]
    if unknown:
        log.warning(
            "%s: the element type of %s is unknown, so it is not guarded: if it is an "
            "int32/int64 division, a request dividing INT_MIN by -1 would crash the server",
            source, ", ".join(f"'{name}'" for name in unknown[:3]),
        )  # fmt: skip
    return _guard_graph(model.graph, types, _Names(model))


def _guard_graph(graph: onnx.GraphProto, types: Mapping[str, int], names: _Names) -> int:
    """Guard `graph`'s divisions, then its subgraphs'; return how many were guarded."""
    constants = _constant_values(graph)
    kinds = [_guarded_kind(node, types, constants) for node in graph.node]
    if any(kind is not None for kind in kinds):
        nodes: list[onnx.NodeProto] = []
        for node, kind in zip(graph.node, kinds, strict=True):
            nodes.extend([node] if kind is None else _guard(node, kind, names))
        replaced = [_copy(node) for node in nodes]  # (before the field lets go of its own)
        graph.ClearField("node")
        graph.node.extend(replaced)
    guarded = sum(kind is not None for kind in kinds)
    for node in graph.node:
        for sub in _subgraphs(node):
            guarded += _guard_graph(sub, types, names)
    return guarded


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    copied = onnx.NodeProto()
    copied.CopyFrom(node)
    return copied


def _is_division(node: onnx.NodeProto) -> bool:
    ours = node.domain in ("", "ai.onnx")
    return ours and node.op_type in ("Div", "Mod") and len(node.input) == 2


def _divisions(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    for graph in _graphs(model.graph):
        yield from (node for node in graph.node if _is_division(node))
    yield from _divisions_in_functions(model)


def _divisions_in_functions(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    for function in model.functions:
        for node in function.node:
            if _is_division(node):
                yield node
            for sub in _subgraphs(node):
                yield from (n for g in _graphs(sub) for n in g.node if _is_division(n))


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every subgraph in it (Loop, If and Scan bodies, nested)."""
    yield graph
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from _graphs(sub)


def _element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Each tensor's element type, as ONNX shape inference has it (subgraphs' too)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(_without_weights(model))
    except Exception as exc:  # (a graph it cannot type: its divisions go unguarded, warned of)
        log.debug("shape inference failed: %s", exc)
        inferred = model
    types: dict[str, int] = {}
    for graph in _graphs(inferred.graph):
        for value in (*graph.input, *graph.output, *graph.value_info):
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
                types[value.name] = value.type.tensor_type.elem_type
        for init in graph.initializer:
            types[init.name] = init.data_type
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                types[node.output[0]] = node.attribute[0].t.data_type
    return types


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its initializers declared as inputs (their type and dims), not held: what
    shape inference needs to type a graph.

    NOTE: inferring on the model itself serialised and parsed all its weights (ONNX's
    infer_shapes goes through bytes): an 800 MB model peaked at 4 GB and took 5 s to study."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    declared = {value.name for value in model.graph.input}
    graph.input.extend(
        helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
        for init in model.graph.initializer
        if init.name not in declared
    )
    return light


def _constant_values(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """The graph's constant tensors whose data it holds (not a request's to give)."""
    given = {value.name for value in graph.input}
    constants = {
        init.name: init
        for init in graph.initializer
        if init.name not in given and init.data_location != TensorProto.EXTERNAL
    }
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
    return constants


def _guarded_kind(
    node: onnx.NodeProto, types: Mapping[str, int], constants: Mapping[str, onnx.TensorProto]
) -> int | None:
    """The element type to guard `node` for; None if it cannot divide INT_MIN by -1."""
    if not _is_division(node):
        return None
    kind = types.get(node.input[0]) or types.get(node.input[1]) or types.get(node.output[0])
    if kind not in TRAPPING_INTEGERS:
        return None
    divisor = constants.get(node.input[1])
    if divisor is not None and not (numpy_helper.to_array(divisor) == -1).any():
        return None
    return kind


class _Names:
    """Fresh tensor and node names, none already in the model."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.taken: set[str] = set()
        for graph in _graphs(model.graph):
            self.taken.update(value.name for value in (*graph.input, *graph.output))
            self.taken.update(init.name for init in graph.initializer)
            for node in graph.node:
                self.taken.update(node.output)
                self.taken.add(node.name)

    def fresh(self, base: str) -> str:
        name, count = base, 0
        while name in self.taken:
            count += 1
            name = f"{base}_{count}"
        self.taken.add(name)
        return name


def _guard(node: onnx.NodeProto, kind: int, names: _Names) -> list[onnx.NodeProto]:
    """The nodes that replace `node` (see `guard_integer_division`)."""
    a, b = node.input
    base = f"{node.name or node.output[0]}/duetime_guard"
    minus_one, one, is_minus_one, safe = (
        names.fresh(f"{base}/{part}") for part in ("minus_one", "one", "is_minus_one", "divisor")
    )
    nodes = [
        helper.make_node(
            "Constant", [], [minus_one], names.fresh(minus_one),
            value=helper.make_tensor(minus_one, kind, [], [-1]),
        ),
        helper.make_node(
            "Constant", [], [one], names.fresh(one), value=helper.make_tensor(one, kind, [], [1])
        ),
        helper.make_node("Equal", [b, minus_one], [is_minus_one], names.fresh(is_minus_one)),
        helper.make_node("Where", [is_minus_one, one, b], [safe], names.fresh(safe)),
    ]  # fmt: skip
    divided = _copy(node)
    divided.input[1] = safe
    if node.op_type == "Mod":
        return [*nodes, divided]
    quotient, negated = names.fresh(f"{base}/quotient"), names.fresh(f"{base}/negated")
    divided.output[0] = quotient  # (its name stays: ORT's errors, division by zero, name it)
    return [
        *nodes,
        divided,
        helper.make_node("Neg", [a], [negated], names.fresh(negated)),
        helper.make_node(
            "Where", [is_minus_one, negated, quotient], [node.output[0]],
            names.fresh(f"{base}/answer"),
        ),
    ]  # fmt: skip
