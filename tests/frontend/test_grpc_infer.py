"""tritonclient.grpc (sync and aio) against a real server: health, metadata, config, inference.

tritonclient always sends `raw_input_contents`; the typed `contents` path is driven with a
ModelInferRequest built by hand and sent through a plain grpc channel.
"""

from __future__ import annotations

import asyncio
import queue
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
from conftest import RunningServer, start_server, stop_server
from repo_models import stacking_model, write_version
from test_http_infer import (
    BY_NAME,
    DATATYPES,
    DEMO_MODELS,
    DTYPES_MODEL,
    TOLERANCE,
    TYPED_DATATYPES,
    TYPED_MODEL,
    DemoModel,
    Reference,
    assert_classes,
    assert_echoed,
    dtype_samples,
    dtypes_server,
    input_name,
    output_name,
    reference,
)
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from duetime.config import ServerSettings
from duetime.errors import InvalidInput
from duetime.frontend.grpc import requested_outputs

pytestmark = pytest.mark.timeout(60)

__all__ = ["dtypes_server", "reference"]  # fixtures shared with test_http_infer

#: v2 datatype -> the InferTensorContents field that carries it.
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}  # fmt: skip


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc)
    yield client
    client.close()


def make_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def test_health(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("mlp")
    assert client.is_model_ready("resnet", "1")
    assert not client.is_model_ready("no-such-model")
    assert not client.is_model_ready("mlp", "9")


def test_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "duetime"
    assert metadata["version"]
    assert {"binary_tensor_data", "model_configuration"} <= set(metadata["extensions"])


@pytest.mark.parametrize("model", DEMO_MODELS, ids=lambda m: m.name)
def test_model_metadata(client: grpcclient.InferenceServerClient, model: DemoModel) -> None:
    metadata = client.get_model_metadata(model.name)
    assert metadata.name == model.name
    assert list(metadata.versions) == ["1"]
    (tensor,) = metadata.inputs
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == (
        model.input, "FP32", [-1, *model.sample_shape]
    )  # fmt: skip
    (tensor,) = metadata.outputs
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == (
        model.output, "FP32", [-1, model.classes]
    )  # fmt: skip
    assert client.get_model_metadata(model.name, "1") == metadata


@pytest.mark.parametrize("model", DEMO_MODELS, ids=lambda m: m.name)
def test_model_config(client: grpcclient.InferenceServerClient, model: DemoModel) -> None:
    config = client.get_model_config(model.name, as_json=True)["config"]
    assert config["name"] == model.name
    assert config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == model.max_batch_size
    assert config["input"] == [
        {
            "name": model.input,
            "data_type": "TYPE_FP32",
            "dims": [str(d) for d in model.sample_shape],
        }
    ]  # int64 fields are strings in protobuf's JSON form
    assert config["output"][0]["dims"] == [str(model.classes)]


@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("model", DEMO_MODELS, ids=lambda m: m.name)
def test_infer_matches_onnxruntime(
    client: grpcclient.InferenceServerClient, reference: Reference, model: DemoModel, rows: int
) -> None:
    batch = model.batch(rows, seed=rows)
    result = client.infer(
        model.name,
        [make_input(model.input, batch, "FP32")],
        outputs=[grpcclient.InferRequestedOutput(model.output)],
        request_id=f"req-{model.name}-{rows}",
        client_timeout=30,
    )
    response = result.get_response()
    assert response.id == f"req-{model.name}-{rows}"
    assert (response.model_name, response.model_version) == (model.name, "1")
    got = result.as_numpy(model.output)
    assert got.dtype == np.float32
    assert got.shape == (rows, model.classes)
    assert np.max(np.abs(got - reference(model, batch))) <= TOLERANCE


@pytest.mark.parametrize(
    ("timeout_us", "priority"), [(10_000_000, 1), (0, 0), (1_000_000, 3)], ids=str
)
def test_timeout_and_priority_are_accepted(
    client: grpcclient.InferenceServerClient, reference: Reference, timeout_us: int, priority: int
) -> None:
    model = BY_NAME["mlp"]
    batch = model.batch(2)
    result = client.infer(
        "mlp", [make_input("x", batch, "FP32")], timeout=timeout_us, priority=priority,
        client_timeout=30,
    )  # fmt: skip
    assert np.max(np.abs(result.as_numpy("y") - reference(model, batch))) <= TOLERANCE


# -- aio client ----------------------------------------------------------------------------------


def test_aio_health_and_metadata(server: RunningServer) -> None:
    async def scenario() -> None:
        client = aiogrpcclient.InferenceServerClient(server.grpc)
        try:
            assert await client.is_server_live()
            assert await client.is_server_ready()
            assert await client.is_model_ready("resnet")
            assert not await client.is_model_ready("no-such-model")
            assert (await client.get_server_metadata()).name == "duetime"
            metadata = await client.get_model_metadata("resnet")
            assert list(metadata.inputs[0].shape) == [-1, 3, 64, 64]
            config = await client.get_model_config("mlp")
            assert config.config.max_batch_size == 64
        finally:
            await client.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("model", DEMO_MODELS, ids=lambda m: m.name)
def test_aio_infer_matches_onnxruntime(
    server: RunningServer, reference: Reference, model: DemoModel
) -> None:
    batches = {rows: model.batch(rows, seed=10 + rows) for rows in (1, 7)}

    async def infer(client: aiogrpcclient.InferenceServerClient, rows: int) -> Any:
        tensor = aiogrpcclient.InferInput(model.input, list(batches[rows].shape), "FP32")
        tensor.set_data_from_numpy(batches[rows])
        return await client.infer(
            model.name, [tensor], outputs=[aiogrpcclient.InferRequestedOutput(model.output)],
            request_id=f"aio-{rows}", timeout=5_000_000, priority=2, client_timeout=30,
        )  # fmt: skip

    async def scenario() -> list[Any]:
        client = aiogrpcclient.InferenceServerClient(server.grpc)
        try:  # both in flight at once: the server may batch them together
            return list(await asyncio.gather(*(infer(client, rows) for rows in batches)))
        finally:
            await client.close()

    for rows, result in zip(batches, asyncio.run(scenario()), strict=True):
        assert result.get_response().id == f"aio-{rows}"
        got = result.as_numpy(model.output)
        assert got.shape == (rows, model.classes)
        assert np.max(np.abs(got - reference(model, batches[rows]))) <= TOLERANCE


# -- every datatype ------------------------------------------------------------------------------


def test_every_datatype_round_trips_raw(dtypes_server: RunningServer) -> None:
    samples = dtype_samples(DATATYPES)
    inputs = [make_input(input_name(d), samples[input_name(d)], d) for d in DATATYPES]
    client = grpcclient.InferenceServerClient(dtypes_server.grpc)
    try:
        result = client.infer(DTYPES_MODEL, inputs, client_timeout=30)
    finally:
        client.close()
    assert [o.name for o in result.get_response().outputs] == [output_name(d) for d in DATATYPES]
    assert_echoed(result, samples, DATATYPES)


def test_requested_output_subset(dtypes_server: RunningServer) -> None:
    samples = dtype_samples(DATATYPES)
    inputs = [make_input(input_name(d), samples[input_name(d)], d) for d in DATATYPES]
    wanted = ["BYTES", "INT8", "FP64"]
    outputs = [grpcclient.InferRequestedOutput(output_name(d)) for d in wanted]
    client = grpcclient.InferenceServerClient(dtypes_server.grpc)
    try:
        result = client.infer(DTYPES_MODEL, inputs, outputs=outputs, client_timeout=30)
    finally:
        client.close()
    assert [o.name for o in result.get_response().outputs] == [output_name(d) for d in wanted]
    assert_echoed(result, samples, wanted)


def typed_request(model: str, samples: dict[str, np.ndarray], datatypes: list[str]) -> Any:
    """A ModelInferRequest carrying every input in typed `contents` (no raw contents)."""
    request = service_pb2.ModelInferRequest(model_name=model, id="typed")
    for datatype in datatypes:
        array = samples[input_name(datatype)]
        tensor = request.inputs.add(name=input_name(datatype), datatype=datatype, shape=array.shape)
        field = CONTENTS_FIELD.get(datatype, "fp32_contents")  # FP16 has none: sent as FP32 values
        getattr(tensor.contents, field).extend(array.reshape(-1).tolist())
    return request


def infer_stub(address: str, request: Any) -> Any:
    with grpc.insecure_channel(address) as channel:
        return service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)


def test_every_datatype_round_trips_typed(dtypes_server: RunningServer) -> None:
    samples = dtype_samples(TYPED_DATATYPES)
    response = infer_stub(dtypes_server.grpc, typed_request(TYPED_MODEL, samples, TYPED_DATATYPES))
    assert response.id == "typed"
    assert_echoed(grpcclient.InferResult(response), samples, TYPED_DATATYPES)


def test_fp16_in_typed_contents_is_refused(dtypes_server: RunningServer) -> None:
    samples = dtype_samples(DATATYPES)
    with pytest.raises(grpc.RpcError) as caught:
        infer_stub(dtypes_server.grpc, typed_request(DTYPES_MODEL, samples, DATATYPES))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'in_fp16'" in caught.value.details()
    assert "raw_input_contents" in caught.value.details()


# -- streaming -----------------------------------------------------------------------------------


def test_stream_infer_answers_in_order_and_survives_a_bad_request(
    server: RunningServer, reference: Reference
) -> None:
    model = BY_NAME["mlp"]
    answers: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        batches = [model.batch(1, seed=1), model.batch(3, seed=3)]
        client.async_stream_infer("mlp", [make_input("x", batches[0], "FP32")], request_id="a")
        client.async_stream_infer(
            "mlp", [make_input("x", batches[0][:, :20], "FP32")], request_id="b"
        )
        client.async_stream_infer("mlp", [make_input("x", batches[1], "FP32")], request_id="c")
        received = [answers.get(timeout=30) for _ in range(3)]
        client.stop_stream()
    finally:
        client.close()
    (first, no_error), (no_result, error), (third, _) = received
    assert no_error is None
    assert no_result is None
    assert "for model 'mlp'. Expected [-1,40], got [1,20]" in str(error)
    for result, batch, request_id in ((first, batches[0], "a"), (third, batches[1], "c")):
        assert result.get_response().id == request_id
        assert result.get_response().parameters["triton_final_response"].bool_param
        assert np.max(np.abs(result.as_numpy("y") - reference(model, batch))) <= TOLERANCE


@pytest.fixture(scope="module")
def small_messages_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A model whose answer is twice its request (y = Concat(x, x)), gRPC messages up to 4 KiB."""
    repo = tmp_path_factory.mktemp("small-messages")
    write_version(repo, "stack", 1, stacking_model())
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, max_grpc_message_bytes=4096
    )
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


def stack_request(rows: int, request_id: str) -> Any:
    request = service_pb2.ModelInferRequest(model_name="stack", id=request_id)
    request.inputs.add(name="x", datatype="FP32", shape=[rows, 4])
    request.raw_input_contents.append(np.ones((rows, 4), dtype=np.float32).tobytes())
    return request


def test_an_answer_over_the_message_limit_fails_its_request_not_the_stream(
    small_messages_server: RunningServer,
) -> None:
    """gRPC would end the whole stream ("Sent message larger than max"); the oversized answer is
    refused instead, as an error response carrying its request's id (as Triton's)."""
    limit = "over the gRPC message limit of 4096 bytes"
    with grpc.insecure_channel(small_messages_server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        requests = [stack_request(2, "a"), stack_request(200, "big"), stack_request(3, "c")]
        answers = list(stub.ModelStreamInfer(iter(requests), timeout=30))
        with pytest.raises(grpc.RpcError) as unary:
            stub.ModelInfer(stack_request(200, "alone"), timeout=30)
    assert [answer.infer_response.id for answer in answers] == ["a", "big", "c"]
    first, big, third = answers
    assert (first.error_message, third.error_message) == ("", "")
    assert [list(answer.infer_response.outputs[0].shape) for answer in (first, third)] == [
        [4, 4], [6, 4]
    ]  # fmt: skip
    assert limit in big.error_message
    assert big.infer_response.model_name == "stack"
    final = [a.infer_response.parameters["triton_final_response"].bool_param for a in answers]
    assert final == [True, True, True]
    assert unary.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert limit in str(unary.value.details())


@pytest.fixture(scope="module")
def waiting_server(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    RunningServer
]:  # fmt: skip
    """The demo resnet, whose batches wait up to 50 ms for more requests."""
    repo = tmp_path_factory.mktemp("waiting")
    shutil.copytree(demo_repo / "resnet", repo / "resnet")
    (repo / "resnet" / "config.toml").write_text(
        "max_batch_size = 32\n[scheduling]\nmax_queue_delay_us = 50000\n"
    )
    running, thread = start_server(ServerSettings(model_repository=repo, http_port=0, grpc_port=0))
    yield running
    stop_server(running, thread)


def test_stream_requests_run_concurrently_and_batch(waiting_server: RunningServer) -> None:
    """A stream's requests are submitted as they are read, not one after another's answer: the
    ones that arrive while a batch waits for company join it.

    NOTE: with no wait allowed, whether two of them met depended on the machine's speed."""
    server = waiting_server
    model = BY_NAME["resnet"]
    answers: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
    stats = grpcclient.InferenceServerClient(server.grpc)

    def executions() -> tuple[int, int]:
        entry = stats.get_inference_statistics("resnet", as_json=True)["model_stats"][0]
        return int(entry.get("execution_count", 0)), int(entry.get("inference_count", 0))

    before = executions()
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for index in range(24):
            batch = model.batch(1, seed=index)
            client.async_stream_infer(
                "resnet", [make_input("image", batch, "FP32")], request_id=str(index)
            )
        received = [answers.get(timeout=30) for _ in range(24)]
        client.stop_stream()
    finally:
        client.close()
    assert [error for _, error in received] == [None] * 24
    assert [result.get_response().id for result, _ in received] == [str(i) for i in range(24)]
    after = executions()
    runs, rows = after[0] - before[0], after[1] - before[1]
    assert rows == 24
    assert runs < 24  # some requests of the stream shared a batch
    stats.close()


def test_classification_extension(
    client: grpcclient.InferenceServerClient, reference: Reference
) -> None:
    model = DEMO_MODELS[1]
    batch = model.batch(2, seed=9)
    result = client.infer(
        model.name,
        [make_input(model.input, batch, "FP32")],
        outputs=[grpcclient.InferRequestedOutput(model.output, class_count=20)],
        client_timeout=30,
    )
    # more classes asked for than there are: all of them
    assert_classes(result.as_numpy(model.output), reference(model, batch), model.classes)


@pytest.mark.parametrize(
    ("first", "again", "needle"),
    [
        ({}, {"class_count": 1}, "classification 1 (first none)"),
        ({"class_count": 3}, {"class_count": 2}, "classification 2 (first 3)"),
    ],
    ids=["plain-then-classes", "class-counts"],
)
def test_an_output_requested_twice_in_two_ways_is_refused_as_over_http(
    client: grpcclient.InferenceServerClient, first: dict[str, int], again: dict[str, int],
    needle: str,
) -> None:  # fmt: skip
    """gRPC answered one of the two asks without a word (the first class count) where HTTP
    refused the same request 400 (test_http_request_checks)."""
    model = DEMO_MODELS[0]
    outputs = [
        grpcclient.InferRequestedOutput(model.output, **first),
        grpcclient.InferRequestedOutput(model.output, **again),
    ]
    with pytest.raises(InferenceServerException) as caught:
        client.infer(
            model.name, [make_input(model.input, model.batch(1, seed=1), "FP32")],
            outputs=outputs, client_timeout=30,
        )  # fmt: skip
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    message = caught.value.message()
    assert f"output '{model.output}' is requested more than once with different parameters: " in (
        message
    )
    assert f"{needle}; request it once, or the same way each time" in message


def _request_for_y(*windows: dict[str, Any]) -> Any:
    """A ModelInferRequest asking for output 'y' once per entry of `windows` (its shared-memory
    parameters; {}: inline)."""
    request = service_pb2.ModelInferRequest(model_name="mlp")
    for window in windows:
        output = request.outputs.add(name="y")
        for key, value in window.items():
            field = "string_param" if isinstance(value, str) else "int64_param"
            setattr(output.parameters[key], field, value)
    return request


SHM_Y = {"shared_memory_region": "out", "shared_memory_byte_size": 12}


@pytest.mark.parametrize(
    ("windows", "needle"),
    [
        (({}, SHM_Y), "shared memory region 'out' at 0 (12 bytes) (first none)"),
        (
            (SHM_Y, {**SHM_Y, "shared_memory_offset": 12}),
            "shared memory region 'out' at 12 (12 bytes) (first region 'out' at 0 (12 bytes))",
        ),
    ],
    ids=["inline-then-shared", "two-places"],
)
def test_an_output_written_to_two_places_is_refused_as_over_http(
    windows: tuple[dict[str, Any], ...], needle: str
) -> None:
    """The shared-memory copy won, leaving the inline ask without its data."""
    with pytest.raises(InvalidInput, match=re.escape(needle)):
        requested_outputs(_request_for_y(*windows))


def test_an_output_requested_twice_the_same_way_is_taken() -> None:
    requested = requested_outputs(_request_for_y(SHM_Y, SHM_Y))
    assert requested.shared is not None
    assert requested.shared["y"].offset == 0
    assert requested_outputs(_request_for_y({}, {})).classes is None


@pytest.mark.parametrize("method", ["ModelInfer", "ServerLive", "ModelStreamInfer"])
def test_bytes_that_are_no_protobuf_message_are_invalid_argument(
    server: RunningServer, method: str, caplog: pytest.LogCaptureFixture
) -> None:
    """grpcio answered UNKNOWN "Unexpected <class 'DecodeError'>" and logged a traceback for
    each such call: a client sending garbage filled the server's log."""
    garbage = b"\xff\xff\xff\xff\xff\xff"
    path = f"/inference.GRPCInferenceService/{method}"

    def call(channel: grpc.Channel) -> object:
        if method == "ModelStreamInfer":
            return list(channel.stream_stream(path)(iter([garbage]), timeout=10))
        return channel.unary_unary(path)(garbage, timeout=10)

    with (
        grpc.insecure_channel(server.grpc) as channel,
        caplog.at_level("ERROR"),
        pytest.raises(grpc.RpcError) as caught,
    ):
        call(channel)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    message = {"ServerLive": "ServerLiveRequest"}.get(method, "ModelInferRequest")
    assert caught.value.details().startswith(
        f"the request is not a valid inference.{message} message: a field's key in the "
        "message (byte 0) is cut off"
    )
    assert "Traceback" not in caplog.text
    assert "deserializ" not in caplog.text.lower()


def test_a_message_protobuf_refuses_is_told_which_field_is_wrong(server: RunningServer) -> None:
    """protobuf's parser says only "Error parsing message with type ...": the client is told
    the field (an input's name that is not UTF-8; raw contents cut short) and its byte."""
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="xx", datatype="FP32", shape=[1, 40])
    request.raw_input_contents.append(np.zeros((1, 40), np.float32).tobytes())
    data = request.SerializeToString()
    cases = {
        data.replace(b"xx", b"x\xff"): "field 'inputs[0].name' is a string but is not valid UTF-8",
        data[:-10]: "field 'raw_input_contents[0]' (byte ",
    }
    with grpc.insecure_channel(server.grpc) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for bad, expected in cases.items():
            with pytest.raises(grpc.RpcError) as caught:
                call(bad, timeout=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert expected in caught.value.details()
