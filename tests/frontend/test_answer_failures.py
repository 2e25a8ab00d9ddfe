"""A request the model answered whose answer the front end could not make (its shared-memory
output window too small, its JSON or gRPC answer over the limit) stays a success of the model in
its statistics and metrics, as Triton's statistics count an inference as it ran, and counts in
`duetime_answers_failed_total` (the scheduler's `answers_failed`). It was first counted a success,
then taken back: counters went down."""

from __future__ import annotations

import http.client
import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from conftest import RunningServer, serving
from repo_models import tiling_model, write_version
from test_v1_routes import write_doubler
from tritonclient.utils import InferenceServerException

from duetime.config import ServerSettings

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm"),
]

LIMIT = 64 * 1024


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    """'lin' (y = 2x, FP32 [b, 4]) and 'big' (n rows of 3 FP32, see `tiling_model`), JSON
    answers and gRPC messages limited to 64 KiB."""
    write_doubler(tmp_path, "lin")
    write_version(tmp_path, "big", 1, tiling_model())
    settings = ServerSettings(
        model_repository=tmp_path, http_port=0, grpc_port=0, max_json_answer_bytes=LIMIT,
        max_grpc_message_bytes=LIMIT,
    )  # fmt: skip
    with serving(settings) as running:
        yield running


def counts(server: RunningServer, model: str) -> tuple[int, int, int, int]:
    """(succeeded, failed, on time, answers failed) of the model's scheduler; Triton's statistics
    and the metrics (nv_inference_request_success, duetime_requests_total) are read from it."""
    stats = server.statistics(model)
    return stats.succeeded, stats.failed, stats.on_time, sum(stats.answers_failed.values())


def triton_stats(server: RunningServer, model: str) -> tuple[int, int]:
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("GET", f"/v2/models/{model}/stats")
        doc = json.loads(connection.getresponse().read())
    finally:
        connection.close()
    inference = doc["model_stats"][0]["inference_stats"]
    return inference["success"]["count"], inference["fail"]["count"]


@pytest.mark.parametrize("client", [httpclient, grpcclient])
def test_an_output_window_too_small_counts_an_answer_failed(
    server: RunningServer, client: Any
) -> None:
    key = f"/duetime_answer_failed_{os.getpid()}_{client.__name__.rsplit('.', 1)[1]}"
    handle = shm.create_shared_memory_region("out", key, 1024)
    url = server.http if client is httpclient else server.grpc
    connection = client.InferenceServerClient(url)
    try:
        connection.register_system_shared_memory("out", key, 1024)
        tensor = client.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        output = client.InferRequestedOutput("y")
        output.set_shared_memory("out", 16)
        connection.infer("lin", [tensor], outputs=[output])  # (fits: a success)
        assert counts(server, "lin") == (1, 0, 1, 0)
        output.set_shared_memory("out", 8)  # (the answer needs 16 bytes)
        with pytest.raises(InferenceServerException, match="should be at least 16"):
            connection.infer("lin", [tensor], outputs=[output])
        assert counts(server, "lin") == (2, 0, 2, 1)
        assert triton_stats(server, "lin") == (2, 0)
    finally:
        connection.close()
        shm.destroy_shared_memory_region(handle)


def test_answers_over_their_size_limits_count_answers_failed(server: RunningServer) -> None:
    """A v2 JSON answer refused as too big (400), a V1 one (400), a gRPC one over the message
    limit (RESOURCE_EXHAUSTED): each a success of the model and an answer failed."""
    x = np.array([0.5, -1.25, 3.0], np.float32)
    rows = 20_000  # (about 900 KB of JSON, 240 KB of gRPC message)

    def tiles(client: Any) -> list[Any]:
        inputs = [client.InferInput("x", [3], "FP32"), client.InferInput("n", [1], "INT64")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(np.array([rows], np.int64))
        return inputs

    http_client = httpclient.InferenceServerClient(server.http)
    grpc_client = grpcclient.InferenceServerClient(server.grpc)
    try:
        json_output = httpclient.InferRequestedOutput("y", binary_data=False)
        with pytest.raises(InferenceServerException, match="too big to answer as JSON"):
            http_client.infer("big", tiles(httpclient), outputs=[json_output])
        assert counts(server, "big") == (1, 0, 1, 1)
        with pytest.raises(InferenceServerException, match="over the gRPC message limit"):
            grpc_client.infer("big", tiles(grpcclient))
        assert counts(server, "big") == (2, 0, 2, 2)
    finally:
        http_client.close()
        grpc_client.close()
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        doc = {"instances": [{"x": x.tolist(), "n": [rows]}]}
        connection.request("POST", "/v1/models/big:predict", body=json.dumps(doc))
        answer = connection.getresponse()
        assert answer.status == 400
        assert b"too big to answer as JSON" in answer.read()
    finally:
        connection.close()
    assert counts(server, "big") == (3, 0, 3, 3)
    assert triton_stats(server, "big") == (3, 0)
    port = server.addresses.metrics_port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    assert 'nv_inference_request_success{model="big",version="1"} 3' in text
    assert 'nv_inference_request_failure{model="big",reason="BACKEND",version="1"} 0' in text
    assert (
        'duetime_answers_failed_total{model="big",reason="unmade",variant="default",version="1"}'
        " 3.0" in text
    )
