"""Loads one model version: ORT sessions, the signature reconciled with the config, a warm-up.

Everything here blocks (file reads, graph optimisation, warm-up runs): callers run it off the
event loop. The result is a `LoadedModel` ready to be published by the registry.
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np
import onnxruntime as ort

from duetime.config import ModelConfig, TensorConfig, VariantConfig
from duetime.datatypes import BFLOAT16, NUMPY_OF, float_info, is_float, unserved_output_reason
from duetime.errors import ConfigError, DuetimeError, fitted
from duetime.execution.executor import Executor
from duetime.execution.ort import (
    MAX_DIMS,
    Run,
    bfloat16_run,
    cached_session,
    default_run_memory_bytes,
    graph_specs,
    private_external_data,
    session_options,
    strings_for_ort,
)
from duetime.repository.layout import ModelSource
from duetime.repository.tritonconfig import TritonModelConfig, load_model_config, triton_field
from duetime.scheduling.profile import LatencyProfile, batch_buckets, profile_from_samples
from duetime.types import ModelSignature, TensorSpec, model_words
from duetime.validation import Validator, left_out_inputs

if TYPE_CHECKING:
    from duetime.repository.graphs import GraphFacts
    from duetime.repository.outputsizes import OutputSizes

log = logging.getLogger("duetime.loader")

DEFAULT_MAX_BATCH_SIZE = 32

PROFILE_BUDGET_S = 1.0
"""Time spent measuring the latency profile of one model version at load."""
PROFILE_ROUNDS = 5
"""Rounds over all the buckets that profiling takes its runs in (see `measure_profile`)."""
PROFILE_MIN_RUNS = 5
PROFILE_MAX_RUNS = 200
"""The runs of each bucket profiling measures (the fewest only where the budget has room)."""
PROFILE_PROBE_SHARE = 1 / 3
"""The share of the budget the first run of each bucket may take: the buckets past it are
estimated from the cost per row of those run, which then have room for 2 runs each at least.

NOTE: at 1/6, room for `PROFILE_MIN_RUNS` each, the demo resnet's default max batch (32) was
not all measured on a busy 2-core VM (first runs of 1.8 ms a row: up to 16 rows measured)."""
PROFILE_MIN_ROWS = 4
"""Buckets of up to this many rows are run at least once whatever they cost."""
WARM_UP_RUNS = 3
"""Runs of each instance at batch 1 before profiling."""
WARM_UP_LARGEST_BUDGETS = 2.0
"""The largest batch is warmed up unless one run of it is predicted to take longer than this
many profile budgets (see `warm_up_largest`)."""
INLINE_BATCH1_NS = 100_000
"""`execution = "auto"` runs a model inline when its batch 1 takes at most this long: handing a
batch to a thread and back costs 30-40 µs on a VM (waking the thread, the GIL, waking the loop),
more than such a model's whole run, and its thread would share the loop's core anyway
(execution/affinity.py SMALL_MODEL_NS)...

NOTE: it was 50 µs, and the largest batch's bound 250 µs: on a slow hour of the 2-core VM the
demo mlp (17 µs at batch 1 on a quiet one) measured 39-47 µs at batch 1 and 165-210 µs at 64
at load, and ran inline on one start and on a thread on the next: the in-process call cost
~95 or ~70 µs over ORT by the draw."""
INLINE_LONGEST_NS = 500_000
"""...and its largest batch at most this long: the longest the loop then waits for one batch
(other requests' reads and answers wait that long)."""


@dataclass(eq=False)
class LoadedModel:
    """A model version ready to serve: its config, signature, validator and instances."""

    name: str
    version: str
    path: Path
    config: ModelConfig
    signature: ModelSignature
    validator: Validator
    executor: Executor
    profile: LatencyProfile
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Outputs' class labels, by output name (config `labels`: Triton's `label_filename`)."""
    cost_depends_on_values: bool = False
    """Its run time follows its inputs' values (a Loop's trip count, a size read from an
    input) or free non-batch dims: its profile cannot say what a run should take, so the
    scheduler never judges a run slow (see `ModelScheduler`'s `predictable_cost`)."""
    unserved_outputs: Mapping[str, str] = field(default_factory=dict)
    """The graph's outputs duetime cannot return (a bfloat16 tensor, a ZipMap's sequence of
    maps), name -> why (`unserved_output_reason`): not in `signature`, but a request asking
    for one is told why rather than that the model has no such output."""
    output_sizes: OutputSizes | None = None
    """Its outputs' sizes as functions of a request's shapes, where ONNX shape inference gives
    them (see repository/outputsizes.py): for a model whose samples tell nothing of an
    answer's size (free dims besides the batch's)."""
    sample_fill: SampleFill = "zeros"
    """The samples its warm-up ran (`WARM_UP_FILLS`): its circuit breaker's check runs them.
    NOTE: the check ran zeros whatever the warm-up had found: a graph dividing by an integer
    input, loaded on distinct samples as zeros failed, failed its check after five clients'
    divisions by zero, and its breaker opened on everyone (found by a tester)."""
    sample_free: int = 1
    """The size of the free dims beyond the batch in those samples (`SAMPLE_FREE_DIMS`)."""


FIELD_NAMES: ContextVar[Callable[[str], str] | None] = ContextVar("FIELD_NAMES", default=None)
"""How the load in progress names its config's fields in a warning, as in its errors (the
manager's: the config file and its own fields, `<folder>/config.pbtxt: field
'input[0].optional'`); None: as the loader does (`<folder>: field 'inputs.0.optional'`)."""


def _warn_of_field(message: str) -> None:
    """Warn of `message`, naming a config's fields `<folder>: field 'inputs.0.name'` (see
    `FIELD_NAMES`)."""
    named = FIELD_NAMES.get()
    log.warning("%s", message if named is None else named(message))


def load_version(
    source: ModelSource,
    version: int,
    config: ModelConfig | None = None,
    *,
    variant: VariantConfig | None = None,
    primary: ModelSignature | None = None,
    profile_budget_s: float = PROFILE_BUDGET_S,
    max_run_memory_bytes: int | None = None,
) -> LoadedModel:
    """Load `version` of `source` (its `variant` file when given); raise ConfigError naming the
    file and the field on failure. A variant must take and give what the `primary` does.
    `max_run_memory_bytes`: the most a request's values may ask one node of the graph to
    allocate (see `Validator`; None: `default_run_memory_bytes`)."""
    if config is None:
        config = load_model_config(source.directory)
    path = source.versions[version]
    if variant is not None:
        path = path.with_name(variant.file)
    options = session_options(
        intra_op_threads=config.intra_op_threads, inter_op_threads=config.inter_op_threads
    )
    from duetime.repository.graphs import study_graph  # (onnx takes ~0.5 s to import)

    if variant is not None:
        _check_variant_graph(path, variant.name)
    studied = study_graph(path)
    if studied.facts is not None and studied.facts.sizes_follow_values:
        # NOTE: ORT's CPU arena keeps the most a run ever took for the session's life: after
        # one request for a 1 GiB ConstantOfShape the server held 1.1 GB, idle, for good.
        # Without it each tensor is the allocator's, given back after the run (measured: RSS
        # back to its 66 MB after a 500 MB run, 598 MB with the arena).
        options.enable_cpu_mem_arena = False
    sessions = _open_sessions(path, options, studied.guarded, config.instances)
    graph_inputs, graph_outputs = graph_specs(sessions[0], path)
    carried = {spec.name for spec in graph_outputs}
    uncarried = {o.name: o.type for o in sessions[0].get_outputs() if o.name not in carried}
    signature = reconcile(
        config, graph_inputs, graph_outputs, source=str(source.directory), uncarried=uncarried
    )
    alone = False
    if signature.max_batch_size > 0:
        where = str(source.directory)
        if variant is not None:  # (its own file: the primary's folder would blame the primary)
            where = f"{where}: variant '{variant.name}' ({path.name})"
        signature, alone = _checked_batching(
            sessions[0], signature, config, (graph_inputs, graph_outputs), where,
            settled=None if primary is None else primary.max_batch_size, facts=studied.facts,
        )  # fmt: skip
    _check_shared_dims(config, sessions[0], signature.max_batch_size > 0, str(source.directory))
    labels = read_labels(config, source.directory)
    label = f"{source.name}-{version}" + (f"-{variant.name}" if variant else "")
    executor = Executor(
        sessions,
        output_names=[spec.name for spec in signature.outputs],
        string_outputs=frozenset(s.name for s in signature.outputs if s.datatype == "BYTES"),
        batched=signature.max_batch_size > 0,
        label=label,
        named=model_words(source.name, version, variant.name if variant else None),
        inline=config.execution == "inline",
        splits_batches=alone,
        output_shapes=answer_shapes(signature),
    )
    produced, fill, free = warm_up(executor, signature, path)
    _check_output_dims(
        config, signature, graph_outputs, produced, studied.facts, str(source.directory)
    )
    signature = _free_misdeclared_dims(config, signature, produced, path)
    # NOTE: optional inputs may differ (quantizing a weight drops its graph input): requests
    # that give one are served by the primary alone (see `Validator.overrides`). After the
    # warm-up, as the primary's outputs are (`_free_misdeclared_dims`).
    if primary is not None and (
        primary.required_inputs != signature.required_inputs or primary.outputs != signature.outputs
    ):
        raise ConfigError(
            f"{path}: variant '{variant.name if variant else path.name}' must take and give what "
            f"the model does: inputs {_describe(primary.required_inputs)} and outputs "
            f"{_describe(primary.outputs)}, but it has {_describe(signature.required_inputs)} "
            f"and {_describe(signature.outputs)}"
        )
    profile = measure_profile(executor, signature, path, profile_budget_s, fill=fill, free=free)
    if produced is not None:
        warm_up_largest(executor, signature, profile, path, profile_budget_s, fill=fill, free=free)
    if variant is None:
        _warn_unmeetable_timeout(config, profile, path)
    varies = cost_varies(studied.facts, signature)
    if varies:
        log.info("%s: its run time follows its inputs (%s)", path, varies)
    if config.execution == "auto":
        inline = runs_inline(profile, config.instances, cost_varies=bool(varies))
        if not inline and config.instances == 1 and not varies:
            inline = _fast_enough_alone(executor, signature, profile, fill, free)
        executor.inline = inline
    unserved = {name: unserved_output_reason(kind) for name, kind in uncarried.items()}
    if max_run_memory_bytes is None:
        max_run_memory_bytes = default_run_memory_bytes()
    sized = studied.facts.sized_nodes if studied.facts is not None else ()
    validator = Validator(
        source.name, signature, unserved, sized=sized, max_run_bytes=max_run_memory_bytes,
        left_out=left_out_inputs(graph_inputs, signature),
    )  # fmt: skip
    # (requests reshaped by the config give other dims than the graph's, which sizes index)
    reshaped = any(spec.wire is not None for spec in signature.inputs)
    return LoadedModel(
        source.name, str(version), path, config, signature, validator, executor, profile, labels,
        cost_depends_on_values=bool(varies), unserved_outputs=unserved,
        output_sizes=None if reshaped else studied.sizes, sample_fill=fill, sample_free=free,
    )  # fmt: skip


def _check_variant_graph(path: Path, name: str) -> None:
    """ConfigError when ONNX's checker rejects a variant file.

    NOTE: variants only: a converter's output can be a graph ONNX Runtime crashes on rather
    than refuses (fp16 of a transformer with its nodes out of order: SIGSEGV while the session
    is made), which would take the primary and the server down with it. A primary gets no
    such check, to serve what ORT serves. By path, so that models over 2 GB are checked too."""
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        lines = str(exc).strip().splitlines()
        raise ConfigError(
            f"{path}: variant '{name}' fails ONNX's model checker "
            f"({lines[0][:200] if lines else 'no reason given'}); not loaded"
        ) from None


def _open_sessions(
    path: Path, options: ort.SessionOptions, guarded: bytes | None, count: int
) -> list[ort.InferenceSession]:
    """`count` sessions on the model at `path`, on its `guarded` graph where it has one.

    NOTE: a guarded graph ORT refuses (an ORT too old to find external data for a graph from
    bytes, say) is served as the file is, with a warning, rather than not at all."""
    with private_external_data(path) as private:

        def shown(exc: ConfigError) -> str:
            """Its message naming the repository's file, not the private copy's."""
            return exc.message.replace(str(private.parent), str(path.parent))

        if guarded is not None:
            try:
                return [cached_session(private, options, guarded) for _ in range(count)]
            except ConfigError as exc:
                log.warning(
                    "%s: its integer divisions cannot be guarded (%s); serving it as it is: a "
                    "request dividing INT_MIN by -1 would crash the server", path, shown(exc),
                )  # fmt: skip
        try:
            return [cached_session(private, options) for _ in range(count)]
        except ConfigError as exc:
            raise ConfigError(shown(exc)) from None


def cost_varies(facts: GraphFacts | None, signature: ModelSignature) -> str:
    """What makes a run's cost follow its inputs beyond its rows ("": nothing): values its graph
    sizes work by (see `graph_facts`), or an input's free dim other than the batch's. A graph
    the onnx package cannot read (ORT's own format) may do anything."""
    if facts is None:
        return "its graph cannot be read"
    if facts.cost_depends_on_values:
        return facts.cost_why
    batched = signature.max_batch_size > 0
    free = next(
        (
            spec.name
            for spec in signature.inputs
            if spec.any_rank or -1 in (spec.shape[1:] if batched else spec.shape)
        ),
        None,
    )
    return "" if free is None else f"input '{free}' has a free dim other than the batch's"


def _warn_unmeetable_timeout(config: ModelConfig, profile: LatencyProfile, path: Path) -> None:
    """Warn when the model's `default_timeout_ms` is shorter than a lone row needs (its run at
    load and the margins kept): every request that sends no timeout would be refused. A model
    with variants may meet it on one; a profile that could not be measured tells nothing.

    NOTE: Triton's default_timeout_microseconds, which a config.pbtxt's becomes, bounds a
    request's wait in the queue; duetime's is the due time of its answer. A Triton model of
    10 ms on a 27 ms run refused every request, and nothing said why at load (the pbtxt
    tester's default_timeout_queue.py)."""
    if config.default_timeout_ms is None or config.variants or profile.guessed:
        return
    scheduling = config.scheduling
    run_ns = profile.predict(1)
    needed_ns = run_ns * (1 + scheduling.exec_margin) + scheduling.delivery_margin_us * 1000
    if config.default_timeout_ms * 1e6 >= needed_ns:
        return
    log.warning(
        "%s: default_timeout_ms %g (a Triton config's dynamic_batching.default_queue_policy."
        "default_timeout_microseconds) is shorter than one row needs: %.3g ms with the margins "
        "kept (its run took %.3g ms at load), so every request that sends no timeout of its own "
        "will be refused; it is the due time of the answer, not Triton's time in the queue: "
        "raise it above that",
        path, config.default_timeout_ms, needed_ns / 1e6, run_ns / 1e6,
    )  # fmt: skip


def answer_shapes(signature: ModelSignature) -> dict[str, tuple[int, ...]]:
    """The outputs answers give in another shape than the graph's (a config's `reshape`), by
    name: that shape without the batch dim."""
    batched = signature.max_batch_size > 0
    return {
        spec.name: spec.wire[1:] if batched else spec.wire
        for spec in signature.outputs
        if spec.wire is not None
    }


def read_labels(config: ModelConfig, directory: Path) -> dict[str, tuple[str, ...]]:
    """Each output's class labels from the file its config `labels` names (one a line)."""
    for index, tensor in enumerate(config.inputs or ()):
        if tensor.labels is not None:
            raise ConfigError(
                f"{directory}: field 'inputs.{index}.labels': labels name an output's classes; "
                "an input has none"
            )
    labels: dict[str, tuple[str, ...]] = {}
    for index, tensor in enumerate(config.outputs or ()):
        if tensor.labels is None:
            continue
        where = f"{directory}: field 'outputs.{index}.labels'"
        name = tensor.labels
        refused = _label_path_refused(name)
        if refused is not None:
            raise ConfigError(f"{where}: '{name}' {refused}")
        try:
            text = (directory / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read '{directory / name}': {exc}") from None
        labels[tensor.name] = tuple(text.splitlines())
    return labels


def label_files(config: ModelConfig, directory: Path) -> list[Path]:
    """The label files the outputs of `config` name in model folder `directory` (those
    `read_labels` reads; not those it refuses)."""
    return [
        directory / tensor.labels
        for tensor in config.outputs or ()
        if tensor.labels is not None and _label_path_refused(tensor.labels) is None
    ]


def _label_path_refused(name: str) -> str | None:
    """Why a config's `labels` (Triton's `label_filename`) `name` is refused (None: taken): a
    path leaving the model's folder.

    NOTE: as Triton (it reads `<model folder>/<label_filename>` and refuses one outside the
    folder: IsChildPathEscapingParentPath), a path to a folder below it (`labels/l.txt`) is
    taken; it was refused as no file name in the model's folder (found by a tester). The check
    is on the name, not the file: a link in the folder to a shared label file is read."""
    inside = (
        "must be a file name in the model's folder or in a folder below it (such as "
        "labels/classes.txt), as in Triton"
    )
    if "\0" in name:
        return f"{inside}: it holds a NUL character"
    if "\\" in name:
        return f"{inside}: '\\' is no folder separator here; write '/'"
    if name.startswith("/"):
        return f"{inside}: an absolute path leaves it"
    normal = posixpath.normpath(name)
    if normal == "." or normal == ".." or normal.startswith("../"):
        return f"{inside}: '..' leaves the folder"
    return None


def runs_inline(profile: LatencyProfile, instances: int, *, cost_varies: bool = False) -> bool:
    """What `execution = "auto"` picks for a model of `instances` with this load-time profile.

    Never a model whose cost varies with its inputs beyond their rows (see `cost_varies`): its
    profile, taken on small sample inputs, says nothing of a request's run (a Loop of a million
    trips, a product of two 2000-square inputs), which would hold the loop, liveness included."""
    return (
        instances == 1
        and not cost_varies
        and profile.predict(1) <= INLINE_BATCH1_NS
        and profile.predict(profile.max_rows) <= INLINE_LONGEST_NS
    )


INLINE_CHECK_FACTOR = 5
"""`_fast_enough_alone` checks a model whose profile is within this factor of the bounds."""
INLINE_CHECK_RUNS = 10


def _fast_enough_alone(
    executor: Executor,
    signature: ModelSignature,
    profile: LatencyProfile,
    fill: SampleFill,
    free: int = 1,
) -> bool:
    """Whether the fastest of a few more runs at batch 1 and at the largest batch are within
    the inline bounds, for a model of one instance whose profile says just over them.

    NOTE: the profile's medians follow the machine's load while it was taken: on the 2-core VM
    with other work running, the demo mlp's largest batch read 2.3 ms once (220 µs at half of
    it), and the model went to a thread for the life of the server. The fastest run is the
    model's own cost, which the bounds are about (the loop is held that long). At most
    `INLINE_CHECK_RUNS` runs of each, and only near the bounds (by the medians at load): a few
    ms of load time.

    NOTE: "near the bounds" was judged by the predictions, which add half the spread (p99 less
    median) measured at load: one run of the 40 at batch 64 preempted for 8 ms (another server
    loading on the core) made the demo mlp's prediction 4 ms, five times the bound, and it ran
    on a thread, unchecked, for the life of the server (median 45 µs). On a thread its results
    waited for a busy loop: at twice its capacity (2/10 ms due times) 0.8 ms on average, and it
    refused every 2 ms request (4,000-5,400 answers/s on time against 7,600-9,600 inline)."""
    largest = profile.max_rows
    if (
        profile.guessed
        or profile.measured_median_ns(1) > INLINE_CHECK_FACTOR * INLINE_BATCH1_NS
        or profile.measured_median_ns(largest) > INLINE_CHECK_FACTOR * INLINE_LONGEST_NS
    ):
        return False
    try:
        fastest = {}
        for rows, bound in ((1, INLINE_BATCH1_NS), (largest, INLINE_LONGEST_NS)):
            feeds = sample_inputs(signature, rows, seed=rows, fill=fill, free=free)
            fastest[rows] = min(_timed_run(executor, feeds) for _ in range(INLINE_CHECK_RUNS))
            if fastest[rows] > bound:
                return False
    except Exception:  # (the profile ran them: a failure now says nothing more)
        return False
    return True


def _describe(specs: tuple[TensorSpec, ...]) -> str:
    return ", ".join(f"{s.name} {s.describe()}" for s in specs)


def reconcile(
    config: ModelConfig,
    graph_inputs: list[TensorSpec],
    graph_outputs: list[TensorSpec],
    *,
    source: str,
    uncarried: Mapping[str, str] | None = None,
) -> ModelSignature:
    """The signature clients see: the graph's, narrowed by the config, with the batch policy.

    Optional inputs (see `graph_specs`) have no say in the batch policy: older exporters list
    every weight as one. See `_batched_inputs` for those a batching model serves. A config that
    lists outputs serves those alone (see `_listed_outputs`); `uncarried`: the graph's outputs
    `graph_specs` left out, name -> type, for the error naming one."""
    graph_outputs = _listed_outputs(config.outputs, graph_outputs, uncarried or {}, source)
    specs = [spec for spec in graph_inputs if not spec.optional] + graph_outputs
    max_batch = config.max_batch_size
    if max_batch is None:
        max_batch = DEFAULT_MAX_BATCH_SIZE if all(map(_free_first, specs)) else 0
        required = [spec for spec in graph_inputs if not spec.optional]
        fixed = next((spec for spec in graph_outputs if not _free_first(spec)), None)
        if max_batch == 0 and fixed is not None and required and all(map(_free_first, required)):
            # (as the sample check's verdict on a graph that reduces over its first dim: found
            # by a tester, a ReduceSum over it whose output the graph gives as [1, 4] was
            # served unbatched with nothing said)
            log.warning(
                "%s: every input has a free first dim, but output '%s' has shape %s; served "
                "unbatched (max_batch_size = 0)", source, fixed.name, list(fixed.shape),
            )  # fmt: skip
    elif max_batch > 0 and not all(s.any_rank or _free_first(s) for s in specs):
        fixed = next(s for s in specs if not (s.any_rank or _free_first(s)))
        raise ConfigError(
            f"{source}: field 'max_batch_size' = {max_batch} needs a free first dim on every input "
            f"and output, but '{fixed.name}' has shape {list(fixed.shape)}; set max_batch_size = 0"
        )
    if max_batch > 0:
        graph_inputs = _batched_inputs(config.inputs, graph_inputs, max_batch, source)
    inputs = _apply(config.inputs, graph_inputs, max_batch > 0, source, "inputs")
    outputs = _apply(config.outputs, graph_outputs, max_batch > 0, source, "outputs")
    shapeless = next((s for s in inputs + outputs if s.any_rank), None)
    if max_batch > 0 and shapeless is not None:
        field = "inputs" if shapeless in inputs else "outputs"
        raise ConfigError(
            f"{source}: field 'max_batch_size' = {max_batch}: '{shapeless.name}' has no shape in "
            f"the graph, so it has no batch dim; give its dims under '{field}' (without the "
            "batch dim), or set max_batch_size = 0"
        )
    _check_ranks(inputs, outputs, source)
    _check_preferred_fit(config, max_batch, source)
    return ModelSignature(tuple(inputs), tuple(outputs), max_batch)


def _check_preferred_fit(config: ModelConfig, max_batch: int, source: str) -> None:
    """ConfigError where a preferred batch size is over `max_batch`, the max_batch_size the
    model is served with, named as the config's writer named it.

    NOTE: the config refuses one over its own max_batch_size (`ModelConfig._preferred_fit`),
    but one over the graph's (no max_batch_size set: 32, or 0) was taken, and the config
    endpoint then returned max_batch_size 32 with preferred_batch_size [100], a config that
    load_model(config=...) refused (found by a tester). Triton refuses it too ("dynamic
    batching preferred size must be <= max batch size")."""
    preferred = config.scheduling.preferred_batch_size
    if not preferred or max(preferred) <= max_batch:
        return
    largest, loc = max(preferred), ("scheduling", "preferred_batch_size")
    field = triton_field(loc) if isinstance(config, TritonModelConfig) else ".".join(loc)
    fix = (
        f"set max_batch_size to {largest} or more, or lower the preferred sizes"
        if max_batch
        else "leave the preferred sizes out (0: the model does not batch)"
    )
    raise ConfigError(
        f"{source}: field '{field}': {largest} is over max_batch_size {max_batch}, what the "
        f"model is served with as its config sets none (duetime's default for its graph); {fix}"
    )


def _check_ranks(inputs: list[TensorSpec], outputs: list[TensorSpec], source: str) -> None:
    """ConfigError for a tensor of more dims than a request or an answer may have (MAX_DIMS).

    NOTE: the codec refused every request's shape of more than 16 dims, where a model with a
    rank-17 input loaded READY (metadata showing its 17 dims) and ORT ran it: the protocol's
    limit is numpy's own now, and a model past it (ORT loads one) is refused here, by name."""
    for kind, specs in (("input", inputs), ("output", outputs)):
        for spec in specs:
            rank = max(len(spec.shape), len(spec.client_shape))
            if rank <= MAX_DIMS:
                continue
            raise ConfigError(
                f"{source}: {kind} '{spec.name}' has {rank} dims; requests and answers "
                f"carry tensors of at most {MAX_DIMS} (numpy's limit)"
            )


def _listed_outputs(
    declared: list[TensorConfig] | None,
    graph: list[TensorSpec],
    uncarried: Mapping[str, str],
    source: str,
) -> list[TensorSpec]:
    """The outputs served: those the config lists (in the graph's order), or all the graph's.

    NOTE: as Triton's ONNX Runtime backend, which checks only the config's `output` entries
    (ModelInstanceState::ValidateOutputs) and whose metadata and answers are the config's: its
    workaround for a LightGBM classifier exported by onnxmltools, whose `label` is declared [1],
    lists only `probabilities` with max_batch_size 16. Serving the unlisted `label` too refused
    that config (its [1] has no batch dim) and, unbatched, listed it in the metadata."""
    if not declared:
        return graph
    names = {spec.name for spec in graph}
    for index, entry in enumerate(declared):
        if entry.name in names:
            continue
        at = f"{source}: field 'outputs.{index}.name': '{entry.name}'"
        if entry.name in uncarried:
            kind = uncarried[entry.name]
            raise ConfigError(
                f"{at} has type {kind}, which duetime cannot serve: "
                f"{unserved_output_reason(kind)}; or leave it out of the config"
            )
        listed = ", ".join(repr(s.name) for s in graph)
        raise ConfigError(f"{at} is not in the graph; it has {listed}")
    listed_names = {entry.name for entry in declared}
    return [spec for spec in graph if spec.name in listed_names]


def _free_first(spec: TensorSpec) -> bool:
    """Whether the graph declares `spec`'s first dim free (a batch dim, perhaps)."""
    return bool(spec.shape) and spec.shape[0] == -1


def _batched_inputs(
    declared: list[TensorConfig] | None, graph: list[TensorSpec], max_batch: int, source: str
) -> list[TensorSpec]:
    """The inputs a batching model serves: an optional one only if its first dim is free (the
    batch's: requests giving it are batched with the others giving it, see `Validator`). A
    weight has a fixed first dim and no batch dim, so requests cannot give it; a config
    naming such an input is an error (Triton refuses optional inputs of batching models)."""
    named = {entry.name: index for index, entry in enumerate(declared or ())}
    served = []
    for spec in graph:
        if not spec.optional or _free_first(spec) or (spec.any_rank and spec.name in named):
            served.append(spec)
        elif spec.name in named:
            raise ConfigError(
                f"{source}: field 'inputs.{named[spec.name]}.name': '{spec.name}' is an "
                f"optional input (the graph has an initializer for it) of shape "
                f"{list(spec.shape)}, with no batch dim, so requests to a model that batches "
                f"(max_batch_size = {max_batch}) cannot give it; set max_batch_size = 0 to "
                "serve it"
            )
    return served


def _apply(
    declared: list[TensorConfig] | None,
    graph: list[TensorSpec],
    batched: bool,
    source: str,
    field: str,
) -> list[TensorSpec]:
    if not declared:
        return graph
    by_name = {spec.name: spec for spec in graph}
    for index, entry in enumerate(declared):
        at = f"{source}: field '{field}.{index}"  # each message closes the quote after its key
        spec = by_name.get(entry.name)
        if spec is None:
            names = ", ".join(repr(s.name) for s in graph)
            raise ConfigError(f"{at}.name': '{entry.name}' is not in the graph; it has {names}")
        if entry.datatype is not None and entry.datatype != spec.datatype:
            raise ConfigError(
                f"{at}.datatype': {entry.datatype} does not match the graph's {spec.datatype}"
            )
        if entry.optional and not spec.optional:
            if field == "outputs":
                raise ConfigError(f"{at}.optional': only an input can be optional")
            _warn_of_field(
                f"{at}.optional': '{spec.name}' has no initializer in the graph, so ONNX "
                "Runtime cannot run without it: requests must give it"
            )
        if entry.reshape is not None:  # (validated: dims given, of as many elements)
            shape = _narrow(spec, entry.reshape, batched, f"{at}.reshape'")
            wire = tuple(entry.dims or ())
            by_name[entry.name] = TensorSpec(
                spec.name, spec.datatype, shape, optional=spec.optional,
                wire=(-1, *wire) if batched else wire,
            )  # fmt: skip
        elif entry.dims is not None:
            dims = _narrow(spec, entry.dims, batched, f"{at}.dims'")
            by_name[entry.name] = TensorSpec(spec.name, spec.datatype, dims, optional=spec.optional)
        if entry.format != "FORMAT_NONE":
            _check_format(entry.format, by_name[entry.name], batched, field, f"{at}.format'")
    if field == "inputs":
        _refuse_unlisted_required(declared, graph, source)
    return [by_name[spec.name] for spec in graph]


def _check_format(layout: str, spec: TensorSpec, batched: bool, field: str, at: str) -> None:
    """ConfigError unless `spec` (as served: the config's dims, else the graph's) may have the
    image layout `layout` (NHWC or NCHW); `at`: the config field.

    NOTE: as Triton (model_config_utils ValidateModelInput): such a layout needs 3 dims besides
    the batch's, and only an input has one (Triton's ModelOutput has no `format`)."""
    if field == "outputs":
        raise ConfigError(f"{at}: only an input has a format (an image layout); remove it")
    dims = spec.shown()[1:] if batched else spec.shown()
    if len(dims) != 3:
        raise ConfigError(
            f"{at}: {layout} needs 3 dims (without the batch dim), but the input's are {dims}; "
            "give the input's dims, or FORMAT_NONE"
        )


def _refuse_unlisted_required(
    declared: list[TensorConfig], graph: list[TensorSpec], source: str
) -> None:
    """A config that lists inputs lists every one requests must give.

    NOTE: as Triton's ONNX Runtime backend ("configuration expects 1 inputs, model provides
    2"): an input left out was served on the graph's own shape, so the config did not say what
    the model takes. Optional inputs (an initializer gives their default) may be left out, and
    so may outputs (Triton's backend checks only those listed)."""
    listed = {entry.name for entry in declared}
    missing = [spec.name for spec in graph if not spec.optional and spec.name not in listed]
    if missing:
        names = ", ".join(f"'{name}'" for name in missing)
        raise ConfigError(
            f"{source}: field 'inputs': the config lists {len(declared)} of the model's inputs "
            f"but not {names}, which requests must give (the graph has no initializer for it); "
            "list every required input, or none to take them all from the graph"
        )


def _dims_hint(dims: list[int], graph_dims: tuple[int, ...], batched: bool) -> str:
    """What a refusal of `dims` that do not fit `graph_dims` says of the rule.

    NOTE: a model with max_batch_size 0 was told "dims exclude the batch dim", the opposite of
    its rule: Triton users who dropped the batch dim ([4] for [-1, 4]) met it (a tester)."""
    if batched:
        return "dims exclude the batch dim; -1 keeps a dim free"
    hint = "with max_batch_size 0 (no batching) dims are the whole shape; -1 keeps a dim free"
    if len(dims) + 1 == len(graph_dims) and all(
        g == -1 or d in (-1, g) for d, g in zip(dims, graph_dims[1:], strict=True)
    ):
        hint += f": {[graph_dims[0], *dims]}"
        if graph_dims[0] == -1:
            hint += ", or a max_batch_size above 0 to batch its first dim"
    return hint


def _narrow(spec: TensorSpec, dims: list[int], batched: bool, where: str) -> tuple[int, ...]:
    """The served shape of `spec` where the config gives `dims` (without the batch dim); a
    ConfigError naming `where` unless they fit the graph's."""
    if spec.any_rank:  # (the graph says nothing: the config's dims are the shape)
        if 0 in dims:
            raise ConfigError(_empty_dim(where, dims, "no shape"))
        return (-1, *dims) if batched else tuple(dims)
    graph_dims = spec.shape[1:] if batched else spec.shape
    if len(dims) != len(graph_dims) or any(
        g != -1 and d not in (-1, g) for d, g in zip(dims, graph_dims, strict=True)
    ):
        raise ConfigError(f"{where}: {dims} does not fit the graph's {list(graph_dims)} "
                          f"({_dims_hint(dims, graph_dims, batched)})")  # fmt: skip
    if any(d == 0 and g != 0 for d, g in zip(dims, graph_dims, strict=True)):
        raise ConfigError(_empty_dim(where, dims, f"dims {list(graph_dims)}"))
    narrowed = tuple(g if d == -1 else d for d, g in zip(dims, graph_dims, strict=True))
    if list(narrowed) != dims:
        # NOTE: served so without a word, the config endpoint giving the graph's dims where the
        # file says -1 (found by a tester); Triton's ONNX Runtime backend refuses such a config
        # (a -1 of the config matches only a -1 of the model)
        _warn_of_field(
            f"{where}: {dims} leaves free a dim the graph fixes ({list(graph_dims)}): served as "
            f"{list(narrowed)}, which requests must match; give the graph's dims (Triton "
            "refuses the -1)"
        )
    return (-1, *narrowed) if batched else narrowed


def _empty_dim(where: str, dims: list[int], graph: str) -> str:
    """The message refusing a config's 0 dim where the graph's dim is not 0.

    NOTE: a 0 is taken only where the graph's dim is 0 too (a model config reports it: see
    config._declared_dim); narrowing a free dim to 0 would refuse every request with data."""
    return (
        f"{where}: {dims} has a dim of 0 where the graph's is not 0 (the graph has {graph}): "
        "a 0 dim takes only empty tensors; give 1 or more, or -1 for a free dim"
    )


def _check_shared_dims(
    config: ModelConfig, session: ort.InferenceSession, batched: bool, source: str
) -> None:
    """ConfigError where the config's dims give two sizes to one named free dim of the graph.

    NOTE: ONNX names a free dim (`dim_param`) so that the tensors sharing the name share its
    size. `Add(a[n, k], b[n, k])` with `a` dims [4] and `b` dims [5] loaded READY, its index
    reason empty: warm-up and profiling failed (logged only), the metadata advertised a [-1, 4]
    and b [-1, 5], and every request shaped so failed in ONNX Runtime (found by a tester)."""
    graph = {arg.name: arg.shape for arg in (*session.get_inputs(), *session.get_outputs())}
    first: dict[str, tuple[int, str, str]] = {}
    """Named dim -> the size the config first gives it, the field, the tensor's name."""
    for kind, entries in (("inputs", config.inputs), ("outputs", config.outputs)):
        for index, entry in enumerate(entries or ()):
            key, given = _given_dims(entry)
            shape = graph.get(entry.name)
            if given is None or not shape:
                continue
            named = shape[1:] if batched else shape
            at = f"{kind}.{index}.{key}"
            for symbol, size in zip(named, given, strict=False):  # (ranks: see `_narrow`)
                if not isinstance(symbol, str) or size < 0:
                    continue
                size_0, at_0, name_0 = first.setdefault(symbol, (size, at, entry.name))
                if size_0 == size:
                    continue
                dims = "[" + ", ".join(str(d) for d in shape) + "]"
                raise ConfigError(
                    f"{source}: field '{at}': {given} gives the graph's dim '{symbol}' of "
                    f"'{entry.name}' {dims} the size {size}, but field '{at_0}' gives it "
                    f"{size_0} for '{name_0}': the graph names both dims '{symbol}', so they "
                    "are one size, and no request shaped as the config says could run; give "
                    "them the same size (or -1 to keep it free)"
                )


def _given_dims(entry: TensorConfig) -> tuple[str, list[int] | None]:
    """The field of `entry` that gives the graph's shape (its `reshape`, else its `dims`), and
    those dims (None: not given)."""
    return ("reshape", entry.reshape) if entry.reshape is not None else ("dims", entry.dims)


def _check_output_dims(
    config: ModelConfig,
    signature: ModelSignature,
    graph_outputs: list[TensorSpec],
    produced: list[np.ndarray] | None,
    facts: GraphFacts | None,
    source: str,
) -> None:
    """ConfigError where the config's dims of an output (those the graph leaves free) are not
    what the warm-up run made of it (`produced`, the outputs of a batch of 1, in the order of
    `signature.outputs`; None: it failed).

    Only where that run settles it: every input had the one shape requests may give (no free
    dim but the batch's), and the graph does not size the output by the input values.

    NOTE: the config's dims of a free dim are taken on trust (see `_narrow`): a Relu `v[n] ->
    w[m]` with `inputs v dims [5]` and `outputs w dims [3]` loaded READY, its metadata and
    config said w is [3], and every answer carried a w of [5], as the warm-up at load had
    (found by a tester)."""
    if produced is None or facts is None or not config.outputs:
        return
    batched = signature.max_batch_size > 0
    if any(
        spec.any_rank or -1 in (spec.shape[1:] if batched else spec.shape)
        for spec in signature.inputs
    ):
        return  # (the samples' free dims are 1s: a request may give other sizes)
    graph = {spec.name: spec for spec in graph_outputs}
    made = dict(zip((spec.name for spec in signature.outputs), produced, strict=False))
    for index, entry in enumerate(config.outputs):
        key, given = _given_dims(entry)
        if given is None or entry.name not in made or entry.name in facts.value_sized_outputs:
            continue
        shape = [int(d) for d in np.shape(made[entry.name])]
        got = shape[1:] if batched else shape
        spec = graph[entry.name]
        declared = None if spec.any_rank else spec.shape[1:] if batched else spec.shape
        if declared is not None and len(got) != len(declared):
            continue  # (the graph's own shape is wrong: the config's follows it, see `_narrow`)
        if len(got) == len(given) and all(
            d in (-1, g) or (declared is not None and declared[i] != -1)
            for i, (d, g) in enumerate(zip(given, got, strict=True))
        ):
            continue
        batch = " (without the batch dim)" if batched else ""
        raise ConfigError(
            f"{source}: field 'outputs.{index}.{key}': {given} is not what the model gives: "
            f"its warm-up run, on inputs of the shapes the config gives, made '{entry.name}' "
            f"{got}{batch}, so every answer would carry {got} where the config says "
            f"{given}; give {key} {got}, or leave them out to take the graph's"
        )


def _free_misdeclared_dims(
    config: ModelConfig,
    signature: ModelSignature,
    produced: list[np.ndarray] | None,
    path: Path,
) -> ModelSignature:
    """`signature` with -1 for each fixed dim of an output (of the graph's shape: not one the
    config gives) that the warm-up run (`produced`, None: it failed) made another size, its
    metadata then saying the dim is free; a warning names each such output.

    NOTE: a fixed dim in a graph may be real (a classifier's 1000 classes) and is kept where the
    run made it so; one an export traced (y declared [2, 3], traced at batch 2, but following the
    input's N) was the metadata while a 5-row request was answered [5, 3], and a client sizing
    an output buffer from metadata got a short one (found by a tester)."""
    if produced is None:
        return signature
    dimmed = {entry.name for entry in config.outputs or () if _given_dims(entry)[1] is not None}
    outputs = []
    for spec, made in zip(signature.outputs, produced, strict=False):
        shape = tuple(int(d) for d in np.shape(made))
        if spec.any_rank or spec.wire is not None or spec.name in dimmed:
            outputs.append(spec)
            continue
        if len(shape) != len(spec.shape):
            log.warning(
                "%s: output '%s' is declared %s by the graph, but its warm-up run made it %s: "
                "its metadata gives the graph's shape, which answers do not have",
                path, spec.name, list(spec.shape), list(shape),
            )  # fmt: skip
            outputs.append(spec)
            continue
        freed = tuple(-1 if d != made_d else d for d, made_d in zip(spec.shape, shape, strict=True))
        if freed != spec.shape:
            log.warning(
                "%s: output '%s' is declared %s by the graph, but its warm-up run made it %s "
                "(an export traced at one size?): served as %s, its metadata too",
                path, spec.name, list(spec.shape), list(shape), list(freed),
            )  # fmt: skip
            spec = replace(spec, shape=freed)
        outputs.append(spec)
    outputs.extend(signature.outputs[len(outputs) :])
    return replace(signature, outputs=tuple(outputs))


def _checked_batching(
    session: ort.InferenceSession,
    signature: ModelSignature,
    config: ModelConfig,
    graph: tuple[list[TensorSpec], list[TensorSpec]],
    source: str,
    *,
    settled: int | None = None,
    facts: GraphFacts | None = None,
) -> tuple[ModelSignature, bool]:
    """`signature` if the graph batches as it claims; unbatched (max_batch_size 0) if its free
    first dims only looked like a batch and nothing asked for batches. A config that asks for
    batches of a graph whose outputs do not follow them is an error; of one whose rows seem to
    interact, a warning: the config may know better. A variant (`settled`: its primary's
    max_batch_size) batches as its primary does. With it: whether each request must run on its
    own (an output sized by the values, or a graph quantized dynamically, batched as the
    config asks; a variant whose rows seem to interact: see `Executor`)."""
    unbatched = config.model_copy(update={"max_batch_size": 0})
    if settled == 0:
        return reconcile(unbatched, *graph, source=source), False
    problem = batching_problem(session, signature, facts)
    if problem is None:
        return signature, False
    if problem.unchecked:
        log.warning("%s: %s; batched, as its dims claim", source, problem.why)
        return signature, False
    asked = config.max_batch_size is not None or settled is not None
    if asked and problem.rows_differ:
        raise ConfigError(
            f"{source}: field 'max_batch_size' = {signature.max_batch_size} needs outputs whose "
            f"first dim is the batch, but {problem.why}; set max_batch_size = 0"
        )
    if asked:
        # NOTE: a batch's answers to an output sized by the values cannot be told apart, even
        # when its first dim happens to be the rows run: a 5-row request padded to 6 rows got a
        # NonZero's entries for its padding row. Each request runs alone, at its own rows; so
        # does each of a graph quantized dynamically (`QUANTIZED_WHY`), an int8-dynamic
        # variant of a batching model included, and each of a variant whose rows seem to
        # interact: it batches as its primary does, which no config of its own asked for (it
        # was batched 'as its config asks', and its answers mixed other requests' rows; found
        # by a tester).
        alone = problem.sized_by_values or problem.coupled or settled is not None
        log.warning(
            "%s: %s; batched anyway, as %s%s", source, problem.why,
            "its primary is" if settled is not None else "its config asks",
            ", but each request runs on its own" if alone else "",
        )  # fmt: skip
        return signature, alone
    log.warning("%s: %s; served unbatched (max_batch_size = 0)", source, problem.why)
    return reconcile(unbatched, *graph, source=source), False


ROWS_TOLERANCE = 1e-5
"""How far (a share of the output's largest value, at least 1) a row's output may move between a
batch and a run alone before `batching_problem` calls the rows dependent: a float sum may be
grouped otherwise in a batch (another kernel, another blocking); rows that mix move far more."""
ROWS_ULPS = 8
"""...or this many units in the last place of the output's type, where that is more (FP16)."""
QUANTIZED_WHY = (
    "its activations are quantized dynamically (a DynamicQuantizeLinear, or a QuantizeLinear "
    "whose scale is computed from the values): one scale is taken over the whole input tensor, "
    "so in a batch each request's answer would follow the other requests' values (a row of "
    "large values zeroes the others' answers)"
)
"""Why `batching_problem` will not batch the requests of a graph quantized dynamically (see
`GraphFacts.dynamically_quantized`).

NOTE: such rows were compared within 20% and batched: ordinary rows batched with rows 1000
times larger came back [0, 0, 0, 0] where ORT alone gives [-9.64, -8.19, 11.37, 9.99] (found by
a tester). N(0, 1) samples at load cannot show how far another request's values move a row."""

SampleFill = Literal["zeros", "distinct", "binary"]
"""What `sample_inputs` puts in integer, BOOL and BYTES inputs: zeros (False, ""); small
non-zero numbers (1-100) that differ from row to row; or row 0 zeros and row 1 ones."""
BATCHING_FILLS: tuple[SampleFill, ...] = ("distinct", "binary", "zeros")
"""The samples `batching_problem` tries, each where the one before failed to run."""


class BatchingProblem(NamedTuple):
    why: str
    rows_differ: bool
    """True: the outputs do not have the batch's rows (their first dim is something else);
    False: they do, but a row's values depend on the other rows of its batch."""
    sized_by_values: bool = False
    """An output's size follows the input values (as the graph or the sample runs show)."""
    coupled: bool = False
    """The graph takes one value over the whole tensor its rows are in (a dynamic quantizer's
    scale): each request must run alone, its own rows together, as ONNX Runtime runs it."""
    unchecked: bool = False
    """No sample ran at all, of any number of rows: nothing shows that the first dim is not a
    batch, and it is taken for one, as it claims (with a warning)."""


def batching_problem(
    session: ort.InferenceSession, signature: ModelSignature, facts: GraphFacts | None = None
) -> BatchingProblem | None:
    """Whether a graph with free first dims really batches, on two sample rows run together and
    one at a time, and on a batch of the first row twice: each output must have the rows run,
    and each row the values it has alone; and no output may take its size from the values
    (`facts`, from the graph). None: it batches, as far as this can tell.

    NOTE: a dim can be free and still not the batch: a Concat of the input with itself gives 2N
    rows, a reduction over the batch none, a Unique as many rows as distinct values (the twin
    rows show it), and the server would split a batch's answers wrongly. A graph can also keep
    its rows' count and mix them (a cumulative sum, a softmax or a normalisation over the first
    axis, a recurrent net whose first axis is time): batching requests would hand each one an
    answer computed from the others'. Such mixing can move an output by a small share of its
    scale (`x - 0.15 * mean(x, axis=0)`), so floats are compared within `ROWS_TOLERANCE` of it,
    integers, booleans and strings exactly, and integer inputs differ from row to row (all
    zeros, a running sum of them is zeros too). Rows of a model quantized dynamically interact
    whatever the samples show (`QUANTIZED_WHY`): its problem is `coupled`.
    """
    names = [spec.name for spec in signature.outputs]
    rows = min(2, signature.max_batch_size)
    sized = _value_sized(names, facts)
    run = bfloat16_run(session, session.run)  # (BF16 tensors as numpy arrays: see its doc)
    problem = _sampled_problem(run, signature, names, rows)
    if problem is not None and problem.rows_differ:
        return problem
    if sized is not None:  # (one the graph explains: what the log says, and the flag)
        return sized
    if problem is not None and problem.sized_by_values:
        return problem
    if facts is not None and facts.dynamically_quantized:  # (whatever the samples showed)
        return BatchingProblem(QUANTIZED_WHY, rows_differ=False, coupled=True)
    return problem


def _sampled_problem(
    run: Run,
    signature: ModelSignature,
    names: list[str],
    rows: int,
    tolerance: float = ROWS_TOLERANCE,
) -> BatchingProblem | None:
    """What the sample runs of `batching_problem` show (None: nothing).

    NOTE: where no sample ran, the graph was taken to batch: a first axis that is time (a
    Conv over it without padding needs 3 rows; each row then moved by the others' mean) was
    batched, and a request of 5 rows alone, padded to 6, was answered wrongly with 200 (found
    by a tester). A batch runs on one row: a graph that runs on `WIDE_ROWS` rows and on no
    sample of one has a first dim that is no batch. One that runs on no sample at all (its
    inner dims need sizes the samples lack: 3 channels, 224 pixels, 400 audio samples, a
    multiple of 64) shows nothing, and is taken to batch, as its dims claim: served
    unbatched, 5 such exports of independent rows lost their batching (found by a tester).
    Free inner dims of 1 fail many graphs that do batch (an image model's height and width
    under its kernel), so they are tried bigger before giving up."""
    failure = ""
    runs_wide = False  # (a sample of `WIDE_ROWS` rows ran where the small ones did not)
    for free in _free_dim_sizes(signature):
        for fill in BATCHING_FILLS:  # (a graph taking its inputs as indices may refuse some)
            feeds = sample_inputs(signature, rows, seed=2, fill=fill, free=free)
            twins = {name: np.repeat(array[:1], rows, axis=0) for name, array in feeds.items()}
            try:
                alone = [
                    run(names, {k: v[row : row + 1] for k, v in feeds.items()})
                    for row in range(rows)
                ]
                whole = run(names, feeds) if rows > 1 else alone[0]
                twinned = run(names, twins) if rows > 1 else alone[0]
            except Exception as exc:
                failure = failure or fitted(" ".join(str(exc).split()), 300)
                runs_wide = runs_wide or _runs(run, names, signature, fill, free)
                continue
            return (
                _rows_problem(names, alone, whole, tolerance)
                or _rows_problem(names, [alone[0]] * rows, twinned, tolerance)
                or _wide_problem(run, signature, names, fill, free, tolerance)
            )
    failed = f"ONNX Runtime: {failure or 'failed'}"
    if runs_wide:
        why = (
            f"no sample input of one row ran ({failed}), but one of {WIDE_ROWS} rows did: its "
            "first dim is no batch (a time axis, say)"
        )
        return BatchingProblem(why, rows_differ=False)
    why = (
        "no sample input ran, of one row or of several, so whether its first dim is a batch "
        f"of independent rows could not be checked ({failed})"
    )
    return BatchingProblem(why, rows_differ=False, unchecked=True)


def _runs(
    run: Run,
    names: list[str],
    signature: ModelSignature,
    fill: SampleFill,
    free: int,
) -> bool:
    """Whether the graph runs on a sample of `WIDE_ROWS` rows (`fill`, free dims `free`)."""
    try:
        run(names, sample_inputs(signature, WIDE_ROWS, seed=2, fill=fill, free=free))
    except Exception:
        return False
    return True


WIDE_ROWS = 8
"""The rows of the wider batch `_wide_problem` runs (at most the model's max_batch_size)."""
LOUD = 1000.0
"""What `_wide_problem` scales its last row's float inputs by."""


def _wide_problem(
    run: Run,
    signature: ModelSignature,
    names: list[str],
    fill: SampleFill,
    free: int,
    tolerance: float,
) -> BatchingProblem | None:
    """What a batch of `WIDE_ROWS` rows shows, its last row's floats `LOUD`er, against its
    first row run alone and the others run together: each output must have the rows run, and
    the first row, within its own scale, what it has alone (None: nothing, or the runs failed:
    the small batches ran). Optional inputs with a batch dim are given too: requests that give
    them batch together (one whose rows mixed through them was batched: found by a tester).

    NOTE: batches of 1 and 2 rows of N(0, 1) values passed graphs that mix rows beyond them,
    and such models were batched and answered wrongly with 200 (found by a tester): one whose
    branch takes the rows' mean from 3 rows on (a 5-row request alone, padded to 6, was
    moved by its padding), one that takes row 2 of the batch, one that adds the rows' maximum
    past a threshold, one whose hand-written quantizer takes its scale from the whole tensor."""
    rows = min(signature.max_batch_size, WIDE_ROWS)
    if rows <= 2:
        return None
    for batched_optional in (True, False):  # (without them where the graph refuses them)
        feeds = sample_inputs(
            signature, rows, seed=3, fill=fill, free=free, batched_optional=batched_optional
        )
        for array in feeds.values():
            if is_float(array.dtype):
                array[-1] *= LOUD
        try:
            whole = run(names, feeds)
            first = run(names, {k: v[:1] for k, v in feeds.items()})
            others = run(names, {k: v[1:] for k, v in feeds.items()})
            break
        except Exception:
            continue
    else:
        return None
    for index, name in enumerate(names):
        if (lacking := _lacks_rows(name, whole[index], rows)) is not None:
            return lacking
        batched = np.asarray(whole[index])
        if not (
            _same_rows(batched[:1], np.asarray(first[index]), tolerance)
            and _same_rows(batched[1:], np.asarray(others[index]), tolerance)
        ):
            why = (
                f"output '{name}' of a batch of {rows} rows, one of large values, differs from "
                "its rows run apart (its rows are not independent)"
            )
            return BatchingProblem(why, rows_differ=False)
    return None


SAMPLE_FREE_DIMS = (1, 8, 32)
"""The sizes `batching_problem` gives free dims beyond the batch, each where the one before
failed to run (every fill), up to `SAMPLE_ROW_ELEMENTS` elements a row."""
SAMPLE_ROW_ELEMENTS = 1 << 20


def _free_dim_sizes(signature: ModelSignature) -> list[int]:
    """The sizes of `SAMPLE_FREE_DIMS` to try for `signature`'s free inner dims: 1 alone where
    it has none."""
    inner = [spec.shape[1 if signature.max_batch_size > 0 else 0 :] for spec in signature.inputs]
    free = max((sum(d < 0 for d in dims) for dims in inner), default=0)
    if free == 0:
        return [1]
    fixed = max((int(np.prod([d for d in dims if d >= 0])) for dims in inner), default=1)
    return [n for n in SAMPLE_FREE_DIMS if n == 1 or fixed * n**free <= SAMPLE_ROW_ELEMENTS]


def _rows_problem(
    names: list[str], alone: list[list[np.ndarray]], whole: list[np.ndarray], tolerance: float
) -> BatchingProblem | None:
    """Whether `whole`, the outputs of a batch, are the `alone` outputs of its rows, stacked.

    NOTE: rows alone may give outputs of other inner dims (TopK of a count read from the row, a
    mask as long as the row's length): not rows_differ, as their first dim is still the batch's.
    Stacked, they raised a ValueError that failed the model's load as an internal error."""
    rows = len(alone)
    for index, name in enumerate(names):
        for outputs, count in (*((run, 1) for run in alone), (whole, rows)):
            if (lacking := _lacks_rows(name, outputs[index], count)) is not None:
                return lacking
        sizes = [list(np.shape(run[index])[1:]) for run in alone]
        if any(size != sizes[0] for size in sizes):
            why = (
                f"output '{name}' has inner dims {sizes[0]} for one row run alone and "
                f"{next(s for s in sizes if s != sizes[0])} for another (its size follows the "
                "input values)"
            )
            return BatchingProblem(why, rows_differ=False, sized_by_values=True)
        batched = np.asarray(whole[index])
        lone = np.concatenate([np.asarray(run[index]) for run in alone])
        if not _same_rows(batched, lone, tolerance):
            why = (
                f"output '{name}' of a batch of {rows} rows differs from the rows run one at a "
                "time (its rows are not independent)"
            )
            return BatchingProblem(why, rows_differ=False)
    return None


def _lacks_rows(name: str, output: np.ndarray, rows: int) -> BatchingProblem | None:
    """Output `name` of a batch of `rows` rows, where its first dim is not those rows."""
    shape = list(np.shape(output))
    if shape and shape[0] == rows:
        return None
    return BatchingProblem(f"output '{name}' has shape {shape} for a batch of {rows}", True)


def _same_rows(batched: np.ndarray, lone: np.ndarray, tolerance: float) -> bool:
    if batched.shape != lone.shape:  # (other dims sized by the whole batch: padding, say)
        return False
    if batched.dtype.kind not in "fc" and not is_float(batched.dtype):
        return bool(np.array_equal(batched, lone))
    eps = float(float_info(lone.dtype).eps)
    if lone.dtype == BFLOAT16:  # (numpy's own functions take no ml_dtypes array)
        batched, lone = batched.astype(np.float32), lone.astype(np.float32)
    finite = np.abs(lone[np.isfinite(lone)])
    scale = max(1.0, float(finite.max()) if finite.size else 1.0)
    share = max(tolerance, ROWS_ULPS * eps)
    return bool(np.allclose(batched, lone, rtol=0, atol=share * scale, equal_nan=True))


def _value_sized(names: list[str], facts: GraphFacts | None) -> BatchingProblem | None:
    """The first output whose size the graph takes from the input values, if any.

    NOTE: not `rows_differ`: the graph says so, no run showed it, and a config that asks for
    batches may know better (its requests then run each on its own: see `Executor`)."""
    sized = facts.value_sized_outputs if facts is not None else {}
    name = next((name for name in names if name in sized), None)
    if name is None:
        return None
    why = (
        f"output '{name}' takes its size from the input values ({sized[name]}), so its first "
        "dim need not be the batch's"
    )
    return BatchingProblem(why, rows_differ=False, sized_by_values=True)


def sample_inputs(
    signature: ModelSignature,
    rows: int,
    seed: int = 0,
    fill: SampleFill = "zeros",
    free: int = 1,
    *,
    batched_optional: bool = False,
) -> dict[str, np.ndarray]:
    """Inputs of the signature's shapes (free dims `free`) for warm-up and profiling; none for
    the optional inputs, which ONNX Runtime then takes from their initializers, but those
    whose first dim is free where `batched_optional` (requests that give one batch together).
    Floats are random (`seed`); integers, booleans and strings as `fill` says (zeros: an index
    any table has)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    specs = [
        spec
        for spec in signature.inputs
        if not spec.optional or (batched_optional and spec.shape and spec.shape[0] < 0)
    ]
    for spec in specs:  # (optional ones: their initializers)
        shape = [d if d >= 0 else free for d in spec.shape]
        if signature.max_batch_size > 0:
            shape[0] = rows
        dtype = NUMPY_OF[spec.datatype]
        if spec.datatype != "BYTES" and is_float(dtype):
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
            continue
        numbers = _sample_numbers(shape, fill)
        if spec.datatype == "BYTES":
            text = numbers.astype(str) if fill != "zeros" else np.full(shape, "", dtype=object)
            feeds[spec.name] = strings_for_ort(text.astype(object), spec.name)
        elif dtype.kind == "b":
            # (asarray: on a 0-d array, == gives a numpy.bool_, which ORT refuses as an input)
            feeds[spec.name] = np.asarray(numbers % 2 == 1)
        else:
            feeds[spec.name] = numbers.astype(dtype)
    return feeds


def _sample_numbers(shape: list[int], fill: SampleFill) -> np.ndarray:
    """Integers of `shape` as `SampleFill` describes them (int64; at most 100)."""
    size = int(np.prod(shape))
    if fill == "zeros" or size == 0:
        return np.zeros(shape, dtype=np.int64)
    per_row = size // (shape[0] if shape else 1)
    flat = np.arange(size)
    row, within = flat // per_row, flat % per_row
    numbers = row % 2 if fill == "binary" else 1 + (row + within) % 100
    return numbers.reshape(shape)


def sample_row_bytes(signature: ModelSignature, free: int = 1) -> int:
    """The input bytes of one row of `sample_inputs`: what the profile was measured on; 0 where
    every input has a fixed size beyond the batch (no request can be bigger than the samples,
    and the scheduler then never weighs a batch's inputs)."""
    batched = signature.max_batch_size > 0
    if not any(
        spec.any_rank or -1 in (spec.shape[1:] if batched else spec.shape)
        for spec in signature.inputs
    ):
        return 0
    return sum(array.nbytes for array in sample_inputs(signature, 1, free=free).values())


def measure_profile(
    executor: Executor,
    signature: ModelSignature,
    path: Path,
    budget_s: float = PROFILE_BUDGET_S,
    *,
    fill: SampleFill = "zeros",
    free: int = 1,
) -> LatencyProfile:
    """Median and p99 execution time of each batch bucket, measured on instance 0 within about
    `budget_s`; the buckets it cannot afford are estimated at the cost per row of the largest
    measured (`LatencyProfile.estimated`).

    The buckets are run once each in rising order while what the runs cost stays within
    `PROFILE_PROBE_SHARE` of the budget (those of up to `PROFILE_MIN_ROWS` rows whatever they
    cost); then each measured one runs `PROFILE_MIN_RUNS` times (or as many as the budget has
    room for), and they share what is left equally, up to `PROFILE_MAX_RUNS` runs each, taken in
    `PROFILE_ROUNDS` rounds over all the buckets, on the samples of `fill` and `free` (the
    warm-up's: see `warm_up`). A graph that rejects the sample inputs gets a nominal 1 ms per
    row, marked `guessed`: the first real execution replaces it.

    NOTE: every bucket up to the max batch was run at least 5 times whatever the budget: the
    load of the demo resnet (about 1 ms a row) took ~4 s at max_batch_size 32, 29 s at 512,
    and 65536, which the config accepts, would have taken about an hour and tens of GB (found
    by a tester). A bucket the load did not run follows the runs of those it did once serving
    starts (see `LatencyProfile._follow`), and the first run of one pays ORT's allocations.

    NOTE: one bucket after another, a change of the machine's speed during profiling (another
    process, a VM's neighbours) lands on some buckets only. On the 2-core VM one such profile of
    resnet read 1.5-1.6 ms a row for batches 1-16 and 1.16-1.21 ms for 24-32, where the cost per
    row is flat (interleaved runs of ORT alone: 889-931 rows/s from batch 1 to 32); in rounds,
    every bucket sees the same stretch of time (profiles taken so: 1.04-1.10 ms a row).
    """
    buckets = batch_buckets(signature.max_batch_size)
    budget_ns = budget_s * 1e9
    samples: dict[int, list[int]] = {}
    output_row_bytes: int | None = None
    try:
        plan: dict[int, tuple[dict[str, np.ndarray], int]] = {}
        """Bucket -> its sample inputs and its first run's ns."""
        spent = 0
        for rows in buckets:
            if plan and rows > PROFILE_MIN_ROWS:
                largest = max(plan)
                if spent + plan[largest][1] * rows / largest > PROFILE_PROBE_SHARE * budget_ns:
                    break
            feeds = sample_inputs(signature, rows, seed=rows, fill=fill, free=free)
            started = time.perf_counter_ns()
            made = executor.run_sync(feeds)
            first = time.perf_counter_ns() - started
            spent += first
            if rows == buckets[0]:
                output_row_bytes = sum(np.asarray(a).nbytes for a in made) // rows
            plan[rows] = feeds, max(first, 1)
        left_ns = max(0.0, budget_ns - spent)
        fewest = int(min(PROFILE_MIN_RUNS, left_ns // spent))
        share_ns = (left_ns - fewest * spent) / len(plan)  # (each bucket's, past its fewest)
        runs = {
            rows: int(min(PROFILE_MAX_RUNS, fewest + share_ns / first))
            for rows, (_, first) in plan.items()
        }
        samples = {rows: [] for rows in plan}
        for round_ in range(PROFILE_ROUNDS):
            for rows, (feeds, _) in plan.items():
                count = runs[rows]
                share = count * (round_ + 1) // PROFILE_ROUNDS - count * round_ // PROFILE_ROUNDS
                samples[rows].extend(_timed_run(executor, feeds) for _ in range(share))
        for rows, (_, first) in plan.items():
            if not samples[rows]:  # (no room for another: its first run, cold, stands for it)
                samples[rows].append(first)
    except Exception as exc:
        log.warning("%s: profiling on sample inputs failed (%s); using 1 ms per row", path, exc)
        samples = {rows: [rows * 1_000_000] for rows in buckets}
        output_row_bytes = None
        guessed = True
    else:
        guessed = False
    profile = profile_from_samples(samples, up_to=signature.max_batch_size)
    profile.sample_output_row_bytes = output_row_bytes
    profile.guessed = guessed
    if profile.estimated:
        log.info(
            "%s: profiled batches of 1-%d rows within its %g s budget; batches of up to %d rows "
            "are estimated at %.3g ms a row until they run",
            path, max(samples), budget_s, profile.max_rows,
            profile.predict(max(samples)) / max(samples) / 1e6,
        )  # fmt: skip
    return profile


def _timed_run(executor: Executor, feeds: dict[str, np.ndarray]) -> int:
    started = time.perf_counter_ns()
    executor.run_sync(feeds)
    return time.perf_counter_ns() - started


class WarmedUp(NamedTuple):
    produced: list[np.ndarray] | None
    """The outputs of the first run (None: the graph rejected every sample)."""
    fill: SampleFill
    """The samples it took (see `WARM_UP_FILLS`): profiling runs those too."""
    free: int = 1
    """Their free dims beyond the batch (see `SAMPLE_FREE_DIMS`): profiling's too."""


WARM_UP_FILLS: tuple[SampleFill, ...] = ("zeros", "distinct")
"""The samples `warm_up` tries, the second where the first failed to run: zeros (an index any
table has), then non-zero ones (a row of "binary" is zeros).

NOTE: zeros alone failed a model dividing by an input ("Integer division by zero"): it was
profiled at a made-up 1 ms a row and run on a thread, and an idle ~20 µs model refused 2 of 20
requests due in 1.5 ms (found by a tester)."""


def warm_up(
    executor: Executor, signature: ModelSignature, path: Path, runs: int = WARM_UP_RUNS
) -> WarmedUp:
    """Run each instance `runs` times at batch 1 so first requests pay no allocation cost (the
    largest batch: `warm_up_largest`, once profiled), on the first samples of `WARM_UP_FILLS`
    the graph runs, their free dims beyond the batch 1, else the next of `SAMPLE_FREE_DIMS`
    (as `batching_problem` tries them).

    A graph that rejects every sample (it needs real indices, say) still loads: it is warned
    about, since real requests may well be valid.

    NOTE: the free dims were 1 alone: an image model's height and width under a 3x3 kernel
    without padding failed every sample, and was profiled at a made-up 1 ms a row; requests
    it answers in microseconds were refused 429 as predicted to take 16 ms (found by a
    tester).
    """
    failure: Exception | None = None
    for free in _free_dim_sizes(signature):
        for fill in WARM_UP_FILLS:
            feeds = sample_inputs(signature, 1, fill=fill, free=free)
            produced: list[np.ndarray] | None = None
            try:
                for instance in range(executor.instances):
                    for _ in range(runs):
                        made = executor.run_sync(feeds, instance)
                        if produced is None:
                            produced = made
            except (DuetimeError, Exception) as exc:
                failure = failure or exc
                if not _has_integers(signature):  # (the other samples differ in those alone)
                    break
                continue
            if failure is not None:
                log.info("%s: warm-up and profiling ran on %s samples%s, as %s failed (%s)",
                         path, fill, f" with free dims of {free}" if free > 1 else "",
                         "smaller ones" if free > 1 else "zeros", failure)  # fmt: skip
            return WarmedUp(produced, fill, free)
    log.warning("%s: warm-up on sample inputs failed (%s); serving anyway", path, failure)
    return WarmedUp(None, "zeros")


def _has_integers(signature: ModelSignature) -> bool:
    """Whether some input's samples follow `SampleFill` (integers, booleans, strings)."""
    return any(
        spec.datatype == "BYTES" or not is_float(NUMPY_OF[spec.datatype])
        for spec in signature.required_inputs
    )


def warm_up_largest(
    executor: Executor,
    signature: ModelSignature,
    profile: LatencyProfile,
    path: Path,
    budget_s: float = PROFILE_BUDGET_S,
    *,
    fill: SampleFill = "zeros",
    free: int = 1,
) -> None:
    """Run each instance once at the largest batch (instance 0 only where profiling did not),
    so that the first full batch does not pay ORT's allocations; not at all where the profile
    predicts one such run takes more than `WARM_UP_LARGEST_BUDGETS` times `budget_s` (the log
    says so): the first batch that large then pays them.

    NOTE: each instance ran the largest batch 3 times, whatever it cost: with a large
    max_batch_size most of a load's time (see `measure_profile`)."""
    rows = max(signature.max_batch_size, 1)
    if rows == 1 or profile.guessed:
        return
    predicted_ns = profile.predict(rows)
    if predicted_ns > WARM_UP_LARGEST_BUDGETS * budget_s * 1e9:
        log.info(
            "%s: not warmed up at its largest batch (%d rows, %.3g s a run by its profile): "
            "the first batch that large pays ONNX Runtime's allocations",
            path, rows, predicted_ns / 1e9,
        )  # fmt: skip
        return
    measured = rows not in profile.estimated
    try:
        feeds = sample_inputs(signature, rows, fill=fill, free=free)
        for instance in range(1 if measured else 0, executor.instances):
            executor.run_sync(feeds, instance)
    except (DuetimeError, Exception) as exc:
        log.warning("%s: warm-up at the largest batch failed (%s); serving anyway", path, exc)
