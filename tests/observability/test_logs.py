"""Logs: a line per failed request with its trace id and reason, the sampled access log, and
the JSON format."""

from __future__ import annotations

import http.client
import json
import logging
import sys
from pathlib import Path

import pytest
from conftest import start_server, stop_server

from duetime.config import ServerSettings
from duetime.observability.logs import (
    TEXT_LINE,
    AccessSampler,
    JsonFormatter,
    TextFormatter,
    configure_logging,
    log_request,
)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def post(address: str, path: str, body: bytes, headers: dict[str, str]) -> int:
    host, port = address.split(":")
    connection = http.client.HTTPConnection(host, int(port))
    connection.request("POST", path, body, headers)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response.status


def test_failed_and_sampled_requests_are_logged(
    mlp_repo: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = ServerSettings(
        model_repository=mlp_repo, http_port=0, grpc_port=0, access_log_sample=1.0
    )
    running, thread = start_server(settings)
    good = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 40],
                                   "data": [0.0] * 40}]}).encode()  # fmt: skip
    try:
        with caplog.at_level(logging.INFO, logger="duetime.requests"):
            assert (
                post(running.http, "/v2/models/mlp/infer", b"{", {"traceparent": TRACEPARENT})
                == 400
            )
            assert post(running.http, "/v2/models/mlp/infer", good, {}) == 200
    finally:
        stop_server(running, thread)
    records = [r for r in caplog.records if r.name == "duetime.requests"]
    failed = next(r for r in records if getattr(r, "status", 0) == 400)
    assert failed.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"  # type: ignore[attr-defined]
    assert failed.model == "mlp"  # type: ignore[attr-defined]
    assert "not valid JSON" in failed.getMessage()
    assert any(getattr(r, "status", 0) == 200 for r in records)


def test_kserve_v1_predicts_are_logged_as_v2_inferences_are(
    mlp_repo: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A V1 `:predict` got no access-log line, and a failed one's line named the model
    'mlp:predict'; the trace id of its traceparent comes back in x-trace-id."""
    settings = ServerSettings(
        model_repository=mlp_repo, http_port=0, grpc_port=0, access_log_sample=1.0
    )
    running, thread = start_server(settings)
    host, port = running.http.split(":")
    statuses = []
    try:
        with caplog.at_level(logging.INFO, logger="duetime.requests"):
            for values in ([0.5] * 40, [0.5] * 3):
                connection = http.client.HTTPConnection(host, int(port))
                body = json.dumps({"instances": [values]})
                connection.request(
                    "POST", "/v1/models/mlp:predict", body, {"traceparent": TRACEPARENT}
                )
                response = connection.getresponse()
                response.read()
                connection.close()
                statuses.append((response.status, response.getheader("x-trace-id")))
    finally:
        stop_server(running, thread)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert statuses == [(200, trace_id), (400, trace_id)]
    records = [r for r in caplog.records if r.name == "duetime.requests"]
    assert [(r.status, r.model, r.trace_id) for r in records] == [  # type: ignore[attr-defined]
        (200, "mlp", trace_id),
        (400, "mlp", trace_id),
    ]


def test_json_lines_carry_the_request_fields() -> None:
    record = logging.LogRecord("duetime.requests", logging.WARNING, __file__, 1, "boom", None, None)
    record.status, record.trace_id, record.model = 503, "ab" * 16, "m"
    doc = json.loads(JsonFormatter().format(record))
    assert doc["level"] == "warning"
    assert doc["message"] == "boom"
    assert (doc["status"], doc["trace_id"], doc["model"]) == (503, "ab" * 16, "m")
    assert doc["time"].endswith("Z")


def test_a_grpc_requests_json_line_has_its_code_as_a_field(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The README: a gRPC request's line "has it as the `grpc_code` field beside the HTTP
    equivalent, `status`"; the JSON lines dropped it (found by a tester)."""
    with caplog.at_level(logging.INFO, logger="duetime.requests"):
        log_request(
            protocol="grpc", model="mlp", version=None, status=400, reason="bad shape",
            trace_id=None, grpc_code="INVALID_ARGUMENT",
        )  # fmt: skip
    (record,) = [r for r in caplog.records if r.name == "duetime.requests"]
    doc = json.loads(JsonFormatter().format(record))
    assert (doc["grpc_code"], doc["status"]) == ("INVALID_ARGUMENT", 400)
    assert doc["message"] == "grpc mlp INVALID_ARGUMENT: bad shape"


def test_text_lines_escape_control_characters() -> None:
    """A CR/LF in a client's value (here a model name) forged a line of its own; an ESC reached
    the terminal. Each is escaped, and a traceback's lines are indented under their record."""
    sent = "x\n2026-01-01 00:00:00,000 CRITICAL duetime.auth: FORGED\r\x1b[2J\x00\x85\u2028\t"
    record = logging.LogRecord(
        "duetime.requests", logging.INFO, __file__, 1, "http %s 404", (sent,), None
    )
    line = TextFormatter(TEXT_LINE).format(record)
    assert "\n" not in line
    assert line.endswith(
        "http x\\n2026-01-01 00:00:00,000 CRITICAL duetime.auth: FORGED\\r\\x1b[2J\\x00\\x85"
        "\\u2028\\t 404"
    )
    try:
        raise ValueError("bad\n2026-01-01 00:00:00,000 CRITICAL duetime.auth: FORGED")
    except ValueError:
        failed = logging.LogRecord(
            "duetime", logging.ERROR, __file__, 1, "boom", None, sys.exc_info()
        )
    first, *rest = TextFormatter(TEXT_LINE).format(failed).split("\n")
    assert first.endswith("ERROR duetime: boom")
    assert rest
    assert all(line.startswith("    ") for line in rest)
    assert "    Traceback (most recent call last):" in rest


@pytest.mark.usefixtures("restore_logging")
def test_a_model_name_cannot_forge_a_log_line(
    mlp_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tester's report: with `--log-level info` a URL naming the model
    "x%0A2026-01-01 ... CRITICAL ..." wrote a CRITICAL line of the client's making."""
    configure_logging("info", "text")  # (as `duetime serve --log-level info` does)
    running, thread = start_server(
        ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0)
    )
    forged = "2026-01-01 00:00:00,000 CRITICAL duetime.auth: FORGED"
    try:
        path = "/v2/models/x%0A" + forged.replace(" ", "%20") + "/infer"
        assert post(running.http, path, b"{}", {}) == 404
    finally:
        stop_server(running, thread)
    lines = capsys.readouterr().err.splitlines()
    assert not [line for line in lines if line.startswith(forged)]
    (line,) = [line for line in lines if "INFO duetime.requests: http x" in line]
    assert f"http x\\n{forged} 404: Request for unknown model: 'x\\n{forged}'" in line


def test_server_errors_log_at_warning_and_client_errors_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """(503 and 504 are load refusals, thousands a second at overload: at INFO, with the 4xx;
    a 503 at WARNING wrote 4,394 lines in 3 s of gzip overload.)"""
    with caplog.at_level(logging.INFO, logger="duetime.requests"):
        for status in (500, 503, 504, 429, 501, 505, 502):
            log_request(protocol="http", model="m", version=None, status=status, reason="x",
                        trace_id="t")  # fmt: skip
    # (501, a v1 explain, and 505, an HTTP version not spoken, are the client's asking: any
    # client wrote WARNING lines with them, found by a tester)
    levels = [logging.WARNING] + [logging.INFO] * 5 + [logging.WARNING]
    assert [r.levelno for r in caplog.records] == levels


@pytest.mark.parametrize("rate", [0.01, 0.1, 0.3, 0.4, 0.5, 0.7, 0.9, 0.999])
def test_access_sampler_takes_its_share(rate: float) -> None:
    """A share of 0.7 logged every success, 0.4 half, 0.3 a third (every n-th, n = 1 / rate
    rounded: found by a tester)."""
    sampler = AccessSampler(rate)
    taken = [sampler.take() for _ in range(10_000)]
    assert abs(sum(taken) - rate * 10_000) <= 1
    assert abs(sum(taken[:100]) - rate * 100) <= 1  # (spread evenly, not in bursts)


def test_access_sampler_takes_none_or_all() -> None:
    assert not any(AccessSampler(0.0).take() for _ in range(100))
    assert all(AccessSampler(1.0).take() for _ in range(100))
