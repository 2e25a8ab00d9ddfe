"""Late answers by cause reach the metrics (`duetime_late_answers_total`) and the statistics
endpoint (`late_by_cause`); how the scheduler counts them is tests/scheduling/test_late_cause."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest
from conftest import serving

from duetime.config import ServerSettings

pytestmark = pytest.mark.timeout(120)


def test_late_answers_are_exported_by_cause(mlp_repo: Path) -> None:
    settings = ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0)
    with serving(settings) as running:
        assert running.samples("duetime_late_answers_total", "cause") == {}, "none yet"
        scheduler = running.server.engine.registry.snapshot.models["mlp"].versions["1"]
        counts = scheduler.primary.scheduler._late_by

        def late() -> None:  # (on the loop, as the scheduler counts them)
            counts["delivery"] = 3
            counts["run"] = 1

        running.loop.call_soon_threadsafe(late)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), running.loop).result(timeout=30)
        samples = running.samples("duetime_late_answers_total", "model", "cause")
        assert samples == {("mlp", "delivery"): 3.0, ("mlp", "run"): 1.0}
        url = f"http://{running.http}/v2/models/mlp/stats"
        doc = json.loads(urllib.request.urlopen(url, timeout=30).read())
        (variant,) = doc["model_stats"][0]["duetime"]["variants"]
        assert variant["late_by_cause"] == {"delivery": 3, "run": 1}
        assert variant["late_margin_ns"] == 0, "counts set by hand: no batch ended late"
