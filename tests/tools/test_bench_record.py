"""`duetime bench --record`: the capture of a run, whatever became of its requests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from duetime.tools.bench_record import UNSENT_ERROR, write_bench_capture
from duetime.tools.capture import read_capture
from duetime.tools.config import BenchConfig
from duetime.tools.drivers import Ledger
from duetime.tools.outcomes import DUE_PASSED_UNSENT, Outcome
from duetime.tools.payloads import PayloadSpec, encode
from duetime.tools.replay_payloads import sent_as_json


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        self.now += 1_000_000
        return self.now


def _run(
    config: BenchConfig, ends: list[Outcome], messages: dict[int, str] | None = None
) -> tuple[Ledger, list[list[dict]], list]:
    ledger = Ledger(clock=_Clock())
    for index, outcome in enumerate(ends):
        rid = ledger.add(ledger.clock(), 0)
        message = "refused" if outcome == Outcome.UNSENT else None
        ledger.finish(rid, outcome, (messages or {}).get(index, message))
    inputs = [{"x": np.zeros((1, 4), np.float32)}, {"x": np.ones((1, 4), np.float32)}]
    host, port = config.host_port()
    spec = PayloadSpec(config.protocol, config.model, config.batch, None, host, port)
    payloads = [[encode(spec, i, config.classes[0]) for i in inputs]]
    return ledger, [inputs], payloads


def test_a_request_never_sent_is_recorded_with_no_outcome(tmp_path: Path) -> None:
    config = BenchConfig(model="m", address="127.0.0.1:9")
    ends = [Outcome.OK, Outcome.UNSENT, Outcome.NO_ANSWER, Outcome.UNSENT]
    ledger, pools, payloads = _run(config, ends)
    path = tmp_path / "run.dtcap"
    assert write_bench_capture(path, config, ledger, pools, payloads) == 4
    records = list(read_capture(path))
    assert [r.status for r in records] == [200, 0, 499, 0]
    assert [r.error for r in records] == [None, UNSENT_ERROR, None, UNSENT_ERROR]
    assert records[1].latency_ns == 0


def test_a_request_dropped_unsent_past_its_due_time_is_not_recorded_as_the_servers_504(
    tmp_path: Path,
) -> None:
    """The generator drops a request whose due time passed while it waited for a connection
    (EXPIRED, as a client with a deadline would not send it): it was recorded as a 504."""
    config = BenchConfig(model="m", address="127.0.0.1:9")
    ends = [Outcome.EXPIRED, Outcome.EXPIRED]
    ledger, pools, payloads = _run(config, ends, {1: DUE_PASSED_UNSENT})
    path = tmp_path / "run.dtcap"
    write_bench_capture(path, config, ledger, pools, payloads)
    server_504, dropped = read_capture(path)
    assert (server_504.status, server_504.error) == (504, None)
    assert (dropped.status, dropped.error, dropped.latency_ns) == (0, DUE_PASSED_UNSENT, 0)


@pytest.mark.parametrize(("protocol", "as_json"), [("http-json", True), ("http-binary", False)])
def test_the_capture_keeps_how_each_request_was_encoded(
    tmp_path: Path, protocol: str, as_json: bool
) -> None:
    config = BenchConfig(model="m", protocol=protocol, address="127.0.0.1:9")  # type: ignore[arg-type]
    ledger, pools, payloads = _run(config, [Outcome.OK, Outcome.OK])
    path = tmp_path / "run.dtcap"
    write_bench_capture(path, config, ledger, pools, payloads)
    records = list(read_capture(path))
    assert [sent_as_json(r) for r in records] == [as_json, as_json]
    body = payloads[0][0].partition(b"\r\n\r\n")[2]
    assert records[0].headers["content-length"] == str(len(body))
    assert "host" not in records[0].headers
