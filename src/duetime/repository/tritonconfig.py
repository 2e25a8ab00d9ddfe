"""Triton's `config.pbtxt`, read as a duetime model config: a Triton model repository of ONNX
models serves unchanged.

The file (UTF-8, but in its comments: see `decoded`) is parsed whole by protobuf's text_format
against Triton's ModelConfig schema (the complete `model_config.proto`, so every section
parses), then translated field by field into the settings `config.py` validates (a
`max_batch_size` of 0 with no tensors listed is left to the graph: 32 where its first dim is
free on every input and output, else 0; Triton's auto-complete gives the onnxruntime backend's
default, 4). A config that sets nothing (an empty
`config.pbtxt`, or only `name`, `platform`, `backend`) is served as a model folder without a
config file: duetime's defaults (the graph's max_batch_size, 1 instance, any priority level a
request asks for), where Triton auto-completes both alike to max_batch_size 4, 2 CPU instances
and one priority level:

| Triton | duetime |
|---|---|
| `max_batch_size` (0 and no `input`/`output`: from the graph) | `max_batch_size` |
| `input`/`output` `name`, `data_type`, `dims` | `inputs`/`outputs` |
| `input`/`output` `reshape` (fixed dims) | `inputs`/`outputs` `reshape` |
| `output` `label_filename` | `outputs` `labels` |
| `input` `optional` | `inputs` `optional` |
| `input` `format` (reported back; no effect on serving) | `inputs` `format` |
| `instance_group` counts (summed but passive ones, per GPU listed; none: 2) | `instances` |
| `dynamic_batching.max_queue_delay_microseconds` | `scheduling.max_queue_delay_us` |
| `dynamic_batching.default_queue_policy.max_queue_size` | `scheduling.max_queue_size` |
| the same unset or 0 (Triton: no maximum), or no `dynamic_batching` | 1024, warned of (q) |
| the same, with `priority_levels` (a queue per level) | `scheduling.max_queue_size_per_level` |
| and `priority_levels` times it (at most 1,000,000; see (+)) | `scheduling.max_queue_size` |
| `dynamic_batching.default_queue_policy.default_timeout_microseconds` | `default_timeout_ms` (*) |
| `dynamic_batching.default_priority_level`, `priority_levels` | `scheduling.` the same |
| no `dynamic_batching.priority_levels` (one level, as Triton) | `scheduling.ignore_priority` |
| `dynamic_batching.preferred_batch_size` (FIFO mode) | `scheduling.preferred_batch_size` |
| `dynamic_batching.priority_queue_policy` (keys in [1, `priority_levels`]) | warned of (p) |
| `dynamic_batching.preserve_ordering` | warned of (p) |
| `scheduling_policy` in `parameters` (`edf`, `fifo`) | `scheduling.policy` |
| `any_priority_level` `"true"` in `parameters` (duetime's own) | `scheduling.priority_levels` 0 |
| `tensors_without_dims` (a JSON list of names) in `parameters` (duetime's own) | no `dims` |
| `tensors_of_any_shape` (a JSON list of names) in `parameters` (duetime's own) | no `dims` |
| `duetime` (a JSON object) in `parameters` (duetime's own) | what Triton has no field for (+) |
| `version_policy` | `version_policy` |
| `parameters` `intra_op_thread_count`, `inter_op_...` | `intra_op_threads`, `inter_op_...` |
| other onnxruntime backend `parameters` | warned of, unless they ask for what duetime does |

(+) `execution`, `breaker`, `variants`, `traffic`, `scheduling.delivery_margin_us`,
`scheduling.exec_margin`: what the config endpoint reports there, so that a config read back
and loaded again serves as before. And the queue bound Triton's field cannot say (see
`carried_queue_bound`): with `priority_levels`, `scheduling.max_queue_size`, the bound over
every level together (Triton has none); without, `scheduling.max_queue_size_per_level`.

(*) A request's own timeout always replaces the model's default due time, shorter or longer
(Triton's `allow_timeout_override: true` lets it shorten it only), whatever the file says
(duetime always honours a request's own; a `dynamic_batching` that does not allow it is
warned of, and the config endpoint says true).
Triton's default timeout bounds a request's wait in the queue, duetime's is the due time of its
answer: a model whose run is longer refuses every request (warned of at load, see loader.py).

(q) duetime keeps every queue bounded (a design rule): a Triton config that leaves
`max_queue_size` unset means an unbounded queue to Triton, and duetime serves it with
`scheduling.max_queue_size`'s default, 1024 queued requests (in all, with `priority_levels`),
beyond which requests are refused at once (429 / RESOURCE_EXHAUSTED). The load logs a warning
saying so, and the config endpoint reports the bound served (`max_queue_size: 1024`).

(p) Not supported, warned of with the reason: a per-level queue policy (the
`default_queue_policy` applies to every level; a key outside [1, `priority_levels`] is refused,
as Triton refuses it), and `preserve_ordering` (each answer is sent when its batch finishes).

What duetime cannot honour is refused with the field named: another platform or backend,
sequence batching (stateful models), ensembles, decoupled models, a `reshape` with free dims,
shape tensors, batch inputs/outputs. Sections that only
tune Triton itself (`optimization`, `model_warmup`, `response_cache`, ...) are ignored with a
warning.
Without `dynamic_batching` Triton runs each request alone; duetime's scheduler batches anyway
(that is what it is for): set `max_batch_size = 0` to stop it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from pydantic import ValidationError

from duetime import config as settings
from duetime.config import (
    BOM,
    MAX_QUEUE_SIZE,
    ONNX_BACKENDS,
    ONNX_RUNTIME_ONLY,
    ModelConfig,
    SchedulingConfig,
    describe_validation_error,
    find_config_file,
    name_difference,
    parse_model_config,
    unread_config_warning,
)
from duetime.errors import ConfigError
from duetime.frontend.proto import model_config_pb2 as mc

log = logging.getLogger("duetime.config")

FILENAME = "config.pbtxt"
ONNX_PLATFORMS = frozenset({"", "onnxruntime_onnx"})
ENSEMBLE = "ensemble"
"""The platform of a Triton ensemble."""

_TRANSLATED = frozenset({
    "name", "platform", "backend", "max_batch_size", "input", "output", "instance_group",
    "dynamic_batching", "version_policy", "parameters", "default_model_filename",
})  # fmt: skip
_TENSOR_FIELDS = frozenset({
    "name", "data_type", "format", "dims", "reshape", "label_filename", "optional",
})  # fmt: skip
_BATCHING_FIELDS = frozenset({
    "max_queue_delay_microseconds", "default_priority_level", "default_queue_policy",
    "priority_levels", "preferred_batch_size", "priority_queue_policy", "preserve_ordering",
})  # fmt: skip
_IDENTITY = frozenset({"name", "platform", "backend", "default_model_filename"})
"""The fields that only say which model, file and runtime: a config setting no others sets
nothing else."""
DEFAULT_QUEUE_SIZE: int = SchedulingConfig.model_fields["max_queue_size"].default
"""The queue bound a Triton config that leaves `max_queue_size` unset is served with."""
_TRITON_FIELDS = mc.ModelConfig.DESCRIPTOR.fields
_SHARED = frozenset(ModelConfig.model_fields) | {"name", "backend"}  # (both forms take these two)
_SHARED_JSON_NAMES = {
    field.json_name: field.name
    for field in _TRITON_FIELDS
    if field.name in _SHARED and field.json_name != field.name
}
"""protobuf's JSON names (camelCase: `maxBatchSize`) of the fields duetime's form shares with
Triton's -> their names."""
_TRITON_ONLY = (
    frozenset(
        {field.name for field in _TRITON_FIELDS} | {field.json_name for field in _TRITON_FIELDS}
    )
    - _SHARED
    - set(_SHARED_JSON_NAMES)
)
"""The keys of a JSON config that only Triton's form has: one of them makes it Triton's."""
_REFUSED = {
    "sequence_batching": "sequence batching (stateful models) is not supported",
    "ensemble_scheduling": "ensembles are not supported; serve each model on its own",
    "batch_input": "batch inputs are not supported",
    "batch_output": "batch outputs are not supported",
}
SCHEDULING_POLICY = "scheduling_policy"
"""The parameter carrying duetime's `scheduling.policy` (edf or fifo) in Triton's form."""
ANY_PRIORITY = "any_priority_level"
"""The parameter ("true") saying, in Triton's form, that requests may ask for any priority
level: a duetime model whose `priority_levels` is 0 (Triton's 0 is one level for all)."""
WITHOUT_DIMS = "tensors_without_dims"
"""The parameter (a JSON list of tensor names) saying, in Triton's form, which tensors written
as dims [1] with reshape [] have no dims at all: a duetime model's tensors without dims beyond
the batch's, served in the graph's shape ([batch], or [] unbatched), not Triton's [batch, 1].
Either way such an input takes both forms (see validation.other_shapes)."""
ANY_SHAPE = "tensors_of_any_shape"
"""The parameter (a JSON list of tensor names) saying, in Triton's form, which tensors written
as dims [-1] take any shape: those whose graph declares no shape at all (not even a rank), which
neither Triton's config nor the v2 protocol can say (see metadata._tensor). Read back as no dims
(the graph's any shape is served); without it dims [-1] is rank 1.

NOTE: a model served for any shape, loaded back from its own config as returned, refused the
[2, 3] requests it had served ("does not match the model's [-1]")."""
DUETIME = "duetime"
"""The parameter (a JSON object) carrying, in Triton's form, the settings of a duetime model
config that Triton's ModelConfig has no field for (`CARRIED`, `CARRIED_SCHEDULING`): the config
endpoint writes those not at their defaults, and a config read back takes them, so that
get_model_config -> edit -> load_model(config=...) serves as before.

NOTE: a model with A/B weights, a sticky key, a shadow version and a variant, loaded back from
its own config as returned, sent all its traffic to the former shadow version (the highest),
moved every sticky key and lost the variant, without a word. Only what Triton has no field for
is carried, so an edit of a Triton field never meets a stale copy of it here (the queue bound
carried is the one its field cannot say: see `carried_queue_bound`)."""
CARRIED = ("execution", "breaker", "variants", "traffic")
"""The sections of a duetime model config that `DUETIME` carries whole."""
CARRIED_SCHEDULING = ("delivery_margin_us", "exec_margin")
"""The `scheduling` settings that `DUETIME` carries (the others are `dynamic_batching`'s, but
a queue bound: see `carried_queue_bound`)."""
_CARRIED_NAMES = (
    f"{', '.join([*CARRIED, *(f'scheduling.{name}' for name in CARRIED_SCHEDULING)])}, and "
    "the queue bound dynamic_batching cannot say (scheduling.max_queue_size with "
    "priority_levels, scheduling.max_queue_size_per_level without)"
)
_THREAD_PARAMETERS = {
    "intra_op_thread_count": "intra_op_threads",
    "inter_op_thread_count": "inter_op_threads",
}

_UNHONOURED_PARAMETERS: dict[str, tuple[str, frozenset[str]]] = {
    "execution_mode": ("runs a graph's operators one at a time", frozenset({"0"})),
    "enable_mem_arena": ("keeps ONNX Runtime's CPU memory arena on", frozenset({"1", "true"})),
    "enable_mem_pattern": ("keeps memory patterns on", frozenset({"1", "true"})),
    "memory.enable_memory_arena_shrinkage": ("never shrinks the arena after a run", frozenset()),
    "session.use_device_allocator_for_initializers": (
        "allocates initializers as ONNX Runtime does by default", frozenset({"0", "false"})
    ),
    **{gpu_only: ("runs on the CPU", frozenset()) for gpu_only in (
        "cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy",
        "do_copy_in_default_stream",
    )},
}  # fmt: skip
"""The onnxruntime backend's `parameters` (its README, "Model Config Options") that duetime's
sessions do not take: what duetime does instead, and the values that ask for just that (no
warning then).

NOTE: honouring them means session options per model (execution/ort.py `session_options`,
called by loader.load_version), which take only the thread counts today."""


Warn = Callable[[str], None]
"""Where the translation's warnings go (what it ignores or changes)."""


def _log(message: str) -> None:
    log.warning("%s", message)


@dataclass(frozen=True, slots=True)
class ReadConfig:
    """A model's config, with the warnings its file gave and that file's digest (the same
    content gives the same warnings: a watcher says them again only when the digest changes)."""

    config: ModelConfig
    warnings: tuple[str, ...] = ()
    digest: str = ""
    unread: str = ""
    """Of the warnings, the one saying that files meant as its config are not read (see
    `unread_config_warning`): the index gives it as the reason of the versions served."""


class TritonModelConfig(ModelConfig):
    """A model config written as Triton's ModelConfig (a config.pbtxt, or a load request's
    `config` in JSON): the same settings, whose fields the errors found at load name as its
    writer wrote them (`triton_field`: `input[0].name`, not `inputs.0.name`)."""


def load_model_config(model_dir: Path) -> ModelConfig:
    """The model's config from its config file (duetime's TOML or YAML, or Triton's pbtxt);
    its warnings are logged."""
    read = read_model_config(model_dir)
    for message in read.warnings:
        _log(message)
    return read.config


def read_model_config(model_dir: Path) -> ReadConfig:
    """The model's config from its config file, its warnings returned, not logged."""
    path = find_config_file(model_dir)
    if path is None:
        unread = unread_config_warning(model_dir)
        if unread is None:
            return ReadConfig(ModelConfig())
        return ReadConfig(
            ModelConfig(), (unread,), hashlib.sha256(unread.encode()).hexdigest(), unread
        )
    warnings: list[str] = []
    if path.name != FILENAME:
        own = settings.load_model_config(model_dir)
        delay = own.scheduling.max_queue_delay_us
        _warn_long_delay(delay, f"{path}: scheduling.max_queue_delay_us", warnings.append)
        # (the digest of what it warns of: the same warnings are said once)
        said = hashlib.sha256("\n".join(warnings).encode()).hexdigest() if warnings else ""
        return ReadConfig(own, tuple(warnings), said)
    raw = _read_bytes(path)
    text = decoded(raw, source=str(path))
    data = translate(text, source=str(path), model_name=model_dir.name, warn=warnings.append)
    digest = hashlib.sha256(raw).hexdigest()
    config = validated(data, source=str(path), form=TritonModelConfig)
    return ReadConfig(config, tuple(warnings), digest)


def declared_filename(model_dir: Path) -> str:
    """The model file name the config of `model_dir` gives its versions (`model.onnx` where
    it names none); ConfigError where the config is refused: that is why the folder is no
    model, whatever its versions hold.

    NOTE: read as the default where refused, the startup scan blamed the version folders of
    an ensemble, a Python model or a config with a typo ("no version folder holds a
    model.onnx") where its load names the field (found by a tester)."""
    return read_model_config(model_dir).config.default_model_filename


def read_pbtxt(path: Path, model_name: str) -> dict[str, Any]:
    """The settings `path` (a Triton config.pbtxt of model `model_name`) translates to."""
    text = decoded(_read_bytes(path), source=str(path))
    return translate(text, source=str(path), model_name=model_name)


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc}") from exc


def decoded(data: bytes, *, source: str) -> str:
    """The text of a config.pbtxt's bytes `data`: UTF-8, but in its comments (any bytes, as
    protobuf's tokenizer skips them; there shown as U+FFFD), a leading byte order mark left out.
    ConfigError naming the line and column of a byte that is not UTF-8 elsewhere (in a string
    value, say: protobuf refuses a string that is not UTF-8).

    NOTE: the file was decoded whole, strictly: a comment saved in Latin-1 (`# Größe`, by a
    Windows editor) refused the model ("'utf-8' codec can't decode byte 0xf6"), which Triton
    serves; and a byte order mark was refused as "Expected identifier or number, got \ufeff",
    a character no terminal shows (both found by a tester)."""
    text = data.decode("utf-8", "surrogateescape").removeprefix(BOM)
    if text.isascii() or not _UNDECODED.search(text):
        return text
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        comment = _comment_start(line)
        bad = _UNDECODED.search(line, 0, comment)
        if bad is not None:
            byte = ord(bad[0]) - 0xDC00
            raise ConfigError(
                f"{source}: line {number}, column {bad.start() + 1}: byte 0x{byte:02x} is not "
                "UTF-8; expected UTF-8 text (other bytes may only be in comments, after '#'): "
                "save the file as UTF-8"
            )
        lines[number - 1] = line[:comment] + _UNDECODED.sub("\ufffd", line[comment:])
    return "\n".join(lines)


_UNDECODED = re.compile("[\udc80-\udcff]")
"""A byte that is not UTF-8, as the surrogateescape error handler decodes it."""


def _comment_start(line: str) -> int:
    """Where the comment of `line` starts (its `#` outside a string value), or its length."""
    quote = ""
    escaped = False
    for index, char in enumerate(line):
        if escaped:
            escaped = False
        elif quote:
            if char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char == "#":
            return index
    return len(line)


def translate(text: str, *, source: str, model_name: str, warn: Warn = _log) -> dict[str, Any]:
    config = _parsed(text_format.Parse, text, source, "protobuf text format")
    return _translated(config, source, model_name, warn)


def read_json_config(
    data: Mapping[str, Any], *, source: str, model_name: str, warn: Warn = _log
) -> ModelConfig:
    """A JSON model config (a load request's `config`): duetime's own settings (Triton's `name`,
    and `backend` "onnxruntime", accepted too), or Triton's ModelConfig in protobuf's JSON form.

    NOTE: the form is decided by the keys, never by how a value is written: a JSON with any
    field Triton's form alone has (`input`, `instance_group`, `dynamic_batching`,
    `parameters`, ...) is Triton's form, its fields left out at Triton's defaults, as in a
    config.pbtxt; any other is duetime's, its settings left out at duetime's defaults. The
    fields both share (`name`, `platform`, `backend`, `max_batch_size`, `version_policy`,
    `default_model_filename`) mean the same in each (but `max_batch_size` 0, which duetime
    reads as "no batching" and Triton as "from the graph"), in any spelling protobuf's JSON
    takes (camelCase names: `maxBatchSize`; integers as protobuf reads them: `"4"`, what
    tritonclient's gRPC `get_model_config(as_json=True)` returns, `4.0`, `"4e0"`).
    The form was the one the JSON was valid in, duetime's first: `"max_batch_size": "4"` was
    read as Triton's form (2 instances, one priority level) and `4` as duetime's (1 instance,
    any level), one config with two meanings (the tconfig tester's
    repro_json_override_form.py); then `4.0` and `"4e0"` still were (the t85 tester's
    repro_2.py). A field given in both spellings is refused (protobuf kept the last). Read in
    Triton's form, it is a `TritonModelConfig`."""
    given = data.get("name", model_name)
    if given != model_name:
        differs = name_difference(given, model_name) if isinstance(given, str) else ""
        raise ConfigError(f"{source}: name '{given}' is not the model '{model_name}'{differs}")
    _refuse_both_spellings(data, mc.ModelConfig.DESCRIPTOR, "", source)
    if not any(key in _TRITON_ONLY for key in data):
        own = parse_model_config(_shared_as_own(data), source=source, model_name=model_name)
        _warn_long_delay(own.scheduling.max_queue_delay_us,
                         f"{source}: scheduling.max_queue_delay_us", warn)  # fmt: skip
        return own
    config = _parsed(json_format.ParseDict, data, source, "JSON ModelConfig")
    translated = _translated(config, source, model_name, warn)
    return validated(translated, source=source, form=TritonModelConfig)


def _refuse_both_spellings(data: Any, message: Any, where: str, source: str) -> None:
    """ConfigError where an object of the JSON `data` gives a field of `message` (a protobuf
    descriptor; `where`: its path, '' for the config) under both of its names
    (`max_batch_size` and `maxBatchSize`): protobuf's JSON reader keeps the last without a
    word, and which one the writer meant is theirs to say."""
    if not isinstance(data, dict):
        return
    for field in message.fields:
        names = [name for name in dict.fromkeys((field.name, field.json_name)) if name in data]
        if len(names) > 1:
            raise ConfigError(f"{source}: {where}{names[0]} and {where}{names[1]}: one field "
                              "given twice, in both of its spellings; give it once")  # fmt: skip
        held = field.message_type
        if held is None or not names:
            continue
        value, path = data[names[0]], f"{where}{names[0]}"
        if held.GetOptions().map_entry:  # (a map: its values are of the entry's `value`)
            held = held.fields_by_name["value"].message_type
            items = list(value.items()) if isinstance(value, dict) and held else []
            for key, item in items:
                _refuse_both_spellings(item, held, f"{path}[{key!r}].", source)
        elif field.is_repeated:
            for index, item in enumerate(value if isinstance(value, list) else []):
                _refuse_both_spellings(item, held, f"{path}[{index}].", source)
        else:
            _refuse_both_spellings(value, held, f"{path}.", source)


def _shared_as_own(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with the fields both forms share written as duetime's form writes them:
    protobuf's JSON names and its spellings of integers (`"maxBatchSize": "4"`, `4.0`,
    `"4e0"`) as `"max_batch_size": 4`. Anything else is left as it is (for duetime's
    validation to refuse, naming the field)."""
    own = {_SHARED_JSON_NAMES.get(key, key): value for key, value in data.items()}
    if "max_batch_size" in own:
        own["max_batch_size"] = _json_integer(own["max_batch_size"])
    policy = own.get("version_policy")
    if isinstance(policy, dict):
        policy = dict(policy)
        latest = policy.get("latest")
        if isinstance(latest, dict):
            latest = {"num_versions" if k == "numVersions" else k: v for k, v in latest.items()}
            if "num_versions" in latest:
                latest["num_versions"] = _json_integer(latest["num_versions"])
            policy["latest"] = latest
        specific = policy.get("specific")
        if isinstance(specific, dict) and isinstance(specific.get("versions"), list):
            specific = {**specific, "versions": [_json_integer(v) for v in specific["versions"]]}
            policy["specific"] = specific
        own["version_policy"] = policy
    return own


def _json_integer(value: Any) -> Any:
    """`value` as protobuf's JSON reader reads an integer field (its `_ConvertInteger`): `4`,
    `4.0`, `"4"`, `"4.0"` and `"4e0"` are all 4. Others unchanged (a bool, a fraction, a
    string with a space or of no number), for duetime's validation to refuse."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, str) or " " in value:
        return value
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)
    except ValueError:
        return value
    return int(number) if number.is_integer() else value


def translate_json(
    data: Mapping[str, Any], *, source: str, model_name: str, warn: Warn = _log
) -> dict[str, Any]:
    """The settings Triton's ModelConfig in its JSON form (protobuf's JSON mapping: the form
    `get_model_config` returns and Triton's load request takes) translates to."""
    config = _parsed(json_format.ParseDict, data, source, "JSON ModelConfig")
    return _translated(config, source, model_name, warn)


def validated(
    data: dict[str, Any], *, source: str, form: type[ModelConfig] = ModelConfig
) -> ModelConfig:
    """The duetime config that a Triton config translated to (`data`), validated (as a `form`);
    errors name the Triton fields the wrong values came from (see `triton_field`), not
    duetime's."""
    try:
        return form.model_validate(data)
    except ValidationError as exc:
        # (a section's whole translated content says nothing of the Triton file: left out)
        message = describe_validation_error(
            source, exc, field_name=triton_field, show_sections=False, schema=form
        )
        raise ConfigError(message) from None


_FIELD_OF_SETTING = {
    "": "(the config)",
    "inputs": "input",
    "outputs": "output",
    "instances": "instance_group (its counts summed)",
    "scheduling": "dynamic_batching",
    "scheduling.max_queue_delay_us": "dynamic_batching.max_queue_delay_microseconds",
    "scheduling.max_queue_size": "dynamic_batching.default_queue_policy.max_queue_size",
    "scheduling.default_priority_level": "dynamic_batching.default_priority_level",
    "scheduling.priority_levels": "dynamic_batching.priority_levels",
    "scheduling.preferred_batch_size": "dynamic_batching.preferred_batch_size",
    "scheduling.policy": f"parameters['{SCHEDULING_POLICY}']",
    "default_timeout_ms": "dynamic_batching.default_queue_policy.default_timeout_microseconds",
    **{setting: f"parameters['{key}']" for key, setting in _THREAD_PARAMETERS.items()},
}
_FIELD_OF_TENSOR_SETTING = {
    "datatype": "data_type", "labels": "label_filename", "reshape": "reshape.shape",
}  # fmt: skip


def triton_field(loc: tuple[int | str, ...]) -> str:
    """The Triton field that the duetime setting at `loc` (a validation error's path through
    what `_translated` made) came from: `('inputs', 0, 'dims', 0)` is `input[0].dims`."""
    if _is_carried(loc):
        path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)
        return f"parameters['{DUETIME}']{path}"
    if len(loc) > 1 and loc[0] in ("inputs", "outputs") and isinstance(loc[1], int):
        tensor = f"{str(loc[0])[:-1]}[{loc[1]}]"
        if len(loc) == 2:
            return tensor
        return f"{tensor}.{_FIELD_OF_TENSOR_SETTING.get(str(loc[2]), loc[2])}"
    dotted = ".".join(str(part) for part in loc if not isinstance(part, int))
    return _FIELD_OF_SETTING.get(dotted, dotted)


def _is_carried(loc: tuple[int | str, ...]) -> bool:
    """Whether the setting at `loc` came from the `DUETIME` parameter."""
    if not loc:
        return False
    return loc[0] in CARRIED or (loc[0] == "scheduling" and loc[1:2] in _CARRIED_LOCS)


_CARRIED_LOCS = tuple((name,) for name in CARRIED_SCHEDULING)


def _parsed(parse: Any, given: Any, source: str, form: str) -> Any:
    """Triton's ModelConfig that `parse` (protobuf's text or JSON reader) makes of `given`."""
    config = mc.ModelConfig()
    try:
        parse(given, config)
    except (text_format.ParseError, json_format.ParseError) as exc:
        raise ConfigError(
            f"{source}: not a Triton model config ({form}): {exc}{_enum_values(str(exc))}"
        ) from None
    except RecursionError:  # (protobuf's JSON reader, and its errors' repr, recurse per level)
        raise ConfigError(
            f"{source}: not a Triton model config ({form}): its values are nested too deeply "
            "(lists or objects within one another, hundreds of levels down)"
        ) from None
    return config


_ENUM_TYPE = re.compile(r'enum type "?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)', re.IGNORECASE)


def _enum_values(error: str) -> str:
    """The values there are of the enum a protobuf parse `error` names ('' if none): protobuf
    names the value it has no use for, not those it takes.

    NOTE: `format: NCHW` was refused as 'Enum type "inference.ModelInput.Format" has no value
    named NCHW', leaving the writer to look up model_config.proto for FORMAT_NCHW."""
    found = _ENUM_TYPE.search(error)
    if found is None:
        return ""
    try:
        enum = mc.DESCRIPTOR.pool.FindEnumTypeByName(found[1])
    except KeyError:
        return ""
    holder = enum.containing_type
    fields = [f.name for f in holder.fields if f.enum_type is enum] if holder is not None else []
    what = f"'{fields[0]}'" if len(fields) == 1 else enum.name
    return f" ({what} takes {', '.join(value.name for value in enum.values)})"


def _translated(config: Any, source: str, model_name: str, warn: Warn) -> dict[str, Any]:
    _refuse_unknown_enums(config, "", source)
    given = {field.name for field, _ in config.ListFields()}
    _refuse_what_cannot_be_served(config, given, source, model_name)
    out: dict[str, Any] = {}
    if config.default_model_filename:
        out["default_model_filename"] = config.default_model_filename
    if not given - _IDENTITY:
        # NOTE: as a folder without a config file (Triton auto-completes both alike): an empty
        # config.pbtxt got 2 instances and one priority level, a folder without one 1 instance
        # and any level (the tconfig tester's repro_autocomplete_defaults.py)
        return out
    tensors = [("inputs", config.input), ("outputs", config.output)]
    for key, specs in tensors:
        if specs:
            out[key] = [
                _tensor(spec, f"{key[:-1]}[{index}]", source, warn)
                for index, spec in enumerate(specs)
            ]
    if config.max_batch_size > 0 or any(specs for _, specs in tensors):
        out["max_batch_size"] = config.max_batch_size
    out["instances"] = _instances(config, source, warn)
    if config.HasField("dynamic_batching"):
        _refuse_contradictions(config.dynamic_batching, out.get("max_batch_size"), source)
        _dynamic_batching(config.dynamic_batching, out, source, warn)
    if not config.dynamic_batching.default_queue_policy.max_queue_size:
        _warn_queue_bounded(config.dynamic_batching, source, warn)
    _priority(config.dynamic_batching, out)
    if config.HasField("version_policy"):
        out["version_policy"] = _version_policy(config.version_policy)
    for name, parameter in config.parameters.items():
        _parameter(name, parameter.string_value, out, source, warn)
    if out.get("execution") == "inline" and out["instances"] != 1:
        raise ConfigError(f"{source}: parameters['{DUETIME}'].execution: 'inline' runs the one "
                          f"instance on the event loop, but instance_group counts "
                          f"{out['instances']}; write 'thread' or 'auto' there, or a count of "
                          "1")  # fmt: skip
    _drop_unused_preferred(out.get("scheduling", {}), source, warn)
    ignored = sorted(given - _TRANSLATED)
    if ignored:
        warn(f"{source}: {', '.join(ignored)}: Triton-only settings, no effect in duetime")
    return out


def _parameter(name: str, value: str, out: dict[str, Any], source: str, warn: Warn) -> None:
    """One of the config's `parameters`: the thread counts and duetime's scheduling policy
    are settings; the onnxruntime backend's others are warned of where they ask for what
    duetime does not do (see `_UNHONOURED_PARAMETERS`), and unknown keys always."""
    where = f"{source}: parameters['{name}']"
    if name in _THREAD_PARAMETERS:
        threads = _integer(value, f"parameters['{name}']", source)
        if threads != 0 or name == "intra_op_thread_count":
            # (an inter-op count of 0 is ONNX Runtime's own choice: duetime's default, 1)
            out[_THREAD_PARAMETERS[name]] = threads
    elif name == SCHEDULING_POLICY:  # (duetime's own, as its model config reports it)
        out.setdefault("scheduling", {})["policy"] = value
    elif name == ANY_PRIORITY:  # (duetime's own; after `_priority`, which it overrides)
        if value.strip().lower() == "true":
            out.setdefault("scheduling", {}).pop("ignore_priority", None)
    elif name == WITHOUT_DIMS:  # (duetime's own; after the tensors, whose dims it drops)
        _without_dims(_names(value, f"parameters['{name}']", source), out, where, warn)
    elif name == ANY_SHAPE:  # (duetime's own; after the tensors, whose dims it drops)
        _of_any_shape(_names(value, f"parameters['{name}']", source), out, where, warn)
    elif name == DUETIME:  # (duetime's own: the settings Triton has no field for)
        _carried(value, out, where, warn)
    elif name in _UNHONOURED_PARAMETERS:
        what_duetime_does, same = _UNHONOURED_PARAMETERS[name]
        if value.strip().lower() not in same:
            warn(f"{where} '{value}': not honoured: duetime {what_duetime_does}")
    else:
        warn(f"{where}: not a parameter of Triton's onnxruntime backend nor of duetime; ignored")


def carried_settings(config: ModelConfig) -> dict[str, Any]:
    """The settings of `config` that the `DUETIME` parameter carries, those not at their
    defaults (none: {}): a config without the parameter reads them as defaults."""
    wanted: dict[str, Any] = {name: True for name in CARRIED}
    wanted["scheduling"] = set(CARRIED_SCHEDULING)
    dumped = config.model_dump(include=wanted, exclude_defaults=True)
    carried = {key: value for key, value in dumped.items() if value not in ({}, [])}
    queue = carried_queue_bound(config.scheduling)
    if queue:
        carried["scheduling"] = {**carried.get("scheduling", {}), **queue}
    return carried


def queue_size_field(scheduling: SchedulingConfig) -> int:
    """`dynamic_batching.default_queue_policy.max_queue_size` as the config endpoint writes the
    queue bounds of `scheduling`, in Triton's terms: with priority levels, the bound of each
    level's queue (the most one level may queue: its own bound, within the whole queue's);
    without (Triton's one queue; a duetime model taking any level), the whole queue's."""
    total = scheduling.max_queue_size
    if scheduling.priority_levels:  # (`ignore_priority` too: one level, 1)
        return min(scheduling.max_queue_size_per_level or total, total)
    return total


def carried_queue_bound(scheduling: SchedulingConfig) -> dict[str, int]:
    """The queue bound of `scheduling` that `queue_size_field` cannot say, as `DUETIME` carries
    it (none: {}): with priority levels, the whole queue's where it is not what the field reads
    back as (`priority_levels` times it, see `_dynamic_batching`); without, a level's own.

    NOTE: the config endpoint wrote a config.toml model's `max_queue_size` 2 with 2 priority
    levels (2 in all) as Triton's `max_queue_size: 2`, a queue of 2 per level, and a
    config.pbtxt's unset one (1024 in all) as 1024 per level: loaded back by
    load_model(config=...), each queued twice what it had (found by a tester)."""
    if scheduling.ignore_priority:
        return {}  # (one level: the field is its bound, whichever of the two was tighter)
    if scheduling.priority_levels:
        total = scheduling.max_queue_size
        read_back = min(MAX_QUEUE_SIZE, scheduling.priority_levels * queue_size_field(scheduling))
        return {} if total == read_back else {"max_queue_size": total}
    per_level = scheduling.max_queue_size_per_level
    return {"max_queue_size_per_level": per_level} if per_level else {}


def _carried(value: str, out: dict[str, Any], where: str, warn: Warn) -> None:
    """The settings the `DUETIME` parameter carries (`value`, a JSON object), into `out`; they
    are validated with the rest (errors name `parameters['duetime'].<setting>`, see
    `triton_field`). A key it does not carry is refused: a setting Triton has a field for is
    set there, and one given in both places would leave the reader to guess which wins."""
    given = _json(value, where)
    expected = (f"expected a JSON object of duetime's settings that Triton's ModelConfig has no "
                f"field for ({_CARRIED_NAMES}), as the config endpoint writes it")  # fmt: skip
    if not isinstance(given, dict):
        raise ConfigError(f"{where}: {expected}; got '{_shown(value)}'")
    scheduling = given.pop("scheduling", {})
    if not isinstance(scheduling, dict):
        raise ConfigError(f"{where}: scheduling: expected a JSON object of "
                          f"{', '.join(CARRIED_SCHEDULING)} and a queue bound; got "
                          f"{_shown(json.dumps(scheduling))}")  # fmt: skip
    # (`_priority` ran: it writes `priority_levels` where the config has them, and only then)
    own = out.setdefault("scheduling", {})
    queue = _carried_queue_bounds(scheduling, "priority_levels" in own, where)
    unknown = sorted(set(given) - set(CARRIED))
    unknown += sorted(f"scheduling.{key}" for key in set(scheduling) - set(CARRIED_SCHEDULING))
    if unknown:
        raise ConfigError(f"{where}: {', '.join(unknown)}: not carried here; it takes "
                          f"{_CARRIED_NAMES}: the settings Triton's ModelConfig has no field for "
                          "(set the others in their Triton fields)")  # fmt: skip
    out.update(given)
    own.update(scheduling, **queue)
    per_level = own.get("max_queue_size_per_level", 0)
    if "max_queue_size" in queue and queue["max_queue_size"] < per_level:
        warn(f"{where}: scheduling.max_queue_size {queue['max_queue_size']} (the bound over "
             "every priority level together) is below dynamic_batching.default_queue_policy."
             f"max_queue_size {per_level} (each level's): no level queues more than "
             f"{queue['max_queue_size']}")  # fmt: skip


def _carried_queue_bounds(scheduling: dict[str, Any], levels: bool, where: str) -> dict[str, int]:
    """The queue bound the `DUETIME` parameter's `scheduling` carries (see
    `carried_queue_bound`), taken out of it and checked: with priority `levels` the whole
    queue's, without them a level's own; the other one is the field's to set."""
    carried = "max_queue_size" if levels else "max_queue_size_per_level"
    set_by_field = "max_queue_size_per_level" if levels else "max_queue_size"
    if set_by_field in scheduling:
        raise ConfigError(f"{where}: scheduling.{set_by_field}: not carried here; "
                          "dynamic_batching.default_queue_policy.max_queue_size sets it "
                          f"({'with' if levels else 'without'} priority_levels)")  # fmt: skip
    if carried not in scheduling:
        return {}
    value, least = scheduling.pop(carried), 1 if levels else 0
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if not is_int or not least <= value <= MAX_QUEUE_SIZE:
        raise ConfigError(f"{where}: scheduling.{carried}: expected an integer in [{least}, "
                          f"{MAX_QUEUE_SIZE}], got {_shown(json.dumps(value))}")  # fmt: skip
    return {carried: value}


def _without_dims(names: list[str], out: dict[str, Any], where: str, warn: Warn) -> None:
    """The tensors `names` (`WITHOUT_DIMS`), written dims [1] with reshape [], as having no
    dims: the graph's shape is served. A name of no such tensor is warned of."""
    _undimmed(names, out, where, warn, _dims_1_reshape_empty, "dims [1] with reshape []")


def _of_any_shape(names: list[str], out: dict[str, Any], where: str, warn: Warn) -> None:
    """The tensors `names` (`ANY_SHAPE`), written dims [-1] without a reshape, as having no
    dims: the graph's shape (any) is served. A name of no such tensor is warned of."""
    _undimmed(names, out, where, warn, _dims_free_vector, "dims [-1] without a reshape")


def _undimmed(
    names: list[str],
    out: dict[str, Any],
    where: str,
    warn: Warn,
    written: Callable[[dict[str, Any]], bool],
    described: str,
) -> None:
    """Drop the dims (and reshape) of the inputs and outputs `names` that are `written` so."""
    tensors = [t for key in ("inputs", "outputs") for t in out.get(key, ())]
    for name in names:
        found = [t for t in tensors if t["name"] == name and written(t)]
        if not found:
            warn(f"{where}: '{name}' is no input or output of {described} in this config; "
                 "ignored")  # fmt: skip
        for tensor in found:
            del tensor["dims"]
            tensor.pop("reshape", None)


def _dims_free_vector(tensor: dict[str, Any]) -> bool:
    return tensor.get("dims") == [-1] and "reshape" not in tensor


def _dims_1_reshape_empty(tensor: dict[str, Any]) -> bool:
    return tensor.get("dims") == [1] and tensor.get("reshape") == []


def _names(value: str, field: str, source: str) -> list[str]:
    """The tensor names of a parameter holding a JSON list of them."""
    names = _json(value, f"{source}: {field}")
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ConfigError(f"{source}: {field}: expected a JSON list of tensor names (as the "
                          f"config endpoint writes it: [\"label\"]), got "
                          f"'{_shown(value)}'")  # fmt: skip
    return names


def _json(value: str, where: str) -> Any:
    """The JSON value a parameter's `value` holds; None if it holds no JSON. ConfigError (naming
    `where`) when it is nested too deeply to read.

    NOTE: json.loads recurses per level: a parameter of `[[[...]]]` a few thousand levels deep
    raised RecursionError, a 500 for the load (a load request's override too)."""
    try:
        return json.loads(value)
    except ValueError:
        return None
    except RecursionError:
        raise ConfigError(
            f"{where}: its JSON is nested too deeply (lists or objects within one another, "
            f"hundreds of levels down): '{_shown(value)}'"
        ) from None


def _shown(value: str) -> str:
    """`value` as an error shows it: its first 80 characters."""
    return value if len(value) <= 80 else f"{value[:80]}..."


def _refuse_what_cannot_be_served(
    config: Any, given: set[str], source: str, model_name: str
) -> None:
    """`given`: the fields the config sets (repeated ones only when not empty)."""

    def refuse(field: str, why: str) -> ConfigError:
        return ConfigError(f"{source}: {field}: {why}")

    if config.name and config.name != model_name:
        raise refuse("name", f"'{config.name}' differs from the model's folder '{model_name}'"
                             f"{name_difference(config.name, model_name)}")  # fmt: skip
    if config.max_batch_size < 0:
        raise refuse("max_batch_size", f"{config.max_batch_size}: must be 0 (no batching) or more")
    if config.platform == ENSEMBLE or "ensemble_scheduling" in given:
        # NOTE: an ensemble (`platform: "ensemble"` beside its `ensemble_scheduling`, as Triton
        # requires both) was refused as another platform, which reads as "change the platform"
        # (found by a tester)
        if "ensemble_scheduling" in given:
            raise refuse("ensemble_scheduling", _REFUSED["ensemble_scheduling"])
        raise refuse("platform", f"'{ENSEMBLE}': {_REFUSED['ensemble_scheduling']}")
    if config.platform not in ONNX_PLATFORMS or config.backend not in ONNX_BACKENDS:
        field = "platform" if config.platform not in ONNX_PLATFORMS else "backend"
        value = config.platform if field == "platform" else config.backend
        raise refuse(field, f"'{value}': {ONNX_RUNTIME_ONLY}")
    refused = sorted(given & _REFUSED.keys())
    if refused:
        raise refuse(refused[0], _REFUSED[refused[0]])
    if config.model_transaction_policy.decoupled:
        raise refuse("model_transaction_policy.decoupled", "decoupled models are not supported")
    for kind, specs in (("input", config.input), ("output", config.output)):
        for spec in specs:
            if spec.is_shape_tensor:
                raise refuse(f"{kind} '{spec.name}'.is_shape_tensor", "shape tensors are not "
                             "supported")  # fmt: skip


def _tensor(spec: Any, where: str, source: str, warn: Warn) -> dict[str, Any]:
    """`where`: the tensor's field (`input[0]`)."""
    kind = where.split("[")[0]
    ignored = sorted({f.name for f, _ in spec.ListFields()} - _TENSOR_FIELDS)
    if ignored:
        warn(f"{source}: {kind} '{spec.name}': {', '.join(ignored)}: Triton-only settings, no "
             "effect in duetime")  # fmt: skip
    layout = _format(spec) if kind == "input" else "FORMAT_NONE"
    if layout != "FORMAT_NONE" and len(spec.dims) != 3:
        # NOTE: as Triton (ValidateModelInput): "model input NHWC/NCHW require 3 dims"
        raise ConfigError(f"{source}: {where}.format: {layout} needs 3 dims (without the batch "
                          f"dim), but dims are {list(spec.dims)}")  # fmt: skip
    tensor: dict[str, Any] = {"name": spec.name}
    if spec.data_type != mc.TYPE_INVALID:
        name = mc.DataType.Name(spec.data_type).removeprefix("TYPE_")
        tensor["datatype"] = "BYTES" if name == "STRING" else name
    if spec.dims:
        tensor["dims"] = list(spec.dims)
    if spec.HasField("reshape"):
        # NOTE: as Triton: requests carry `dims` and the graph takes the reshape (dims [1] with
        # reshape [], its form of a tensor without dims, takes [batch, 1]): it was served as
        # dims [], and [batch, 1], as Triton's clients send it, was refused
        tensor["reshape"] = list(spec.reshape.shape)
    if spec.DESCRIPTOR.name == "ModelOutput" and spec.label_filename:
        tensor["labels"] = spec.label_filename
    if spec.DESCRIPTOR.name == "ModelInput" and spec.optional:
        tensor["optional"] = True
    if layout != "FORMAT_NONE":
        tensor["format"] = layout
    return tensor


_ENUM_NOUNS = {
    "inference.ModelInput.Format": "a layout",
    "inference.DataType": "a data type",
    "inference.ModelInstanceGroup.Kind": "an instance group kind",
    "inference.ModelQueuePolicy.TimeoutAction": "a timeout action",
    "inference.ModelOptimizationPolicy.ModelPriority": "a priority",
}
"""What a value of these enums is called in the error refusing one there is not (others: 'a
value of <enum>')."""


def _refuse_unknown_enums(message: Any, where: str, source: str) -> None:
    """ConfigError for a number in an enum field of `message` (at the field path `where`, ''
    for the config) that names none of the enum's values, naming the field and the values.

    NOTE: proto3 enums are open: protobuf's text and JSON readers both take `data_type: 99`
    or `kind: 9` and keep the number. Naming it raised ValueError out of the loader ('Enum
    DataType has no name defined for value 99'; `format: 7` did too), and an instance group's
    kind 9 was taken without a word (its instances counted as a GPU group's). Checked in every
    section, Triton-only ones too: a number that means nothing is a mistake wherever it is."""
    for field, value in message.ListFields():
        path = f"{where}.{field.name}" if where else field.name
        entry = field.message_type
        held = field  # (what each item is: a map's is its entries' `value`)
        if entry is not None and entry.GetOptions().map_entry:  # (`key: .. value { .. }`)
            items = [(f"{path}[{key!r}]", item) for key, item in value.items()]
            held = entry.fields_by_name["value"]
        elif field.is_repeated:
            items = [(f"{path}[{index}]", item) for index, item in enumerate(value)]
        else:
            items = [(path, value)]
        enum = held.enum_type
        for at, item in items:
            if held.message_type is not None:
                _refuse_unknown_enums(item, at, source)
            elif enum is not None and item not in enum.values_by_number:
                noun = _ENUM_NOUNS.get(enum.full_name, f"a value of {enum.name}")
                names = [v.name for v in enum.values if not v.name.endswith("_INVALID")]
                raise ConfigError(f"{source}: {at}: {item} is not {noun}; expected one of "
                                  f"{', '.join(names)}")  # fmt: skip


def _format(spec: Any) -> str:
    """An input's `format` by name (a number naming none was refused: `_refuse_unknown_enums`)."""
    return str(mc.ModelInput.Format.Name(spec.format))


_GROUP_FIELDS = frozenset({"name", "kind", "count", "gpus", "passive"})
"""An instance group's fields `_instances` reads; the others tune Triton only (warned of)."""


CPU_INSTANCES = 2
"""The instances of a CPU instance group without a count, and of a config without groups, as
Triton gives an onnxruntime model (SetDefaultInstanceCount; model_configuration.md "CPU Model
Instance"): a model with no group gets one KIND_AUTO group, KIND_CPU on a machine without GPUs."""


def _instances(config: Any, source: str, warn: Warn) -> int:
    """How many instances the config's groups add up to; see `_group_instances`.

    NOTE: a config without groups, or a CPU group without a count, got 1 instance (duetime's
    default, and a count below 1 taken as 1) where Triton runs 2 (the pbtxt tester's
    instances.py); the config endpoint reports the count served."""
    groups = config.instance_group
    if not groups:
        return CPU_INSTANCES
    counts = [
        _group_instances(group, f"{source}: instance_group[{index}]", warn)
        for index, group in enumerate(groups)
    ]
    if not any(counts):
        raise ConfigError(f"{source}: instance_group: every group is passive, so no instance "
                          "would take requests; make one group not passive")  # fmt: skip
    return sum(counts)


def _group_instances(group: Any, where: str, warn: Warn) -> int:
    """The serving instances one instance group adds, as Triton counts them: a count below 1
    is Triton's default (`CPU_INSTANCES` for a CPU or kind-less group, 1 for a GPU one), a GPU
    group's count is per listed GPU, and a passive group adds none (Triton schedules no
    requests to its instances).

    NOTE: duetime runs on the CPU: a GPU group gets its Triton count of CPU instances, each a
    session with a thread of its own, and a warning saying how many."""
    ignored = sorted({f.name for f, _ in group.ListFields()} - _GROUP_FIELDS)
    if ignored:
        warn(f"{where}: {', '.join(ignored)}: Triton-only settings, no effect in duetime")
    cpu = group.kind in (mc.ModelInstanceGroup.KIND_AUTO, mc.ModelInstanceGroup.KIND_CPU)
    count: int = group.count if group.count >= 1 else CPU_INSTANCES if cpu else 1
    gpus = list(group.gpus)
    if group.kind == mc.ModelInstanceGroup.KIND_CPU and gpus:
        raise ConfigError(f"{where}.gpus: a KIND_CPU group names GPUs {gpus}; drop them or "
                          "make the group KIND_GPU")  # fmt: skip
    if group.kind == mc.ModelInstanceGroup.KIND_GPU:
        per = (f"{count} for each of gpus {gpus}, as Triton counts them" if gpus
               else "its count; Triton would run that many on each GPU")  # fmt: skip
        count *= max(len(gpus), 1)
        warn(f"{where}: KIND_GPU: GPU instances run on the CPU in duetime: {count} of them "
             f"({per})")  # fmt: skip
    if group.passive:
        warn(f"{where}: passive: Triton schedules no requests to a passive group's instances; "
             f"duetime adds none of its {count}")  # fmt: skip
        return 0
    return count


def _refuse_contradictions(batching: Any, max_batch_size: int | None, source: str) -> None:
    """What Triton refuses of `dynamic_batching` against the rest of the config (its
    ValidateModelConfig), in Triton's terms: duetime's own checks name duetime's settings
    (`scheduling.preferred_batch_size 4 is over max_batch_size 0`). `max_batch_size`: None
    where the graph gives it.

    NOTE: priority_levels without a default_priority_level is refused, as Triton refuses it:
    it was served with duetime's default level, 1."""
    levels, default = batching.priority_levels, batching.default_priority_level
    where = f"{source}: dynamic_batching"
    if levels and not default:
        raise ConfigError(f"{where}.default_priority_level: not set; with priority_levels "
                          f"{levels} it must be in [1, {levels}], as Triton requires")  # fmt: skip
    if levels and default > levels:
        raise ConfigError(f"{where}.default_priority_level: {default} is beyond priority_levels "
                          f"{levels}")  # fmt: skip
    preferred = list(batching.preferred_batch_size)
    if preferred and min(preferred) < 1:
        raise ConfigError(f"{where}.preferred_batch_size: {min(preferred)}: each must be 1 or "
                          "more")  # fmt: skip
    if preferred and max_batch_size is not None and max(preferred) > max_batch_size:
        none = " (0: the model does not batch)" if max_batch_size == 0 else ""
        raise ConfigError(f"{where}.preferred_batch_size: {max(preferred)} is over "
                          f"max_batch_size {max_batch_size}{none}")  # fmt: skip


def _drop_unused_preferred(scheduling: dict[str, Any], source: str, warn: Warn) -> None:
    """Under the EDF policy, preferred batch sizes have no effect: warned of naming the
    Triton field, and left out (the scheduler would warn naming duetime's setting)."""
    policy = scheduling.get("policy", SchedulingConfig.model_fields["policy"].default)
    if policy != "edf" or not scheduling.get("preferred_batch_size"):
        return
    sizes = scheduling.pop("preferred_batch_size")
    warn(f"{source}: dynamic_batching.preferred_batch_size {sizes}: no effect under duetime's "
         f"EDF policy (batches are sized by due times); parameters['{SCHEDULING_POLICY}'] "
         "'fifo' batches as Triton does")  # fmt: skip


LONG_QUEUE_DELAY_US = 10_000_000
"""A `max_queue_delay_microseconds` over this (10 s) is taken, as Triton takes any, with a
warning: a request may wait that long for its batch to fill."""


def _warn_long_delay(delay_us: int, field: str, warn: Warn) -> None:
    """Warn of a queue delay over `LONG_QUEUE_DELAY_US`, in any form of config (`field`: the
    source and the field, as its writer named it).

    NOTE: a config.pbtxt's was warned of, the same in config.toml or a load request's JSON
    (`scheduling.max_queue_delay_us`) was not (found by a tester)."""
    if delay_us > LONG_QUEUE_DELAY_US:
        warn(f"{field}: {delay_us} ({delay_us / 1e6:g} s): a request with no due time may wait "
             "that long for its batch to fill")  # fmt: skip


def _warn_queue_bounded(batching: Any, source: str, warn: Warn) -> None:
    """NOTE: Triton's `max_queue_size` 0 (unset, or no `dynamic_batching`) is no maximum;
    duetime keeps its queues bounded by design and served such a model with a bound of 1024
    without a word: a burst beyond it was refused where Triton queues it (the tconfig tester's
    repro_queue_cap.py). The bound stays; the load says so (the config endpoint reports it)."""
    where = "dynamic_batching.default_queue_policy.max_queue_size"
    per = " in all, over every priority level" if batching.priority_levels else ""
    warn(f"{source}: {where}: not set (0), which Triton takes as no maximum (an unbounded "
         f"queue); duetime keeps queues bounded: at most {DEFAULT_QUEUE_SIZE} queued requests"
         f"{per} (scheduling.max_queue_size), beyond which requests are refused at once (HTTP "
         f"429 / RESOURCE_EXHAUSTED); set {where} to choose the bound")  # fmt: skip


def _priority_queue_policy(batching: Any, source: str, warn: Warn) -> None:
    """NOTE: Triton refuses a `priority_queue_policy` key outside [1, priority_levels]
    (ValidateModelConfig); duetime took any. Its policies were dropped under a warning calling
    them "Triton-only settings ... (it sizes batches by due times)": they are per-level queue
    bounds and timeouts, which duetime does not have (one `default_queue_policy` for all)."""
    keys = sorted(batching.priority_queue_policy)
    if not keys:
        return
    where = f"{source}: dynamic_batching.priority_queue_policy"
    levels = batching.priority_levels
    outside = [key for key in keys if not 1 <= key <= levels]
    if levels and outside:
        raise ConfigError(f"{where}: key {outside[0]} is not a priority level; keys must be in "
                          f"[1, priority_levels] = [1, {levels}], as Triton requires")  # fmt: skip
    if not levels:
        warn(f"{where} (keys {keys}): ignored: without dynamic_batching.priority_levels every "
             "request is at one level")  # fmt: skip
        return
    warn(f"{where} (levels {keys}): per-priority queue policies are not supported; the "
         "default_queue_policy applies to every level")  # fmt: skip


def _dynamic_batching(batching: Any, out: dict[str, Any], source: str, warn: Warn) -> None:
    ignored = sorted({f.name for f, _ in batching.ListFields()} - _BATCHING_FIELDS)
    if ignored:
        warn(f"{source}: dynamic_batching: {', '.join(ignored)}: Triton-only settings, no effect "
             "in duetime")  # fmt: skip
    _priority_queue_policy(batching, source, warn)
    if batching.preserve_ordering:
        warn(f"{source}: dynamic_batching.preserve_ordering: not supported: duetime sends each "
             "answer as soon as its batch finishes (batches run in due-time order, several "
             "instances side by side), not held back to the order requests came in")  # fmt: skip
    scheduling: dict[str, Any] = out.setdefault("scheduling", {})
    scheduling["max_queue_delay_us"] = delay = batching.max_queue_delay_microseconds
    _warn_long_delay(delay, f"{source}: dynamic_batching.max_queue_delay_microseconds", warn)
    if batching.preferred_batch_size:
        scheduling["preferred_batch_size"] = list(batching.preferred_batch_size)
    if batching.HasField("default_queue_policy"):
        policy = batching.default_queue_policy
        if policy.max_queue_size and batching.priority_levels:
            # NOTE: Triton keeps a queue per priority level, each of this size (PriorityQueue::
            # Enqueue): 2 requests at level 1 and 2 at level 2 fit a max_queue_size of 2
            scheduling["max_queue_size_per_level"] = policy.max_queue_size
            scheduling["max_queue_size"] = min(
                MAX_QUEUE_SIZE, batching.priority_levels * policy.max_queue_size
            )
        elif policy.max_queue_size:
            scheduling["max_queue_size"] = policy.max_queue_size
        delay_action = policy.timeout_action == mc.ModelQueuePolicy.DELAY
        if policy.default_timeout_microseconds and not delay_action:
            out["default_timeout_ms"] = policy.default_timeout_microseconds / 1000
        if delay_action:
            # NOTE: the default timeout was made every request's due time, and refused at
            # admission where it could not be met: a DELAY model whose run outlasts it (Triton:
            # nothing refused, the timed-out run after the others) refused every request
            # (found by a tester)
            warn(f"{source}: dynamic_batching.default_queue_policy.timeout_action DELAY: Triton "
                 "fails no request for its default timeout (it runs timed-out requests after "
                 "the others), and duetime never runs a request past its due time, so the "
                 "default timeout sets none here; a request's own timeout still does")  # fmt: skip
    if not batching.default_queue_policy.allow_timeout_override:
        _warn_timeout_honoured(source, warn)


def _warn_timeout_honoured(source: str, warn: Warn) -> None:
    """NOTE: Triton's dynamic batcher ignores a request's own `timeout` unless the queue policy
    allows the override (false, its default, whether written or not: proto3 cannot tell);
    duetime honours it by design. It did so without a word, and the config endpoint said
    `allow_timeout_override: true` (the pbtxt tester's timeout_override.py). The warning read
    as if the file had set false: it now says the default is false (a tester)."""
    warn(f"{source}: dynamic_batching.default_queue_policy.allow_timeout_override is false "
         "(Triton's default where the file does not set it): Triton would ignore a request's "
         "own timeout; duetime honours it (in place of the model's default, shorter or "
         "longer), so the config endpoint reports allow_timeout_override true")  # fmt: skip


def _priority(batching: Any, out: dict[str, Any]) -> None:
    """The priority levels of `batching` (a model without `dynamic_batching` has none).

    NOTE: as Triton (InferenceRequest::SetPriority): a priority above the model's
    `priority_levels` is its default level, and with none (0) every request is at that one
    level, in arrival order. duetime's `priority_levels` 0 means any level: requests that asked
    for priority 1 were served ahead of those before them (the pbtxt tester's prio_order.py)."""
    scheduling: dict[str, Any] = out.setdefault("scheduling", {})
    if not batching.priority_levels:
        scheduling["ignore_priority"] = True  # (a duetime model's, read back: see ANY_PRIORITY)
        return
    scheduling["priority_levels"] = batching.priority_levels
    if batching.default_priority_level:
        scheduling["default_priority_level"] = batching.default_priority_level


def _version_policy(policy: Any) -> dict[str, Any]:
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return {"all": {}}
    if choice == "specific":
        return {"specific": {"versions": list(policy.specific.versions)}}
    if choice == "latest":  # (`latest: {}` too: 0 versions, refused by validation as in Triton)
        return {"latest": {"num_versions": policy.latest.num_versions}}
    return {"latest": {"num_versions": 1}}  # (no policy: Triton's default)


def _integer(value: str, field: str, source: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{source}: {field}: expected an integer, got '{value}'") from None
