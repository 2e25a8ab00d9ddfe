"""A capture record that does not decode (its CRC32 matches, a field is bad) is skipped by the
reader: the replay counts it, names the first, warns, and exits 3, for it replayed less than
the capture."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_v2 import fake_v2_server

from duetime.cli import main
from duetime.errors import ConfigError
from duetime.tools.capture import CapturedRequest, CapturedTensor, CaptureReader, CaptureWriter
from duetime.tools.capture.format import RECORD_FIXED, RECORD_PREFIX
from duetime.tools.replay import ReplayConfig, load_plan


def _capture(path: Path, count: int, damaged: set[int]) -> Path:
    """`count` records, those in `damaged` with an unknown flag set (and a CRC32 to match)."""
    x = CapturedTensor.of("x", np.zeros((1, 4), np.float32))
    with CaptureWriter(path) as writer:
        for i in range(count):
            writer.write(CapturedRequest(
                arrival_ns=i * 1_000_000, protocol="http", model="m", version=None,
                request_id=f"r{i}", inputs=[x], outputs_wanted=None, parameters={},
                due_in_ns=None, priority=0, headers={}, trace_id=None, status=200, error=None,
                latency_ns=0, answered_version=None, variant=None, outputs=None,
            ))  # fmt: skip
    with CaptureReader(path) as reader:
        offset = reader.header.size
    data = bytearray(path.read_bytes())
    for index in range(count):
        length, _ = RECORD_PREFIX.unpack_from(data, offset)
        start = offset + RECORD_PREFIX.size
        if index in damaged:
            fields = list(RECORD_FIXED.unpack_from(data, start))
            fields[5] |= 0x40  # (flags: one no reader knows)
            RECORD_FIXED.pack_into(data, start, *fields)
            crc = zlib.crc32(bytes(data[start : start + length]))
            data[offset + 4 : offset + 8] = struct.pack("<I", crc)
        offset = start + length
    path.write_bytes(bytes(data))
    return path


def test_the_plan_counts_the_records_skipped(tmp_path: Path) -> None:
    capture = _capture(tmp_path / "c.dtcap", 6, {1, 4})
    plan = load_plan(ReplayConfig(capture, "http://127.0.0.1:9"))
    assert (len(plan), plan.skipped) == (4, 2)
    assert plan.first_skipped is not None
    assert "record 1 at byte offset" in plan.first_skipped


def test_a_capture_of_skipped_records_only_says_so(tmp_path: Path) -> None:
    capture = _capture(tmp_path / "c.dtcap", 2, {0, 1})
    with pytest.raises(ConfigError, match=r"holds no requests that decode \(2 skipped"):
        load_plan(ReplayConfig(capture, "http://127.0.0.1:9"))


def test_a_replay_of_a_damaged_capture_reports_what_it_skipped(tmp_path: Path, capsys: Any) -> None:
    capture = _capture(tmp_path / "c.dtcap", 5, {3})
    out = tmp_path / "r.json"
    with fake_v2_server() as fake:
        code = main(["replay", str(capture), "--target", f"http://{fake.address}", "-q",
                     "--json", str(out)])  # fmt: skip
    doc = json.loads(out.read_text())
    assert (doc["requests_in_capture"], doc["sent"], doc["ok"]) == (4, 4, 4)
    assert doc["skipped"] == 1
    assert "record 3" in doc["first_skipped"]
    assert "1 records of the capture were skipped" in capsys.readouterr().out
    assert code == 3
