"""Triton's config.pbtxt read as a duetime model config (repository/tritonconfig.py)."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format, text_format
from repo_models import scale_model, write_version

from duetime.config import ModelConfig
from duetime.demo import write_demo_repository
from duetime.errors import ConfigError
from duetime.frontend.metadata import model_config_json
from duetime.frontend.proto import model_config_pb2 as mc
from duetime.repository.layout import scan_model
from duetime.repository.loader import load_version
from duetime.repository.tritonconfig import load_model_config, read_json_config, translate

# A config as Triton users write them, with sections duetime has no use for.
TRITON_CONFIG = """
name: "mlp"
platform: "onnxruntime_onnx"
max_batch_size: 16
version_policy: { specific: { versions: [1, 3] } }
input [ { name: "x" data_type: TYPE_FP32 dims: [ 40 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
instance_group [ { count: 2 kind: KIND_CPU }, { kind: KIND_GPU gpus: [ 0 ] } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 200
  default_priority_level: 2
  priority_levels: 3
  default_queue_policy { default_timeout_microseconds: 5000 max_queue_size: 64 }
}
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }
model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value {
  data_type: TYPE_FP32 dims: [ 40 ] zero_data: true } } } ]
response_cache { enable: true }
"""


def test_a_triton_config_translates_field_by_field(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="duetime.config"):
        settings = translate(TRITON_CONFIG, source="mlp/config.pbtxt", model_name="mlp")
    assert settings == {
        "max_batch_size": 16,
        "inputs": [{"name": "x", "datatype": "FP32", "dims": [40]}],
        "outputs": [{"name": "y", "datatype": "FP32", "dims": [3]}],
        "instances": 3,
        "scheduling": {
            "max_queue_delay_us": 200,
            "default_priority_level": 2,
            "priority_levels": 3,
            # (a queue of 64 per level, as Triton's)
            "max_queue_size_per_level": 64,
            "max_queue_size": 3 * 64,
        },
        "default_timeout_ms": 5.0,
        "version_policy": {"specific": {"versions": [1, 3]}},
        "intra_op_threads": 2,
    }
    assert "GPU instances run on the CPU" in caplog.text
    assert "preferred_batch_size [4, 8]: no effect under duetime's EDF policy" in caplog.text
    assert "model_warmup, optimization, response_cache: Triton-only settings" in caplog.text
    ModelConfig.model_validate(settings)  # and duetime accepts what it says


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('max_batch_size: 0 input [ { name: "x" data_type: TYPE_STRING dims: [ -1 ] } ]',
         {"max_batch_size": 0, "inputs": [{"name": "x", "datatype": "BYTES", "dims": [-1]}]}),
        # (`max_batch_size: 0` or `name: 'm'` alone set nothing: served as no config, see
        # tests/repository/test_triton_config_compat.py)
        ('backend: "onnxruntime" version_policy { all {} }', {"version_policy": {"all": {}}}),
        ("version_policy { latest { num_versions: 2 } }",
         {"version_policy": {"latest": {"num_versions": 2}}}),
        # (`latest { }` is 0 versions, refused at validation as Triton refuses it: it was
        # served as latest 1)
        ("version_policy { latest { } }", {"version_policy": {"latest": {"num_versions": 0}}}),
        ("dynamic_batching { }", {"scheduling": {"max_queue_delay_us": 0}}),
        # Triton's form of a tensor with no dims beyond the batch (its auto-complete writes it):
        # answers carry [batch, 1], the graph gives [batch]
        ('max_batch_size: 8 output [ { name: "label" data_type: TYPE_INT64 dims: [ 1 ] '
         "reshape { shape: [ ] } } ]",
         {"max_batch_size": 8,
          "outputs": [{"name": "label", "datatype": "INT64", "dims": [1], "reshape": []}]}),
    ],
)  # fmt: skip
def test_defaults_and_datatypes(text: str, expected: dict[str, Any]) -> None:
    # (no priority_levels: every request at one level; no instance_group: 2 instances; as
    # Triton, see the tests of each)
    scheduling = {**expected.get("scheduling", {}), "ignore_priority": True}
    assert translate(text, source="c", model_name="m") == {
        **expected, "scheduling": scheduling, "instances": 2,
    }  # fmt: skip


def test_nested_triton_only_settings_are_named_in_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = (
        'input [ { name: "x" dims: [ 3, 8, 8 ] optional: true allow_ragged_batch: true } ]\n'
        "dynamic_batching { preserve_ordering: true priority_queue_policy { key: 1 value {} } }\n"
        'parameters { key: "inter_op_thread_count" value { string_value: "0" } }\n'
        'parameters { key: "intra_op_thread_count" value { string_value: "0" } }\n'
    )
    with caplog.at_level(logging.WARNING, logger="duetime.config"):
        out = translate(text, source="c", model_name="m")
    assert "c: input 'x': allow_ragged_batch: Triton-only settings" in caplog.text
    assert out["inputs"] == [{"name": "x", "dims": [3, 8, 8], "optional": True}]  # (duetime's too)
    # (each with its own reason: see tests/repository/test_triton_config_compat.py)
    assert "c: dynamic_batching.preserve_ordering: not supported" in caplog.text
    assert "c: dynamic_batching.priority_queue_policy (keys [1]): ignored" in caplog.text
    assert (out["intra_op_threads"], "inter_op_threads" in out) == (0, False)  # (0: ORT's own)


def test_a_latest_policy_of_no_versions_is_refused_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text("version_policy { latest { num_versions: 0 } }")
    with pytest.raises(ConfigError, match=r"field 'version_policy\.latest\.num_versions'"):
        load_model_config(tmp_path / "m")


def test_a_config_name_that_is_not_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m" / "config.pbtxt").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"config\.pbtxt: a config file's name, but not a file"):
        load_model_config(tmp_path / "m")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('platform: "tensorrt_plan"', "c: platform: 'tensorrt_plan': duetime serves ONNX models"),
        ('backend: "python"', "c: backend: 'python'"),
        ('name: "other"', "c: name: 'other' differs from the model's folder 'm'"),
        ("sequence_batching { }", "c: sequence_batching: sequence batching (stateful models)"),
        ("model_transaction_policy { decoupled: true }", "decoupled models are not supported"),
        ("max_batch_size: -1", "c: max_batch_size: -1: must be 0 (no batching) or more"),
        ('parameters { key: "intra_op_thread_count" value { string_value: "two" } }',
         "c: parameters['intra_op_thread_count']: expected an integer, got 'two'"),
        ("max_batch_size: 8\nbogus_field: 1", "c: not a Triton model config (protobuf text "
         'format): 2:1 : Message type "inference.ModelConfig" has no field named "bogus_field"'),
    ],
)  # fmt: skip
def test_what_duetime_cannot_honour_is_refused_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        translate(text, source="c", model_name="m")


DATA_TYPES = (
    "TYPE_BOOL, TYPE_UINT8, TYPE_UINT16, TYPE_UINT32, TYPE_UINT64, TYPE_INT8, TYPE_INT16, "
    "TYPE_INT32, TYPE_INT64, TYPE_FP16, TYPE_FP32, TYPE_FP64, TYPE_STRING, TYPE_BF16"
)
TENSORS = (
    'input [ { name: "x" data_type: TYPE_FP32 dims: [ 40 ] } ]\n'
    'output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (TENSORS.replace("data_type: TYPE_FP32", "data_type: 99", 1),
         f"input[0].data_type: 99 is not a data type; expected one of {DATA_TYPES}"),
        (TENSORS.replace('data_type: TYPE_FP32 dims: [ 3 ]', "data_type: -2 dims: [ 3 ]"),
         f"output[0].data_type: -2 is not a data type; expected one of {DATA_TYPES}"),
        (TENSORS + "instance_group [ { kind: KIND_CPU }, { kind: 9 } ]",
         "instance_group[1].kind: 9 is not an instance group kind; expected one of KIND_AUTO, "
         "KIND_GPU, KIND_CPU, KIND_MODEL"),
        (TENSORS + "dynamic_batching { default_queue_policy { timeout_action: 3 } }",
         "dynamic_batching.default_queue_policy.timeout_action: 3 is not a timeout action; "
         "expected one of REJECT, DELAY"),
        (TENSORS + "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
         "priority_queue_policy { key: 2 value { timeout_action: 4 } } }",
         "dynamic_batching.priority_queue_policy[2].timeout_action: 4 is not a timeout action"),
        (TENSORS + "optimization { priority: 5 }",
         "optimization.priority: 5 is not a priority; expected one of PRIORITY_DEFAULT, "
         "PRIORITY_MAX, PRIORITY_MIN"),
        (TENSORS + 'model_warmup [ { name: "w" inputs { key: "x" value { data_type: 40 '
         "dims: [ 40 ] zero_data: true } } } ]",
         "model_warmup[0].inputs['x'].data_type: 40 is not a data type"),
        (TENSORS + "instance_group [ { kind: KIND_CPU secondary_devices [ { kind: 1 } ] } ]",
         "instance_group[0].secondary_devices[0].kind: 1 is not a value of "
         "SecondaryDeviceKind; expected one of KIND_NVDLA"),
    ],
    ids=["input-data-type", "output-data-type", "instance-kind", "timeout-action",
         "priority-queue-policy", "optimization-priority", "warmup-data-type", "secondary-kind"],
)  # fmt: skip
def test_an_enum_number_that_names_no_value_is_refused_naming_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    """proto3 enums are open: protobuf reads `data_type: 99` and keeps the number. It raised
    'ValueError: Enum DataType has no name defined for value 99' out of the load, and
    `kind: 9` was served (as a GPU group's count); each is now refused at load, in the file
    and in a load request's JSON alike, naming the field and the values it takes."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.pbtxt").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(f"config.pbtxt: {message}")):
        load_model_config(folder)
    config = mc.ModelConfig()
    text_format.Parse(text, config)
    as_json = json_format.MessageToDict(config, preserving_proto_field_name=True)
    with pytest.raises(ConfigError, match=re.escape(f"load parameter 'config': {message}")):
        read_json_config(as_json, source="load parameter 'config'", model_name="m")


def test_enum_numbers_that_name_a_value_are_taken_as_that_value() -> None:
    text = TENSORS.replace("TYPE_FP32", "11") + "instance_group [ { kind: 2 count: 3 } ]"
    settings = translate(text, source="c", model_name="m")
    assert settings["inputs"] == [{"name": "x", "datatype": "FP32", "dims": [40]}]
    assert settings["instances"] == 3


@pytest.fixture
def triton_repo(tmp_path: Path) -> Path:
    """The demo mlp as a Triton repository: model.onnx and a config.pbtxt."""
    demo = write_demo_repository(tmp_path / "demo")
    model = tmp_path / "triton" / "mlp"
    shutil.copytree(demo / "mlp" / "1", model / "1")
    (model / "config.pbtxt").write_text(
        'name: "mlp"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "x", data_type: TYPE_FP32, dims: [ 40 ] } ]\n'
        'output [ { name: "y", data_type: TYPE_FP32, dims: [ 3 ] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 100 }\n",
        encoding="utf-8",
    )
    return model


def test_a_triton_model_folder_loads_with_its_config(triton_repo: Path) -> None:
    config = load_model_config(triton_repo)
    assert (config.max_batch_size, config.scheduling.max_queue_delay_us) == (8, 100)
    model = load_version(scan_model(triton_repo), 1)
    try:
        assert model.signature.max_batch_size == 8
        assert [spec.name for spec in model.signature.inputs] == ["x"]
    finally:
        model.executor.close()


def test_label_filename_names_the_classes_of_classification_answers(triton_repo: Path) -> None:
    config = triton_repo / "config.pbtxt"
    text = config.read_text(encoding="utf-8")
    config.write_text(text.replace("dims: [ 3 ] }", 'dims: [ 3 ], label_filename: "l.txt" }'))
    (triton_repo / "l.txt").write_text("up\ndown\nflat\n", encoding="utf-8")
    model = load_version(scan_model(triton_repo), 1)
    try:
        assert model.labels == {"y": ("up", "down", "flat")}
        assert model_config_json(model)["output"][0]["label_filename"] == "l.txt"
    finally:
        model.executor.close()
    (triton_repo / "l.txt").unlink()
    with pytest.raises(ConfigError, match=r"field 'outputs.0.labels': cannot read '.*l.txt'"):
        load_version(scan_model(triton_repo), 1)
    config.write_text(text.replace("dims: [ 3 ] }", 'dims: [ 3 ], label_filename: "../x" }'))
    with pytest.raises(
        ConfigError, match=re.escape("'../x' must be a file name in the model's folder")
    ):
        load_version(scan_model(triton_repo), 1)


def test_a_pbtxt_beside_a_duetime_config_is_refused(triton_repo: Path) -> None:
    (triton_repo / "config.toml").write_text("max_batch_size = 4\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="more than one config file"):
        load_model_config(triton_repo)


def test_a_tensor_without_dims_is_reported_as_triton_does_and_read_back(tmp_path: Path) -> None:
    """An output of one value per row (a classifier's label) had `"dims": []`, which Triton's
    own config check refuses: it is `dims: [1]` with `reshape { shape: [] }`, and a parameter
    names it, so that the config read back (get the config, load it) serves [batch] as before;
    without the parameter (Triton's own config) it is read as Triton reads it: answers then
    carry [batch, 1]."""
    from onnx import TensorProto, helper

    from duetime.repository.tritonconfig import translate_json

    graph = helper.make_graph(
        [helper.make_node("ArgMax", ["x"], ["label"], axis=1, keepdims=0)], "argmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["n"])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (tmp_path / "m" / "config.toml").write_text("max_batch_size = 4\n")
    loaded = load_version(scan_model(tmp_path / "m"), 1)
    try:
        config = model_config_json(loaded)
    finally:
        loaded.executor.close()
    (label,) = config["output"]
    assert (label["dims"], label["reshape"]) == ([1], {"shape": []})
    assert config["input"][0]["dims"] == [3]
    assert "reshape" not in config["input"][0]
    assert config["parameters"]["tensors_without_dims"] == {"string_value": '["label"]'}
    settings = translate_json(config, source="m", model_name="m")
    assert settings["outputs"] == [{"name": "label", "datatype": "INT64"}]
    del config["parameters"]["tensors_without_dims"]
    settings = translate_json(config, source="m", model_name="m")
    assert settings["outputs"] == [
        {"name": "label", "datatype": "INT64", "dims": [1], "reshape": []}
    ]


@pytest.mark.parametrize("microseconds", [2**64 - 1, 2**63 - 1, 18_000_000_000_000_000_001])
def test_every_uint64_default_timeout_of_a_triton_config_is_taken_and_shown(
    tmp_path: Path, microseconds: int
) -> None:
    """Triton's default_timeout_microseconds is a uint64: its largest values were refused (a
    bound in ms named on the microseconds field), and values past what the config endpoint can
    say (1e20 ms) answered 500 there."""
    policy = f"default_queue_policy {{ default_timeout_microseconds: {microseconds} }}"
    text = f"dynamic_batching {{ {policy} }}"
    settings = ModelConfig.model_validate(translate(text, source="c", model_name="m"))
    assert settings.default_timeout_ms is not None
    repo = write_demo_repository(tmp_path / "repo")
    (repo / "mlp" / "config.toml").unlink()
    (repo / "mlp" / "config.pbtxt").write_text(text)
    loaded = load_version(scan_model(repo / "mlp"), 1)
    try:
        shown = model_config_json(loaded)["dynamic_batching"]["default_queue_policy"]
    finally:
        loaded.executor.close()
    assert 0 < shown["default_timeout_microseconds"] <= 2**64 - 1


@pytest.mark.parametrize(
    ("milliseconds", "microseconds"),
    [(0.0005, 1), (1e-7, 1), (4.35, 4350), (1.2341, 1235), (5, 5000)],
)
def test_a_default_timeout_is_shown_in_whole_microseconds_rounded_up(
    tmp_path: Path, milliseconds: float, microseconds: int
) -> None:
    """Found by a tester (T64): 0.0005 ms was shown as 0 microseconds, Triton's 'none', and
    the config loaded back served with no due time (every request answered 200, not 504)."""
    repo = write_demo_repository(tmp_path / "repo")
    (repo / "mlp" / "config.toml").write_text(f"default_timeout_ms = {milliseconds}\n")
    loaded = load_version(scan_model(repo / "mlp"), 1)
    try:
        shown = model_config_json(loaded)["dynamic_batching"]["default_queue_policy"]
    finally:
        loaded.executor.close()
    assert shown["default_timeout_microseconds"] == microseconds
    back = ModelConfig.model_validate(
        translate(f"dynamic_batching {{ default_queue_policy {{ default_timeout_microseconds: "
                  f"{microseconds} }} }}", source="c", model_name="m")
    )  # fmt: skip
    assert back.default_timeout_ms is not None
    assert back.default_timeout_ms >= milliseconds


def test_a_pbtxt_without_priority_levels_ignores_priority_and_says_so(triton_repo: Path) -> None:
    """Its config says what the file says (no levels), while duetime serves one level."""
    model = load_version(scan_model(triton_repo), 1)
    try:
        batching = model_config_json(model)["dynamic_batching"]
    finally:
        model.executor.close()
    assert model.config.scheduling.ignore_priority
    assert (batching["priority_levels"], batching["default_priority_level"]) == (0, 0)


def test_a_pbtxt_without_instance_groups_serves_triton_s_two_and_says_so(
    triton_repo: Path,
) -> None:
    """Triton gives an onnxruntime model without instance_group one CPU group of 2 (on a
    machine without GPUs); duetime served 1."""
    model = load_version(scan_model(triton_repo), 1)
    try:
        groups, sessions = model_config_json(model)["instance_group"], model.executor.instances
    finally:
        model.executor.close()
    assert (model.config.instances, sessions) == (2, 2)
    assert [group["count"] for group in groups] == [2]


@pytest.mark.parametrize(("microseconds", "warned"), [(1, True), (60_000_000, False)])
def test_a_default_timeout_shorter_than_a_run_is_warned_of_at_load(
    triton_repo: Path, caplog: pytest.LogCaptureFixture, microseconds: int, warned: bool
) -> None:
    """Triton's default timeout bounds a request's wait in the queue; duetime's is the due time
    of the answers to requests that send no timeout of their own: one shorter than the model's
    run refused every such request, and nothing said why (the pbtxt tester's
    default_timeout_queue.py). Its config says what duetime does: a request's own timeout is
    honoured."""
    config = triton_repo / "config.pbtxt"
    policy = f"default_queue_policy {{ default_timeout_microseconds: {microseconds} }}"
    config.write_text(
        config.read_text().replace("dynamic_batching {", f"dynamic_batching {{ {policy}")
    )
    with caplog.at_level(logging.WARNING, logger="duetime.loader"):
        model = load_version(scan_model(triton_repo), 1)
    try:
        shown = model_config_json(model)["dynamic_batching"]["default_queue_policy"]
    finally:
        model.executor.close()
    named = "default_timeout_microseconds) is shorter than one row needs"
    refused = "so every request that sends no timeout of its own will be refused"
    assert (named in caplog.text, refused in caplog.text) == (
        warned, warned,
    )  # fmt: skip
    assert shown["allow_timeout_override"] is True


def test_a_pbtxt_queue_size_with_priority_levels_bounds_each_level_and_reads_back(
    tmp_path: Path,
) -> None:
    """Triton keeps a queue per priority level, each `max_queue_size` long: 2 requests at
    level 1 and 2 at level 2 fit a size of 2 (duetime refused the fourth, one queue of 2)."""
    text = (
        "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
        "default_queue_policy { max_queue_size: 2 } }"
    )
    settings = translate(text, source="c", model_name="m")
    scheduling = ModelConfig.model_validate(settings).scheduling
    assert (scheduling.max_queue_size_per_level, scheduling.max_queue_size) == (2, 4)
    write_version(tmp_path, "m", 1, scale_model(2.0))
    (tmp_path / "m" / "config.pbtxt").write_text(text, encoding="utf-8")
    model = load_version(scan_model(tmp_path / "m"), 1)
    try:
        policy = model_config_json(model)["dynamic_batching"]["default_queue_policy"]
    finally:
        model.executor.close()
    assert policy["max_queue_size"] == 2  # what the file said: read back, it is the same


def test_a_duetime_model_taking_any_priority_level_reads_back_the_same(tmp_path: Path) -> None:
    """Its config.toml's priority_levels 0 is any level; Triton's 0 is one level for all: read
    back (load_model(config=...)), it served every request in arrival order."""
    write_version(tmp_path, "m", 1, scale_model(2.0))
    (tmp_path / "m" / "config.toml").write_text("max_batch_size = 4\n", encoding="utf-8")
    model = load_version(scan_model(tmp_path / "m"), 1)
    try:
        shown = model_config_json(model)
    finally:
        model.executor.close()
    assert shown["dynamic_batching"]["priority_levels"] == 0
    read_back = read_json_config(shown, source="c", model_name="m")
    assert not read_back.scheduling.ignore_priority
    # a Triton config without levels (and without the parameter) still has one level
    assert translate("dynamic_batching { }", source="c", model_name="m")["scheduling"][
        "ignore_priority"
    ]


def test_a_delay_queue_policy_s_default_timeout_sets_no_due_time() -> None:
    """Found by a tester: Triton's DELAY fails no request for its default timeout (it runs the
    timed-out ones after the others); made a due time, it refused every request of a model
    whose run outlasted it."""
    warned: list[str] = []
    for action, due in (("DELAY", None), ("REJECT", 50.0)):
        policy = f"timeout_action: {action} default_timeout_microseconds: 50000"
        text = f"max_batch_size: 1 dynamic_batching {{ default_queue_policy {{ {policy} }} }}"
        settings = translate(text, source="c", model_name="m", warn=warned.append)
        assert ModelConfig.model_validate(settings).default_timeout_ms == due
    assert any("DELAY: Triton fails no request for its default timeout" in w for w in warned)
