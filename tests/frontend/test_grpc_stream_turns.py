"""ModelStreamInfer answers go out in request order: one its model made in time but whose turn
came after its due time is sent as a DEADLINE_EXCEEDED error, never a late success; what is
sent is measured against the message limit, answers and errors alike, and the stream goes on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import RunningServer, serving
from repo_models import heavy_model, scale_model, write_version
from tritonclient.grpc import service_pb2

from duetime.config import ServerSettings
from duetime.frontend.grpc import FINAL_RESPONSE

pytestmark = pytest.mark.timeout(90)

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
INFER = "/inference.GRPCInferenceService/ModelInfer"
LIMIT = 1024 * 1024
"""The server's --max-grpc-message-bytes."""
ROWS = 60_000
"""Rows of a scale request whose answer comes close to `LIMIT` (16 bytes a row)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("stream-turns")
    write_version(repo, "scale", 1, scale_model(2.0))
    (repo / "scale" / "config.toml").write_text("max_batch_size = 65536\n")
    write_version(repo, "slow", 1, heavy_model(2.0, depth=64))  # (64 rows: 0.1-0.4 s a run)
    (repo / "slow" / "config.toml").write_text("max_batch_size = 64\n")
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, max_grpc_message_bytes=LIMIT
    )
    with serving(settings) as running:
        yield running


def request(model: str, request_id: str, rows: int = 1, timeout_us: int | None = None) -> Any:
    message = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    message.inputs.add(name="x", datatype="FP32", shape=[rows, 4])
    message.raw_input_contents.append(np.ones((rows, 4), np.float32).tobytes())
    if timeout_us is not None:
        message.parameters["timeout"].int64_param = timeout_us
    return message


def channel(server: RunningServer) -> grpc.Channel:
    unlimited = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    return grpc.insecure_channel(server.grpc, options=unlimited)


def stream(server: RunningServer, requests: list[Any]) -> list[Any]:
    """Every answer of one ModelStreamInfer call (its status, if not OK, raised)."""
    with channel(server) as open_channel:
        call = open_channel.stream_stream(
            STREAM,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        return list(call(iter(requests), timeout=60))


def test_an_answer_held_past_its_due_time_behind_earlier_ones_is_sent_as_expired(
    server: RunningServer,
) -> None:
    held_before = server.statistics("scale").answers_failed.get("held_late", 0)
    answers = stream(server, [
        request("slow", "slow", rows=64),
        request("slow", "slower", rows=64),  # (its run after the first's)
        # (ready at once, its turn 0.2-0.8 s on; NOTE: due in 100 ms, it raced a 0.1 s run of
        # 'slow' on the VM and was sent in time, a success, in 3 runs of 6; due in 30 ms behind
        # one run, it was sent in time once on CI: the client's thread, sharing the process
        # and the 2 cores with the server, may send it well after the first)
        request("scale", "due", timeout_us=30_000),
        request("scale", "patient", timeout_us=60_000_000),
    ])  # fmt: skip
    ids = [answer.infer_response.id for answer in answers]
    assert ids == ["slow", "slower", "due", "patient"]
    slow, slower, due, patient = answers
    assert not slow.error_message
    assert not slower.error_message
    assert not patient.error_message
    assert due.error_message.startswith("Request timeout expired: model 'scale'")
    assert "held behind earlier answers on the stream" in due.error_message
    assert due.infer_response.parameters[FINAL_RESPONSE].bool_param
    assert not due.infer_response.outputs
    # (its client got an error: its model counts an answer it could not deliver)
    assert server.statistics("scale").answers_failed["held_late"] == held_before + 1


def test_an_answer_that_fits_only_without_its_stream_wrapper_fails_alone(
    server: RunningServer,
) -> None:
    with channel(server) as open_channel:
        infer = open_channel.unary_unary(
            INFER,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        base = infer(request("scale", "", ROWS)).ByteSize()
        edge = request("scale", "i" * (LIMIT - 10 - base - 2), ROWS)
        assert LIMIT - 20 < infer(edge).ByteSize() <= LIMIT  # (a unary answer fits)
    answers = stream(server, [request("scale", "before"), edge, request("scale", "after")])
    assert [answer.infer_response.id[:6] for answer in answers] == ["before", "iiiiii", "after"]
    assert "over the gRPC message limit of 1048576 bytes" in answers[1].error_message
    assert not answers[0].error_message
    assert not answers[2].error_message


def test_an_error_too_big_for_a_message_is_cut_to_fit(server: RunningServer) -> None:
    unknown = service_pb2.ModelInferRequest(model_name="no-such-model", id="i" * (LIMIT - 100))
    answers = stream(server, [request("scale", "before"), unknown, request("scale", "after")])
    assert [answer.infer_response.id[:6] for answer in answers] == ["before", "iiiiii", "after"]
    error = answers[1]
    assert "no-such-model" in error.error_message
    assert len(error.infer_response.id) < LIMIT // 2  # (cut)
    assert error.infer_response.parameters[FINAL_RESPONSE].bool_param
    assert error.ByteSize() <= LIMIT
