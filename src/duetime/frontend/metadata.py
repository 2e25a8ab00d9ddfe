"""Model metadata and Triton-style model configuration, as plain dicts both front ends encode."""

from __future__ import annotations

import json
import math
from typing import Any

from duetime.config import ModelConfig, SchedulingConfig
from duetime.datatypes import TRITON_TYPE_OF
from duetime.repository.loader import LoadedModel
from duetime.repository.tritonconfig import (
    ANY_PRIORITY,
    ANY_SHAPE,
    DUETIME,
    WITHOUT_DIMS,
    carried_settings,
    queue_size_field,
)
from duetime.types import TensorSpec

PLATFORM = "onnxruntime_onnx"


def model_metadata_json(model: LoadedModel, versions: list[str]) -> dict[str, Any]:
    """The v2 model metadata object."""
    return {
        "name": model.name,
        "versions": versions,
        "platform": PLATFORM,
        "inputs": [_tensor(spec) for spec in shown_inputs(model)],
        "outputs": [_tensor(spec) for spec in model.signature.outputs],
    }


def shown_inputs(model: LoadedModel) -> list[TensorSpec]:
    """The inputs metadata and the model config list: the required ones, and the optional
    ones (initializers a request may override) that the model's config names.

    NOTE: as Triton's: exporters of a few years ago listed every weight of a model as a graph
    input, and clients that make up a value for each listed input (perf_analyzer, load
    generators) would send hundreds of random weights. Requests may override any of them."""
    named = {tensor.name for tensor in model.config.inputs or ()}
    return [s for s in model.signature.inputs if not s.optional or s.name in named]


def _tensor(spec: TensorSpec) -> dict[str, Any]:
    """A tensor's metadata entry.

    NOTE: a graph input declared with no shape at all takes any shape, and is shown as [-1]
    (`TensorSpec.shown`, in the config's dims too): neither the v2 protocol nor Triton's model
    config can say "any rank". Triton's ONNX Runtime backend has no answer either: ORT reports
    such an input with no dims, as it does a scalar, so Triton's autocomplete makes it dims [1]
    (with `reshape: []` when batching) and then refuses every other shape, which the model
    would take. [-1] keeps it free, and makes clients that fill inputs from metadata
    (perf_analyzer) ask for its shape; a model config's `dims` pins one. The model config's
    `tensors_of_any_shape` parameter names such tensors, so that it reads back as any shape."""
    return {"name": spec.name, "datatype": spec.datatype, "shape": spec.shown()}


def model_config_json(model: LoadedModel) -> dict[str, Any]:
    """The model's configuration in Triton's JSON form (what `get_model_config` returns)."""
    signature = model.signature
    batched = signature.max_batch_size > 0
    config = model.config
    scheduling = config.scheduling
    labels = {t.name: t.labels for t in config.outputs or () if t.labels is not None}
    formats = {t.name: t.format for t in config.inputs or () if t.format != "FORMAT_NONE"}
    inputs = shown_inputs(model)
    # NOTE: what duetime does, in Triton's terms: a request's own timeout is always honoured
    # (in place of the default, shorter or longer), whatever a Triton config said (warned of at
    # load when it did not allow it)
    queue_policy: dict[str, Any] = {
        # (a queue per level, as Triton's, where the levels have one; the bound the field
        # cannot say travels in `parameters['duetime']`: see tritonconfig.carried_queue_bound)
        "max_queue_size": queue_size_field(scheduling),
        "allow_timeout_override": True,
    }  # fmt: skip
    if config.default_timeout_ms is not None:
        # (whole microseconds, rounded up, 1 at least: 0 is Triton's "none", and a default under
        # 1 µs read back as 0 served with no due time once loaded again; a uint64)
        microseconds = min(max(1, math.ceil(round(config.default_timeout_ms * 1000, 3))), 2**64 - 1)
        queue_policy["default_timeout_microseconds"] = microseconds
    return {
        "name": model.name,
        "platform": PLATFORM,
        "backend": "onnxruntime",
        "version_policy": config.version_policy.model_dump(exclude_none=True)
        or {"latest": {"num_versions": 1}},
        "max_batch_size": signature.max_batch_size,
        "input": [_config_tensor(s, batched, layout=formats.get(s.name)) for s in inputs],
        "output": [_config_tensor(s, batched, labels.get(s.name)) for s in signature.outputs],
        # (Triton names a group without a name `<model>_<index>`: NormalizeInstanceGroup)
        "instance_group": [
            {"name": f"{model.name}_0", "kind": "KIND_CPU", "count": config.instances}
        ],
        "dynamic_batching": {
            "max_queue_delay_microseconds": scheduling.max_queue_delay_us,
            "preferred_batch_size": list(scheduling.preferred_batch_size),
            **_priority(scheduling),
            "default_queue_policy": queue_policy,
        },
        "parameters": {
            "scheduling_policy": {"string_value": scheduling.policy},
            **_any_priority(scheduling),
            **_without_dims([*inputs, *signature.outputs], batched),
            **_of_any_shape([*inputs, *signature.outputs]),
            "intra_op_thread_count": {"string_value": str(config.intra_op_threads)},
            "inter_op_thread_count": {"string_value": str(config.inter_op_threads)},
            **_carried(config),
        },
        "default_model_filename": config.default_model_filename,
    }


def _priority(scheduling: SchedulingConfig) -> dict[str, int]:
    """The model's priority levels in Triton's terms: `ignore_priority` is no levels (0), as a
    Triton config without them says (every priority is then the default level)."""
    if scheduling.ignore_priority:
        return {"priority_levels": 0, "default_priority_level": 0}
    return {
        "priority_levels": scheduling.priority_levels,
        "default_priority_level": scheduling.default_priority_level,
    }


def _any_priority(scheduling: SchedulingConfig) -> dict[str, Any]:
    """NOTE: duetime's `priority_levels` 0 honours any level, where Triton's 0 is one level for
    all: a config.toml model's config, read back by load_model(config=...), served every request
    in arrival order. The parameter says so in Triton's form (see tritonconfig.ANY_PRIORITY)."""
    if scheduling.ignore_priority or scheduling.priority_levels:
        return {}
    return {ANY_PRIORITY: {"string_value": "true"}}


def _carried(config: ModelConfig) -> dict[str, Any]:
    """The settings Triton's ModelConfig has no field for (traffic, variants, execution,
    breaker, two scheduling margins, a queue bound), those not at their defaults, as one JSON
    object in the `duetime` parameter, so that the config read back by load_model(config=...)
    serves as before (see tritonconfig.DUETIME)."""
    carried = carried_settings(config)
    if not carried:
        return {}
    return {DUETIME: {"string_value": json.dumps(carried, separators=(",", ":"))}}


def _without_dims(specs: list[TensorSpec], batched: bool) -> dict[str, Any]:
    """NOTE: a tensor without dims beyond the batch's is written as Triton writes it, dims [1]
    with reshape [] (see `_config_tensor`), which a config read back takes as Triton's: answers
    in [batch, 1], and metadata saying so. Read back by load_model(config=...), a model served
    [batch] became one answering [batch, 1]. The parameter names such tensors (a JSON list), so
    that the config reads back as the same model (see tritonconfig.WITHOUT_DIMS)."""
    names = [spec.name for spec in specs if _has_no_dims(spec, batched)]
    if not names:
        return {}
    return {WITHOUT_DIMS: {"string_value": json.dumps(names)}}


def _of_any_shape(specs: list[TensorSpec]) -> dict[str, Any]:
    """NOTE: a tensor whose graph declares no shape at all is written dims [-1] (see `_tensor`),
    which a config read back takes as rank 1: loaded by load_model(config=...), a model that
    took any shape refused the [2, 3] it had served. The parameter names such tensors (a JSON
    list), so that the config reads back as the same model (see tritonconfig.ANY_SHAPE)."""
    names = [spec.name for spec in specs if spec.any_rank]
    if not names:
        return {}
    return {ANY_SHAPE: {"string_value": json.dumps(names)}}


def _has_no_dims(spec: TensorSpec, batched: bool) -> bool:
    """Whether `spec` has no dims beyond the batch's as requests give it (and no reshape)."""
    return spec.wire is None and not (spec.shown()[1:] if batched else spec.shown())


def _config_tensor(
    spec: TensorSpec, batched: bool, labels: str | None = None, layout: str | None = None
) -> dict[str, Any]:
    """A tensor's entry; `labels`: an output's label file, `layout`: an input's format (None:
    FORMAT_NONE, left out as protobuf's JSON leaves out defaults, so both protocols agree).

    NOTE: the format changes nothing in serving, but Triton's image_client (parse_model) reads
    it to lay out its images and refused a model without one: a config.pbtxt's was dropped."""
    dims = spec.shown()[1:] if batched else spec.shown()
    tensor: dict[str, Any] = {"name": spec.name, "data_type": TRITON_TYPE_OF[spec.datatype]}
    if layout is not None:
        tensor["format"] = layout
    if spec.wire is not None:  # (the config's reshape: requests carry dims, the graph takes this)
        tensor["dims"] = dims
        tensor["reshape"] = {"shape": list(spec.shape[1:] if batched else spec.shape)}
    elif dims:
        tensor["dims"] = dims
    else:  # NOTE: as Triton writes a tensor without dims (its config check refuses empty dims)
        tensor["dims"], tensor["reshape"] = [1], {"shape": []}  # (named by WITHOUT_DIMS)
    if labels is not None:
        tensor["label_filename"] = labels
    if spec.optional:
        tensor["optional"] = True
    return tensor
