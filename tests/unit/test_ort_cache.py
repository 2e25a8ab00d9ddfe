"""The optimised-graph cache: its key (the model file's bytes, and none for external data) and
the graphs it keeps of a model file changed in place."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from repo_models import scale_model

from duetime.execution.ort import (
    CACHE_DIR,
    EXTERNAL_DATA_MARK,
    _cache_key,
    cached_session,
    session_options,
)

CHUNK = 1 << 20
"""(`_cache_key` reads the file a mebibyte at a time)"""

KEEP = 2
"""Graphs kept of one model file (`ort.CACHE_KEEP`): the newest and the one used before it."""


@pytest.mark.parametrize("at", [0, 100, CHUNK - 3, CHUNK, 2 * CHUNK - 1 - len(EXTERNAL_DATA_MARK)])
def test_a_file_naming_external_data_anywhere_has_no_key(tmp_path: Path, at: int) -> None:
    path = tmp_path / "model.onnx"
    data = bytearray(2 * CHUNK)
    data[at : at + len(EXTERNAL_DATA_MARK)] = EXTERNAL_DATA_MARK  # across a chunk's end too
    path.write_bytes(bytes(data))
    assert _cache_key(path) is None


def test_the_key_follows_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(bytes(2 * CHUNK))
    key = _cache_key(path)
    assert key is not None
    assert _cache_key(path) == key
    path.write_bytes(bytes(2 * CHUNK - 1) + b"\x01")
    assert _cache_key(path) not in (None, key)


def test_a_model_changed_in_place_leaves_a_bounded_cache(tmp_path: Path) -> None:
    """Every graph written stayed: 6 in-place updates of a 275 KB model left 7 graphs (1.9 MB),
    one more at each reload, though only the current bytes' can be read again."""
    path = tmp_path / "model.onnx"
    cache = tmp_path / CACHE_DIR
    options = session_options(intra_op_threads=1, inter_op_threads=1)
    x = np.ones((1, 4), np.float32)
    cache.mkdir()
    bystanders = ["model.fp16.0123456789abcdef0123.onnx", "other.0123456789abcdef0123.onnx"]
    for name in [*bystanders, ".model.0123456789abcdef0123.onnx.99.partial"]:
        (cache / name).write_bytes(b"")  # (a variant's, another file's, a write under way)
    keys = []
    for factor in range(1, 8):
        path.write_bytes(scale_model(factor))
        assert cached_session(path, options).run(None, {"x": x})[0][0, 0] == factor
        keys.append(_cache_key(path))
        graphs = sorted(p.name for p in cache.glob("model.*.onnx") if p.name not in bystanders)
        assert graphs == sorted(f"model.{key}.onnx" for key in keys[-KEEP:])
    assert set(bystanders) < set(os.listdir(cache))
    assert len(os.listdir(cache)) == KEEP + 3

    path.write_bytes(scale_model(6))  # a rollback: its graph is found, and kept as used last
    assert cached_session(path, options).run(None, {"x": x})[0][0, 0] == 6
    path.write_bytes(scale_model(8))
    cached_session(path, options)
    graphs = {p.name for p in cache.glob("model.*.onnx")} - set(bystanders)
    assert graphs == {f"model.{keys[5]}.onnx", f"model.{_cache_key(path)}.onnx"}
