"""`duetime bench --record`: the capture of a run, whatever became of its requests, which a
replay sends as bench did; a capture that fails is not left behind."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import numpy as np
import pytest

from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.tools.bench_record import UNSENT_ERROR, write_bench_capture
from duetime.tools.capture import CapturedRequest, CapturedTensor, CaptureWriter, read_capture
from duetime.tools.config import BenchConfig
from duetime.tools.drivers import Ledger
from duetime.tools.outcomes import DUE_PASSED_UNSENT, Outcome
from duetime.tools.payloads import PayloadSpec, encode
from duetime.tools.replay import ReplayConfig, load_plan
from duetime.tools.replay_payloads import grpc_request, http_request, sent_as_json


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
    spec = PayloadSpec(config.protocol, config.model, config.batch, config.priority, host, port)
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


# -- what a replay of it sends -------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http-binary", "http-json", "grpc"])
@pytest.mark.parametrize("timeouts_ms", [(), (20,)], ids=["no-due-time", "due-time"])
def test_a_bench_capture_replays_as_the_bytes_bench_sent(
    tmp_path: Path, protocol: str, timeouts_ms: tuple[float, ...]
) -> None:
    """Bench sends no request id: it recorded `bench-N`, which the replay then sent (its
    bodies were not bench's, nor its gRPC ModelInferRequest, and the server echoed the id);
    it padded the HTTP `timeout` too, where a replay writes it as JSON does."""
    config = BenchConfig(model="m", protocol=protocol, address="127.0.0.1:9",  # type: ignore[arg-type]
                         timeouts_ms=timeouts_ms, priority=3)  # fmt: skip
    ledger, pools, payloads = _run(config, [Outcome.OK, Outcome.OK])
    path = tmp_path / "run.dtcap"
    write_bench_capture(path, config, ledger, pools, payloads)
    records = list(read_capture(path))
    assert [r.request_id for r in records] == ["", ""]
    for k, captured in enumerate(records):
        if protocol == "grpc":
            assert grpc_request(captured).data == payloads[0][k].data
            assert grpc_request(captured).deadline_s == payloads[0][k].deadline_s
        else:
            assert http_request(captured, "127.0.0.1", 9) == payloads[0][k]


def test_the_ids_an_older_bench_capture_holds_are_not_sent(tmp_path: Path) -> None:
    """Captures bench wrote before hold `bench-N` ids it never sent: a replay leaves them out,
    unless the capture says they were sent; another capture's ids are sent as recorded."""
    inputs = [CapturedTensor.of("x", np.ones((1, 4), np.float32))]

    def capture(name: str, meta: dict[str, object]) -> Path:
        with CaptureWriter(tmp_path / name, meta=meta) as writer:
            for rid in range(2):
                writer.write(CapturedRequest(
                    arrival_ns=rid, protocol="grpc", model="m", version=None,
                    request_id=f"bench-{rid}", inputs=inputs, outputs_wanted=None, parameters={},
                    due_in_ns=None, priority=0, headers={}, trace_id=None, status=200,
                    error=None, latency_ns=0, answered_version=None, variant=None, outputs=None,
                ))  # fmt: skip
        return tmp_path / name

    def ids(path: Path, target: str) -> list[str]:
        plan = load_plan(ReplayConfig(path, target, progress=False))
        if target.startswith("grpc"):
            return [pb.ModelInferRequest.FromString(p.data).id for p in plan.payloads]
        found = [re.search(rb'"id":"([^"]*)"', p) for p in plan.payloads]  # (in the JSON head)
        return [m[1].decode() if m else "" for m in found]

    older = capture("older.cap", {"written_by": "duetime bench", "model": "m"})
    for target in ("grpc://127.0.0.1:1", "http://127.0.0.1:1"):
        assert ids(older, target) == ["", ""]
    said = capture("said.cap", {"written_by": "duetime bench", "ids_sent": True})
    assert ids(said, "grpc://127.0.0.1:1") == ["bench-0", "bench-1"]
    served = capture("served.cap", {"source": "duetime serve"})
    assert ids(served, "http://127.0.0.1:1") == ["bench-0", "bench-1"]


# -- a capture that cannot be written ------------------------------------------------------------


def test_a_capture_that_fails_while_written_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was left there, holding some of the requests (or its header alone): `duetime replay`
    would send it as if it were the run, and a rerun refused to overwrite it."""
    config = BenchConfig(model="m", address="127.0.0.1:9")
    ledger, pools, payloads = _run(config, [Outcome.OK] * 3)
    written = CaptureWriter.write

    def fails_on_the_second(writer: CaptureWriter, record: CapturedRequest) -> None:
        if writer.records == 1:
            writer.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        written(writer, record)

    monkeypatch.setattr(CaptureWriter, "write", fails_on_the_second)
    path = tmp_path / "run.dtcap"
    with pytest.raises(OSError, match="No space left"):
        write_bench_capture(path, config, ledger, pools, payloads)
    assert not path.exists()


def test_a_file_already_there_is_left_as_it_was(tmp_path: Path) -> None:
    config = BenchConfig(model="m", address="127.0.0.1:9")
    ledger, pools, payloads = _run(config, [Outcome.OK])
    path = tmp_path / "run.dtcap"
    path.write_bytes(b"someone else's")
    with pytest.raises(FileExistsError):
        write_bench_capture(path, config, ledger, pools, payloads)
    assert path.read_bytes() == b"someone else's"
