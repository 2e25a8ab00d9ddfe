"""The due time a replay hands the server: the budget the original client sent, never a tighter
one from the capture's arrival stamp, and never none for a request that was overdue when it
arrived (it replays overdue, and is refused as it was)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RunningServer, recording_server

from duetime.cli import main as cli_main
from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.tools.capture import CapturedRequest, CapturedTensor, CaptureWriter, read_capture
from duetime.tools.payloads import GRPC_DEADLINE_MARGIN_S
from duetime.tools.replay import ReplayConfig, load_plan, run_replay
from duetime.tools.replay_payloads import due_timeout_us, grpc_request, request_parameters
from duetime.tools.replay_results import recorded_answers_sent

pytestmark = pytest.mark.timeout(120)

US = 1_000


def record(**fields: Any) -> CapturedRequest:
    x = np.ones((1, 40), dtype=np.float32)
    captured = CapturedRequest(
        arrival_ns=0, protocol="grpc", model="mlp", version=None, request_id="r",
        inputs=[CapturedTensor.of("x", x)], outputs_wanted=None, parameters={}, due_in_ns=None,
        priority=0, headers={}, trace_id=None, status=200, error=None, latency_ns=0,
        answered_version=None, variant=None, outputs=None,
    )  # fmt: skip
    for name, value in fields.items():
        setattr(captured, name, value)
    return captured


# -- pure: the budget chosen -----------------------------------------------------------------


def test_the_clients_own_timeout_is_replayed_not_the_shrunken_due() -> None:
    # the capture stamped arrival 262 µs after the server had started counting the timeout
    sent = record(parameters={"timeout": 8698}, due_in_ns=8436 * US)
    assert due_timeout_us(sent) == 8698
    assert request_parameters(sent)["timeout"] == 8698


def test_an_overdue_request_without_a_timeout_parameter_replays_with_1_us() -> None:
    overdue = record(due_in_ns=-743 * US, status=504)  # a gRPC deadline already passed
    assert due_timeout_us(overdue) == 1
    assert request_parameters(overdue)["timeout"] == 1
    assert due_timeout_us(record(due_in_ns=0)) == 1


def test_an_overdue_request_with_a_timeout_parameter_replays_it() -> None:
    overdue = record(protocol="http", parameters={"timeout": 1}, due_in_ns=-45 * US, status=504)
    assert due_timeout_us(overdue) == 1
    assert request_parameters(overdue)["timeout"] == 1


def test_without_a_timeout_parameter_the_captured_due_is_used() -> None:
    assert due_timeout_us(record(due_in_ns=2_500_001)) == 2501
    assert due_timeout_us(record(parameters={"timeout": 0}, due_in_ns=3_000 * US)) == 3000
    assert request_parameters(record(parameters={"timeout": 0}, due_in_ns=3 * US))["timeout"] == 3


def test_no_due_time_stays_none() -> None:
    assert due_timeout_us(record()) is None
    assert "timeout" not in request_parameters(record())


def test_a_timeout_the_server_refused_is_sent_again_as_it_was() -> None:
    refused = record(protocol="http", parameters={"timeout": "soon"}, status=400)
    assert due_timeout_us(refused) is None
    assert request_parameters(refused)["timeout"] == "soon"


def test_a_grpc_replay_carries_the_budget_in_the_parameter_and_the_deadline() -> None:
    overdue = grpc_request(record(due_in_ns=-10 * US))
    message = pb.ModelInferRequest.FromString(overdue.data)
    assert message.parameters["timeout"].int64_param == 1
    assert overdue.deadline_s == pytest.approx(1e-6 + GRPC_DEADLINE_MARGIN_S)


def test_the_plan_judges_lateness_by_the_budget_it_sends(tmp_path: Path) -> None:
    capture = tmp_path / "in.cap"
    records = [
        record(arrival_ns=0, due_in_ns=-5 * US),
        record(arrival_ns=1, parameters={"timeout": 900}, due_in_ns=700 * US),
        record(arrival_ns=2),
    ]
    with CaptureWriter(capture) as writer:
        for captured in records:
            writer.write(captured)
    plan = load_plan(ReplayConfig(capture, "grpc://127.0.0.1:1", progress=False))
    assert plan.dues_ns == [1 * US, 900 * US, None]


def test_recorded_answers_are_counted_over_the_loops_sent() -> None:
    recorded: list[object | None] = [[1], None, [2]]
    assert recorded_answers_sent(recorded, 0) == 0
    assert recorded_answers_sent(recorded, 2) == 1
    assert recorded_answers_sent(recorded, 7) == 5
    assert recorded_answers_sent([], 3) == 0


# -- against real servers ----------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_overdue_when_captured_replay_overdue(
    server: RunningServer, tmp_path: Path, protocol: str
) -> None:
    capture = tmp_path / "overdue.cap"
    with CaptureWriter(capture) as writer:
        for i in range(5):
            writer.write(record(arrival_ns=i * 1_000_000, request_id=f"r{i}", due_in_ns=-50 * US,
                                status=504))  # fmt: skip
    target = f"{protocol}://{server.http if protocol == 'http' else server.grpc}"
    doc = run_replay(ReplayConfig(capture, target, progress=False)).to_json()
    assert doc["sent"] == 5
    assert doc["ok"] == 0, doc["statuses"]
    # refused as due (504), or served and judged late by the 1 µs budget it was sent with
    assert doc["expired"] + doc["rejected"] + doc["late"] == 5, doc["statuses"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bench_record_replay_record_keeps_the_clients_timeouts(
    mlp_repo: Path, tmp_path: Path, protocol: str
) -> None:
    first, second = tmp_path / "first.cap", tmp_path / "second.cap"
    with recording_server(mlp_repo, first) as running:
        target = running.http if protocol == "http" else running.grpc
        argv = [
            "bench", f"--{protocol}", target, "--model", "mlp", "--rate", "100", "--duration",
            "0.3", "--warmup", "0", "--timeout-ms", "10,20", "--seed", "7", "-q",
        ]  # fmt: skip
        assert cli_main(argv) == 0
    with recording_server(mlp_repo, second) as running:
        target = running.http if protocol == "http" else running.grpc
        out = tmp_path / "replay.json"
        argv = ["replay", str(first), "--target", f"{protocol}://{target}", "-q",
                "--json", str(out)]  # fmt: skip
        assert cli_main(argv) == 0
    result = json.loads(out.read_text())
    assert result["errors"] == 0
    sent = sorted(r.parameters["timeout"] for r in read_capture(first))
    replayed = sorted(r.parameters["timeout"] for r in read_capture(second))
    assert len(sent) >= 20
    # (bench sends what is left of 10 or 20 ms after its scheduled send: a late send, less)
    assert all(0 < timeout <= 20_000 for timeout in sent)
    # the replay sends each its recorded timeout, but for a send it made late, which carries
    # what is left of it (as bench does): less, never more
    assert len(replayed) == len(sent)
    assert all(0 < r <= s for r, s in zip(replayed, sent, strict=True))
    kept = sum((Counter(replayed) & Counter(sent)).values())
    assert kept >= len(sent) - result["replayer"]["sends_retimed"]
