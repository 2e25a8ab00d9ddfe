"""A tensor without dims (beyond the batch's) is written in Triton's config as dims [1] with
reshape [], and Triton's clients send it [1] ([batch, 1] where the model batches): a request in
that form is answered in it too, its outputs without dims given a trailing dim of 1, over HTTP,
gRPC and the Engine; a request in metadata's form ([], [batch]) is answered in that one. (A
Triton client that sent [1] was answered [], and its `as_numpy('y')[0]` raised IndexError.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, serving
from onnx import TensorProto, helper

from duetime.config import ServerSettings
from duetime.engine import Engine

pytestmark = pytest.mark.timeout(120)


def doubling(shape: list[str]) -> bytes:
    """y = 2x, x and y FP32 of `shape` ([]: a scalar; ["N"]: a batch of scalars)."""
    value = helper.make_tensor_value_info
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])], "g",
        [value("x", TensorProto.FLOAT, shape)], [value("y", TensorProto.FLOAT, shape)],
        initializer=[two],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def write(root: Path, name: str, shape: list[str], config: str = "") -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.onnx").write_bytes(doubling(shape))
    if config:
        (root / name / "config.toml").write_text(config)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("no-dims")
    write(root, "scalar", [])
    write(root, "batched", ["N"], "max_batch_size = 8\n")
    onnx.checker.check_model(onnx.load_from_string(doubling(["N"])))
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[RunningServer]:
    with serving(ServerSettings(model_repository=repo, http_port=0, grpc_port=0)) as running:
        yield running


CASES = [
    ("scalar", [2.5], (1,)),  # Triton's form
    ("scalar", 2.5, ()),  # metadata's
    ("batched", [[1.0], [2.0], [3.0]], (3, 1)),
    ("batched", [1.0, 2.0, 3.0], (3,)),
]


@pytest.mark.parametrize(("model", "value", "shape"), CASES)
def test_http_answers_in_the_form_asked(
    server: RunningServer, model: str, value: object, shape: tuple[int, ...]
) -> None:
    x = np.array(value, dtype=np.float32)
    assert x.shape == shape
    with httpclient.InferenceServerClient(server.http) as client:
        for binary in (True, False):
            tensor = httpclient.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            wanted = [httpclient.InferRequestedOutput("y", binary_data=binary)]
            y = client.infer(model, [tensor], outputs=wanted).as_numpy("y")
            assert y.shape == shape
            np.testing.assert_array_equal(y, 2 * x)


@pytest.mark.parametrize(("model", "value", "shape"), CASES)
def test_grpc_answers_in_the_form_asked(
    server: RunningServer, model: str, value: object, shape: tuple[int, ...]
) -> None:
    x = np.array(value, dtype=np.float32)
    with grpcclient.InferenceServerClient(server.grpc) as client:
        tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        y = client.infer(model, [tensor]).as_numpy("y")
    assert y.shape == shape
    np.testing.assert_array_equal(y, 2 * x)


def test_the_triton_client_reads_its_scalar(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.http) as client:
        assert client.get_model_config("scalar")["output"][0]["dims"] == [1]
        tensor = httpclient.InferInput("x", [1], "FP32")
        tensor.set_data_from_numpy(np.array([2.5], dtype=np.float32))
        assert client.infer("scalar", [tensor]).as_numpy("y")[0] == 5.0


def test_the_engine_answers_in_the_form_asked(repo: Path) -> None:
    engine = Engine.open(repo)
    try:
        for model, value, shape in CASES:
            x = np.array(value, dtype=np.float32)
            y = engine.infer(model, {"x": x})["y"]
            assert y.shape == shape
            np.testing.assert_array_equal(y, 2 * x)
    finally:
        engine.close()
