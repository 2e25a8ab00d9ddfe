"""`duetime optimize` on what can go wrong around it: variants ONNX Runtime crashes on or ONNX's
checker rejects, inputs whose sizes it cannot know, held-out quality, a config it cannot write,
noisy timings, timings biased by the order of the runs, reruns, and runs with nothing to record.

Runs pass `--keep-slower` and a short `--measure-s`, as in test_optimize.py.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from types import SimpleNamespace
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
from duetime.tools.optimize import measure
from duetime.tools.optimize.measure import ratio_bounds, round_times_ns, verdict

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


# -- 7. timings the order of the runs would bias ------------------------------------------------


class Machine:
    """A fake clock on which a run takes 1000 ns, 1100 ns within `reach` runs of one of a
    `heavy` session's (whichever session it is of): as the int8 variants slowed the next run."""

    def __init__(self, reach: int) -> None:
        self.ns, self.reach, self.slowed = 0, reach, 0

    def perf_counter_ns(self) -> int:
        return self.ns

    def perf_counter(self) -> float:
        return self.ns / 1e9

    def session(self, heavy: bool = False) -> Any:
        def run(outputs: Any, feeds: Any) -> None:
            self.ns += 1100 if self.slowed else 1000
            self.slowed = self.reach if heavy else max(self.slowed - 1, 0)

        return SimpleNamespace(run=run)


@pytest.mark.parametrize("reach", [1, 2])
def test_the_order_of_the_runs_makes_no_variant_faster(
    reach: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Timed in the same order every round (primary, fp16, int8-dynamic, int8-static), the
    primary always ran after int8-static, slowed, and fp16, no faster, was kept as 9% faster.
    Timed after a run of its own, a session is not slowed by another's (reach 1); in a random
    order, what reaches past that run touches each alike (reach 2: in the same order every round,
    the primary was timed after int8-static's untimed run and one of its own)."""
    machine = Machine(reach)
    monkeypatch.setattr(measure, "time", machine)
    primary, fp16 = machine.session(), machine.session()
    sessions = [primary, fp16, machine.session(heavy=True), machine.session(heavy=True)]
    times = round_times_ns(sessions, {}, budget_s=1.0)
    assert len(times[0]) == measure.MAX_TIMING_ROUNDS
    assert statistics.median(times[1]) / statistics.median(times[0]) == 1.0
    ratios = [f / p for p, f in zip(times[0], times[1], strict=True)]
    assert statistics.median(ratios) == 1.0
    speed = VariantSpeed(
        batch_1_us=statistics.median(times[1]), primary_batch_1_us=statistics.median(times[0])
    )
    bounds = (ratio_bounds(times[0], times[1]), None)
    assert verdict(speed, 0, keep_slower=False, bounds=bounds)[0] == "dropped"


def test_each_round_runs_the_sessions_in_a_new_order_the_same_every_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine, runs = Machine(0), []

    def session(name: str) -> Any:
        timed = machine.session()

        def run(outputs: Any, feeds: Any) -> None:
            runs.append(name)
            timed.run(outputs, feeds)

        return SimpleNamespace(run=run)

    monkeypatch.setattr(measure, "time", machine)
    round_times_ns([session(name) for name in "PFDS"], {}, budget_s=0.0)
    first = runs
    runs = []
    round_times_ns([session(name) for name in "PFDS"], {}, budget_s=0.0)
    assert runs == first
    rounds = ["".join(first[4 + 8 * r : 4 + 8 * (r + 1) : 2]) for r in range(5)]
    assert all(sorted(order) == sorted("PFDS") for order in rounds)
    assert len(set(rounds)) > 1
    assert all(first[i] == first[i + 1] for i in range(4, len(first), 2))  # (untimed, timed)


# -- 8. configs: comments, and nothing to record ------------------------------------------------


USER_ENTRY = '# my own smaller net\n[[variants]]\nname = "tiny"\nfile = "tiny.onnx"\n'
KNOBS = "# knobs\n[scheduling]\nmax_queue_delay_us = 100\n"


@pytest.mark.parametrize(
    "layout", [[USER_ENTRY, KNOBS], [KNOBS, USER_ENTRY]], ids=["variants first", "variants last"]
)
def test_a_comment_above_an_entry_stays_above_it_as_the_entries_move(
    repo: Path, layout: list[str]
) -> None:
    """A user's comment above their own entry, first, ended up above optimize's entry, put in
    front of it. (Below a table, the comment is parsed into that table.)"""
    model = repo / "mlp"
    config = model / "config.toml"
    config.write_text("\n".join(["max_batch_size = 16\n", *layout]))
    assert optimize(model, *FAST, "--kinds", "fp16") == 0
    assert [v.name for v in load_model_config(model).variants] == ["fp16", "tiny"]
    lines = config.read_text().splitlines()
    assert under(lines, "# my own smaller net") == ["[[variants]]", 'name = "tiny"']
    assert under(lines, "# knobs") == ["[scheduling]", "max_queue_delay_us = 100"]
    at = lines.index('name = "fp16"')
    config.write_text("\n".join([*lines[: at - 1], "# checked by hand", *lines[at - 1 :], ""]))
    assert optimize(model, *FAST, "--kinds", "int8-dynamic,fp16") == 0  # (fp16 measured again)
    lines = config.read_text().splitlines()
    assert under(lines, "# checked by hand") == ["[[variants]]", 'name = "fp16"']
    assert under(lines, "# my own smaller net") == ["[[variants]]", 'name = "tiny"']
    assert under(lines, "# knobs") == ["[scheduling]", "max_queue_delay_us = 100"]
    assert optimize(model, *FAST, "--kinds", "int8-dynamic,fp16") == 0
    timed = "speed = "  # (the figures of a new timing)
    again = [line for line in config.read_text().splitlines() if not line.startswith(timed)]
    assert again == [line for line in lines if not line.startswith(timed)]


def under(lines: list[str], comment: str) -> list[str]:
    """The two lines right under `comment` (its only line)."""
    (at,) = [i for i, line in enumerate(lines) if line == comment]
    return lines[at + 1 : at + 3]


def test_nothing_kept_and_no_config_file_creates_none_and_says_so(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty config.toml was created and said "updated": a server polling the repository
    reloads the model for it."""
    from duetime.tools.optimize import pipeline

    monkeypatch.setattr(pipeline, "verdict", lambda *args, **kwargs: ("dropped", "not faster"))
    model = repo / "mlp"
    (model / "config.toml").unlink()
    assert optimize(model, "--measure-s", "0.05", "-q", "--kinds", "fp16") == 0
    assert sorted(p.name for p in model.iterdir()) == ["1"]
    out = capsys.readouterr().out
    assert "updated nothing: no kind was kept, and none of them was listed to remove" in out


def test_nothing_kept_leaves_a_yaml_config_and_its_comments_untouched(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rewritten with the same variants, a YAML config lost its comments."""
    from duetime.tools.optimize import pipeline

    monkeypatch.setattr(pipeline, "verdict", lambda *args, **kwargs: ("dropped", "not faster"))
    model = repo / "mlp"
    (model / "config.toml").unlink()
    text = "# small batches\nmax_batch_size: 8\nvariants:\n- {name: t, file: t.onnx}\n"
    (model / "config.yaml").write_text(text)
    assert optimize(model, "--measure-s", "0.05", "-q", "--kinds", "fp16") == 0
    assert (model / "config.yaml").read_text() == text
    assert "PyYAML" not in capsys.readouterr().out
