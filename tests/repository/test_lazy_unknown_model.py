"""With lazy loading, a request for an unknown model is told the models a request loads, not
only those loaded so far."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_models import factor_of, run_on_engine, scale_model, write_version

from duetime import Engine
from duetime.errors import ModelNotFound

pytestmark = pytest.mark.timeout(60)

UNKNOWN = "Request for unknown model: 'nope' is not found; served models: "


async def _unknown(engine: Engine) -> str:
    with pytest.raises(ModelNotFound) as refused:
        await factor_of(engine, "nope")
    return refused.value.message


def test_an_unknown_model_is_told_the_models_lazy_loading_serves(tmp_path: Path) -> None:
    """It said "served models: none" while every model of the repository loads on its first
    request, as `GET /v1/models` lists them (found by a tester)."""
    write_version(tmp_path, "a", 1, scale_model(1))
    write_version(tmp_path, "b", 1, scale_model(2))

    async def scenario(engine: Engine) -> None:
        assert await _unknown(engine) == f"{UNKNOWN}'a', 'b' (each loads on its first request)"
        assert await factor_of(engine, "a") == 1.0
        assert await _unknown(engine) == (
            f"{UNKNOWN}'a', 'b' ('b' not loaded yet: each loads on its first request)"
        )

    run_on_engine(tmp_path, scenario, lazy=True)


def test_without_lazy_loading_only_the_served_models_are_told(tmp_path: Path) -> None:
    write_version(tmp_path, "a", 1, scale_model(1))
    write_version(tmp_path, "b", 1, scale_model(2))

    async def scenario(engine: Engine) -> None:
        assert await _unknown(engine) == f"{UNKNOWN}none"
        await engine.load_model("a")
        assert await _unknown(engine) == f"{UNKNOWN}'a'"

    run_on_engine(tmp_path, scenario, control_mode="explicit", lazy=True)
