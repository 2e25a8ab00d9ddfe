"""A repository load (or unload) in flight when the server stops: its caller hears 503 /
UNAVAILABLE "the server is shutting down; retry on another replica", not a connection closed
with no response (HTTP) or a call held until gRPC's grace ran out (gRPC)."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from conftest import start_server, stop_server
from repo_models import scale_model, write_version

from duetime.config import ServerSettings
from duetime.errors import DuetimeError
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.frontend.proto import grpc_service_pb2_grpc as pb_grpc
from duetime.frontend.rest import ControlCall, Reply, error_reply
from tests.repository.test_load_ends import Gate, opened

pytestmark = pytest.mark.timeout(120)

SHUTTING_DOWN = "the server is shutting down; retry on another replica"


def http_load(address: str, answers: list[tuple[int, str]]) -> None:
    request = urllib.request.Request(
        f"http://{address}/v2/repository/models/m/load", b"{}", method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            answers.append((answer.status, answer.read().decode()))
    except urllib.error.HTTPError as error:
        answers.append((error.code, error.read().decode()))


def grpc_load(address: str, answers: list[tuple[grpc.StatusCode, str]]) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="m"), timeout=60)
            answers.append((grpc.StatusCode.OK, ""))
        except grpc.RpcError as error:
            answers.append((error.code(), error.details() or ""))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_load_under_way_at_stop_is_answered_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    """The stop cancels the load (`ModelManager.aclose`): HTTP's answer was never sent (the
    client read "Remote end closed connection without response"); gRPC's call ended only at
    the end of gRPC's grace, "Cancelling all calls"."""
    write_version(tmp_path, "m", 1, scale_model(1.0))
    settings = ServerSettings(
        model_repository=tmp_path, http_port=0, grpc_port=0, model_control_mode="explicit",
        load_model=("m",), shutdown_grace_s=30.0,
    )  # fmt: skip
    running, thread = start_server(settings)
    write_version(tmp_path, "m", 2, scale_model(2.0))
    gate = Gate("m")
    gate.patch(monkeypatch)
    answers: list[tuple[object, str]] = []
    with opened(gate):
        if protocol == "http":
            client = threading.Thread(target=http_load, args=(running.http, answers))
        else:
            client = threading.Thread(target=grpc_load, args=(running.grpc, answers))
        client.start()
        assert gate.entered.wait(30), "the load never started"
        stop_server(running, thread)  # (returns once the stop has ended: no grace ran out)
        client.join(30)
    ((status, text),) = answers
    if protocol == "http":
        assert status == 503, text
        text = json.loads(text)["error"]
    else:
        assert status == grpc.StatusCode.UNAVAILABLE, text
    assert "the load of model 'm' did not finish" in text
    assert SHUTTING_DOWN in text


def test_a_cancelled_repository_operation_is_answered_503() -> None:
    """An unload (or load) the shutdown cancels: its future was never resolved."""

    async def main() -> Reply:
        async def cancelled() -> None:
            raise asyncio.CancelledError

        def failed(exc: DuetimeError) -> Reply:
            return error_reply(exc)

        pending = ControlCall.start(cancelled(), Reply(200), failed)
        call = pending.ticket
        assert isinstance(call, ControlCall)
        return await asyncio.wait_for(asyncio.shield(call.future), 10)

    reply = asyncio.run(main())
    assert reply.status == 503
    assert SHUTTING_DOWN.encode() in bytes(reply.body)
