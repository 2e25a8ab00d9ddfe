"""The statistics of one version, named as routing names it: "01" is version 1."""

from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_version_with_a_leading_zero_is_that_version(
    server: RunningServer, protocol: str
) -> None:
    """`/v2/models/m/versions/01/stats` answered 200 with no statistics (gRPC too), while
    infer, ready and metadata take "01" as version 1."""
    if protocol == "http":
        with httpclient.InferenceServerClient(server.http) as client:
            assert client.is_model_ready("mlp", "01")
            stats = client.get_inference_statistics("mlp", "01")
    else:
        with grpcclient.InferenceServerClient(server.grpc) as client:
            assert client.is_model_ready("mlp", "01")
            stats = client.get_inference_statistics("mlp", "01", as_json=True)
    [entry] = stats["model_stats"]
    assert (entry["name"], entry["version"]) == ("mlp", "1")
