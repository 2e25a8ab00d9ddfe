"""Triton config.pbtxt compatibility (the tconfig tester's repros): the queue bound of a config
that sets none is said, one JSON config means one thing whatever protobuf spelling it comes in,
an empty config.pbtxt serves as no config, a `specific` version without a folder is named, and
`priority_queue_policy` / `preserve_ordering` are validated and warned of truthfully."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from repo_models import factor_of, scale_model, write_version
from repo_models import run_on_engine as run

from duetime.config import ModelConfig
from duetime.engine import Engine
from duetime.errors import ConfigError
from duetime.frontend.metadata import model_config_json
from duetime.repository.layout import scan_model
from duetime.repository.loader import load_version
from duetime.repository.tritonconfig import read_json_config, read_model_config, translate

QUEUE_FIELD = "dynamic_batching.default_queue_policy.max_queue_size"


def warnings_of(text: str) -> list[str]:
    said: list[str] = []
    translate(text, source="c", model_name="m", warn=said.append)
    return said


# -- 1. max_queue_size unset: bounded, and said so ----------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "max_batch_size: 1\n"
        "dynamic_batching { default_queue_policy { allow_timeout_override: true } }\n",
        "max_batch_size: 4\n",  # (no dynamic_batching at all)
        "max_batch_size: 4\ndynamic_batching { default_queue_policy { max_queue_size: 0 } }\n",
    ],
)
def test_a_config_without_a_queue_size_is_bounded_with_a_warning_naming_the_field(
    tmp_path: Path, text: str
) -> None:
    said = [w for w in warnings_of(text) if QUEUE_FIELD in w]
    assert len(said) == 1, said
    assert "no maximum (an unbounded queue)" in said[0]  # Triton's meaning
    assert "at most 1024 queued requests" in said[0]  # the bound used
    write_version(tmp_path, "m", 1, scale_model(2.0))
    (tmp_path / "m" / "config.pbtxt").write_text(text, encoding="utf-8")
    read = read_model_config(tmp_path / "m")
    assert read.config.scheduling.max_queue_size == 1024
    assert len([w for w in read.warnings if QUEUE_FIELD in w]) == 1
    model = load_version(scan_model(tmp_path / "m"), 1)
    try:
        shown = model_config_json(model)
    finally:
        model.executor.close()
    assert shown["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 1024
    # the config endpoint's config, loaded back, sets the bound: no warning then
    back: list[str] = []
    read_json_config(shown, source="c", model_name="m", warn=back.append)
    assert not [w for w in back if QUEUE_FIELD in w]


def test_a_config_with_a_queue_size_is_not_warned_of() -> None:
    text = "max_batch_size: 4\ndynamic_batching { default_queue_policy { max_queue_size: 8 } }\n"
    assert not [w for w in warnings_of(text) if "max_queue_size" in w]


def test_the_bound_with_priority_levels_is_said_to_cover_every_level() -> None:
    text = "max_batch_size: 4\ndynamic_batching { priority_levels: 2 default_priority_level: 1 }\n"
    said = [w for w in warnings_of(text) if QUEUE_FIELD in w]
    assert len(said) == 1
    assert "in all, over every priority level" in said[0]


# -- 2. one JSON config, one meaning --------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"max_batch_size": 4},
        {"max_batch_size": "4"},  # (protobuf's int64 as a string: gRPC's as_json)
        {"maxBatchSize": "4"},  # (protobuf's JSON name)
        {"backend": "onnxruntime", "max_batch_size": 4},
        {"name": "m", "platform": "onnxruntime_onnx", "max_batch_size": "4"},
    ],
)
def test_a_minimal_json_config_means_one_thing_whatever_its_spelling(
    body: dict[str, object],
) -> None:
    config = read_json_config(body, source="c", model_name="m")
    assert config.max_batch_size == 4
    assert (config.instances, config.scheduling.priority_levels) == (1, 0)
    assert not config.scheduling.ignore_priority


def test_a_version_policy_as_protobuf_writes_it_reads_as_duetimes() -> None:
    for body, expected in [
        ({"version_policy": {"latest": {"num_versions": "2"}}}, {"latest": {"num_versions": 2}}),
        ({"versionPolicy": {"latest": {"numVersions": 2}}}, {"latest": {"num_versions": 2}}),
        ({"version_policy": {"specific": {"versions": ["1", "3"]}}},
         {"specific": {"versions": [1, 3]}}),
    ]:  # fmt: skip
        config = read_json_config(body, source="c", model_name="m")
        assert config.version_policy.model_dump(exclude_none=True) == expected
        assert config.instances == 1


def test_a_json_string_that_is_no_number_is_still_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="max_batch_size"):
        read_json_config({"max_batch_size": "many"}, source="c", model_name="m")


# -- 3. an empty config.pbtxt is served as no config ---------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["", "# nothing set\n", 'name: "m"\n', 'platform: "onnxruntime_onnx"\n', "max_batch_size: 0\n"],
)
def test_an_empty_triton_config_serves_as_no_config(tmp_path: Path, text: str) -> None:
    write_version(tmp_path, "m", 1, scale_model(2.0))
    write_version(tmp_path, "n", 1, scale_model(3.0))
    (tmp_path / "m" / "config.pbtxt").write_text(text, encoding="utf-8")
    read = read_model_config(tmp_path / "m")
    assert read.config.model_dump() == ModelConfig().model_dump()
    assert read.warnings == ()
    assert read_json_config({}, source="c", model_name="m").model_dump() == (
        ModelConfig().model_dump()
    )
    served = {}
    for name in ("m", "n"):
        model = load_version(scan_model(tmp_path / name), 1)
        try:
            shown = model_config_json(model)
        finally:
            model.executor.close()
        served[name] = (
            shown["max_batch_size"],
            sum(int(g["count"]) for g in shown["instance_group"]),
            shown["dynamic_batching"].get("priority_levels", 0),
            "any_priority_level" in shown.get("parameters", {}),
        )
    assert served["m"] == served["n"]


# -- 4. a specific version without a folder ------------------------------------------------------


def test_a_specific_version_without_a_folder_is_named_in_the_log_and_the_index(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for version in (1, 2):
        write_version(tmp_path, "m", version, scale_model(version))
    (tmp_path / "m" / "config.pbtxt").write_text(
        "max_batch_size: 4\nversion_policy: { specific { versions: [1, 5] } }\n", encoding="utf-8"
    )
    said = "version 5 is specified for model 'm', but the version directory is not present"

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 1.0
        rows = [e for e in engine.repository_index() if e["name"] == "m"]
        assert {"name": "m", "version": "5", "state": "UNAVAILABLE", "reason": said} in rows
        assert [e["version"] for e in rows if e.get("state") == "READY"] == ["1"]

    with caplog.at_level(logging.WARNING):
        run(tmp_path, scenario)
    assert caplog.text.count(said) == 1


def test_version_policy_names_the_missing_specific_versions() -> None:
    policy = ModelConfig.model_validate({"version_policy": {"specific": {"versions": [7, 1, 5]}}})
    assert policy.version_policy.select([1, 2]) == [1]
    assert policy.version_policy.missing([1, 2]) == [5, 7]
    assert ModelConfig().version_policy.missing([1]) == []


# -- 5. priority_queue_policy and preserve_ordering -----------------------------------------------


def test_priority_queue_policy_is_warned_of_truthfully() -> None:
    text = (
        "max_batch_size: 4\ndynamic_batching { priority_levels: 2 default_priority_level: 2 "
        "priority_queue_policy { key: 1 value { max_queue_size: 1 default_timeout_microseconds: "
        "1000 } } }\n"
    )
    said = [w for w in warnings_of(text) if "priority_queue_policy" in w]
    assert len(said) == 1
    assert "per-priority queue policies are not supported" in said[0]
    assert "the default_queue_policy applies to every level" in said[0]
    assert "Triton-only" not in said[0]
    assert "sizes batches" not in said[0]


@pytest.mark.parametrize("key", [0, 3, 7])
def test_a_priority_queue_policy_key_outside_the_levels_is_refused(key: int) -> None:
    text = (
        "max_batch_size: 4\ndynamic_batching { priority_levels: 2 default_priority_level: 1 "
        f"priority_queue_policy {{ key: {key} value {{ max_queue_size: 1 }} }} }}\n"
    )
    with pytest.raises(
        ConfigError, match=rf"dynamic_batching\.priority_queue_policy: key {key} .*\[1, 2\]"
    ):
        translate(text, source="c", model_name="m", warn=lambda _: None)


def test_preserve_ordering_is_warned_of_with_its_true_reason() -> None:
    said = warnings_of("max_batch_size: 4\ndynamic_batching { preserve_ordering: true }\n")
    ordering = [w for w in said if "preserve_ordering" in w]
    assert len(ordering) == 1
    assert "not supported" in ordering[0]
    assert "Triton-only" not in ordering[0]
