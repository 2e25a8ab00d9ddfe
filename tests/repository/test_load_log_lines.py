"""What the log says of loads and unloads: an unload is logged as a load is (it was never
logged, at any level), and a version ready after a failed load says so at WARNING, the default
level, where its failure was an ERROR (its recovery was at INFO alone: the operator never saw
the error cleared). Found by a tester (t114)."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import pytest
from repo_models import age, factor_of, scale_model, write_version
from repo_models import run_on_engine as run

from duetime.engine import Engine

pytestmark = pytest.mark.timeout(60)


def said(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "duetime.manager" and r.levelno >= level
    ]


def test_an_unload_is_logged_by_request_and_as_the_folder_goes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    write_version(tmp_path, "n", 1, scale_model(2))

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        await manager.unload("m")
        shutil.rmtree(tmp_path / "n")
        await manager.poll()
        for _ in range(500):  # (the drains end in the background)
            if "model n version 1 unloaded" in said(caplog):
                break
            await asyncio.sleep(0.01)

    with caplog.at_level(logging.INFO, logger="duetime.manager"):
        run(tmp_path, scenario, control_mode="poll", poll_s=3600)
    lines = said(caplog)
    assert "model m version 1 unloading: unloaded by request" in lines
    assert "model m version 1 unloaded" in lines
    assert "model n version 1 unloading: its folder was removed from the repository" in lines
    assert "model n version 1 unloaded" in lines


def test_a_version_ready_after_its_load_failed_says_so_at_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = write_version(tmp_path, "m", 1, b"not a model")

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        model.write_bytes(scale_model(3))
        age(model)
        await manager.poll()
        assert await factor_of(engine) == 3.0

    with caplog.at_level(logging.INFO, logger="duetime.manager"):
        run(tmp_path, scenario, control_mode="poll", poll_s=3600)
    assert any(line.startswith("model m version 1 not loaded") for line in said(caplog))
    assert "model m version 1 ready (1 variants); its last load had failed" in said(
        caplog, logging.WARNING
    )


def test_a_model_ready_after_its_config_failed_says_so_at_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    config = tmp_path / "m" / "config.toml"
    config.write_text("max_batch_size = 'x'\n")
    age(config)

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        config.write_text("max_batch_size = 4\n")
        age(config)
        await manager.poll()
        assert await factor_of(engine) == 1.0

    with caplog.at_level(logging.INFO, logger="duetime.manager"):
        run(tmp_path, scenario, control_mode="poll", poll_s=3600)
    assert any(line.startswith("model m not loaded") for line in said(caplog, logging.ERROR))
    assert "model m version 1 ready (1 variants); its last load had failed" in said(
        caplog, logging.WARNING
    )


def test_a_first_load_is_ready_at_info(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 1.0

    with caplog.at_level(logging.INFO, logger="duetime.manager"):
        run(tmp_path, scenario)
    assert "model m version 1 ready (1 variants)" in said(caplog)
    assert said(caplog, logging.WARNING) == []
