"""Triton's layout for a model with external data: `<version>/model.onnx/` a folder holding
`model.onnx` and its weight files (the onnxruntime backend loads `<dir>/model.onnx`).

Found by a tester (repro_model_dir.py): such a version was refused, UNAVAILABLE "1/model.onnx: a
folder, not a file", though a Triton ONNX repository is to serve as it is.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from repo_models import age, factor_of, scale_model
from repo_models import run_on_engine as run

from duetime.engine import Engine
from duetime.errors import ModelUnavailable
from duetime.repository.layout import scan_model, scan_repository


def folder_version(repo: Path, version: int, factor: float, *, leaving: bool = False) -> Path:
    """Write `m/<version>/model.onnx/model.onnx` (y = factor * x), its tensors in weights.bin
    in that folder (in the version folder, named `../weights.bin`, when `leaving`); the folder."""
    folder = repo / "m" / str(version) / "model.onnx"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights.bin").unlink(missing_ok=True)  # (onnx appends to a file already there)
    model = onnx.load_from_string(scale_model(factor))
    onnx.save_model(
        model, str(folder / "model.onnx"), save_as_external_data=True,
        all_tensors_to_one_file=True, location="weights.bin", size_threshold=0,
    )  # fmt: skip
    weights = folder / "weights.bin"
    if leaving:  # (onnx refuses to write such a location itself)
        weights = weights.rename(folder.parent / "weights.bin")
        model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
        for tensor in model.graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = "../weights.bin"
        onnx.save_model(model, str(folder / "model.onnx"))
    for path in (folder / "model.onnx", weights):
        age(path)
    return folder


def index(engine: Engine) -> dict[str, tuple[str, str]]:
    return {
        e.get("version", ""): (e.get("state", ""), e.get("reason", ""))
        for e in engine.repository_index()
        if e["name"] == "m"
    }


def test_a_version_whose_model_onnx_is_a_folder_is_found(tmp_path: Path) -> None:
    folder = folder_version(tmp_path, 1, 2.0)
    (tmp_path / "m" / "2").mkdir()
    (tmp_path / "m" / "2" / "model.onnx").write_bytes(scale_model(3))
    assert scan_model(tmp_path / "m").versions == {
        1: folder / "model.onnx",
        2: tmp_path / "m" / "2" / "model.onnx",
    }
    assert scan_repository(tmp_path).errors == {}


def test_it_serves_with_its_external_data_read_from_that_folder(tmp_path: Path) -> None:
    folder_version(tmp_path, 1, 3.0)

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 3.0
        assert index(engine)["1"][0] == "READY"

    run(tmp_path, scenario)


def test_a_poll_sees_new_weights_inside_that_folder(tmp_path: Path) -> None:
    folder = folder_version(tmp_path, 1, 1.0)

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 1.0
        graph = (folder / "model.onnx").read_bytes()
        folder_version(tmp_path, 1, 4.0)  # new weights, the same model file
        assert (folder / "model.onnx").read_bytes() == graph
        await engine.manager.poll()  # type: ignore[union-attr]
        assert await factor_of(engine) == 4.0

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


def test_external_data_outside_that_folder_is_still_refused(tmp_path: Path) -> None:
    """ORT refuses a location leaving the model file's folder: one beside the folder, in the
    version folder, is outside it."""
    folder_version(tmp_path, 1, 5.0, leaving=True)
    assert (tmp_path / "m" / "1" / "weights.bin").is_file()

    async def scenario(engine: Engine) -> None:
        with pytest.raises(ModelUnavailable):
            await factor_of(engine)
        state, reason = index(engine)["1"]
        assert state == "UNAVAILABLE"
        assert "escapes model directory" in reason

    run(tmp_path, scenario)


def test_weights_rewritten_in_place_do_not_change_a_serving_version(tmp_path: Path) -> None:
    """ONNX Runtime maps external data files and reads the tensors in place: a data file
    rewritten in place (`rsync --inplace`, a download into place) changed the answers of the
    version serving, before any reload (old and new weights mixed, 200 each; found by a
    tester). Each version answers from a copy of its own."""
    folder = folder_version(tmp_path, 1, 2.0)
    weights = folder / "weights.bin"

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 2.0
        with weights.open("r+b") as handle:  # (in place: the same inode, the same size)
            handle.write(np.float32(7.0).tobytes())
        assert await factor_of(engine) == 2.0

    run(tmp_path, scenario)


TRUNCATE_IN_PLACE = """
import asyncio, sys
from pathlib import Path
sys.path[:0] = sys.argv[2:]
from repo_models import factor_of
from duetime.engine import Engine

async def main() -> None:
    engine = await Engine.start(Path(sys.argv[1]))
    assert await factor_of(engine) == 2.0
    weights = Path(sys.argv[1]) / "m" / "1" / "model.onnx" / "weights.bin"
    data = weights.read_bytes()
    weights.write_bytes(b"")  # (truncated, as `cp` does first)
    print(await factor_of(engine), flush=True)
    weights.write_bytes(data)
    await engine.aclose()

asyncio.run(main())
"""


def test_weights_truncated_in_place_do_not_kill_the_server(tmp_path: Path) -> None:
    """A data file truncated in place (`cp new weights.bin`) under a serving version killed the
    server with SIGBUS, its mapped pages gone (found by a tester)."""
    folder_version(tmp_path, 1, 2.0)
    tests = str(Path(__file__).parent.parent)
    done = subprocess.run(
        [sys.executable, "-c", TRUNCATE_IN_PLACE, str(tmp_path), tests],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "2.0"


def test_no_private_copy_is_made_where_it_would_fill_the_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A copy that filled the folder would fail other programs' writes meanwhile: the version
    serves from the repository's files, with a warning."""
    import shutil
    from collections import namedtuple

    from duetime.execution import ort as ort_module

    folder_version(tmp_path, 1, 2.0)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1 << 20))

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 2.0

    with caplog.at_level("WARNING", logger=ort_module.log.name):
        run(tmp_path, scenario)
    assert any("free in the temporary folder" in r.getMessage() for r in caplog.records)
