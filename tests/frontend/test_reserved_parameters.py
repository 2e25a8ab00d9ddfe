"""The request parameters Triton reserves (`sequence_id`, `sequence_start`, `sequence_end`, keys
starting with `triton_`): refused where Triton refuses them, in its words, over gRPC and HTTP;
what tritonclient sends still works."""

from __future__ import annotations

import http.client
import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import RunningServer, start_server, stop_server
from repo_models import scale_model, write_version
from tritonclient.grpc import service_pb2, service_pb2_grpc

from duetime.config import ServerSettings
from duetime.errors import InvalidInput
from duetime.frontend.parameters import check_grpc_parameters, check_http_parameters

pytestmark = pytest.mark.timeout(60)

RESERVED = "parameter keys starting with 'triton_' are reserved for Triton usage"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root: Path = tmp_path_factory.mktemp("reserved-parameters")
    write_version(root, "scale", 1, scale_model(2.0))
    running, thread = start_server(ServerSettings(model_repository=root, http_port=0, grpc_port=0))
    yield running
    stop_server(running, thread)


# -- the checks alone ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "kind", "message"),
    [
        ("sequence_id", "bool_param", "for 'sequence_id' parameter, expected int64_param or"),
        ("sequence_id", "double_param", "expected int64_param or string_param."),
        ("sequence_id", "uint64_param", "expected int64_param or string_param."),
        ("sequence_start", "int64_param", "'sequence_start' parameter, expected bool_param."),
        ("sequence_end", "string_param", "'sequence_end' parameter, expected bool_param."),
        ("triton_enable_empty_final_response", "int64_param", "expected bool_param."),
        ("triton_foo", "bool_param", "triton_enable_empty_final_response (got 'triton_foo')"),
    ],
)  # fmt: skip
def test_grpc_refuses_what_triton_refuses_in_its_words(key: str, kind: str, message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        check_grpc_parameters({key: kind})
    assert message in raised.value.message


def test_grpc_takes_the_reserved_parameters_in_the_types_triton_takes() -> None:
    check_grpc_parameters(
        {"sequence_id": "int64_param", "sequence_start": "bool_param", "sequence_end": "bool_param",
         "triton_enable_empty_final_response": "bool_param", "mine": "double_param"}
    )  # fmt: skip
    check_grpc_parameters({"sequence_id": "string_param"})


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"sequence_id": -1}, "Unable to parse 'sequence_id': request parameter 'sequence_id'"),
        ({"sequence_id": True}, "must be an unsigned integer or a string, got true"),
        ({"sequence_id": 1.5}, "got 1.5"),
        ({"sequence_start": 1}, "Unable to parse 'sequence_start': request parameter"),
        ({"sequence_end": "yes"}, "'sequence_end' must be true or false, got \"yes\""),
        ({"triton_enable_empty_final_response": True}, f"{RESERVED} and should not be specified"),
        ({"triton_foo": 1}, "(got 'triton_foo')"),
    ],
)  # fmt: skip
def test_http_refuses_what_triton_refuses_in_its_words(
    parameters: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput) as raised:
        check_http_parameters(parameters)
    assert message in raised.value.message


def test_http_takes_the_sequence_parameters_in_the_types_triton_takes() -> None:
    check_http_parameters({"sequence_id": 2**64 - 1, "sequence_start": True, "sequence_end": False})
    check_http_parameters({"sequence_id": "session-7", "mine": 1.5})


# -- over the wire -------------------------------------------------------------------------------


def grpc_request(key: str, field: str, value: object) -> Any:
    request = service_pb2.ModelInferRequest(model_name="scale", id="p")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    setattr(request.parameters[key], field, value)
    return request


@pytest.mark.parametrize(
    ("key", "field", "value"),
    [("sequence_id", "bool_param", True), ("sequence_id", "double_param", 1.5),
     ("sequence_start", "int64_param", 1), ("sequence_end", "string_param", "yes"),
     ("triton_foo", "bool_param", True), ("triton_enable_empty_final_response", "int64_param", 1)],
)  # fmt: skip
def test_a_grpc_request_with_a_parameter_triton_refuses_is_invalid_argument(
    server: RunningServer, key: str, field: str, value: object
) -> None:
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(grpc_request(key, field, value), timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"'{key}'" in raised.value.details()


@pytest.mark.parametrize("level", ["request", "input", "output"])
def test_a_grpc_parameter_with_no_value_is_invalid_argument(
    server: RunningServer, level: str
) -> None:
    """An `InferParameter` with none of its values set is HTTP's null, which HTTP and the Engine
    refuse: it was taken at every level (found by a tester)."""
    request = service_pb2.ModelInferRequest(model_name="scale", id="p")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    output = request.outputs.add(name="y")
    holder = {"request": request, "input": tensor, "output": output}[level]
    holder.parameters["empty"].SetInParent()
    where = {"request": "request", "input": "input 'x'", "output": "output 'y'"}[level]
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{where} parameter 'empty' has no value: set one of bool_param" in (
        raised.value.details()
    )


@pytest.mark.parametrize(
    ("key", "field", "value"),
    [("sequence_id", "int64_param", 7), ("sequence_id", "string_param", "session-7"),
     ("sequence_start", "bool_param", True),
     ("triton_enable_empty_final_response", "bool_param", True)],
)  # fmt: skip
def test_a_grpc_request_with_a_reserved_parameter_of_the_right_type_is_answered(
    server: RunningServer, key: str, field: str, value: object
) -> None:
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(grpc_request(key, field, value), timeout=30)
    assert response.id == "p"


def test_a_tritonclient_stream_asking_for_an_empty_final_response_is_answered(
    server: RunningServer,
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc)
    answers: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
    x = grpcclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer(
            "scale", [x], request_id="s", sequence_id=7, sequence_start=True, sequence_end=True,
            enable_empty_final_response=True,
        )  # fmt: skip
        result, error = answers.get(timeout=30)
        client.stop_stream()
    finally:
        client.close()
    assert error is None, error
    assert result.get_response().id == "s"
    assert result.get_response().parameters["triton_final_response"].bool_param
    assert result.as_numpy("y").tolist() == [[2.0] * 4]


def post(server: RunningServer, parameters: dict[str, Any]) -> tuple[int, Any]:
    doc = {
        "parameters": parameters,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 1, 1, 1]}],
    }
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", "/v2/models/scale/infer", json.dumps(doc).encode())
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@pytest.mark.parametrize(
    "parameters",
    [{"triton_foo": True}, {"triton_enable_empty_final_response": True}, {"sequence_start": 1},
     {"sequence_id": -1}],
)  # fmt: skip
def test_an_http_request_with_a_parameter_triton_refuses_is_400(
    server: RunningServer, parameters: dict[str, Any]
) -> None:
    status, body = post(server, parameters)
    assert status == 400
    assert f"'{next(iter(parameters))}'" in body["error"]


def test_an_http_request_with_the_sequence_parameters_triton_takes_is_answered(
    server: RunningServer,
) -> None:
    status, body = post(
        server, {"sequence_id": "s-1", "sequence_start": True, "sequence_end": True}
    )
    assert status == 200, body
    assert body["outputs"][0]["data"] == [2.0] * 4
