"""Unit tests for `duetime.repository.registry.Registry`: publishing and resolving deployments."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from duetime.config import TrafficConfig
from duetime.errors import ModelNotFound, ModelUnavailable
from duetime.repository.registry import Deployment, Registry, ServedVersion


def deployment(name: str, version: str) -> Deployment:
    """A Deployment with stand-ins: the registry reads only `model.name` and `model.version`,
    and, of one a publish took out, whether its scheduler has `finished` draining (not yet: it
    stays among the snapshot's `retiring`)."""
    model: Any = SimpleNamespace(name=name, version=version)
    scheduler: Any = SimpleNamespace(finished=False)
    return Deployment(model, scheduler)


def publish(registry: Registry, item: Deployment) -> None:
    """Serve `item` beside the versions of its model already served."""
    current = registry.snapshot.models.get(item.model.name)
    versions = dict(current.versions) if current else {}
    versions[item.model.version] = ServedVersion(item.model.version, (item,))
    registry.publish(item.model.name, versions, TrafficConfig())


def registry_with(*deployments: Deployment) -> Registry:
    registry = Registry()
    for item in deployments:
        publish(registry, item)
    return registry


def test_empty_registry() -> None:
    registry = Registry()
    assert dict(registry.snapshot.models) == {}
    with pytest.raises(ModelNotFound) as unknown:
        registry.resolve("m", None)
    assert unknown.value.message == (
        "Request for unknown model: 'm' is not found; served models: none"
    )


def test_publish_and_resolve() -> None:
    one = deployment("m", "1")
    registry = registry_with(one)
    assert registry.resolve("m", None) is one
    assert registry.resolve("m", "") is one
    assert registry.resolve("m", "1") is one
    served = registry.snapshot.models["m"]
    assert (served.name, served.default, list(served.versions)) == ("m", "1", ["1"])


@pytest.mark.parametrize(
    ("versions", "default"),
    [(["1", "2"], "2"), (["2", "1"], "2"), (["9", "10"], "10"), (["10", "9", "3"], "10")],
)
def test_default_is_the_highest_version_numerically(versions: list[str], default: str) -> None:
    items = {v: deployment("m", v) for v in versions}
    registry = registry_with(*items.values())
    assert registry.snapshot.models["m"].default == default
    assert registry.resolve("m", None) is items[default]
    for version, item in items.items():
        assert registry.resolve("m", version) is item


def test_republishing_a_version_replaces_it() -> None:
    old, new = deployment("m", "1"), deployment("m", "1")
    registry = registry_with(old, new)
    assert registry.resolve("m", "1") is new
    assert list(registry.snapshot.models["m"].versions) == ["1"]


def test_models_are_independent() -> None:
    a, b = deployment("a", "1"), deployment("b", "5")
    registry = registry_with(a, b)
    assert registry.resolve("a", None) is a
    assert registry.resolve("b", None) is b


def test_unknown_model_lists_served_models() -> None:
    registry = registry_with(deployment("b", "1"), deployment("a", "1"))
    with pytest.raises(ModelNotFound) as unknown:
        registry.resolve("c", None)
    assert unknown.value.message == (
        "Request for unknown model: 'c' is not found; served models: 'a', 'b'"
    )


def test_unknown_model_lists_the_models_loaded_on_demand_too() -> None:
    """Lazy loading: the models a request would load, which "served models: none" left out."""
    registry = registry_with(deployment("b", "1"))
    registry.on_demand = lambda: ["a", "b", "c"]
    with pytest.raises(ModelNotFound) as unknown:
        registry.resolve("d", None)
    assert unknown.value.message == (
        "Request for unknown model: 'd' is not found; served models: 'a', 'b', 'c' ('a', 'c' "
        "not loaded yet: each loads on its first request)"
    )


def test_unknown_version_lists_loaded_versions() -> None:
    registry = registry_with(deployment("m", "10"), deployment("m", "2"))
    with pytest.raises(ModelNotFound) as unknown:
        registry.resolve("m", "3")
    # (Triton's words first: its clients and QA tests match on them)
    assert unknown.value.message == (
        "Request for unknown model: 'm' version 3 is not found; loaded versions: 2, 10"
    )


def test_failure_of_an_unserved_model_is_unavailable_not_unknown() -> None:
    registry = Registry()
    registry.record_failure("m", "bad config")
    with pytest.raises(ModelUnavailable) as failed:
        registry.resolve("m", None)
    # (Triton's words first, as its QA tests expect; duetime's reason after them)
    assert failed.value.message == (
        "Request for unknown model: 'm' has no available versions: bad config"
    )
    with pytest.raises(ModelNotFound, match=r"^Request for unknown model: 'other' is not found"):
        registry.resolve("other", None)


def test_a_model_loading_with_nothing_served_is_unavailable_not_unknown() -> None:
    """It was a 404 "unknown model" while its first load ran (README: 503 for a model
    loading); now a 503 with Triton's start, and a Retry-After of about its load time."""
    registry = Registry()
    registry.record_loading("m", 2.4)
    with pytest.raises(ModelUnavailable) as loading:
        registry.resolve("m", None)
    assert loading.value.message.startswith(
        "Request for unknown model: 'm' has no available versions: it is loading"
    )
    assert loading.value.retry_after_s == 3
    registry.record_failure("m", "bad config")  # (a reload of a failed model: loading wins)
    with pytest.raises(ModelUnavailable, match="it is loading"):
        registry.resolve("m", None)
    registry.record_loading("m", None)
    with pytest.raises(ModelUnavailable, match="has no available versions: bad config"):
        registry.resolve("m", None)
    registry.record_loading("n", 0.01)
    registry.record_loading("o", 0.01)
    publish(registry, deployment("n", "1"))
    registry.record_failure("p", "bad config")
    assert registry.snapshot.loading.keys() == {"n", "o"}  # (kept by publish and failures)
    assert registry.resolve("n", None).model.name == "n"  # (served: it answers)


def test_a_version_loading_beside_served_ones_is_unavailable_not_unknown() -> None:
    """A request for version 2 while it loads and version 1 serves was a 404 "version 2 is not
    found"; Triton answers UNAVAILABLE "version 2 is not at ready state". Now a 503 saying it is
    loading, with a Retry-After of about the load's time; a version no load brings is unknown."""
    registry = registry_with(deployment("m", "1"))
    registry.record_loading("m", 2.4, ["2"])
    for written in ("2", "02"):
        with pytest.raises(ModelUnavailable) as loading:
            registry.resolve("m", written)
        assert loading.value.message == (
            f"Request for unknown model: 'm' version {written} is not at ready state: it is "
            "loading (a load takes about 3 s); retry shortly"
        )
        assert loading.value.retry_after_s == 3
    with pytest.raises(ModelNotFound, match="'m' version 3 is not found; loaded versions: 1"):
        registry.resolve("m", "3")
    assert registry.resolve("m", None).model.version == "1"  # (the served one answers)
    registry.record_loading("m", 2.4, [])  # (version 2 failed: the load goes on without it)
    with pytest.raises(ModelNotFound, match="'m' version 2 is not found"):
        registry.resolve("m", "2")
    registry.record_loading("m", 2.4, ["2"])
    publish(registry, deployment("m", "2"))  # (loaded: served)
    assert registry.resolve("m", "2").model.version == "2"
    registry.record_loading("m", None)
    assert registry.resolve("m", "2").model.version == "2"


def test_publish_clears_the_failure() -> None:
    registry = Registry()
    registry.record_failure("m", "bad config")
    registry.record_failure("n", "broken")
    one = deployment("m", "1")
    publish(registry, one)
    assert registry.resolve("m", None) is one
    assert dict(registry.snapshot.failures) == {"n": "broken"}


def test_failure_does_not_replace_a_working_model() -> None:
    one = deployment("m", "1")
    registry = registry_with(one)
    registry.record_failure("m", "version 2 is broken")
    assert registry.resolve("m", None) is one
    assert registry.snapshot.failures["m"] == "version 2 is broken"


def test_snapshots_are_immutable_and_replaced_whole() -> None:
    registry = registry_with(deployment("m", "1"))
    before = registry.snapshot
    publish(registry, deployment("m", "2"))
    assert list(before.models["m"].versions) == ["1"]
    assert registry.snapshot is not before
    variants = before.models["m"].versions["1"].variants
    with pytest.raises(TypeError):
        registry.snapshot.models["x"] = before.models["m"]  # type: ignore[index]
    with pytest.raises(TypeError):
        registry.snapshot.models["m"].versions["3"] = ServedVersion("3", variants)  # type: ignore[index]


def test_clear_returns_every_deployment() -> None:
    items = [deployment("a", "1"), deployment("a", "2"), deployment("b", "1")]
    registry = registry_with(*items)
    registry.record_failure("c", "broken")
    cleared = registry.clear()
    assert sorted(map(id, cleared)) == sorted(map(id, items))
    assert dict(registry.snapshot.models) == {}
    assert dict(registry.snapshot.failures) == {}
    # cleared at shutdown: unavailable (503, retry elsewhere), not unknown (404, final)
    with pytest.raises(ModelUnavailable, match="'a': the server is shutting down; retry on"):
        registry.resolve("a", None)


def test_publishing_no_versions_stops_serving_the_model() -> None:
    registry = registry_with(deployment("m", "1"), deployment("n", "1"))
    registry.publish("m", {}, TrafficConfig())
    assert list(registry.snapshot.models) == ["n"]
    with pytest.raises(ModelNotFound):
        registry.resolve("m", None)


def test_traffic_plan_only_names_served_versions() -> None:
    registry = registry_with(deployment("m", "1"), deployment("m", "2"))
    current = registry.snapshot.models["m"]
    traffic = TrafficConfig(weights={"1": 70, "2": 30, "7": 50}, shadow={"2": 0.1, "9": 1.0})
    registry.publish("m", current.versions, traffic)
    plan = registry.snapshot.models["m"].traffic
    assert plan.versions == ("1", "2")
    assert plan.shadows == (("2", 0.1),)
