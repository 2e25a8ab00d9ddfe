"""A gRPC call's error message goes in its trailers, which clients take up to 8 KB of: an error
that names a client's long model name is cut to fit (`MAX_DETAILS_BYTES`), and the client gets
its real status. (A ModelInfer naming a model of 20,000 characters got RESOURCE_EXHAUSTED
"Stream removed (received metadata size exceeds hard limit)" in place of NOT_FOUND.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import RunningServer, serving
from repo_models import scale_model, write_version
from tritonclient.grpc import service_pb2

from duetime.config import ServerSettings
from duetime.errors import CUT
from duetime.frontend.grpc import MAX_DETAILS_BYTES

pytestmark = pytest.mark.timeout(60)

SERVICE = "/inference.GRPCInferenceService/"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root: Path = tmp_path_factory.mktemp("long-error")
    write_version(root, "scale", 1, scale_model(2.0))
    with serving(ServerSettings(model_repository=root, http_port=0, grpc_port=0)) as running:
        yield running


def error_of(server: RunningServer, method: str, request: object) -> grpc.RpcError:
    with grpc.insecure_channel(server.grpc) as channel:
        call = channel.unary_unary(SERVICE + method)
        with pytest.raises(grpc.RpcError) as raised:
            call(request.SerializeToString(), timeout=30)  # type: ignore[attr-defined]
    return raised.value


@pytest.mark.parametrize("name", ["x" * 20_000, "é" * 6_000, "m" * 3_000_000])
def test_an_error_naming_a_long_model_name_keeps_its_status(
    server: RunningServer, name: str
) -> None:
    for method, request in (
        ("ModelInfer", service_pb2.ModelInferRequest(model_name=name)),
        ("ModelMetadata", service_pb2.ModelMetadataRequest(name=name)),
    ):
        error = error_of(server, method, request)
        assert error.code() == grpc.StatusCode.NOT_FOUND, error.details()
        details = error.details()
        assert CUT in details
        assert len(details.encode()) <= MAX_DETAILS_BYTES + 100  # (+ the trace id)
        assert details.startswith("Request for unknown model: '")


def test_a_short_error_is_not_cut(server: RunningServer) -> None:
    error = error_of(server, "ModelInfer", service_pb2.ModelInferRequest(model_name="nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert CUT not in error.details()
    assert "'nope'" in error.details()


def test_an_http_error_quoting_a_long_input_name_is_cut(server: RunningServer) -> None:
    """Found by a tester: over HTTP a 7 MB input name came back whole, in a 7 MB 400 (and a
    7 MB log line); cut as gRPC cuts its details, to `MAX_MESSAGE_BYTES`."""
    import http.client
    import json

    from duetime.frontend.rest import MAX_MESSAGE_BYTES

    body = json.dumps(
        {"inputs": [{"name": "n" * 3_000_000, "datatype": "FP32", "shape": [1, 4],
                     "data": [0, 0, 0, 0]}]}
    ).encode()  # fmt: skip
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", "/v2/models/scale/infer", body)
        reply = connection.getresponse()
        message = json.loads(reply.read())["error"]
    finally:
        connection.close()
    assert reply.status == 400
    assert CUT in message
    assert len(message.encode()) <= MAX_MESSAGE_BYTES + 100  # (+ the trace id)
