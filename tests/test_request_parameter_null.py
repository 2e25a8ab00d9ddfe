"""The request parameters `timeout` and `priority` given no value: in process, None is "not
given" for both; over the wire, a JSON null (HTTP) or a parameter with no value set (gRPC) is
refused for both, naming the parameter, as for every other parameter (a v2 parameter's value
is a string, a number or a boolean).

NOTE: in process and over gRPC, no `timeout` value was taken as no timeout while no `priority`
value was refused "got null". (HTTP refused a null for both already: that test guards it.)"""

from __future__ import annotations

import http.client
from pathlib import Path

import grpc
import numpy as np
import orjson
import pytest
from conftest import serving
from repo_models import inputs, scale_model, write_version

from duetime import Engine
from duetime.config import ServerSettings
from duetime.errors import InvalidInput
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.frontend.proto import grpc_service_pb2_grpc as pb_grpc
from duetime.requestparams import due_from_timeout_us, priority_of

pytestmark = pytest.mark.timeout(120)

PARAMETERS = ("timeout", "priority")


@pytest.mark.parametrize("name", PARAMETERS)
def test_none_is_not_given_in_process(tmp_path: Path, name: str) -> None:
    write_version(tmp_path, "m", 1, scale_model(2.0))
    with Engine.open(tmp_path) as engine:
        answer = engine.infer("m", inputs(), parameters={name: None})
        np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])


def test_null_is_refused_on_the_wire_naming_the_parameter() -> None:
    with pytest.raises(InvalidInput, match=r"request parameter 'timeout' .*got null$"):
        due_from_timeout_us({"timeout": None}, 0)
    with pytest.raises(InvalidInput, match=r"request parameter 'priority' .*got null$"):
        priority_of({"priority": None})
    assert due_from_timeout_us({}, 0) is None  # (absent: no due time)
    assert priority_of({}) == 0


def test_null_is_refused_over_http_for_both(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(2.0))
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0)
    x = inputs()["x"]
    tensor = {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    answers = {}
    with serving(settings) as running:
        host, port = running.http.split(":")
        for name in PARAMETERS:
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
            try:
                body = orjson.dumps({"inputs": [tensor], "parameters": {name: None}})
                connection.request("POST", "/v2/models/m/infer", body)
                response = connection.getresponse()
                answers[name] = response.status, orjson.loads(response.read())["error"]
            finally:
                connection.close()
    for name in PARAMETERS:
        status, error = answers[name]
        assert status == 400, error
        assert f"request parameter '{name}' has invalid type: it is null" in error


def test_no_value_is_refused_over_grpc_for_both(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(2.0))
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0)
    x = inputs()["x"]
    refusals = {}
    with serving(settings) as running, grpc.insecure_channel(running.grpc) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for name in PARAMETERS:
            request = pb.ModelInferRequest(model_name="m")
            request.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
            request.raw_input_contents.append(x.tobytes())
            request.parameters[name].SetInParent()  # (the parameter, with no value set)
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(request, timeout=30)
            refusals[name] = refused.value.code(), refused.value.details()
    for name in PARAMETERS:
        code, details = refusals[name]
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert f"request parameter '{name}'" in details
