"""A request's tensors are checked against the model (names, datatypes, shapes, how many) before
their data is decoded, over HTTP and gRPC.

Decoding came first, then validation: 16.7M empty BYTES elements (a 64 MiB body) sent to an FP32
model stalled the event loop 13 s before their datatype was refused; 140k input tensors or 440k
requested outputs in 8 MiB of JSON, 1-2 s. The tests count the decoding calls a refused request
made: none.
"""

from __future__ import annotations

import http.client
import json
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import pytest
from conftest import RunningServer, start_server, stop_server
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc

from duetime.config import ServerSettings
from duetime.frontend import codec
from duetime.validation import MAX_STRING_ELEMENTS

pytestmark = pytest.mark.timeout(60)

ELEMENTS = 100_000
"""BYTES elements of the requests below (each an empty string: 4 bytes of length prefix)."""


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tensors the front ends decode while a test runs (by the server's thread too)."""
    calls: list[str] = []

    def counted(name: str, decode: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return decode(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(codec, "from_raw", counted("raw", codec.from_raw))
    monkeypatch.setattr(codec, "from_json", counted("json", codec.from_json))
    return calls


def post(address: str, path: str, head: dict[str, Any], binary: bytes = b"") -> tuple[int, str]:
    """POST a v2 request (its JSON `head`, then `binary`); the status and the error, if any."""
    text = json.dumps(head).encode()
    headers = {"Content-Type": "application/json"}
    if binary:
        headers["Inference-Header-Content-Length"] = str(len(text))
    connection = http.client.HTTPConnection(address, timeout=30)
    try:
        connection.request("POST", path, text + binary, headers)
        response = connection.getresponse()
        answer = json.loads(response.read())
    finally:
        connection.close()
    return response.status, answer.get("error", "")


def empty_strings(count: int) -> bytes:
    return struct.pack("<I", 0) * count


def bytes_input(name: str, count: int) -> dict[str, Any]:
    parameters = {"binary_data_size": count * 4}
    return {"name": name, "datatype": "BYTES", "shape": [count], "parameters": parameters}


def mlp_x() -> dict[str, Any]:
    return {"name": "x", "datatype": "FP32", "shape": [1, 40], "data": [0.5] * 40}


# -- HTTP ----------------------------------------------------------------------------------------


def test_http_binary_bytes_for_an_fp32_input_are_refused_undecoded(
    server: RunningServer, decoded: list[str]
) -> None:
    invalid = server.server.engine.router.invalid
    before = invalid.get(("mlp", "1"), 0)
    head = {"inputs": [bytes_input("x", ELEMENTS)]}
    status, error = post(server.http, "/v2/models/mlp/infer", head, empty_strings(ELEMENTS))
    assert status == 400
    assert "input 'x': datatype BYTES does not match the model's FP32" in error
    assert decoded == []
    assert invalid[("mlp", "1")] == before + 1  # counted as the validator's refusals are


def test_http_json_tensors_past_the_models_inputs_are_refused_undecoded(
    server: RunningServer, decoded: list[str]
) -> None:
    tensors = [
        {"name": f"t{i}", "datatype": "FP32", "shape": [1], "data": [1]} for i in range(1000)
    ]
    status, error = post(server.http, "/v2/models/mlp/infer", {"inputs": [mlp_x(), *tensors]})
    assert status == 400
    assert "input 't0' is not an input of model 'mlp'" in error
    assert decoded == ["json"]  # x, which the model takes: nothing past it


def test_http_json_bytes_values_for_an_fp32_input_are_refused_undecoded(
    server: RunningServer, decoded: list[str]
) -> None:
    strings = {"name": "x", "datatype": "BYTES", "shape": [ELEMENTS], "data": [""] * ELEMENTS}
    head = {"inputs": [strings]}
    status, error = post(server.http, "/v2/models/mlp/infer", head)
    assert status == 400
    assert "datatype BYTES does not match the model's FP32" in error
    assert decoded == []


@pytest.mark.parametrize(
    ("shape", "needle"),
    [
        pytest.param([1000, 40], "batch-size must be <= 64 for 'mlp'", id="batch"),
        pytest.param(
            [1, 40, 1],
            "unexpected shape for input 'x' for model 'mlp'. Expected [-1,40], got [1,40,1]",
            id="rank",
        ),
    ],
)
def test_http_a_shape_the_model_refuses_is_refused_undecoded(
    server: RunningServer, decoded: list[str], shape: list[int], needle: str
) -> None:
    count = int(np.prod(shape))
    head = {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": [0.0] * count}]}
    status, error = post(server.http, "/v2/models/mlp/infer", head)
    assert status == 400
    assert needle in error
    assert decoded == []


def test_http_thousands_of_outputs_are_refused_before_the_inputs_are_decoded(
    server: RunningServer, decoded: list[str]
) -> None:
    head = {"inputs": [mlp_x()], "outputs": [{"name": "y"} for _ in range(1000)]}
    status, error = post(server.http, "/v2/models/mlp/infer", head)
    assert status == 400
    assert "the request asks for 1000 outputs but model 'mlp' has 1: 'y'" in error
    assert decoded == []


def test_http_an_unknown_output_is_refused_before_the_inputs_are_decoded(
    server: RunningServer, decoded: list[str]
) -> None:
    head = {"inputs": [mlp_x()], "outputs": [{"name": "y"}, {"name": "z"}]}
    status, error = post(server.http, "/v2/models/mlp/infer", head)
    assert status == 400
    assert "requested output 'z' is not an output of model 'mlp'" in error
    assert decoded == []


def test_http_an_output_asked_for_twice_is_still_answered(server: RunningServer) -> None:
    head = {"inputs": [mlp_x()], "outputs": [{"name": "y"}, {"name": "y"}]}
    assert post(server.http, "/v2/models/mlp/infer", head)[0] == 200


def test_http_unknown_model_or_version_is_refused_undecoded(
    server: RunningServer, decoded: list[str]
) -> None:
    head = {"inputs": [bytes_input("x", ELEMENTS)]}
    for path, needle in [
        ("/v2/models/nope/infer", "Request for unknown model: 'nope' is not found"),
        ("/v2/models/mlp/versions/7/infer", "unknown model: 'mlp' version 7 is not found"),
    ]:
        status, error = post(server.http, path, head, empty_strings(ELEMENTS))
        assert (status, needle in error) == (404, True), error
    assert decoded == []


# -- gRPC ----------------------------------------------------------------------------------------


@pytest.fixture
def stub(server: RunningServer) -> Iterator[Any]:
    options = [("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(server.grpc, options=options) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def refusal(stub: Any, request: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=30)
    return caught.value.code(), caught.value.details() or ""


def test_grpc_raw_bytes_for_an_fp32_input_are_refused_undecoded(
    stub: Any, decoded: list[str]
) -> None:
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="BYTES", shape=[ELEMENTS])
    request.raw_input_contents.append(empty_strings(ELEMENTS))
    code, details = refusal(stub, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'x': datatype BYTES does not match the model's FP32" in details
    assert decoded == []


def test_grpc_inputs_past_the_models_are_refused_undecoded(stub: Any, decoded: list[str]) -> None:
    request = service_pb2.ModelInferRequest(model_name="mlp")
    for i in range(1000):
        request.inputs.add(name=f"t{i}", datatype="FP32", shape=[1])
        request.raw_input_contents.append(b"\0\0\0\0")
    code, details = refusal(stub, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 't0' is not an input of model 'mlp'" in details
    assert decoded == []


def test_grpc_thousands_of_outputs_are_refused_undecoded(stub: Any, decoded: list[str]) -> None:
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 40])
    request.raw_input_contents.append(bytes(160))
    for _ in range(1000):
        request.outputs.add(name="y").parameters["classification"].int64_param = 1
    code, details = refusal(stub, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "the request asks for 1000 outputs but model 'mlp' has 1" in details
    assert decoded == []


def test_grpc_raw_entries_that_do_not_add_up_are_still_refused(stub: Any) -> None:
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 40])
    request.raw_input_contents.extend([bytes(160), bytes(160)])
    code, details = refusal(stub, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "raw_input_contents has 2 entries but 1 inputs carry their data" in details


# -- a model that takes BYTES ----------------------------------------------------------------------


def build_strings_model() -> onnx.ModelProto:
    """y = Identity(text), STRING [n]."""
    text = helper.make_tensor_value_info("text", TensorProto.STRING, ["n"])
    out = helper.make_tensor_value_info("y", TensorProto.STRING, ["n"])
    node = helper.make_node("Identity", ["text"], ["y"])
    graph = helper.make_graph([node], "strings", [text], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def with_strings(
    demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("strings")
    shutil.copytree(demo_repo / "mlp", root / "mlp")
    (root / "strings" / "1").mkdir(parents=True)
    (root / "strings" / "config.toml").write_text("max_batch_size = 0\n")
    (root / "strings" / "1" / "model.onnx").write_bytes(build_strings_model().SerializeToString())
    settings = ServerSettings(model_repository=root, http_port=0, grpc_port=0)
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


def test_a_binary_header_kept_for_one_model_is_checked_for_another(
    with_strings: RunningServer, decoded: list[str]
) -> None:
    """The header of a binary request is kept decoded by its bytes, whatever the model: sent
    to a model that takes no BYTES, its BYTES input is refused before it is decoded."""
    head = {"inputs": [bytes_input("text", ELEMENTS)]}
    binary = empty_strings(ELEMENTS)
    assert post(with_strings.http, "/v2/models/strings/infer", head, binary)[0] == 200
    decoded.clear()
    status, error = post(with_strings.http, "/v2/models/mlp/infer", head, binary)
    assert status == 400
    assert "input 'text' is not an input of model 'mlp'" in error
    assert decoded == []


def test_more_bytes_elements_than_an_input_may_hold_are_refused_undecoded(
    with_strings: RunningServer, decoded: list[str]
) -> None:
    """16.7M empty strings in one 64 MiB request took 4.6 GB and held the server 13 s (each
    element costs a few hundred bytes, however short; found by a tester)."""
    count = MAX_STRING_ELEMENTS + 1
    head = {"inputs": [bytes_input("text", count)]}
    status, error = post(with_strings.http, "/v2/models/strings/infer", head, empty_strings(count))
    assert status == 400
    assert f"input 'text': {count} BYTES elements, over the {MAX_STRING_ELEMENTS}" in error
    assert decoded == []
    request = service_pb2.ModelInferRequest(model_name="strings")
    request.inputs.add(name="text", datatype="BYTES", shape=[count])
    request.raw_input_contents.append(empty_strings(count))
    with grpc.insecure_channel(with_strings.grpc) as channel:
        code, details = refusal(service_pb2_grpc.GRPCInferenceServiceStub(channel), request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{count} BYTES elements" in details
    assert decoded == []


def test_bytes_a_model_takes_are_decoded_as_sent(with_strings: RunningServer) -> None:
    values = [b"", b"a\0", b"bc", b"", b"\0\0d"] * 8
    binary = b"".join(struct.pack("<I", len(v)) + v for v in values)
    head = {
        "inputs": [
            {
                "name": "text",
                "datatype": "BYTES",
                "shape": [len(values)],
                "parameters": {"binary_data_size": len(binary)},
            }
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": False}}],
    }
    connection = http.client.HTTPConnection(with_strings.http, timeout=30)
    text = json.dumps(head).encode()
    connection.request(
        "POST",
        "/v2/models/strings/infer",
        text + binary,
        {"Inference-Header-Content-Length": str(len(text))},
    )
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    assert response.status == 200, answer
    assert answer["outputs"][0]["data"] == [v.decode() for v in values]
