"""Typed settings, validated once: the model config (config.toml / config.yaml) and the server's."""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
import tomllib
import typing
import unicodedata
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from duetime.errors import ConfigError
from duetime.repository.layout import MODEL_FILENAME

log = logging.getLogger(__name__)

V2Datatype = Literal[
    "BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
    "FP16", "FP32", "FP64", "BF16", "BYTES",
]  # fmt: skip

InputFormat = Literal["FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"]
"""An input's layout, as Triton's model_config.proto names them (`ModelInput.Format`)."""

PRIMARY_VARIANT = "default"
"""The variant name of a version's own `model.onnx` (repository.registry.PRIMARY): reserved,
no `[[variants]]` entry may take it."""

CONFIG_FILENAMES = ("config.toml", "config.yaml", "config.yml", "config.pbtxt")
"""A model's config file: duetime's own (TOML or YAML) or Triton's (see tritonconfig.py)."""


MAX_TIMEOUT_MS = 2**64 / 1000
"""The longest `default_timeout_ms`: Triton's form of it, microseconds in a uint64 (every uint64
of a Triton config fits; the config endpoints clamp to the largest). NOTE: 1e20 passed, and the
model's config endpoint answered 500 (HTTP) and UNKNOWN (gRPC) for good."""


class _Strict(BaseModel):
    # NOTE: strict types: `max_batch_size = true` or `"4"` in a model config is a mistake to
    # report, not a value to coerce. ServerSettings relaxes this: its values arrive as text.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


DIM_RULE = "a dim must be 1 or more, -1 for a free dim, or 0 where the graph's dim is 0"
"""What a config's dims may be (the message of a dim refused)."""


def _declared_dim(dim: int) -> int:
    """A dim a config declares: 1 or more, -1 for a free one, or 0 where the graph's is 0.

    NOTE: Triton refuses 0 (model_config_utils ValidateIOShape), and so did duetime; but a
    graph with a fixed 0 dim loads and serves (ONNX Runtime runs its empty tensors), the model
    config reports that 0, and the config got from the server must load back (get, edit, load).
    So 0 parses here and the load refuses it unless the graph's dim is 0 too (loader._narrow):
    a 0 anywhere else would refuse every request that carries data."""
    if dim < -1:
        raise ValueError(DIM_RULE)
    return dim


class TensorConfig(_Strict):
    """An input or output declared in the config; checked against the ONNX graph at load."""

    name: str = Field(min_length=1)
    datatype: V2Datatype | None = None
    """The v2 datatype; read from the graph when omitted."""
    dims: list[Annotated[int, AfterValidator(_declared_dim)]] | None = None
    """The shape without the batch dim (as Triton's `dims`); each 1 or more, -1 for a free
    dim, or 0 where the graph's dim is 0 (a tensor that is always empty)."""
    reshape: list[int] | None = None
    """The shape the graph takes (an output: gives) without the batch dim, where requests and
    answers carry `dims` (Triton's `reshape`): dims [1] with reshape [] takes [batch, 1] from
    requests, runs the graph on [batch], and answers [batch, 1]. As many elements as `dims`;
    dims of 1 or more in both (no free dims)."""
    labels: str | None = Field(default=None, min_length=1)
    """An output's class labels: a file in the model's folder or a folder below it
    (`labels/classes.txt`; not a path leaving it), one label a line, the label of class i on
    line i (Triton's `label_filename`); classification answers then read `value:index:label`."""
    optional: bool = False
    """An input requests may leave out (Triton's `optional`). Only a graph input with an
    initializer can be: ONNX Runtime runs on that default. Such inputs are optional whether
    the config says so or not; on any other input this has no effect (with a warning)."""
    format: InputFormat = "FORMAT_NONE"
    """An input's image layout (Triton's `format`): `FORMAT_NHWC` or `FORMAT_NCHW` for an
    image of 3 dims besides the batch's (checked at load, against the graph's where `dims` is
    not given), `FORMAT_NONE` for any other tensor. It describes the input and changes nothing
    in how it is served: the model config reports it, for clients that lay out their images by
    it (Triton's image_client refuses a model whose image input has none). An output has no
    format."""

    @model_validator(mode="after")
    def _reshape_fits(self) -> TensorConfig:
        if self.reshape is None:
            return self
        if self.dims is None:
            raise ValueError("a reshape needs dims: the shape requests and answers carry")
        if min((*self.dims, *self.reshape), default=1) < 1:
            raise ValueError(
                f"dims {self.dims} with reshape {self.reshape}: dims must be 1 or more in both "
                "(free dims with a reshape are not supported)"
            )
        if math.prod(self.dims) != math.prod(self.reshape):
            raise ValueError(
                f"dims {self.dims} and reshape {self.reshape} hold different numbers of elements"
            )
        return self


MAX_QUEUE_SIZE = 1_000_000
"""The largest `scheduling.max_queue_size`."""


class SchedulingConfig(_Strict):
    """How requests for one model are queued and batched."""

    policy: Literal["edf", "fifo"] = "edf"
    """`edf`: earliest due time first; `fifo`: arrival order (Triton-style batcher)."""
    max_queue_delay_us: int = Field(default=0, ge=0, le=2**64 - 1)
    """The longest a request waits for others to join its batch. A due time cuts it short: the
    batch starts in time to finish by it, with its margins and some slack for the loop's timers
    (`scheduler.WAKE_SLACK_NS`), in either policy.
    NOTE: any length, as Triton's `max_queue_delay_microseconds` (a uint64): a long one is the
    model owner's choice (a Triton config.pbtxt with one is warned of, see tritonconfig.py)."""
    max_queue_size: int = Field(default=1024, ge=1, le=MAX_QUEUE_SIZE)
    """Requests queued beyond this are rejected at once (HTTP 429 / RESOURCE_EXHAUSTED)."""
    max_queue_size_per_level: int = Field(default=0, ge=0, le=MAX_QUEUE_SIZE)
    """The most requests one priority level may queue, within `max_queue_size`; beyond it,
    that level's requests are rejected as for a full queue (0: no bound of its own). Triton's
    `default_queue_policy.max_queue_size` with `priority_levels` set: a queue per level."""
    delivery_margin_us: int = Field(default=300, ge=0, le=10_000_000)
    """Part of every due time kept for getting the answer to the client (encoding, the network,
    the client reading it): batches are planned to finish this long before the due time."""
    exec_margin: float = Field(default=0.5, ge=0.0, le=10.0)
    """Further margin as a share of the batch's predicted execution time: long batches vary more
    in absolute terms (other work on the core, memory traffic), so they keep more in hand."""
    default_priority_level: int = Field(default=1, ge=1, le=1_000_000)
    """The level of requests that send priority 0 or none (1 is served first, as Triton)."""
    priority_levels: int = Field(default=0, ge=0, le=1_000_000)
    """How many levels requests may ask for (0: any). With levels set, a request asking for
    a level beyond them gets the default level, as Triton's `priority_levels`."""
    ignore_priority: bool = False
    """Every request is at one level, whatever priority it asks for: Triton's meaning of no
    `priority_levels` (a config.pbtxt without them is read so). Sets both settings above to 1;
    the model's config endpoint shows `priority_levels` 0, as Triton's."""
    preferred_batch_size: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list)
    """FIFO mode, as Triton's: batches grow to the largest of these at most, and one that
    reached any of them starts at once when no more requests are queued (no window wait).
    EDF mode sizes batches by due times and ignores them."""

    @model_validator(mode="before")
    @classmethod
    def _one_level(cls, data: object) -> object:
        """`ignore_priority`: one level, 1, which every priority maps to (the scheduler's rule
        for a level beyond `priority_levels`)."""
        if not (isinstance(data, dict) and data.get("ignore_priority") is True):
            return data
        given = [data[key] for key in ("priority_levels", "default_priority_level") if key in data]
        if any(value != 1 for value in given):
            raise ValueError(
                "ignore_priority puts every request at one level: leave priority_levels and "
                "default_priority_level out"
            )
        return {**data, "priority_levels": 1, "default_priority_level": 1}

    @model_validator(mode="after")
    def _levels(self) -> SchedulingConfig:
        if self.priority_levels and self.default_priority_level > self.priority_levels:
            raise ValueError(
                f"default_priority_level {self.default_priority_level} is beyond "
                f"priority_levels {self.priority_levels}"
            )
        return self


class BreakerConfig(_Strict):
    """When an instance stops taking work (see resilience/breaker.py)."""

    failures: int = Field(default=5, ge=1, le=1_000_000)
    """Executions in a row that failed for every request in them open the breaker."""
    slow_factor: float = Field(default=10.0, gt=1.0)
    """An execution is slow when it takes this many times its latency profile's prediction..."""
    slow_min_us: int = Field(default=5_000, ge=0)
    """...and at least this long (short runs vary too much in relative terms)."""
    slow_executions: int = Field(default=5, ge=1, le=1_000_000)
    """Slow executions in a row that open the breaker."""
    open_s: float = Field(default=5.0, gt=0, le=3600)
    """How long an open breaker refuses work before it lets a probe through."""
    max_open_s: float = Field(default=60.0, gt=0, le=86_400)
    """Each failed probe doubles the open period, up to this."""
    probes: int = Field(default=1, ge=1, le=1000)
    """Good executions while half-open that close the breaker."""

    @model_validator(mode="after")
    def _open_within_its_bound(self) -> BreakerConfig:
        """NOTE: `open_s = 100` with `max_open_s = 10` was taken: the breaker first stayed
        open 100 s, ten times its stated bound, and after a failed probe 10 s, the doubling
        shrinking it (found by a tester). Refused, as a default level beyond the levels is.
        An open_s left to its default starts at max_open_s where that is lower: a config giving
        max_open_s = 3 alone was refused for the default's 5 (found by a tester)."""
        if self.open_s > self.max_open_s and "open_s" not in self.model_fields_set:
            object.__setattr__(self, "open_s", self.max_open_s)  # (frozen: set as it is made)
        if self.open_s > self.max_open_s:
            raise ValueError(
                f"open_s {self.open_s:g} is over max_open_s {self.max_open_s:g}: the open "
                "period starts at open_s and doubles up to max_open_s; lower open_s or raise "
                "max_open_s"
            )
        return self


class LatestVersions(_Strict):
    num_versions: int = Field(default=1, ge=1, le=1_000)
    """How many of the highest versions to serve."""


class SpecificVersions(_Strict):
    versions: list[Annotated[int, Field(ge=0, le=2**63 - 1)]] = Field(min_length=1)
    """Versions are int64s, as Triton's (and as gRPC's ModelConfig carries them)."""


class VersionPolicy(_Strict):
    """Which versions found on disk are served, as Triton's `version_policy`: one of
    `latest = { num_versions = N }` (the default, N = 1), `all = {}`, or
    `specific = { versions = [1, 3] }`."""

    latest: LatestVersions | None = None
    all: dict[str, Any] | None = None
    specific: SpecificVersions | None = None

    @model_validator(mode="after")
    def _one_choice(self) -> VersionPolicy:
        chosen = [n for n in ("latest", "all", "specific") if getattr(self, n) is not None]
        if len(chosen) > 1:
            raise ValueError(f"choose one of latest, all, specific; got {', '.join(chosen)}")
        if self.all:
            raise ValueError("'all' takes no settings: write all = {}")
        return self

    def select(self, available: Iterable[int]) -> list[int]:
        """The versions to serve out of those `available`, highest first."""
        found = sorted(set(available), reverse=True)
        if self.all is not None:
            return found
        if self.specific is not None:
            return [v for v in found if v in set(self.specific.versions)]
        latest = self.latest.num_versions if self.latest is not None else 1
        return found[:latest]

    def missing(self, available: Iterable[int]) -> list[int]:
        """The versions a `specific` policy names that are not `available` (no such version
        folder), lowest first; none for the other policies.

        NOTE: `select` passes them over, as Triton serves the others; Triton also logs "version
        5 is specified for model 'm', but the version directory is not present" (its
        VersionsToLoad), where duetime said nothing (see repository/manager.py `_sync`)."""
        if self.specific is None:
            return []
        return sorted(set(self.specific.versions) - set(available))


class VariantQuality(_Strict):
    """How a variant's answers compare with the primary model's (written by `duetime optimize`)."""

    max_abs_error: float = Field(ge=0, allow_inf_nan=True)  # (inf: NaN in an answer)
    """Largest absolute difference of any output element over the sample set."""
    argmax_agreement: float = Field(ge=0, le=1)
    """Share of samples whose argmax (over the last axis of the first output) matches."""
    samples: int = Field(ge=1)


class VariantSpeed(_Strict):
    """The variant's measured execution time beside the primary's (written by `duetime
    optimize`); routing reads the live latency profile, not these figures."""

    batch_1_us: float = Field(gt=0)
    primary_batch_1_us: float = Field(gt=0)
    max_batch_us: float | None = Field(default=None, gt=0)
    primary_max_batch_us: float | None = Field(default=None, gt=0)


class VariantConfig(_Strict):
    """A cheaper stand-in for the model: another ONNX file in each version folder, taking the
    same inputs and giving the same outputs (an fp16 or int8 copy, or a smaller model).

    Variants are listed best first; a request goes to the primary model when its predicted
    finish meets its due time, else to the first variant whose predicted finish does."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Named in answers (response parameter `variant`) and metrics; not PRIMARY_VARIANT."""
    file: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """File name inside each version folder (no folders); a version without it serves without
    this variant."""
    kind: Literal["fp16", "int8-dynamic", "int8-static", "model"] = "model"
    quality: VariantQuality | None = None
    speed: VariantSpeed | None = None

    @field_validator("name", mode="after")
    @classmethod
    def _not_the_primarys(cls, name: str) -> str:
        """NOTE: a variant named "default" was served, and answers said `variant: default`
        whether model.onnx or the variant computed them (metrics and statistics merged too)."""
        if name == PRIMARY_VARIANT:
            raise ValueError(
                f"'{PRIMARY_VARIANT}' is the name answers, statistics and metrics give the "
                "version's own model.onnx; give the variant another name"
            )
        return name


class TrafficConfig(_Strict):
    """How requests that name no version are spread over the served versions."""

    weights: dict[str, Annotated[float, Field(ge=0, le=1e9)]] | None = None
    """Version -> weight (A/B split; relative, each at most 1e9); versions not listed get none.
    Default: all to the highest. A weighted version that is not served gets none (warned of at
    load)."""
    sticky_key: str | None = Field(default=None, min_length=1, max_length=128)
    """A request parameter, HTTP header or gRPC metadata key whose value pins a client to a
    version (rendezvous hashing over the weights)."""
    shadow: dict[str, Annotated[float, Field(ge=0, le=1)]] | None = None
    """Version -> share of requests mirrored to it; its answers are compared, never returned."""

    @field_validator("weights", "shadow", mode="before")
    @classmethod
    def _integer_keys(cls, table: object) -> object:
        """A YAML or JSON table's integer keys as the versions they name (`{1: 70, 2: 30}`).

        NOTE: YAML reads `weights: {1: 70, 2: 30}` with integer keys, and they were refused
        "Input should be a valid string" though TOML's `{ 1 = 70 }` is taken (found by a
        tester). A bool key is no version, and is left for the check to refuse."""
        if isinstance(table, dict) and any(type(key) is int for key in table):
            return {str(k) if type(k) is int else k: v for k, v in table.items()}
        return table

    @field_validator("weights", "shadow", mode="after")
    @classmethod
    def _versions_are_integers(
        cls, table: dict[str, float] | None, info: ValidationInfo
    ) -> dict[str, float] | None:
        """Keys as the versions they name: "01" is version "1" (as a request's version is)."""
        if table is None:
            return None
        versions: dict[str, float] = {}
        for key, value in table.items():
            if not (key.isascii() and key.isdigit() and len(key) <= 20):
                raise ValueError(f"version '{key}' is not an integer version")
            version = str(int(key))
            if version in versions:
                raise ValueError(f"version {version} is given twice ('{key}')")
            versions[version] = value
        if info.field_name == "weights" and not any(w > 0 for w in versions.values()):
            raise ValueError("at least one version needs a weight above 0")
        return versions


_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}")


class ModelConfig(_Strict):
    """`<repo>/<model>/config.toml`: every field is optional."""

    platform: Literal["onnxruntime_onnx"] = "onnxruntime_onnx"
    default_model_filename: str = MODEL_FILENAME
    """The model file in each version folder (Triton's field of that name): a file, or a
    folder holding `model.onnx` beside the model's external data."""
    max_batch_size: int | None = Field(default=None, ge=0, le=65_536)
    """Largest batch one execution takes; 0 disables batching. Default: 32 when the graph's
    first dim is free on every input and output, else 0."""
    instances: int = Field(default=1, ge=1, le=64)
    """ONNX Runtime sessions (each with its own thread) sharing the model's queue."""
    execution: Literal["auto", "thread", "inline"] = "auto"
    """`thread`: each instance runs on a thread of its own, and the event loop never waits for
    ONNX Runtime. `inline`: the one instance runs on the event loop itself: no hand-off to a
    thread and back (tens of µs on a VM, more than a tiny model's whole run), but the loop waits
    for every batch; needs `instances = 1`. `auto` (default): inline when the model has one
    instance and its load-time profile says batch 1 takes at most 100 µs and its largest batch at
    most 500 µs (see repository/loader.py `runs_inline`), else thread; a shadow version always
    runs on a thread."""
    intra_op_threads: int = Field(default=1, ge=0, le=256)
    """Threads ORT uses inside one operator; 0 lets ORT choose."""
    inter_op_threads: int = Field(default=1, ge=1, le=256)
    default_timeout_ms: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_MS)
    """Due time of the requests that bring none of their own (a `timeout` parameter, a gRPC
    deadline): a request's own, shorter or longer, is honoured in its place; none by default
    (no deadline)."""
    scheduling: SchedulingConfig = SchedulingConfig()
    inputs: list[TensorConfig] | None = None
    outputs: list[TensorConfig] | None = None
    version_policy: VersionPolicy = VersionPolicy()
    breaker: BreakerConfig = BreakerConfig()
    variants: list[VariantConfig] = []
    traffic: TrafficConfig = TrafficConfig()

    @field_validator("scheduling", mode="before")
    @classmethod
    def _policy_shorthand(cls, value: object) -> object:
        """`scheduling = "fifo"` is short for `[scheduling] policy = "fifo"`: the natural
        spelling when the policy is all a model sets (it was refused with "Input should be a
        valid dictionary or instance of SchedulingConfig"). Other strings are refused by
        `policy`, naming the choices."""
        return {"policy": value} if isinstance(value, str) else value

    @field_validator("default_model_filename", mode="after")
    @classmethod
    def _a_name_in_the_version_folder(cls, name: str) -> str:
        if not _FILE_NAME.fullmatch(name):
            raise ValueError(
                "expected the name of a file (or folder) in each version folder: up to 255 "
                "letters, digits, '_', '.' and '-', not starting with '.'"
            )
        return name

    @field_validator("inputs", "outputs", mode="after")
    @classmethod
    def _tensors_named_once(cls, tensors: list[TensorConfig] | None) -> list[TensorConfig] | None:
        """NOTE: refused, as Triton refuses it: of two entries for one tensor, one would win
        without a word (the later), and the config would not say what is served."""
        # (counted in one pass: `names.count` per name took 5 s of the loader's thread for
        # 20,000 inputs, and minutes for 87,000; found by a tester)
        counts = Counter(tensor.name for tensor in tensors or ())
        repeated = sorted(name for name, count in counts.items() if count > 1)
        if repeated:
            listed = ", ".join(f"'{name}'" for name in repeated)
            raise ValueError(f"{listed} listed more than once; list each tensor once")
        return tensors

    @model_validator(mode="after")
    def _inline_is_one_instance(self) -> ModelConfig:
        if self.execution == "inline" and self.instances != 1:
            raise ValueError(
                f"execution 'inline' runs the model on the event loop, so it has one instance; "
                f"got instances = {self.instances}"
            )
        return self

    @model_validator(mode="after")
    def _preferred_fit(self) -> ModelConfig:
        preferred = self.scheduling.preferred_batch_size
        if preferred and self.max_batch_size is not None and max(preferred) > self.max_batch_size:
            raise ValueError(
                f"scheduling.preferred_batch_size {max(preferred)} is over max_batch_size "
                f"{self.max_batch_size}"
            )
        return self

    @model_validator(mode="after")
    def _unique_variants(self) -> ModelConfig:
        names = [v.name for v in self.variants]
        files = [v.file for v in self.variants]
        for what, values in (("name", names), ("file", files)):
            repeated = sorted({x for x in values if values.count(x) > 1})
            if repeated:
                raise ValueError(f"variants: {what} {', '.join(repeated)} appears more than once")
        if self.default_model_filename in files:
            raise ValueError(
                f"variants: '{self.default_model_filename}' is the primary model, not a variant"
            )
        return self


def describe_validation_error(
    source: str,
    error: ValidationError,
    secrets: Collection[str] = (),
    *,
    field_name: Callable[[tuple[int | str, ...]], str] | None = None,
    show_sections: bool = True,
    schema: type[BaseModel] | None = None,
) -> str:
    """One line per problem: the file, the field (its dotted path, or what `field_name` calls
    it), what was expected, what came (of the fields named in `secrets`, only the length of
    what came: it may be a credential; with `show_sections` false, nothing of a whole mapping
    or list). `schema`: the model validated, whose fields name what an unknown key may have
    meant (see `unknown_key_hint`)."""
    lines = []
    for item in error.errors():
        loc = item["loc"]
        where = field_name(loc) if field_name else ".".join(map(str, loc)) or "(top level)"
        given = item["input"]
        if item["type"] == "missing" or (not show_sections and isinstance(given, dict | list)):
            got = ""
        elif item["loc"][:1] and item["loc"][0] in secrets:
            got = f" (got {len(given)} characters)" if isinstance(given, str) else ""
        else:
            got = f" (got {_shown_input(given)})"
        message = item["msg"]
        if not loc and item["type"] == "value_error":
            # (a check of several fields together: its message names them)
            lines.append(f"{source}: {message.removeprefix('Value error, ')}")
            continue
        if item["type"] in _BOUNDS and isinstance(given, float) and math.isnan(given):
            # NOTE: NaN fails every bound (its comparisons are false): "should be less than or
            # equal to 1000000000 (got nan)" named a bound NaN does not exceed
            message = "Input should be a finite number"
        hint = ""
        if item["type"] == "extra_forbidden" and schema is not None:
            hint = unknown_key_hint(schema, loc)
        lines.append(f"{source}: field '{where}': {message}{got}{hint}")
    return "; ".join(lines)


def unknown_key_hint(schema: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """What the unknown key at `loc` (a path through `schema`'s tables) may have meant: the
    table it is a setting of, where it is one elsewhere; else the nearest setting's name, in
    its own table first ('' where none is near).

    NOTE: "Extra inputs are not permitted" was all a misspelt key (`max_batch`,
    `[breaker] failure`) or one in the wrong table (`max_queue_delay_us` at the top level)
    got, where a misspelt `DUETIME_*` variable is told the one meant (found by a tester)."""
    key, table = loc[-1], _table_at(schema, loc[:-1])
    if not isinstance(key, str) or table is None:
        return ""
    settings = _settings_of(schema)
    homes = [path[:-1] for path in settings if path[-1] == key]
    if homes:
        if () in homes:
            here = ".".join(part for part in loc[:-1] if isinstance(part, str))
            return f"; '{key}' is a top-level setting, not one of '{here}'"
        tables = " or ".join(f"'{'.'.join(home)}'" for home in homes)
        return f"; '{key}' is a setting of {tables}: write it there"
    near = difflib.get_close_matches(key, list(table.model_fields), n=1, cutoff=0.6)
    if near:
        return f"; did you mean '{near[0]}'?"
    dotted = {".".join(path): path[-1] for path in settings}
    near = difflib.get_close_matches(key, list(dotted.values()), n=1, cutoff=0.6)
    meant = [name for name, last in dotted.items() if near and last == near[0]]
    return f"; did you mean '{meant[0]}'?" if meant else ""


def _table_at(schema: type[BaseModel], path: Iterable[int | str]) -> type[BaseModel] | None:
    """The model of the table at `path` in `schema` (list indexes skipped); None where the
    path leads to no table of settings."""
    table: type[BaseModel] | None = schema
    for part in path:
        if isinstance(part, int):
            continue
        field = table.model_fields.get(part) if table is not None else None
        table = _model_in(field.annotation) if field is not None else None
    return table


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The settings model an annotation holds (`list[TensorConfig] | None`: TensorConfig)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        found = _model_in(argument)
        if found is not None:
            return found
    return None


def _settings_of(schema: type[BaseModel]) -> list[tuple[str, ...]]:
    """Every setting of `schema` and of its tables, as paths (`('scheduling', 'policy')`)."""
    paths: list[tuple[str, ...]] = []
    for name, field in schema.model_fields.items():
        paths.append((name,))
        inner = _model_in(field.annotation)
        if inner is not None:
            paths += [(name, *path) for path in _settings_of(inner)]
    return paths


def _shown_input(given: Any) -> str:
    """`given` as an error shows it: its repr.

    NOTE: a load request's JSON may nest lists a thousand levels deep (orjson's limit), and
    their repr raised RecursionError: the load answered 500."""
    try:
        return repr(given)
    except RecursionError:
        return f"a {type(given).__name__} nested too deeply to show"


_BOUNDS = frozenset(
    ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number")
)
"""pydantic's error types of a number out of its bounds."""


class _UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]  # (PyYAML: untyped)
    """YAML's safe loader, refusing a mapping that gives a key twice.

    NOTE: `yaml.safe_load` kept the last of two `max_batch_size:` (or two `scheduling:` blocks,
    losing the first one's settings) without a word, where TOML and protobuf's text format
    refuse the same mistake naming the line. Keys merged in with `<<` may still be overridden,
    as YAML allows."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # (an unhashable key: the base class refuses it)
                    continue
                if first is not key_node:
                    raise yaml.YAMLError(
                        f"line {key_node.start_mark.line + 1}: key {key!r} given again (first "
                        f"on line {first.start_mark.line + 1}); keep one"
                    )
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


BOM = "\ufeff"
"""A UTF-8 byte order mark, as Windows editors start a file with one: not part of the config."""


def utf8_text(data: bytes, *, source: str) -> str:
    """The text of a config file's bytes `data`: UTF-8, a leading byte order mark left out.
    ConfigError naming the line and column (from 1) of the first byte that is not UTF-8.

    NOTE: a config.toml saved with a byte order mark (as Notepad saves it) was refused as
    "Invalid statement (at line 1, column 1)", where config.pbtxt and config.yaml skip it, and
    a Latin-1 byte was refused as "can't decode byte 0xf6 in position 4", with no line (found
    by a tester). TOML and YAML are UTF-8 throughout, comments too: the byte is refused."""
    try:
        return data.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        start = data.rfind(b"\n", 0, exc.start) + 1
        before = data[start : exc.start].decode("utf-8").removeprefix(BOM)
        raise ConfigError(
            f"{source}: line {line}, column {len(before) + 1}: "
            f"byte 0x{data[exc.start]:02x} is not UTF-8; save the file as UTF-8"
        ) from None


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse a TOML or YAML file into a mapping, or raise ConfigError naming the file."""
    what = path.suffix[1:].upper()
    try:
        text = utf8_text(path.read_bytes(), source=f"{path}: cannot be read as {what}")
        data = (
            tomllib.loads(text)
            if path.suffix == ".toml"
            else yaml.load(text, Loader=_UniqueKeyLoader)  # (a SafeLoader)
        )
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(f"{path}: cannot be read as {what}: {_yaml_problem(exc)}") from exc
    except (OSError, tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot be read as {what}: {exc}") from exc
    except RecursionError:
        # NOTE: both parsers recurse per level of nesting: a small file of `x = [[[...]]]`
        # a few hundred levels deep raised RecursionError, which the server did not expect
        # (a start ended in a traceback, a load answered 500, polling stopped at the model)
        raise ConfigError(
            f"{path}: cannot be read as {what}: its values are nested too deeply (lists or "
            "tables within one another, hundreds of levels down)"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table of settings, got {type(data).__name__}")
    return data


def _yaml_problem(exc: yaml.MarkedYAMLError) -> str:
    """PyYAML's error on one line: where the problem is (line and column, from 1), what it is,
    and the construct it was in.

    NOTE: PyYAML's own text spans lines, each place named `in "<unicode string>"` and quoted
    with a caret under it; a log or an HTTP error showed its first line, "while parsing a flow
    sequence", with no place (found by a tester)."""

    def at(mark: Any) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    mark = exc.problem_mark or exc.context_mark
    text = f"{at(mark)}: " if mark is not None else ""
    text += exc.problem or exc.context or "not YAML"
    if exc.context and exc.problem:
        where = f" at {at(exc.context_mark)}" if exc.context_mark is not None else ""
        text += f" ({exc.context}{where})"
    return text


def find_config_file(model_dir: Path) -> Path | None:
    """The model's one config file (any of CONFIG_FILENAMES), None if it has none; ConfigError
    where the folder cannot be read.

    NOTE: a folder the server may not read (chmod 000) raised PermissionError through the
    startup scan (a traceback, no model served) and through a load request (500), and a poll
    logged its traceback every round (found by a tester)."""
    try:
        found = [model_dir / name for name in CONFIG_FILENAMES if (model_dir / name).exists()]
    except OSError as exc:
        raise ConfigError(f"{model_dir}: cannot be read: {exc.strerror or exc}") from None
    for path in found:
        if not path.is_file():  # (a folder of that name would leave the model on defaults)
            raise ConfigError(f"{path}: a config file's name, but not a file")
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ConfigError(f"{model_dir}: more than one config file ({names}); keep one")
    return found[0] if found else None


_CONFIG_SUFFIXES = frozenset({".toml", ".yaml", ".yml", ".pbtxt"})


def unread_config_files(model_dir: Path) -> list[Path]:
    """Files in `model_dir` (a model folder with none of CONFIG_FILENAMES) that look meant as
    its config but that duetime does not read: `Config.toml`, `config.json`, `config.toml.txt`,
    `model.toml`, or a config file in a version folder (`1/config.pbtxt`). Sorted.

    NOTE: such a file was ignored without a word and the model served on its graph's
    defaults, while a mistake inside `config.toml` is refused. A version folder's `.json` files
    are left alone: exporters put a `config.json` of their own beside `model.onnx`."""
    found: list[Path] = []
    try:
        for child in model_dir.iterdir():
            lowered = child.name.lower()
            if child.is_file() and (
                lowered.startswith("config.") or Path(lowered).suffix in _CONFIG_SUFFIXES
            ):
                found.append(child)
            elif child.is_dir() and child.name.isascii() and child.name.isdigit():
                found += [
                    file
                    for file in child.iterdir()
                    if Path(file.name.lower()).suffix in _CONFIG_SUFFIXES and file.is_file()
                ]
    except OSError:  # (a folder gone or unreadable: the load says so)
        return []
    return sorted(found)


def unread_config_warning(model_dir: Path) -> str | None:
    """What to warn of when `model_dir` has no config file but files that look meant as one
    (see `unread_config_files`); None when there are none."""
    unread = unread_config_files(model_dir)
    if not unread:
        return None
    shown = ", ".join(str(path.relative_to(model_dir)) for path in unread)
    names = f"{', '.join(CONFIG_FILENAMES[:-1])} or {CONFIG_FILENAMES[-1]}"
    return (
        f"{model_dir}: {shown}: not read (a model's config is its folder's {names}, named "
        "exactly so); the model serves on its defaults: rename the file meant as its config"
    )


def load_model_config(model_dir: Path) -> ModelConfig:
    """The model's config from `config.toml|yaml|yml` in `model_dir`, or the defaults (a Triton
    `config.pbtxt` is read by repository/tritonconfig.py, which has its schema)."""
    path = find_config_file(model_dir)
    if path is None:
        return ModelConfig()
    if path.suffix == ".pbtxt":
        raise ConfigError(f"{path}: read Triton configs with repository/tritonconfig.py")
    return parse_model_config(read_config_file(path), source=str(path), model_name=model_dir.name)


def name_difference(name: str, folder: str) -> str:
    """How a config's `name` differs from the model's `folder` name where the two print alike
    ('' where they do not): their code points, escaped.

    NOTE: a folder `café` written in NFD (`e` and a combining accent, as macOS and some
    archivers write names) with `name: "café"` in NFC was refused as "'café' differs from the
    model's folder 'café'" (found by a tester). It stays refused: Triton compares the two
    names byte for byte, and clients address the model by its folder's bytes, which a request
    naming it in NFC would not find; the message now shows the difference."""
    if unicodedata.normalize("NFC", name) == unicodedata.normalize("NFC", folder):
        how = "only in Unicode normalization, how their accented letters are encoded"
    elif not (name.isprintable() and folder.isprintable()):
        how = "in characters that do not print"
    else:
        return ""
    return (
        f" ({how}: the name is {name!a}, the folder {folder!a}; write the name as "
        "the folder has it, or leave it out)"
    )


def url_host(host: str) -> str:
    """`host` as a URL or a gRPC target writes it: an IPv6 literal in brackets (`[::1]:8001`;
    bare, `::1:8001` reads as an address with no port)."""
    return f"[{host}]" if ":" in host else host


ONNX_RUNTIME_ONLY = (
    "duetime serves ONNX models with ONNX Runtime (platform 'onnxruntime_onnx', backend "
    "'onnxruntime')"
)
"""Why a config naming another platform or backend is refused."""
ONNX_BACKENDS = frozenset({"", "onnxruntime"})
"""The `backend` of a model duetime serves: ONNX Runtime's, or none said (Triton's unset)."""


def parse_model_config(
    data: Mapping[str, Any], *, source: str, model_name: str | None = None
) -> ModelConfig:
    """The model config `data` says, in duetime's form. Triton's `name` and `backend` are
    taken too, checked as Triton checks them and left out: the name must be the model's,
    `model_name` (its folder's; None: not checked), the backend ONNX Runtime's.

    NOTE: the README lists `name` and `backend` among the fields both forms share, and a load
    request's JSON in duetime's form took them, but a config.toml or config.yaml with them was
    refused ("field 'name': Extra inputs are not permitted"): a config saved from that JSON,
    or one migrated from Triton, did not load (found by a tester)."""
    data = dict(data)
    backend = data.pop("backend", "")
    if not (isinstance(backend, str) and backend in ONNX_BACKENDS):
        raise ConfigError(f"{source}: backend: {backend!r}: {ONNX_RUNTIME_ONLY}")
    name = data.pop("name", model_name)
    if model_name is not None and name not in ("", model_name):  # ("": Triton's unset)
        if not isinstance(name, str):
            raise ConfigError(f"{source}: name: expected the model's name, '{model_name}' (its "
                              f"folder's), got {name!r}")  # fmt: skip
        raise ConfigError(f"{source}: name: '{name}' differs from the model's folder "
                          f"'{model_name}'{name_difference(name, model_name)}")  # fmt: skip
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(source, exc, schema=ModelConfig)) from exc


class ServerSettings(_Strict):
    """Settings of one server process: CLI flags, `DUETIME_*` variables, or defaults."""

    # (protected_namespaces: pydantic before 2.10 warned of every `model_*` field at import)
    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=False, protected_namespaces=(), allow_inf_nan=False
    )

    model_repository: Path | None = None
    host: str = "127.0.0.1"
    """A name or an address: IPv6 literals with or without brackets (`::1`, `[::1]`), `::` for
    every interface (IPv4 too where the OS makes IPv6 sockets dual stack, as Linux does)."""

    @field_validator("host", mode="after")
    @classmethod
    def _unbracketed(cls, value: str) -> str:
        """`[::1]` as `::1`: sockets take the bare address; URLs and gRPC add the brackets
        back (see `url_host`)."""
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        if not value:
            raise ValueError(
                "expected an address of this host (127.0.0.1; 0.0.0.0 or :: for every one)"
            )
        return value

    http_port: int = Field(default=8000, ge=0, le=65_535)
    """0 picks a free port."""
    grpc_port: int = Field(default=8001, ge=0, le=65_535)
    """0 picks a free port."""
    metrics: bool = True
    """Serve Prometheus metrics at `/metrics` on `metrics_port`."""
    metrics_port: int = Field(default=8002, ge=0, le=65_535)
    """0 picks a free port. When this is left at its default and the port is taken, the server
    runs without metrics (and logs why); a port that was asked for and is taken fails the
    start."""
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    max_json_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Largest JSON part of an HTTP inference request (JSON is decoded on the event loop, about
    15 ms a megabyte); bigger tensors must come as binary data (413 otherwise)."""
    max_json_answer_bytes: int = Field(default=256 * 1024 * 1024, ge=1024)
    """Largest HTTP inference answer to write as JSON, as estimated from its outputs' sizes and
    datatypes before it is encoded; a bigger one is refused (400, naming the output) with a
    pointer to binary data. A 1 GB JSON answer took 20 s and 4 GB of memory to make."""
    idle_timeout_s: float = Field(default=60.0, gt=0)
    """A keep-alive connection with no request in flight is closed after this long, and one
    whose client reads none of its answers for this long is dropped (nginx's `send_timeout`);
    a gRPC connection with no call for this long is ended (GOAWAY: its client reconnects)."""
    max_connections: int = Field(default=4096, ge=1)
    """Open HTTP connections; beyond this a new one is answered 503 and closed at once."""
    max_grpc_connections: int = Field(default=4096, ge=1, le=2**31 - 1)
    """Open gRPC connections; beyond this gRPC closes a new one at once. NOTE: there was no
    bound: a client holding 4,400 idle connections took every descriptor the server had, and
    no new HTTP or gRPC client was served until they closed (found by a tester)."""
    grpc_max_concurrent_streams: int = Field(default=0, ge=0, le=2**31 - 1)
    """Calls (HTTP/2 streams) one gRPC connection may have open at once (HTTP/2's
    SETTINGS_MAX_CONCURRENT_STREAMS). 0: gRPC's own bound (none). NOTE: with none, one client
    keeping 2,000 ModelInfer calls open on one channel beyond a model's queue (each refused at
    once and sent again) kept about 1,000 of them in gRPC's shared queue of calls not yet
    taken: every other client's gRPC calls waited 1-2 s behind them (found by a tester; 3 ms
    at 256, as over HTTP meanwhile). Not the default: gRPC's clients do not all hold calls
    back for it: tritonclient's with 2,000 async calls outstanding had 9-58% of them fail
    UNAVAILABLE (RST_STREAM 7, the stream refused), and one process's channels to one address
    share a connection, so its 257th long-lived stream waited for ever (a tester again)."""
    request_read_timeout_s: float = Field(default=10.0, gt=0)
    """An HTTP request's head must arrive within this long of its first byte, and its body
    must then keep coming at `min_body_rate_bytes_s` over each such period; a slower client
    (slowloris) is answered 408 and closed; a gRPC connection must finish its HTTP/2 handshake
    within this long, and a gRPC call's first request message must all come within this long of
    the call's start (else DEADLINE_EXCEEDED)."""
    min_body_rate_bytes_s: int = Field(default=64 * 1024, ge=1)
    max_inflight_bytes: int = Field(default=1024 * 1024 * 1024, ge=1024)
    """HTTP request body bytes held at once (being read, or waiting for their answer), with
    the bytes HTTP and gRPC requests read from shared memory (a request whose do not fit is
    refused, 429). Bodies up to this over `max_connections` always pass; a bigger one that does
    not fit waits, its connection paused (a chunked one is refused, 503)."""
    max_connection_inflight_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    """Body bytes of one connection's requests read and not yet answered, and what they read
    from shared memory (a gRPC connection's: that alone; a request whose do not fit is refused,
    429); beyond this the connection reads no further requests until some are answered. Its
    answers made and not yet read by the client count against it too: a request whose answer
    would not fit (at the size of the connection's last) waits unstarted until the client
    reads."""
    max_unsent_answer_bytes: int = Field(default=1024 * 1024 * 1024, ge=1024)
    """Bytes of big inference answers made and not yet read by their clients, over all
    connections (HTTP's and gRPC's counted apart, each within this): at or beyond it, requests
    whose answers may be big wait unstarted until clients read theirs."""
    shutdown_grace_s: float = Field(default=5.0, ge=0)
    """On SIGINT/SIGTERM, queued requests get this long to finish."""
    max_grpc_message_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=2**31 - 1)
    """Largest gRPC message, received or sent: a bigger request is refused by gRPC itself, a
    bigger answer is refused (RESOURCE_EXHAUSTED, in a stream its error_message) before it is
    sent. Triton's limit is 2 GiB - 1; answers this size want shared-memory outputs."""
    grpc_keepalive_time_ms: int = Field(default=7_200_000, ge=1, le=2**31 - 1)
    """Triton's `--grpc-keepalive-time`: after this long without activity on a gRPC
    connection the server pings the client (gRPC's server default, 2 hours)."""
    grpc_keepalive_timeout_ms: int = Field(default=20_000, ge=1, le=2**31 - 1)
    """Triton's `--grpc-keepalive-timeout`: a connection whose client does not answer the
    server's ping within this long is closed."""
    grpc_keepalive_permit_without_calls: bool = False
    """Triton's `--grpc-keepalive-permit-without-calls`: take clients' keepalive pings on a
    connection with no call open at `grpc_http2_min_recv_ping_interval_without_data_ms`, not
    once per 2 hours (gRPC's policy for such pings)."""
    grpc_http2_max_pings_without_data: int = Field(default=2, ge=0, le=2**31 - 1)
    """Triton's `--grpc-http2-max-pings-without-data`: pings the server sends while it sends
    no data (0: no limit)."""
    grpc_http2_min_recv_ping_interval_without_data_ms: int = Field(
        default=300_000, ge=0, le=2**31 - 1
    )
    """Triton's `--grpc-http2-min-recv-ping-interval-without-data`: while the server sends no
    data, a client's ping sooner than this after its last is a bad ping (a strike). A client
    whose keepalive pings come every second on an idle stream needs at most 1000 here."""
    grpc_http2_max_ping_strikes: int = Field(default=2, ge=0, le=2**31 - 1)
    """Triton's `--grpc-http2-max-ping-strikes`: bad pings tolerated before the server closes
    the connection (GOAWAY `too_many_pings`); 0: any number."""
    grpc_infer_response_compression_level: Literal["none", "low", "medium", "high"] = "none"
    """Triton's `--grpc-infer-response-compression-level`: the gRPC compression level of
    answers, gRPC choosing the algorithm among those the client accepts (`none`: none)."""
    cpus: str = "auto"
    """CPUs to run on: `auto` (all this process may use), `none` (no pinning), or a list like
    `0,2-3`. The event loop is pinned to the first; small models' instances share it, big
    models' instances get the others (see execution/affinity.py)."""
    busy_poll_us: int = Field(default=0, ge=0, le=1_000_000)
    """After a read, the event loop keeps polling (a busy core) this long before it sleeps, so
    that a client's next request is read without waking the core (see loops.BusyPoll). 0: off."""
    cpu_dma_latency_us: int | None = Field(default=None, ge=0, le=2**31 - 1)
    """While serving, hold this limit on how long an idle CPU may take to wake up (Linux PM QoS,
    `/dev/cpu_dma_latency`, every CPU of the machine; needs root). 0: idle CPUs poll instead of
    halting, so a request finds its core awake (see execution/affinity.py `CpuLatencyLimit`).
    None: the system's own idle policy."""
    overload_utilization: float = Field(default=0.85, ge=0.0, le=1.0)
    """Above this share of the event loop's time spent busy, while more than 20% of requests are
    failing their due times (`overload.MISSED_SHARE`), a growing share of new requests is
    refused before their bodies are decoded (HTTP 429 / RESOURCE_EXHAUSTED) so the loop keeps
    answering the others on time (see overload.py). 0 turns it off."""
    tune_runtime: bool = True
    """After loading: `gc.freeze()` and a high gen-0 threshold, so collections stay off the hot
    path."""
    gc_threshold: int = Field(default=50_000, ge=100, le=2**31 - 1)
    """gen-0 collection threshold while `tune_runtime` is on (Python's default is 700; the
    most `gc.set_threshold` takes is a C int's)."""
    access_log_sample: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of successful requests that get an access-log line (`duetime.requests` logger, at
    INFO); failed requests always get one."""
    control_token: str | None = Field(default=None, min_length=16, repr=False)
    """When set, the calls that change the server (repository load and unload, trace and log
    settings updates, shared-memory registration) must carry the HTTP header `Authorization:
    Bearer <token>` or the gRPC metadata `authorization: Bearer <token>` (gRPC keys are lower
    case); the index and the settings stay readable. A secret: `repr=False` keeps it out of the
    settings' repr and of validation errors (which give its length)."""

    @field_validator("control_token")
    @classmethod
    def _sendable(cls, value: str | None) -> str | None:
        """A token no client could send is refused at start (the value is not shown).

        NOTE: one with a space at either end, a tab, a newline or a non-ASCII letter was taken,
        and then no call could match it: HTTP and gRPC clients trim a header's value, and
        neither carries anything but visible ASCII in one as it is."""
        if value is not None and not all("!" <= c <= "~" for c in value):
            raise ValueError(
                "expected visible ASCII characters only (letters, digits, punctuation: no "
                "spaces, tabs, newlines or non-ASCII letters), as an HTTP Authorization header "
                "and gRPC metadata carry it"
            )
        return value

    model_control_mode: Literal["none", "explicit", "poll"] = "none"
    """As Triton: `none` loads every model at start and never changes them; `explicit` loads
    and unloads through the repository API (`load_model` names those loaded at start); `poll`
    rescans the repository every `repository_poll_secs` and applies what changed."""
    repository_poll_secs: float = Field(default=5.0, gt=0)
    repository_stable_secs: float = Field(default=1.0, ge=0)
    """A changed version is loaded only once its files have been unchanged this long (a copy
    still in progress keeps changing them)."""
    load_model: tuple[str, ...] = ()
    """Explicit mode: models to load at start (`*` for all); `DUETIME_LOAD_MODEL=a,b`."""

    @field_validator("model_repository", "record_path", mode="before")
    @classmethod
    def _not_empty(cls, value: object) -> object:
        """An empty path is refused (as a Path it is the current folder: an empty variable
        served it, or named '.' as the capture file)."""
        if isinstance(value, str) and not value.strip():
            raise ValueError("expected a path, got an empty one")
        return value

    @field_validator("load_model", mode="before")
    @classmethod
    def _listed(cls, value: object) -> object:
        """A variable's comma-separated names as a tuple; `*` only alone, as Triton has it."""
        if isinstance(value, str):
            value = tuple(name.strip() for name in value.split(",") if name.strip())
        if isinstance(value, tuple | list) and "*" in value and len(value) > 1:
            raise ValueError("'*' loads every model: give it alone, not with other names")
        return value

    @model_validator(mode="after")
    def _ports_apart(self) -> ServerSettings:
        """NOTE: `--http-port 9000 --metrics-port 9000` was told the port was taken, "pass
        --http-port with a free port", though it was free until the metrics took it (found by
        a tester). 0 (a port the system picks) may repeat."""
        ports = {"http_port": self.http_port, "grpc_port": self.grpc_port}
        if self.metrics:
            ports["metrics_port"] = self.metrics_port
        seen: dict[int, str] = {}
        for name, port in ports.items():
            if port and port in seen:
                flags = " and ".join(f"{n} (--{n.replace('_', '-')})" for n in (seen[port], name))
                raise ValueError(f"{flags} are both {port}: each endpoint needs a port of its own")
            seen[port] = name
        return self

    max_run_memory_bytes: int | None = Field(default=None, ge=1)
    """The most one request's values may ask a node of a model to allocate (the shape given to
    a ConstantOfShape, Expand, Tile, Range, Pad, OneHot or Resize): a bigger request is refused
    before it runs (400, naming the input). None: a quarter of the machine's memory (or of its
    cgroup's limit)."""
    max_loaded_models: int | None = Field(default=None, ge=1)
    max_loaded_bytes: int | None = Field(default=None, ge=1)
    """Budget for loaded model files (per instance); the least recently used idle model is
    unloaded to make room."""
    lazy_load: bool = False
    """Load each model on its first request (which waits if its due time allows)."""
    strict_readiness: bool = True
    """As Triton: server ready (HTTP `/v2/health/ready`, gRPC `ServerReady` and health checks)
    only while no model of the repository failed to load with nothing serving it."""
    unload_drain_secs: float = Field(default=30.0, ge=0)
    """How long a replaced or unloaded version may take to finish its queued requests."""
    switch_interval_us: int = Field(default=50, ge=10, le=100_000)
    """While `tune_runtime` is on: how long an instance thread back from ONNX Runtime waits for
    a busy event loop to hand over the GIL (`sys.setswitchinterval`; Python's default 5000).

    NOTE: a thread waits for the GIL at least once per batch (for the outputs), and under
    overload the loop always holds it. Measured on a 2-core VM with a thread spinning on the
    loop's core: a batch of the demo resnet (1.04 ms alone) took 1.61 ms at 500 µs and 1.17 ms at
    50 µs; of its int8 variant (0.33 ms alone) 1.00 ms and 0.53 ms: at 500 µs the overrun made
    the scheduler refuse two thirds of what the instance could do."""
    loop_slice_us: int = Field(default=100, ge=0, le=100_000)
    """While `tune_runtime` is on: the event loop thread's time slice on Linux 6.12+ (EEVDF's
    request length, `sched_attr.sched_runtime`; the kernel clamps it to 100-100,000 µs and
    defaults to 700 µs times a factor that grows with the CPU count). A short slice lets the
    loop, woken by a request or a finished batch, run at once on a core another process is
    using, rather than after that process's slice; its share of the core is unchanged. 0: the
    kernel's default. Elsewhere it has no effect."""
    record_path: Path | None = None
    """Traffic capture: write sampled requests and their outcomes to this new file (it must not
    exist; format in docs/capture-format.md). None: no capture."""
    record_sample: float = Field(default=1.0, ge=0.0, le=1.0)
    """Share of requests captured (each drawn independently)."""
    record_outputs: bool = False
    """Capture each answer's output tensors too."""
    record_buffer: int = Field(default=8192, ge=1, le=10_000_000)
    """Captured requests held for the writer thread; when it falls this far behind, further
    samples are dropped (counted, logged at shutdown), never waited for."""


_OTHER_VARIABLES = frozenset(
    {"DUETIME_FUZZ_EXAMPLES", "DUETIME_LOG_LEVEL", "DUETIME_LOG_FORMAT", "DUETIME_DEMO"}
)
"""`DUETIME_*` variables that are not server settings: the test suite's, and the flags' that
`duetime` reads itself (`--log-level`, `--log-format`, `--demo`; see cli.py)."""


def server_settings(
    overrides: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, str] | None = None,
) -> ServerSettings:
    """Build settings from `DUETIME_<FIELD>` variables, then `overrides` (CLI flags) on top.
    A `DUETIME_*` variable that names no setting is warned of, with the nearest that does (it
    was ignored without a word: `DUETIME_RECORD` for `DUETIME_RECORD_PATH`, say)."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    keys = {f"DUETIME_{name.upper()}": name for name in ServerSettings.model_fields}
    for key, name in keys.items():
        if key in env:
            values[name] = env[key]
    for key in sorted(set(env) - set(keys) - _OTHER_VARIABLES):
        if key.startswith("DUETIME_"):
            near = difflib.get_close_matches(key, list(keys), n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]}?)" if near else ""
            log.warning("environment variable %s names no server setting; ignored%s", key, hint)
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return ServerSettings.model_validate(values)
    except ValidationError as exc:
        secrets = [name for name, field in ServerSettings.model_fields.items() if not field.repr]
        message = describe_validation_error("server settings", exc, secrets)
        raise ConfigError(named_sources(message, setting_sources(overrides, env, flags))) from None


def setting_sources(
    overrides: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Each server setting -> what an error about it names as its source: its flag (`flags`:
    setting -> flag) where `overrides` (the flags given) set it, else its `DUETIME_*` variable
    where `env` (None: the process's) sets it, else its flag.

    NOTE: a value that came from a variable is named by it: "(--http-port)" for a bad
    DUETIME_HTTP_PORT named a flag the user never passed."""
    env = os.environ if env is None else env
    flags = flags or {}
    sources: dict[str, str] = {}
    for name in ServerSettings.model_fields:
        variable = f"DUETIME_{name.upper()}"
        if overrides.get(name) is None and variable in env:
            sources[name] = variable
        elif name in flags:
            sources[name] = flags[name]
    return sources


def named_sources(message: str, sources: Mapping[str, str]) -> str:
    """`message` with each `field '<setting>'` it names followed by the setting's source
    (`setting_sources`): a flag it names already (`field 'load_model' (--load-model 'x')`) is
    replaced by the variable where that gave the value.

    NOTE: the checks made after the settings are validated (a startup model that is not in the
    repository, a host that is not this one's, a bad --cpus) named the flag whatever gave the
    value, or nothing (found by a tester)."""
    for name, source in sources.items():
        field = f"field '{name}'"
        named = f"{field} ({source}".replace("\\", r"\\")  # (as re.sub's replacement)
        message = re.sub(rf"{re.escape(field)} \(--[\w-]+", named, message)
        message = re.sub(rf"{re.escape(field)}(?! \()", f"{named})", message)
    return message
