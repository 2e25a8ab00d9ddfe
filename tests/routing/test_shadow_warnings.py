"""What a model's load says of a `[traffic] shadow` that mirrors less than it seems to."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from repo_models import age, factor_of, scale_model, write_version
from repo_models import run_on_engine as run

from duetime.engine import Engine

ALL = "[version_policy]\nall = {}\n[traffic]\n"


def shadow_warnings(tmp_path: Path, caplog: pytest.LogCaptureFixture, traffic: str) -> list[str]:
    """The load's warnings about shadows, for versions 1 and 2 served with `traffic`."""
    for version in (1, 2):
        write_version(tmp_path, "m", version, scale_model(version))
    path = tmp_path / "m" / "config.toml"
    path.write_text(ALL + traffic)
    age(path)

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) in (1.0, 2.0)

    with caplog.at_level(logging.WARNING, logger="duetime.manager"):
        run(tmp_path, scenario)
    return [r.getMessage() for r in caplog.records if "shadow" in r.getMessage()]


def test_a_shadow_naming_the_only_answering_version_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Probe self_shadow: `weights = {"1" = 1}` with `shadow = {"1" = 1.0}` mirrored nothing
    the policy routed (a copy never goes to the version answering it), and nothing said so."""
    [warning] = shadow_warnings(tmp_path, caplog, 'weights = { "1" = 1 }\nshadow = { "1" = 1.0 }\n')
    assert "model m: [traffic] shadow names version 1, the only version" in warning
    assert warning.endswith("only of requests that name another version.")  # (it ended ". ")


def test_warnings_of_one_traffic_table_are_joined_by_one_space(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    traffic = 'weights = { "1" = 1, "3" = 1 }\nshadow = { "1" = 1.0 }\n'
    [warning] = shadow_warnings(tmp_path, caplog, traffic)
    assert "(version_policy serves 1, 2): they get no requests. [traffic] shadow names" in warning
    assert warning.endswith("another version.")


def test_a_shadow_naming_the_default_version_without_weights_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    [warning] = shadow_warnings(tmp_path, caplog, 'shadow = { "2" = 0.5 }\n')  # (2: the default)
    assert "shadow names version 2, the only version" in warning


@pytest.mark.parametrize(
    "traffic",
    [
        'weights = { "1" = 1 }\nshadow = { "2" = 1.0 }\n',
        'weights = { "1" = 1, "2" = 1 }\nshadow = { "1" = 1.0 }\n',  # (copies of 2's share)
        'weights = { "1" = 1 }\nshadow = { "1" = 0 }\n',  # (mirrors nothing, as it says)
    ],
)
def test_a_shadow_that_gets_copies_is_not_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, traffic: str
) -> None:
    assert shadow_warnings(tmp_path, caplog, traffic) == []


def test_the_warned_shadow_still_mirrors_requests_naming_another_version(tmp_path: Path) -> None:
    """What the warning says is left: a request naming version 2 is mirrored to 1."""
    for version in (1, 2):
        write_version(tmp_path, "m", version, scale_model(version))
    path = tmp_path / "m" / "config.toml"
    path.write_text(ALL + 'weights = { "1" = 1 }\nshadow = { "1" = 1.0 }\n')
    age(path)

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 1.0
        assert ("m", "1") not in engine.router.shadows
        assert await factor_of(engine, version="2") == 2.0
        assert engine.router.shadows[("m", "1")].mirrored == 1

    run(tmp_path, scenario)
