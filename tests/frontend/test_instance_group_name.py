"""A served model's config names its instance group as Triton names a group without a name:
`<model>_<index>` (NormalizeInstanceGroup), over gRPC and HTTP, and the config read back loads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, explicit_serving

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(mlp_repo: Path) -> Iterator[RunningServer]:
    with explicit_serving(mlp_repo, "mlp") as running:
        yield running


def test_the_group_is_named_after_the_model_and_its_index(server: RunningServer) -> None:
    grpc_config = grpcclient.InferenceServerClient(server.grpc).get_model_config("mlp")
    http_config = httpclient.InferenceServerClient(server.http).get_model_config("mlp")
    assert [group.name for group in grpc_config.config.instance_group] == ["mlp_0"]
    assert [group["name"] for group in http_config["instance_group"]] == ["mlp_0"]


def test_the_config_read_back_loads_as_an_override(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http)
    config = client.get_model_config("mlp")
    config["instance_group"][0]["count"] = 3
    client.load_model("mlp", config=json.dumps(config))
    assert server.server.engine.registry.resolve("mlp", None).model.config.instances == 3
    reloaded = client.get_model_config("mlp")["instance_group"]
    assert [(group["name"], group["count"]) for group in reloaded] == [("mlp_0", 3)]
