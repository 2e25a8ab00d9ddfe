"""A tensor's JSON `data` is read as Triton reads it (ReadDataFromJsonHelper): every value of
its nest of lists in order, however ragged, checked only by its count against the shape. A
KServe V1 request, whose nesting is its shape, still refuses a ragged one."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest
from conftest import RunningServer

pytestmark = pytest.mark.timeout(60)


def _infer(server: RunningServer, data: Any, shape: list[int]) -> tuple[int, Any]:
    host, port = server.http.rsplit(":", 1)
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": data}]}
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("POST", "/v2/models/mlp/infer", json.dumps(doc).encode())
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_a_ragged_nest_answers_as_its_values_in_order(server: RunningServer) -> None:
    values = [round(0.01 * i, 2) for i in range(80)]
    status, flat = _infer(server, values, [2, 40])
    assert status == 200, flat
    ragged = [values[:3], [values[3:50], values[50:51]], values[51], *values[52:]]
    status, answer = _infer(server, ragged, [2, 40])
    assert status == 200, answer
    assert answer["outputs"] == flat["outputs"]


def test_a_ragged_nest_of_the_wrong_count_names_it(server: RunningServer) -> None:
    status, answer = _infer(server, [[0.5] * 40, [0.5] * 39, [0.5, 0.5]], [2, 40])
    assert status == 400
    assert "input 'x': 'data' holds 81 values but shape [2, 40] needs 80" in answer["error"]


def test_a_v1_predict_still_refuses_a_ragged_nest(server: RunningServer) -> None:
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        body = json.dumps({"instances": [[0.5] * 40, [0.5] * 39]}).encode()
        connection.request("POST", "/v1/models/mlp:predict", body)
        response = connection.getresponse()
        status, answer = response.status, json.loads(response.read())
    finally:
        connection.close()
    assert status == 400
    assert "ragged" in answer["error"]
