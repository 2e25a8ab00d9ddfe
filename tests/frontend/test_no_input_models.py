"""A model with no inputs (a Constant, a generator) is answered over HTTP as over gRPC and in
process: a v2 request with `"inputs": []` or no `inputs` at all, JSON or with the binary
extension's header; to a model that has inputs, such a request is refused naming the missing one.

HTTP refused every request to such a model ("request 'inputs' must be a non-empty list of
tensors") while its metadata listed `inputs: []` and gRPC served it.
"""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Iterator, Mapping
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from conftest import RunningServer, start_server, stop_server
from onnx import TensorProto, helper, numpy_helper

from duetime.config import ServerSettings
from duetime.errors import InvalidInput

pytestmark = pytest.mark.timeout(120)

CONSTANT = np.arange(6, dtype=np.float32).reshape(2, 3)


def constant_model() -> bytes:
    """y = CONSTANT, from no input at all."""
    node = helper.make_node("Constant", [], ["y"], value=numpy_helper.from_array(CONSTANT))
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([node], "constant", [], [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def pair_model() -> bytes:
    """sum = a + b: a model with inputs."""
    spec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4]) for n in "ab"]
    out = helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["sum"])], "pair", spec, [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("no-inputs")
    for name, model in (("constant", constant_model()), ("pair", pair_model())):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.onnx").write_bytes(model)
    running, thread = start_server(ServerSettings(model_repository=root, http_port=0, grpc_port=0))
    yield running
    stop_server(running, thread)


def post(
    server: RunningServer, model: str, body: bytes, headers: Mapping[str, str] | None = None
) -> tuple[int, Any]:
    connection = http.client.HTTPConnection(server.http, timeout=30)
    try:
        connection.request("POST", f"/v2/models/{model}/infer", body, dict(headers or {}))
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def with_header(body: bytes, extra: bytes = b"") -> tuple[bytes, dict[str, str]]:
    """`body` as a binary-extension request: its JSON, then `extra` bytes."""
    return body + extra, {"Inference-Header-Content-Length": str(len(body))}


BODIES = {
    "empty-list": b'{"inputs": []}',
    "no-inputs-key": b"{}",
    "null": b'{"inputs": null}',
    "no-inputs-key-with-outputs": b'{"outputs": [{"name": "y"}]}',
}


@pytest.mark.parametrize("binary_header", [False, True], ids=["json", "binary-header"])
@pytest.mark.parametrize("body", list(BODIES.values()), ids=list(BODIES))
def test_http_answers_a_model_with_no_inputs(
    served: RunningServer, body: bytes, binary_header: bool
) -> None:
    sent, headers = with_header(body) if binary_header else (body, {})
    for _ in range(2):  # (the second from the binary header's parsed recipe, where kept)
        status, answer = post(served, "constant", sent, headers)
        assert status == 200, answer
        (output,) = answer["outputs"]
        assert (output["name"], output["shape"]) == ("y", [2, 3])
        assert output["data"] == CONSTANT.ravel().tolist()


@pytest.mark.parametrize("binary_header", [False, True], ids=["json", "binary-header"])
@pytest.mark.parametrize("body", list(BODIES.values()), ids=list(BODIES))
def test_http_names_the_missing_input_of_a_model_that_has_some(
    served: RunningServer, body: bytes, binary_header: bool
) -> None:
    body = body.replace(b'"y"', b'"sum"')
    sent, headers = with_header(body) if binary_header else (body, {})
    status, answer = post(served, "pair", sent, headers)
    assert status == 400
    assert "input 'a' (FP32[-1, 4]) is missing; model 'pair' expects 'a'" in answer["error"]


def test_bytes_after_the_header_of_a_request_with_no_inputs_are_refused(
    served: RunningServer,
) -> None:
    status, answer = post(served, "constant", *with_header(b"{}", b"\0" * 8))
    assert status == 400
    assert "but 8 follow the JSON header" in answer["error"]


def test_inputs_that_are_no_list_are_refused(served: RunningServer) -> None:
    status, answer = post(served, "constant", b'{"inputs": {}}')
    assert status == 400
    assert "request 'inputs' must be a list of tensors" in answer["error"]


def test_every_protocol_answers_a_model_with_no_inputs_alike(served: RunningServer) -> None:
    over_http = triton_http.InferenceServerClient(served.http).infer("constant", [])
    over_grpc = triton_grpc.InferenceServerClient(served.grpc).infer("constant", [])
    call = served.server.engine.infer_async("constant", {})
    in_process = asyncio.run_coroutine_threadsafe(call, served.loop).result(timeout=30)
    for answer in (over_http.as_numpy("y"), over_grpc.as_numpy("y"), in_process["y"]):
        np.testing.assert_array_equal(answer, CONSTANT)


def test_every_protocol_names_the_missing_input_alike(served: RunningServer) -> None:
    with pytest.raises(triton_http.InferenceServerException) as over_http:
        triton_http.InferenceServerClient(served.http).infer("pair", [])
    with pytest.raises(triton_grpc.InferenceServerException) as over_grpc:
        triton_grpc.InferenceServerClient(served.grpc).infer("pair", [])
    call = served.server.engine.infer_async("pair", {})
    with pytest.raises(InvalidInput) as in_process:
        asyncio.run_coroutine_threadsafe(call, served.loop).result(timeout=30)
    assert over_http.value.status() == "400"
    assert over_grpc.value.status() == f"StatusCode.{grpc.StatusCode.INVALID_ARGUMENT.name}"
    for message in (over_http.value.message(), over_grpc.value.message(), in_process.value.message):
        assert "input 'a' (FP32[-1, 4]) is missing" in (message or "")
