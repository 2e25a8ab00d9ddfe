"""What serves after failed loads, and what the index says of it: the reason of a version that
serves on names the latest failed load; stand-ins for a broken version fill only the places the
version policy leaves empty."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from repo_models import Scenario, age, run_on_engine, scale_model, write_version

from duetime.config import ModelConfig
from duetime.engine import Engine
from duetime.errors import InvalidInput


def run(repo: Path, scenario: Scenario, **options: Any) -> None:
    run_on_engine(repo, scenario, limit_s=30, **options)


def served(engine: Engine, model: str = "m") -> list[str]:
    return sorted(engine.registry.snapshot.models[model].versions, key=int)


def reasons(engine: Engine, model: str = "m") -> dict[str, tuple[str, str]]:
    return {
        e["version"]: (e["state"], e.get("reason", ""))
        for e in engine.repository_index()
        if e["name"] == model and "version" in e
    }


def test_a_failed_plain_load_replaces_the_reason_an_earlier_failed_load_left(
    tmp_path: Path,
) -> None:
    """Version 1 kept saying a new load failed because of an override's version_policy (a
    load before) after a plain load had failed on a broken version 2."""
    write_version(tmp_path, "m", 1, scale_model(1))
    none_selected = ModelConfig.model_validate({"version_policy": {"specific": {"versions": [9]}}})

    async def scenario(engine: Engine) -> None:
        with pytest.raises(InvalidInput, match="version_policy"):
            await engine.load_model("m", none_selected)
        assert "version_policy" in reasons(engine)["1"][1]
        write_version(tmp_path, "m", 2, b"not an onnx model")
        with pytest.raises(InvalidInput, match="version 2"):
            await engine.load_model("m")
        assert served(engine) == ["1"]
        state, reason = reasons(engine)["1"]
        assert state == "READY"
        assert "version_policy" not in reason
        assert reason.startswith("a new load failed, the previous one still serves: ")
        assert "version 2" in reason
        (tmp_path / "m" / "2" / "model.onnx").write_bytes(scale_model(2))
        await engine.load_model("m")  # (a load that succeeds: no reason left)
        assert served(engine) == ["2"]
        assert reasons(engine)["2"] == ("READY", "")

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",), stable_s=0.0)


def test_stand_ins_fill_only_the_places_of_failed_versions(tmp_path: Path) -> None:
    """`latest 2`, versions 1 and 2 serving, a broken 3: 1 stands in for it. Then a good 4:
    1, 2 and 4 served (three under a two-version policy), 1 and 2 both said to stand in."""
    for version in (1, 2):
        write_version(tmp_path, "m", version, scale_model(version))
    config = tmp_path / "m" / "config.toml"
    config.write_text("version_policy = { latest = { num_versions = 2 } }\n")
    age(config)

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        assert served(engine) == ["1", "2"]
        write_version(tmp_path, "m", 3, b"not an onnx model")
        await manager.poll()
        assert served(engine) == ["1", "2"]  # (1 stands in for the broken 3)
        write_version(tmp_path, "m", 4, scale_model(4))
        await manager.poll()
        assert served(engine) == ["2", "4"]
        listed = reasons(engine)
        assert listed["1"][0] != "READY"  # (retired: unloading, then unavailable)
        assert "version 3" in listed["2"][1]  # (2 stands in for 3)
        assert listed["4"] == ("READY", "")

    run(tmp_path, scenario, control_mode="poll", poll_s=3600, stable_s=0.0)
