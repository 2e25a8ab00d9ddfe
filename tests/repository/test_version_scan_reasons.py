"""A model folder refused for holding no version names what it holds that looks meant as one,
and why each is not a version.

Found by a tester (repro_version_scan_reason.py): the refusal said only "no version folder
holds a model.onnx", whatever the folder held: a version beyond int64 (silently dropped),
`1/model.onnx` a folder, `1/Model.onnx`, `1/resnet.onnx`, `v1/model.onnx`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_models import scale_model

from duetime.errors import ConfigError
from duetime.repository.layout import VERSION_MAX, scan_model, scan_repository

CASES = {
    "99999999999999999999/model.onnx": "99999999999999999999/: beyond the highest version "
    f"(versions are int64s: at most {VERSION_MAX})",
    "1/model.onnx/": "1/model.onnx: a folder holding no model.onnx (as Triton's layout, "
    "1/model.onnx/model.onnx, beside its external data)",
    "1/Model.onnx": "1/Model.onnx: the file must be named model.onnx (or named by the config's "
    "field 'default_model_filename')",
    "1/resnet.onnx": "1/resnet.onnx: the file must be named model.onnx (or named by the config's "
    "field 'default_model_filename')",
    "v1/model.onnx": "v1/: not a version: a version folder's name is an integer, such as 1",
    "model.onnx": "model.onnx: a model file directly in the model folder; it goes in a version "
    "folder, m/1/model.onnx",
    "1/model.txt": "1/: holds no model.onnx",
}


def make(directory: Path, relative: str) -> None:
    path = directory / relative
    if relative.endswith("/"):
        path.mkdir(parents=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(scale_model(1))


@pytest.mark.parametrize(("relative", "said"), CASES.items(), ids=list(CASES))
def test_the_refusal_names_what_was_found_and_why_it_is_no_version(
    tmp_path: Path, relative: str, said: str
) -> None:
    make(tmp_path / "m", relative)
    with pytest.raises(ConfigError) as caught:
        scan_model(tmp_path / "m")
    assert caught.value.message == (
        f"{tmp_path / 'm'}: no version folder holds a model.onnx ({said}); expected "
        f"{tmp_path / 'm'}/<version>/model.onnx with an integer version such as 1"
    )
    assert scan_repository(tmp_path).errors == {"m": caught.value.message}


def test_folders_not_meant_as_versions_are_not_named(tmp_path: Path) -> None:
    """A folder without a model file (`labels/`) is no version, as meant: the refusal of an
    empty model folder says what it always said."""
    (tmp_path / "m" / "labels").mkdir(parents=True)
    (tmp_path / "m" / "config.toml").write_text("")
    with pytest.raises(ConfigError) as caught:
        scan_model(tmp_path / "m")
    assert caught.value.message == (
        f"{tmp_path / 'm'}: no version folder holds a model.onnx; expected "
        f"{tmp_path / 'm'}/<version>/model.onnx with an integer version such as 1"
    )


def test_at_most_five_things_are_named(tmp_path: Path) -> None:
    for version in range(1, 8):
        make(tmp_path / "m", f"{version}/net.onnx")
    with pytest.raises(ConfigError, match=r"5/net\.onnx: .*; and 2 more\); expected"):
        scan_model(tmp_path / "m")


@pytest.mark.parametrize(
    ("link", "said"),
    [
        ("1/model.onnx", "1/model.onnx: a symbolic link to {target}, which does not exist"),
        ("1", "1: a symbolic link to {target}, which does not exist"),
    ],
    ids=["model-file", "version-folder"],
)
def test_a_link_to_nothing_is_named_as_such(tmp_path: Path, link: str, said: str) -> None:
    """A `model.onnx` linking to a file on a mount gone was refused as 'the file must be named
    model.onnx'; a version folder so linked was not named at all."""
    target = tmp_path / "gone" / "elsewhere"
    path = tmp_path / "m" / link
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    with pytest.raises(ConfigError) as caught:
        scan_model(tmp_path / "m")
    assert said.format(target=target) in caught.value.message


def test_a_repository_entry_linking_to_nothing_is_warned_of_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A model folder linked from a mount that is gone was skipped without a word."""
    import logging

    from repo_models import run_on_engine, write_version

    from duetime.engine import Engine

    write_version(tmp_path, "ok", 1, scale_model(1))
    (tmp_path / "remote").symlink_to(tmp_path / "mnt" / "remote")

    async def scenario(engine: Engine) -> None:
        await engine.manager.poll()  # type: ignore[union-attr]
        await engine.manager.poll()  # type: ignore[union-attr]
        assert engine.ready

    with caplog.at_level(logging.WARNING, logger="duetime.manager"):
        run_on_engine(tmp_path, scenario, control_mode="poll", poll_s=3600)
    warned = [r.getMessage() for r in caplog.records if "symbolic link" in r.getMessage()]
    assert warned == [
        f"model repository {tmp_path}: remote is a symbolic link to {tmp_path / 'mnt' / 'remote'}"
        ", which does not exist; if it is meant as a model folder, it is not served"
    ]
