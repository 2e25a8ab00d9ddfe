"""ModelStreamInfer errors: in the stream (`error_message`) by default; with Triton's
`triton_grpc_error: true` header, the first one ends the stream with its gRPC status code."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import RunningServer, start_server, stop_server
from repo_models import scale_model, write_version
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from duetime.config import ServerSettings

pytestmark = pytest.mark.timeout(60)

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root: Path = tmp_path_factory.mktemp("stream-errors")
    write_version(root, "scale", 1, scale_model(2.0))
    running, thread = start_server(ServerSettings(model_repository=root, http_port=0, grpc_port=0))
    yield running
    stop_server(running, thread)


def request(request_id: str, width: int = 4) -> Any:
    """A request of the scale model (x FP32 [n, 4]); another width is invalid."""
    message = service_pb2.ModelInferRequest(model_name="scale", id=request_id)
    message.inputs.add(name="x", datatype="FP32", shape=[1, width])
    message.raw_input_contents.append(np.ones((1, width), np.float32).tobytes())
    return message


def stream(
    address: str, requests: list[Any], metadata: tuple[tuple[str, str], ...]
) -> Iterator[Any]:
    """The responses of one ModelStreamInfer call; the call's status raised at its end."""
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(
            STREAM,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        yield from call(iter(requests), metadata=metadata, timeout=30)


def test_with_the_header_the_first_error_ends_the_stream_with_its_status_code(
    server: RunningServer,
) -> None:
    answers = stream(
        server.grpc, [request("good"), request("bad", width=5), request("never")],
        metadata=(("triton_grpc_error", "true"),),
    )  # fmt: skip
    first = next(answers)
    with pytest.raises(grpc.RpcError) as raised:
        next(answers)
    assert first.infer_response.id == "good"
    assert not first.error_message
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'x'" in raised.value.details()
    assert "(trace " in raised.value.details()


def test_without_the_header_errors_stay_in_the_stream_and_it_goes_on(
    server: RunningServer,
) -> None:
    answers = list(stream(server.grpc, [request("bad", width=5), request("after")], metadata=()))
    assert [answer.infer_response.id for answer in answers] == ["bad", "after"]
    assert "input 'x'" in answers[0].error_message
    assert not answers[1].error_message


def test_a_tritonclient_stream_with_the_header_gets_the_status_code_and_is_closed(
    server: RunningServer,
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc)
    answers: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
    bad = grpcclient.InferInput("x", [1, 5], "FP32")
    bad.set_data_from_numpy(np.ones((1, 5), np.float32))
    try:
        client.start_stream(
            callback=lambda result, error: answers.put((result, error)),
            headers={"triton_grpc_error": "true"},
        )
        client.async_stream_infer("scale", [bad], request_id="bad")
        _, error = answers.get(timeout=30)
        with pytest.raises(InferenceServerException, match="no longer in valid state"):
            client.async_stream_infer("scale", [bad], request_id="after")
        client.stop_stream()
    finally:
        client.close()
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "input 'x'" in error.message()


@pytest.mark.parametrize("run", range(20))
def test_undecodable_bytes_end_the_stream_after_the_answers_before_them(
    server: RunningServer, run: int
) -> None:
    """What follows the bad bytes makes no difference. The stream stayed open until the
    client's deadline in 11 to 20 runs of 20 when a request followed them: its reader's abort
    raced the first answer, and was cancelled with the reader when the answer went first."""
    garbage = b"\xff\xff\xff"
    messages = [request("good").SerializeToString(), garbage, request("never").SerializeToString()]
    answers = []
    with grpc.insecure_channel(server.grpc) as channel:
        call = channel.stream_stream(
            STREAM, response_deserializer=service_pb2.ModelStreamInferResponse.FromString
        )
        with pytest.raises(grpc.RpcError) as raised:
            answers.extend(call(iter(messages), timeout=20))
    assert [answer.infer_response.id for answer in answers] == ["good"]
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details().startswith(
        "the request is not a valid inference.ModelInferRequest message: a field's key in the "
        "message (byte 0) is cut off: the bytes end inside it"
    )
