"""What a model config may say, in each of its forms (config.toml, Triton's config.pbtxt, a
load request's JSON), checked as Triton checks it (repository/tritonconfig.py, config.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from duetime.config import ModelConfig, parse_model_config
from duetime.errors import ConfigError, InvalidInput
from duetime.frontend.rest import parse_config_override
from duetime.repository.loader import reconcile
from duetime.repository.tritonconfig import (
    load_model_config,
    read_json_config,
    read_model_config,
    translate,
)
from duetime.types import TensorSpec


def model_dir(tmp_path: Path, filename: str, text: str) -> Path:
    """A model folder holding only its config file (enough for reading the config)."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / filename).write_text(text, encoding="utf-8")
    return folder


DIM_RULE = "a dim must be 1 or more, -1 for a free dim, or 0 where the graph's dim is 0 (got -2)"


def test_a_dim_below_minus_1_in_a_pbtxt_is_refused_at_load(tmp_path: Path) -> None:
    folder = model_dir(
        tmp_path, "config.pbtxt",
        'max_batch_size: 8\ninput [{ name: "x" data_type: TYPE_FP32 dims: [-2] }]\n',
    )  # fmt: skip
    with pytest.raises(ConfigError, match=re.escape(DIM_RULE)):
        load_model_config(folder)


def test_a_dim_below_minus_1_in_a_config_toml_is_refused_at_load(tmp_path: Path) -> None:
    folder = model_dir(tmp_path, "config.toml", '[[outputs]]\nname = "y"\ndims = [4, -2]\n')
    with pytest.raises(ConfigError, match=r"field 'outputs\.0\.dims\.1': .*" + re.escape(DIM_RULE)):
        load_model_config(folder)


@pytest.mark.parametrize(
    "override",
    [
        {"inputs": [{"name": "x", "dims": [-2]}]},  # duetime's form
        {"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["-2"]}]},  # Triton's
    ],
)
def test_a_dim_below_minus_1_in_a_load_override_is_refused(override: dict[str, object]) -> None:
    with pytest.raises(InvalidInput, match=re.escape(DIM_RULE)):
        parse_config_override(json.dumps(override), "m")


EMPTY = [TensorSpec("x", "FP32", (2, 0))]
"""A graph input with a fixed 0 dim: ONNX Runtime runs it on empty tensors, duetime serves it,
and its model config reports dims [2, 0]."""


@pytest.mark.parametrize(
    "override",
    [
        {"inputs": [{"name": "x", "dims": [2, 0]}]},  # duetime's form
        {"input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["2", "0"]}]},  # Triton's
    ],
)
def test_a_0_dim_where_the_graph_has_one_loads_back(override: dict[str, object]) -> None:
    """The config the server reports for such a model loads again (get, edit, load)."""
    config = parse_config_override(json.dumps(override), "m")
    signature = reconcile(config, EMPTY, [TensorSpec("y", "FP32", (2, 0))], source="m")
    assert signature.max_batch_size == 0
    assert [spec.shape for spec in signature.inputs] == [(2, 0)]


def test_a_0_dim_in_a_config_file_loads_where_the_graph_has_one(tmp_path: Path) -> None:
    for filename, text in [
        ("config.pbtxt", 'input [{ name: "x" data_type: TYPE_FP32 dims: [2, 0] }]\n'),
        ("config.toml", '[[inputs]]\nname = "x"\ndims = [2, 0]\n'),
    ]:
        (tmp_path / filename).mkdir()
        folder = model_dir(tmp_path / filename, filename, text)
        config = load_model_config(folder)
        signature = reconcile(config, EMPTY, [], source="m")
        assert [spec.shape for spec in signature.inputs] == [(2, 0)]


@pytest.mark.parametrize(
    ("graph", "dims", "has"),
    [
        ((-1, -1), [2, 0], "dims [-1, -1]"),  # a free dim narrowed to 0
        ((-1, 5), [-1, 0], "dims [-1, 5]"),  # another fixed dim
        ((), [0], "no shape"),  # the graph says nothing
    ],
)
def test_a_0_dim_where_the_graph_has_none_is_refused_naming_it(
    graph: tuple[int, ...], dims: list[int], has: str
) -> None:
    config = parse_model_config(
        {"max_batch_size": 0, "inputs": [{"name": "x", "dims": dims}]}, source="c"
    )
    spec = TensorSpec("x", "FP32", graph, any_rank=not graph)
    message = (
        f"m: field 'inputs.0.dims': {dims} has a dim of 0 where the graph's is not 0 (the graph "
        f"has {has}): a 0 dim takes only empty tensors; give 1 or more, or -1 for a free dim"
    )
    if graph == (-1, 5):
        message = f"m: field 'inputs.0.dims': {dims} does not fit the graph's [-1, 5]"
    with pytest.raises(ConfigError, match=re.escape(message)):
        reconcile(config, [spec], [], source="m")


def test_free_and_positive_dims_are_still_accepted(tmp_path: Path) -> None:
    folder = model_dir(tmp_path, "config.toml", '[[inputs]]\nname = "x"\ndims = [-1, 1, 3]\n')
    (tensor,) = load_model_config(folder).inputs or ()
    assert tensor.dims == [-1, 1, 3]


@pytest.mark.parametrize(
    ("filename", "text"),
    [
        ("config.pbtxt", 'input [{ name: "x" dims: [4] }, { name: "x" dims: [-1] }]\n'),
        ("config.toml", '[[outputs]]\nname = "y"\n[[outputs]]\nname = "y"\ndims = [4]\n'),
    ],
)
def test_a_tensor_listed_twice_is_refused_naming_it(
    tmp_path: Path, filename: str, text: str
) -> None:
    folder = model_dir(tmp_path, filename, text)
    with pytest.raises(ConfigError, match=r"'[xy]' listed more than once; list each tensor once"):
        load_model_config(folder)


TWO_INPUTS = [TensorSpec("a", "FP32", (-1, 3)), TensorSpec("b", "FP32", (-1, 3))]
SUM = [TensorSpec("s", "FP32", (-1, 3))]


def test_a_config_listing_some_of_the_required_inputs_is_refused() -> None:
    """As Triton's ONNX Runtime backend ("configuration expects 1 inputs, model provides 2");
    'b' was served on the graph's shape, unlisted."""
    config = parse_model_config({"inputs": [{"name": "a", "dims": [3]}]}, source="c")
    with pytest.raises(ConfigError, match=re.escape(
        "m: field 'inputs': the config lists 1 of the model's inputs but not 'b', which "
        "requests must give"
    )):  # fmt: skip
        reconcile(config, TWO_INPUTS, SUM, source="m")


def test_inputs_with_a_default_and_outputs_may_be_left_out_of_the_config() -> None:
    weight = TensorSpec("w", "FP32", (-1, 3), optional=True)
    config = parse_model_config(
        {"inputs": [{"name": "a"}, {"name": "b"}], "outputs": []}, source="c"
    )
    signature = reconcile(config, [*TWO_INPUTS, weight], SUM, source="m")
    assert [spec.name for spec in signature.inputs] == ["a", "b", "w"]
    assert [spec.name for spec in signature.outputs] == ["s"]


@pytest.mark.parametrize(
    ("override", "max_batch_size", "versions"),
    [
        # protobuf's JSON form writes int64 as strings (tritonclient gRPC, as_json=True)
        ({"name": "m", "platform": "onnxruntime_onnx",
          "version_policy": {"specific": {"versions": ["1", "3"]}}}, None, [1, 3]),
        ({"name": "m", "backend": "onnxruntime", "max_batch_size": "4"}, 4, None),
        ({"maxBatchSize": 4}, 4, None),  # (protobuf's JSON names, as json_format writes them)
        # duetime's own form, where both read the same keys: 0 is "no batching" (Triton's
        # form would take it from the graph)
        ({"name": "m", "max_batch_size": 0}, 0, None),
        ({"max_batch_size": 2, "version_policy": {"specific": {"versions": [3]}}}, 2, [3]),
    ],
)  # fmt: skip
def test_a_load_override_in_either_json_form_is_taken_with_only_shared_fields(
    override: dict[str, object], max_batch_size: int | None, versions: list[int] | None
) -> None:
    config = parse_config_override(json.dumps(override), "m")
    specific = config.version_policy.specific
    assert config.max_batch_size == max_batch_size
    assert (specific.versions if specific else None) == versions


def test_triton_config_as_grpc_get_model_config_returns_it_loads_back() -> None:
    from google.protobuf import json_format

    from duetime.frontend.proto import model_config_pb2 as mc

    config = mc.ModelConfig(name="m", backend="onnxruntime", max_batch_size=4)
    config.version_policy.specific.versions.extend([1, 3])
    as_json = json_format.MessageToDict(config, preserving_proto_field_name=True)
    assert as_json["version_policy"] == {"specific": {"versions": ["1", "3"]}}
    loaded = parse_config_override(json.dumps(as_json), "m")
    assert (loaded.max_batch_size, loaded.version_policy.select([1, 2, 3])) == (4, [3, 1])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"name": "m", "backend": "python"}, "backend: 'python': duetime serves ONNX models"),
        ({"name": "other"}, "name 'other' is not the model 'm'"),
        # valid in neither form: the errors of the form its keys belong to
        ({"instances": 0}, "field 'instances': Input should be greater than or equal to 1"),
        ({"instance_group": [], "bogus": 1}, 'has no field named "bogus"'),
    ],
)
def test_a_load_override_valid_in_neither_form_says_why(
    override: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidInput, match=re.escape(message)):
        parse_config_override(json.dumps(override), "m")


ONE_LEVEL = {"ignore_priority": True}
"""A config without priority_levels: every request at one level, as Triton."""


TIMEOUT_HONOURED = (
    "c: dynamic_batching.default_queue_policy.allow_timeout_override is false (Triton's default "
    "where the file does not set it): Triton would ignore a request's own timeout; duetime "
    "honours it (in place of the model's default, shorter or longer), so the config "
    "endpoint reports allow_timeout_override true"
)
"""The warning of a `dynamic_batching` whose queue policy does not allow the override."""


def translated(text: str) -> tuple[dict[str, object], list[str]]:
    """What a config.pbtxt translates to, and the warnings it gives (but the queue bound of a
    config without max_queue_size, which test_triton_config_compat.py checks)."""
    warnings: list[str] = []
    settings = translate(text, source="c", model_name="m", warn=warnings.append)
    return settings, [w for w in warnings if "max_queue_size: not set" not in w]


def test_a_passive_instance_group_adds_no_serving_instances_and_says_so() -> None:
    settings, warnings = translated(
        "instance_group [{ kind: KIND_CPU count: 1 }, { kind: KIND_CPU count: 3 passive: true "
        'host_policy: "numa1" rate_limiter { resources [{ name: "R" count: 2 }] } }]'
    )
    assert settings == {"instances": 1, "scheduling": ONE_LEVEL}
    assert warnings == [
        "c: instance_group[1]: host_policy, rate_limiter: Triton-only settings, no effect in "
        "duetime",
        "c: instance_group[1]: passive: Triton schedules no requests to a passive group's "
        "instances; duetime adds none of its 3",
    ]


def test_a_gpu_group_counts_its_instances_per_gpu_as_triton_does() -> None:
    settings, warnings = translated("instance_group [{ kind: KIND_GPU count: 2 gpus: [0, 1] }]")
    assert settings == {"instances": 4, "scheduling": ONE_LEVEL}
    assert warnings == [
        "c: instance_group[0]: KIND_GPU: GPU instances run on the CPU in duetime: 4 of them "
        "(2 for each of gpus [0, 1], as Triton counts them)"
    ]


@pytest.mark.parametrize(
    "fields", ["secondary_devices [{ device_id: 1 }]", 'profile: ["0"]', 'host_policy: "h"']
)
def test_instance_group_settings_duetime_does_not_honour_are_named(fields: str) -> None:
    settings, warnings = translated(f"instance_group [{{ count: 2 {fields} }}]")
    name = fields.split(" ")[0].rstrip(":")
    assert settings == {"instances": 2, "scheduling": ONE_LEVEL}
    assert warnings == [f"c: instance_group[0]: {name}: Triton-only settings, no effect in duetime"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("instance_group [{ count: 2 passive: true }]", "every group is passive"),
        ("instance_group [{ kind: KIND_CPU gpus: [0] }]",
         "instance_group[0].gpus: a KIND_CPU group names GPUs [0]"),
    ],
)  # fmt: skip
def test_instance_groups_that_cannot_serve_are_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        translated(text)


def parameters(**values: str) -> str:
    return "\n".join(
        f'parameters {{ key: "{key.replace("__", ".")}" value {{ string_value: "{value}" }} }}'
        for key, value in values.items()
    )


def test_onnxruntime_parameters_duetime_does_not_honour_are_each_named() -> None:
    settings, warnings = translated(parameters(
        execution_mode="1", enable_mem_arena="0", enable_mem_pattern="0",
        memory__enable_memory_arena_shrinkage="cpu:0", no_such_parameter="x",
        inter_op_thread_count="2",
    ))  # fmt: skip
    assert settings == {"inter_op_threads": 2, "scheduling": ONE_LEVEL, "instances": 2}
    assert sorted(warnings) == [  # (protobuf keeps a map in no order)
        "c: parameters['enable_mem_arena'] '0': not honoured: duetime keeps ONNX Runtime's CPU "
        "memory arena on",
        "c: parameters['enable_mem_pattern'] '0': not honoured: duetime keeps memory patterns on",
        "c: parameters['execution_mode'] '1': not honoured: duetime runs a graph's operators "
        "one at a time",
        "c: parameters['memory.enable_memory_arena_shrinkage'] 'cpu:0': not honoured: duetime "
        "never shrinks the arena after a run",
        "c: parameters['no_such_parameter']: not a parameter of Triton's onnxruntime backend nor "
        "of duetime; ignored",
    ]


def test_onnxruntime_parameters_asking_for_what_duetime_does_give_no_warning() -> None:
    settings, warnings = translated(parameters(
        execution_mode="0", enable_mem_arena="1", enable_mem_pattern="true",
        scheduling_policy="fifo", intra_op_thread_count="2",
    ))  # fmt: skip
    assert settings == {
        "scheduling": {**ONE_LEVEL, "policy": "fifo"}, "intra_op_threads": 2, "instances": 2,
    }  # fmt: skip
    assert warnings == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('max_batch_size: 8\ninput [{ name: "x" data_type: TYPE_FP32 dims: [-2] }]',
         "c: field 'input[0].dims': Value error, a dim must be 1 or more, -1 for a free dim, or "
         "0 where the graph's dim is 0 (got -2)"),
        ('output [{ name: "y" label_filename: "" }, { name: "z" dims: [-3] }]',
         "c: field 'output[1].dims': Value error"),
        ("instance_group [{ count: 100 }]",
         "c: field 'instance_group (its counts summed)': Input should be less than or equal to "
         "64 (got 100)"),
        ("max_batch_size: 4\ndynamic_batching { preferred_batch_size: [8] }",
         "c: dynamic_batching.preferred_batch_size: 8 is over max_batch_size 4"),
        ("dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
         "c: dynamic_batching.default_priority_level: 3 is beyond priority_levels 2"),
        # (these two named duetime's settings, or were taken: the pbtxt tester's field_names.py)
        ('max_batch_size: 0\ninput [{ name: "x" data_type: TYPE_FP32 dims: [-1, 4] }]\n'
         "dynamic_batching { preferred_batch_size: [4] }",
         "c: dynamic_batching.preferred_batch_size: 4 is over max_batch_size 0"),
        ("dynamic_batching { priority_levels: 3 }",
         "c: dynamic_batching.default_priority_level: not set; with priority_levels 3 it must be "
         "in [1, 3]"),
        ("max_batch_size: 4\ndynamic_batching { preferred_batch_size: [0, 2] }",
         "c: dynamic_batching.preferred_batch_size: 0: each must be 1 or more"),
        ("dynamic_batching { default_queue_policy { max_queue_size: 2000000 } }",
         "c: field 'dynamic_batching.default_queue_policy.max_queue_size': Input should be less "
         "than or equal to 1000000 (got 2000000)"),
        ('parameters { key: "scheduling_policy" value { string_value: "lifo" } }',
         "c: field 'parameters['scheduling_policy']': Input should be 'edf' or 'fifo' "
         "(got 'lifo')"),
        ('input [{ name: "x" format: FORMAT_NCHW dims: [4] }]',
         "c: input[0].format: FORMAT_NCHW needs 3 dims (without the batch dim), but dims are [4]"),
    ],
)  # fmt: skip
def test_a_pbtxt_error_names_the_triton_field_it_came_from(
    tmp_path: Path, text: str, message: str
) -> None:
    folder = model_dir(tmp_path, "config.pbtxt", text)
    with pytest.raises(ConfigError) as caught:
        load_model_config(folder)
    assert caught.value.message.startswith(message.replace("c: ", f"{folder}/config.pbtxt: ", 1))
    assert "scheduling" not in caught.value.message.replace("scheduling_policy", "")
    assert "(top level)" not in caught.value.message


def test_a_triton_json_override_error_names_the_triton_field() -> None:
    override = {"input": [{"name": "x", "dims": ["-2"]}], "instance_group": [{"count": 65}]}
    with pytest.raises(InvalidInput) as caught:
        parse_config_override(json.dumps(override), "m")
    assert "field 'input[0].dims'" in caught.value.message
    assert "field 'instance_group (its counts summed)'" in caught.value.message


def test_values_triton_takes_are_taken(tmp_path: Path) -> None:
    """A count below 1 is Triton's default (2 on the CPU); a delay has no cap (Triton's is a
    uint64), a long one is warned of."""
    settings, warnings = translated(
        "max_batch_size: 8\ninstance_group [{ kind: KIND_CPU count: -1 }]\n"
        "dynamic_batching { max_queue_delay_microseconds: 20000000 }"
    )
    assert (settings["instances"], settings["scheduling"]) == (
        2,
        {**ONE_LEVEL, "max_queue_delay_us": 20_000_000},
    )
    assert warnings == [
        "c: dynamic_batching.max_queue_delay_microseconds: 20000000 (20 s): a request with no due "
        "time may wait that long for its batch to fill",
        TIMEOUT_HONOURED,
    ]
    folder = model_dir(tmp_path, "config.pbtxt", "max_batch_size: 8\ninstance_group [{ count: 0 }]"
                       "\ndynamic_batching { max_queue_delay_microseconds: 20000000 }")  # fmt: skip
    config = load_model_config(folder)
    assert (config.instances, config.scheduling.max_queue_delay_us) == (2, 20_000_000)


@pytest.mark.parametrize(
    ("groups", "instances"),
    [
        # no group: one KIND_AUTO group, KIND_CPU without GPUs (a config setting nothing at all
        # is served as no config, 1 instance: see test_triton_config_compat.py)
        ("max_batch_size: 4", 2),
        ("instance_group [{ kind: KIND_CPU }]", 2),
        ("instance_group [{ }]", 2),
        ("instance_group [{ kind: KIND_CPU count: 0 }, { kind: KIND_CPU count: 3 }]", 5),
        ("instance_group [{ kind: KIND_GPU gpus: [0, 1] }]", 2),  # (1 per GPU)
        ("instance_group [{ kind: KIND_GPU }]", 1),
    ],
)
def test_a_count_triton_leaves_to_its_default_is_triton_s(groups: str, instances: int) -> None:
    """As Triton's SetDefaultInstanceCount for the onnxruntime backend: 2 for a CPU group
    without a count, 1 for a GPU group; duetime served 1 for both (the pbtxt tester's
    instances.py)."""
    settings, _ = translated(groups)
    assert settings["instances"] == instances


def test_a_config_with_nchw_and_three_dims_is_taken() -> None:
    settings, warnings = translated('input [{ name: "x" format: FORMAT_NCHW dims: [3, 8, 8] }]')
    assert settings["inputs"] == [{"name": "x", "dims": [3, 8, 8], "format": "FORMAT_NCHW"}]
    assert not any("format" in warning for warning in warnings)


@pytest.mark.parametrize(("policy", "kept"), [("", False), ("edf", False), ("fifo", True)])
def test_preferred_sizes_edf_ignores_are_warned_of_by_their_triton_name(
    policy: str, kept: bool
) -> None:
    """The scheduler's warning named `scheduling.preferred_batch_size`, which a pbtxt has not."""
    chosen = parameters(scheduling_policy=policy) if policy else ""
    settings, warnings = translated(
        f"max_batch_size: 8\ndynamic_batching {{ preferred_batch_size: [2, 4] }}\n{chosen}"
    )
    scheduling = settings["scheduling"]
    assert isinstance(scheduling, dict)
    assert ("preferred_batch_size" in scheduling) == kept
    assert [w for w in warnings if "preferred" in w] == ([] if kept else [
        "c: dynamic_batching.preferred_batch_size [2, 4]: no effect under duetime's EDF policy "
        "(batches are sized by due times); parameters['scheduling_policy'] 'fifo' batches as "
        "Triton does"
    ])  # fmt: skip


@pytest.mark.parametrize(
    ("batching", "warned"),
    [
        ("dynamic_batching { }", True),  # (false: Triton's default)
        ("dynamic_batching { default_queue_policy { allow_timeout_override: false } }", True),
        ("dynamic_batching { default_queue_policy { allow_timeout_override: true } }", False),
        ("", False),  # (no dynamic batcher: Triton's queue policies are its)
    ],
)
def test_a_timeout_override_triton_would_not_allow_is_warned_of(
    batching: str, warned: bool
) -> None:
    """duetime honours a request's own timeout by design; where Triton's dynamic batcher would
    ignore it, that was done without a word (the pbtxt tester's timeout_override.py)."""
    _, warnings = translated(batching)
    assert (TIMEOUT_HONOURED in warnings) == warned


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('{"max_batch_size": 4, "max_batch_size": 8}', "max_batch_size"),
        ('{"scheduling": {"policy": "edf", "policy": "fifo"}}', "policy"),
        ('{"input": [{"name": "x", "name": "y", "data_type": "TYPE_FP32", "dims": [4]}]}', "name"),
    ],
    ids=["top", "nested", "in-a-list"],
)
def test_a_config_override_giving_a_key_twice_is_refused(text: str, key: str) -> None:
    """As a config.yaml or config.toml giving a key twice is: JSON readers kept the last."""
    with pytest.raises(InvalidInput) as caught:
        parse_config_override(text, "m")
    assert caught.value.message == (
        f"load parameter 'config': key '{key}' is given twice in one object; give it once"
    )


def test_a_config_override_with_a_key_once_in_each_object_is_taken() -> None:
    text = '{"max_batch_size": 4, "scheduling": {"max_batch_size": 4}}'
    with pytest.raises(InvalidInput) as caught:  # (refused by the schema, not as twice)
        parse_config_override(text, "m")
    assert "twice" not in caught.value.message
    assert parse_config_override('{"max_batch_size": 4}', "m").max_batch_size == 4


FIFO_PREFERRING_100 = [
    ({"scheduling": {"policy": "fifo", "preferred_batch_size": [100]}},
     "scheduling.preferred_batch_size"),  # duetime's form
    ({"dynamic_batching": {"preferred_batch_size": [100]},
      "parameters": {"scheduling_policy": {"string_value": "fifo"}}},
     "dynamic_batching.preferred_batch_size"),  # Triton's
]  # fmt: skip


@pytest.mark.parametrize(("override", "field"), FIFO_PREFERRING_100)
def test_a_preferred_size_over_the_graph_s_max_batch_size_is_refused(
    override: dict[str, object], field: str
) -> None:
    """Found by a tester: with max_batch_size left to the graph (32), preferred sizes of 100
    were taken, and the config endpoint returned a config that loaded back was refused."""
    config = parse_config_override(json.dumps(override), "m")
    with pytest.raises(ConfigError) as caught:
        reconcile(config, TWO_INPUTS, SUM, source="m")
    assert caught.value.message == (
        f"m: field '{field}': 100 is over max_batch_size 32, what the model is served with as "
        "its config sets none (duetime's default for its graph); set max_batch_size to 100 or "
        "more, or lower the preferred sizes"
    )


@pytest.mark.parametrize(("override", "field"), FIFO_PREFERRING_100)
def test_a_preferred_size_of_a_graph_that_does_not_batch_is_refused(
    override: dict[str, object], field: str
) -> None:
    config = parse_config_override(json.dumps(override), "m")
    fixed = [TensorSpec("a", "FP32", (2, 3))]
    with pytest.raises(ConfigError, match=re.escape(f"'{field}': 100 is over max_batch_size 0")):
        reconcile(config, fixed, [TensorSpec("s", "FP32", (2, 3))], source="m")


def test_preferred_sizes_within_the_graph_s_max_batch_size_are_taken() -> None:
    config = parse_model_config({"scheduling": {"preferred_batch_size": [4, 32]}}, source="c")
    assert reconcile(config, TWO_INPUTS, SUM, source="m").max_batch_size == 32


@pytest.mark.parametrize("spelt", [4, "4", 4.0, "4.0", "4e0", "+4"])
@pytest.mark.parametrize("key", ["max_batch_size", "maxBatchSize"])
def test_a_json_override_s_form_does_not_follow_how_its_number_is_spelt(
    key: str, spelt: object
) -> None:
    """Found by a tester: `4` and `"4"` were read as duetime's form (1 instance, any priority
    level) and `4.0`, `"4.0"`, `"4e0"` as Triton's (2 instances, one level), which protobuf
    reads alike. The keys decide the form."""
    config = parse_config_override(json.dumps({key: spelt}), "m")
    assert type(config) is ModelConfig
    assert (config.max_batch_size, config.instances, config.scheduling.priority_levels) == (4, 1, 0)


@pytest.mark.parametrize("spelt", [4.5, "4.5", "four", True])
def test_a_json_override_s_number_protobuf_would_refuse_is_refused(spelt: object) -> None:
    with pytest.raises(InvalidInput, match="field 'max_batch_size'"):
        parse_config_override(json.dumps({"max_batch_size": spelt}), "m")


@pytest.mark.parametrize(
    ("override", "fields"),
    [
        ({"max_batch_size": 4, "maxBatchSize": 8}, "max_batch_size and maxBatchSize"),
        ({"input": [], "max_batch_size": 4, "maxBatchSize": 8}, "max_batch_size and maxBatchSize"),
        ({"version_policy": {"latest": {"num_versions": 1, "numVersions": 2}}},
         "version_policy.latest.num_versions and version_policy.latest.numVersions"),
        ({"dynamic_batching": {"preferred_batch_size": [2], "preferredBatchSize": [4]}},
         "dynamic_batching.preferred_batch_size and dynamic_batching.preferredBatchSize"),
        ({"input": [{"name": "x", "data_type": "TYPE_FP32", "dataType": "TYPE_FP16"}]},
         "input[0].data_type and input[0].dataType"),
    ],
)  # fmt: skip
def test_a_json_override_giving_a_field_in_both_spellings_is_refused_naming_both(
    override: dict[str, object], fields: str
) -> None:
    """protobuf's JSON reader kept the last of the two without a word (found by a tester)."""
    with pytest.raises(InvalidInput) as caught:
        parse_config_override(json.dumps(override), "m")
    assert caught.value.message == (
        f"load parameter 'config': {fields}: one field given twice, in both of its spellings; "
        "give it once"
    )


LONG_DELAY = "a request with no due time may wait that long for its batch to fill"


@pytest.mark.parametrize(
    ("filename", "text", "field"),
    [
        ("config.toml", "[scheduling]\nmax_queue_delay_us = 3600000000\n",
         "scheduling.max_queue_delay_us"),
        ("config.yaml", "scheduling:\n  max_queue_delay_us: 3600000000\n",
         "scheduling.max_queue_delay_us"),
        ("config.pbtxt", "dynamic_batching { max_queue_delay_microseconds: 3600000000 }\n",
         "dynamic_batching.max_queue_delay_microseconds"),
    ],
)  # fmt: skip
def test_a_long_queue_delay_is_warned_of_in_every_config_file(
    tmp_path: Path, filename: str, text: str, field: str
) -> None:
    """Found by a tester: config.pbtxt's was warned of, config.toml's not."""
    folder = model_dir(tmp_path, filename, text)
    read = read_model_config(folder)
    assert f"{folder / filename}: {field}: 3600000000 (3600 s): {LONG_DELAY}" in read.warnings
    assert read.digest


def test_a_long_queue_delay_in_a_json_override_of_duetime_s_form_is_warned_of() -> None:
    warnings: list[str] = []
    override = {"scheduling": {"max_queue_delay_us": 3600000000}}
    read_json_config(override, source="c", model_name="m", warn=warnings.append)
    assert warnings == [f"c: scheduling.max_queue_delay_us: 3600000000 (3600 s): {LONG_DELAY}"]


def test_a_short_queue_delay_in_a_config_toml_is_not_warned_of(tmp_path: Path) -> None:
    folder = model_dir(tmp_path, "config.toml", "[scheduling]\nmax_queue_delay_us = 10000000\n")
    assert read_model_config(folder).warnings == ()


def test_a_pbtxt_name_differing_only_in_unicode_normalization_shows_the_code_points() -> None:
    with pytest.raises(ConfigError) as caught:
        translate('name: "caf\u00e9"', source="c", model_name="cafe\u0301")
    assert "the name is 'caf\\xe9', the folder 'cafe\\u0301'" in caught.value.message


def test_a_json_name_differing_only_in_unicode_normalization_shows_the_code_points() -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_config_override(json.dumps({"name": "caf\u00e9"}), "cafe\u0301")
    assert "the name is 'caf\\xe9', the folder 'cafe\\u0301'" in caught.value.message
