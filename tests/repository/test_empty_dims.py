"""A graph with a fixed dim of 0 (x: FP32 [2, 0]; ONNX Runtime runs its empty tensors): served,
its model config reports dims [2, 0], and that config loads back (get, edit, load) over HTTP and
gRPC. A 0 dim where the graph's is not 0 is refused at load, naming the field.

The config read back was refused: "field 'input[0].dims': a dim must be 1 or more, or -1 for a
free dim (got 0)"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, start_server, stop_server
from onnx import TensorProto, helper
from repo_models import write_version
from tritonclient.utils import InferenceServerException

from duetime.config import ServerSettings

pytestmark = pytest.mark.timeout(120)


def identity(shape: list[int | str]) -> bytes:
    """y = x, both FP32 of `shape`."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo: Path = tmp_path_factory.mktemp("repo")
    write_version(repo, "empty", 1, identity([2, 0]))
    write_version(repo, "free", 1, identity(["a", "b"]))
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, model_control_mode="explicit",
        load_model=("empty", "free"),
    )  # fmt: skip
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


def test_the_config_of_a_0_dim_model_loads_back_over_http(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http)
    config = client.get_model_config("empty")
    assert config["input"][0]["dims"] == [2, 0]
    assert config["output"][0]["dims"] == [2, 0]
    client.load_model("empty", config=json.dumps(config))
    x = httpclient.InferInput("x", [2, 0], "FP32")
    x.set_data_from_numpy(np.zeros((2, 0), np.float32))
    assert client.infer("empty", [x]).as_numpy("y").shape == (2, 0)
    assert client.get_model_config("empty")["input"][0]["dims"] == [2, 0]


def test_the_config_of_a_0_dim_model_loads_back_over_grpc(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        config = client.get_model_config("empty", as_json=True)["config"]
        assert config["input"][0]["dims"] == ["2", "0"]  # (protobuf's JSON: int64 as text)
        client.load_model("empty", config=json.dumps(config))
    finally:
        client.close()


def test_a_0_dim_where_the_graph_has_a_free_one_is_refused(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http)
    config = client.get_model_config("free")
    assert config["input"][0]["dims"] == [-1]  # (the first is the batch dim)
    config["input"][0]["dims"] = [0]
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("free", config=json.dumps(config))
    message = str(caught.value)
    assert "field 'input[0].dims': [0] has a dim of 0 where the graph's is not 0" in message
    assert "give 1 or more, or -1 for a free dim" in message
    config["input"][0]["dims"] = [-2]
    with pytest.raises(InferenceServerException, match="got -2"):
        client.load_model("free", config=json.dumps(config))
