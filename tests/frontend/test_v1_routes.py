"""KServe V1 routes on a real server: model names with a ':', models not loaded yet (lazy
loading), and answers over the JSON answer limit."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import orjson
import pytest
from conftest import RunningServer, serving
from onnx import TensorProto, helper
from repo_models import tiling_model, write_version

from duetime.config import ServerSettings
from duetime.frontend import rest
from duetime.frontend.v1 import v1_predictions

pytestmark = pytest.mark.timeout(120)


def write_doubler(root: Path, name: str = "lin") -> Path:
    """Model `name`: y = x * 2, x FP32 [b, 4], batching up to 8."""
    folder = root / name / "1"
    folder.mkdir(parents=True)
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])], name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])], initializer=[two],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(folder / "model.onnx"))
    (root / name / "config.toml").write_text("max_batch_size = 8\n")
    for path in (root / name).rglob("*"):  # (settled: a lazy load waits for fresh files)
        os.utime(path, (1e9, 1e9))
    return root


def call(server: RunningServer, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        body = None if doc is None else json.dumps(doc)
        connection.request(method, path, body=body)
        response = connection.getresponse()
        return response.status, orjson.loads(response.read())
    finally:
        connection.close()


@pytest.fixture
def colon_server(tmp_path: Path) -> Iterator[RunningServer]:
    write_doubler(tmp_path)
    shutil.move(tmp_path / "lin", tmp_path / "lin:v2")
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0)
    with serving(settings) as running:
        yield running


def test_a_model_whose_name_has_a_colon_is_ready_on_get(colon_server: RunningServer) -> None:
    """`GET /v1/models/lin:v2` is the readiness of model 'lin:v2' (it was 404 "no such
    endpoint": the path was split at its last ':' for GET as for POST)."""
    assert call(colon_server, "GET", "/v1/models/lin:v2") == (
        200,
        {"name": "lin:v2", "ready": True},
    )
    status, answer = call(
        colon_server, "POST", "/v1/models/lin:v2:predict", {"instances": [[1] * 4]}
    )
    assert (status, answer) == (200, {"predictions": [[2.0] * 4]})
    assert call(colon_server, "GET", "/v1/models/lin:v2:predict")[0] == 405  # (use POST)
    status, error = call(colon_server, "GET", "/v1/models/lin:v3")
    assert status == 404
    assert "'lin:v3' is not found" in error["error"]


ANSWER_LIMIT = 4 * 1024 * 1024


@pytest.fixture
def big_server(tmp_path: Path) -> Iterator[RunningServer]:
    """`big`: see `tiling_model` (an answer of n rows of 3 FP32 values)."""
    write_version(tmp_path, "big", 1, tiling_model())
    settings = ServerSettings(
        model_repository=tmp_path, http_port=0, grpc_port=0, max_json_answer_bytes=ANSWER_LIMIT
    )
    with serving(settings) as running:
        yield running


def tiles(rows: int) -> dict[str, Any]:
    return {"instances": [{"x": [0.5, -1.25, 3.0], "n": [rows]}]}


def test_a_v1_answer_over_the_json_limit_is_refused(big_server: RunningServer) -> None:
    """As v2 refuses a JSON answer over --max-json-answer-bytes, before it is encoded (V1 made
    a 40 MB answer v2 refused)."""
    status, error = call(big_server, "POST", "/v1/models/big:predict", tiles(200_000))
    assert status == 400
    assert "output 'y' is too big to answer as JSON" in error["error"]
    assert f"over the {ANSWER_LIMIT}-byte limit" in error["error"]
    assert "--max-json-answer-bytes" in error["error"]
    status, answer = call(big_server, "POST", "/v1/models/big:predict", tiles(2))
    assert (status, answer) == (200, {"predictions": [[[0.5, -1.25, 3.0]] * 2]})


def test_a_big_v1_answer_is_built_off_the_event_loop(
    big_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Encoded on the loop, a big V1 answer stalled every other client while it was built."""
    threads: list[str] = []

    def recorded(outputs: dict[str, Any], batched: bool) -> bytes:
        threads.append(threading.current_thread().name)
        return v1_predictions(outputs, batched)

    monkeypatch.setattr(rest, "v1_predictions", recorded)
    loop_thread = threading.current_thread().name
    status, answer = call(big_server, "POST", "/v1/models/big:predict", tiles(30_000))
    assert status == 200
    assert answer == {"predictions": [[[0.5, -1.25, 3.0]] * 30_000]}
    status, _ = call(big_server, "POST", "/v1/models/big:predict", tiles(2))
    assert status == 200
    (big, small) = threads
    assert small == "test-server"  # (a small answer is made on the loop, at once)
    assert big not in ("test-server", loop_thread)


@pytest.fixture
def lazy_server(tmp_path: Path) -> Iterator[RunningServer]:
    """Models 'lin' and 'other' (y = 2x), loaded by the first request for each, one at a time
    (loading one evicts the other)."""
    write_doubler(tmp_path, "lin")
    write_doubler(tmp_path, "other")
    settings = ServerSettings(
        model_repository=tmp_path, http_port=0, grpc_port=0, lazy_load=True,
        max_loaded_models=1,
    )  # fmt: skip
    with serving(settings) as running:
        yield running


@pytest.mark.usefixtures("evict_at_once")
def test_a_v1_predict_loads_a_model_not_loaded_yet(lazy_server: RunningServer) -> None:
    """A V1 predict loads the model first, as a v2 infer does (it was 404 "unknown model ...
    served models: none"), after lazy loading left it unloaded or evicted it; until then the
    model is listed and not ready (503), as KServe answers for a model of its registry."""
    assert call(lazy_server, "GET", "/v1/models") == (200, {"models": ["lin", "other"]})
    assert call(lazy_server, "GET", "/v1/models/lin") == (503, {"name": "lin", "ready": False})
    assert call(lazy_server, "GET", "/v1/models/nope")[0] == 404
    doc = {"instances": [[1, 2, 3, 4]]}
    expected = (200, {"predictions": [[2.0, 4.0, 6.0, 8.0]]})
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # (one load, the others join it)
        answers = pool.map(
            lambda _: call(lazy_server, "POST", "/v1/models/lin:predict", doc), range(4)
        )
        assert list(answers) == [expected] * 4
    assert call(lazy_server, "GET", "/v1/models/lin") == (200, {"name": "lin", "ready": True})
    assert call(lazy_server, "POST", "/v1/models/other:predict", doc) == expected  # (evicts lin)
    assert call(lazy_server, "GET", "/v1/models/lin") == (503, {"name": "lin", "ready": False})
    assert call(lazy_server, "POST", "/v1/models/lin:predict", doc) == expected
    assert call(lazy_server, "GET", "/v1/models") == (200, {"models": ["lin", "other"]})
    status, error = call(lazy_server, "POST", "/v1/models/lin:predict", {"instances": [[1]]})
    assert status == 400  # (decoded against the signature of the model loaded)
    assert "input 'x'" in error["error"]
