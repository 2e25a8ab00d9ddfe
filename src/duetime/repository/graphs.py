"""What the loader learns from a model's ONNX graph, and the one rewrite it makes before serving it.

Learned: which outputs have a size set by the input values (Unique, NonZero, ...), whether an
execution's cost follows the values (a Loop's trip count, an Expand to a requested shape), and
whether activations are quantized dynamically. Rewritten: signed-integer Div and Mod, so that no
request can trap the process with INT_MIN / -1 (see `guard_integer_division`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx.inliner
from onnx import TensorProto, helper, numpy_helper

if TYPE_CHECKING:
    from duetime.repository.outputsizes import OutputSizes

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
    "MaxUnpool": (2,),
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
    sizes_follow_values: bool = False
    """Whether some tensor's size follows the input values (a node `_mark` finds: its
    `cost_why`), so one run may allocate far more than another."""
    sized_nodes: tuple[SizedNode, ...] = ()
    """Nodes whose output's size a request's input values set directly (see `sized_nodes`):
    what a request asks them to allocate can be told before it runs."""
    unbounded: tuple[str, ...] = ()
    """Nodes whose allocation follows the request's values in a way `sized_nodes` cannot
    compute before a run ("Loop node 'l'"): what they take is bounded only by ONNX Runtime's
    allocation failure (see `study_graph`'s warning)."""


@dataclass(frozen=True)
class StudiedGraph:
    """A model file as the loader serves it."""

    facts: GraphFacts | None
    """None: the onnx package cannot read the file (ORT's own format), so nothing is known."""
    guarded: bytes | None = None
    """The model with its integer divisions guarded, to serve in place of the file; None: the
    file as it is (it has none, or they cannot be guarded: see the log)."""
    sizes: OutputSizes | None = None
    """Its outputs' sizes as functions of its inputs' dims (`output_sizes`; None: not known)."""


UNBOUNDED_SHOWN = 5
"""The most nodes `study_graph`'s warning names."""


def study_graph(path: Path) -> StudiedGraph:
    """Read `path` (without its external tensors' data: tensors in files of their own stay
    there) and learn what serving it needs to know."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # (ORT read it: a file this cannot read is one ORT's own format took)
        return StudiedGraph(None)
    facts = graph_facts(model)
    if facts.unbounded:
        shown = ", ".join(facts.unbounded[:UNBOUNDED_SHOWN])
        more = len(facts.unbounded) - UNBOUNDED_SHOWN
        log.warning(
            "%s: the memory its %s allocate%s follows the request's values in a way not "
            "computed before a run, so --max-run-memory-bytes does not bound it (only ONNX "
            "Runtime's allocation failure does, or under memory overcommit the OOM killer)",
            path, shown + (f" and {more} more" if more > 0 else ""),
            "s" if len(facts.unbounded) == 1 else "",
        )  # fmt: skip
    from duetime.repository.outputsizes import output_sizes  # (it builds on this module)

    sizes = output_sizes(model)
    guarded = guard_integer_division(model, str(path))
    return StudiedGraph(facts, model.SerializeToString() if guarded else None, sizes)


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
    sized, unbounded = _sizing(model, flow.values) if flow.cost else ((), ())
    return GraphFacts(
        outputs, bool(cost_why), cost_why, flow.dynamic, bool(flow.cost), sized, unbounded
    )


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
    for sub in subgraphs(node):  # (quantizers in a branch count too)
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
    body = next(subgraphs(node))
    inner = _Flow(set(flow.values), dict(flow.sized))
    inner.values.update(value.name for value in body.input)
    _follow(body, inner)
    flow.dynamic = flow.dynamic or inner.dynamic
    return inner.cost or None


def _branches_origin(node: onnx.NodeProto, flow: _Flow) -> str | None:
    """The first node of an If's branches whose size or cost follows the values, if any."""
    origin = None
    for branch in subgraphs(node):
        inner = _Flow(set(flow.values), dict(flow.sized))
        _follow(branch, inner)
        flow.dynamic = flow.dynamic or inner.dynamic
        origin = origin or inner.cost or None
    return origin


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs `node` holds (an If's branches, a Loop's or a Scan's body), not nested."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


# -- sizes asked for -----------------------------------------------------------------------------

Feeds = Mapping[str, np.ndarray]
Value = Callable[[Feeds], np.ndarray | None]
"""A tensor's value computed from a request's feeds (None: the request does not give it)."""


@dataclass(frozen=True)
class SizedNode:
    """A node whose output's size follows a request's values in a way computed before it runs:
    `elements(feeds)` is a lower bound on its output's element count for those feeds (None:
    not known), each element `itemsize` bytes."""

    described: str
    """"ConstantOfShape node 'big'", for the error."""
    inputs: tuple[str, ...]
    """The request's inputs whose values size it."""
    itemsize: int
    elements: Callable[[Feeds], int | None]

    def bytes_asked(self, feeds: Feeds) -> int | None:
        """The bytes `feeds` ask its output to take, at least; None: not known (a value this
        cannot compute, or one ONNX Runtime will refuse, such as a negative dim)."""
        try:
            count = self.elements(feeds)
        except Exception:  # (values ORT refuses with its own error: a wrong rank, say)
            return None
        return None if count is None else count * self.itemsize


PASS_THROUGH_OPS = frozenset({"Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten"})
"""Ops whose output keeps its input's values in order (a scalar count made 1-D by an
Unsqueeze), as far as a size computed from them is concerned."""

ARITHMETIC: Mapping[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Max": np.maximum, "Min": np.minimum,
}  # fmt: skip
"""Ops computed on a request's values where they make a size (`Mul(n, 1024)`), in the tensors'
own types, as ONNX Runtime does (int64 wraps as there)."""

UNBOUNDED_OPS = frozenset(
    {*SIZE_INPUTS} - {"Reshape", "Slice", "Split", "SplitToSequence", "Squeeze", "Unsqueeze",
                      "TopK"}
)  # fmt: skip
"""Ops that can allocate far more than their inputs hold, as a size input asks (those of
`SIZE_INPUTS` but the ones that only rearrange or take a part): one whose size input follows
the request's values and is not computed by `_SIZERS` is named in `GraphFacts.unbounded`."""


def sized_nodes(model: onnx.ModelProto) -> tuple[SizedNode, ...]:
    """The nodes, in the main graph and its subgraphs, whose output size a request's values
    set in a way computed before a run (see `_sizing`)."""
    graph = model.graph
    flow = _Flow(values={value.name for value in graph.input}, sized={})
    _follow(graph, flow)
    return _sizing(model, flow.values)[0]


def _sizing(
    model: onnx.ModelProto, valued: set[str]
) -> tuple[tuple[SizedNode, ...], tuple[str, ...]]:
    """The nodes whose output size a request's values set, computed from them (`SizedNode`),
    and those whose size follows the values (`valued`: the main graph's tensors that do) in a
    way not computed here (named, for the load's warning).

    Computed: a size or shape input of ConstantOfShape, Expand, Tile, Range, OneHot, Pad,
    Resize, Upsample and MaxUnpool made from graph inputs and constants by `PASS_THROUGH_OPS`,
    Cast, Concat, `ARITHMETIC`, Shape of an input and Gather of constant indices (see `_Values`); in
    the main graph and in subgraphs (a node in a branch of an If counts where the condition,
    computed, takes that branch, or cannot be computed); and a Loop's scan outputs: its trip
    count M times a lower bound of the bytes each iteration adds to them.

    NOTE: a lower bound on what a run allocates, for a limit checked before it runs (one
    request of `ConstantOfShape([2**28])` made the server allocate 1 GiB and keep it). Only the
    main graph's nodes fed through pass-through ops were followed: a request giving a Loop's
    trip count 10**9 (4 GB of scan output) was run, its memory growing ~100 MB/s until its due
    time (without one, until the OOM killer), as was a ConstantOfShape in an If's branch or of
    `Mul(n, 1024)`. A Loop whose condition can end it early is still held to M: M is what the
    request asks for."""
    found: list[SizedNode] = []
    unbounded: list[str] = []
    _size_graph(model.graph, _Values(model.graph), valued, None, found, unbounded)
    return tuple(found), tuple(dict.fromkeys(unbounded))


Condition = Callable[[Feeds], bool | None]
"""Whether a subgraph runs for a request's feeds (None: not known)."""


def _size_graph(
    graph: onnx.GraphProto,
    values: _Values,
    valued: set[str],
    runs: Condition | None,
    found: list[SizedNode],
    unbounded: list[str],
) -> None:
    """`_sizing`'s walk of one graph: `values` computes its tensors, `valued` are those that
    follow the request's values, `runs` says whether it runs at all (None: it does)."""
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        described = f"{node.op_type} node '{node.name or node.output[0]}'"
        sizer = _SIZERS.get(node.op_type)
        made = sizer(node, values) if sizer is not None else None
        if node.op_type == "Loop":
            made = _looped(node, values)
        if made is not None and values.fed(made[1]):
            elements, reads = made
            itemsize = _itemsize(node, values)
            if node.op_type == "Loop":
                itemsize = max(_iteration_bytes(node), 1)
                described += f" (its scan outputs, at least {itemsize} bytes an iteration)"
            found.append(SizedNode(described, values.fed(reads), itemsize, _when(runs, elements)))
        elif node.op_type in UNBOUNDED_OPS | {"Loop"} and _sized_by(node, valued, values):
            unbounded.append(described)
        _size_subgraphs(node, values, valued, runs, found, unbounded)


def _size_subgraphs(
    node: onnx.NodeProto,
    values: _Values,
    valued: set[str],
    runs: Condition | None,
    found: list[SizedNode],
    unbounded: list[str],
) -> None:
    """`_size_graph` of `node`'s subgraphs: an If's branches each as its condition takes it,
    a Loop's or Scan's body (its inputs, the iteration's, computed by none)."""
    for attr in node.attribute:
        subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for sub in subs:
            inner = values.inside(sub)
            flow = _Flow(set(valued), {})
            flow.values.update(value.name for value in sub.input)
            _follow(sub, flow)
            when = runs
            if node.op_type == "If" and attr.name in ("then_branch", "else_branch"):
                when = _branch_runs(node, values, attr.name == "then_branch", runs)
            _size_graph(sub, inner, flow.values, when, found, unbounded)


def _sized_by(node: onnx.NodeProto, valued: set[str], values: _Values) -> bool:
    """Whether a size input of `node` follows the request's values; for a Loop with scan
    outputs, whether its trip count may: none given, or one that follows the values, or a
    constant of `WHILE_TRIPS` or more (an exporter's while loop, ended by its condition)."""
    if node.op_type != "Loop":
        return any(_input(node, index) in valued for index in SIZE_INPUTS.get(node.op_type, ()))
    if not _iteration_outputs(node):
        return False
    count = _input(node, 0)
    made = values.value(count) if count else None
    if made is None or made[1]:
        return not count or count in valued or made is not None
    trips = _scalar(made[0]({}))
    return trips is None or trips >= WHILE_TRIPS


WHILE_TRIPS = 2**31
"""A Loop's constant trip count from which it is taken as a while loop: its condition, not
the count, ends it (PyTorch's exporter writes INT64_MAX)."""


def _branch_runs(
    node: onnx.NodeProto, values: _Values, then: bool, runs: Condition | None
) -> Condition:
    """Whether an If's branch (`then` or else) runs: its condition computed from the feeds
    (None where it cannot be: the branch is counted)."""
    made = values.value(_input(node, 0))
    condition = made[0] if made is not None else None

    def taken(feeds: Feeds) -> bool | None:
        if runs is not None and runs(feeds) is False:
            return False
        value = None if condition is None else condition(feeds)
        if value is None or np.asarray(value).size != 1:
            return None
        return bool(np.asarray(value).reshape(-1)[0]) == then

    return taken


def _when(
    runs: Condition | None, elements: Callable[[Feeds], int | None]
) -> Callable[[Feeds], int | None]:
    """`elements`, but 0 where `runs` says its graph does not run for the feeds."""
    if runs is None:
        return elements
    return lambda feeds: 0 if runs(feeds) is False else elements(feeds)


def _looped(node: onnx.NodeProto, values: _Values) -> _Sized | None:
    """Loop(M, cond, ...): M iterations (none when `cond` is computed false), for a Loop with
    scan outputs; None without them (or without M)."""
    if not _iteration_outputs(node):
        return None
    made = values.value(_input(node, 0))
    if made is None:
        return None
    count, reads = made
    first = values.value(_input(node, 1)) if _input(node, 1) else None

    def iterations(feeds: Feeds) -> int | None:
        if first is not None:
            go = first[0](feeds)
            if go is not None and np.asarray(go).size == 1 and not np.asarray(go).any():
                return 0
        trips = _scalar(count(feeds))
        return None if trips is None or trips < 0 else int(trips)

    return iterations, reads


def _iteration_outputs(node: onnx.NodeProto) -> list[onnx.ValueInfoProto]:
    """A Loop's body outputs that are scan outputs (stacked, one slice per iteration)."""
    body = next(subgraphs(node), None)
    if body is None:
        return []
    carried = max(len(node.input) - 2, 0)
    return list(body.output[1 + carried :])


def _iteration_bytes(node: onnx.NodeProto) -> int:
    """A lower bound of the bytes a Loop's iteration adds to its scan outputs: each output's
    fixed dims times its element's size, a dim not fixed taken as 1."""
    total = 0
    for value in _iteration_outputs(node):
        kind = value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else 0
        try:
            size = int(helper.tensor_dtype_to_np_dtype(kind).itemsize) if kind else 1
        except Exception:  # (a type numpy has no dtype of)
            size = 1
        dims = value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else ()
        total += size * math.prod(d.dim_value if d.dim_value > 0 else 1 for d in dims)
    return total


class _Values:
    """Tensors of a graph whose values a request's feeds and its constants make."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.inputs = {value.name: value for value in graph.input}
        self.constants = _constant_values(graph)
        self.makers = {out: node for node in graph.node for out in node.output if out}
        self.types: dict[str, int] = {
            v.name: v.type.tensor_type.elem_type
            for v in (*graph.input, *graph.value_info, *graph.output)
            if v.type.HasField("tensor_type")
        }
        self.types.update({name: tensor.data_type for name, tensor in self.constants.items()})

    def inside(self, sub: onnx.GraphProto) -> _Values:
        """The values seen inside subgraph `sub`: this graph's (outer scope), its own
        constants and nodes, and its inputs (an iteration's) computed by none."""
        own = _Values(sub)
        made = object.__new__(_Values)
        hidden = set(own.inputs)
        made.inputs = {k: v for k, v in self.inputs.items() if k not in hidden}
        made.constants = {
            k: v for k, v in {**self.constants, **own.constants}.items() if k not in hidden
        }
        made.makers = {k: v for k, v in {**self.makers, **own.makers}.items() if k not in hidden}
        made.types = {**self.types, **own.types}
        return made

    def fed(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """Those of `names` that are the graph's inputs (a request's to give)."""
        return tuple(dict.fromkeys(name for name in names if name in self.inputs))

    def value(self, name: str, depth: int = 0) -> tuple[Value, tuple[str, ...]] | None:
        """How to compute tensor `name` from the feeds, and the inputs it reads; None: not by
        the ops followed here."""
        if name in self.inputs:
            default = self.constants.get(name)
            fixed = None if default is None else numpy_helper.to_array(default)
            return (lambda feeds: feeds.get(name, fixed)), (name,)
        if name in self.constants:
            array = numpy_helper.to_array(self.constants[name])
            return (lambda feeds: array), ()
        node = self.makers.get(name)
        if node is None or depth > 32 or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Shape" and len(node.input) == 1 and not node.attribute:
            source = node.input[0]
            if source not in self.inputs:
                return None
            return (lambda feeds: _shape_of(feeds.get(source))), (source,)
        parts = [self.value(part, depth + 1) for part in node.input if part]
        if not parts or any(part is None for part in parts):
            return None
        known = [part for part in parts if part is not None]
        reads = tuple(name for _, names in known for name in names)
        makers = [make for make, _ in known]
        compute = _computed(node, makers)
        return None if compute is None else (compute, reads)

    def shape(self, name: str) -> Callable[[Feeds], tuple[int, ...] | None]:
        """How to find tensor `name`'s shape: a fed input's own, a constant's; else None."""
        if name in self.inputs:
            return lambda feeds: None if feeds.get(name) is None else feeds[name].shape
        if name in self.constants:
            dims = tuple(self.constants[name].dims)
            return lambda feeds: dims
        return lambda feeds: None


def _computed(node: onnx.NodeProto, makers: list[Value]) -> Value | None:
    """How `node` computes its first output from its inputs' `makers`; None: an op not
    followed (see `_Values.value`)."""
    op = node.op_type
    first = makers[0]
    if op in PASS_THROUGH_OPS:
        return lambda feeds: _flat(first(feeds))
    if op == "Cast":
        to = next((a.i for a in node.attribute if a.name == "to"), 0)
        try:
            dtype = helper.tensor_dtype_to_np_dtype(to)
        except Exception:  # (a type numpy has no dtype of)
            return None
        return lambda feeds: _cast(first(feeds), dtype)
    if op == "Concat":
        return lambda feeds: _concat([make(feeds) for make in makers])
    if op in ARITHMETIC and len(makers) == 2:
        operation, second = ARITHMETIC[op], makers[1]
        return lambda feeds: _arithmetic(operation, first(feeds), second(feeds))
    if op == "Gather" and len(makers) == 2 and all(a.i == 0 for a in node.attribute):
        indices = makers[1]
        return lambda feeds: _gathered(first(feeds), indices(feeds))
    return None


def _shape_of(array: np.ndarray | None) -> np.ndarray | None:
    return None if array is None else np.array(np.shape(array), np.int64)


def _cast(array: np.ndarray | None, dtype: np.dtype[Any]) -> np.ndarray | None:
    if array is None:
        return None
    with np.errstate(all="ignore"):
        return np.asarray(array).astype(dtype)


def _arithmetic(
    operation: Callable[[np.ndarray, np.ndarray], np.ndarray],
    one: np.ndarray | None,
    other: np.ndarray | None,
) -> np.ndarray | None:
    if one is None or other is None:
        return None
    one, other = np.asarray(one), np.asarray(other)
    if one.dtype != other.dtype:  # (ONNX's operands share a type: ORT refuses the model else)
        return None
    with np.errstate(all="ignore"):
        return np.asarray(operation(one, other))


def _gathered(data: np.ndarray | None, indices: np.ndarray | None) -> np.ndarray | None:
    if data is None or indices is None:
        return None
    data = np.asarray(data)
    return np.take(data.reshape(-1) if data.ndim <= 1 else data, np.asarray(indices), axis=0)


def _flat(array: np.ndarray | None) -> np.ndarray | None:
    return None if array is None else np.asarray(array).reshape(-1)


def _concat(arrays: list[np.ndarray | None]) -> np.ndarray | None:
    if any(array is None for array in arrays):
        return None
    return np.concatenate([np.asarray(a).reshape(-1) for a in arrays if a is not None])


def _dims(array: np.ndarray | None) -> list[int] | None:
    """A shape's dims as Python ints (no overflow); None for a negative one (ORT refuses it)."""
    if array is None:
        return None
    dims = [int(d) for d in np.asarray(array).reshape(-1)]
    return None if any(d < 0 for d in dims) else dims


_Sized = tuple[Callable[[Feeds], int | None], tuple[str, ...]]
"""A node's element count from the feeds, and the inputs it reads."""


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if index < len(node.input) else ""


def _shaped(node: onnx.NodeProto, values: _Values) -> _Sized | None:
    """ConstantOfShape(shape): prod(shape) elements."""
    made = values.value(_input(node, 0))
    if made is None:
        return None
    shape, reads = made

    def elements(feeds: Feeds) -> int | None:
        dims = _dims(shape(feeds))
        return None if dims is None else math.prod(dims)

    return elements, reads


def _expanded(node: onnx.NodeProto, values: _Values) -> _Sized | None:
    """Expand(x, shape): x's shape broadcast with `shape` (where x's is unknown, prod(shape):
    each output dim is at least the shape's, or ORT refuses it)."""
    made = values.value(_input(node, 1))
    if made is None:
        return None
    shape, reads = made
    source = values.shape(_input(node, 0))

    def elements(feeds: Feeds) -> int | None:
        dims = _dims(shape(feeds))
        if dims is None:
            return None
        mine = source(feeds)
        if mine is None:
            return math.prod(dims)
        return math.prod(_broadcast(tuple(mine), tuple(dims)))

    return elements, reads


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    rank = max(len(a), len(b))
    a, b = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    return tuple(x if y == 1 else y if x == 1 else max(x, y) for x, y in zip(a, b, strict=True))


def _tiled(node: onnx.NodeProto, values: _Values) -> _Sized | None:
    """Tile(x, repeats): x's elements times prod(repeats) (x's taken as 1 where unknown)."""
    made = values.value(_input(node, 1))
    if made is None:
        return None
    repeats, reads = made
    source = values.shape(_input(node, 0))

    def elements(feeds: Feeds) -> int | None:
        dims = _dims(repeats(feeds))
        if dims is None:
            return None
        mine = source(feeds)
        return math.prod(dims) * (1 if mine is None else math.prod(mine))

    return elements, reads


def _ranged(node: onnx.NodeProto, values: _Values) -> _Sized | None:
    """Range(start, limit, delta): ceil((limit - start) / delta) elements, or none."""
    made = [values.value(_input(node, index)) for index in range(3)]
    if any(part is None for part in made):
        return None
    known = [part for part in made if part is not None]
    reads = tuple(name for _, names in known for name in names)

    def elements(feeds: Feeds) -> int | None:
        start, limit, delta = (_scalar(make(feeds)) for make, _ in known)
        if start is None or limit is None or not delta:
            return None
        return max(math.ceil((limit - start) / delta), 0)

    return elements, reads


def _scalar(array: np.ndarray | None) -> float | None:
    if array is None or np.asarray(array).size != 1:
        return None
    value = np.asarray(array).reshape(-1)[0].item()
    return value if math.isfinite(value) else None


def _one_hot(node: onnx.NodeProto, values: _Values) -> _Sized | None:
    """OneHot(indices, depth, values): indices' elements times depth."""
    made = values.value(_input(node, 1))
    if made is None:
        return None
    depth, reads = made
    source = values.shape(_input(node, 0))

    def elements(feeds: Feeds) -> int | None:
        count = _scalar(depth(feeds))
        if count is None or count < 1:
            return None
        mine = source(feeds)
        return int(count) * (1 if mine is None else math.prod(mine))

    return elements, reads


def _padded(node: onnx.NodeProto, values: _Values) -> _Sized | None:
    """Pad(x, pads): each of x's dims plus its pads at both ends (x's shape must be known; no
    `axes` input)."""
    if _input(node, 3):
        return None
    made = values.value(_input(node, 1))
    if made is None:
        return None
    pads, reads = made
    source = values.shape(_input(node, 0))

    def elements(feeds: Feeds) -> int | None:
        mine, given = source(feeds), pads(feeds)
        if mine is None or given is None:
            return None
        amounts = [int(p) for p in np.asarray(given).reshape(-1)]
        if len(amounts) != 2 * len(mine):
            return None
        rank = len(mine)
        return math.prod(max(dim + amounts[i] + amounts[i + rank], 0) for i, dim in enumerate(mine))

    return elements, reads


def _resized(node: onnx.NodeProto, values: _Values) -> _Sized | None:
    """Resize(x, roi, scales, sizes) and Upsample(x, scales): prod(sizes), or x's dims times
    the scales (x's shape must be known; no `axes` attribute)."""
    if any(attr.name == "axes" for attr in node.attribute):
        return None
    if node.op_type == "Resize" and _input(node, 3):
        return _shaped(_only_input(node, 3), values)
    made = values.value(_input(node, 1 if node.op_type == "Upsample" else 2))
    if made is None:
        return None
    scales, reads = made
    source = values.shape(_input(node, 0))

    def elements(feeds: Feeds) -> int | None:
        mine, given = source(feeds), scales(feeds)
        if mine is None or given is None:
            return None
        factors = [float(f) for f in np.asarray(given).reshape(-1)]
        if len(factors) != len(mine) or not all(math.isfinite(f) and f >= 0 for f in factors):
            return None
        return math.prod(math.floor(dim * f) for dim, f in zip(mine, factors, strict=True))

    return elements, reads


def _only_input(node: onnx.NodeProto, index: int) -> onnx.NodeProto:
    """`node` as one whose first input is its input `index` (for `_shaped`)."""
    copied = onnx.NodeProto()
    copied.op_type = node.op_type
    copied.input.append(node.input[index])
    return copied


def _unpooled(node: onnx.NodeProto, values: _Values) -> _Sized | None:
    """MaxUnpool(x, indices, output_shape): prod(output_shape) elements.

    NOTE: without it (a size input no list named), a request asking `output_shape` [1, 1,
    40000, 40000] of a one-pixel MaxUnpool was run: 6.4 GB allocated, kept after the answer,
    and no warning at load (found by a tester)."""
    return _shaped(_only_input(node, 2), values) if _input(node, 2) else None


_SIZERS: Mapping[str, Callable[[onnx.NodeProto, _Values], _Sized | None]] = {
    "ConstantOfShape": _shaped, "Expand": _expanded, "Tile": _tiled, "Range": _ranged,
    "OneHot": _one_hot, "Pad": _padded, "Resize": _resized, "Upsample": _resized,
    "MaxUnpool": _unpooled,
}  # fmt: skip


def _itemsize(node: onnx.NodeProto, values: _Values) -> int:
    """Bytes of one element of `node`'s output: ConstantOfShape's `value`'s type (float32 by
    default), OneHot's `values`', the others' first input's; 1 where unknown (a lower bound)."""
    kind: int | None = None
    if node.op_type == "ConstantOfShape":
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        kind = value.data_type if value is not None else TensorProto.FLOAT
    else:
        kind = values.types.get(_input(node, 2 if node.op_type == "OneHot" else 0))
    try:
        return int(helper.tensor_dtype_to_np_dtype(kind).itemsize) if kind else 1
    except Exception:  # (a type numpy has no dtype of: bfloat16 in an older onnx, say)
        return 1


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
        for sub in subgraphs(node):
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
            for sub in subgraphs(node):
                yield from (n for g in _graphs(sub) for n in g.node if _is_division(n))


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every subgraph in it (Loop, If and Scan bodies, nested)."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
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
