"""Big answers over HTTP: built off the event loop (JSON) or written from their arrays (binary),
and byte for byte what ONNX Runtime made (frontend/rest.py BulkReply, codec.raw_view)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from conftest import RunningServer, start_server, stop_server
from repo_models import tiling_model, write_version

from duetime.config import ServerSettings
from duetime.frontend import codec, rest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """`big`: see `tiling_model`."""
    repo = tmp_path_factory.mktemp("big")
    write_version(repo, "big", 1, tiling_model())
    running, thread = start_server(ServerSettings(model_repository=repo, http_port=0, grpc_port=0))
    try:
        yield running
    finally:
        stop_server(running, thread)


X = np.array([0.5, float("nan"), -2.25], np.float32)


def ask(server: RunningServer, rows: int, *, binary: bool) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.http)
    try:
        x = httpclient.InferInput("x", [3], "FP32")
        x.set_data_from_numpy(X, binary_data=False)
        n = httpclient.InferInput("n", [1], "INT64")
        n.set_data_from_numpy(np.array([rows], np.int64), binary_data=False)
        wanted = httpclient.InferRequestedOutput("y", binary_data=binary)
        return client.infer("big", [x, n], outputs=[wanted]).as_numpy("y")
    finally:
        client.close()


@pytest.mark.parametrize("binary", [False, True])
def test_big_answers_are_the_model_s_values(server: RunningServer, binary: bool) -> None:
    rows = 200_000  # 600k values: a JSON answer built off the loop, a binary one from its array
    assert rows * 3 > rest.BULK_JSON_VALUES
    assert rows * 12 > rest.TAIL_BYTES
    y = ask(server, rows, binary=binary)
    np.testing.assert_array_equal(y, np.tile(X, (rows, 1)))
    small = ask(server, 2, binary=binary)  # and the small path beside it
    np.testing.assert_array_equal(small, np.tile(X, (2, 1)))


def test_many_big_json_answers_at_once_all_arrive_whole(server: RunningServer) -> None:
    results: list[np.ndarray] = []
    threads = [
        threading.Thread(target=lambda: results.append(ask(server, 40_000, binary=False)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4
    for y in results:
        np.testing.assert_array_equal(y, np.tile(X, (40_000, 1)))


def test_json_in_pieces_is_the_same_values_as_in_one_go() -> None:
    values = np.random.default_rng(0).standard_normal(3 * codec.JSON_CHUNK + 5).astype(np.float32)
    values[codec.JSON_CHUNK + 7] = np.inf  # one piece with a non-finite value, as Triton writes it
    data = codec.to_json_data(values, "FP32")
    assert isinstance(data, orjson.Fragment)
    decoded = json.loads(orjson.dumps({"data": data}))["data"]
    assert decoded[codec.JSON_CHUNK + 7] == float("inf")
    np.testing.assert_array_equal(np.array(decoded, np.float32), values)


def test_raw_view_is_the_array_s_bytes_without_a_copy() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = codec.raw_view(array, "FP32")
    assert isinstance(view, memoryview)
    assert bytes(view) == array.tobytes()
    assert len(view) == array.nbytes
    assert np.shares_memory(np.frombuffer(view, np.float32), array)
    assert bytes(codec.raw_view(array.T, "FP32")) == np.ascontiguousarray(array.T).tobytes()
    assert len(codec.raw_view(np.zeros((0, 3), np.float32), "FP32")) == 0
    big_endian = np.arange(3, dtype=">i4")
    assert bytes(codec.raw_view(big_endian, "INT32")) == np.arange(3, dtype="<i4").tobytes()
