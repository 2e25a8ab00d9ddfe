"""What `duetime replay` puts on the wire for a captured request: every parameter in a field
that holds its value, and a clear error naming the record for one that no field holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from duetime.cli import main as cli_main
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.tools.capture import CapturedRequest, CapturedTensor, CaptureWriter
from duetime.tools.capture.format import encode_http_record
from duetime.tools.replay import ReplayConfig, load_plan
from duetime.tools.replay_payloads import Unsendable, grpc_request


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
    tmp_path: Path, capsys: pytest.CaptureFixture[str], protocol: str
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
    argv = ["replay", str(capture), "--target", f"{protocol}://127.0.0.1:1", "-q"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert f"record 1 (id 'r1') cannot be replayed over {protocol}: parameter" in err
    assert "18446744073709551616" in err
    assert "Traceback" not in err
