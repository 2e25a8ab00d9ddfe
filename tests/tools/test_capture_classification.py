"""A request that asks for an output's top classes (`classification`) is recorded with the
answer its client got (BYTES class strings), not the model's raw scores, so that a replay with
--compare-outputs against the same server passes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import requests
import tritonclient.grpc as grpcclient
from conftest import RunningServer, recording_server

from duetime.cli import main
from duetime.tools.capture import read_capture


def test_a_classification_answer_is_recorded_and_replays_equal(
    mlp_repo: Path, server: RunningServer, tmp_path: Path
) -> None:
    capture = tmp_path / "c.cap"
    x = np.linspace(-1, 1, 40, dtype=np.float32)
    body = {
        "id": "h1",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 40], "data": x.tolist()}],
        "outputs": [{"name": "y", "parameters": {"classification": 2}}],
    }
    with recording_server(mlp_repo, capture) as running:
        got = requests.post(f"http://{running.http}/v2/models/mlp/infer", json=body, timeout=30)
        assert got.status_code == 200, got.text
        http_answer = got.json()["outputs"][0]
        client = grpcclient.InferenceServerClient(running.grpc)
        try:
            tensor = grpcclient.InferInput("x", [1, 40], "FP32")
            tensor.set_data_from_numpy(x.reshape(1, 40))
            wanted = grpcclient.InferRequestedOutput("y", class_count=3)
            grpc_answer = client.infer("mlp", [tensor], outputs=[wanted], request_id="g1")
        finally:
            client.close()
    records = {r.request_id: r for r in read_capture(capture)}
    recorded = records["h1"].outputs
    assert recorded is not None
    (y,) = recorded
    assert (y.name, y.datatype, list(y.shape)) == ("y", "BYTES", http_answer["shape"])
    assert [s.decode() for s in y.array().ravel()] == http_answer["data"]
    grpc_recorded = records["g1"].outputs
    assert grpc_recorded is not None
    assert grpc_recorded[0].datatype == "BYTES"
    assert list(grpc_recorded[0].array().ravel()) == list(grpc_answer.as_numpy("y").ravel())

    out = tmp_path / "replay.json"
    code = main(["replay", str(capture), "--target", f"http://{server.http}",
                 "--compare-outputs", "--json", str(out), "-q"])  # fmt: skip
    result = json.loads(out.read_text())
    assert result["compare"]["compared"] == 2
    assert result["compare"]["mismatched"] == 0
    assert code == 0
