"""Admission probes (a request admitted though predicted to miss, to measure the model again)
are counted in the statistics (each variant's `probes`) and in /metrics."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from repo_models import scale_model, write_version

from duetime import Engine
from duetime.errors import DeadlineExceeded, Overloaded
from duetime.observability.metrics import MetricsCollector
from duetime.statistics import statistics_json

pytestmark = pytest.mark.timeout(60)

MARGIN_US = 100_000
"""The model's delivery margin: every request is predicted to need this (and a few µs more)."""
TIMEOUT_S = 0.08
"""Short of MARGIN_US, so admission refuses it, but within twice it: after 100 ms without a run
(scheduler.PROBE_NS) the idle model admits one as a probe."""


def test_probes_are_counted_in_the_statistics_and_metrics(tmp_path: Path) -> None:
    """SchedulerStatistics.probes was counted and shown nowhere, though the README says a probe
    is "counted in the statistics"."""
    write_version(tmp_path, "m", 1, scale_model(2.0))
    (tmp_path / "m" / "config.toml").write_text(f"[scheduling]\ndelivery_margin_us = {MARGIN_US}\n")
    x = {"x": np.ones((1, 4), np.float32)}
    with Engine.open(tmp_path) as engine:
        refused = 0
        deadline = time.monotonic() + 30
        while True:  # (refused until the model has run nothing for 100 ms)
            try:
                engine.infer("m", x, timeout=TIMEOUT_S)
                break
            except Overloaded:
                refused += 1
            except DeadlineExceeded:
                break  # (admitted, then found unable to make its due time: still a probe)
            assert time.monotonic() < deadline, "no probe admitted in 30 s"
            time.sleep(0.02)
        [entry] = statistics_json(engine.registry.snapshot, "m", None)["model_stats"]
        [variant] = entry["duetime"]["variants"]
        assert (variant["probes"], variant["rejected"]) == (1, refused)
        probes = {
            tuple(sample.labels.values()): sample.value
            for family in MetricsCollector(engine).collect()
            if family.name == "duetime_admission_probes"
            for sample in family.samples
        }
        assert probes == {("m", "1", "default"): 1}
