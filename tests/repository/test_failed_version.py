"""A version whose load failed, beside versions that serve, is unavailable with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_models import age, factor_of, inputs, run_on_engine, scale_model, write_version

from duetime.engine import Engine
from duetime.errors import ModelNotFound, ModelUnavailable


def versions_1_and_3_with_2_corrupt(repo: Path) -> Path:
    """Model m: versions 1 and 3 (scale 1 and 3), version 2 not ONNX, all served by its policy;
    its config file."""
    write_version(repo, "m", 1, scale_model(1))
    write_version(repo, "m", 2, b"not an onnx model")
    write_version(repo, "m", 3, scale_model(3))
    config = repo / "m" / "config.toml"
    config.write_text("version_policy = { all = {} }\n")
    age(config)
    return config


def test_a_version_whose_load_failed_beside_served_ones_is_unavailable_with_its_reason(
    tmp_path: Path,
) -> None:
    """Version 2 failed to load while 1 and 3 serve: a request for it was a 404 "version 2 is
    not found", as if there were no folder; Triton answers UNAVAILABLE "is not at ready state".
    Now 503 with the reason the index gives; a version with no folder stays 404."""
    versions_1_and_3_with_2_corrupt(tmp_path)

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine, version="3") == 3
        for named in ("2", "02"):
            with pytest.raises(ModelUnavailable) as caught:
                await engine.infer_async("m", inputs(), version=named)
            assert caught.value.message.startswith(
                f"Request for unknown model: 'm' version {named} is not at ready state: its "
                "load failed: "
            )
            assert "ONNX Runtime cannot load it" in caught.value.message
            assert caught.value.http_status == 503
        with pytest.raises(ModelNotFound, match="version 4 is not found"):
            await engine.infer_async("m", inputs(), version="4")

    run_on_engine(tmp_path, scenario)


def test_a_failed_version_the_policy_then_leaves_out_is_unknown_again(tmp_path: Path) -> None:
    """The failed load's row stayed after the policy dropped the version, and a request for it
    was told 503 "its load failed" where any other version outside the policy is 404."""
    config = versions_1_and_3_with_2_corrupt(tmp_path)

    async def scenario(engine: Engine) -> None:
        with pytest.raises(ModelUnavailable, match="its load failed"):
            await engine.infer_async("m", inputs(), version="2")
        config.write_text("version_policy = { specific = { versions = [1, 3] } }\n")
        age(config)
        manager = engine.manager
        assert manager is not None
        await manager.poll()
        with pytest.raises(ModelNotFound, match="version 2 is not found"):
            await engine.infer_async("m", inputs(), version="2")
        assert [e["version"] for e in engine.repository_index() if e["name"] == "m"] == [
            "1",
            "3",
        ]

    run_on_engine(tmp_path, scenario, control_mode="poll", poll_s=3600.0)
