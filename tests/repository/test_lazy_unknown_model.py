"""With lazy loading, a request for an unknown model is told the models a request loads, not
only those loaded so far."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_models import factor_of, run_on_engine, scale_model, write_version

from duetime import Engine
from duetime.errors import ModelNotFound, ModelUnavailable

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


def test_a_model_not_loaded_yet_is_unavailable_not_unknown(tmp_path: Path) -> None:
    """Its metadata and readiness said "not found" (404, NOT_FOUND: final to a client), the
    message listing it as served, where gRPC's ModelReady and V1 said not ready (found by a
    tester): it is unavailable (503, retry) until its first inference request loads it."""
    write_version(tmp_path, "a", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        with pytest.raises(ModelUnavailable, match="'a' has no available versions: it is not"):
            engine.registry.resolve("a", None)
        assert await factor_of(engine, "a") == 1.0  # (an inference loads it)
        assert engine.registry.resolve("a", None).model.name == "a"

    run_on_engine(tmp_path, scenario, lazy=True)
