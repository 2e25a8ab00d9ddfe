"""An HTTP input that carries its values both in `data` and as binary data (`binary_data_size`) is
refused, naming the input; the binary data won without a word, whatever `data` said."""

from __future__ import annotations

import http.client
import json

import numpy as np
from conftest import RunningServer


def test_data_and_binary_data_size_together_are_refused(server: RunningServer) -> None:
    values = np.arange(40, dtype=np.float32).reshape(1, 40)
    entry = {
        "name": "x", "datatype": "FP32", "shape": [1, 40], "data": [0.0] * 40,
        "parameters": {"binary_data_size": values.nbytes},
    }  # fmt: skip
    head = json.dumps({"inputs": [entry]}).encode()
    connection = http.client.HTTPConnection(server.http, timeout=30)
    headers = {"Inference-Header-Content-Length": str(len(head))}
    connection.request("POST", "/v2/models/mlp/infer", head + values.tobytes(), headers)
    response = connection.getresponse()
    answer = json.loads(response.read())
    assert response.status == 400
    assert "input 'x': has both 'data' and a 'binary_data_size' parameter" in answer["error"]
    # the connection still serves the request sent one way
    del entry["data"]
    head = json.dumps({"inputs": [entry]}).encode()
    headers = {"Inference-Header-Content-Length": str(len(head))}
    connection.request("POST", "/v2/models/mlp/infer", head + values.tobytes(), headers)
    response = connection.getresponse()
    response.read()
    connection.close()
    assert response.status == 200
