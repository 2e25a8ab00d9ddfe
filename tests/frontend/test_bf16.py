"""BF16 tensors (Triton's TYPE_BF16) are served: in and out of a model, over HTTP (binary and
JSON), gRPC and in process, as ml_dtypes' bfloat16 arrays (what tritonclient takes and gives).

They were refused: ONNX Runtime's Python API takes and gives no bfloat16 numpy array, so a model
with a bfloat16 input did not load and a bfloat16 output was left out (found by a tester, who
ran one through OrtValues). ONNX Runtime's Cast is the oracle's: both round to nearest even.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import ml_dtypes
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, serving
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc

from duetime.config import ServerSettings
from duetime.repository.layout import MODEL_FILENAME

pytestmark = pytest.mark.timeout(120)

BF16 = ml_dtypes.bfloat16


def serialized(graph: onnx.GraphProto) -> bytes:
    """`graph` as a model file (opset 18, whose Cast and Identity take bfloat16)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def casts_model() -> bytes:
    """widened = x (BF16) cast to FP32; narrowed = f (FP32) cast to BF16; kept = x as it is."""
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["widened"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["f"], ["narrowed"], to=TensorProto.BFLOAT16),
         helper.make_node("Identity", ["x"], ["kept"])], "casts",
        [info("x", TensorProto.BFLOAT16, ["N", 4]), info("f", TensorProto.FLOAT, ["N", 4])],
        [info("widened", TensorProto.FLOAT, ["N", 4]),
         info("narrowed", TensorProto.BFLOAT16, ["N", 4]),
         info("kept", TensorProto.BFLOAT16, ["N", 4])],
    )  # fmt: skip
    return serialized(graph)


def scalars_model() -> bytes:
    """Scalars: widened = s (BF16) cast to FP32; narrowed = f (FP32) cast to BF16."""
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Cast", ["s"], ["widened"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["f"], ["narrowed"], to=TensorProto.BFLOAT16)], "scalars",
        [info("s", TensorProto.BFLOAT16, []), info("f", TensorProto.FLOAT, [])],
        [info("widened", TensorProto.FLOAT, []), info("narrowed", TensorProto.BFLOAT16, [])],
    )  # fmt: skip
    return serialized(graph)


def widens_model() -> bytes:
    """Only its input is BF16 (the OrtValue feeds beside `run`'s numpy ones, no OrtValue out):
    widened = x cast to FP32, beside a BYTES input passed through (no OrtValue of strings)."""
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["widened"], to=TensorProto.FLOAT),
         helper.make_node("Identity", ["label"], ["same"])], "widens",
        [info("x", TensorProto.BFLOAT16, ["N", 4]), info("label", TensorProto.STRING, ["N"])],
        [info("widened", TensorProto.FLOAT, ["N", 4]), info("same", TensorProto.STRING, ["N"])],
    )  # fmt: skip
    return serialized(graph)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("bf16")
    (root / "casts" / "1").mkdir(parents=True)
    (root / "casts" / "1" / MODEL_FILENAME).write_bytes(casts_model())
    (root / "casts" / "config.toml").write_text("max_batch_size = 8\n")
    (root / "widens" / "1").mkdir(parents=True)
    (root / "widens" / "1" / MODEL_FILENAME).write_bytes(widens_model())
    (root / "widens" / "config.toml").write_text("max_batch_size = 8\n")
    (root / "scalars" / "1").mkdir(parents=True)
    (root / "scalars" / "1" / MODEL_FILENAME).write_bytes(scalars_model())
    with serving(ServerSettings(model_repository=root, http_port=0, grpc_port=0)) as running:
        yield running


X = np.array([[1.5, 0.1, -3.0, 1e38], [2.0, -0.0, 7.25, -1e-3]], np.float32).astype(BF16)
F = np.array([[0.1, 2.5, 3.3e38, -0.0], [7.0, 1.0 / 3.0, -9.5, 1e-20]], np.float32)


def check(outputs: dict[str, np.ndarray], x: np.ndarray = X, f: np.ndarray = F) -> None:
    assert outputs["widened"].dtype == np.float32
    assert np.array_equal(outputs["widened"], x.astype(np.float32))
    for name, want in (("narrowed", f.astype(BF16)), ("kept", x)):
        got = outputs[name]
        assert got.dtype == BF16, (name, got.dtype)
        assert got.view(np.uint16).tolist() == want.view(np.uint16).tolist(), name


@pytest.mark.parametrize("binary_outputs", [True, False])
def test_tritonclient_http(server: RunningServer, binary_outputs: bool) -> None:
    client = httpclient.InferenceServerClient(server.http)
    try:
        x = httpclient.InferInput("x", list(X.shape), "BF16")
        x.set_data_from_numpy(X, binary_data=True)  # (tritonclient sends BF16 binary only)
        f = httpclient.InferInput("f", list(F.shape), "FP32")
        f.set_data_from_numpy(F, binary_data=binary_outputs)
        names = ("widened", "narrowed", "kept")
        asked = [httpclient.InferRequestedOutput(n, binary_data=binary_outputs) for n in names]
        result = client.infer("casts", [x, f], outputs=asked)
        check({name: result.as_numpy(name) for name in names})
        assert result.get_output("kept")["datatype"] == "BF16"
    finally:
        client.close()


def test_tritonclient_grpc(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        x = grpcclient.InferInput("x", list(X.shape), "BF16")
        x.set_data_from_numpy(X)
        f = grpcclient.InferInput("f", list(F.shape), "FP32")
        f.set_data_from_numpy(F)
        result = client.infer("casts", [x, f])
        check({name: result.as_numpy(name) for name in ("widened", "narrowed", "kept")})
        metadata = client.get_model_metadata("casts", as_json=True)
        assert [i["datatype"] for i in metadata["inputs"]] == ["BF16", "FP32"]
        config = client.get_model_config("casts", as_json=True)["config"]
        assert config["input"][0]["data_type"] == "TYPE_BF16"
    finally:
        client.close()


def post(server: RunningServer, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        f"http://{server.http}/v2/models/casts/infer", json.dumps(body).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def json_request(x_data: list[float]) -> dict[str, object]:
    return {"inputs": [
        {"name": "x", "datatype": "BF16", "shape": [2, 4], "data": x_data},
        {"name": "f", "datatype": "FP32", "shape": [2, 4], "data": F.reshape(-1).tolist()},
    ]}  # fmt: skip


def test_json_values_round_to_nearest_even(server: RunningServer) -> None:
    """JSON values of a BF16 input are rounded to the nearest bfloat16 (ties to even), as
    ml_dtypes and ONNX Runtime's Cast round; BF16 answers are written as the doubles they are."""
    values = [0.1, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -3.0, 1e38, 2.0, -0.0, 7.25]
    status, answer = post(server, json_request(values))
    assert status == 200, answer
    outputs = {o["name"]: o for o in answer["outputs"]}  # type: ignore[attr-defined]
    assert outputs["kept"]["datatype"] == "BF16"
    rounded = np.array(values, np.float64).astype(BF16)
    assert outputs["kept"]["data"] == rounded.astype(np.float64).tolist()
    widened = np.array(outputs["widened"]["data"], np.float32)  # (FP32 text)
    assert widened.tolist() == rounded.astype(np.float32).tolist()


def test_a_json_value_beyond_bf16_is_refused_naming_the_input(server: RunningServer) -> None:
    status, answer = post(server, json_request([1e39] + [0.0] * 7))
    assert status == 400
    assert "input 'x': 'data' has values outside the range of BF16" in str(answer["error"])


def test_typed_grpc_contents_cannot_carry_bf16(server: RunningServer) -> None:
    """The v2 protocol has no typed field for BF16 (as FP16): raw contents only, as Triton."""
    request = service_pb2.ModelInferRequest(model_name="casts")
    tensor = request.inputs.add(name="x", datatype="BF16", shape=[1, 4])
    tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
    f = request.inputs.add(name="f", datatype="FP32", shape=[1, 4])
    f.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "BF16 data must be sent in raw_input_contents" in (raised.value.details() or "")


def test_requests_batched_together_get_their_own_rows(server: RunningServer) -> None:
    """Concurrent requests of one row each, batched by the scheduler: each gets its row."""
    rng = np.random.default_rng(7)
    rows = [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(24)]

    def one(row: np.ndarray) -> None:
        client = grpcclient.InferenceServerClient(server.grpc)
        try:
            x = grpcclient.InferInput("x", [1, 4], "BF16")
            x.set_data_from_numpy(row.astype(BF16))
            f = grpcclient.InferInput("f", [1, 4], "FP32")
            f.set_data_from_numpy(row)
            result = client.infer("casts", [x, f])
            check(
                {name: result.as_numpy(name) for name in ("widened", "narrowed", "kept")},
                row.astype(BF16), row,
            )  # fmt: skip
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, rows))


def test_in_process(server: RunningServer) -> None:
    call = server.server.engine.infer_async("casts", {"x": X, "f": F})
    outputs = asyncio.run_coroutine_threadsafe(call, server.loop).result(timeout=30)
    check(outputs)


def test_classification_of_a_bf16_output(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http)
    try:
        x = httpclient.InferInput("x", list(X.shape), "BF16")
        x.set_data_from_numpy(X, binary_data=True)
        f = httpclient.InferInput("f", list(F.shape), "FP32")
        f.set_data_from_numpy(F)
        asked = [httpclient.InferRequestedOutput("kept", class_count=2)]
        result = client.infer("casts", [x, f], outputs=asked)
        top = result.as_numpy("kept")
    finally:
        client.close()
    assert top is not None
    values = X.astype(np.float32)
    assert top.tolist() == [
        [b"%f:3" % values[0, 3], b"%f:0" % values[0, 0]],
        [b"%f:2" % values[1, 2], b"%f:0" % values[1, 0]],
    ]


def test_scalars_cross_into_onnx_runtime_as_scalars(server: RunningServer) -> None:
    """A scalar crossed as an OrtValue went in as shape [1] (np.ascontiguousarray makes a 0-d
    array 1-d; found by a tester): refused by ONNX Runtime, or answered with the wrong shape."""
    s, f = np.array(2.5, BF16), np.array(0.1, np.float32)
    call = server.server.engine.infer_async("scalars", {"s": s, "f": f})
    outputs = asyncio.run_coroutine_threadsafe(call, server.loop).result(timeout=30)
    assert outputs["widened"].shape == outputs["narrowed"].shape == ()
    assert float(outputs["widened"]) == 2.5
    assert outputs["narrowed"].view(np.uint16) == f.astype(BF16).view(np.uint16)


def test_a_bf16_input_beside_a_string_input(server: RunningServer) -> None:
    labels = np.array([b"a", b"bc"], object)
    call = server.server.engine.infer_async("widens", {"x": X, "label": labels})
    outputs = asyncio.run_coroutine_threadsafe(call, server.loop).result(timeout=30)
    assert np.array_equal(outputs["widened"], X.astype(np.float32))
    assert outputs["same"].tolist() == [b"a", b"bc"]
