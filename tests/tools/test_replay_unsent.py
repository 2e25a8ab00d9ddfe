"""A replay whose target dies counts the requests it could never send (no connection could be
opened) as unsent, not as sent errors, warns, and exits 3, as `duetime bench` does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fake_v2 import fake_v2_server

from duetime.cli import main

REQUESTS = 20


def _capture(tmp_path: Path) -> Path:
    lines = tmp_path / "c.jsonl"
    with lines.open("w") as out:
        for i in range(REQUESTS):
            out.write(json.dumps({
                "t_ms": i * 5, "model": "m",
                "inputs": {"x": {"datatype": "FP32", "shape": [1, 4], "data": [0.5] * 4}},
            }) + "\n")  # fmt: skip
    capture = tmp_path / "c.cap"
    assert main(["capture", "convert", str(lines), str(capture)]) == 0
    return capture


def test_requests_that_found_no_connection_are_unsent(tmp_path: Path, capsys: Any) -> None:
    capture = _capture(tmp_path)
    out = tmp_path / "r.json"
    with fake_v2_server(dies_at_first_post=True) as fake:
        # one connection: each answer closes it, and after the first the server is gone
        code = main(["replay", str(capture), "--target", f"http://{fake.address}",
                     "--connections", "1", "--json", str(out), "-q", "--drain", "2"])  # fmt: skip
    result = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert result["unsent"] > 0
    assert result["sent"] + result["unsent"] == REQUESTS
    # (what was sent was answered, or failed on a connection that was open: an error)
    assert result["ok"] + result["errors"] == result["sent"]
    assert sum(result["statuses"].values()) == result["sent"]
    assert sum(result["timeline"]["sent"]) == result["sent"]
    assert f"unsent {result['unsent']}" in printed
    assert "were not sent" in printed
    assert code == 3
