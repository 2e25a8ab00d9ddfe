"""A float tensor's JSON data reads null as NaN, as KServe's v2 client writes a NaN or infinity
(JSON has neither) and its server reads it; other types still refuse null."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest
from conftest import RunningServer

from duetime.frontend.codec import from_json

pytestmark = pytest.mark.timeout(60)


def _infer(server: RunningServer, body: bytes) -> tuple[int, Any]:
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", "/v2/models/mlp/infer", body)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_null_in_a_float_input_is_nan_over_http(server: RunningServer) -> None:
    values = [0.25] * 80
    values[3] = values[47] = None  # type: ignore[call-overload]
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 40], "data": values}]}
    status, nulls = _infer(server, json.dumps(doc).encode())
    assert status == 200, nulls
    text = json.dumps(doc).replace("null", "NaN")  # (as Triton's clients write a NaN)
    status, nans = _infer(server, text.encode())
    assert status == 200, nans
    assert json.dumps(nulls["outputs"]) == json.dumps(nans["outputs"])


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_null_reads_as_nan_in_every_float_type_flat_or_nested(datatype: str) -> None:
    array = from_json([[None, 1], [2.5, None]], datatype, (2, 2), "input 'x'")
    assert array.dtype.name == {"FP16": "float16", "FP32": "float32", "FP64": "float64"}[datatype]
    assert [str(v) for v in array.ravel()] == ["nan", "1.0", "2.5", "nan"]


@pytest.mark.parametrize(
    ("datatype", "data", "said"),
    [
        ("INT64", [None, 1], "not INT64"),
        ("BOOL", [None, True], "not BOOL"),
        ("FP32", [None, "1.5"], "not FP32"),
        ("FP32", [None, True], "not FP32"),
        ("FP32", [None, 10**400], "outside the range of FP32"),
    ],
)
def test_null_beside_what_a_float_tensor_does_not_take_is_refused(
    datatype: str, data: list[Any], said: str
) -> None:
    with pytest.raises(Exception, match=said):
        from_json(data, datatype, (2,), "input 'x'")
