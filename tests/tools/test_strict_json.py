"""The tools' --json results are standard JSON: no Infinity or NaN, which strict parsers refuse."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from fake_v2 import fake_v2_server

from duetime.cli import main
from duetime.tools.capture import CapturedRequest, CapturedTensor, CaptureWriter


def _strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"not standard JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_floats_that_are_not_finite_are_written_null() -> None:
    from duetime.tools.outputs import strict_json

    doc = {"a": math.inf, "b": [1.5, -math.inf, {"c": math.nan}], "d": (2, "x"), "e": None}
    assert _strict(strict_json(doc)) == {"a": None, "b": [1.5, None, {"c": None}],
                                         "d": [2, "x"], "e": None}  # fmt: skip


def test_a_replay_comparing_outputs_of_another_shape_writes_standard_json(tmp_path: Path) -> None:
    capture = tmp_path / "c.dtcap"
    x = CapturedTensor.of("x", np.zeros((1, 4), np.float32))
    y = CapturedTensor.of("y", np.zeros((1, 3), np.float32))  # (the fake answers y [1, 4])
    with CaptureWriter(capture) as writer:
        writer.write(CapturedRequest(
            arrival_ns=0, protocol="http", model="m", version=None, request_id="r0", inputs=[x],
            outputs_wanted=None, parameters={}, due_in_ns=None, priority=0, headers={},
            trace_id=None, status=200, error=None, latency_ns=0, answered_version=None,
            variant=None, outputs=[y],
        ))  # fmt: skip
    out = tmp_path / "r.json"
    with fake_v2_server() as fake:
        code = main(["replay", str(capture), "--target", f"http://{fake.address}",
                     "--compare-outputs", "--json", str(out), "-q"])  # fmt: skip
    assert code == 3  # (the answer differs)
    doc = _strict(out.read_text())
    assert doc["compare"]["mismatched"] == 1
    assert doc["compare"]["first_mismatches"][0]["max_abs_error"] is None
