"""`duetime serve` stopped by SIGTERM while a run outlasts the shutdown grace (a subprocess)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.test_cli import serving
from tests.unit.test_executor_close import FOREVER, loop_model

pytestmark = pytest.mark.timeout(90)


def post(url: str, body: dict[str, object]) -> tuple[int, str]:
    request = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def busy_instances(http: str) -> int:
    with urllib.request.urlopen(f"http://{http}/v2/models/loop/stats", timeout=10) as answer:
        stats = json.load(answer)
    return int(stats["model_stats"][0]["duetime"]["variants"][0]["busy_instances"])


def test_sigterm_during_a_run_longer_than_the_grace_exits_0_and_answers_503(
    tmp_path: Path,
) -> None:
    """It aborted (SIGABRT, "terminate called without an active exception") with the run's
    thread still in ONNX Runtime, and the run's client got no answer."""
    version = tmp_path / "repo" / "loop" / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(loop_model())
    (version.parent / "config.toml").write_text('max_batch_size = 0\nexecution = "thread"\n')
    body = {
        "inputs": [
            {"name": "n", "datatype": "INT64", "shape": [1], "data": [FOREVER]},
            {"name": "x", "datatype": "FP32", "shape": [1], "data": [0.0]},
        ]
    }
    with serving(tmp_path, str(tmp_path / "repo"), "--shutdown-grace-s", "1") as server:
        answers: list[tuple[int, str]] = []
        client = threading.Thread(
            target=lambda: answers.append(post(f"http://{server.http}/v2/models/loop/infer", body))
        )
        client.start()
        deadline = time.monotonic() + 30
        while busy_instances(server.http) == 0:  # (waits until the run starts; no timing)
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.02)
        assert server.stop() == 0, server.stderr
        client.join(30)
    assert "terminate called" not in server.stderr
    ((status, text),) = answers
    assert status == 503, text
    assert "the server is shutting down" in json.loads(text)["error"]
