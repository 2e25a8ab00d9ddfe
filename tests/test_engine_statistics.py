"""`Engine.statistics`: the in-process API gives the model statistics the HTTP and gRPC
statistics calls give (Triton's form, duetime's own figures under "duetime": the latency
profile, refusals), of one version, one model or every model, and refuses a model or version
not served as those calls do."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RunningServer, on_loop

from duetime import Engine
from duetime.demo import write_demo_repository
from duetime.errors import ModelNotFound

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("demo")
    write_demo_repository(path)
    return path


def test_counts_what_ran_with_its_profile(demo: Path) -> None:
    with Engine.open(demo) as engine:
        for _ in range(3):
            engine.infer("mlp", {"x": np.ones((1, 40), np.float32)}, timeout=10)
        stats = engine.statistics("mlp")
        assert engine.statistics("mlp", "1") == stats | {"model_stats": stats["model_stats"]}
        everything = engine.statistics()
    (mlp,) = stats["model_stats"]
    assert (mlp["name"], mlp["version"], mlp["inference_count"]) == ("mlp", "1", 3)
    assert mlp["inference_stats"]["success"]["count"] == 3
    (variant,) = mlp["duetime"]["variants"]
    assert variant["succeeded"] == 3
    assert variant["latency_profile"]  # (measured at load)
    names = [entry["name"] for entry in everything["model_stats"]]
    assert names == sorted(names)
    assert {"mlp", "resnet"} <= set(names)


@pytest.mark.parametrize(("model", "version"), [("nope", None), ("mlp", "7")])
def test_a_model_or_version_not_served_is_refused(
    demo: Path, model: str, version: str | None
) -> None:
    with Engine.open(demo) as engine, pytest.raises(ModelNotFound, match=f"'{model}'"):
        engine.statistics(model, version)


def test_the_same_counts_as_the_http_call(server: RunningServer) -> None:
    """The server's engine counts as its statistics endpoint does: Triton's figures, and the
    requests by outcome (those a refreshed profile or margins could move aside)."""
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("GET", "/v2/models/mlp/stats")
        response = connection.getresponse()
        assert response.status == 200
        over_http = json.loads(response.read())
    finally:
        connection.close()
    in_process = on_loop(server, lambda: server.server.engine.statistics("mlp"))
    assert [_counts(entry) for entry in in_process["model_stats"]] == [
        _counts(entry) for entry in over_http["model_stats"]
    ]


def _counts(entry: dict[str, Any]) -> tuple[object, ...]:
    variants = [
        {key: variant[key] for key in ("variant", "succeeded", "rejected", "expired", "failed")}
        for variant in entry["duetime"]["variants"]
    ]
    kept = ("name", "version", "last_inference", "inference_count", "execution_count")
    return (*(entry[key] for key in kept), entry["inference_stats"], entry["batch_stats"], variants)
