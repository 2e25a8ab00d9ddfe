"""How many parameters an inference request, and each of its inputs and outputs, may carry: over
MAX_PARAMETERS it is refused (INVALID_ARGUMENT, 400) naming whose `parameters` and the limit,
before any is read, over gRPC (ModelInfer and ModelStreamInfer) and HTTP; up to it, answered."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import RunningServer, start_server, stop_server
from repo_models import scale_model, write_version
from tritonclient.grpc import service_pb2, service_pb2_grpc

from duetime.config import ServerSettings
from duetime.errors import InvalidInput
from duetime.frontend.parameters import MAX_PARAMETERS, check_parameter_count

pytestmark = pytest.mark.timeout(60)

WHERE = {"request": "request", "input": "input 'x'", "output": "output 'y'"}
"""Whose parameters a test fills -> how the refusal names them."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root: Path = tmp_path_factory.mktemp("parameter-count")
    write_version(root, "scale", 1, scale_model(2.0))
    running, thread = start_server(ServerSettings(model_repository=root, http_port=0, grpc_port=0))
    yield running
    stop_server(running, thread)


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Iterator[Any]:
    with grpc.insecure_channel(server.grpc) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def assert_names_the_limit(message: str, whose: str, count: int) -> None:
    assert f"{WHERE[whose]} 'parameters' has {count} entries" in message, message
    assert f"limit of {MAX_PARAMETERS} parameters" in message, message


def test_the_count_is_checked_against_the_limit() -> None:
    check_parameter_count(MAX_PARAMETERS, "request")
    with pytest.raises(InvalidInput) as raised:
        check_parameter_count(MAX_PARAMETERS + 1, "input 'x'")
    assert_names_the_limit(raised.value.message, "input", MAX_PARAMETERS + 1)


# -- gRPC ----------------------------------------------------------------------------------------


def grpc_request(whose: str, count: int) -> Any:
    request = service_pb2.ModelInferRequest(model_name="scale", id="p")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    output = request.outputs.add(name="y")
    parameters = {"request": request, "input": tensor, "output": output}[whose].parameters
    for index in range(count):
        parameters[f"p{index}"].int64_param = index
    return request


@pytest.mark.parametrize("whose", list(WHERE))
def test_a_grpc_request_over_the_limit_is_invalid_argument(stub: Any, whose: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(grpc_request(whose, MAX_PARAMETERS + 1), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_names_the_limit(raised.value.details(), whose, MAX_PARAMETERS + 1)


@pytest.mark.parametrize("whose", list(WHERE))
def test_a_grpc_request_at_the_limit_is_answered(stub: Any, whose: str) -> None:
    response = stub.ModelInfer(grpc_request(whose, MAX_PARAMETERS), timeout=30)
    assert response.id == "p"


def test_a_streamed_request_over_the_limit_gets_its_error_and_the_stream_goes_on(
    stub: Any,
) -> None:
    requests = [grpc_request("request", MAX_PARAMETERS + 1), grpc_request("request", 0)]
    first, second = stub.ModelStreamInfer(iter(requests), timeout=30)
    assert_names_the_limit(first.error_message, "request", MAX_PARAMETERS + 1)
    assert second.error_message == ""
    assert second.infer_response.id == "p"


# -- HTTP ----------------------------------------------------------------------------------------


def post(server: RunningServer, whose: str, count: int) -> tuple[int, Any]:
    parameters = {f"p{index}": index for index in range(count)}
    tensor = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 1, 1, 1]}
    doc: dict[str, Any] = {"inputs": [tensor], "outputs": [{"name": "y"}]}
    {"request": doc, "input": tensor, "output": doc["outputs"][0]}[whose]["parameters"] = parameters
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", "/v2/models/scale/infer", json.dumps(doc).encode())
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@pytest.mark.parametrize("whose", list(WHERE))
def test_an_http_request_over_the_limit_is_400(server: RunningServer, whose: str) -> None:
    status, body = post(server, whose, MAX_PARAMETERS + 1)
    assert status == 400
    assert_names_the_limit(body["error"], whose, MAX_PARAMETERS + 1)


@pytest.mark.parametrize("whose", list(WHERE))
def test_an_http_request_at_the_limit_is_answered(server: RunningServer, whose: str) -> None:
    status, body = post(server, whose, MAX_PARAMETERS)
    assert status == 200, body
    assert body["outputs"][0]["data"] == [2.0] * 4
