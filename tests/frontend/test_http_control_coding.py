"""Control requests (repository load and unload, index, log and trace settings, shared memory)
with a compressed body have it inflated, as an inference body is; a per-model trace setting
checks the control token before it looks the model up."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import RunningServer, serving
from repo_models import scale_model, write_version

from duetime.config import ServerSettings

pytestmark = pytest.mark.timeout(120)

TOKEN = "t" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}
COMPRESS: dict[str, Callable[[bytes], bytes]] = {"gzip": gzip.compress, "deflate": zlib.compress}


@pytest.fixture(scope="module")
def control_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("repo")
    write_version(repo, "m", 1, scale_model(2))
    write_version(repo, "n", 1, scale_model(3))
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, model_control_mode="explicit",
        load_model=["m"], control_token=TOKEN, max_body_bytes=1 << 20,
    )  # fmt: skip
    with serving(settings) as running:
        yield running


def _call(
    server: RunningServer, method: str, path: str, body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:  # fmt: skip
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request(method, path, body, headers or {})
        response = connection.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data else None
    finally:
        connection.close()


def _compressed(doc: dict[str, Any], coding: str) -> tuple[bytes, dict[str, str]]:
    body = COMPRESS[coding](json.dumps(doc).encode())
    return body, {"Content-Encoding": coding, "Content-Type": "application/json", **AUTH}


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compressed_settings_and_index_requests_are_inflated(
    control_server: RunningServer, coding: str
) -> None:
    body, headers = _compressed({"log_verbose_level": 0}, coding)
    status, doc = _call(control_server, "POST", "/v2/logging", body, headers)
    assert status == 200, doc
    assert doc["log_verbose_level"] == 0

    body, headers = _compressed({"trace_level": ["OFF"]}, coding)
    status, doc = _call(control_server, "POST", "/v2/trace/setting", body, headers)
    assert status == 200, doc
    assert doc["trace_level"] == ["OFF"]
    status, doc = _call(control_server, "POST", "/v2/models/m/trace/setting", body, headers)
    assert status == 200, doc

    body, headers = _compressed({"ready": True}, coding)
    status, doc = _call(control_server, "POST", "/v2/repository/index", body, headers)
    assert status == 200, doc
    assert [entry["name"] for entry in doc] == ["m"]


def test_a_compressed_load_with_its_files_and_a_compressed_unload(
    control_server: RunningServer,
) -> None:
    config = json.dumps({"max_batch_size": 4})
    model = base64.b64encode(scale_model(5)).decode()
    doc = {"parameters": {"config": config, "file:1/model.onnx": model}}
    body, headers = _compressed(doc, "gzip")
    status, answer = _call(control_server, "POST", "/v2/repository/models/n/load", body, headers)
    assert status == 200, answer
    status, answer = _call(control_server, "GET", "/v2/models/n/config")
    assert status == 200, answer
    assert answer["max_batch_size"] == 4
    x = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
    infer = json.dumps({"inputs": [x]}).encode()
    status, answer = _call(control_server, "POST", "/v2/models/n/infer", infer)
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [5, 10, 15, 20]  # the uploaded model, not the disk's

    body, headers = _compressed({"parameters": {}}, "deflate")
    status, answer = _call(control_server, "POST", "/v2/repository/models/n/unload", body, headers)
    assert status == 200, answer
    status, answer = _call(control_server, "GET", "/v2/models/n/ready")
    assert status != 200, answer


def test_control_bodies_that_do_not_inflate_are_refused_with_what_was_wrong(
    control_server: RunningServer, tmp_path: Path
) -> None:
    bad = {"Content-Encoding": "gzip", **AUTH}
    status, doc = _call(control_server, "POST", "/v2/logging", b"not gzip at all", bad)
    assert status == 400, doc
    assert "gzip" in doc["error"]
    status, doc = _call(control_server, "POST", "/v2/repository/models/n/load", b"junk", bad)
    assert status == 400, doc
    assert "gzip" in doc["error"]
    unknown = {"Content-Encoding": "br", **AUTH}
    status, doc = _call(control_server, "POST", "/v2/trace/setting", b"{}", unknown)
    assert status == 415, doc
    assert "br" in doc["error"]
    # a bomb past the body limit: 413, as an inference body's
    bomb = gzip.compress(b" " * (4 << 20))
    status, doc = _call(control_server, "POST", "/v2/logging", bomb, bad)
    assert status == 413, doc
    # the server is well and still serves
    status, doc = _call(control_server, "GET", "/v2/health/ready")
    assert status == 200


def test_a_model_trace_setting_checks_the_token_before_the_model(
    control_server: RunningServer,
) -> None:
    body = json.dumps({"trace_level": ["OFF"]}).encode()
    for model in ("m", "no-such-model"):
        status, doc = _call(control_server, "POST", f"/v2/models/{model}/trace/setting", body)
        assert status == 401, (model, doc)
    unknown = "/v2/models/no-such-model/trace/setting"
    status, doc = _call(control_server, "POST", unknown, body, AUTH)
    assert status == 404, doc
    status, doc = _call(control_server, "GET", unknown)
    assert status == 404, doc
