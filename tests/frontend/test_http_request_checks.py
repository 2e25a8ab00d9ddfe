"""What a v2 inference request may hold over HTTP: outputs requested twice, parameter types, and
numbers out of range, with gRPC's answer beside it where gRPC can say the same."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, start_server, stop_server
from onnx import TensorProto, helper
from repo_models import write_version

from duetime.config import ServerSettings
from duetime.errors import InvalidInput
from duetime.frontend.rest import parse_infer_request
from duetime.frontend.sharedmemory import SharedMemoryRegions

pytestmark = pytest.mark.timeout(60)

X = np.linspace(-1, 1, 2 * 40, dtype=np.float32).reshape(2, 40)
X_JSON = {"name": "x", "datatype": "FP32", "shape": [2, 40], "data": X.ravel().tolist()}


def post(server: RunningServer, path: str, doc: Any) -> tuple[int, Any]:
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", path, json.dumps(doc).encode())
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


# -- an output requested twice -------------------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_an_output_requested_twice_is_answered_once_as_over_grpc(
    server: RunningServer, binary: bool
) -> None:
    client = httpclient.InferenceServerClient(server.http)
    try:
        x = httpclient.InferInput("x", [2, 40], "FP32")
        x.set_data_from_numpy(X, binary_data=binary)
        twice = [httpclient.InferRequestedOutput("y", binary_data=binary) for _ in range(2)]
        over_http = client.infer("mlp", [x], outputs=twice)
    finally:
        client.close()
    assert [output["name"] for output in over_http.get_response()["outputs"]] == ["y"]
    grpc = grpcclient.InferenceServerClient(server.grpc)
    try:
        x = grpcclient.InferInput("x", [2, 40], "FP32")
        x.set_data_from_numpy(X)
        twice = [grpcclient.InferRequestedOutput("y") for _ in range(2)]
        over_grpc = grpc.infer("mlp", [x], outputs=twice)
    finally:
        grpc.close()
    assert [output.name for output in over_grpc.get_response().outputs] == ["y"]
    np.testing.assert_array_equal(over_http.as_numpy("y"), over_grpc.as_numpy("y"))


def test_the_same_output_twice_the_same_way_in_other_words(server: RunningServer) -> None:
    # binary_data given on one and left to the request's default on the other: the same
    doc = {
        "inputs": [X_JSON],
        "parameters": {"binary_data_output": False},
        "outputs": [
            {"name": "y", "parameters": {"classification": 2}},
            {"name": "y", "parameters": {"classification": 2, "binary_data": False}},
        ],
    }
    status, answer = post(server, "/v2/models/mlp/infer", doc)
    assert status == 200, answer
    (output,) = answer["outputs"]
    assert output["datatype"] == "BYTES"  # the top classes
    assert output["shape"] == [2, 2]


@pytest.mark.parametrize(
    ("first", "again", "needle"),
    [
        ({"binary_data": True}, {"binary_data": False}, "binary_data false (first true)"),
        ({}, {"classification": 2}, "classification 2 (first none)"),
        ({"classification": 3}, {"classification": 2}, "classification 2 (first 3)"),
    ],
    ids=["binary_data", "classification", "class-count"],
)
def test_an_output_requested_twice_in_two_ways_is_refused(
    server: RunningServer, first: dict[str, Any], again: dict[str, Any], needle: str
) -> None:
    doc = {
        "inputs": [X_JSON],
        "outputs": [{"name": "y", "parameters": first}, {"name": "y", "parameters": again}],
    }
    status, answer = post(server, "/v2/models/mlp/infer", doc)
    assert status == 400, answer
    assert "output 'y' is requested more than once with different parameters" in answer["error"]
    assert needle in answer["error"]


def test_an_output_written_twice_to_two_places_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").write_bytes(bytes(256))
    regions = SharedMemoryRegions(root=tmp_path)
    regions.register("out", "/out", 0, 256)
    try:

        def output(offset: int) -> dict[str, Any]:
            where = {"shared_memory_region": "out", "shared_memory_byte_size": 24}
            return {"name": "y", "parameters": {**where, "shared_memory_offset": offset}}

        def parse(outputs: list[dict[str, Any]]) -> Any:
            body = json.dumps({"inputs": [X_JSON], "outputs": outputs}).encode()
            return parse_infer_request(body, None, "mlp", None, regions)

        request, plan = parse([output(0), output(0)])
        assert request.outputs == ("y",)
        assert plan.shared is not None
        assert plan.shared["y"].offset == 0
        with pytest.raises(InvalidInput, match="shared memory region 'out' at 24") as caught:
            parse([output(0), output(24)])
        assert "output 'y'" in caught.value.message
    finally:
        regions.unregister()


# -- parameter types -----------------------------------------------------------------------------


def _with_parameter(where: str, value: Any) -> dict[str, Any]:
    """A request for mlp with parameter 'p' = `value` on the request, its input or its output."""
    doc: dict[str, Any] = {"inputs": [dict(X_JSON)], "outputs": [{"name": "y"}]}
    holder = {"request": doc, "input": doc["inputs"][0], "output": doc["outputs"][0]}[where]
    holder["parameters"] = {"p": value}
    return doc


@pytest.mark.parametrize(
    ("value", "kind"), [(None, "null"), ({"k": 1}, "an object"), ([1], "a list")]
)
@pytest.mark.parametrize(
    ("where", "named"),
    [("request", "request"), ("input", "input 'x'"), ("output", "output 'y'")],
)
def test_a_parameter_that_is_no_string_number_or_boolean_is_refused(
    server: RunningServer, where: str, named: str, value: Any, kind: str
) -> None:
    status, answer = post(server, "/v2/models/mlp/infer", _with_parameter(where, value))
    assert status == 400, answer
    assert f"{named} parameter 'p' has invalid type: it is {kind}" in answer["error"]


@pytest.mark.parametrize("value", ["text", 7, 2.5, True])
@pytest.mark.parametrize("where", ["request", "input", "output"])
def test_a_string_number_or_boolean_parameter_is_taken(
    server: RunningServer, where: str, value: Any
) -> None:
    status, answer = post(server, "/v2/models/mlp/infer", _with_parameter(where, value))
    assert status == 200, answer


def test_only_the_server_s_decoding_refuses_them() -> None:
    # a capture reader decodes what was sent, as it was sent
    doc = _with_parameter("request", {"k": [1]})
    request, _ = parse_infer_request(json.dumps(doc).encode(), None, "mlp", None)
    assert request.parameters == {"p": {"k": [1]}}
    with pytest.raises(InvalidInput, match="request parameter 'p' has invalid type"):
        parse_infer_request(json.dumps(doc).encode(), None, "mlp", None, strict=True)


# -- numbers out of range ------------------------------------------------------------------------

ONNX_TYPES = {
    "INT64": TensorProto.INT64, "UINT64": TensorProto.UINT64, "INT8": TensorProto.INT8,
    "FP32": TensorProto.FLOAT,
}  # fmt: skip


@pytest.fixture(scope="module")
def dtypes_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """`id_<datatype>`: y = x, both [batch, 3], for each of `ONNX_TYPES`."""
    repo = tmp_path_factory.mktemp("identities")
    for datatype, kind in ONNX_TYPES.items():
        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])], "identity",
            [helper.make_tensor_value_info("x", kind, ["batch", 3])],
            [helper.make_tensor_value_info("y", kind, ["batch", 3])],
        )  # fmt: skip
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        write_version(repo, f"id_{datatype.lower()}", 1, model.SerializeToString())
    running, thread = start_server(ServerSettings(model_repository=repo, http_port=0, grpc_port=0))
    try:
        yield running
    finally:
        stop_server(running, thread)


OUTSIDE = "has values outside the range of"
INT64 = f"{OUTSIDE} INT64 (-9223372036854775808 to 9223372036854775807)"
UINT64 = f"{OUTSIDE} UINT64 (0 to 18446744073709551615)"


@pytest.mark.parametrize(
    ("datatype", "values", "needle"),
    [
        pytest.param("INT64", [2**63, 0, 0], INT64, id="int64-2**63"),
        pytest.param("INT64", [-(2**63) - 1, 0, 0], INT64, id="int64-low"),
        pytest.param("INT64", [2**70, 0, 0], INT64, id="int64-2**70"),
        pytest.param("UINT64", [2**64, 0, 0], UINT64, id="uint64-2**64"),
        pytest.param("UINT64", [-1, 2**63, 0], UINT64, id="uint64-negative"),
        pytest.param("INT8", [128, 0, 0], f"{OUTSIDE} INT8 (-128 to 127)", id="int8"),
        pytest.param(
            "FP32", [1e39, 0, 0], f"{OUTSIDE} FP32 (-3.4028235e+38 to 3.4028235e+38)", id="fp32"
        ),
        pytest.param(  # (a fraction is no range problem)
            "INT64", [1.5, 0, 0], "holds values that are not INT64 (float64)", id="fraction"
        ),
    ],
)
def test_a_value_out_of_range_says_so_naming_the_input_and_the_range(
    dtypes_server: RunningServer, datatype: str, values: list[Any], needle: str
) -> None:
    doc = {"inputs": [{"name": "x", "datatype": datatype, "shape": [1, 3], "data": values}]}
    status, answer = post(dtypes_server, f"/v2/models/id_{datatype.lower()}/infer", doc)
    assert status == 400, answer
    assert f"input 'x': 'data' {needle}" in answer["error"]


def test_the_edges_of_the_64_bit_ranges_are_taken(dtypes_server: RunningServer) -> None:
    for datatype, values in [("INT64", [2**63 - 1, -(2**63), 0]), ("UINT64", [2**64 - 1, 0, 1])]:
        doc = {"inputs": [{"name": "x", "datatype": datatype, "shape": [1, 3], "data": values}]}
        status, answer = post(dtypes_server, f"/v2/models/id_{datatype.lower()}/infer", doc)
        assert status == 200, answer
        assert answer["outputs"][0]["data"] == values


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("priority", 2**64, "0 and 18446744073709551615 (a uint64), got 18446744073709551616"),
        ("priority", 2**64 + 1, "got 18446744073709551617"),
        ("priority", -(2**63) - 1, "got -9223372036854775809"),
        ("timeout", 2**64, "got 18446744073709551616"),
    ],
    ids=["priority-2**64", "priority-2**64+1", "priority-low", "timeout"],
)
def test_a_big_integer_parameter_is_echoed_as_sent(
    server: RunningServer, name: str, value: int, needle: str
) -> None:
    doc = {"inputs": [X_JSON], "parameters": {name: value}}
    status, answer = post(server, "/v2/models/mlp/infer", doc)
    assert status == 400, answer
    assert f"request parameter '{name}' must be" in answer["error"]
    assert needle in answer["error"]
