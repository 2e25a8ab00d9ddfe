"""Due times over the wire: the `timeout` parameter, gRPC deadlines, the model default, priority."""

from __future__ import annotations

import http.client
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import orjson
import pytest
from conftest import RunningServer, start_server, stop_server

from duetime.config import ServerSettings
from duetime.frontend.proto import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(60)

# resnet runs about 1 ms per sample here, so a batch of 32 takes tens of milliseconds: a 2 ms
# due time cannot be met, and admission must say so at once instead of running it.
BIG_BATCH = 32


def _post(
    server: RunningServer, model: str, doc: dict[str, object]
) -> tuple[int, dict[str, object]]:
    conn = http.client.HTTPConnection(server.addresses.host, server.addresses.http_port, timeout=30)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", orjson.dumps(doc))
        response = conn.getresponse()
        return response.status, orjson.loads(response.read())
    finally:
        conn.close()


def _resnet_doc(rows: int, **parameters: object) -> dict[str, object]:
    image = np.zeros((rows, 3, 64, 64), np.float32)
    tensor = {
        "name": "image",
        "datatype": "FP32",
        "shape": list(image.shape),
        "data": image.ravel().tolist(),
    }
    return {"inputs": [tensor], "parameters": parameters}


def _grpc_infer(
    target: str, rows: int, *, deadline_s: float | None, **params: int
) -> pb.ModelInferResponse:
    request = pb.ModelInferRequest(model_name="resnet")
    request.inputs.add(name="image", datatype="FP32", shape=[rows, 3, 64, 64])
    request.raw_input_contents.append(np.zeros((rows, 3, 64, 64), np.float32).tobytes())
    for key, value in params.items():
        request.parameters[key].int64_param = value
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        return call(request, timeout=deadline_s)


def test_http_unmeetable_timeout_is_refused_at_once(server: RunningServer) -> None:
    status, body = _post(server, "resnet", _resnet_doc(BIG_BATCH, timeout=2000))
    assert status in (429, 504)
    assert "due" in str(body["error"])


def test_http_generous_timeout_is_answered(server: RunningServer) -> None:
    status, body = _post(server, "resnet", _resnet_doc(1, timeout=10_000_000))
    assert status == 200, body


@pytest.mark.parametrize("bad", [-1, "soon", 1.5, True])
def test_http_bad_timeout_names_the_parameter(server: RunningServer, bad: object) -> None:
    status, body = _post(server, "mlp", {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 40], "data": [0.0] * 40}],
        "parameters": {"timeout": bad},
    })  # fmt: skip
    assert status == 400
    assert "timeout" in str(body["error"])


@pytest.mark.parametrize("bad", [-1, "high"])
def test_http_bad_priority_names_the_parameter(server: RunningServer, bad: object) -> None:
    status, body = _post(server, "mlp", {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 40], "data": [0.0] * 40}],
        "parameters": {"priority": bad},
    })  # fmt: skip
    assert status == 400
    assert "priority" in str(body["error"])


def test_http_priority_is_accepted(server: RunningServer) -> None:
    status, _ = _post(server, "resnet", _resnet_doc(1, priority=2, timeout=10_000_000))
    assert status == 200


def test_grpc_deadline_sets_the_due_time(server: RunningServer) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _grpc_infer(server.grpc, BIG_BATCH, deadline_s=0.002)
    # The server refuses at admission (RESOURCE_EXHAUSTED) unless the client's own deadline
    # fires first (DEADLINE_EXCEEDED); either way no late answer arrives.
    assert caught.value.code() in (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )


def test_grpc_timeout_parameter_sets_the_due_time(server: RunningServer) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _grpc_infer(server.grpc, BIG_BATCH, deadline_s=30, timeout=2000)
    assert caught.value.code() in (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )
    assert "due" in (caught.value.details() or "")


def test_grpc_generous_deadline_is_answered(server: RunningServer) -> None:
    response = _grpc_infer(server.grpc, 1, deadline_s=30)
    assert list(response.outputs[0].shape) == [1, 10]


@pytest.fixture(scope="module")
def strict_server(
    demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """resnet with `default_timeout_ms = 2`: a batch of 32 can never make it."""
    repo = tmp_path_factory.mktemp("strict")
    shutil.copytree(demo_repo / "resnet", repo / "resnet")
    (repo / "resnet" / "config.toml").write_text("max_batch_size = 32\ndefault_timeout_ms = 2\n")
    running, thread = start_server(ServerSettings(model_repository=repo, http_port=0, grpc_port=0))
    yield running
    stop_server(running, thread)


def test_model_default_timeout_applies_without_a_timeout(strict_server: RunningServer) -> None:
    status, body = _post(strict_server, "resnet", _resnet_doc(BIG_BATCH))
    assert status in (429, 504)
    assert "due" in str(body["error"])


def test_a_request_timeout_replaces_the_model_default(strict_server: RunningServer) -> None:
    """A request's own timeout is honoured always, longer than the model's default too (README):
    it was held to the default, as Triton's `allow_timeout_override` allows only shorter ones
    (found by a tester)."""
    status, body = _post(strict_server, "resnet", _resnet_doc(BIG_BATCH, timeout=10_000_000))
    assert status == 200, body
