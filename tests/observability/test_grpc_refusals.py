"""gRPC inference requests answered with an error before any model ran them count in
`duetime_requests_refused_total{protocol="grpc"}`, as HTTP's do: undecodable bytes, a bad
'timeout', an unknown model, a request its model's validation refuses, on ModelInfer and on a
stream. (Only HTTP's refusals were counted: gRPC's moved no metric.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import RunningServer, serving
from repo_models import scale_model, write_version
from tritonclient.grpc import service_pb2

from duetime.config import ServerSettings

pytestmark = pytest.mark.timeout(60)

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root: Path = tmp_path_factory.mktemp("grpc-refusals")
    write_version(root, "scale", 1, scale_model(2.0))
    with serving(ServerSettings(model_repository=root, http_port=0, grpc_port=0)) as running:
        yield running


def refused(server: RunningServer) -> dict[tuple[str, ...], float]:
    counts = server.samples("duetime_requests_refused_total", "protocol", "status", "reason")
    assert not any("made-up-model" in "".join(key) for key in counts)  # (no client's label)
    return counts


def request(model: str = "scale", width: int = 4, timeout: int | None = None) -> Any:
    """A request of the scale model (x FP32 [1, 4]); another width is invalid."""
    message = service_pb2.ModelInferRequest(model_name=model)
    message.inputs.add(name="x", datatype="FP32", shape=[1, width])
    message.raw_input_contents.append(np.ones((1, width), np.float32).tobytes())
    if timeout is not None:
        message.parameters["timeout"].int64_param = timeout
    return message


def call(server: RunningServer, data: bytes) -> grpc.StatusCode:
    with grpc.insecure_channel(server.grpc) as channel:
        infer = channel.unary_unary(
            INFER, response_deserializer=service_pb2.ModelInferResponse.FromString
        )
        try:
            infer(data, timeout=30)
        except grpc.RpcError as error:
            return error.code()
        return grpc.StatusCode.OK


def test_model_infer_refusals_are_counted(server: RunningServer) -> None:
    before = refused(server)
    assert call(server, b"\xff\xff\xff garbage") == grpc.StatusCode.INVALID_ARGUMENT
    assert call(server, request(timeout=-5).SerializeToString()) == grpc.StatusCode.INVALID_ARGUMENT
    assert call(server, request(width=3).SerializeToString()) == grpc.StatusCode.INVALID_ARGUMENT
    assert call(server, request("made-up-model").SerializeToString()) == grpc.StatusCode.NOT_FOUND
    assert call(server, request().SerializeToString()) == grpc.StatusCode.OK
    after = refused(server)

    def more(key: tuple[str, str, str]) -> float:
        return after.get(key, 0) - before.get(key, 0)

    assert more(("grpc", "INVALID_ARGUMENT", "InvalidInput")) == 3
    assert more(("grpc", "NOT_FOUND", "ModelNotFound")) == 1
    assert sum(after.values()) - sum(before.values()) == 4  # (the answered one: not refused)


def test_streamed_refusals_are_counted(server: RunningServer) -> None:
    before = refused(server)
    requests = [request(), request(width=3), request("made-up-model"), request()]
    with grpc.insecure_channel(server.grpc) as channel:
        stream = channel.stream_stream(
            STREAM,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        answers = list(stream(iter(requests), timeout=30))
    assert [bool(a.error_message) for a in answers] == [False, True, True, False]
    after = refused(server)

    def more(key: tuple[str, str, str]) -> float:
        return after.get(key, 0) - before.get(key, 0)

    assert more(("grpc", "INVALID_ARGUMENT", "InvalidInput")) == 1
    assert more(("grpc", "NOT_FOUND", "ModelNotFound")) == 1


def test_a_refusals_log_line_names_the_grpc_code_its_client_got(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    """It named the HTTP status of the same refusal (`grpc scale 400: ...`), a status a gRPC
    client never sees (found by a tester); the HTTP one stays a field, for both protocols."""
    with caplog.at_level(logging.INFO, logger="duetime.requests"):
        assert (
            call(server, request(width=3).SerializeToString()) == grpc.StatusCode.INVALID_ARGUMENT
        )
        with grpc.insecure_channel(server.grpc) as channel:
            stream = channel.stream_stream(
                STREAM,
                request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
            )
            [answer] = stream(iter([request("made-up-model")]), timeout=30)
        assert answer.error_message
    lines = {
        r.protocol: r  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "duetime.requests" and r.model in ("scale", "made-up-model")  # type: ignore[attr-defined]
    }
    unary, streamed = lines["grpc"], lines["grpc-stream"]
    assert unary.getMessage().startswith("grpc scale INVALID_ARGUMENT: ")
    assert (unary.grpc_code, unary.status) == ("INVALID_ARGUMENT", 400)  # type: ignore[attr-defined]
    assert streamed.getMessage().startswith("grpc-stream made-up-model NOT_FOUND: ")
    assert (streamed.grpc_code, streamed.status) == ("NOT_FOUND", 404)  # type: ignore[attr-defined]
