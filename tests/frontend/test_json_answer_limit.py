"""An HTTP answer too big for JSON is refused before it is encoded, with a pointer to binary data
(ServerSettings.max_json_answer_bytes, rest.py `_check_json_answer`, codec.json_size).

A model that expands its input made a 1 GB JSON answer from a 32-byte request: 20 s of encoding
and 4 GB of memory."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest
from conftest import RunningServer, start_server, stop_server
from repo_models import tiling_model, write_version

from duetime.config import ServerSettings
from duetime.datatypes import NUMPY_OF
from duetime.frontend import codec

pytestmark = pytest.mark.timeout(120)

LIMIT = 64 * 1024
X = [0.5, -1.25, 3.0]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """`big`: see `tiling_model` (an answer of n rows of 3 FP32 values)."""
    repo = tmp_path_factory.mktemp("json-limit")
    write_version(repo, "big", 1, tiling_model())
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, max_json_answer_bytes=LIMIT
    )
    running, thread = start_server(settings)
    try:
        yield running
    finally:
        stop_server(running, thread)


def _infer(server: RunningServer, rows: int, **request: Any) -> tuple[int, bytes]:
    doc = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [3], "data": X},
            {"name": "n", "datatype": "INT64", "shape": [1], "data": [rows]},
        ],
        **request,
    }
    call = urllib.request.Request(
        f"http://{server.http}/v2/models/big/infer", data=json.dumps(doc).encode()
    )
    try:
        with urllib.request.urlopen(call, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_a_json_answer_over_the_limit_is_refused_naming_the_output(
    server: RunningServer,
) -> None:
    rows = LIMIT // (3 * 17) + 1  # 17 bytes a value at most: just over the limit
    status, body = _infer(server, rows)
    assert status == 400
    error = json.loads(body)["error"]
    assert "output 'y' is too big to answer as JSON" in error
    assert "--max-json-answer-bytes" in error
    assert "'binary_data': true" in error
    assert "'binary_data_output': true" in error


def test_a_big_json_answer_built_off_the_loop_is_refused_too(server: RunningServer) -> None:
    status, body = _infer(server, 100_000)  # (300k values: a BulkReply)
    assert status == 400
    assert "output 'y' is too big to answer as JSON" in json.loads(body)["error"]


@pytest.mark.parametrize(
    "request_",
    [
        {"parameters": {"binary_data_output": True}},
        {"outputs": [{"name": "y", "parameters": {"binary_data": True}}]},
    ],
)
def test_the_same_answer_as_binary_data_is_given(
    server: RunningServer, request_: dict[str, Any]
) -> None:
    rows = LIMIT // (3 * 17) + 1
    status, body = _infer(server, rows, **request_)
    assert status == 200
    values = np.frombuffer(body[-rows * 12 :], np.float32).reshape(rows, 3)
    np.testing.assert_array_equal(values, np.tile(np.array(X, np.float32), (rows, 1)))


def test_a_json_answer_under_the_limit_is_given(server: RunningServer) -> None:
    status, body = _infer(server, 100)
    assert status == 200
    assert json.loads(body)["outputs"][0]["data"] == X * 100


@pytest.mark.parametrize("datatype", sorted(codec.JSON_VALUE_BYTES))
def test_json_size_is_at_least_the_size_of_extreme_finite_values_as_json(datatype: str) -> None:
    dtype = NUMPY_OF[datatype]
    if dtype.kind == "b":
        values = np.array([False, True] * 3)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)  # type: ignore[type-var]
        values = np.array([info.min, info.max, 0, 1], dtype)
    else:
        finfo = ml_dtypes.finfo(dtype)  # (numpy's and BF16's)
        rng = np.random.default_rng(0)
        values = np.concatenate(
            [
                np.array([finfo.min, finfo.max, finfo.tiny, -finfo.tiny, finfo.eps], dtype),
                np.array([-finfo.smallest_subnormal], dtype),  # (finite: see json_size)
                (-rng.random(20_000) * 1e-5).astype(dtype),
            ]
        )
    data = codec.to_json_data(values, datatype)  # (as an answer encodes it)
    encoded = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)
    assert codec.json_size(values, datatype) >= len(encoded) - 2  # (less the brackets)


def test_json_size_of_bytes_counts_their_lengths_and_quotes() -> None:
    values = np.array([b"ab", b"", "xyz"], dtype=object)
    assert codec.json_size(values, "BYTES") == len(b'"ab","","xyz",')
