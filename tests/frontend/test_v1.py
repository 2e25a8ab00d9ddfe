"""KServe's V1 protocol (frontend/v1.py): the request and answer formats, and the endpoints on a
real server, answered as the v2 endpoint answers the same tensors."""

from __future__ import annotations

import http.client
import json
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from conftest import RunningServer

from duetime.errors import InvalidInput
from duetime.frontend.v1 import v1_inputs, v1_predictions
from duetime.types import ModelSignature, TensorSpec

pytestmark = pytest.mark.timeout(60)

ONE = ModelSignature(
    inputs=(TensorSpec("x", "FP32", (-1, 2)),), outputs=(TensorSpec("y", "FP32", (-1,)),),
    max_batch_size=8,
)  # fmt: skip
TWO = ModelSignature(
    inputs=(TensorSpec("a", "INT64", (-1, 2)), TensorSpec("s", "BYTES", (-1,))),
    outputs=(TensorSpec("y", "FP32", (-1,)),),
    max_batch_size=8,
)
UNBATCHED = ModelSignature(
    inputs=(TensorSpec("x", "FP32", (2, 2)),), outputs=(TensorSpec("y", "FP32", (2,)),),
    max_batch_size=0,
)  # fmt: skip


def test_examples_stack_on_the_batch_dimension() -> None:
    (x,) = v1_inputs({"instances": [[1, 2], [3, 4.5]]}, ONE, "m").values()
    assert x.dtype == np.float32
    assert x.tolist() == [[1, 2], [3, 4.5]]
    (x,) = v1_inputs({"inputs": {"x": [[1, 2]]}}, ONE, "m").values()  # columnar
    assert x.tolist() == [[1, 2]]
    (x,) = v1_inputs({"instances": [[[1, 2], [3, 4]]]}, UNBATCHED, "m").values()
    assert x.shape == (2, 2)  # a model that does not batch takes the one example as it is


def test_several_inputs_come_as_objects() -> None:
    doc = {"instances": [{"a": [1, 2], "s": "x"}, {"a": [3, 4], "s": "yz"}]}
    tensors = v1_inputs(doc, TWO, "m")
    assert tensors["a"].dtype == np.int64
    assert tensors["a"].tolist() == [[1, 2], [3, 4]]
    assert tensors["s"].tolist() == [b"x", b"yz"]
    columnar = v1_inputs({"inputs": {"a": [[1, 2]], "s": ["x"]}}, TWO, "m")
    assert columnar["s"].tolist() == [b"x"]


@pytest.mark.parametrize(
    ("doc", "signature", "message"),
    [
        ([1], ONE, "expected a JSON object with 'instances'"),
        ({"examples": []}, ONE, "expected 'instances'"),
        ({"instances": []}, ONE, "'instances' must be a non-empty list"),
        ({"instances": [[1, "2"]]}, ONE, "input 'x': 'instances' holds values that are not FP32"),
        ({"instances": [[1, 2], [3]]}, ONE, "input 'x': 'instances' is a ragged nest of lists"),
        ({"instances": [[1e39, 2]]}, ONE, "'instances' has values outside the range of FP32"),
        ({"instances": [{"a": [1, 2]}]}, TWO, "example 0 has no input 's' (BYTES[-1])"),
        ({"inputs": {"s": ["x"]}}, TWO, "'inputs': the request has no input 'a'"),
        ({"instances": [[1, 2]]}, TWO, "takes 2 inputs ('a', 's'); each entry of 'instances'"),
        ({"instances": [{"a": [1.5, 2], "s": "x"}]}, TWO, "values that are not INT64"),
        ({"instances": [[1]] * 2}, UNBATCHED, "does not batch (max_batch_size 0); send one"),
        # (as TensorFlow Serving refuses them; 'inputs' beside 'instances' and a name that is no
        # input were ignored)
        (
            {"instances": [[1, 2]], "inputs": {"x": [[3, 4]]}}, ONE,
            "predict request: has both 'instances' and 'inputs'",
        ),
        (
            {"instances": [{"a": [1, 2], "s": "x"}, {"a": [1, 2], "s": "x", "z": 1}]}, TWO,
            "'instances': example 1 has 'z', which is not an input of model 'm' (its inputs: "
            "'a', 's')",
        ),
        (
            {"inputs": {"a": [[1, 2]], "s": ["x"], "S": ["y"]}}, TWO,
            "'inputs': the request has 'S', which is not an input of model 'm'",
        ),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field(doc: Any, signature: ModelSignature, message: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        v1_inputs(doc, signature, "m")
    assert message in raised.value.message


def test_predictions_are_one_entry_per_example() -> None:
    y = np.array([[0.5, 1.0], [2.0, 3.0]], np.float32)
    assert json.loads(v1_predictions({"y": y}, batched=True)) == {"predictions": y.tolist()}
    both = v1_predictions({"y": y, "s": np.array([b"a", b"b"], dtype=object)}, batched=True)
    assert json.loads(both)["predictions"] == [{"y": [0.5, 1.0], "s": "a"},
                                               {"y": [2.0, 3.0], "s": "b"}]  # fmt: skip
    assert json.loads(v1_predictions({"y": y}, batched=False)) == {"predictions": [y.tolist()]}
    assert json.loads(v1_predictions({"y": np.array(2.5)}, batched=False))["predictions"] == [2.5]


def test_non_finite_predictions_are_null_as_kserve_writes_them() -> None:
    """KServe's V1 server answers with orjson, which writes NaN and ±inf as null, and its client
    reads with orjson, which refuses `NaN`/`Infinity`: `{"predictions":[Infinity]}` failed
    `InferenceRESTClient(protocol='v1').infer` with JSONDecodeError."""
    y = np.array([[np.nan, np.inf, -np.inf, 1.5], [1, 2, 3, 4]], dtype=np.float32)
    got = orjson.loads(v1_predictions({"y": y, "z": y[:, 1]}, batched=True))["predictions"]
    assert got == [{"y": [None, None, None, 1.5], "z": None}, {"y": [1, 2, 3, 4], "z": 2}]
    for dtype in (np.float16, np.float64):
        row = y[0].astype(dtype)
        assert orjson.loads(v1_predictions({"y": row}, False)) == {"predictions": [got[0]["y"]]}
    assert orjson.loads(v1_predictions({"s": np.float32(np.inf)}, False)) == {"predictions": [None]}


def test_a_float_input_reads_null_as_nan() -> None:
    """The KServe client writes its request with orjson: NaN and ±inf arrive as null."""
    (x,) = v1_inputs({"instances": [[None, 1], [2, None]]}, ONE, "m").values()
    assert x.dtype == np.float32
    assert np.isnan(x[[0, 1], [0, 1]]).all()
    assert x[[0, 1], [1, 0]].tolist() == [1, 2]
    (x,) = v1_inputs({"inputs": {"x": [[None, 1]]}}, ONE, "m").values()  # columnar
    assert np.isnan(x[0, 0])
    with pytest.raises(InvalidInput, match="'instances' holds values that are not INT64"):
        v1_inputs({"instances": [{"a": [None, 2], "s": "x"}]}, TWO, "m")
    with pytest.raises(InvalidInput, match="'instances' is a ragged nest of lists"):
        v1_inputs({"instances": [[None, 1], [None]]}, ONE, "m")


def call(server: RunningServer, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        body = None if doc is None else json.dumps(doc)
        connection.request(method, path, body=body)
        response = connection.getresponse()
        return response.status, orjson.loads(response.read())  # (strict, as KServe's client)
    finally:
        connection.close()


def test_the_endpoints_answer_as_kserve_v1_does(server: RunningServer) -> None:
    assert call(server, "GET", "/") == (200, {"status": "alive"})
    status, listed = call(server, "GET", "/v1/models")
    assert status == 200
    assert {"mlp", "resnet"} <= set(listed["models"])
    assert call(server, "GET", "/v1/models/mlp") == (200, {"name": "mlp", "ready": True})
    status, error = call(server, "GET", "/v1/models/nope")
    assert status == 404
    assert "Request for unknown model: 'nope' is not found" in error["error"]


def test_explain_is_not_implemented_for_a_known_model(server: RunningServer) -> None:
    """KServe answers :explain on a model without an explainer with 501 (its Model.explain
    raises NotImplementedError); duetime answered 404 'no such endpoint'."""
    doc = {"instances": [[0] * 40]}
    status, error = call(server, "POST", "/v1/models/mlp:explain", doc)
    assert status == 501
    assert "model 'mlp' has no explainer" in error["error"]
    status, error = call(server, "POST", "/v1/models/nope:explain", doc)
    assert status == 404
    assert "Request for unknown model: 'nope' is not found" in error["error"]
    assert call(server, "GET", "/v1/models/mlp:explain")[0] == 405
    status, error = call(server, "POST", "/v1/models/mlp:explainer", doc)
    assert status == 404
    assert "only ':predict' and ':explain'" in error["error"]


def test_predict_answers_what_the_v2_endpoint_answers(server: RunningServer) -> None:
    x = np.random.default_rng(7).random((3, 40), dtype=np.float32)
    status, answer = call(server, "POST", "/v1/models/mlp:predict", {"instances": x.tolist()})
    assert status == 200
    client = httpclient.InferenceServerClient(server.http)
    try:
        tensor = httpclient.InferInput("x", [3, 40], "FP32")
        tensor.set_data_from_numpy(x)
        expected = client.infer("mlp", [tensor]).as_numpy("y")
    finally:
        client.close()
    np.testing.assert_allclose(np.array(answer["predictions"], np.float32), expected, rtol=1e-6)
    status, error = call(server, "POST", "/v1/models/mlp:predict", {"instances": [[1, 2]]})
    assert status == 400
    assert "for model 'mlp'. Expected [-1,40], got [1,2]" in error["error"]
    assert call(server, "GET", "/v1/models/mlp")[0] == 200  # still serving


def test_a_nan_goes_in_and_comes_back_as_null(server: RunningServer) -> None:
    status, answer = call(server, "POST", "/v1/models/mlp:predict", {"instances": [[None] * 40]})
    assert status == 200
    assert None in answer["predictions"][0]


@pytest.mark.parametrize("dtype", [np.longlong, np.ulonglong, np.int64, np.int32, np.uint8])
def test_integer_outputs_of_every_numpy_type_are_answered(dtype: Any) -> None:
    """ONNX Runtime gives int64 outputs as numpy's `longlong`, whose scalars orjson refuses:
    every scikit-learn or XGBoost classifier's 1-D `label` answered 500."""
    labels = np.array([1, 0, 2], dtype=dtype)
    assert json.loads(v1_predictions({"label": labels}, True)) == {"predictions": [1, 0, 2]}
    probabilities = np.array([[0.25, 0.75], [1.0, 0.0], [0.5, 0.5]], np.float32)
    doc = json.loads(v1_predictions({"label": labels, "p": probabilities}, True))
    assert doc["predictions"][0] == {"label": 1, "p": [0.25, 0.75]}


def test_onnx_runtime_gives_the_longlong_type_these_tests_feed() -> None:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ArgMax", ["x"], ["y"], axis=1, keepdims=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["N"])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.eye(3, dtype=np.float32)})
    assert json.loads(v1_predictions({"y": y}, True)) == {"predictions": [0, 1, 2]}
