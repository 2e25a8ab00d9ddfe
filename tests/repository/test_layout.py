"""The repository's on-disk layout: which folders are models, and which are versions."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_models import scale_model, write_version

from duetime.errors import ConfigError
from duetime.repository.layout import scan_model, scan_repository


def test_folders_starting_with_an_underscore_are_models_hidden_ones_are_not(
    tmp_path: Path,
) -> None:
    """Triton serves `_preprocess`; only hidden folders (`.git`, a copy in progress) are left
    alone."""
    for name in ("_preprocess", "__private__", "main", ".git", ".tmp-main"):
        write_version(tmp_path, name, 1, scale_model(1))
    scan = scan_repository(tmp_path)
    assert [m.name for m in scan.models] == ["__private__", "_preprocess", "main"]
    assert scan.errors == {}


@pytest.mark.parametrize("alias", ["01", "001"])
def test_two_folders_of_one_version_are_refused_naming_both(tmp_path: Path, alias: str) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    write_version(tmp_path, "m", 2, scale_model(2))
    (tmp_path / "m" / alias).mkdir()
    (tmp_path / "m" / alias / "model.onnx").write_bytes(scale_model(100))
    with pytest.raises(ConfigError, match=f"version folders '{alias}' and '1' are both version 1"):
        scan_model(tmp_path / "m")
    scan = scan_repository(tmp_path)  # the other models still load
    assert scan.models == []
    assert "are both version 1" in scan.errors["m"]


def test_a_lone_zero_padded_folder_is_its_version(tmp_path: Path) -> None:
    (tmp_path / "m" / "007").mkdir(parents=True)
    (tmp_path / "m" / "007" / "model.onnx").write_bytes(scale_model(7))
    (tmp_path / "m" / "01").mkdir()  # no model file: not a version, no conflict with '1'
    write_version(tmp_path, "m", 1, scale_model(1))
    assert sorted(scan_model(tmp_path / "m").versions) == [1, 7]
