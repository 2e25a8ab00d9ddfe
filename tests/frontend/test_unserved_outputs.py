"""Outputs a graph has but duetime cannot return (a bfloat16 tensor beside a string input, a
ZipMap's sequence of maps) are left out at load; a request asking for one by name is told why, on
every protocol, and the load warning gives each type's own reason.

The request was told "requested output 'y' is not an output of model ...", though the graph has
it: the reason was only in the log, and there it said the v2 protocol cannot carry bfloat16 (it
defines BF16: the limit is ONNX Runtime's Python API) and suggested a classifier's zipmap option.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import RunningServer, start_server, stop_server
from onnx import TensorProto, helper
from repo_models import run_on_engine
from tritonclient.grpc import service_pb2, service_pb2_grpc

from duetime.config import ServerSettings
from duetime.engine import Engine
from duetime.errors import ConfigError, InvalidInput
from duetime.repository.layout import MODEL_FILENAME, scan_model
from duetime.repository.loader import LoadedModel, load_version

pytestmark = pytest.mark.timeout(120)

BF16_REASON = (
    "its type bfloat16 comes out of ONNX Runtime's Python API only beside inputs it can take as "
    "OrtValues, which strings are not"
)


def bf16_model() -> bytes:
    """y = x cast to bfloat16, z = relu(x), beside a string input s (a bfloat16 output comes out
    of ONNX Runtime's Python API only through OrtValues, which no string can be): one output
    duetime cannot return, one it can."""
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.BFLOAT16),
         helper.make_node("Relu", ["x"], ["z"])], "bf16",
        [info("x", TensorProto.FLOAT, ["N", 3]), info("s", TensorProto.STRING, ["N"])],
        [info("y", TensorProto.BFLOAT16, ["N", 3]), info("z", TensorProto.FLOAT, ["N", 3])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return bytes(model.SerializeToString())


def zipmap_model() -> bytes:
    """A classifier as skl2onnx exports it by default: a label and a ZipMap of probabilities."""
    seq_of_maps = helper.make_sequence_type_proto(
        helper.make_map_type_proto(
            TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])
        )
    )
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["p"], axis=1),
         helper.make_node("ArgMax", ["p"], ["label"], axis=1, keepdims=0),
         helper.make_node("ZipMap", ["p"], ["probabilities"], domain="ai.onnx.ml",
                          classlabels_int64s=[0, 1, 2])], "clf",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
         helper.make_value_info("probabilities", seq_of_maps)],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return bytes(model.SerializeToString())


def write_model(root: Path, name: str, model: bytes) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / MODEL_FILENAME).write_bytes(model)
    return root / name


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("unserved")
    write_model(root, "bf16", bf16_model())
    write_model(root, "clf", zipmap_model())
    settings = ServerSettings(model_repository=root, http_port=0, grpc_port=0)
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


X = np.array([[1.0, -2.0, 3.0]], dtype=np.float32)


def over_http(server: RunningServer, model: str, output: str) -> tuple[int, str]:
    body = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": X[0].tolist()}],
        "outputs": [{"name": output}],
    }
    if model == "bf16":
        body["inputs"].append({"name": "s", "datatype": "BYTES", "shape": [1], "data": ["a"]})
    connection = http.client.HTTPConnection(server.http, timeout=30)
    try:
        connection.request("POST", f"/v2/models/{model}/infer", json.dumps(body).encode())
        response = connection.getresponse()
        answer = json.loads(response.read())
    finally:
        connection.close()
    return response.status, answer.get("error", "")


def over_grpc(server: RunningServer, model: str, output: str) -> tuple[int, str]:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 3])
    request.raw_input_contents.append(X.tobytes())
    if model == "bf16":
        request.inputs.add(name="s", datatype="BYTES", shape=[1])
        request.raw_input_contents.append(b"\x01\x00\x00\x00a")
    request.outputs.add(name=output)
    with grpc.insecure_channel(server.grpc) as channel:
        try:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
        except grpc.RpcError as exc:  # (INVALID_ARGUMENT is HTTP's 400; any other, not)
            invalid = exc.code() == grpc.StatusCode.INVALID_ARGUMENT
            return 400 if invalid else 500, exc.details() or ""
    return 200, ""


def in_process(server: RunningServer, model: str, output: str) -> tuple[int, str]:
    feeds = {"x": X, "s": np.array([b"a"], object)} if model == "bf16" else {"x": X}
    call = server.server.engine.infer_async(model, feeds, outputs=[output])
    try:
        asyncio.run_coroutine_threadsafe(call, server.loop).result(timeout=30)
    except InvalidInput as exc:
        return 400, exc.message
    return 200, ""


ASK = {"http": over_http, "grpc": over_grpc, "engine": in_process}


@pytest.mark.parametrize("protocol", list(ASK))
def test_asking_for_a_bf16_output_says_why_it_is_not_served(
    served: RunningServer, protocol: str
) -> None:
    status, message = ASK[protocol](served, "bf16", "y")
    assert status == 400
    assert f"output 'y' of model 'bf16' is not served: {BF16_REASON}" in message
    assert "is not an output" not in message
    assert "zipmap" not in message.lower()
    assert ASK[protocol](served, "bf16", "z") == (200, "")


@pytest.mark.parametrize("protocol", list(ASK))
def test_asking_for_a_zipmap_output_says_to_export_without_it(
    served: RunningServer, protocol: str
) -> None:
    status, message = ASK[protocol](served, "clf", "probabilities")
    assert status == 400
    assert "output 'probabilities' of model 'clf' is not served: it is a sequence of maps" in (
        message
    )
    assert "zipmap=False" in message


@pytest.mark.parametrize("protocol", list(ASK))
def test_an_output_the_graph_lacks_is_still_not_an_output(
    served: RunningServer, protocol: str
) -> None:
    status, message = ASK[protocol](served, "bf16", "w")
    assert status == 400
    assert "requested output 'w' is not an output of model 'bf16'; its outputs are 'z'" in message


def test_the_load_warning_gives_bf16_its_own_reason(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    folder = write_model(tmp_path, "bf16", bf16_model())
    with caplog.at_level(logging.WARNING, logger="duetime.ort"):
        model = load_version(scan_model(folder), 1, profile_budget_s=0.02)
    loaded.append(model)
    assert [spec.name for spec in model.signature.outputs] == ["z"]
    assert set(model.unserved_outputs) == {"y"}
    warned = [r.getMessage() for r in caplog.records if "'y'" in r.getMessage()]
    assert len(warned) == 1
    assert BF16_REASON in warned[0]
    assert "v2 protocol cannot carry" not in warned[0]
    assert "zipmap" not in warned[0].lower()


def test_a_config_naming_a_bf16_output_gives_its_own_reason(tmp_path: Path) -> None:
    folder = write_model(tmp_path, "bf16", bf16_model())
    (folder / "config.toml").write_text('[[outputs]]\nname = "y"\n', encoding="utf-8")
    with pytest.raises(
        ConfigError, match=r"field 'outputs.0.name': 'y' has type tensor\(bf"
    ) as raised:
        load_version(scan_model(folder), 1, profile_budget_s=0.02)
    assert BF16_REASON in str(raised.value)
    assert "zipmap" not in str(raised.value).lower()


ZIPMAP_PBTXT = """output [
  { name: "label" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "probabilities" data_type: TYPE_FP32 dims: [ -1, 3 ] }
]
"""


@pytest.mark.parametrize(
    ("model", "pbtxt", "message"),
    [
        (  # (it said "<folder>: field 'outputs.1.name'", a field the file has not)
            "clf", ZIPMAP_PBTXT,
            "config.pbtxt: field 'output[1].name': 'probabilities' has type seq(map(",
        ),
        (  # (it said "duetime has no BF16 tensors (numpy has none)")
            "bf16", 'output [{ name: "y" data_type: TYPE_BF16 dims: [ -1, 3 ] }]\n',
            "config.pbtxt: field 'output[0].name': 'y' has type tensor(bfloat16), which duetime "
            f"cannot serve: {BF16_REASON}",
        ),
    ],
)  # fmt: skip
def test_a_pbtxt_listing_an_unserved_output_is_refused_in_its_own_words(
    tmp_path: Path, model: str, pbtxt: str, message: str
) -> None:
    """A Triton config.pbtxt listing an output duetime cannot return: the load's error names
    the file and its own field, with the reason the load warning and a request give."""
    folder = write_model(tmp_path, model, bf16_model() if model == "bf16" else zipmap_model())
    (folder / "config.pbtxt").write_text(pbtxt, encoding="utf-8")

    async def scenario(engine: Engine) -> None:
        with pytest.raises(InvalidInput) as raised:
            await engine.load_model(model)
        assert f"{folder}/{message}" in raised.value.message
        assert "outputs." not in raised.value.message

    run_on_engine(tmp_path, scenario, control_mode="explicit")
