"""KServe V1 as a tester found it wanting (T71): binary data as TensorFlow Serving writes it
(`{"b64": ...}`), answers compressed as `Accept-Encoding` asks, `:explain` of a model lazy
loading has not loaded yet, the model list and a model whose load failed, and the words of a
refusal for a due time the model's `default_timeout_ms` set."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import orjson
import pytest
from conftest import RunningServer, serving
from onnx import TensorProto, helper
from repo_models import age, scale_model, tiling_model, write_version

from duetime.config import ServerSettings
from duetime.errors import InvalidInput
from duetime.frontend.v1 import v1_inputs, v1_json_size, v1_predictions
from duetime.types import ModelSignature, TensorSpec

pytestmark = pytest.mark.timeout(120)

TEXT = ModelSignature(
    inputs=(TensorSpec("s", "BYTES", (-1, 2)),), outputs=(TensorSpec("y", "BYTES", (-1, 2)),),
    max_batch_size=8,
)  # fmt: skip
ONE_TEXT = ModelSignature(
    inputs=(TensorSpec("s", "BYTES", (-1,)),), outputs=(TensorSpec("y", "BYTES", (-1,)),),
    max_batch_size=8,
)  # fmt: skip
MIXED = ModelSignature(
    inputs=(TensorSpec("a", "FP32", (-1, 2)), TensorSpec("s", "BYTES", (-1,))),
    outputs=(TensorSpec("y", "FP32", (-1,)),),
    max_batch_size=8,
)


def b64(data: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(data).decode()}


def request(
    server: RunningServer, method: str, path: str, doc: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        body = None if doc is None else json.dumps(doc)
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        found = {name.lower(): value for name, value in response.getheaders()}
        return response.status, found, response.read()
    finally:
        connection.close()


# -- 1. binary data: {"b64": ...} ----------------------------------------------------------------


def test_a_bytes_input_reads_b64_values_as_the_bytes_they_encode() -> None:
    """TensorFlow Serving's JSON form of binary data was refused "element 0 must be a string"."""
    (s,) = v1_inputs({"instances": [[b64(b"hello"), "cd"]]}, TEXT, "m").values()
    assert s.tolist() == [[b"hello", b"cd"]]
    (s,) = v1_inputs({"instances": [{"s": [b64(b"\xff\x00"), "cd"]}]}, TEXT, "m").values()
    assert s.tolist() == [[b"\xff\x00", b"cd"]]  # (not UTF-8: the run refuses it, as v2's)
    (s,) = v1_inputs({"inputs": {"s": [[b64(b"a"), "b"], ["c", b64(b"d")]]}}, TEXT, "m").values()
    assert s.tolist() == [[b"a", b"b"], [b"c", b"d"]]
    # (an instance that is binary data is the only input's value, not an object of inputs)
    (s,) = v1_inputs({"instances": [b64(b"x"), "y"]}, ONE_TEXT, "m").values()
    assert s.tolist() == [b"x", b"y"]
    (s,) = v1_inputs({"instances": [{"b64": "aGk"}]}, ONE_TEXT, "m").values()  # (no padding)
    assert s.tolist() == [b"hi"]
    tensors = v1_inputs({"instances": [{"a": [1, 2], "s": b64(b"z")}]}, MIXED, "m")
    assert tensors["s"].tolist() == [b"z"]


@pytest.mark.parametrize(
    ("doc", "signature", "message"),
    [
        ({"instances": [[{"b64": "!!!"}, "cd"]]}, TEXT, "element 0: its \"b64\" is not valid"),
        ({"instances": [["ab", {"b64": 1}]]}, TEXT, "element 1 is an object that is not binary"),
        ({"instances": [["ab", {"x": "y"}]]}, TEXT, "element 1 is an object that is not binary"),
        ({"instances": [[b64(b"a"), 3]]}, TEXT, "BYTES 'instances' element 1 must be a string"),
        ({"instances": [[b64(b"a")], ["b", "c"]]}, TEXT, "ragged"),
        (
            {"instances": [{"a": [b64(b"a"), 1], "s": "x"}]}, MIXED,
            "input 'a': 'instances' holds {\"b64\": ...} (binary data), which only a BYTES input "
            "takes; FP32 takes numbers",
        ),
    ],
)  # fmt: skip
def test_b64_values_are_refused_where_tensorflow_serving_refuses_them(
    doc: Any, signature: ModelSignature, message: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        v1_inputs(doc, signature, "m")
    assert message in refused.value.message


def test_a_bytes_output_named_bytes_is_answered_as_b64() -> None:
    """As TensorFlow Serving answers a string output whose name ends in `_bytes`."""
    outputs = {"y_bytes": np.array([b"\xff\x00", "h\u00e9"], dtype=object)}
    answer = v1_predictions(outputs, batched=True)
    assert orjson.loads(answer) == {"predictions": [b64(b"\xff\x00"), b64("h\u00e9".encode())]}
    assert v1_json_size(outputs)["y_bytes"] >= len(answer) - len('{"predictions":[]}')
    outputs["y"] = np.array(["a", "b"], dtype=object)  # (any other name: text, as before)
    assert orjson.loads(v1_predictions(outputs, batched=True))["predictions"][1] == {
        "y_bytes": b64("h\u00e9".encode()),
        "y": "b",
    }


def write_text_model(root: Path) -> None:
    """Model `text`: s STRING [N, 2] answered as `out` (text) and `out_bytes` (binary)."""
    folder = root / "text" / "1"
    folder.mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["out"]),
         helper.make_node("Identity", ["s"], ["out_bytes"])], "text",
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["N", 2])],
        [helper.make_tensor_value_info("out", TensorProto.STRING, ["N", 2]),
         helper.make_tensor_value_info("out_bytes", TensorProto.STRING, ["N", 2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(folder / "model.onnx"))
    (root / "text" / "config.toml").write_text("max_batch_size = 8\n")


@pytest.fixture
def text_server(tmp_path: Path) -> Iterator[RunningServer]:
    write_text_model(tmp_path)
    write_version(tmp_path, "lin", 1, scale_model(2))
    (tmp_path / "lin" / "config.toml").write_text("max_batch_size = 8\n")
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0)
    with serving(settings) as running:
        yield running


def test_b64_goes_in_and_comes_back_over_v1(text_server: RunningServer) -> None:
    doc = {"instances": [[b64(b"hello"), "cd"]]}
    status, _, body = request(text_server, "POST", "/v1/models/text:predict", doc)
    assert status == 200, body
    assert orjson.loads(body) == {
        "predictions": [{"out": ["hello", "cd"], "out_bytes": [b64(b"hello"), b64(b"cd")]}]
    }
    doc = {"instances": [[b64(b"\xff"), "cd"]]}  # (not text: an ONNX string tensor holds text)
    status, _, body = request(text_server, "POST", "/v1/models/text:predict", doc)
    assert status == 400
    assert "is not valid UTF-8" in orjson.loads(body)["error"]
    doc = {"instances": [[b64(b"\x01\x02\x03\x04"), 1, 2, 3]]}  # (FP32 x: refused)
    status, _, body = request(text_server, "POST", "/v1/models/lin:predict", doc)
    assert status == 400
    assert "which only a BYTES input takes" in orjson.loads(body)["error"]


# -- 2. compression --------------------------------------------------------------------------------


@pytest.fixture
def tiles_server(tmp_path: Path) -> Iterator[RunningServer]:
    write_version(tmp_path, "big", 1, tiling_model())
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0)
    with serving(settings) as running:
        yield running


@pytest.mark.parametrize("rows", [2, 2_000, 30_000])  # (small; over 64 KB; built off the loop)
def test_a_v1_answer_is_compressed_as_accept_encoding_asks(
    tiles_server: RunningServer, rows: int
) -> None:
    """As a v2 answer is (README: "An inference answer is compressed as the request's
    Accept-Encoding asks"); V1's went uncompressed whatever was asked."""
    doc = {"instances": [{"x": [0.5, -1.25, 3.0], "n": [rows]}]}
    path = "/v1/models/big:predict"
    status, headers, plain = request(tiles_server, "POST", path, doc)
    assert status == 200
    assert "content-encoding" not in headers
    assert orjson.loads(plain) == {"predictions": [[[0.5, -1.25, 3.0]] * rows]}
    for asked, coding, inflate in [
        ("gzip", "gzip", gzip.decompress),
        ("deflate;q=0.9, gzip;q=0.5", "deflate", zlib.decompress),
    ]:
        status, headers, body = request(tiles_server, "POST", path, doc, {"Accept-Encoding": asked})
        assert status == 200
        assert headers["content-encoding"] == coding
        assert "accept-encoding" in headers["vary"].lower()
        assert inflate(body) == plain
    status, headers, body = request(tiles_server, "POST", path, doc, {"Accept-Encoding": "br"})
    assert "content-encoding" not in headers  # (none it offers: identity)
    assert body == plain


# -- 4. :explain of a model not loaded yet ---------------------------------------------------------


@pytest.fixture
def lazy_server(tmp_path: Path) -> Iterator[RunningServer]:
    write_version(tmp_path, "lin", 1, scale_model(2))
    (tmp_path / "lin" / "config.toml").write_text("max_batch_size = 8\n")
    age(tmp_path / "lin" / "config.toml")  # (settled: a lazy load waits for fresh files)
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0, lazy_load=True)
    with serving(settings) as running:
        yield running


def test_explain_of_a_model_not_loaded_yet_is_not_ready(lazy_server: RunningServer) -> None:
    """It was 404 "'lin' is not found; served models: 'lin'", while its readiness said 503; KServe
    answers :explain 503 for a model not ready, 501 for one ready without an explainer."""
    status, _, body = request(lazy_server, "GET", "/v1/models/lin")
    assert (status, orjson.loads(body)) == (503, {"name": "lin", "ready": False})
    status, _, body = request(lazy_server, "POST", "/v1/models/lin:explain", {"instances": [[1]]})
    assert status == 503
    error = orjson.loads(body)["error"]
    assert "model 'lin' is not ready: not loaded yet" in error
    assert "not found" not in error
    status, _, _ = request(lazy_server, "POST", "/v1/models/nope:explain", {"instances": [[1]]})
    assert status == 404
    doc = {"instances": [[1, 2, 3, 4]]}
    status, _, body = request(lazy_server, "POST", "/v1/models/lin:predict", doc)
    assert (status, orjson.loads(body)) == (200, {"predictions": [[2.0, 4.0, 6.0, 8.0]]})
    status, _, _ = request(lazy_server, "POST", "/v1/models/lin:explain", doc)
    assert status == 501


def test_explain_of_a_model_whose_lazy_load_failed_says_why(tmp_path: Path) -> None:
    """It said "not loaded yet (its first ':predict' loads it)" after a predict's load had
    failed, where the predict gave the load's error (found by a tester)."""
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx graph")
    age(tmp_path / "broken" / "1" / "model.onnx")
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0, lazy_load=True)
    with serving(settings) as running:
        doc = {"instances": [[1, 2, 3, 4]]}
        status, _, _ = request(running, "POST", "/v1/models/broken:predict", doc)
        assert status >= 400
        status, _, body = request(running, "POST", "/v1/models/broken:explain", doc)
    assert status == 503
    error = orjson.loads(body)["error"]
    assert "model 'broken' is not ready: its last load failed: " in error
    assert "not loaded yet" not in error


# -- 5. the model list and a model whose load failed -----------------------------------------------


def test_a_model_whose_load_failed_is_listed_as_its_readiness_knows_it(tmp_path: Path) -> None:
    """`GET /v1/models` left it out while `GET /v1/models/broken` answered 503 (known, not
    ready): a client that lists the models, then polls each, never saw it."""
    write_version(tmp_path, "good", 1, scale_model(1))
    write_version(tmp_path, "broken", 1, b"not an onnx model")
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0)
    with serving(settings) as running:
        status, _, body = request(running, "GET", "/v1/models")
        assert (status, orjson.loads(body)) == (200, {"models": ["broken", "good"]})
        status, _, body = request(running, "GET", "/v1/models/broken")
        assert (status, orjson.loads(body)) == (503, {"name": "broken", "ready": False})
        assert request(running, "GET", "/v1/models/nosuch")[0] == 404


# -- 3. a due time the model's default_timeout_ms set ----------------------------------------------


def test_a_refusal_for_a_default_due_time_names_default_timeout_ms(tmp_path: Path) -> None:
    """A V1 predict cannot send a timeout, and a v2 one that sends none is due by the model's
    `default_timeout_ms`: both were told to "send a larger timeout", which could not help. A
    v2 request's own timeout replaces the default (the default capped it: found by a tester)."""
    write_version(tmp_path, "lin", 1, scale_model(2))
    (tmp_path / "lin" / "config.toml").write_text(
        "max_batch_size = 8\ndefault_timeout_ms = 0.001\n"  # (1 µs: due before it is queued)
    )
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0)
    v2 = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    with serving(settings) as running:
        for path, doc in [
            ("/v1/models/lin:predict", {"instances": [[1, 2, 3, 4]]}),
            ("/v2/models/lin/infer", v2),
        ]:
            status, _, body = request(running, "POST", path, doc)
            assert status == 504, body
            error = orjson.loads(body)["error"]
            assert error.startswith("Request timeout expired: ")  # (Triton's words first)
            assert "before it reached the scheduler" in error
            assert "its due time is its model's default_timeout_ms (0.001 ms after its" in error
            assert "raise the model's default_timeout_ms" in error
            assert "larger timeout" not in error
        own = {**v2, "parameters": {"timeout": 10_000_000}}  # (10 s: its own, honoured)
        status, _, body = request(running, "POST", "/v2/models/lin/infer", own)
        assert status == 200, body
