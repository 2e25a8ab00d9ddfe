"""Tests for duetime.demo: the built-in demo model repository."""

from __future__ import annotations

import pathlib
import tomllib

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from duetime.demo import ORDERBOOK_FEATURES, write_demo_repository

# name -> (max_batch_size, input name, input dims sans batch, output name, output dims sans batch)
EXPECTED: dict[str, tuple[int, str, list[int], str, list[int]]] = {
    "mlp": (64, "x", [40], "y", [3]),
    "resnet": (32, "image", [3, 64, 64], "logits", [10]),
    "orderbook": (64, "features", [ORDERBOOK_FEATURES], "logits", [3]),
    "deeplob": (32, "lob", [100, 40], "logits", [3]),
}
FILES = [f"{name}/{file}" for name in EXPECTED for file in ("config.toml", "1/model.onnx")]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return write_demo_repository(tmp_path_factory.mktemp("demo") / "models")


def _session(model: pathlib.Path, opts: ort.SessionOptions | None = None) -> ort.InferenceSession:
    return ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])


def test_writes_expected_layout(repo: pathlib.Path) -> None:
    assert repo.is_dir()
    for rel in FILES:
        assert (repo / rel).is_file(), rel
        assert (repo / rel).stat().st_size > 0, rel


def test_accepts_str_path_and_creates_it(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "a" / "b"
    result = write_demo_repository(str(target))
    assert result == target
    assert (target / "mlp" / "1" / "model.onnx").is_file()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_toml(repo: pathlib.Path, name: str) -> None:
    text = (repo / name / "config.toml").read_text(encoding="utf-8")
    assert text.lstrip().startswith("#")
    assert tomllib.loads(text) == {"max_batch_size": EXPECTED[name][0]}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_model_is_valid_onnx(repo: pathlib.Path, name: str) -> None:
    model = onnx.load(str(repo / name / "1" / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert model.graph.doc_string


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_session_io_signature(repo: pathlib.Path, name: str) -> None:
    _, in_name, in_dims, out_name, out_dims = EXPECTED[name]
    sess = _session(repo / name / "1" / "model.onnx")
    (inp,), (out,) = sess.get_inputs(), sess.get_outputs()
    assert (inp.name, inp.type, inp.shape) == (in_name, "tensor(float)", ["batch", *in_dims])
    assert (out.name, out.type, out.shape) == (out_name, "tensor(float)", ["batch", *out_dims])


@pytest.mark.parametrize("batch", [1, 7])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_inference_outputs(repo: pathlib.Path, name: str, batch: int) -> None:
    _, in_name, in_dims, out_name, out_dims = EXPECTED[name]
    sess = _session(repo / name / "1" / "model.onnx")
    x = np.random.default_rng(0).standard_normal((batch, *in_dims)).astype(np.float32)
    (y,) = sess.run([out_name], {in_name: x})
    assert y.dtype == np.float32
    assert y.shape == (batch, *out_dims)
    assert np.all(np.isfinite(y))
    assert np.abs(y).max() < 100.0  # sensibly scaled weights
    assert np.ptp(y) > 0.0  # not a degenerate constant


def test_rows_are_independent_of_batch(repo: pathlib.Path) -> None:
    sess = _session(repo / "resnet" / "1" / "model.onnx")
    x = np.random.default_rng(1).standard_normal((7, 3, 64, 64)).astype(np.float32)
    (full,) = sess.run(None, {"image": x})
    (single,) = sess.run(None, {"image": x[3:4]})
    np.testing.assert_allclose(full[3:4], single, rtol=1e-4, atol=1e-4)


def test_deterministic_bytes(tmp_path: pathlib.Path) -> None:
    first = write_demo_repository(tmp_path / "one")
    second = write_demo_repository(tmp_path / "two")
    for rel in FILES:
        assert (first / rel).read_bytes() == (second / rel).read_bytes(), rel


def test_idempotent_rewrite(tmp_path: pathlib.Path) -> None:
    """Written again, the demo keeps a file that differs from its own (a user's: it rewrote
    them all) unless told to overwrite it, and writes the ones missing."""
    root = write_demo_repository(tmp_path)
    before = {rel: (root / rel).read_bytes() for rel in FILES}
    (root / "mlp" / "1" / "model.onnx").write_bytes(b"garbage")
    (root / "resnet" / "config.toml").unlink()
    assert write_demo_repository(tmp_path) == root
    assert (root / "mlp" / "1" / "model.onnx").read_bytes() == b"garbage"
    assert (root / "resnet" / "config.toml").read_bytes() == before["resnet/config.toml"]
    assert write_demo_repository(tmp_path, on_change="overwrite") == root
    assert {rel: (root / rel).read_bytes() for rel in FILES} == before


def test_resnet_has_batchnorm_that_ort_fuses(repo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    source = repo / "resnet" / "1" / "model.onnx"
    ops = [n.op_type for n in onnx.load(str(source)).graph.node]
    assert ops.count("BatchNormalization") >= 5
    assert ops.count("BatchNormalization") == ops.count("Conv")

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(tmp_path / "resnet_opt.onnx")
    _session(source, opts)
    fused_ops = [n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node]
    assert "BatchNormalization" not in fused_ops
    assert any(op in ("Conv", "FusedConv") for op in fused_ops)
