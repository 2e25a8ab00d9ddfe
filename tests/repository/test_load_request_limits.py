"""Load requests a client can shape badly: names the file system cannot hold, uploads too deep
or of too many files, and failed uploads of names the repository does not have.

Each is a client's error (400 / INVALID_ARGUMENT) that changes nothing served and leaves the
server ready; the engine tests run under `asyncio.run` against a repository in tmp_path.
"""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import pytest
from conftest import RunningServer, explicit_serving
from repo_models import scale_model, write_version
from tritonclient.grpc import service_pb2, service_pb2_grpc

from duetime.config import ModelConfig
from duetime.engine import Engine
from duetime.errors import InvalidInput, ModelNotFound
from duetime.repository import manager as manager_module
from duetime.repository.manager import RepositoryOptions

pytestmark = pytest.mark.timeout(60)

Scenario = Callable[[Engine], Awaitable[None]]

LONG_NAME = "é" * 130
"""130 characters, 260 bytes in UTF-8: over the file system's 255 (NAME_MAX)."""


def run(repo: Path, scenario: Scenario) -> None:
    """`scenario` on an engine of `repo` in explicit mode, with model 'm' loaded."""

    async def main() -> None:
        options = RepositoryOptions(control_mode="explicit", startup_models=("m",))
        engine = await Engine.start(repo, options=options)
        try:
            await scenario(engine)
        finally:
            await engine.aclose()

    write_version(repo, "m", 1, scale_model(1))
    asyncio.run(main())


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("repo")
    write_version(repo, "m", 1, scale_model(1))
    with explicit_serving(repo, "m") as running:
        yield running


def call(
    server: RunningServer, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    """The status and JSON answer of one HTTP request (`path` percent-encoded here)."""
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(method, quote(path), json.dumps(body) if body is not None else None)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


# -- names ---------------------------------------------------------------------------------------


def test_a_model_name_over_255_bytes_is_refused_over_http_and_grpc(
    explicit_server: RunningServer,
) -> None:
    """'é' * 130 is 130 characters but 260 bytes: it passed a limit of 255 characters, and the
    file system's 'File name too long' came back as 500 / UNKNOWN."""
    status, answer = call(explicit_server, "POST", f"/v2/repository/models/{LONG_NAME}/load")
    assert status == 400, answer
    assert "at most 255 bytes in UTF-8 (it is 260 bytes long)" in answer["error"]
    with grpc.insecure_channel(explicit_server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.RepositoryModelLoadRequest(model_name=LONG_NAME)
        with pytest.raises(grpc.RpcError) as refused:
            stub.RepositoryModelLoad(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "260 bytes long" in (refused.value.details() or "")
    assert call(explicit_server, "GET", "/v2/health/ready")[0] == 200


def test_a_name_of_255_bytes_is_a_name(tmp_path: Path) -> None:
    """The limit is the file system's: a folder of 255 bytes is a model like any other."""
    name = "é" * 127 + "x"  # 255 bytes

    async def scenario(engine: Engine) -> None:
        await engine.load_model(name, ModelConfig(), files={"1/model.onnx": scale_model(3)})
        assert name in engine.registry.snapshot.models

    run(tmp_path, scenario)


# -- uploads -------------------------------------------------------------------------------------


def test_an_upload_path_of_too_many_parts_is_refused_naming_the_limit(
    tmp_path: Path, explicit_server: RunningServer
) -> None:
    """A path of 2,000 parts overflowed the stack making its folders (RecursionError: 500 /
    UNKNOWN); one of `MAX_UPLOAD_DEPTH` parts is written."""
    deep = "/".join(["d"] * 2000) + "/f"
    depth = manager_module.MAX_UPLOAD_DEPTH
    model = scale_model(3)
    parameters = {"config": "{}", "file:1/model.onnx": "", f"file:{deep}": ""}
    status, answer = call(
        explicit_server, "POST", "/v2/repository/models/up/load", {"parameters": parameters}
    )
    assert status == 400, answer
    assert f"more than {depth} parts" in answer["error"]

    async def scenario(engine: Engine) -> None:
        with pytest.raises(InvalidInput, match=f"more than {depth} parts"):
            await engine.load_model("up", ModelConfig(), files={"1/model.onnx": model, deep: b""})
        deepest = "/".join(["d"] * (depth - 1)) + "/f"
        await engine.load_model("up", ModelConfig(), files={"1/model.onnx": model, deepest: b""})
        assert "up" in engine.registry.snapshot.models

    run(tmp_path, scenario)


def test_an_upload_of_too_many_files_is_refused_before_any_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load of 100,000 empty `file:` entries kept the loader thread writing for over 30 s
    (a 64 MiB body holds millions); over `MAX_UPLOAD_FILES` nothing is written."""
    written: list[str] = []
    real = manager_module._write_upload

    def recording(name: str, files: dict[str, bytes]) -> Path:
        written.append(name)
        return real(name, files)

    monkeypatch.setattr(manager_module, "_write_upload", recording)
    limit = manager_module.MAX_UPLOAD_FILES
    files = {f"1/extra/{i}": b"" for i in range(limit)}
    files["1/model.onnx"] = scale_model(3)

    async def scenario(engine: Engine) -> None:
        with pytest.raises(InvalidInput, match=f"over the limit of {limit}"):
            await engine.load_model("up", ModelConfig(), files=files)
        assert written == []
        assert "up" not in engine.registry.snapshot.models
        del files["1/extra/0"]  # (at the limit: loaded)
        await engine.load_model("up", ModelConfig(), files=files)
        assert "up" in engine.registry.snapshot.models

    run(tmp_path, scenario)


# -- failed uploads ------------------------------------------------------------------------------


def test_a_failed_upload_of_a_name_with_no_folder_leaves_no_trace(tmp_path: Path) -> None:
    """It made the server unready (strict readiness) while the index listed nothing wrong, and
    requests for the name got 503 quoting the upload's failure: anyone allowed to load could
    take a replica out of service."""

    async def scenario(engine: Engine) -> None:
        assert engine.ready
        files = {"1/model.onnx": b"not an onnx model"}
        with pytest.raises(InvalidInput, match="ONNX Runtime cannot load it") as caught:
            await engine.load_model("brandnew", ModelConfig(), files=files)
        # named by its load parameter, not the temporary folder it was written to (a tester)
        assert "file:1/model.onnx: ONNX Runtime cannot load it" in caught.value.message
        assert "duetime-upload" not in caught.value.message
        assert engine.ready
        assert [e["name"] for e in engine.repository_index()] == ["m"]
        with pytest.raises(ModelNotFound):
            await engine.infer_async("brandnew", {})

    run(tmp_path, scenario)


def test_a_failed_upload_of_a_new_name_keeps_the_server_ready_over_http(
    explicit_server: RunningServer,
) -> None:
    """The same failed upload over HTTP: the load answers 400, and readiness stays 200."""
    parameters = {"config": "{}", "file:1/model.onnx": "bm90IG9ubng="}  # 'not onnx'
    status, answer = call(
        explicit_server, "POST", "/v2/repository/models/brandnew/load", {"parameters": parameters}
    )
    assert status == 400, answer
    assert call(explicit_server, "GET", "/v2/health/ready")[0] == 200
    status, answer = call(explicit_server, "POST", "/v2/models/brandnew/infer", {"inputs": []})
    assert status == 404, answer
