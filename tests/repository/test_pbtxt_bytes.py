"""The bytes of a config.pbtxt: UTF-8, but in its comments, which may hold any bytes (protobuf's
tokenizer skips them, so Triton serves such a file); and a leading UTF-8 byte order mark is no
part of the config. A byte that is not UTF-8 elsewhere is refused, naming its line and column.

Found by a tester (t77 repro_3.py, repro_5.py): a comment saved in Latin-1 (`# Größe`, by a
Windows editor) refused the model ("'utf-8' codec can't decode byte 0xf6 in position 4"); and a
file starting with a byte order mark was refused as "Expected identifier or number, got \ufeff",
a character no terminal shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_models import factor_of, scale_model, write_version
from repo_models import run_on_engine as run

from duetime.engine import Engine
from duetime.errors import ConfigError
from duetime.repository.tritonconfig import read_model_config

BOM = b"\xef\xbb\xbf"
SERVED = {
    "latin-1 comment": b"# Gr\xf6\xdfe des Batches\nmax_batch_size: 4\n",
    "latin-1 comment after a value": (
        b'platform: "onnxruntime_onnx"  # f\xfcr ONNX\nmax_batch_size: 4\n'
    ),
    "a comment of invalid bytes after a string holding '#'": (
        b'platform: "onnxruntime_onnx" parameters { key: "a#b" value { string_value: "1" } } '
        b"# \xff\xfe\nmax_batch_size: 4\n"
    ),
    "byte order mark": BOM + b'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n',
    "byte order mark and a latin-1 comment": BOM + b"# \xe9t\xe9\nmax_batch_size: 4\n",
    "crlf lines": b"# \xe9t\xe9\r\nmax_batch_size: 4\r\n",
}


def write_config(repo: Path, data: bytes) -> Path:
    write_version(repo, "m", 1, scale_model(2))
    path = repo / "m" / "config.pbtxt"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("data", SERVED.values(), ids=list(SERVED))
def test_bytes_in_comments_and_a_byte_order_mark_are_read(tmp_path: Path, data: bytes) -> None:
    write_config(tmp_path, data)
    assert read_model_config(tmp_path / "m").config.max_batch_size == 4


REFUSED = {
    "in a string value": (b'max_batch_size: 4\nplatform: "onnx\xf6"\n', 2, 16),
    "outside a comment": (b"max_batch_size: 4 \xf6\n", 1, 19),
    "in a string holding '#'": (b'max_batch_size: 4\nplatform: "a#\xf6"\n', 2, 14),
    "after an escaped quote": (b'max_batch_size: 4\nplatform: "a\\"#\xf6"\n', 2, 16),
    "in a single-quoted string": (b"platform: 'x#\xf6'  # \xf6\n", 1, 14),
}


@pytest.mark.parametrize(("data", "line", "column"), REFUSED.values(), ids=list(REFUSED))
def test_a_byte_not_utf8_outside_comments_is_refused_naming_where(
    tmp_path: Path, data: bytes, line: int, column: int
) -> None:
    path = write_config(tmp_path, data)
    with pytest.raises(ConfigError) as caught:
        read_model_config(tmp_path / "m")
    assert caught.value.message == (
        f"{path}: line {line}, column {column}: byte 0xf6 is not UTF-8; expected UTF-8 text "
        "(other bytes may only be in comments, after '#'): save the file as UTF-8"
    )


@pytest.mark.parametrize("case", ["latin-1 comment", "byte order mark"])
def test_such_a_model_serves(tmp_path: Path, case: str) -> None:
    write_config(tmp_path, SERVED[case])

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 2.0
        (row,) = [r for r in engine.repository_index() if r["name"] == "m"]
        assert (row["state"], row["reason"]) == ("READY", "")

    run(tmp_path, scenario)
