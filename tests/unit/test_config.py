"""Unit tests for `duetime.config`: model config files and server settings."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from duetime.config import (
    ModelConfig,
    SchedulingConfig,
    ServerSettings,
    load_model_config,
    parse_model_config,
    read_config_file,
    server_settings,
)
from duetime.errors import ConfigError

TOML = """
max_batch_size = 16
instances = 2
default_timeout_ms = 2.5

[scheduling]
policy = "fifo"
max_queue_delay_us = 500

[[inputs]]
name = "x"
datatype = "FP32"
dims = [4, -1]

[[outputs]]
name = "y"
"""

YAML = """
max_batch_size: 16
instances: 2
default_timeout_ms: 2.5
scheduling:
  policy: fifo
  max_queue_delay_us: 500
inputs:
  - name: x
    datatype: FP32
    dims: [4, -1]
outputs:
  - name: y
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_when_there_is_no_config_file(tmp_path: Path) -> None:
    config = load_model_config(tmp_path)
    assert config == ModelConfig()
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size is None
    assert config.instances == 1
    assert config.default_timeout_ms is None
    assert config.scheduling == SchedulingConfig(
        policy="edf", max_queue_delay_us=0, max_queue_size=1024
    )
    assert config.inputs is None
    assert config.outputs is None


@pytest.mark.parametrize(
    ("name", "text"), [("config.toml", TOML), ("config.yaml", YAML), ("config.yml", YAML)]
)
def test_reads_toml_and_yaml(tmp_path: Path, name: str, text: str) -> None:
    write(tmp_path, name, text)
    config = load_model_config(tmp_path)
    assert config.max_batch_size == 16
    assert config.instances == 2
    assert config.default_timeout_ms == 2.5
    assert config.scheduling.policy == "fifo"
    assert config.scheduling.max_queue_delay_us == 500
    assert config.scheduling.max_queue_size == 1024
    assert config.inputs is not None
    assert [(t.name, t.datatype, t.dims) for t in config.inputs] == [("x", "FP32", [4, -1])]
    assert config.outputs is not None
    assert [(t.name, t.datatype, t.dims) for t in config.outputs] == [("y", None, None)]


def test_yaml_traffic_tables_take_integer_versions(tmp_path: Path) -> None:
    """YAML reads `{1: 70}` with integer keys: they were refused "Input should be a valid
    string", where TOML's `{ 1 = 70 }` is taken (found by a tester)."""
    write(tmp_path, "config.yaml", "traffic:\n  weights: {1: 70, 02: 30}\n  shadow: {3: 0.5}\n")
    traffic = load_model_config(tmp_path).traffic
    assert traffic.weights == {"1": 70.0, "2": 30.0}
    assert traffic.shadow == {"3": 0.5}
    write(tmp_path, "config.yaml", "traffic:\n  weights: {-1: 70}\n")
    with pytest.raises(ConfigError, match="version '-1' is not an integer version"):
        load_model_config(tmp_path)


@pytest.mark.parametrize(
    ("name", "text"), [("config.toml", ""), ("config.yaml", ""), ("config.yaml", "# nothing\n")]
)
def test_empty_file_means_defaults(tmp_path: Path, name: str, text: str) -> None:
    write(tmp_path, name, text)
    assert load_model_config(tmp_path) == ModelConfig()


def test_inline_execution_has_one_instance() -> None:
    assert ModelConfig.model_validate({"execution": "inline"}).execution == "inline"
    with pytest.raises(ValueError, match=r"inline.*one instance; got instances = 2"):
        ModelConfig.model_validate({"execution": "inline", "instances": 2})
    with pytest.raises(ValueError, match="execution"):
        ModelConfig.model_validate({"execution": "fiber"})


def test_config_is_frozen() -> None:
    config = ModelConfig()
    with pytest.raises(ValueError, match="frozen"):
        config.instances = 3


@pytest.mark.parametrize(
    ("data", "field", "got"),
    [
        pytest.param({"max_batch_sise": 4}, "max_batch_sise", "4", id="unknown-top-level"),
        pytest.param(
            {"scheduling": {"polcy": "edf"}}, "scheduling.polcy", "'edf'", id="unknown-nested"
        ),
        pytest.param(
            {"inputs": [{"name": "x", "shape": [1]}]}, "inputs.0.shape", "[1]", id="unknown-in-list"
        ),
        pytest.param({"max_batch_size": -1}, "max_batch_size", "-1", id="negative"),
        pytest.param({"max_batch_size": 70_000}, "max_batch_size", "70000", id="too-big"),
        pytest.param({"instances": 0}, "instances", "0", id="no-instances"),
        pytest.param({"default_timeout_ms": 0}, "default_timeout_ms", "0", id="zero-timeout"),
        pytest.param({"platform": "tensorrt_plan"}, "platform", "'tensorrt_plan'", id="platform"),
        pytest.param(
            {"scheduling": {"policy": "lifo"}}, "scheduling.policy", "'lifo'", id="policy"
        ),
        pytest.param(
            {"scheduling": {"max_queue_size": 0}}, "scheduling.max_queue_size", "0", id="queue-size"
        ),
        pytest.param(
            {"inputs": [{"name": "x", "datatype": "FP33"}]},
            "inputs.0.datatype",
            "'FP33'",
            id="datatype",
        ),
        pytest.param({"inputs": [{"name": ""}]}, "inputs.0.name", "''", id="empty-name"),
        pytest.param(
            {"inputs": [{"name": "x", "dims": [1, "a"]}]}, "inputs.0.dims.1", "'a'", id="dims-type"
        ),
        pytest.param(
            {"outputs": [{"name": "y", "dims": [-2]}]},
            "outputs.0.dims.0",
            "-2",
            id="dims-below-minus-1",
        ),
        pytest.param({"inputs": {"name": "x"}}, "inputs", "{'name': 'x'}", id="inputs-not-a-list"),
    ],
)
def test_invalid_fields_name_the_source_path_and_value(
    data: dict[str, Any], field: str, got: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_model_config(data, source="repo/m/config.toml")
    message = caught.value.message
    assert message.startswith("repo/m/config.toml: ")
    assert f"field '{field}'" in message
    assert f"(got {got})" in message


def test_missing_required_field_has_no_got(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"field 'inputs\.0\.name': Field required$"):
        parse_model_config({"inputs": [{"datatype": "FP32"}]}, source="s")


def test_every_problem_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "config.toml", 'max_batch_size = -1\n[scheduling]\npolicy = "lifo"\n')
    with pytest.raises(ConfigError) as caught:
        load_model_config(tmp_path)
    message = caught.value.message
    assert message.count(str(path)) == 2
    assert "field 'max_batch_size'" in message
    assert "field 'scheduling.policy'" in message


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        pytest.param("config.toml", "max_batch_size = \n", "cannot be read as TOML", id="bad-toml"),
        pytest.param("config.yaml", "a: [\n", "cannot be read as YAML", id="bad-yaml"),
        pytest.param("config.yml", "a: [\n", "cannot be read as YML", id="bad-yml"),
        pytest.param(
            "config.yaml", "- 1\n- 2\n", "expected a table of settings, got list", id="yaml-list"
        ),
        pytest.param(
            "config.yaml", "just text\n", "expected a table of settings, got str", id="yaml-str"
        ),
    ],
)
def test_unreadable_files_name_the_file(tmp_path: Path, name: str, text: str, match: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError, match=re.escape(str(path)) + ": " + match):
        load_model_config(tmp_path)


def test_yaml_syntax_error_is_one_line_with_its_place(tmp_path: Path) -> None:
    path = write(tmp_path, "config.yaml", "max_batch_size: 4\ninputs: [a, b\n")
    with pytest.raises(ConfigError) as caught:
        read_config_file(path)
    assert caught.value.message == (
        f"{path}: cannot be read as YAML: line 3, column 1: expected ',' or ']', but got "
        "'<stream end>' (while parsing a flow sequence at line 2, column 9)"
    )


def test_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_bytes(b"name = '\xff'\n")
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        read_config_file(path)


def test_yaml_error_names_the_file_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, "config.yaml", "instances: many\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: field 'instances'") + ".*got 'many'"):
        load_model_config(tmp_path)


@pytest.mark.parametrize("names", [("config.toml", "config.yaml"), ("config.yaml", "config.yml")])
def test_two_config_files_is_an_error(tmp_path: Path, names: tuple[str, str]) -> None:
    for name in names:
        write(tmp_path, name, "")
    with pytest.raises(
        ConfigError, match=f"more than one config file \\({', '.join(names)}\\); keep one"
    ):
        load_model_config(tmp_path)


def test_a_folder_named_like_a_config_file_is_refused(tmp_path: Path) -> None:
    """Not ignored: the model would quietly run on defaults its owner meant to change."""
    (tmp_path / "config.toml").mkdir()
    with pytest.raises(ConfigError, match=r"config\.toml: a config file's name, but not a file"):
        load_model_config(tmp_path)


# -- server settings ----------------------------------------------------------------------------


def test_server_settings_defaults() -> None:
    assert server_settings({}, env={}) == ServerSettings()
    settings = ServerSettings()
    assert (settings.host, settings.http_port, settings.grpc_port) == ("127.0.0.1", 8000, 8001)
    assert settings.model_repository is None


def test_server_settings_from_env() -> None:
    env = {
        "DUETIME_HTTP_PORT": "9000",
        "DUETIME_HOST": "0.0.0.0",
        "DUETIME_MODEL_REPOSITORY": "/models",
        "DUETIME_IDLE_TIMEOUT_S": "2.5",
        "DUETIME_UNRELATED": "ignored",
        "HTTP_PORT": "1",
    }
    settings = server_settings({}, env=env)
    assert settings.http_port == 9000
    assert settings.host == "0.0.0.0"
    assert settings.model_repository == Path("/models")
    assert settings.idle_timeout_s == 2.5
    assert settings.grpc_port == 8001


def test_server_settings_overrides_win_over_env_and_none_is_not_an_override() -> None:
    env = {"DUETIME_HTTP_PORT": "9000", "DUETIME_GRPC_PORT": "9001"}
    settings = server_settings({"http_port": 1234, "grpc_port": None}, env=env)
    assert settings.http_port == 1234
    assert settings.grpc_port == 9001


def test_server_settings_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUETIME_GRPC_PORT", "7001")
    assert server_settings({}).grpc_port == 7001


@pytest.mark.parametrize(
    ("overrides", "env", "match"),
    [
        pytest.param(
            {}, {"DUETIME_HTTP_PORT": "abc"}, "field 'http_port'.*got 'abc'", id="env-not-int"
        ),
        pytest.param({"http_port": 70_000}, {}, "field 'http_port'.*got 70000", id="port-range"),
        pytest.param(
            {}, {"DUETIME_MAX_BODY_BYTES": "10"}, "field 'max_body_bytes'.*got '10'", id="too-small"
        ),
        pytest.param({"idle_timeout_s": 0}, {}, "field 'idle_timeout_s'", id="zero-timeout"),
        pytest.param(  # (gc.set_threshold raised OverflowError at start: a traceback)
            {"gc_threshold": 2**31}, {}, "field 'gc_threshold'.*2147483647", id="gc-past-int"
        ),
        pytest.param(
            {}, {"DUETIME_GC_THRESHOLD": "9999999999"}, "field 'gc_threshold'", id="gc-env"
        ),
        pytest.param(
            {"bogus": 1}, {}, "field 'bogus': Extra inputs are not permitted", id="unknown"
        ),
    ],
)
def test_server_settings_errors(overrides: dict[str, Any], env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match="^server settings: " + match):
        server_settings(overrides, env=env)


@pytest.mark.parametrize(
    ("overrides", "env"),
    [({"control_token": "hunter2"}, {}), ({}, {"DUETIME_CONTROL_TOKEN": "hunter2"})],
    ids=["flag", "env"],
)
def test_a_bad_control_token_is_not_echoed(overrides: dict[str, Any], env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as raised:
        server_settings(overrides, env=env)
    assert "hunter2" not in raised.value.message
    assert "field 'control_token'" in raised.value.message
    assert "at least 16 characters" in raised.value.message
    assert "got 7 characters" in raised.value.message
    assert "hunter2" not in repr(ServerSettings(control_token="x" * 16 + "hunter2"))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"version_policy": {"all": {}, "latest": {}}}, "choose one of latest, all, specific"),
        ({"version_policy": {"latest": {"num_versions": 0}}}, "greater than or equal to 1"),
        ({"version_policy": {"specific": {"versions": []}}}, "at least 1 item"),
        (
            {"version_policy": {"specific": {"versions": [1, 2**63]}}},
            "versions.1': Input should be less than or equal to 9223372036854775807",
        ),
        ({"version_policy": {"all": {"x": 1}}}, "'all' takes no settings"),
        ({"variants": [{"name": "a", "file": "../x.onnx"}]}, "should match pattern"),
        ({"variants": [{"name": "a", "file": "model.onnx"}]}, "is the primary model"),
        (
            {"variants": [{"name": "a", "file": "a.onnx"}, {"name": "a", "file": "b.onnx"}]},
            "name a appears more than once",
        ),
    ],
)
def test_bad_lifecycle_config_names_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_model_config(data, source="config.toml")
    assert message in caught.value.message
    assert caught.value.message.startswith("config.toml: ")


def test_version_policy_selects_versions() -> None:
    def select(data: dict[str, Any]) -> list[int]:
        return parse_model_config(data, source="c").version_policy.select([1, 3, 2])

    assert select({}) == [3]
    assert select({"version_policy": {"latest": {"num_versions": 2}}}) == [3, 2]
    assert select({"version_policy": {"all": {}}}) == [3, 2, 1]
    assert select({"version_policy": {"specific": {"versions": [1, 9]}}}) == [1]


def test_load_model_from_a_variable_is_a_comma_separated_list() -> None:
    """No value of `DUETIME_LOAD_MODEL` worked: a tuple was required."""
    settings = server_settings({}, env={"DUETIME_LOAD_MODEL": "mlp, resnet"})
    assert settings.load_model == ("mlp", "resnet")


def test_a_variable_naming_no_setting_is_warned_of_with_the_nearest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`DUETIME_RECORD` (the flag is --record) was ignored without a word."""
    with caplog.at_level(logging.WARNING, logger="duetime"):
        server_settings({}, env={"DUETIME_RECORD": "x.cap", "DUETIME_FUZZ_EXAMPLES": "5"})
    assert (
        "DUETIME_RECORD names no server setting; ignored (did you mean DUETIME_RECORD_PATH?)"
        in (caplog.text)
    )
    assert "FUZZ" not in caplog.text


@pytest.mark.parametrize(
    "token",
    [
        " " + "s" * 20,
        "s" * 20 + " ",
        " " * 20,
        "s" * 10 + "\t" + "s" * 10,
        "s" * 20 + "\n",
        "s" * 10 + " " + "s" * 10,
        "s" * 20 + "é",
        "s" * 20 + "\x00",
    ],
    ids=["lead", "trail", "spaces", "tab", "newline", "inner-space", "non-ascii", "nul"],
)
def test_a_control_token_no_client_can_send_is_refused_at_start(token: str) -> None:
    """Taken before, such a token matched no call: clients trim a header's value, and neither
    HTTP nor gRPC metadata carries anything but visible ASCII as it is."""
    with pytest.raises(ConfigError) as raised:
        server_settings({"control_token": token}, env={})
    assert "field 'control_token'" in raised.value.message
    assert "visible ASCII" in raised.value.message
    assert token.strip() not in raised.value.message or not token.strip()


def test_a_control_token_of_visible_ascii_is_taken() -> None:
    token = "Ab0-._~+/=!#$%&'*^`|" + "x" * 4
    assert server_settings({"control_token": token}, env={}).control_token == token


@pytest.mark.parametrize(
    ("ports", "said"),
    [
        ({"http_port": 9000, "metrics_port": 9000}, "(--http-port) and metrics_port"),
        ({"http_port": 9000, "grpc_port": 9000}, "(--http-port) and grpc_port (--grpc-port) are"),
        ({"grpc_port": 9001, "metrics_port": 9001}, "(--metrics-port) are both 9001"),
    ],
)
def test_two_endpoints_on_one_port_are_refused_naming_both(
    ports: dict[str, int], said: str
) -> None:
    """`--http-port 9000 --metrics-port 9000` was told the port was taken, "pass --http-port
    with a free port", though it was free until the metrics took it (found by a tester)."""
    with pytest.raises(ValidationError, match=re.escape(said)):
        ServerSettings(**ports)


def test_ports_0_and_a_port_of_metrics_turned_off_may_repeat() -> None:
    ServerSettings(http_port=0, grpc_port=0, metrics_port=0)
    ServerSettings(http_port=9000, metrics_port=9000, metrics=False)


@pytest.mark.parametrize(("name", "text"), [("config.toml", TOML), ("config.yaml", YAML)])
def test_a_config_file_starting_with_a_byte_order_mark_loads(
    tmp_path: Path, name: str, text: str
) -> None:
    """Found by a tester: a config.toml saved by Notepad was refused as "Invalid statement (at
    line 1, column 1)", where config.pbtxt and config.yaml skip the mark."""
    (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_model_config(tmp_path).max_batch_size == 16


@pytest.mark.parametrize("name", ["config.toml", "config.yaml"])
def test_a_byte_that_is_not_utf8_is_named_by_its_line_and_column(tmp_path: Path, name: str) -> None:
    """It was "'utf-8' codec can't decode byte 0xf6 in position 4", with no line."""
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf# caf\xc3\xa9\n# Gr\xf6\xdfe\n")
    with pytest.raises(ConfigError) as caught:
        load_model_config(tmp_path)
    assert caught.value.message == (
        f"{path}: cannot be read as {path.suffix[1:].upper()}: line 2, column 5: byte 0xf6 is "
        "not UTF-8; save the file as UTF-8"
    )


@pytest.mark.parametrize(
    ("data", "hint"),
    [
        ({"max_batch": 4}, "did you mean 'max_batch_size'?"),
        ({"scheduling": {"max_queue_dealy_us": 100}}, "did you mean 'max_queue_delay_us'?"),
        ({"breaker": {"failure": 3}}, "did you mean 'failures'?"),
        ({"inputs": [{"name": "x", "dim": [4]}]}, "did you mean 'dims'?"),
        ({"max_queue_dealy_us": 100}, "did you mean 'scheduling.max_queue_delay_us'?"),
        ({"max_queue_delay_us": 100},
         "'max_queue_delay_us' is a setting of 'scheduling': write it there"),
        ({"scheduling": {"max_batch_size": 8}},
         "'max_batch_size' is a top-level setting, not one of 'scheduling'"),
        ({"dims": [4]}, "'dims' is a setting of 'inputs' or 'outputs': write it there"),
    ],
)  # fmt: skip
def test_an_unknown_key_is_told_the_setting_it_may_mean(data: dict[str, object], hint: str) -> None:
    """Found by a tester: each got "Extra inputs are not permitted" and nothing more."""
    with pytest.raises(ConfigError) as caught:
        parse_model_config(data, source="c")
    assert "Extra inputs are not permitted" in caught.value.message
    assert caught.value.message.endswith(f"; {hint}")


def test_a_key_near_no_setting_gets_no_guess() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_model_config({"zzz": 1}, source="c")
    assert caught.value.message == "c: field 'zzz': Extra inputs are not permitted (got 1)"


def test_a_breaker_opening_longer_than_its_maximum_is_refused_naming_both() -> None:
    """Found by a tester: open_s 100 with max_open_s 10 opened for 100 s, then for 10."""
    with pytest.raises(ConfigError, match=r"open_s 100 is over max_open_s 10"):
        parse_model_config({"breaker": {"open_s": 100, "max_open_s": 10}}, source="c")
    assert parse_model_config({"breaker": {"open_s": 10, "max_open_s": 10}}, source="c")


def test_a_breaker_bounded_below_the_default_open_period_opens_for_its_bound() -> None:
    """A config giving max_open_s = 3 alone was refused for the default open_s, 5, which its
    writer never wrote (found by a tester): the first open period is the bound."""
    config = parse_model_config({"breaker": {"max_open_s": 3}}, source="c")
    assert (config.breaker.open_s, config.breaker.max_open_s) == (3, 3)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("config.toml", 'name = "m"\nbackend = "onnxruntime"\nmax_batch_size = 4\n'),
        ("config.yaml", "name: m\nbackend: onnxruntime\nmax_batch_size: 4\n"),
    ],
)
def test_a_config_file_may_give_the_model_s_name_and_backend_as_json_may(
    tmp_path: Path, name: str, text: str
) -> None:
    """Found by a tester: the README lists them among the fields both forms share, and a load
    request's JSON took them, but config.toml refused them as extra inputs."""
    folder = tmp_path / "m"
    folder.mkdir()
    write(folder, name, text)
    assert load_model_config(folder).max_batch_size == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name = "other"\n', "name: 'other' differs from the model's folder 'm'"),
        ("name = 4\n", "name: expected the model's name, 'm' (its folder's), got 4"),
        ('backend = "python"\n', "backend: 'python': duetime serves ONNX models with ONNX "
                                 "Runtime (platform 'onnxruntime_onnx', backend 'onnxruntime')"),
    ],
)  # fmt: skip
def test_a_config_file_s_name_and_backend_are_checked_as_triton_checks_them(
    tmp_path: Path, text: str, message: str
) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    path = write(folder, "config.toml", text)
    with pytest.raises(ConfigError) as caught:
        load_model_config(folder)
    assert caught.value.message == f"{path}: {message}"


def test_a_name_that_differs_only_in_unicode_normalization_shows_the_code_points(
    tmp_path: Path,
) -> None:
    """Found by a tester: a folder `café` in NFD and a name `café` in NFC were refused as
    "'café' differs from the model's folder 'café'". Refused still, as Triton refuses it."""
    folder = tmp_path / "cafe\u0301"
    folder.mkdir()
    path = write(folder, "config.toml", 'name = "caf\u00e9"\n')
    with pytest.raises(ConfigError) as caught:
        load_model_config(folder)
    assert caught.value.message == (
        f"{path}: name: 'caf\u00e9' differs from the model's folder 'cafe\u0301' (only in "
        "Unicode normalization, how their accented letters are encoded: the name is "
        "'caf\\xe9', the folder 'cafe\\u0301'; write the name as the folder has it, or leave "
        "it out)"
    )
