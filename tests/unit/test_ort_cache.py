"""The optimised-graph cache's key: the model file's bytes, and no key for external data."""

from __future__ import annotations

from pathlib import Path

import pytest

from duetime.execution.ort import EXTERNAL_DATA_MARK, _cache_key

CHUNK = 1 << 20
"""(`_cache_key` reads the file a mebibyte at a time)"""


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
