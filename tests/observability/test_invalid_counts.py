"""Every inference request refused as invalid counts once among its model's invalid requests
(`duetime_requests_total{outcome="invalid"}`), whichever stage refused it: the front end
reading its body or its tensors' headers, or the validator after routing. A `data` count that
did not match the shape, or a body that was not JSON, was counted in
`duetime_requests_refused_total` but not there (found by a tester)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import RunningServer, serving
from tritonclient.grpc import service_pb2, service_pb2_grpc

from duetime.config import ServerSettings

pytestmark = pytest.mark.timeout(120)

GOOD = [{"name": "x", "datatype": "FP32", "shape": [1, 40], "data": [0.5] * 40}]

HTTP_CASES = {
    "data count": {"inputs": [{**GOOD[0], "data": [0.5] * 10}]},
    "shape": {"inputs": [{**GOOD[0], "shape": [1, 39], "data": [0.5] * 39}]},
    "datatype": {"inputs": [{**GOOD[0], "datatype": "INT8", "data": [0] * 40}]},
    "input name": {"inputs": [{**GOOD[0], "name": "nope"}]},
    "no inputs": {"inputs": []},
    "timeout parameter": {"inputs": GOOD, "parameters": {"timeout": "soon"}},
    "output name": {"inputs": GOOD, "outputs": [{"name": "nope"}]},
}


@pytest.fixture(scope="module")
def running(mlp_repo: Path) -> Iterator[RunningServer]:
    settings = ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0, metrics_port=0)
    with serving(settings) as server:
        yield server


def invalid(running: RunningServer) -> int:
    counts = running.server.engine.router.invalid
    return sum(v for (model, _), v in list(counts.items()) if model == "mlp")


def post(running: RunningServer, path: str, body: bytes) -> int:
    request = urllib.request.Request(f"http://{running.http}{path}", body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.parametrize("case", [*HTTP_CASES, "not JSON", "V1 instances"])
def test_an_invalid_http_request_counts_once(running: RunningServer, case: str) -> None:
    before = invalid(running)
    if case == "not JSON":
        status = post(running, "/v2/models/mlp/infer", b"{not json")
    elif case == "V1 instances":
        body = json.dumps({"instances": [[1, 2]]}).encode()
        status = post(running, "/v1/models/mlp:predict", body)
    else:
        status = post(running, "/v2/models/mlp/infer", json.dumps(HTTP_CASES[case]).encode())
    assert status == 400
    assert invalid(running) == before + 1


def test_an_invalid_request_to_a_model_not_served_counts_nowhere(running: RunningServer) -> None:
    """(Nor under a version string a client made up: one became a label each, found by a
    tester.)"""
    before = dict(running.server.engine.router.invalid)
    assert post(running, "/v2/models/nosuch/infer", b"{not json") in (400, 404)
    assert post(running, "/v2/models/mlp/versions/7/infer", b"{not json") in (400, 404)
    assert post(running, "/v2/models/mlp/versions/junk0/infer", b"{not json") == 400
    request = _grpc_request(short=True)
    request.model_version = "grpcjunk"
    with grpc.insecure_channel(running.grpc) as channel, pytest.raises(grpc.RpcError):
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert running.server.engine.router.invalid == before


def _grpc_request(**changes: object) -> service_pb2.ModelInferRequest:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=[1, 40]
    )
    request = service_pb2.ModelInferRequest(model_name="mlp", inputs=[tensor])
    request.raw_input_contents.append(np.ones(40, np.float32).tobytes())
    if changes.get("short"):
        request.raw_input_contents[0] = b"\0" * 12
    if changes.get("shape"):
        request.inputs[0].shape[:] = [1, 39]
    if changes.get("timeout"):
        request.parameters["timeout"].string_param = "soon"
    return request


@pytest.mark.parametrize("case", ["short", "shape", "timeout"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_invalid_grpc_request_counts_once(
    running: RunningServer, case: str, stream: bool
) -> None:
    before = invalid(running)
    request = _grpc_request(**{case: True})
    with grpc.insecure_channel(running.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        if stream:
            (answer,) = list(stub.ModelStreamInfer(iter([request]), timeout=30))
            assert answer.error_message
        else:
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(request, timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert invalid(running) == before + 1
