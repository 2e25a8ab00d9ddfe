"""The statistics of one version, named as routing names it: "01" is version 1."""

from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer
from tritonclient.utils import InferenceServerException

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


def test_a_version_without_a_model_name_gives_every_models_versions(
    server: RunningServer,
) -> None:
    """As Triton (its version is read only with a name): gRPC gave only each model's version of
    that number, none for a number no model has, where `/v2/models/stats` gives them all
    (found by a tester). A malformed version is refused all the same, as Triton does."""
    with grpcclient.InferenceServerClient(server.grpc) as client:
        every = client.get_inference_statistics("", "", as_json=True)["model_stats"]
        numbered = client.get_inference_statistics("", "7", as_json=True)["model_stats"]
        with pytest.raises(InferenceServerException, match="version string 'abc'"):
            client.get_inference_statistics("", "abc")
    with httpclient.InferenceServerClient(server.http) as client:
        over_http = client.get_inference_statistics("", "7")["model_stats"]
    names = {(e["name"], e["version"]) for e in every}
    assert len(names) > 1
    assert {(e["name"], e["version"]) for e in numbered} == names
    assert {(e["name"], e["version"]) for e in over_http} == names
