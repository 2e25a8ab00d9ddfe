"""tritonclient.http (sync and aio) against a real server: health, metadata, config, inference.

Results are compared with ONNX Runtime run directly on the same model file. A second server on
a test-local repository serves identity models over every v2 datatype; `test_grpc_infer.py`
reuses its builder (`write_dtypes_repository`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from conftest import RunningServer, start_server, stop_server
from onnx import TensorProto, helper

from duetime.config import ServerSettings

pytestmark = pytest.mark.timeout(60)


# -- the demo models and a reference run ---------------------------------------------------------


@dataclass(frozen=True)
class DemoModel:
    name: str
    input: str
    sample_shape: tuple[int, ...]
    output: str
    classes: int
    max_batch_size: int

    def batch(self, rows: int, seed: int = 0) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return rng.standard_normal((rows, *self.sample_shape), dtype=np.float32)


DEMO_MODELS = [
    DemoModel("mlp", "x", (40,), "y", 3, 64),
    DemoModel("resnet", "image", (3, 64, 64), "logits", 10, 32),
]
BY_NAME = {model.name: model for model in DEMO_MODELS}
TOLERANCE = 1e-6

Reference = Callable[[DemoModel, np.ndarray], np.ndarray]


def reference_runner(demo_repo: Path) -> Reference:
    """ONNX Runtime on each demo model's file, outside the server."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sessions = {
        model.name: ort.InferenceSession(
            str(demo_repo / model.name / "1" / "model.onnx"), options, ["CPUExecutionProvider"]
        )
        for model in DEMO_MODELS
    }

    def run(model: DemoModel, batch: np.ndarray) -> np.ndarray:
        (result,) = sessions[model.name].run([model.output], {model.input: batch})
        return np.asarray(result)

    return run


@pytest.fixture(scope="module")
def reference(demo_repo: Path) -> Reference:
    return reference_runner(demo_repo)


# -- identity models over every v2 datatype ------------------------------------------------------

#: v2 datatype -> ONNX element type.
ONNX_TYPE_OF = {
    "BOOL": TensorProto.BOOL, "INT8": TensorProto.INT8, "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32, "INT64": TensorProto.INT64, "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16, "UINT32": TensorProto.UINT32, "UINT64": TensorProto.UINT64,
    "FP16": TensorProto.FLOAT16, "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}  # fmt: skip
DATATYPES = list(ONNX_TYPE_OF)
DTYPES_MODEL = "dtypes"
TYPED_MODEL = "dtypes_typed"
"""Every datatype but FP16, which gRPC's typed `contents` cannot carry."""
TYPED_DATATYPES = [name for name in DATATYPES if name != "FP16"]


def input_name(datatype: str) -> str:
    return f"in_{datatype.lower()}"


def output_name(datatype: str) -> str:
    return f"out_{datatype.lower()}"


def build_identity_model(datatypes: list[str]) -> onnx.ModelProto:
    """One Identity per datatype: in_<type> [batch, 3] -> out_<type> [batch, 3]."""
    nodes, inputs, outputs = [], [], []
    for datatype in datatypes:
        kind = ONNX_TYPE_OF[datatype]
        nodes.append(helper.make_node("Identity", [input_name(datatype)], [output_name(datatype)]))
        inputs.append(helper.make_tensor_value_info(input_name(datatype), kind, ["batch", 3]))
        outputs.append(helper.make_tensor_value_info(output_name(datatype), kind, ["batch", 3]))
    graph = helper.make_graph(nodes, "identities", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def write_dtypes_repository(root: Path) -> Path:
    for name, datatypes in ((DTYPES_MODEL, DATATYPES), (TYPED_MODEL, TYPED_DATATYPES)):
        (root / name / "1").mkdir(parents=True)
        model = build_identity_model(datatypes)
        (root / name / "1" / "model.onnx").write_bytes(model.SerializeToString())
    return root


def dtype_samples(datatypes: list[str]) -> dict[str, np.ndarray]:
    """Two rows per datatype holding its extremes, so a lossy conversion shows."""
    samples: dict[str, np.ndarray] = {}
    for datatype in datatypes:
        if datatype == "BOOL":
            rows: list[list[Any]] = [[True, False, True], [False, False, True]]
            array = np.array(rows, dtype=np.bool_)
        elif datatype == "BYTES":
            text = [[b"", b"hello", "h\u00e9llo \u2713".encode()], [b"a b", b"{}", b"0" * 40]]
            array = np.array(text, dtype=np.object_)
        elif datatype.startswith(("INT", "UINT")):
            info = np.iinfo(datatype.lower())
            array = np.array(
                [[info.min, info.max, 1], [0, info.max - 1, info.min + 1]], datatype.lower()
            )
        else:
            dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype]
            info = np.finfo(dtype)
            array = np.array([[info.min, info.max, info.tiny], [-0.0, 1.5, -np.pi]], dtype)
        samples[input_name(datatype)] = array
    return samples


def assert_echoed(result: Any, samples: dict[str, np.ndarray], datatypes: list[str]) -> None:
    """Each identity output of `result` (an http or grpc InferResult) equals what was sent."""
    for datatype in datatypes:
        got = result.as_numpy(output_name(datatype))
        assert got is not None, f"{datatype}: output missing"
        assert_same_tensor(datatype, got, samples[input_name(datatype)])


def assert_same_tensor(datatype: str, got: np.ndarray, sent: np.ndarray) -> None:
    assert got.shape == sent.shape, datatype
    if datatype == "BYTES":  # JSON carries text; binary carries bytes
        as_bytes = [v.encode() if isinstance(v, str) else bytes(v) for v in got.reshape(-1)]
        assert as_bytes == list(sent.reshape(-1)), datatype
        return
    assert got.dtype == sent.dtype, datatype
    np.testing.assert_array_equal(got, sent, err_msg=datatype)


@pytest.fixture(scope="module")
def dtypes_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = write_dtypes_repository(tmp_path_factory.mktemp("dtypes"))
    running, thread = start_server(ServerSettings(model_repository=root, http_port=0, grpc_port=0))
    yield running
    stop_server(running, thread)


# -- sync client ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http, network_timeout=30)
    yield client
    client.close()


def make_input(
    name: str, array: np.ndarray, datatype: str, *, binary: bool
) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def test_health(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("mlp")
    assert client.is_model_ready("resnet", "1")
    assert not client.is_model_ready("no-such-model")
    assert not client.is_model_ready("mlp", "9")


def test_server_metadata(client: httpclient.InferenceServerClient) -> None:
    metadata = client.get_server_metadata()
    assert metadata["name"] == "duetime"
    assert metadata["version"]
    assert {"binary_tensor_data", "model_configuration"} <= set(metadata["extensions"])


@pytest.mark.parametrize("model", DEMO_MODELS, ids=lambda m: m.name)
def test_model_metadata(client: httpclient.InferenceServerClient, model: DemoModel) -> None:
    metadata = client.get_model_metadata(model.name)
    assert metadata["name"] == model.name
    assert metadata["versions"] == ["1"]
    assert metadata["inputs"] == [
        {"name": model.input, "datatype": "FP32", "shape": [-1, *model.sample_shape]}
    ]
    assert metadata["outputs"] == [
        {"name": model.output, "datatype": "FP32", "shape": [-1, model.classes]}
    ]
    assert client.get_model_metadata(model.name, "1") == metadata


@pytest.mark.parametrize("model", DEMO_MODELS, ids=lambda m: m.name)
def test_model_config(client: httpclient.InferenceServerClient, model: DemoModel) -> None:
    config = client.get_model_config(model.name)
    assert config["name"] == model.name
    assert config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == model.max_batch_size
    assert config["input"] == [
        {"name": model.input, "data_type": "TYPE_FP32", "dims": list(model.sample_shape)}
    ]
    assert config["output"] == [
        {"name": model.output, "data_type": "TYPE_FP32", "dims": [model.classes]}
    ]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("model", DEMO_MODELS, ids=lambda m: m.name)
def test_infer_matches_onnxruntime(
    client: httpclient.InferenceServerClient,
    reference: Reference,
    model: DemoModel,
    rows: int,
    binary: bool,
) -> None:
    batch = model.batch(rows, seed=rows)
    result = client.infer(
        model.name,
        [make_input(model.input, batch, "FP32", binary=binary)],
        outputs=[httpclient.InferRequestedOutput(model.output, binary_data=binary)],
        request_id=f"req-{model.name}-{rows}",
    )
    response = result.get_response()
    assert response["id"] == f"req-{model.name}-{rows}"
    assert response["model_name"] == model.name
    assert response["model_version"] == "1"
    got = result.as_numpy(model.output)
    assert got is not None
    assert got.dtype == np.float32
    assert got.shape == (rows, model.classes)
    assert np.max(np.abs(got - reference(model, batch))) <= TOLERANCE


def test_infer_without_requested_outputs_returns_all(
    client: httpclient.InferenceServerClient, reference: Reference
) -> None:
    model = BY_NAME["mlp"]
    batch = model.batch(3)
    result = client.infer(model.name, [make_input("x", batch, "FP32", binary=True)])
    response = result.get_response()
    assert [output["name"] for output in response["outputs"]] == ["y"]
    assert "id" not in response
    assert np.max(np.abs(result.as_numpy("y") - reference(model, batch))) <= TOLERANCE


@pytest.mark.parametrize(
    ("timeout_us", "priority"), [(10_000_000, 1), (0, 0), (1_000_000, 3)], ids=str
)
def test_timeout_and_priority_are_accepted(
    client: httpclient.InferenceServerClient, reference: Reference, timeout_us: int, priority: int
) -> None:
    model = BY_NAME["mlp"]
    batch = model.batch(2)
    result = client.infer(
        "mlp", [make_input("x", batch, "FP32", binary=True)], timeout=timeout_us, priority=priority
    )
    assert np.max(np.abs(result.as_numpy("y") - reference(model, batch))) <= TOLERANCE


# -- aio client ----------------------------------------------------------------------------------


def test_aio_health_and_metadata(server: RunningServer) -> None:
    async def scenario() -> None:
        client = aiohttpclient.InferenceServerClient(server.http)
        try:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready("resnet")
            assert not await client.is_model_ready("no-such-model")
            assert (await client.get_server_metadata())["name"] == "duetime"
            metadata = await client.get_model_metadata("resnet")
            assert metadata["inputs"][0]["shape"] == [-1, 3, 64, 64]
            config = await client.get_model_config("mlp")
            assert config["max_batch_size"] == 64
        finally:
            await client.close()

    asyncio.run(scenario())


# tritonclient's aio client hands aiohttp the JSON body as bytes; over 1 MB aiohttp warns.
@pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("model", DEMO_MODELS, ids=lambda m: m.name)
def test_aio_infer_matches_onnxruntime(
    server: RunningServer, reference: Reference, model: DemoModel, binary: bool
) -> None:
    batches = {rows: model.batch(rows, seed=10 + rows) for rows in (1, 7)}

    async def infer(client: aiohttpclient.InferenceServerClient, rows: int) -> Any:
        tensor = aiohttpclient.InferInput(model.input, list(batches[rows].shape), "FP32")
        tensor.set_data_from_numpy(batches[rows], binary_data=binary)
        output = aiohttpclient.InferRequestedOutput(model.output, binary_data=binary)
        return await client.infer(
            model.name, [tensor], outputs=[output], request_id=f"aio-{rows}",
            timeout=5_000_000, priority=2,
        )  # fmt: skip

    async def scenario() -> list[Any]:
        client = aiohttpclient.InferenceServerClient(server.http)
        try:  # both in flight at once: the server may batch them together
            return list(await asyncio.gather(*(infer(client, rows) for rows in batches)))
        finally:
            await client.close()

    for rows, result in zip(batches, asyncio.run(scenario()), strict=True):
        assert result.get_response()["id"] == f"aio-{rows}"
        got = result.as_numpy(model.output)
        assert got.shape == (rows, model.classes)
        assert np.max(np.abs(got - reference(model, batches[rows]))) <= TOLERANCE


# -- every datatype ------------------------------------------------------------------------------


def test_dtypes_metadata(dtypes_server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(dtypes_server.http)
    try:
        metadata = client.get_model_metadata(DTYPES_MODEL)
        config = client.get_model_config(DTYPES_MODEL)
    finally:
        client.close()
    assert metadata["inputs"] == [
        {"name": input_name(d), "datatype": d, "shape": [-1, 3]} for d in DATATYPES
    ]
    assert [t["data_type"] for t in config["output"]] == [
        "TYPE_STRING" if d == "BYTES" else f"TYPE_{d}" for d in DATATYPES
    ]


def infer_identities(
    server: RunningServer,
    inputs: list[httpclient.InferInput],
    outputs: list[httpclient.InferRequestedOutput],
) -> Any:
    """One request to the identity model of every datatype, on a client of its own."""
    client = httpclient.InferenceServerClient(server.http)
    try:
        return client.infer(DTYPES_MODEL, inputs, outputs=outputs)
    finally:
        client.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_datatype_round_trips(dtypes_server: RunningServer, binary: bool) -> None:
    samples = dtype_samples(DATATYPES)
    inputs = [
        make_input(input_name(d), samples[input_name(d)], d, binary=binary) for d in DATATYPES
    ]
    outputs = [
        httpclient.InferRequestedOutput(output_name(d), binary_data=binary) for d in DATATYPES
    ]
    result = infer_identities(dtypes_server, inputs, outputs)
    assert_echoed(result, samples, DATATYPES)


def test_every_datatype_round_trips_from_a_header_sent_again(dtypes_server: RunningServer) -> None:
    """The same JSON header with other tensor bytes: a server that kept the header decoded must
    still read each request's own values (the first request decodes it, the others reuse it)."""
    client = httpclient.InferenceServerClient(dtypes_server.http)
    try:
        for shift in range(3):
            samples = {k: np.roll(v, shift, axis=1) for k, v in dtype_samples(DATATYPES).items()}
            inputs = [
                make_input(input_name(d), samples[input_name(d)], d, binary=True) for d in DATATYPES
            ]
            outputs = [httpclient.InferRequestedOutput(output_name(d)) for d in DATATYPES]
            assert_echoed(client.infer(DTYPES_MODEL, inputs, outputs=outputs), samples, DATATYPES)
    finally:
        client.close()


def test_non_finite_floats_round_trip_as_json_tokens_like_triton(
    dtypes_server: RunningServer,
) -> None:
    """tritonclient writes NaN and ±Infinity into a JSON request (Python's json does); Triton
    reads them and writes them back so, where orjson alone would refuse them and write null."""
    floats = ["FP16", "FP32", "FP64"]
    samples = dtype_samples(DATATYPES)
    for datatype, dtype in zip(floats, (np.float16, np.float32, np.float64), strict=True):
        samples[input_name(datatype)] = np.array([[np.nan, np.inf, -np.inf], [0.5, -0.0, 2]], dtype)
    inputs = [make_input(input_name(d), samples[input_name(d)], d, binary=False) for d in DATATYPES]
    outputs = [httpclient.InferRequestedOutput(output_name(d), binary_data=False) for d in floats]
    result = infer_identities(dtypes_server, inputs, outputs)
    assert_echoed(result, samples, floats)


def test_requested_output_subset(dtypes_server: RunningServer) -> None:
    samples = dtype_samples(DATATYPES)
    inputs = [make_input(input_name(d), samples[input_name(d)], d, binary=True) for d in DATATYPES]
    wanted = ["UINT64", "BYTES", "FP16"]
    outputs = [
        httpclient.InferRequestedOutput(output_name(d), binary_data=d != "BYTES") for d in wanted
    ]
    result = infer_identities(dtypes_server, inputs, outputs)
    assert [o["name"] for o in result.get_response()["outputs"]] == [output_name(d) for d in wanted]
    assert_echoed(result, samples, wanted)


def assert_classes(got: np.ndarray, logits: np.ndarray, count: int) -> None:
    """`got` holds Triton's classification strings of each row of `logits`: b"<value>:<index>",
    the `count` highest values first, each value printed with six decimals."""
    assert got.shape == (len(logits), count)
    for strings, row in zip(got.tolist(), logits, strict=True):
        texts = [item.decode() if isinstance(item, bytes) else item for item in strings]
        pairs = [text.split(":") for text in texts]  # (JSON gives str, binary bytes)
        assert [int(index) for _, index in pairs] == list(np.argsort(-row, kind="stable")[:count])
        assert all(len(value.split(".")[1]) == 6 for value, _ in pairs)
        values = np.array([float(value) for value, _ in pairs])
        assert np.max(np.abs(values - np.sort(row)[::-1][:count])) <= 1e-5


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_classification_extension(
    client: httpclient.InferenceServerClient, reference: Reference, binary: bool
) -> None:
    model = DEMO_MODELS[0]
    batch = model.batch(3, seed=5)
    result = client.infer(
        model.name,
        [make_input(model.input, batch, "FP32", binary=binary)],
        outputs=[httpclient.InferRequestedOutput(model.output, binary_data=binary, class_count=2)],
    )
    got = result.as_numpy(model.output)
    assert got is not None
    assert_classes(got, reference(model, batch), 2)
    assert "classification" in client.get_server_metadata()["extensions"]
