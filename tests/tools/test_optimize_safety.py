"""`duetime optimize` on what can go wrong around it: variants ONNX Runtime crashes on or ONNX's
checker rejects, inputs whose sizes it cannot know, held-out quality, a config it cannot write,
noisy timings, and reruns.

Runs pass `--keep-slower` and a short `--measure-s`, as in test_optimize.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_optimize import FAST, optimize  # (the same run of the tool)

from duetime.config import VariantConfig, VariantSpeed, load_model_config
from duetime.demo import write_demo_repository
from duetime.errors import ConfigError
from duetime.repository.layout import scan_model
from duetime.repository.loader import load_version
from duetime.tools.optimize.measure import ratio_bounds, verdict

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return write_demo_repository(tmp_path / "repo")


def unsorted(path: Path) -> None:
    """Rewrite the model at `path` with its nodes in reverse order: a graph ONNX's checker
    rejects ("Nodes in a graph must be topologically sorted")."""
    model = onnx.load(str(path))
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(path))


def leftovers(model: Path) -> list[str]:
    return sorted(p.name for p in (model / "1").iterdir() if p.name.endswith(".tmp"))


# -- 1. variants that would crash ONNX Runtime -------------------------------------------------


def test_a_variant_onnx_runtime_crashes_on_fails_that_kind_and_the_run_goes_on(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from duetime.tools.optimize import probe

    crash_fp16 = (
        "import os, signal, sys\nif 'fp16' in sys.argv[1]: os.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    monkeypatch.setattr(probe, "_CHILD", crash_fp16)
    model = repo / "mlp"
    assert optimize(model, *FAST, "--kinds", "fp16,int8-dynamic") == 0
    out = capsys.readouterr().out
    assert "fp16" in out
    assert "failed: ValueError: ONNX Runtime crashed loading it (signal 11" in out
    assert [v.kind for v in load_model_config(model).variants] == ["int8-dynamic"]
    assert leftovers(model) == []
    assert not (model / "1" / "model.fp16.onnx").exists()


def test_a_built_graph_the_checker_rejects_fails_that_kind(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from duetime.tools.optimize import build

    convert = build._convert

    def convert_unsorted(kind: str, source: Path, prepared: Path, out: Path, *rest: object) -> None:
        convert(kind, source, prepared, out, *rest)  # type: ignore[arg-type]
        unsorted(out)

    monkeypatch.setattr(build, "_convert", convert_unsorted)
    model = repo / "mlp"
    assert optimize(model, *FAST, "--kinds", "fp16") == 1
    out = capsys.readouterr().out
    assert "failed: ValueError: ONNX's model checker rejects it: Nodes in a graph must be" in out
    assert not (model / "config.toml").read_text().count("[[variants]]")
    assert leftovers(model) == []


def test_a_variant_file_the_checker_rejects_is_not_served_and_the_primary_is(
    repo: Path,
) -> None:
    model = repo / "mlp"
    folder = model / "1"
    (folder / "model.fp16.onnx").write_bytes((folder / "model.onnx").read_bytes())
    unsorted(folder / "model.fp16.onnx")
    variant = VariantConfig(name="fp16", file="model.fp16.onnx", kind="fp16")
    source = scan_model(model)
    primary = load_version(source, 1, profile_budget_s=0.05)
    with pytest.raises(ConfigError, match="fails ONNX's model checker"):
        load_version(source, 1, variant=variant, primary=primary.signature, profile_budget_s=0.05)


def test_the_fp16_variant_is_a_graph_onnx_checker_accepts(repo: Path) -> None:
    """ORT's converter (keep_io_types) appends the inputs' Casts after the nodes reading them."""
    model = repo / "mlp"
    assert optimize(model, *FAST, "--kinds", "fp16") == 0
    onnx.checker.check_model(str(model / "1" / "model.fp16.onnx"))


# -- 2. inputs whose sizes random samples cannot know ------------------------------------------


def free_width_model(tmp_path: Path) -> Path:
    """y = x @ w summed over a free width: x is [batch, 4, width]."""
    model = tmp_path / "free"
    (model / "1").mkdir(parents=True)
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.eye(4).ravel().tolist())
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
            helper.make_node("MatMul", ["s", "w"], ["y"]),
        ],
        "free",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[weight, helper.make_tensor("axes", TensorProto.INT64, [1], [2])],
    )
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = 8
    onnx.save(onnx_model, str(model / "1" / "model.onnx"))
    (model / "config.toml").write_text("max_batch_size = 8\n")
    return model


def test_a_free_dim_besides_the_batch_is_refused_without_calibration_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = free_width_model(tmp_path)
    assert optimize(model, *FAST, "--kinds", "fp16") == 2
    err = capsys.readouterr().err
    assert "input 'x' dim 2 can be any size" in err
    assert "pass --calibration FILE.npz" in err
    assert (model / "config.toml").read_text() == "max_batch_size = 8\n"


def test_a_free_dim_is_measured_at_the_calibration_data_s_size(tmp_path: Path) -> None:
    model = free_width_model(tmp_path)
    calibration = tmp_path / "calibration.npz"
    np.savez(calibration, x=np.random.default_rng(0).standard_normal((32, 4, 6)))
    assert optimize(model, *FAST, "--kinds", "fp16", "--calibration", calibration) == 0
    assert [v.kind for v in load_model_config(model).variants] == ["fp16"]


# -- 3. quality measured on samples held out from calibration ----------------------------------


def test_quality_is_measured_on_calibration_samples_held_out_from_calibrating(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calibration = tmp_path / "calibration.npz"
    np.savez(calibration, x=np.random.default_rng(3).standard_normal((40, 40)))
    assert (
        optimize(repo / "mlp", *FAST, "--kinds", "int8-static", "--calibration", calibration) == 0
    )
    assert f"10 samples (held out from {calibration}, calibrated on 30 others)" in (
        capsys.readouterr().out
    )
    (listed,) = load_model_config(repo / "mlp").variants
    assert listed.quality is not None
    assert listed.quality.samples == 10


def test_calibration_data_too_small_to_hold_out_from_is_refused(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calibration = tmp_path / "calibration.npz"
    np.savez(calibration, x=np.zeros((7, 40), dtype=np.float32))
    assert optimize(repo / "mlp", *FAST, "--calibration", calibration) == 2
    assert "7 samples; at least 8 are needed" in capsys.readouterr().err


# -- 4. a config that cannot be written ----------------------------------------------------------


def test_a_model_folder_that_cannot_be_written_is_one_line_and_changes_nothing(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from duetime.tools.optimize import records

    model = repo / "mlp"
    before = (model / "config.toml").read_text()
    mkstemp = records.tempfile.mkstemp

    def read_only_model_folder(*args: Any, **kwargs: Any) -> tuple[int, str]:
        if Path(kwargs["dir"]) == model:
            raise PermissionError(1, "Operation not permitted", str(model / ".config.toml.x.tmp"))
        return mkstemp(*args, **kwargs)

    monkeypatch.setattr(records.tempfile, "mkstemp", read_only_model_folder)
    assert optimize(model, *FAST, "--kinds", "int8-dynamic") == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        f"duetime optimize: cannot write {model / 'config.toml'}: Operation not permitted; "
        "nothing was changed"
    )
    assert (model / "config.toml").read_text() == before
    assert sorted(p.name for p in (model / "1").iterdir()) == ["model.onnx"]


def test_a_config_that_cannot_be_replaced_puts_the_variant_files_back(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from duetime.tools.optimize import pipeline

    model = repo / "mlp"
    assert optimize(model, *FAST, "--kinds", "int8-dynamic") == 0
    config, variant = model / "config.toml", model / "1" / "model.int8-dynamic.onnx"
    before = config.read_text(), variant.read_bytes()
    replace = pipeline.os.replace

    def immutable_config(src: Any, dst: Any) -> None:
        if Path(dst) == config:
            raise PermissionError(1, "Operation not permitted", str(src), str(dst))
        replace(src, dst)

    monkeypatch.setattr(pipeline.os, "replace", immutable_config)
    assert optimize(model, *FAST, "--kinds", "fp16,int8-dynamic") == 1
    assert "cannot write" in capsys.readouterr().err
    assert (config.read_text(), variant.read_bytes()) == before
    assert sorted(p.name for p in (model / "1").iterdir()) == [
        "model.int8-dynamic.onnx",
        "model.onnx",
    ]
    assert sorted(p.name for p in model.iterdir() if p.is_file()) == ["config.toml"]


# -- 6. reruns ---------------------------------------------------------------------------------


def test_a_rerun_leaves_the_config_s_blank_lines_as_they_were(repo: Path) -> None:
    model = repo / "mlp"
    assert optimize(model, *FAST, "--kinds", "int8-dynamic,int8-static") == 0
    assert optimize(model, *FAST, "--kinds", "fp16") == 0
    once = (model / "config.toml").read_text()
    assert optimize(model, *FAST, "--kinds", "fp16") == 0
    again = (model / "config.toml").read_text()
    assert again.count("\n\n\n") == 0
    assert again.count("\n") == once.count("\n")


# -- 5. verdicts beyond the noise ----------------------------------------------------------------


def test_a_variant_faster_within_the_noise_is_not_clearly_faster() -> None:
    speed = VariantSpeed(batch_1_us=90.0, primary_batch_1_us=100.0)
    noisy = ((0.7, 1.1), None)
    status, reason = verdict(speed, 0, keep_slower=False, bounds=noisy)
    assert (status, reason) == ("dropped", "not clearly faster at batch 1 (noise ±20%)")
    steady = ((0.88, 0.92), None)
    assert verdict(speed, 0, keep_slower=False, bounds=steady) == ("kept", "faster at batch 1")


def test_ratio_bounds_are_the_same_for_the_same_times_and_narrow_when_steady() -> None:
    primary = [100, 103, 98, 250, 101, 99, 100, 102]  # one round hit by the machine's load
    variant = [90, 92, 89, 230, 91, 88, 90, 93]
    low, high = ratio_bounds(primary, variant)
    assert (low, high) == ratio_bounds(primary, variant)
    assert 0.85 < low <= high < 0.95
    wild = ratio_bounds(primary, [60, 140, 70, 300, 130, 65, 120, 80])
    assert wild[1] - wild[0] > 0.3
