"""A deployment that finishes draining after a reload or an unload leaves the registry's snapshot
as its drain ends: its final counts fold into the kept ones and the snapshot holds it, its
session and its scheduler no longer. Only a publish folded it: without a later one (which may
never come) it was kept alive, an unloaded version's series stayed on /metrics and every scrape
read its statistics (found by a reviewer)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from repo_models import factor_of, scale_model, write_version
from repo_models import run_on_engine as run

from duetime.engine import Engine
from duetime.observability.metrics import MetricsCollector
from duetime.statistics import statistics_json


def successes(engine: Engine) -> list[str]:
    """The scrape's nv_inference_request_success lines of model 'm'."""
    collector = MetricsCollector(SimpleNamespace(  # type: ignore[arg-type]
        registry=engine.registry, router=SimpleNamespace(invalid={}, shadows={})
    ))  # fmt: skip
    prometheus = CollectorRegistry()
    prometheus.register(collector)
    text = generate_latest(prometheus).decode()
    return [
        line
        for line in text.splitlines()
        if line.startswith("nv_inference_request_success{") and 'model="m"' in line
    ]


def stats_success(engine: Engine) -> int:
    doc: dict[str, Any] = statistics_json(engine.registry.snapshot, "m", None)
    return sum(e["inference_stats"]["success"]["count"] for e in doc["model_stats"])


async def served_refs(engine: Engine) -> tuple[weakref.ref[Any], weakref.ref[Any]]:
    """Weak references to the session and the scheduler of the version of 'm' serving now (one
    answer checked first)."""
    assert engine.manager is not None
    assert await factor_of(engine) == 1.0
    served = engine.registry.resolve("m", None)
    return weakref.ref(served.model), weakref.ref(served.scheduler)


async def released(*refs: weakref.ref[Any]) -> bool:
    """Whether each object of `refs` is freed within a few seconds: an instance thread may hold
    its session a moment longer, till its last run's frame is gone (it once was, under a full
    suite on two workers)."""
    for _ in range(100):
        gc.collect()
        if all(ref() is None for ref in refs):
            return True
        await asyncio.sleep(0.05)
    return False


async def drained(engine: Engine) -> None:
    """Every drain under way has ended (and its task is let go)."""
    assert engine.manager is not None
    await asyncio.gather(*engine.manager._retiring)
    for _ in range(3):
        await asyncio.sleep(0)


def test_a_reloaded_version_leaves_the_snapshot_once_drained(tmp_path: Any) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        model, scheduler = await served_refs(engine)
        write_version(tmp_path, "m", 1, scale_model(2))
        assert engine.manager is not None
        await engine.manager.load("m")  # (a reload: the old version drains)
        assert await factor_of(engine) == 2.0
        await drained(engine)
        snapshot = engine.registry.snapshot
        assert snapshot.retiring == ()  # (no publish since the drain ended)
        assert stats_success(engine) == 2  # (the old one's count goes on in the new series)
        assert len(successes(engine)) == 1
        assert successes(engine)[0].endswith(" 2.0")
        del snapshot
        assert await released(model, scheduler), "the replaced version is kept alive"

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def test_an_unloaded_version_leaves_the_metrics_once_drained(tmp_path: Any) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))

    async def scenario(engine: Engine) -> None:
        model, scheduler = await served_refs(engine)
        assert engine.manager is not None
        await engine.manager.unload("m")
        await drained(engine)
        assert engine.registry.snapshot.retiring == ()  # (no publish since the drain ended)
        assert not engine.registry.snapshot.retired  # (nothing of its labels serves on)
        assert successes(engine) == []  # its series is gone
        assert await released(model, scheduler), "the unloaded version is kept alive"

    run(tmp_path, scenario, control_mode="explicit", startup_models=("m",))
