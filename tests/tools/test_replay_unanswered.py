"""A replay whose target never answers counts its requests unanswered (and errors) and warns,
as `duetime bench` does: closing the connections at the end does not turn them into status 0."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from duetime.cli import main
from duetime.tools.capture import CapturedRequest, CapturedTensor, CaptureWriter
from duetime.tools.replay_results import format_result

REQUESTS = 6


@pytest.fixture
def silent_target() -> Iterator[str]:
    """A port that takes connections (the kernel's backlog) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


def _capture(path: Path) -> Path:
    x = CapturedTensor.of("x", np.zeros((1, 4), np.float32))
    with CaptureWriter(path) as writer:
        for i in range(REQUESTS):
            writer.write(CapturedRequest(
                arrival_ns=i * 5_000_000, protocol="http", model="m", version=None,
                request_id=f"r{i}", inputs=[x], outputs_wanted=None, parameters={},
                due_in_ns=None, priority=0, headers={}, trace_id=None, status=200, error=None,
                latency_ns=0, answered_version=None, variant=None, outputs=None,
            ))  # fmt: skip
    return path


def test_requests_never_answered_are_unanswered(
    tmp_path: Path, silent_target: str, capsys: Any
) -> None:
    capture = _capture(tmp_path / "c.dtcap")
    out = tmp_path / "r.json"
    code = main(["replay", str(capture), "--target", f"http://{silent_target}", "--drain", "0.2",
                 "--json", str(out), "-q"])  # fmt: skip
    result = json.loads(out.read_text())
    assert result["sent"] == REQUESTS
    assert result["unanswered"] == REQUESTS
    assert result["errors"] == REQUESTS  # (counted as errors too, as bench counts them)
    assert result["statuses"] == {}
    said = capsys.readouterr().out
    assert "6 requests had no answer by the end of --drain" in said
    assert "not in the latency percentiles" in said
    assert code == 0
    assert "raise --drain" in said
    # NOTE: the same after Ctrl-C cut the drain short was told to "raise --drain" (a tester's)
    stopped = format_result({**result, "interrupted": True})
    assert "6 requests had no answer when the replay ended (after Ctrl-C it waits at" in stopped
    assert "raise --drain" not in stopped
