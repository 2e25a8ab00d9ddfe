"""What a deployment answers while it drains after a reload swapped in its replacement, or after
an unload, is counted: the metrics and `/stats` read it with its replacement's counts (one series
per model, version and variant), and its final counts go on in them once it has closed. It was
counted nowhere: the collector and the statistics read only the registry's served deployments
(21 of 281 successes missing across a reload under load; found by a tester)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from test_triton_accounting import Harness, harness, run

from duetime.config import ModelConfig, SchedulingConfig
from duetime.observability.metrics import MetricsCollector
from duetime.repository.registry import Deployment, Registry, ServedVersion
from duetime.statistics import statistics_json


class _Model:
    """What the registry, the statistics and the collector read of a loaded model."""

    name, version = "m", "1"
    path = Path("/nonexistent/model.onnx")
    config = SimpleNamespace(scheduling=SchedulingConfig(), instances=1)
    executor = SimpleNamespace(inline=False)


def publish(registry: Registry, *deployed: Harness) -> None:
    """Serve version 1 of 'm' with `deployed`'s scheduler (none: unload it)."""
    deployments = tuple(Deployment(_Model(), h.scheduler) for h in deployed)  # type: ignore[arg-type]
    versions = {"1": ServedVersion("1", deployments)} if deployed else {}
    registry.publish("m", versions, ModelConfig().traffic)


def successes(registry: Registry) -> dict[str, float]:
    """The scrape's nv_inference_request_success and duetime_requests_total success of 'm'
    (each a single series: the scrape has no duplicate)."""
    collector = MetricsCollector(SimpleNamespace(  # type: ignore[arg-type]
        registry=registry, router=SimpleNamespace(invalid={}, shadows={})
    ))  # fmt: skip
    prometheus = CollectorRegistry()
    prometheus.register(collector)
    text = generate_latest(prometheus).decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name == "nv_inference_request_success" or (
            name == "duetime_requests_total" and 'outcome="success"' in line
        ):
            assert name not in found, f"two series of {name}"
            found[name] = float(line.rsplit(" ", 1)[1])
    return found


def both(count: int) -> dict[str, float]:
    return {"nv_inference_request_success": count, "duetime_requests_total": count}


def stats_success(registry: Registry) -> int:
    doc: dict[str, Any] = statistics_json(registry.snapshot, "m", None)
    return sum(e["inference_stats"]["success"]["count"] for e in doc["model_stats"])


async def answer_one(h: Harness, index: int) -> None:
    future = h.submit()
    await asyncio.sleep(0)
    h.executor.finish(index)
    await future


def test_a_replaced_version_counts_what_it_answers_while_it_drains() -> None:
    async def body() -> None:
        registry = Registry()
        old, new = harness(), harness()
        publish(registry, old)
        await answer_one(old, 0)
        held = old.submit()  # (running when the reload swaps the new deployment in)
        publish(registry, new)
        await answer_one(new, 0)
        old.executor.finish(1)  # the old one answers while it drains
        await held
        assert successes(registry) == both(3)
        assert stats_success(registry) == 3
        await old.scheduler.aclose(0)
        publish(registry, new)  # (a publish folds what finished into the counts kept)
        assert registry.snapshot.retiring == ()
        await answer_one(new, 1)
        assert stats_success(registry) == 4
        assert successes(registry) == both(4)

    run(body)


def test_an_unloaded_version_is_counted_until_it_has_drained() -> None:
    async def body() -> None:
        registry = Registry()
        h = harness()
        publish(registry, h)
        held = h.submit()
        publish(registry)  # unloaded, its request still running
        assert successes(registry) == both(0)
        h.executor.finish(0)
        await held
        assert successes(registry) == both(1)
        await h.scheduler.aclose(0)
        publish(registry)
        assert successes(registry) == {}  # (drained and closed: gone, as documented)
        assert registry.snapshot.retiring == ()
        assert not registry.snapshot.retired
        again = harness()
        publish(registry, again)  # loaded again: from zero
        assert successes(registry) == both(0)

    run(body)


def test_a_shed_request_counts_against_the_deployment_serving_when_it_was_shed() -> None:
    async def body() -> None:
        registry = Registry()
        old, new = harness(), harness()
        publish(registry, old)
        registry.count_shed("m", None)
        registry.count_shed("m", "1")
        publish(registry, new)  # (a reload: the next refusals count against its replacement)
        registry.count_shed("m", None)
        registry.count_shed("m", "2")  # a version not served, and a model not served: nowhere
        registry.count_shed("nobody", None)
        assert old.scheduler.statistics().rejected == 2
        assert new.scheduler.statistics().rejected == 1
        publish(registry)  # unloaded: counted nowhere, and no error
        registry.count_shed("m", None)
        assert new.scheduler.statistics().rejected == 1

    run(body)
