"""A request the replay sends late (its sender behind schedule) carries what is left of its
recorded budget, so that its due time stays its budget after the scheduled send (as
`duetime bench` restamps late sends); a send on schedule goes as it was encoded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.tools.capture import CaptureWriter
from duetime.tools.capture.format import CapturedRequest, CapturedTensor
from duetime.tools.hdr import LatencyRecorder
from duetime.tools.payloads import GRPC_DEADLINE_MARGIN_S
from duetime.tools.replay import Replay, ReplayConfig, load_plan

MS = 1_000_000
BUDGET_US = 100_000


def _record(index: int, **fields: Any) -> CapturedRequest:
    record = CapturedRequest(
        arrival_ns=index * 10 * MS, protocol="http", model="m", version=None,
        request_id=f"q{index}", inputs=[CapturedTensor.of("x", np.ones((1, 4), np.float32))],
        outputs_wanted=None, parameters={"timeout": BUDGET_US}, due_in_ns=BUDGET_US * 1000,
        priority=0, headers={}, trace_id=None, status=200, error=None, latency_ns=0,
        answered_version=None, variant=None, outputs=None,
    )  # fmt: skip
    for name, value in fields.items():
        setattr(record, name, value)
    return record


class _Kept:
    """A transport that keeps what it is given to send."""

    opened = waited = 0

    def __init__(self) -> None:
        self.sent: dict[int, Any] = {}

    def send(self, rid: int, payload: Any) -> None:
        self.sent[rid] = payload


def _sent_late(tmp_path: Path, target: str, late_ns: int) -> tuple[dict[int, Any], list[Any]]:
    """What each of four requests (10 ms apart) went out as, all sent at once `late_ns` after
    the last one's scheduled send, and the payloads as encoded."""
    capture = tmp_path / "c.cap"
    with CaptureWriter(capture) as writer:
        for index in range(4):
            writer.write(_record(index))
    config = ReplayConfig(capture, target, progress=False)
    plan = load_plan(config)
    replay = Replay(plan, config)
    kept = _Kept()
    replay.transport = kept  # type: ignore[assignment]
    replay.recorder = LatencyRecorder(0)
    replay.clock = lambda: 30 * MS + late_ns  # (the last is scheduled at 30 ms)
    replay.tick()
    return kept.sent, plan.payloads


def _http_timeout(payload: bytes) -> Any:
    body = payload.split(b"\r\n\r\n", 1)[1]
    head = payload.split(b"\r\n\r\n", 1)[0].decode()
    length = next(
        int(line.split(":")[1]) for line in head.split("\r\n")
        if line.lower().startswith("inference-header-content-length")
    )  # fmt: skip
    return orjson.loads(body[:length])["parameters"]["timeout"]


def test_late_http_sends_carry_what_is_left_of_their_budget(tmp_path: Path) -> None:
    sent, encoded = _sent_late(tmp_path, "http://127.0.0.1:1", late_ns=0)
    # request i is 30 - 10 i ms late: 30, 20 and 10 ms are past the 1 ms of "on schedule"
    assert [_http_timeout(sent[i]) for i in range(4)] == [70_000, 80_000, 90_000, BUDGET_US]
    assert sent[3] is encoded[3]  # (on schedule: as encoded, no copy)
    for i in range(3):
        assert len(sent[i]) == len(encoded[i])  # (no length header changes)


def test_a_send_later_than_its_budget_carries_one_microsecond(tmp_path: Path) -> None:
    sent, _ = _sent_late(tmp_path, "http://127.0.0.1:1", late_ns=500 * MS)
    assert [_http_timeout(sent[i]) for i in range(4)] == [1, 1, 1, 1]


def test_late_grpc_sends_carry_what_is_left_of_their_budget(tmp_path: Path) -> None:
    sent, _ = _sent_late(tmp_path, "grpc://127.0.0.1:1", late_ns=0)
    timeouts = []
    for i in range(4):
        request = pb.ModelInferRequest.FromString(sent[i].data)
        timeouts.append(request.parameters["timeout"].int64_param)
        assert sent[i].deadline_s == pytest.approx(timeouts[-1] / 1e6 + GRPC_DEADLINE_MARGIN_S)
    assert timeouts == [70_000, 80_000, 90_000, BUDGET_US]


def test_the_timeout_rewritten_is_the_request_parameter_not_an_output_s() -> None:
    from duetime.tools.replay_payloads import retimed_http, timed_http_request

    record = _record(
        0, outputs_wanted=("y",), output_parameters={"y": {"timeout": BUDGET_US}},
        parameters={"timeout": BUDGET_US, "note": 'a "timeout":100000 in a string'},
    )  # fmt: skip
    payload, at = timed_http_request(record, "h", 1)
    assert at > 0
    changed = retimed_http(payload, at, BUDGET_US, 42)
    assert len(changed) == len(payload)
    body = changed.split(b"\r\n\r\n", 1)[1]
    doc = orjson.loads(body[:-16])  # (the JSON head, then one FP32 [1, 4] tensor)
    assert doc["parameters"]["timeout"] == 42
    assert doc["parameters"]["note"] == 'a "timeout":100000 in a string'
    assert doc["outputs"][0]["parameters"]["timeout"] == BUDGET_US


def test_a_client_timeout_that_sets_no_due_time_is_not_rewritten() -> None:
    from duetime.tools.replay_payloads import timed_http_request

    record = _record(0, parameters={"timeout": "soon"})  # (the recorded due time: 100 ms)
    _, at = timed_http_request(record, "h", 1)
    assert at == -1


def test_a_request_that_waited_for_a_connection_carries_what_is_left(tmp_path: Path) -> None:
    """Sent on schedule into a pool whose connections were all busy, it went out later (the
    pool's `waited` hook) with its whole budget, unless retimed there."""
    capture = tmp_path / "c.cap"
    with CaptureWriter(capture) as writer:
        for index in range(2):
            writer.write(_record(index))
    config = ReplayConfig(capture, "http://127.0.0.1:1", progress=False)
    plan = load_plan(config)
    replay = Replay(plan, config)
    replay.clock = lambda: 10 * MS + 25 * MS  # the second, scheduled at 10 ms, waited 25 ms
    assert _http_timeout(replay.waited(1, plan.payloads[1])) == 75_000
    replay.clock = lambda: 10 * MS  # on time: as encoded
    assert replay.waited(1, plan.payloads[1]) is plan.payloads[1]
