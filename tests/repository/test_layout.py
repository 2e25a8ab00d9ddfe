"""The repository's on-disk layout: which folders are models, and which are versions."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_models import scale_model, write_version

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
def test_a_zero_padded_folder_beside_its_version_is_ignored(tmp_path: Path, alias: str) -> None:
    """As Triton: `01` is no version (it refused the model as a second folder of version 1)."""
    write_version(tmp_path, "m", 1, scale_model(1))
    write_version(tmp_path, "m", 2, scale_model(2))
    (tmp_path / "m" / alias).mkdir()
    (tmp_path / "m" / alias / "model.onnx").write_bytes(scale_model(100))
    source = scan_model(tmp_path / "m")
    assert sorted(source.versions) == [1, 2]
    assert source.versions[1] == tmp_path / "m" / "1" / "model.onnx"
    [ignored] = source.ignored
    assert ignored.startswith(f"folder {alias}/ holds a model.onnx but is not served")
    scan = scan_repository(tmp_path)
    assert [m.name for m in scan.models] == ["m"]
    assert scan.errors == {}


def test_a_lone_zero_padded_folder_is_no_version(tmp_path: Path) -> None:
    (tmp_path / "m" / "007").mkdir(parents=True)
    (tmp_path / "m" / "007" / "model.onnx").write_bytes(scale_model(7))
    (tmp_path / "m" / "01").mkdir()  # no model file: nothing to ignore
    write_version(tmp_path, "m", 1, scale_model(1))
    source = scan_model(tmp_path / "m")
    assert sorted(source.versions) == [1]
    assert [line.split(" holds")[0] for line in source.ignored] == ["folder 007/"]
