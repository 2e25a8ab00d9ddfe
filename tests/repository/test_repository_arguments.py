"""In-process repository arguments of the wrong type: refused naming the argument, never a
bare TypeError or AttributeError from deep inside, nor read as something else."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from repo_models import scale_model, write_version

from duetime import Engine
from duetime.errors import ConfigError, InvalidInput
from duetime.repository.manager import RepositoryOptions


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
