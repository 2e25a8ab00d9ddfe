"""A config nested a few thousand levels deep (`x = [[[...]]]`: small, but past the parsers'
recursion) is refused like any unreadable config, naming its file (and field); and one model's
unexpected failure does not stop the poll from loading the others.

Found by a tester (repro_deep_config.py): the RecursionError escaped `read_config_file`, so the
server ended at start with a traceback, a load answered 500, and every poll stopped at that model
(models added after it never loaded). The same came from the JSON of a config.pbtxt's
`parameters` and of a load request's config override.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from repo_models import Scenario, age, factor_of, run_on_engine, scale_model, write_version

from duetime.config import read_config_file
from duetime.engine import Engine
from duetime.errors import ConfigError, InvalidInput
from duetime.frontend.rest import parse_config_override
from duetime.repository import manager as manager_module
from duetime.repository.tritonconfig import read_model_config

pytestmark = pytest.mark.timeout(60)

DEPTH = 3000
DEEP_TOML = "x = " + "[" * DEPTH + "]" * DEPTH + "\n"
DEEP_YAML = "x: " + "[" * DEPTH + "]" * DEPTH + "\n"
DEEP_JSON = "[" * 5000 + "]" * 5000


def run(repo: Path, scenario: Scenario, **options: object) -> None:
    run_on_engine(repo, scenario, limit_s=30, **options)


def write_config(repo: Path, model: str, name: str, text: str) -> Path:
    path = repo / model / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    age(path)
    return path


@pytest.mark.parametrize(
    ("name", "text"), [("config.toml", DEEP_TOML), ("config.yaml", DEEP_YAML)], ids=["toml", "yaml"]
)
def test_a_deeply_nested_config_file_is_a_config_error_naming_it(
    tmp_path: Path, name: str, text: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match="nested too deeply") as caught:
        read_config_file(path)
    assert caught.value.message.startswith(f"{path}: cannot be read as ")


def test_the_server_starts_beside_a_deeply_nested_config_and_the_index_names_it(
    tmp_path: Path,
) -> None:
    write_version(tmp_path, "good", 1, scale_model(2))
    write_version(tmp_path, "deep", 1, scale_model(3))
    path = write_config(tmp_path, "deep", "config.toml", DEEP_TOML)

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine, "good") == 2.0
        [entry] = [e for e in engine.repository_index() if e["name"] == "deep"]
        assert entry["state"] == "UNAVAILABLE"
        assert entry["reason"].startswith(f"{path}: cannot be read as TOML")

    run(tmp_path, scenario)


def test_an_explicit_load_of_a_deeply_nested_config_is_refused_naming_the_file(
    tmp_path: Path,
) -> None:
    write_version(tmp_path, "deep", 1, scale_model(3))
    path = write_config(tmp_path, "deep", "config.yaml", DEEP_YAML)

    async def scenario(engine: Engine) -> None:
        with pytest.raises(InvalidInput, match="nested too deeply") as caught:
            await engine.load_model("deep")
        assert str(path) in caught.value.message

    run(tmp_path, scenario, control_mode="explicit")


def test_a_poll_goes_on_past_a_model_whose_load_fails_unexpectedly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A fault of duetime's (not a ConfigError) in one model's load: the models after it still
    load, and the fault is logged."""
    write_version(tmp_path, "a", 1, scale_model(1))

    def broken(directory: Path) -> object:
        if directory.name == "a":
            raise RuntimeError("a bug of ours")
        return read_model_config(directory)

    async def scenario(engine: Engine) -> None:
        assert engine.manager is not None
        monkeypatch.setattr(manager_module, "read_model_config", broken)
        write_version(tmp_path, "b", 1, scale_model(5))
        (tmp_path / "a" / "1" / "model.onnx").write_bytes(scale_model(4))
        age(tmp_path / "a" / "1" / "model.onnx")
        await engine.manager.poll()  # (raised RuntimeError, and "b" was never loaded)
        assert await factor_of(engine, "b") == 5.0
        assert "repository poll: model a failed" in caplog.text

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


@pytest.mark.parametrize("parameter", ["tensors_without_dims", "tensors_of_any_shape", "duetime"])
def test_a_deeply_nested_json_parameter_of_a_config_pbtxt_is_refused_naming_it(
    tmp_path: Path, parameter: str
) -> None:
    value = DEEP_JSON if parameter != "duetime" else '{"breaker": ' + DEEP_JSON + "}"
    quoted = value.replace('"', '\\"')
    text = f'parameters {{ key: "{parameter}" value {{ string_value: "{quoted}" }} }}\n'
    path = write_config(tmp_path, "m", "config.pbtxt", text)
    with pytest.raises(ConfigError, match="nested too deeply") as caught:
        read_model_config(tmp_path / "m")
    assert caught.value.message.startswith(f"{path}: parameters['{parameter}']: ")
    assert len(caught.value.message) < 500  # (the value shown is cut short)


@pytest.mark.parametrize(
    "override",
    [
        {"parameters": {"duetime": {"string_value": '{"breaker": ' + DEEP_JSON + "}"}}},
        {"parameters": {"tensors_of_any_shape": {"string_value": DEEP_JSON}}},
    ],
    ids=["duetime", "tensors_of_any_shape"],
)
def test_a_load_override_with_a_deeply_nested_json_parameter_is_refused(
    override: dict[str, object],
) -> None:
    with pytest.raises(InvalidInput, match="nested too deeply"):
        parse_config_override(json.dumps(override), "m")


@pytest.mark.parametrize("field", ["max_batch_size", "input", "unknown"])
def test_a_load_override_nesting_as_deep_as_its_json_may_is_refused(field: str) -> None:
    """A load request's JSON may nest a thousand levels (orjson's limit); the repr of such a
    value in the error raised RecursionError (a 500)."""
    text = f'{{"{field}": {"[" * 1000 + "]" * 1000}}}'
    orjson.loads(text)  # (the request's JSON itself is read)
    with pytest.raises(InvalidInput, match=r"^load parameter 'config': "):
        parse_config_override(text, "m")
