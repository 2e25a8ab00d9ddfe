"""Inference answers compressed as the client's Accept-Encoding asks, as Triton does
(`HTTPAPIServer::GetResponseCompressionType`): gzip or deflate, JSON and binary answers, the
binary header's length that of the decompressed JSON, big answers compressed off the loop."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from conftest import RunningServer, start_server, stop_server
from repo_models import tiling_model, write_version

from duetime.config import ServerSettings
from duetime.frontend import rest
from duetime.frontend.rest import Reply, response_coding

pytestmark = pytest.mark.timeout(120)

DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.decompress,
    "deflate": zlib.decompress,
}
X = np.linspace(-1, 1, 4 * 40, dtype=np.float32).reshape(4, 40)


@pytest.mark.parametrize(
    ("accepted", "coding"),
    [
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("identity", None),
        ("gzip, deflate", "gzip"),  # a tie: the first listed
        ("deflate, gzip", "deflate"),
        ("gzip;q=0.5, deflate", "deflate"),
        ("gzip;q=0.5, deflate;q=0.4", "gzip"),
        ("deflate;q=0.5, identity;q=0.8", None),
        ("gzip;q=0", None),
        ("gzip ; Q=0.7 , br", "gzip"),
        ("GZip", "gzip"),
        ("br", None),
        ("*", None),
        ("gzip;q=x, deflate;q=0.1", "deflate"),  # a bad q-value drops its entry
        ("gzip;q=2", None),
        ("", None),
        ("x-gzip", "gzip"),  # (RFC 9110 8.4.1.3: equivalent to gzip)
        ("x-gzip;q=0.5, deflate;q=0.6", "deflate"),
    ],
)
def test_the_coding_is_picked_as_triton_picks_it(accepted: str, coding: str | None) -> None:
    assert response_coding(accepted) == coding


def _post(address: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[Any, bytes]:
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        return response, response.read()
    finally:
        connection.close()


def _infer_body(binary: bool) -> bytes:
    doc = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4, 40], "data": X.ravel().tolist()}],
        "outputs": [{"name": "y", "parameters": {"binary_data": binary}}],
    }
    return json.dumps(doc).encode()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_an_inference_answer_is_compressed_as_accepted(
    server: RunningServer, coding: str, binary: bool
) -> None:
    body = _infer_body(binary)
    plain, expected = _post(server.http, "/v2/models/mlp/infer", body, {})
    assert plain.status == 200
    assert plain.getheader("Content-Encoding") is None
    response, data = _post(server.http, "/v2/models/mlp/infer", body, {"Accept-Encoding": coding})
    assert response.status == 200, data
    assert response.getheader("Content-Encoding") == coding
    assert response.getheader("Vary") == "Accept-Encoding"
    assert int(response.getheader("Content-Length")) == len(data)
    decoded = DECOMPRESS[coding](data)
    assert decoded == expected
    if binary:
        # the JSON header's length is that of the decompressed JSON, as Triton's
        length = int(response.getheader("Inference-Header-Content-Length"))
        assert length == int(plain.getheader("Inference-Header-Content-Length"))
        head = json.loads(decoded[:length])
        assert head["outputs"][0]["parameters"]["binary_data_size"] == len(decoded) - length


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("x-gzip", gzip.compress),
        # two members, one after the other (RFC 1952 2.2): gzip.decompress reads them
        ("gzip", lambda body: gzip.compress(body[:100]) + gzip.compress(body[100:])),
    ],
    ids=["x-gzip", "two-members"],
)
def test_request_bodies_in_gzip_s_other_forms_are_read(
    server: RunningServer, coding: str, encode: Callable[[bytes], bytes]
) -> None:
    """Both were refused (415 'not supported'; 400 'not one complete gzip stream'), where
    RFC 9110 has x-gzip read as gzip and gzip readers take several members (a tester)."""
    body = _infer_body(False)
    _, expected = _post(server.http, "/v2/models/mlp/infer", body, {})
    response, data = _post(
        server.http, "/v2/models/mlp/infer", encode(body), {"Content-Encoding": coding}
    )
    assert response.status == 200, data
    assert data == expected
    garbage = gzip.compress(body) + b"not gzip"
    response, data = _post(
        server.http, "/v2/models/mlp/infer", garbage, {"Content-Encoding": coding}
    )
    assert response.status == 400
    assert b"not valid gzip data" in data


def test_errors_and_other_answers_are_not_compressed(server: RunningServer) -> None:
    # as Triton: only inference answers are
    gzip_only = {"Accept-Encoding": "gzip"}
    response, data = _post(server.http, "/v2/models/nope/infer", _infer_body(False), gzip_only)
    assert response.status == 404
    assert response.getheader("Content-Encoding") is None
    assert "nope" in json.loads(data)["error"]
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("GET", "/v2/models/mlp", headers=gzip_only)
        metadata = connection.getresponse()
        assert json.loads(metadata.read())["name"] == "mlp"
        assert metadata.getheader("Content-Encoding") is None
    finally:
        connection.close()


def _inputs(module: Any) -> list[Any]:
    x = module.InferInput("x", [4, 40], "FP32")
    x.set_data_from_numpy(X)
    return [x]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_tritonclient_reads_compressed_answers(
    server: RunningServer, coding: str, binary: bool
) -> None:
    client = httpclient.InferenceServerClient(server.http)
    try:
        wanted = [httpclient.InferRequestedOutput("y", binary_data=binary)]
        expected = client.infer("mlp", _inputs(httpclient), outputs=wanted).as_numpy("y")
        result = client.infer(
            "mlp", _inputs(httpclient), outputs=wanted, response_compression_algorithm=coding
        )
        np.testing.assert_array_equal(result.as_numpy("y"), expected)
    finally:
        client.close()

    async def ask() -> np.ndarray:
        async with aiohttpclient.InferenceServerClient(server.http) as aio:
            result = await aio.infer(
                "mlp",
                _inputs(aiohttpclient),
                outputs=[aiohttpclient.InferRequestedOutput("y", binary_data=binary)],
                response_compression_algorithm=coding,
            )
            return result.as_numpy("y")

    np.testing.assert_array_equal(asyncio.run(ask()), expected)


# -- big answers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """`big`: see `tiling_model`."""
    repo = tmp_path_factory.mktemp("big")
    write_version(repo, "big", 1, tiling_model())
    running, thread = start_server(ServerSettings(model_repository=repo, http_port=0, grpc_port=0))
    try:
        yield running
    finally:
        stop_server(running, thread)


@pytest.fixture
def compressing_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each answer is compressed on, in order."""
    threads: list[str] = []
    original = rest.compressed

    def recorded(reply: Reply, coding: str) -> Reply:
        threads.append(threading.current_thread().name)
        return original(reply, coding)

    monkeypatch.setattr(rest, "compressed", recorded)
    return threads


BIG_X = np.array([0.5, -1.0, 2.25], np.float32)


def _ask_big(server: RunningServer, rows: int, binary: bool) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.http)
    try:
        x = httpclient.InferInput("x", [3], "FP32")
        x.set_data_from_numpy(BIG_X)
        n = httpclient.InferInput("n", [1], "INT64")
        n.set_data_from_numpy(np.array([rows], np.int64))
        wanted = [httpclient.InferRequestedOutput("y", binary_data=binary)]
        result = client.infer("big", [x, n], outputs=wanted, response_compression_algorithm="gzip")
        return result.as_numpy("y")
    finally:
        client.close()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_a_big_answer_is_compressed_off_the_loop(
    big_server: RunningServer, compressing_threads: list[str], binary: bool
) -> None:
    rows = 100_000  # 1.2 MB binary, 300k values in JSON
    assert rows * 12 > rest.BULK_COMPRESS_BYTES
    np.testing.assert_array_equal(_ask_big(big_server, rows, binary), np.tile(BIG_X, (rows, 1)))
    np.testing.assert_array_equal(_ask_big(big_server, 2, binary), np.tile(BIG_X, (2, 1)))
    loop_thread = "test-server"  # (conftest.start_server's)
    assert len(compressing_threads) == 2
    assert compressing_threads[0] != loop_thread
    assert compressing_threads[1] == loop_thread  # a small one costs less than a thread
