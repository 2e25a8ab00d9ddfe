"""In-process repository arguments of the wrong type: refused naming the argument, never a
bare TypeError or AttributeError from deep inside, nor read as something else."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from repo_models import inputs, scale_model, write_version

from duetime import Engine
from duetime.config import ModelConfig, server_settings
from duetime.errors import ConfigError, InvalidInput
from duetime.repository.manager import RepositoryOptions
from duetime.server import repository_options


@pytest.mark.parametrize("name", [5, None, b"m"], ids=repr)
def test_a_load_or_unload_of_no_name_is_invalid_input(tmp_path: Path, name: object) -> None:
    write_version(tmp_path, "m", 1, scale_model(2))
    with Engine.open(tmp_path, options=RepositoryOptions(control_mode="explicit")) as engine:
        for call in (engine.load_model, engine.unload_model):
            with pytest.raises(InvalidInput, match=r"model name .* is not valid"):
                asyncio.run(call(name))  # type: ignore[arg-type]


def test_a_control_mode_that_is_none_of_the_three_is_refused() -> None:
    with pytest.raises(ConfigError, match="'control_mode': expected one of none, explicit, poll"):
        RepositoryOptions(control_mode="bogus")  # type: ignore[arg-type]


def test_startup_models_given_as_one_string_is_refused_not_split_into_letters() -> None:
    with pytest.raises(ConfigError, match=r"'startup_models'.*\('mlp',\)"):
        RepositoryOptions(control_mode="explicit", startup_models="mlp")  # type: ignore[arg-type]
    assert RepositoryOptions(startup_models=("mlp",)).startup_models == ("mlp",)


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("poll_s", 0, "greater than 0"),
        ("poll_s", -1.0, "greater than 0"),
        ("poll_s", math.nan, "a finite number"),
        ("stable_s", -1, "greater than or equal to 0"),
        ("max_loaded_models", 0, "greater than or equal to 1"),
        ("max_loaded_models", True, "a valid integer"),
        ("max_loaded_bytes", -5, "greater than or equal to 1"),
        ("lazy", "yes", "a valid boolean"),
        ("strict_readiness", None, "a valid boolean"),
        ("drain_s", -1, "greater than or equal to 0"),
        ("max_run_memory_bytes", 0, "greater than or equal to 1"),
        ("max_run_memory_bytes", -1, "greater than or equal to 1"),
    ],
)
def test_options_the_cli_refuses_are_refused_naming_the_option(
    option: str, value: object, expected: str
) -> None:
    """They were taken without a word: `poll_s=0` rescanned the repository non-stop (a core
    busy while idle), `max_loaded_models=0` served no model, `lazy="yes"` made `ready` 'yes'
    (found by a tester). The rules are the server settings' (the CLI's)."""
    with pytest.raises(ConfigError, match=rf"^repository options: field '{option}': .*{expected}"):
        RepositoryOptions(**{option: value})


@pytest.mark.parametrize(
    ("option", "setting", "value"),
    [
        ("poll_s", "repository_poll_secs", 0),
        ("max_loaded_models", "max_loaded_models", 0),
        ("max_loaded_bytes", "max_loaded_bytes", -5),
        ("drain_s", "unload_drain_secs", -1),
        ("max_run_memory_bytes", "max_run_memory_bytes", -1),
    ],
)
def test_options_are_refused_in_the_cli_s_words(option: str, setting: str, value: int) -> None:
    """The server settings' rules, not a copy of them: the same words as the CLI's."""
    with pytest.raises(ConfigError) as cli:
        server_settings({setting: value}, env={})
    with pytest.raises(ConfigError) as in_process:
        RepositoryOptions(**{option: value})
    assert (
        str(cli.value).partition(f"field '{setting}': ")[2]
        == (str(in_process.value).partition(f"field '{option}': ")[2])
    )


def test_what_the_cli_takes_the_options_take() -> None:
    settings = server_settings(
        {"repository_poll_secs": "0.001", "unload_drain_secs": "0", "max_loaded_models": "1"},
        env={},
    )
    options = repository_options(settings)
    assert (options.poll_s, options.drain_s, options.max_loaded_models) == (0.001, 0.0, 1)
    options = RepositoryOptions(poll_s=3600, drain_s=0, stable_s=0.0, max_run_memory_bytes=1)
    assert (options.poll_s, options.drain_s, options.max_run_memory_bytes) == (3600, 0, 1)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ([("1/model.onnx", b"x")], r"^files: expected a mapping .* got list"),
        (b"1/model.onnx", r"^files: expected a mapping .* got bytes"),
        ({"1/model.onnx": "text"}, r"^files\['1/model.onnx'\]: expected the file's content .*str"),
        ({"1/model.onnx": None}, r"^files\['1/model.onnx'\]: .* got NoneType"),
        ({1: b"x"}, r"^files: expected paths in the model folder \(str\) as keys.* got int 1"),
    ],
    ids=["pairs", "bytes", "str content", "None content", "int key"],
)
def test_files_of_the_wrong_type_are_refused_naming_files(
    tmp_path: Path, files: object, expected: str
) -> None:
    """They failed deep in the load: "'list' object has no attribute 'items'", "memoryview: a
    bytes-like object is required, not 'str'" (found by a tester)."""
    config = ModelConfig.model_validate({"max_batch_size": 8})
    with Engine.open(tmp_path, options=RepositoryOptions(control_mode="explicit")) as engine:
        with pytest.raises(TypeError, match=expected):
            engine.load_model_blocking("m", config=config, files=files)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=expected):
            engine.load_model("m", config=config, files=files)  # type: ignore[arg-type]
        assert engine.repository_index() == []
        upload = {"1/model.onnx": memoryview(scale_model(3))}
        engine.load_model_blocking("m", config=config, files=upload)
        assert engine.infer("m", inputs())["y"][0, 0] == 3 * inputs()["x"][0, 0]


def test_an_unknown_startup_model_is_named_as_the_engine_s_option(tmp_path: Path) -> None:
    """It was "server settings: field 'load_model' (--load-model 'nope')": a setting and a flag
    an Engine's caller never gave (found by a tester); the CLI still names its flag."""
    write_version(tmp_path, "m", 1, scale_model(2))
    options = RepositoryOptions(control_mode="explicit", startup_models=("nope",))
    with pytest.raises(ConfigError) as refused:
        Engine.open(tmp_path, options=options)
    assert str(refused.value).startswith(
        "repository options: field 'startup_models' ('nope'): no model folder of that name"
    )
    assert "--load-model" not in str(refused.value)
