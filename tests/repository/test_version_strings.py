"""A version string that is not an int64 is refused as Triton refuses it (400 / INVALID_ARG,
"failed to get model version from specified version string"), before the model is looked up;
a well-formed version of a model or version not served stays "not found" (404 / NOT_FOUND).

"abc" of a model not served was told the model is not found (404), and a 20-digit version above
2**63 - 1 of a served model that its version is not found (404)."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import grpc
import pytest
from conftest import RunningServer
from repo_models import scale_model, write_version
from tritonclient.grpc import service_pb2, service_pb2_grpc

from duetime.repository.layout import scan_model, version_of

pytestmark = pytest.mark.timeout(120)

VERSION_MAX = 2**63 - 1  # (versions are int64s, as Triton's)
TOO_BIG = str(VERSION_MAX + 1)  # 9223372036854775808
TWENTY_DIGITS = "9" * 20
INVALID, NOT_FOUND = "invalid", "not found"
CASES = [
    # model, version, outcome
    ("nope", "abc", INVALID),
    ("nope", "-1", INVALID),
    ("nope", TOO_BIG, INVALID),
    ("nope", "1", NOT_FOUND),
    ("nope", str(VERSION_MAX), NOT_FOUND),
    ("mlp", TOO_BIG, INVALID),
    ("mlp", TWENTY_DIGITS, INVALID),
    ("mlp", str(VERSION_MAX), NOT_FOUND),
    ("mlp", "09", NOT_FOUND),
]
INFER_BODY = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 40], "data": [0.0] * 40}]}
)


@pytest.mark.parametrize("endpoint", ["infer", "ready", "metadata", "config", "stats"])
@pytest.mark.parametrize(("model", "version", "outcome"), CASES)
def test_http(server: RunningServer, endpoint: str, model: str, version: str, outcome: str) -> None:
    if endpoint == "stats" and outcome == NOT_FOUND:
        pytest.skip("statistics of a well-formed version not served are empty, as Triton's")
    path = f"/v2/models/{model}/versions/{version}"
    method, body = "GET", None
    if endpoint == "infer":
        method, path, body = "POST", f"{path}/infer", INFER_BODY
    elif endpoint in ("ready", "config", "stats"):
        path = f"{path}/{endpoint}"
    connection = http.client.HTTPConnection(server.http, timeout=30)
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
        status, error = response.status, json.loads(response.read() or b"{}").get("error", "")
    finally:
        connection.close()
    if outcome == INVALID:
        assert status == 400, (status, error)
        shown = f"failed to get model version from specified version string '{version}'"
        assert error.startswith(shown), error
    elif endpoint != "ready":
        assert (status, error.startswith("Request for unknown model: ")) == (404, True), error


@pytest.mark.parametrize("call", ["ModelInfer", "ModelReady", "ModelMetadata", "ModelConfig"])
@pytest.mark.parametrize(("model", "version", "outcome"), CASES)
def test_grpc(server: RunningServer, call: str, model: str, version: str, outcome: str) -> None:
    channel = grpc.insecure_channel(server.grpc)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request: object
    if call == "ModelInfer":
        request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
        tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 40])
        tensor.contents.fp32_contents.extend([0.0] * 40)
    else:
        request = getattr(service_pb2, f"{call}Request")(name=model, version=version)
    try:
        getattr(stub, call)(request, timeout=30)
        code, details = grpc.StatusCode.OK, ""
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
    finally:
        channel.close()
    if outcome == INVALID:
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert details.startswith("failed to get model version from specified version string")
    elif call != "ModelReady":
        assert code == grpc.StatusCode.NOT_FOUND, (code, details)


def test_a_folder_beyond_int64_is_no_version(tmp_path: Path) -> None:
    assert version_of(str(VERSION_MAX)) == VERSION_MAX
    for name in (TOO_BIG, TWENTY_DIGITS, "1" * 21, "-1", "1.0", "\u00b2"):
        assert version_of(name) is None, name
    write_version(tmp_path, "m", 1, scale_model(2.0))
    write_version(tmp_path, "m", VERSION_MAX, scale_model(2.0))
    write_version(tmp_path, "m", int(TOO_BIG), scale_model(2.0))
    assert sorted(scan_model(tmp_path / "m").versions) == [1, VERSION_MAX]
