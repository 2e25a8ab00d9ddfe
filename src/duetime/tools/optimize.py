"""`duetime optimize`: build fp16 and int8 copies of a model version, measure their quality and
speed against the primary, and list the worthwhile ones as variants in the model's config.

    duetime optimize models/resnet --kinds int8-static --calibration images.npz --json out.json

Python API: `optimize(OptimizeOptions(...))` returns an `OptimizeReport`.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import tomlkit
import yaml
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

from duetime.config import (
    CONFIG_FILENAMES,
    ModelConfig,
    VariantConfig,
    VariantQuality,
    VariantSpeed,
    load_model_config,
    parse_model_config,
    read_config_file,
)
from duetime.datatypes import NUMPY_OF
from duetime.errors import ConfigError, DuetimeError
from duetime.execution.ort import graph_specs, open_session, session_options
from duetime.repository.layout import MODEL_FILENAME, scan_model
from duetime.repository.loader import reconcile
from duetime.types import ModelSignature, TensorSpec

Kind = Literal["fp16", "int8-dynamic", "int8-static"]
KINDS: tuple[Kind, ...] = ("fp16", "int8-dynamic", "int8-static")
DEFAULT_SAMPLES = 256
DEFAULT_MEASURE_S = 2.0
"""Seconds spent timing each batch size, shared round-robin by the primary and its variants."""
SEED = 0
FASTER_BY = 0.02
"""A variant counts as faster when its median time is at least this share below the primary's:
smaller differences are within run-to-run noise."""
CLOSE_RTOL = CLOSE_ATOL = 1e-2
"""For a first output with one value per sample (nothing to take an argmax over), a sample
agrees when the values are within these tolerances (`numpy.isclose`)."""
RANDOM_INT_HIGH = 8
"""Random integer inputs are drawn from [0, 8): valid as small indices or category ids."""
MIN_TIMING_ROUNDS, MAX_TIMING_ROUNDS = 5, 200
_DYNAMIC_OPS = sorted(set(IntegerOpsRegistry) - {"Conv"} | {"Gemm"})
# NOTE: Conv is left out of dynamic quantization: ORT's ConvInteger has no fast CPU kernel (the
# demo resnet ran 4-5x slower with it). Static QDQ quantization is the way for convolutions.

Feeds = dict[str, np.ndarray]
Status = Literal["kept", "dropped", "failed"]


class OptimizeError(DuetimeError):
    """The model cannot be optimized as asked (its primary cannot run on the sample inputs)."""


@dataclass(frozen=True)
class OptimizeOptions:
    model_dir: Path
    version: int | None = None
    kinds: tuple[Kind, ...] = KINDS
    calibration: Path | None = None
    samples: int = DEFAULT_SAMPLES
    keep_slower: bool = False
    measure_s: float = DEFAULT_MEASURE_S


@dataclass
class VariantResult:
    """What became of one kind: built and listed (kept), built but not listed, or not built."""

    kind: Kind
    file: str
    status: Status
    reason: str
    quality: VariantQuality | None = None
    speed: VariantSpeed | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "file": self.file, "status": self.status, "reason": self.reason,
            "quality": self.quality.model_dump() if self.quality else None,
            "speed": self.speed.model_dump() if self.speed else None,
        }  # fmt: skip


@dataclass
class OptimizeReport:
    model: str
    version: int
    samples: int
    sample_source: str
    max_batch: int
    primary_batch_1_us: float
    primary_max_batch_us: float | None
    results: list[VariantResult]
    config_path: Path | None
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "version": self.version, "samples": self.samples,
            "sample_source": self.sample_source, "max_batch": self.max_batch,
            "primary": {"batch_1_us": self.primary_batch_1_us,
                        "max_batch_us": self.primary_max_batch_us},
            "variants": [r.to_json() for r in self.results],
            "config": str(self.config_path) if self.config_path else None,
            "elapsed_s": round(self.elapsed_s, 2), "notes": self.notes,
        }  # fmt: skip

    def format(self) -> str:
        max_head = f"batch {self.max_batch} µs" if self.primary_max_batch_us else "max batch µs"
        rows = [("kind", "file", "max abs err", "argmax", "batch 1 µs", max_head, "result")]
        rows.append(("primary", MODEL_FILENAME, "-", "-", _us(self.primary_batch_1_us, None),
                     _us(self.primary_max_batch_us, None), ""))  # fmt: skip
        for r in self.results:
            q, s = r.quality, r.speed
            rows.append((
                r.kind, r.file if r.status == "kept" else "-",
                f"{q.max_abs_error:.3g}" if q else "-", f"{q.argmax_agreement:.3f}" if q else "-",
                _us(s.batch_1_us, s.primary_batch_1_us) if s else "-",
                _us(s.max_batch_us, s.primary_max_batch_us) if s else "-",
                f"{r.status}: {r.reason}",
            ))  # fmt: skip
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        lines = [
            f"{self.model} version {self.version}: {self.samples} samples ({self.sample_source})"
        ]
        for row in rows:
            cells = [c.rjust(w) if 2 <= i <= 5 else c.ljust(w) for i, (c, w) in
                     enumerate(zip(row, widths, strict=False))]  # fmt: skip
            lines.append("  ".join([*cells, row[-1]]).rstrip())
        where = self.config_path or "nothing: no kind could be built"
        lines.append(f"updated {where} ({self.elapsed_s:.1f} s)")
        return "\n".join([*lines, *self.notes])


def _us(value: float | None, primary: float | None) -> str:
    if value is None:
        return "-"
    text = f"{value:.0f}" if value >= 100 else f"{value:.1f}"
    return f"{text} (x{value / primary:.2f})" if primary else text


# -- finding the model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    model_dir: Path
    version: int
    path: Path


def resolve_target(model_dir: Path, version: int | None) -> _Target:
    """The model file to optimize; ConfigError naming the path when there is none."""
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: not a folder; expected a model folder REPO/MODEL")
    if (
        model_dir.name.isascii()
        and model_dir.name.isdigit()
        and (model_dir / MODEL_FILENAME).is_file()
    ):
        raise ConfigError(
            f"{model_dir} is a version folder; give the model folder {model_dir.parent} "
            f"and --version {model_dir.name}"
        )
    source = scan_model(model_dir)
    chosen = source.latest if version is None else version
    if chosen not in source.versions:
        found = ", ".join(str(v) for v in sorted(source.versions))
        raise ConfigError(
            f"{model_dir}: no version {chosen} holds a {MODEL_FILENAME}; found {found}"
        )
    return _Target(model_dir, chosen, source.versions[chosen])


# -- sample inputs -------------------------------------------------------------------------------


def _per_sample_shape(spec: TensorSpec, batched: bool) -> tuple[int, ...]:
    return spec.shape[1:] if batched else spec.shape


def random_samples(
    signature: ModelSignature, count: int, seed: int, *, zero_ints: bool = False
) -> Feeds:
    """`count` samples of every input, stacked on a new first axis; free dims are 1.

    Floats are standard normal; integers uniform in [0, RANDOM_INT_HIGH) (or zeros); text empty.
    """
    rng = np.random.default_rng(seed)
    batched = signature.max_batch_size > 0
    samples: Feeds = {}
    for spec in signature.inputs:
        shape = (count, *(d if d >= 0 else 1 for d in _per_sample_shape(spec, batched)))
        dtype = NUMPY_OF[spec.datatype]
        if spec.datatype == "BYTES":
            samples[spec.name] = np.full(shape, "", dtype=object)
        elif dtype.kind == "f":
            samples[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            samples[spec.name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            high = 1 if zero_ints else RANDOM_INT_HIGH
            samples[spec.name] = rng.integers(0, high, shape).astype(dtype)
    return samples


def load_calibration(path: Path, signature: ModelSignature, count: int) -> Feeds:
    """The first `count` samples of an .npz file holding one array per input, samples first."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError) as exc:
        raise ConfigError(f"--calibration {path}: cannot be read as .npz: {exc}") from exc
    wanted = [spec.name for spec in signature.inputs]
    if sorted(arrays) != sorted(wanted):
        raise ConfigError(
            f"--calibration {path}: holds arrays {sorted(arrays)}; the model's inputs are {wanted}"
        )
    batched = signature.max_batch_size > 0
    samples = {s.name: _fit(path, s, arrays[s.name], batched) for s in signature.inputs}
    sizes = {name: len(array) for name, array in samples.items()}
    if len(set(sizes.values())) != 1 or 0 in sizes.values():
        raise ConfigError(f"--calibration {path}: arrays need the same number of samples: {sizes}")
    return {name: array[:count] for name, array in samples.items()}


def _fit(path: Path, spec: TensorSpec, array: np.ndarray, batched: bool) -> np.ndarray:
    def fits(shape: tuple[int, ...], want: tuple[int, ...]) -> bool:
        return len(shape) == len(want) and all(
            w in (-1, d) for d, w in zip(shape, want, strict=True)
        )

    want = _per_sample_shape(spec, batched)
    if not fits(array.shape[1:], want):
        if not batched and want[:1] == (1,) and fits(array.shape[1:], want[1:]):
            array = array[:, None]  # a model fixed at batch 1: samples without that dim
        else:
            raise ConfigError(
                f"--calibration {path}: '{spec.name}' has shape {list(array.shape)}; expected "
                f"[samples, {', '.join(str(d) for d in want)}] (-1: any size)"
            )
    dtype = NUMPY_OF[spec.datatype]
    if spec.datatype == "BYTES" or not np.can_cast(array.dtype, dtype, "same_kind"):
        raise ConfigError(
            f"--calibration {path}: '{spec.name}' is {array.dtype}; the model takes {spec.datatype}"
        )
    return array.astype(dtype, copy=False)


def _batches(samples: Feeds, signature: ModelSignature) -> list[Feeds]:
    """The sample set as run feeds: chunks of the max batch, or one sample per run."""
    count = len(next(iter(samples.values())))
    if signature.max_batch_size == 0:
        return [{name: a[i] for name, a in samples.items()} for i in range(count)]
    step = signature.max_batch_size
    return [{name: a[i : i + step] for name, a in samples.items()} for i in range(0, count, step)]


def _rows(samples: Feeds, rows: int) -> Feeds:
    """The first `rows` samples as one batch, repeating the set when it is smaller."""
    return {name: np.take(a, np.arange(rows) % len(a), axis=0) for name, a in samples.items()}


def _run_all(session: Any, batches: list[Feeds], batched: bool) -> list[np.ndarray]:
    """Every output over the whole sample set, samples first."""
    runs = [session.run(None, feeds) for feeds in batches]
    join = np.concatenate if batched else np.stack
    return [join([run[i] for run in runs]) for i in range(len(runs[0]))]


class _Reader(CalibrationDataReader):  # type: ignore[misc]
    def __init__(self, batches: list[Feeds]) -> None:
        self._batches = iter(batches)

    def get_next(self) -> Feeds | None:
        return next(self._batches, None)


# -- building ------------------------------------------------------------------------------------


def _prepare(model: Path, scratch: Path) -> tuple[Path, str | None]:
    """ORT's documented pre-processing for quantization (shape inference, graph optimisation)."""
    prepared = scratch / "prepared.onnx"
    try:
        quant_pre_process(str(model), str(prepared))
        return prepared, None
    except Exception as exc:  # the pre-processor raises whatever its passes raise
        return model, f"quantization pre-processing failed ({_reason(exc)}); quantized as is"


def _float_weights(model: onnx.ModelProto) -> int:
    tensors = list(model.graph.initializer) + [
        attr.t for node in model.graph.node if node.op_type == "Constant" for attr in node.attribute
    ]
    return sum(t.data_type == onnx.TensorProto.FLOAT and len(t.dims) > 0 for t in tensors)


def _build(
    kind: Kind, source: Path, prepared: Path, out: Path, calib: list[Feeds], pc: bool
) -> None:
    if kind == "fp16":
        model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
        onnx.save(model, str(out))
    elif kind == "int8-dynamic":
        quantize_dynamic(str(prepared), str(out), op_types_to_quantize=_DYNAMIC_OPS)
    else:
        # NOTE: uint8 activations (U8S8): with ORT's default int8 ones (S8S8) its CPU graph
        # optimiser fused only 3 of the demo resnet's 8 QDQ convolutions into QLinearConv and
        # the model ran no faster than fp32; with U8S8 all fuse and it ran 2.5-3x faster.
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
class _Built:
    kind: Kind
    temp: Path
    session: Any
    quality: VariantQuality
    note: str = ""


class _Builder:
    """Builds each kind into a hidden temp file in the version folder and checks its answers."""

    def __init__(
        self,
        target: _Target,
        signature: ModelSignature,
        samples: Feeds,
        calib: Feeds,
        scratch: Path,
    ) -> None:
        self.target, self.signature, self.scratch = target, signature, scratch
        self.batches, self.calib = _batches(samples, signature), _batches(calib, signature)
        self.options = session_options(intra_op_threads=1, inter_op_threads=1)
        self.float_weights = _float_weights(onnx.load(str(target.path), load_external_data=False))
        self.prepared: Path | None = None
        self.notes: list[str] = []

    def build(self, kind: Kind, reference: list[np.ndarray]) -> _Built:
        """The built variant (its file still hidden); the better of per-channel and per-tensor
        for int8-static. Raises whatever the converter or ONNX Runtime raised."""
        if self.float_weights == 0:
            raise ValueError("the graph has no FP32 weights to convert")
        if self.prepared is None and kind != "fp16":
            self.prepared, note = _prepare(self.target.path, self.scratch)
            self.notes += [note] if note else []
        candidates: list[_Built] = []
        try:
            for per_channel in [True, False] if kind == "int8-static" else [False]:
                candidates.append(self._candidate(kind, per_channel, reference))
        except BaseException:
            for c in candidates:
                c.temp.unlink(missing_ok=True)
            raise
        best = min(candidates, key=lambda c: _quality_key(c.quality))
        for c in candidates:
            if c is not best:
                c.temp.unlink(missing_ok=True)
        return best

    def _candidate(self, kind: Kind, per_channel: bool, reference: list[np.ndarray]) -> _Built:
        temp = self._temp(kind)
        try:
            prepared = self.prepared or self.target.path
            _build(kind, self.target.path, prepared, temp, self.calib, per_channel)
            session = open_session(temp, self.options)
            self._check_signature(session, temp)
            outputs = _run_all(session, self.batches, self.signature.max_batch_size > 0)
            quality = compare(reference, outputs)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        note = ("per-channel" if per_channel else "per-tensor") if kind == "int8-static" else ""
        return _Built(kind, temp, session, quality, note)

    def _temp(self, kind: Kind) -> Path:
        return self.target.path.parent / f".{_file_of(kind)}.{secrets.token_hex(4)}.tmp"

    def _check_signature(self, session: Any, path: Path) -> None:
        inputs, outputs = graph_specs(session, path)
        mine = [(s.name, s.datatype) for s in (*self.signature.inputs, *self.signature.outputs)]
        theirs = [(s.name, s.datatype) for s in (*inputs, *outputs)]
        if sorted(mine) != sorted(theirs):
            raise ValueError(f"the variant's inputs and outputs {theirs} differ from {mine}")


def _file_of(kind: Kind) -> str:
    return f"model.{kind}.onnx"


def _reason(exc: BaseException) -> str:
    text = (exc.message if isinstance(exc, DuetimeError) else str(exc)).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first[:200]}"


# -- measuring -----------------------------------------------------------------------------------


def compare(reference: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> VariantQuality:
    """Max abs error over all numeric outputs; argmax agreement over the first output.

    The argmax is taken over the last axis of each sample's first output and compared at every
    remaining position. Where a sample's first output has no axis longer than 1 (a score, a
    label), a sample agrees when `numpy.isclose` (CLOSE_RTOL, CLOSE_ATOL) holds for it.
    """
    error = 0.0
    for ref, out in zip(reference, outputs, strict=True):
        if ref.shape != out.shape:
            raise ValueError(
                f"an output has shape {list(out.shape)}, the primary's {list(ref.shape)}"
            )
        if ref.dtype.kind in "biuf" and out.dtype.kind in "biuf":
            diff = np.abs(ref.astype(np.float64) - out.astype(np.float64))
            error = max(error, float(np.max(np.where(np.isnan(diff), np.inf, diff), initial=0.0)))
    ref, out = reference[0], outputs[0]
    count = len(ref)
    if ref.dtype.kind not in "biuf":
        agree = np.mean(ref.reshape(count, -1) == out.reshape(count, -1), axis=1)
    elif ref.ndim > 1 and ref.shape[-1] > 1:
        agree = np.mean((ref.argmax(-1) == out.argmax(-1)).reshape(count, -1), axis=1)
    else:
        close = np.isclose(out, ref, rtol=CLOSE_RTOL, atol=CLOSE_ATOL).reshape(count, -1)
        agree = close.all(axis=1)
    agreement = float(np.mean(agree)) if count else 0.0
    return VariantQuality(max_abs_error=error, argmax_agreement=agreement, samples=count)


def _quality_key(quality: VariantQuality | None) -> tuple[float, float]:
    """Sorts best first: argmax agreement descending, then max abs error ascending."""
    if quality is None:
        return (1.0, float("inf"))
    return (-quality.argmax_agreement, quality.max_abs_error)


def median_times_us(sessions: Sequence[Any], feeds: Feeds, budget_s: float) -> list[float]:
    """Median execution time of each session on `feeds`, timed in rounds (one run of each per
    round, so drift in the machine's speed touches all alike) until `budget_s` is spent."""
    for session in sessions:
        session.run(None, feeds)
    times: list[list[int]] = [[] for _ in sessions]
    deadline = time.perf_counter() + budget_s
    rounds = 0
    while rounds < MIN_TIMING_ROUNDS or (
        rounds < MAX_TIMING_ROUNDS and time.perf_counter() < deadline
    ):
        for session, samples in zip(sessions, times, strict=True):
            started = time.perf_counter_ns()
            session.run(None, feeds)
            samples.append(time.perf_counter_ns() - started)
        rounds += 1
    return [statistics.median(samples) / 1e3 for samples in times]


def _speeds(
    primary: Any, built: list[_Built], samples: Feeds, signature: ModelSignature, budget_s: float
) -> tuple[list[float], list[float] | None]:
    """Medians in µs (primary first) at batch 1 and at the max batch (None: no batching)."""
    sessions = [primary, *(b.session for b in built)]
    if signature.max_batch_size == 0:
        return median_times_us(sessions, _batches(samples, signature)[0], budget_s), None
    one = median_times_us(sessions, _rows(samples, 1), budget_s)
    if signature.max_batch_size == 1:
        return one, None
    return one, median_times_us(sessions, _rows(samples, signature.max_batch_size), budget_s)


def verdict(speed: VariantSpeed, max_batch: int, keep_slower: bool) -> tuple[Status, str]:
    """Keep a variant that is FASTER_BY faster than the primary at batch 1 or the max batch."""
    faster = []
    if speed.batch_1_us < speed.primary_batch_1_us * (1 - FASTER_BY):
        faster.append("batch 1")
    top, primary_top = speed.max_batch_us, speed.primary_max_batch_us
    if top is not None and primary_top is not None and top < primary_top * (1 - FASTER_BY):
        faster.append(f"batch {max_batch}")
    if faster:
        return "kept", f"faster at {' and '.join(faster)}"
    if keep_slower:
        return "kept", "not faster; kept by --keep-slower"
    return "dropped", f"not {FASTER_BY:.0%} faster than the primary at any batch size"


def _measured(
    built: _Built,
    one: list[float],
    top: list[float] | None,
    index: int,
    signature: ModelSignature,
    options: OptimizeOptions,
) -> VariantResult:
    """The result of the `index`th built variant, given the medians (primary's first)."""
    speed = VariantSpeed(
        batch_1_us=_round(one[index + 1]), primary_batch_1_us=_round(one[0]),
        max_batch_us=_round(top[index + 1]) if top else None,
        primary_max_batch_us=_round(top[0]) if top else None,
    )  # fmt: skip
    status, reason = verdict(speed, signature.max_batch_size, options.keep_slower)
    quality = VariantQuality(
        max_abs_error=_round(built.quality.max_abs_error),
        argmax_agreement=round(built.quality.argmax_agreement, 4),
        samples=built.quality.samples,
    )
    reason = f"{reason} ({built.note})" if built.note else reason
    return VariantResult(built.kind, _file_of(built.kind), status, reason, quality, speed)


def _round(value: float) -> float:
    return float(f"{value:.4g}")


# -- the model's config --------------------------------------------------------------------------


def _entry(result: VariantResult) -> VariantConfig:
    return VariantConfig(
        name=result.kind, file=result.file, kind=result.kind, quality=result.quality,
        speed=result.speed,
    )  # fmt: skip


def plan_variants(
    existing: Sequence[VariantConfig], replaced: set[str], new: Sequence[VariantConfig]
) -> list[int | VariantConfig]:
    """The new `variants` list: an int keeps that entry of `existing` as it is written.

    Entries of the `replaced` kinds go; the optimizer's kinds (new and kept) are sorted best
    first and take the place of the first such entry, or the front; other entries (kind
    "model") keep their order around them.
    """
    ours = set(KINDS)
    kept = [i for i, v in enumerate(existing) if v.kind not in replaced]
    block: list[int | VariantConfig] = [i for i in kept if existing[i].kind in ours]
    block += list(new)
    block.sort(key=lambda e: _quality_key(existing[e].quality if isinstance(e, int) else e.quality))
    at = next((i for i, v in enumerate(existing) if v.kind in ours), -1)
    before: list[int | VariantConfig] = [i for i in kept if existing[i].kind not in ours and i < at]
    after: list[int | VariantConfig] = [i for i in kept if existing[i].kind not in ours and i > at]
    return before + block + after


def _config_path(model_dir: Path) -> Path:
    found = [model_dir / name for name in CONFIG_FILENAMES if (model_dir / name).is_file()]
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ConfigError(f"{model_dir}: more than one config file ({names}); keep one")
    return found[0] if found else model_dir / "config.toml"


def _render_toml(text: str, plan: list[int | VariantConfig]) -> str:
    doc = tomlkit.parse(text)
    old = doc.get("variants")
    items = list(old) if old is not None else []
    inline = isinstance(old, tomlkit.items.Array)
    container: Any = tomlkit.array() if inline else tomlkit.aot()
    if inline:
        container.multiline(True)
    for entry in plan:
        if isinstance(entry, int):
            container.append(items[entry])
            continue
        table: Any = tomlkit.inline_table() if inline else tomlkit.table()
        for key, value in entry.model_dump(exclude_none=True).items():
            if isinstance(value, dict):
                sub = tomlkit.inline_table()
                sub.update(value)
                value = sub
            table[key] = value
        container.append(table)
    if plan:
        doc["variants"] = container
    elif "variants" in doc:
        del doc["variants"]
    return tomlkit.dumps(doc)


def _render_yaml(data: dict[str, Any], plan: list[int | VariantConfig]) -> str:
    old = data.get("variants") or []
    entries = [old[e] if isinstance(e, int) else e.model_dump(exclude_none=True) for e in plan]
    data = dict(data)  # "variants" keeps its place among the keys
    if entries:
        data["variants"] = entries
    else:
        data.pop("variants", None)
    text: str = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return text


def update_config(model_dir: Path, results: Sequence[VariantResult]) -> tuple[Path, str]:
    """Rewrite the `variants` of the model's config for the kinds measured in `results`.

    Returns the path and the new text, validated but not yet written (see `_write_atomic`).
    """
    path = _config_path(model_dir)
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    data = read_config_file(path) if text else {}
    existing = parse_model_config(data, source=str(path)).variants
    replaced: set[str] = {r.kind for r in results if r.status != "failed"}
    plan = plan_variants(existing, replaced, [_entry(r) for r in results if r.status == "kept"])
    if path.suffix == ".toml":
        new_text = _render_toml(text, plan)
        check = tomllib.loads(new_text)
    else:
        new_text = _render_yaml(data, plan)
        check = yaml.safe_load(new_text) or {}
    parse_model_config(check, source=f"{path} (as optimize would write it)")
    return path, new_text


def _write_atomic(path: Path, data: bytes) -> None:
    """Write via a hidden temp file in the same folder and rename: readers see old or new."""
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


# -- running -------------------------------------------------------------------------------------


def _silent(message: str) -> None:
    pass


def optimize(options: OptimizeOptions, say: Callable[[str], None] = _silent) -> OptimizeReport:
    """Build, check and time each kind, then record the worthwhile ones in the model's config.

    Raises ConfigError for a bad path, config or calibration file, and OptimizeError when the
    primary model cannot run on the sample inputs. A kind that cannot be built is reported as
    failed in the result; its config entry (if any) is left as it was.
    """
    started = time.perf_counter()
    target = resolve_target(options.model_dir, options.version)
    config = load_model_config(target.model_dir)
    primary = open_session(target.path, session_options(intra_op_threads=1, inter_op_threads=1))
    signature = reconcile(config, *graph_specs(primary, target.path), source=str(target.model_dir))
    samples, calib, source = _sample_sets(options, signature)
    samples, reference = _reference(primary, samples, signature, options.calibration is None)
    say(f"{target.model_dir.name} version {target.version}: {len(reference[0])} samples ({source})")
    results: list[VariantResult] = []
    built: list[_Built] = []
    with tempfile.TemporaryDirectory(prefix="duetime-optimize-") as scratch:
        builder = _Builder(target, signature, samples, calib, Path(scratch))
        try:
            for kind in options.kinds:
                say(f"building {kind}")
                try:
                    _check_clash(config, kind)
                    built.append(builder.build(kind, reference))
                except Exception as exc:  # a kind that cannot be built is reported, not fatal
                    results.append(VariantResult(kind, _file_of(kind), "failed", _reason(exc)))
            say("timing")
            try:
                one, top = _speeds(primary, built, samples, signature, options.measure_s)
            except Exception as exc:  # ORT's own exception types
                raise OptimizeError(f"timing failed: {_reason(exc)}") from exc
            results += [_measured(b, one, top, i, signature, options) for i, b in enumerate(built)]
            results.sort(key=lambda r: options.kinds.index(r.kind))
            config_path = _commit(target, results, built)
        finally:
            for b in built:
                b.temp.unlink(missing_ok=True)
    notes = builder.notes + _notes(options, target, results, config_path)
    return OptimizeReport(
        model=target.model_dir.name, version=target.version, samples=len(reference[0]),
        sample_source=source, max_batch=signature.max_batch_size if top else 0,
        primary_batch_1_us=_round(one[0]), primary_max_batch_us=_round(top[0]) if top else None,
        results=results, config_path=config_path, elapsed_s=time.perf_counter() - started,
        notes=notes,
    )  # fmt: skip


def _notes(
    options: OptimizeOptions, target: _Target, results: list[VariantResult], config: Path | None
) -> list[str]:
    """What the reader of the table should also know."""
    notes = []
    if config is not None and config.suffix != ".toml":
        notes.append(f"{config} was rewritten with PyYAML, which keeps no comments")
    for r in results:
        stale = target.path.parent / r.file
        if r.status == "dropped" and stale.is_file():
            notes.append(f"{stale} (from an earlier run) is left in place, no longer listed")
    if options.calibration is None and "int8-static" in options.kinds:
        notes.append("int8-static was calibrated on random inputs; --calibration FILE.npz "
                     "with real inputs gives it representative ranges")  # fmt: skip
    return notes


def _sample_sets(options: OptimizeOptions, signature: ModelSignature) -> tuple[Feeds, Feeds, str]:
    """The quality sample set, the calibration set, and a description of where they came from."""
    if options.calibration is not None:
        samples = load_calibration(options.calibration, signature, options.samples)
        return samples, samples, f"from {options.calibration}"
    # Random calibration data is drawn apart from the quality set, so quality is not in-sample.
    samples = random_samples(signature, options.samples, SEED)
    calib = random_samples(signature, options.samples, SEED + 1)
    return samples, calib, f"random, seed {SEED}"


def _reference(
    primary: Any, samples: Feeds, signature: ModelSignature, random: bool
) -> tuple[Feeds, list[np.ndarray]]:
    """The primary's outputs; random integer inputs that it rejects are retried as zeros."""
    batched = signature.max_batch_size > 0
    try:
        return samples, _run_all(primary, _batches(samples, signature), batched)
    except Exception as exc:  # ORT's own exception types
        first = exc
    if random and any(a.dtype.kind in "iu" for a in samples.values()):
        count = len(next(iter(samples.values())))
        zeros = random_samples(signature, count, SEED, zero_ints=True)
        try:
            return zeros, _run_all(primary, _batches(zeros, signature), batched)
        except Exception:
            pass
    raise OptimizeError(
        f"the primary model fails on the sample inputs ({_reason(first)}); give --calibration "
        "FILE.npz with real inputs"
    )


def _check_clash(config: ModelConfig, kind: Kind) -> None:
    """Refuse `kind` when an entry of another kind already uses its name or its file."""
    for entry in config.variants:
        if entry.kind != kind and (entry.name == kind or entry.file == _file_of(kind)):
            raise ValueError(
                f"variant '{entry.name}' (kind {entry.kind}) already uses the name {kind} or the "
                f"file {_file_of(kind)}; not overwriting it"
            )


def _commit(target: _Target, results: list[VariantResult], built: list[_Built]) -> Path | None:
    """Move the kept files into place, then write the config (so a reader never finds an entry
    without its file). Returns the config path, or None when nothing was measured."""
    if all(r.status == "failed" for r in results):
        return None
    path, text = update_config(target.model_dir, results)
    kept = {r.kind for r in results if r.status == "kept"}
    for b in built:
        if b.kind in kept:
            os.replace(b.temp, target.path.parent / _file_of(b.kind))
    _write_atomic(path, text.encode("utf-8"))
    return path


# -- command line --------------------------------------------------------------------------------


def _kinds(text: str) -> tuple[Kind, ...]:
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [k for k in chosen if k not in KINDS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of {', '.join(KINDS)}; got {text!r}"
        )
    return tuple(k for k in KINDS if k in chosen)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `duetime optimize` flags."""
    parser.description = (
        "Build fp16 and int8 copies of a model version (model.<kind>.onnx beside model.onnx), "
        "compare their answers and speed with the primary's, and list those that are faster as "
        "variants in the model's config (best first)."
    )
    parser.add_argument("model_dir", type=Path, metavar="REPO/MODEL", help="the model folder")
    parser.add_argument(
        "--version", type=int, help="the version folder to optimize (default: the highest)"
    )
    parser.add_argument(
        "--kinds", type=_kinds, default=KINDS, help=f"comma list (default {','.join(KINDS)})"
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE.npz",
        help="one array per input, samples first: int8-static calibration and the quality "
        "sample set (default: random inputs)",
    )
    parser.add_argument(
        "--samples",
        type=_positive,
        default=DEFAULT_SAMPLES,
        help=f"samples to compare answers on (default {DEFAULT_SAMPLES})",
    )
    parser.add_argument(
        "--keep-slower",
        action="store_true",
        help="list variants that are not faster than the primary too",
    )
    parser.add_argument(
        "--measure-s",
        type=float,
        default=DEFAULT_MEASURE_S,
        help=f"seconds of timing per batch size (default {DEFAULT_MEASURE_S:g})",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the result table")


def run(args: argparse.Namespace) -> int:
    """`duetime optimize`: 0 when done, 1 when no kind could be built or the model cannot run,
    2 for a bad path, flag, config or calibration file."""
    options = OptimizeOptions(
        model_dir=args.model_dir, version=args.version, kinds=args.kinds,
        calibration=args.calibration, samples=args.samples, keep_slower=args.keep_slower,
        measure_s=args.measure_s,
    )  # fmt: skip

    def say(message: str) -> None:
        if not args.quiet:
            print(f"duetime optimize: {message}", file=sys.stderr, flush=True)

    try:
        report = optimize(options, say)
    except ConfigError as exc:
        print(f"duetime optimize: {exc.message}", file=sys.stderr)
        return 2
    except DuetimeError as exc:
        print(f"duetime optimize: {exc.message}", file=sys.stderr)
        return 1
    print(report.format())
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.to_json(), indent=2))
        say(f"wrote {args.json}")
    return 1 if all(r.status == "failed" for r in report.results) else 0


__all__ = ["KINDS", "OptimizeError", "OptimizeOptions", "OptimizeReport", "VariantResult",
           "add_arguments", "optimize", "run"]  # fmt: skip
