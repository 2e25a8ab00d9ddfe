"""Tensors without dims beyond the batch's (a batched [N], every sklearn classifier's `label`;
a scalar of a model that does not batch): Triton's config writes them dims [1] with reshape [],
so its clients send [batch, 1] ([1]), where duetime's send [batch] ([]). Inputs take both; a
request is answered in its own form (metadata's form kept for both once broke Triton clients:
a scalar sent [1] came back [], and `as_numpy('y')[0]` raised IndexError); the config read back
by load_model(config=...) serves the same model.

The config endpoint said dims [1] while requests of [3, 1] were refused ("does not match the
model's [-1]"), and the config read back served [batch, 1] alone, refusing [3]."""

from __future__ import annotations

import asyncio
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
from repo_models import run_on_engine, write_version
from tritonclient.utils import InferenceServerException

from duetime.config import ServerSettings
from duetime.engine import Engine
from duetime.errors import ConfigError, InvalidInput
from duetime.frontend.codec import Expected
from duetime.frontend.metadata import model_config_json
from duetime.repository.layout import scan_model
from duetime.repository.loader import load_version
from duetime.repository.tritonconfig import read_json_config, translate

pytestmark = pytest.mark.timeout(120)

TRITON_FORM = """max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
"""


def negation(shape: list[int | str]) -> bytes:
    """y = -x, both of `shape` (["n"]: a batched vector; []: a scalar)."""
    graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def write_models(repo: Path) -> None:
    write_version(repo, "vec", 1, negation(["n"]))
    write_version(repo, "scalar", 1, negation([]))
    write_version(repo, "triton", 1, negation(["n"]))  # (Triton's form, given explicitly)
    (repo / "triton" / "config.pbtxt").write_text(TRITON_FORM, encoding="utf-8")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("repo")
    write_models(repo)
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, model_control_mode="explicit",
        load_model=("vec", "scalar", "triton"),
    )  # fmt: skip
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


def infer(server: RunningServer, protocol: str, model: str, x: np.ndarray) -> np.ndarray:
    """y for `x` through tritonclient over `protocol` (json, binary or grpc)."""
    if protocol == "grpc":
        grpc_client = grpcclient.InferenceServerClient(server.grpc)
        try:
            tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            answer = grpc_client.infer(model, [tensor]).as_numpy("y")
        finally:
            grpc_client.close()
    else:
        binary = protocol == "binary"
        client = httpclient.InferenceServerClient(server.http)
        try:
            tensor = httpclient.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            wanted = [httpclient.InferRequestedOutput("y", binary_data=binary)]
            answer = client.infer(model, [tensor], outputs=wanted).as_numpy("y")
        finally:
            client.close()
    assert answer is not None
    return answer


def metadata_shapes(server: RunningServer, model: str) -> list[list[int]]:
    client = httpclient.InferenceServerClient(server.http)
    try:
        found = client.get_model_metadata(model)
    finally:
        client.close()
    return [tensor["shape"] for tensor in found["inputs"] + found["outputs"]]


def model_config(server: RunningServer, protocol: str, model: str) -> dict[str, Any]:
    """The config as each client gives it (gRPC's in protobuf's JSON form: int64 as strings)."""
    if protocol == "grpc":
        grpc_client = grpcclient.InferenceServerClient(server.grpc)
        try:
            return dict(grpc_client.get_model_config(model, as_json=True)["config"])
        finally:
            grpc_client.close()
    client = httpclient.InferenceServerClient(server.http)
    try:
        return dict(client.get_model_config(model))
    finally:
        client.close()


def load(server: RunningServer, model: str, config: dict[str, Any]) -> None:
    client = httpclient.InferenceServerClient(server.http)
    try:
        client.load_model(model, config=json.dumps(config))
    finally:
        client.close()


VECTOR = np.array([1.0, 2.0, 3.0], np.float32)
CASES = [
    # model, what requests give, the answer's shape (the request's form)
    ("vec", VECTOR, (3,)),
    ("vec", VECTOR.reshape(3, 1), (3, 1)),  # (the shape the config's dims [1] give)
    ("scalar", np.array(2.0, np.float32), ()),
    ("scalar", np.array([2.0], np.float32), (1,)),
    ("triton", VECTOR.reshape(3, 1), (3, 1)),
    ("triton", VECTOR, (3, 1)),
]


@pytest.mark.parametrize("protocol", ["json", "binary", "grpc"])
@pytest.mark.parametrize(("model", "x", "shape"), CASES)
def test_either_form_is_taken_and_answered_in_the_models(
    server: RunningServer, protocol: str, model: str, x: np.ndarray, shape: tuple[int, ...]
) -> None:
    y = infer(server, protocol, model, x)
    assert (y.shape, y.ravel().tolist()) == (shape, (-x).ravel().tolist())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_shape_the_config_gives_is_taken(server: RunningServer, protocol: str) -> None:
    """The tester's repro: a request built from the config's max_batch_size and dims."""
    for model in ("vec", "scalar"):
        config = model_config(server, protocol, model)
        tensor = config["input"][0]
        dims = [int(d) for d in tensor["dims"]]
        assert (dims, tensor["reshape"].get("shape", [])) == ([1], [])  # (gRPC's JSON: {})
        batched = int(config.get("max_batch_size", 0)) > 0
        x = np.ones([3, *dims] if batched else dims, np.float32)
        assert infer(server, "json", model, x).size == x.size


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_config_read_back_serves_the_same_model(server: RunningServer, protocol: str) -> None:
    """load_model(config=<the server's config>, as each client gives it): metadata and answers
    as before. The config's dims [1] + reshape [] were read as Triton's: metadata [-1, 1] ([1]),
    answers in that shape, and requests of [3] ([]) refused."""
    for model, shape in (("vec", [-1]), ("scalar", []), ("triton", [-1, 1])):
        assert metadata_shapes(server, model) == [shape, shape]
        load(server, model, model_config(server, protocol, model))
        assert metadata_shapes(server, model) == [shape, shape]
        x = np.ones([3 if d == -1 else d for d in shape], np.float32)
        assert infer(server, "json" if protocol == "http" else "grpc", model, x).shape == x.shape


def test_a_shape_of_neither_form_is_refused_naming_both(server: RunningServer) -> None:
    with pytest.raises(InferenceServerException, match=r"Expected \[-1\] or \[-1,1\], got "
                       r"\[3,2\]"):  # fmt: skip
        infer(server, "json", "vec", np.ones((3, 2), np.float32))
    with pytest.raises(InferenceServerException, match=r"Expected \[\] or \[1\], got "
                       r"\[2\]"):  # fmt: skip
        infer(server, "grpc", "scalar", np.ones(2, np.float32))


def test_requests_in_either_form_batch_together(tmp_path: Path) -> None:
    """A batch of [2] and [2, 1] requests: one shape to the graph, each answer its own."""
    write_models(tmp_path)

    async def scenario(engine: Engine) -> None:
        for model in ("vec", "triton"):
            given = [np.arange(2, dtype=np.float32) + 10 * i for i in range(6)]
            given = [x if i % 2 else x.reshape(2, 1) for i, x in enumerate(given)]
            answers = await asyncio.gather(
                *(engine.infer_async(model, {"x": x}) for x in given)
            )  # fmt: skip
            for x, answer in zip(given, answers, strict=True):
                shape = x.shape if model == "vec" else (2, 1)  # (vec: the request's own form)
                assert (answer["y"].shape, answer["y"].ravel().tolist()) == (
                    shape, (-x).ravel().tolist()
                )  # fmt: skip

    run_on_engine(tmp_path, scenario)
    model = load_version(scan_model(tmp_path / "vec"), 1)
    try:
        keys = {
            model.validator.prepare({"x": x}, None).shape_key
            for x in (VECTOR, VECTOR.reshape(3, 1))
        }
    finally:
        model.executor.close()
    assert len(keys) == 1


def test_the_front_ends_check_takes_either_form(tmp_path: Path) -> None:
    """codec.Expected, the check before decoding, as the validator's."""
    write_models(tmp_path)
    for name, taken, refused in (
        ("vec", [(3,), (3, 1)], [(3, 2), (3, 1, 1)]),
        ("scalar", [(), (1,)], [(2,), (1, 1)]),
        ("triton", [(3,), (3, 1)], [(3, 2)]),
    ):
        model = load_version(scan_model(tmp_path / name), 1)
        try:
            expected = Expected(name, model.signature, (name, "1"), {})
            for shape in taken:
                expected.input("x", "FP32", shape)
            for shape in refused:
                with pytest.raises(InvalidInput, match="unexpected shape for input"):
                    expected.input("x", "FP32", shape)
        finally:
            model.executor.close()


def test_the_config_names_the_tensors_without_dims(tmp_path: Path) -> None:
    """...in a parameter, read back as no dims; Triton's own form stays Triton's."""
    write_models(tmp_path)
    for name, parameter in (("vec", '["x", "y"]'), ("scalar", '["x", "y"]'), ("triton", None)):
        model = load_version(scan_model(tmp_path / name), 1)
        try:
            shown = model_config_json(model)
        finally:
            model.executor.close()
        given = shown["parameters"].get("tensors_without_dims")
        assert given == (None if parameter is None else {"string_value": parameter})
        read_back = read_json_config(shown, source="c", model_name=name)
        assert read_back.inputs is not None
        assert read_back.outputs is not None
        dims = [(t.dims, t.reshape) for t in read_back.inputs + read_back.outputs]
        assert dims == [(None, None) if parameter else ([1], [])] * 2


def test_the_parameter_is_checked() -> None:
    tensor = 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]'
    given = 'parameters { key: "tensors_without_dims" value: { string_value: "%s" } }'
    with pytest.raises(ConfigError, match=r"c: parameters\['tensors_without_dims'\]: expected a "
                       "JSON list of tensor names"):  # fmt: skip
        translate(f"{tensor}\n{given % 'y'}", source="c", model_name="m")
    warned: list[str] = []
    names = r"[\"y\", \"z\"]"  # (escaped in the text format's string)
    settings = translate(
        f"{tensor}\n{given % names}", source="c", model_name="m", warn=warned.append
    )
    assert settings["outputs"] == [{"name": "y", "datatype": "FP32"}]
    assert [w for w in warned if "max_queue_size: not set" not in w] == [  # (see
        # tests/repository/test_triton_config_compat.py for that one)
        "c: parameters['tensors_without_dims']: 'z' is no input or output of dims [1] with "
        "reshape [] in this config; ignored"
    ]
