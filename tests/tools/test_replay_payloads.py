"""What `duetime replay` puts on the wire for a captured request: every parameter in a field
that holds its value, and a clear error naming the record for one that no field holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from conftest import RunningServer

from duetime.cli import main as cli_main
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.frontend.rest import parse_infer_request
from duetime.tools.capture import CapturedRequest, CapturedTensor, CaptureWriter, read_capture
from duetime.tools.capture.format import encode_http_record
from duetime.tools.replay import ReplayConfig, load_plan
from duetime.tools.replay_payloads import Unsendable, grpc_request, http_request


def record(**fields: Any) -> CapturedRequest:
    captured = CapturedRequest(
        arrival_ns=0, protocol="grpc", model="mlp", version=None, request_id="r",
        inputs=[CapturedTensor.of("x", np.ones((1, 4), np.float32))], outputs_wanted=None,
        parameters={}, due_in_ns=None, priority=0, headers={}, trace_id=None, status=200,
        error=None, latency_ns=0, answered_version=None, variant=None, outputs=None,
    )  # fmt: skip
    for name, value in fields.items():
        setattr(captured, name, value)
    return captured


def write(path: Path, records: list[CapturedRequest]) -> Path:
    with CaptureWriter(path) as writer:
        for captured in records:
            writer.write(captured)
    return path


# -- gRPC parameters -----------------------------------------------------------------------------


def test_an_integer_past_int64_travels_as_uint64_over_grpc(tmp_path: Path) -> None:
    # tritonclient sends the v2 priority (a uint64) in uint64_param; captured, then replayed
    top = 2**64 - 1
    capture = write(tmp_path / "in.cap", [record(parameters={"priority": top, "n": -(2**63)})])
    plan = load_plan(ReplayConfig(capture, "grpc://127.0.0.1:1", progress=False))
    sent = pb.ModelInferRequest.FromString(plan.payloads[0].data)
    assert sent.parameters["priority"].WhichOneof("parameter_choice") == "uint64_param"
    assert sent.parameters["priority"].uint64_param == top
    assert sent.parameters["n"].int64_param == -(2**63)


@pytest.mark.parametrize("value", [-(2**63) - 1, 2**64])
def test_an_integer_no_grpc_parameter_holds_is_named(value: int) -> None:
    with pytest.raises(Unsendable, match=f"parameter 'big': {value} is outside"):
        grpc_request(record(parameters={"big": value}))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_unsendable_record_is_a_clear_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], protocol: str, server: RunningServer
) -> None:
    # a v2 REST body may hold any JSON integer; the capture keeps the body as it came
    body = b'{"id":"r1","inputs":[],"parameters":{"p":18446744073709551616}}'
    capture = tmp_path / "in.cap"
    with CaptureWriter(capture) as writer:
        writer.write(record(request_id="r0"))
        raw = encode_http_record(
            1, "mlp", None, body, None, None, 0, {}, None, 200, None, 0, None, None, None
        )
        writer.write_encoded(raw, 1)
    target = server.grpc if protocol == "grpc" else server.http
    argv = ["replay", str(capture), "--target", f"{protocol}://{target}", "-q"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert f"record 1 (id 'r1') cannot be replayed over {protocol}: parameter" in err
    assert "18446744073709551616" in err
    assert "Traceback" not in err


# -- HTTP: JSON as JSON, binary as binary --------------------------------------------------------


def http_parts(wire: bytes) -> tuple[dict[str, str], bytes]:
    head, body = wire.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}, body


def captured_http(tmp_path: Path, body: bytes, header_length: int | None) -> CapturedRequest:
    """`body` as the server captures a v2 REST request (verbatim), read back."""
    headers = {"host": "h:1", "content-length": str(len(body)), "user-agent": "t"}
    if header_length is not None:
        headers["inference-header-content-length"] = str(header_length)
    capture = tmp_path / "in.cap"
    with CaptureWriter(capture) as writer:
        raw = encode_http_record(
            0, "mlp", None, body, header_length, None, 0, headers, None, 200, None, 0, None,
            None, None,
        )  # fmt: skip
        writer.write_encoded(raw, 1)
    [captured] = read_capture(capture)
    return captured


def test_a_request_sent_as_json_is_replayed_as_json(tmp_path: Path) -> None:
    sent = {
        "id": "j1",
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.5, 1, 2, 3]},
            {"name": "w", "datatype": "BYTES", "shape": [2], "data": ["été", "b"]},
            {"name": "h", "datatype": "FP16", "shape": [1], "data": [1.5]},
        ],
        "outputs": [{"name": "y"}],
        "parameters": {"tag": "a"},
    }
    captured = captured_http(tmp_path, orjson.dumps(sent), None)
    headers, body = http_parts(http_request(captured, "127.0.0.1", 8000))
    assert "inference-header-content-length" not in headers
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"] == "t"
    assert int(headers["content-length"]) == len(body)
    doc = orjson.loads(body)
    assert doc["outputs"] == [{"name": "y"}]
    assert doc["parameters"] == {"tag": "a"}
    assert b"binary_data" not in body
    replayed, _ = parse_infer_request(body, None, "mlp", None)
    original, _ = parse_infer_request(orjson.dumps(sent), None, "mlp", None)
    assert replayed.id == "j1"
    for name, array in original.inputs.items():
        assert replayed.inputs[name].dtype == array.dtype
        np.testing.assert_array_equal(replayed.inputs[name], array)


def test_a_binary_request_and_one_never_on_the_wire_replay_binary(tmp_path: Path) -> None:
    head = orjson.dumps({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2],
                    "parameters": {"binary_data_size": 8}}],
    })  # fmt: skip
    data = np.array([1, 2], np.float32).tobytes()
    binary = captured_http(tmp_path, head + data, len(head))
    for captured in (binary, record(protocol="http")):  # (the second: bench --record's)
        headers, body = http_parts(http_request(captured, "127.0.0.1", 8000))
        length = int(headers["inference-header-content-length"])
        assert headers["content-type"] == "application/octet-stream"
        assert orjson.loads(body[:length])["parameters"]["binary_data_output"] is True
        assert body[length:] == b"".join(t.data for t in captured.inputs)


# -- the parameters of requested outputs ---------------------------------------------------------


def test_an_outputs_parameters_are_replayed_over_both_protocols(tmp_path: Path) -> None:
    # tritonclient InferRequestedOutput("y", class_count=2): the top 2 classes, not the tensor
    classified = record(outputs_wanted=("y", "z"), output_parameters={"y": {"classification": 2}})
    headers, body = http_parts(http_request(classified, "127.0.0.1", 8000))
    head = orjson.loads(body[: int(headers["inference-header-content-length"])])
    assert head["outputs"] == [
        {"name": "y", "parameters": {"classification": 2, "binary_data": True}},
        {"name": "z", "parameters": {"binary_data": True}},
    ]
    sent = pb.ModelInferRequest.FromString(grpc_request(classified).data)
    assert [o.name for o in sent.outputs] == ["y", "z"]
    assert sent.outputs[0].parameters["classification"].int64_param == 2
    assert not sent.outputs[1].parameters
    sent_json = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}],
        "outputs": [{"name": "y", "parameters": {"classification": 3}}],
    }
    as_json = captured_http(tmp_path, orjson.dumps(sent_json), None)
    _, body = http_parts(http_request(as_json, "127.0.0.1", 8000))
    assert orjson.loads(body)["outputs"] == [{"name": "y", "parameters": {"classification": 3}}]
