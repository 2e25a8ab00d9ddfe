"""The v2 extensions a server lists in its metadata, the same over HTTP and gRPC."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, start_server, stop_server
from repo_models import scale_model, write_version

from duetime.config import ServerSettings

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root: Path = tmp_path_factory.mktemp("extensions")
    write_version(root, "scale", 1, scale_model(2.0))
    running, thread = start_server(ServerSettings(model_repository=root, http_port=0, grpc_port=0))
    yield running
    stop_server(running, thread)


def test_both_protocols_list_the_schedule_policy_extension_whose_parameters_are_honoured(
    server: RunningServer,
) -> None:
    http = httpclient.InferenceServerClient(server.http)
    grpc = grpcclient.InferenceServerClient(server.grpc)
    try:
        over_http = http.get_server_metadata()["extensions"]
        over_grpc = grpc.get_server_metadata(as_json=True)["extensions"]
    finally:
        http.close()
        grpc.close()
    assert "schedule_policy" in over_http
    assert over_grpc == over_http
