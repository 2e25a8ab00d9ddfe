"""A recording server records the requests its load shedder refuses unread (HTTP 429, gRPC
RESOURCE_EXHAUSTED) with their outcome, so that a capture holds the load the server really
received and its replay offers it again."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, recording_server, shedder_refusing

from duetime.cli import main
from duetime.errors import Overloaded
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.scheduling.scheduler import ModelScheduler
from duetime.tools.capture import read_capture
from duetime.tools.capture import recorder as recorder_module
from duetime.tools.capture.recorder import Recorder

_INFER = "/inference.GRPCInferenceService/ModelInfer"


def _send_all_shed(running: RunningServer) -> None:
    x = np.arange(40, dtype=np.float32).reshape(1, 40) / 40
    # HTTP JSON, with a timeout and a priority
    body = {
        "id": "json", "parameters": {"timeout": 70000, "priority": 1},
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 40], "data": x.ravel().tolist()}],
    }  # fmt: skip
    url = f"http://{running.http}/v2/models/mlp/infer"
    assert requests.post(url, json=body, timeout=30).status_code == 429
    # HTTP JSON, gzip-compressed, to a named version
    gz = dict(body, id="gzip")
    answer = requests.post(
        f"http://{running.http}/v2/models/mlp/versions/1/infer",
        data=gzip.compress(json.dumps(gz).encode()),
        headers={"content-type": "application/json", "content-encoding": "gzip"},
        timeout=30,
    )
    assert answer.status_code == 429
    # HTTP binary (tritonclient)
    http = httpclient.InferenceServerClient(running.http)
    try:
        tensor = httpclient.InferInput("x", [1, 40], "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        with pytest.raises(Exception, match=r"429|saturated"):
            http.infer("mlp", [tensor], request_id="binary")
    finally:
        http.close()
    # gRPC, with a deadline
    client = grpcclient.InferenceServerClient(running.grpc)
    try:
        tensor = grpcclient.InferInput("x", [1, 40], "FP32")
        tensor.set_data_from_numpy(x)
        with pytest.raises(Exception, match="saturated"):
            client.infer("mlp", [tensor], request_id="grpc", client_timeout=5.0)
    finally:
        client.close()
    # bytes that are no request at all: refused all the same, not recordable
    with grpc.insecure_channel(running.grpc) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            channel.unary_unary(_INFER)(b"\xff\xff not a protobuf message")
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture(scope="module")
def shed_capture(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shed") / "shed.cap"
    with pytest.MonkeyPatch.context() as patch:
        # (this machine's load must not make the writer look busy: see the test of the gate)
        patch.setattr(recorder_module, "_SHED_BUSY", 1.0)
        with recording_server(demo_repo, path) as running:
            # (every model made to look busy: the shedder spares a model with capacity idle)
            with pytest.MonkeyPatch.context() as busy, shedder_refusing(running):
                busy.setattr(ModelScheduler, "idle", property(lambda self: False))
                busy.setattr(ModelScheduler, "backlogged", lambda self, now: True)
                _send_all_shed(running)
            recorder = running.server.recorder
            assert recorder is not None
    stats = recorder.statistics()
    assert (stats.written, stats.dropped, stats.failed) == (4, 0, 1)
    return path


def test_shed_requests_are_recorded_with_their_refusal(shed_capture: Path) -> None:
    records = {r.request_id: r for r in read_capture(shed_capture)}
    assert sorted(records) == ["binary", "grpc", "gzip", "json"]
    for record in records.values():
        assert record.status == 429
        assert record.error is not None
        assert "saturated" in record.error
        assert record.model == "mlp"
        (x,) = record.inputs
        assert x.name == "x"
        assert x.shape == (1, 40)
        np.testing.assert_array_equal(
            x.array(), np.arange(40, dtype=np.float32).reshape(1, 40) / 40
        )
    assert records["gzip"].version == "1"
    assert records["json"].due_in_ns == 70_000_000
    assert records["json"].priority == 1
    assert records["json"].parameters["timeout"] == 70000
    assert records["grpc"].protocol == "grpc"
    due = records["grpc"].due_in_ns
    assert due is not None
    # (the call's 5 s deadline as the server read it: gRPC's `time_remaining` converts the
    # core's deadline to the wall clock, and read 5.0096 s once in CI: 1% of tolerance)
    assert 0 < due <= 5_050_000_000


def test_capture_show_counts_the_load_received(shed_capture: Path, capsys: Any) -> None:
    assert main(["capture", "show", str(shed_capture)]) == 0
    shown = capsys.readouterr().out
    assert "requests: 4 " in shown


def test_shed_requests_replay_as_the_load_they_were(
    shed_capture: Path, server: RunningServer, tmp_path: Path
) -> None:
    out = tmp_path / "replay.json"
    code = main(["replay", str(shed_capture), "--target", f"http://{server.http}",
                 "--json", str(out), "-q"])  # fmt: skip
    result = json.loads(out.read_text())
    assert (result["sent"], result["errors"]) == (4, 0)
    assert result["statuses"] == {"200": 4}
    assert code == 0


def test_a_grpc_request_refused_unread_decodes_as_the_engine_would_get_it() -> None:
    from duetime.frontend.grpc import unread_infer_request

    request = pb.ModelInferRequest(model_name="m", model_version="2", id="r")
    request.inputs.add(name="x", datatype="INT64", shape=[2])
    request.raw_input_contents.append(np.array([3, 4], dtype=np.int64).tobytes())
    request.outputs.add(name="y").parameters["classification"].int64_param = 2
    request.parameters["priority"].int64_param = 2
    decoded = unread_infer_request(request.SerializeToString())
    assert (decoded.model, decoded.version, decoded.id, decoded.priority) == ("m", "2", "r", 2)
    assert decoded.inputs["x"].tolist() == [3, 4]
    assert decoded.classes == {"y": 2}


def test_shed_requests_are_counted_dropped_while_the_writer_is_busy(tmp_path: Path) -> None:
    """Recording shed requests must not take from an overloaded server: while the writer is
    busy (big tensors at a high rate) they are left out, and counted."""
    path = tmp_path / "c.cap"
    recorder = Recorder(path, flush_s=3600)  # (the writer waits: its busy share stays put)
    recorder.start()
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]})
    target = b"/v2/models/mlp/infer"
    try:
        recorder._busy = 0.5
        recorder.refused_unread("http", target, body.encode(), {}, Overloaded("busy"))
        stats = recorder.statistics()
        assert (stats.sampled, stats.dropped, stats.skipped, stats.buffered) == (1, 1, 1, 0)
        recorder._busy = 0.0
        recorder.refused_unread("http", target, body.encode(), {}, Overloaded("busy"))
    finally:
        stats = recorder.stop()
    assert (stats.sampled, stats.written, stats.dropped, stats.skipped) == (2, 1, 1, 1)
    (record,) = read_capture(path)
    assert (record.model, record.status) == ("mlp", 429)
