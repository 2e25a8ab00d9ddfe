"""deploy/grafana/duetime.json: a Grafana dashboard that imports (valid JSON, a Prometheus
datasource input, the expected panels) and asks only for metrics duetime exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from duetime.engine import Engine
from duetime.observability.gc_pauses import GcPauses
from duetime.observability.metrics import MetricsCollector
from duetime.overload import LoadShedder

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "duetime.json"
PANELS = {
    "Request rate by outcome",
    "Goodput",
    "P50 / P99 end-to-end latency",
    "Queue vs compute latency",
    "Batch size distribution",
    "Queue depth",
    "In-flight batches",
    "Loaded models",
    "GC pauses",
    "Breaker state",
    "Shadow divergence",
}
SUFFIXES = {
    "counter": ("_total",), "gauge": ("",), "unknown": ("",),  # (Triton's names: untyped)
    "histogram": ("_bucket", "_sum", "_count"),
}  # fmt: skip


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return document


def exposed_series() -> set[str]:
    """Every series name the collector writes, from its families (no model needed)."""
    collector = MetricsCollector(Engine(), LoadShedder(), GcPauses())
    return {
        family.name + suffix for family in collector.collect() for suffix in SUFFIXES[family.type]
    }


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def test_it_is_an_importable_dashboard(dashboard: dict[str, Any]) -> None:
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["title"] == "duetime"
    (source,) = dashboard["__inputs"]
    assert (source["name"], source["type"], source["pluginId"]) == (
        "DS_PROMETHEUS",
        "datasource",
        "prometheus",
    )
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
            assert panel["targets"], panel["title"]


def test_it_has_the_expected_panels(dashboard: dict[str, Any]) -> None:
    titles = {panel["title"] for panel in dashboard["panels"]}
    assert titles >= PANELS


def test_every_query_asks_for_metrics_duetime_exposes(dashboard: dict[str, Any]) -> None:
    exposed = exposed_series()
    for title, expr in queries(dashboard):
        names = set(re.findall(r"\bduetime_[a-z_]+", expr))
        assert names, f"{title}: {expr} reads no duetime metric"
        assert names <= exposed, f"{title}: {sorted(names - exposed)} are not exposed"


def test_latency_quantiles_read_histogram_buckets(dashboard: dict[str, Any]) -> None:
    for title, expr in queries(dashboard):
        for match in re.finditer(r"histogram_quantile\(0\.\d+, sum by \(([^)]*)\)", expr):
            assert "le" in [label.strip() for label in match[1].split(",")], title
        if "histogram_quantile" in expr:
            assert "_bucket" in expr, title
