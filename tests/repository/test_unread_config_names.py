"""A file meant as a model's config under a name duetime does not read (`Config.toml`,
`config.json`, `model.toml`, a `config.pbtxt` in the version folder) is warned of, naming it and
the names read: in the log, and as the reason of the versions served in the index. The model
still serves, on its defaults.

Found by a tester (repro_ignored_config_name.py): such a file was ignored without a word, and
the model served with max_batch_size 32 where the file asked for 4.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from repo_models import age, factor_of, run_on_engine, scale_model, write_version

from duetime.config import CONFIG_FILENAMES
from duetime.engine import Engine
from duetime.repository.tritonconfig import read_model_config

pytestmark = pytest.mark.timeout(60)

UNREAD = ["Config.toml", "config.json", "config.toml.txt", "model.toml", "1/config.pbtxt"]


def write(repo: Path, relative: str, text: str = "max_batch_size = 4\n") -> None:
    path = repo / "m" / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    age(path)


@pytest.mark.parametrize("name", UNREAD)
def test_a_config_under_a_name_not_read_is_warned_of(tmp_path: Path, name: str) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    write(tmp_path, name)
    read = read_model_config(tmp_path / "m")
    assert read.config.max_batch_size is None  # (served on the defaults: not refused)
    [warning] = read.warnings
    assert warning == read.unread
    assert warning.startswith(f"{tmp_path / 'm'}: {name}: not read")
    assert all(known in warning for known in CONFIG_FILENAMES)


@pytest.mark.parametrize(
    "name",
    ["labels.txt", "README.md", "1/config.json", "1/model.onnx.data", "1/small.onnx"],
)
def test_other_files_are_not_warned_of(tmp_path: Path, name: str) -> None:
    """A version folder's config.json is an exporter's (beside model.onnx), not a config."""
    write_version(tmp_path, "m", 1, scale_model(1))
    write(tmp_path, name, "x")
    assert read_model_config(tmp_path / "m").warnings == ()


def test_nothing_is_warned_of_beside_a_config_file_read(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    write(tmp_path, "config.toml")
    write(tmp_path, "config.toml.bak")
    read = read_model_config(tmp_path / "m")
    assert (read.config.max_batch_size, read.warnings) == (4, ())


def test_the_log_and_the_index_say_so_once_and_the_model_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_version(tmp_path, "m", 1, scale_model(3))
    write(tmp_path, "Config.toml")
    listed: list[str] = []

    async def scenario(engine: Engine) -> None:
        assert engine.manager is not None
        assert await factor_of(engine) == 3.0
        await engine.manager.poll()
        [entry] = [e for e in engine.repository_index() if e["name"] == "m"]
        assert entry["state"] == "READY"
        assert entry["reason"].startswith(f"{tmp_path / 'm'}: Config.toml: not read")
        listed.append(entry["reason"])
        (tmp_path / "m" / "Config.toml").rename(tmp_path / "m" / "config.toml")
        age(tmp_path / "m" / "config.toml")
        await engine.manager.poll()  # (the name fixed: the reason is gone)
        [entry] = [e for e in engine.repository_index() if e["name"] == "m"]
        assert (entry["state"], entry["reason"]) == ("READY", "")

    with caplog.at_level(logging.WARNING, logger="duetime.config"):
        run_on_engine(tmp_path, scenario, limit_s=30, control_mode="poll", poll_s=3600.0)
    said = [r.getMessage() for r in caplog.records if "Config.toml" in r.getMessage()]
    assert said == listed  # (once, not at every poll)
