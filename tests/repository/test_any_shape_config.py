"""Tensors whose graph declares no shape at all (not even a rank) take any shape. Neither
Triton's config nor the v2 protocol can say "any rank": the config endpoint writes dims [-1]
(metadata shows [-1]) and names such tensors in `parameters['tensors_of_any_shape']`, so that
load_model(config=<the server's config>) serves the same model.

The config read back was rank 1: a [2, 3] request the model had served was refused with
"unexpected shape for input 'x' for model 'm'. Expected [-1], got [2,3]"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, start_server, stop_server
from onnx import TensorProto, helper
from repo_models import write_version

from duetime.config import ServerSettings
from duetime.errors import ConfigError
from duetime.frontend.metadata import model_config_json
from duetime.repository.layout import scan_model
from duetime.repository.loader import load_version
from duetime.repository.tritonconfig import read_json_config, translate

pytestmark = pytest.mark.timeout(120)


def shapeless_identity() -> bytes:
    """y = x, FP16, both declared with no shape at all."""
    x = onnx.ValueInfoProto(name="x")
    x.type.tensor_type.elem_type = TensorProto.FLOAT16
    y = onnx.ValueInfoProto(name="y")
    y.type.tensor_type.elem_type = TensorProto.FLOAT16
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("repo")
    write_version(repo, "ar", 1, shapeless_identity())
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, model_control_mode="explicit",
        load_model=("ar",),
    )  # fmt: skip
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


def infer(server: RunningServer, shape: tuple[int, ...]) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.http)
    try:
        x = np.arange(int(np.prod(shape)), dtype=np.float16).reshape(shape)
        tensor = httpclient.InferInput("x", list(shape), "FP16")
        tensor.set_data_from_numpy(x)
        answer = client.infer("ar", [tensor]).as_numpy("y")
    finally:
        client.close()
    assert answer is not None
    return answer


def model_config(server: RunningServer, protocol: str) -> dict[str, Any]:
    if protocol == "grpc":
        grpc_client = grpcclient.InferenceServerClient(server.grpc)
        try:
            return dict(grpc_client.get_model_config("ar", as_json=True)["config"])
        finally:
            grpc_client.close()
    client = httpclient.InferenceServerClient(server.http)
    try:
        return dict(client.get_model_config("ar"))
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_config_read_back_takes_any_shape(server: RunningServer, protocol: str) -> None:
    config = model_config(server, protocol)
    assert [int(d) for d in config["input"][0]["dims"]] == [-1]
    assert config["parameters"]["tensors_of_any_shape"] == {"string_value": '["x", "y"]'}
    client = httpclient.InferenceServerClient(server.http)
    try:
        client.load_model("ar", config=json.dumps(config))
        found = client.get_model_metadata("ar")
    finally:
        client.close()
    assert [t["shape"] for t in found["inputs"] + found["outputs"]] == [[-1], [-1]]
    for shape in ((2, 3), (5,), (), (1, 2, 2)):
        assert infer(server, shape).shape == shape


def test_the_config_names_only_tensors_of_any_shape(tmp_path: Path) -> None:
    write_version(tmp_path, "ar", 1, shapeless_identity())
    model = load_version(scan_model(tmp_path / "ar"), 1)
    try:
        shown = model_config_json(model)
    finally:
        model.executor.close()
    read_back = read_json_config(shown, source="c", model_name="ar")
    assert read_back.inputs is not None
    assert read_back.outputs is not None
    assert [t.dims for t in read_back.inputs + read_back.outputs] == [None, None]
    # (an edit that gives dims wins over the parameter, which is then warned of)
    shown["input"][0]["dims"] = [2, 3]
    warned: list[str] = []
    edited = read_json_config(shown, source="c", model_name="ar", warn=warned.append)
    assert edited.inputs is not None
    assert edited.inputs[0].dims == [2, 3]
    assert warned == [
        "c: parameters['tensors_of_any_shape']: 'x' is no input or output of dims [-1] without "
        "a reshape in this config; ignored"
    ]


def test_the_parameter_is_checked() -> None:
    tensor = 'output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]'
    given = 'parameters { key: "tensors_of_any_shape" value: { string_value: "%s" } }'
    with pytest.raises(ConfigError, match=r"c: parameters\['tensors_of_any_shape'\]: expected "
                       "a JSON list of tensor names"):  # fmt: skip
        translate(f"{tensor}\n{given % 'y'}", source="c", model_name="m")
    names = r"[\"y\"]"  # (escaped in the text format's string)
    settings = translate(f"{tensor}\n{given % names}", source="c", model_name="m")
    assert settings["outputs"] == [{"name": "y", "datatype": "FP32"}]
