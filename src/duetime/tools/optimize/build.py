"""Making the variant files: fp16 by conversion, int8 by ONNX Runtime's dynamic or static (QDQ)
quantization. Each is built into a hidden temp file beside the model and checked for answers."""

from __future__ import annotations

import heapq
import importlib.util
import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quant_pre_process,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.quantization.registry import IntegerOpsRegistry
from onnxruntime.transformers.float16 import convert_float_to_float16

from duetime.config import VariantQuality
from duetime.execution.ort import graph_specs, open_session, session_options
from duetime.tools.optimize.measure import compare, ranking_keys
from duetime.tools.optimize.options import Kind, file_of, reason_of
from duetime.tools.optimize.probe import check_graph, check_loads, save_feeds
from duetime.tools.optimize.samples import Feeds, batches_of, run_all
from duetime.types import ModelSignature

_DYNAMIC_OPS = sorted(set(IntegerOpsRegistry) - {"Conv"} | {"Gemm"})
# NOTE: Conv is left out of dynamic quantization: ORT's ConvInteger has no fast CPU kernel (the
# demo resnet ran 4-5x slower with it). Static QDQ quantization is the way for convolutions.


class _Reader(CalibrationDataReader):  # type: ignore[misc]
    def __init__(self, batches: list[Feeds]) -> None:
        self._batches = iter(batches)

    def get_next(self) -> Feeds | None:
        return next(self._batches, None)


def _prepare(model: Path, scratch: Path) -> tuple[Path, str | None]:
    """ORT's documented pre-processing for quantization (shape inference, graph optimisation).

    NOTE: its symbolic shape inference needs sympy, which neither duetime nor ONNX Runtime
    installs: without it that one pass is skipped (ONNX's own shape inference still runs)."""
    prepared = scratch / "prepared.onnx"
    symbolic = importlib.util.find_spec("sympy") is not None
    try:
        quant_pre_process(str(model), str(prepared), skip_symbolic_shape=not symbolic)
    except Exception as exc:  # the pre-processor raises whatever its passes raise
        return model, f"quantization pre-processing failed ({reason_of(exc)}); quantized as is"
    if not symbolic:
        return prepared, (
            "quantization pre-processing ran without symbolic shape inference, which needs "
            "sympy (pip install sympy)"
        )
    return prepared, None


PRE_PROCESS_ADVICE = "pre-processing before quantization"
"""In what ORT's quantizers log on the root logger for a model not pre-processed ("Please
consider to run pre-processing before quantization", "Please consider pre-processing before
quantization"): duetime has pre-processed it when it could, and says so itself when it could
not."""


class _DropAdvice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return PRE_PROCESS_ADVICE not in record.getMessage()


@contextmanager
def quiet_quantizer_advice() -> Iterator[None]:
    """Within: ORT's PRE_PROCESS_ADVICE is dropped from the root logger; all as it was after.

    NOTE: ORT logs it with `logging.warning`, which gives a root logger with no handler one of
    its own (basicConfig) that would stay: a NullHandler stands in while quantizing."""
    root = logging.getLogger()
    drop = _DropAdvice()
    stand_in = logging.NullHandler() if not root.handlers else None
    root.addFilter(drop)
    if stand_in is not None:
        root.addHandler(stand_in)
    try:
        yield
    finally:
        root.removeFilter(drop)
        if stand_in is not None:
            root.removeHandler(stand_in)


def _float_weights(model: onnx.ModelProto) -> int:
    tensors = list(model.graph.initializer) + [
        attr.t for node in model.graph.node if node.op_type == "Constant" for attr in node.attribute
    ]
    return sum(t.data_type == onnx.TensorProto.FLOAT and len(t.dims) > 0 for t in tensors)


def _subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    """Every name the node's subgraphs (If, Loop, Scan bodies) read, at any depth: a superset of
    the outer-scope values they use."""
    names: set[str] = set()
    for attr in node.attribute:
        for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
            for inner in graph.node:
                names.update(inner.input)
                names |= _subgraph_inputs(inner)
    return names


def topologically_sorted(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """`nodes` in an order where each comes after the nodes whose outputs it reads, otherwise
    keeping their order (Kahn's algorithm, taking the earliest ready node each time)."""
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    needs = [
        {producer[name] for name in {*node.input, *_subgraph_inputs(node)} if name in producer}
        - {i}
        for i, node in enumerate(nodes)
    ]
    users: list[list[int]] = [[] for _ in nodes]
    for i, wanted in enumerate(needs):
        for j in wanted:
            users[j].append(i)
    waiting = [len(wanted) for wanted in needs]
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for user in users[i]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) != len(nodes):
        raise ValueError("the converted graph has a cycle")
    return [nodes[i] for i in order]


def _convert(
    kind: Kind, source: Path, prepared: Path, out: Path, calib: list[Feeds], pc: bool
) -> None:
    if kind == "fp16":
        model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
        # NOTE: with keep_io_types the converter appends the Casts of the graph's inputs after
        # the nodes that read them: ONNX's checker rejects that, and ORT_ENABLE_ALL's
        # optimisers crashed on it (SIGSEGV) for a transformer. Sorted, it checks and loads.
        nodes = topologically_sorted(list(model.graph.node))
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        onnx.save(model, str(out))
    elif kind == "int8-dynamic":
        with quiet_quantizer_advice():
            quantize_dynamic(str(prepared), str(out), op_types_to_quantize=_DYNAMIC_OPS)
    else:
        # NOTE: uint8 activations (U8S8): with ORT's default int8 ones (S8S8) its CPU graph
        # optimiser fused only 3 of the demo resnet's 8 QDQ convolutions into QLinearConv and
        # the model ran no faster than fp32; with U8S8 all fuse and it ran 2.5-3x faster.
        with quiet_quantizer_advice():
            quantize_static(
                str(prepared), str(out), _Reader(calib), quant_format=QuantFormat.QDQ,
                per_channel=pc, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
            )  # fmt: skip
    wanted = (
        (onnx.TensorProto.FLOAT16,)
        if kind == "fp16"
        else (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)
    )
    built = onnx.load(str(out), load_external_data=False)
    if not any(t.data_type in wanted for t in built.graph.initializer):
        raise ValueError(f"{kind} conversion changed no weights; nothing to gain")


@dataclass
class Built:
    """A variant built into `temp` (hidden; the caller moves or removes it), open in `session`."""

    kind: Kind
    temp: Path
    session: Any
    quality: VariantQuality
    note: str = ""


RUNS_ALONE: frozenset[str] = frozenset({"int8-dynamic"})
"""Kinds whose activations are quantized dynamically (one scale over the whole input tensor):
the server runs each request of such a variant on its own, whatever the model's batching (see
repository/loader.py `QUANTIZED_WHY`), so their answers are compared, and their speed judged,
one request at a time.

NOTE: judged on batches, an int8-dynamic variant was kept for being faster at batch 32, a size
the server never runs it at (at batch 1 it was slower), and its max abs error was that of rows
sharing a scale (0.558 where the server's answers differed by 0.511; found by a tester)."""


class Builder:
    """Builds each kind of the version's `model` into a hidden temp file beside it and checks
    it: ONNX's checker, a child process that opens and runs it, then its answers against the
    primary's on the sample set."""

    def __init__(
        self,
        model: Path,
        signature: ModelSignature,
        samples: Feeds,
        calib: Feeds,
        scratch: Path,
        by_argmax: bool = True,
    ) -> None:
        self.model, self.signature, self.scratch = model, signature, scratch
        self.by_argmax = by_argmax
        self.batches, self.calib = batches_of(samples, signature), batches_of(calib, signature)
        self.singles = batches_of(samples, signature, rows=1)
        """The samples one a run, as the server runs a kind of `RUNS_ALONE`."""
        self.options = session_options(intra_op_threads=1, inter_op_threads=1)
        self.float_weights = _float_weights(onnx.load(str(model), load_external_data=False))
        self.prepared: Path | None = None
        self.notes: list[str] = []
        self.feeds = save_feeds(self.batches[0], scratch / "feeds.npz")

    def build(self, kind: Kind, reference: list[np.ndarray]) -> Built:
        """The built variant (its file still hidden); the better of per-channel and per-tensor
        for int8-static. Raises whatever the converter or ONNX Runtime raised."""
        if self.float_weights == 0:
            raise ValueError("the graph has no FP32 weights to convert")
        if self.prepared is None and kind != "fp16":
            self.prepared, note = _prepare(self.model, self.scratch)
            self.notes += [note] if note else []
        candidates: list[Built] = []
        try:
            for per_channel in [True, False] if kind == "int8-static" else [False]:
                candidates.append(self._candidate(kind, per_channel, reference))
        except BaseException:
            for c in candidates:
                c.temp.unlink(missing_ok=True)
            raise
        keys = ranking_keys([c.quality for c in candidates], self.by_argmax)
        best = candidates[keys.index(min(keys))]
        for c in candidates:
            if c is not best:
                c.temp.unlink(missing_ok=True)
        return best

    def _candidate(self, kind: Kind, per_channel: bool, reference: list[np.ndarray]) -> Built:
        temp = self._temp(kind)
        try:
            prepared = self.prepared or self.model
            _convert(kind, self.model, prepared, temp, self.calib, per_channel)
            # NOTE: ORT's converters can write graphs ORT itself crashes on (fp16 of a
            # transformer: nodes out of order, SIGSEGV at session creation); checked, then
            # opened in a child first, so that the crash fails this kind and not the run.
            check_graph(temp)
            check_loads(temp, self.feeds)
            session = open_session(temp, self.options)
            self._check_signature(session, temp)
            runs = self.singles if kind in RUNS_ALONE else self.batches
            outputs = run_all(session, runs, self.signature.max_batch_size > 0)
            quality = compare(reference, outputs)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        note = ("per-channel" if per_channel else "per-tensor") if kind == "int8-static" else ""
        return Built(kind, temp, session, quality, note)

    def _temp(self, kind: Kind) -> Path:
        return self.model.parent / f".{file_of(kind)}.{secrets.token_hex(4)}.tmp"

    def _check_signature(self, session: Any, path: Path) -> None:
        inputs, outputs = graph_specs(session, path)
        # (optional inputs may go: quantizing a weight drops its graph input, see the loader)
        signature = self.signature
        mine = [(s.name, s.datatype) for s in (*signature.required_inputs, *signature.outputs)]
        theirs = [(s.name, s.datatype) for s in (*inputs, *outputs) if not s.optional]
        if sorted(mine) != sorted(theirs):
            raise ValueError(f"the variant's inputs and outputs {theirs} differ from {mine}")
