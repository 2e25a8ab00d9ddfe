"""A load refused for its config override's version_policy leaves no made-up version listed.

Probe reload (repro_failed_override_trace): explicit mode, versions 1 and 2 served (the
default policy serves 2); a load whose override named `specific [9]` was refused 400 and 2
served on, but the index listed version 9 UNAVAILABLE ("version directory is not present") for
good, though README says a failed load "leaves no trace"."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_models import run_on_engine, scale_model, write_version

from duetime.config import ModelConfig
from duetime.engine import Engine
from duetime.errors import InvalidInput


def listed(engine: Engine) -> dict[str, tuple[str, str]]:
    return {
        e["version"]: (e["state"], e.get("reason", ""))
        for e in engine.repository_index()
        if e["name"] == "m" and "version" in e
    }


def test_a_refused_override_leaves_no_absent_version_in_the_index(tmp_path: Path) -> None:
    for version in (1, 2):
        write_version(tmp_path, "m", version, scale_model(version))
    override = ModelConfig.model_validate(
        {"max_batch_size": 8, "version_policy": {"specific": {"versions": [9]}}}
    )

    async def scenario(engine: Engine) -> None:
        before = listed(engine)
        assert "9" not in before
        with pytest.raises(InvalidInput, match="version_policy"):
            await engine.load_model("m", override)
        after = listed(engine)
        assert "9" not in after, after
        assert after.keys() == before.keys()
        assert sorted(engine.registry.snapshot.models["m"].versions) == ["2"]

    run_on_engine(
        tmp_path,
        scenario,
        limit_s=30,
        control_mode="explicit",
        startup_models=("m",),
        stable_s=0.0,
    )
