"""`duetime replay`: a capture sent to a real server that records what it got (count, order,
inputs, timing kept); a slow target that must not delay the schedule; `--compare-outputs` on a
changed model version; broken captures; the schedule arithmetic.

The server shares this process (and its GIL) with the replay, on a machine that may be busy: no
figure of timing is asserted, only what a kept schedule implies whatever the load.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import math
import socket
import socketserver
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import RunningServer, start_server, stop_server
from repo_models import scale_model, write_version

from duetime.cli import main as cli_main
from duetime.config import ServerSettings
from duetime.frontend.rest import parse_infer_request
from duetime.loops import new_event_loop
from duetime.tools.capture import CapturedRequest, CapturedTensor, CaptureWriter, read_capture
from duetime.tools.outcomes import Outcome
from duetime.tools.replay import (
    LOOP_EARLY_NS,
    Replay,
    ReplayConfig,
    load_plan,
    replay_async,
    run_replay,
)
from duetime.tools.replay_results import answered_none

pytestmark = pytest.mark.timeout(120)

MS = 1_000_000


def captured(
    index: int, arrival_ns: int, x: np.ndarray, *, model: str = "same", **fields: Any
) -> CapturedRequest:
    record = CapturedRequest(
        arrival_ns=arrival_ns, protocol="http", model=model, version=None,
        request_id=f"q{index}", inputs=[CapturedTensor.of("x", x)], outputs_wanted=None,
        parameters={}, due_in_ns=None, priority=0, headers={}, trace_id=None, status=200,
        error=None, latency_ns=0, answered_version=None, variant=None, outputs=None,
    )  # fmt: skip
    for name, value in fields.items():
        setattr(record, name, value)
    return record


def inputs(index: int, rows: int = 1) -> np.ndarray:
    return np.random.default_rng(index).standard_normal((rows, 4)).astype(np.float32)


def write(path: Path, records: list[CapturedRequest]) -> Path:
    with CaptureWriter(path) as writer:
        for record in records:
            writer.write(record)
    return path


def traffic(count: int = 30) -> list[CapturedRequest]:
    """Irregular arrivals over ~0.5 s, mixed versions, due times, headers and batch sizes."""
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.uniform(5, 30, count) * MS).astype(np.int64)
    return [
        captured(
            i, int(arrivals[i]), inputs(i, rows=1 + i % 3),
            version="1" if i % 2 else None,
            due_in_ns=200 * MS if i % 3 == 0 else None,
            headers={"x-tenant": f"t{i % 4}"},
            parameters={"tag": f"p{i}"},
        )
        for i in range(count)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def scale_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`same`: y = 2x; `changed`: version 1 y = 2x, version 2 (the default) y = 3x."""
    repo = tmp_path_factory.mktemp("scale")
    write_version(repo, "same", 1, scale_model(2.0))
    write_version(repo, "changed", 1, scale_model(2.0))
    write_version(repo, "changed", 2, scale_model(3.0))
    (repo / "changed" / "config.toml").write_text("[version_policy]\nall = {}\n")
    return repo


@pytest.fixture(scope="module")
def scale_server(scale_repo: Path) -> Iterator[RunningServer]:
    settings = ServerSettings(model_repository=scale_repo, http_port=0, grpc_port=0)
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


def config(capture: Path, target: str, **fields: Any) -> ReplayConfig:
    return ReplayConfig(capture, target, progress=False, drain_s=10.0, **fields)


# -- against a real server that records what it gets ---------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_round_trip_keeps_count_order_inputs_and_timing(
    scale_repo: Path, tmp_path: Path, protocol: str
) -> None:
    original = traffic()
    capture = write(tmp_path / "in.cap", original)
    seen_path = tmp_path / "seen.cap"
    settings = ServerSettings(
        model_repository=scale_repo, http_port=0, grpc_port=0, record_path=seen_path
    )
    running, thread = start_server(settings)
    try:
        target = f"{protocol}://{running.http if protocol == 'http' else running.grpc}"
        began = time.perf_counter_ns()
        doc = run_replay(config(capture, target)).to_json()
        elapsed_ns = time.perf_counter_ns() - began
    finally:
        stop_server(running, thread)
    # (a shared, busy CPU may make an answer late by the client's clock: it still counts)
    assert (doc["sent"], doc["ok"] + doc["late"], doc["errors"]) == (30, 30, 0)
    assert doc["statuses"] == {"200": 30}
    # NOTE: paired by id, not sorted by arrival: on a busy 2-core machine the server can take two
    # sends 5 ms apart in the other order
    by_id = {r.request_id: r for r in read_capture(seen_path)}
    assert sorted(by_id) == sorted(r.request_id for r in original)
    seen = [by_id[r.request_id] for r in original]
    assert {r.protocol for r in seen} == {protocol}
    for sent, got in zip(original, seen, strict=True):
        assert got.inputs[0].data == sent.inputs[0].data
        assert got.inputs[0].shape == sent.inputs[0].shape
        assert got.version == sent.version
        assert got.headers["x-tenant"] == sent.headers["x-tenant"]
        assert got.parameters["tag"] == sent.parameters["tag"]
        if sent.due_in_ns is None:
            assert got.due_in_ns is None
        else:  # the timeout parameter: due from the server's arrival, recorded a little later
            assert got.due_in_ns is not None
            assert got.due_in_ns <= math.ceil(sent.due_in_ns / 1000) * 1000
    # NOTE: no figure of how close to schedule the sends went (the project's rule: a busy machine
    # delays any of them by any amount; bench/ measures that). What holds under any load: no send
    # leaves before its scheduled time, but for the timer's fixed lead, so the run lasts the
    # capture's span instead of sending at once, and the schedule error is reported.
    span_ns = original[-1].arrival_ns - original[0].arrival_ns
    assert elapsed_ns >= span_ns - LOOP_EARLY_NS
    lag = doc["schedule_error_us"]
    assert all(math.isfinite(lag[name]) for name in ("p50", "p99", "p999", "max"))
    assert -LOOP_EARLY_NS / 1000 <= lag["p50"] <= lag["p99"] <= lag["p999"]
    assert lag["max"] >= 0
    assert 0 <= lag["within_1ms"] <= 1


def test_the_progress_line_counts_ends_by_the_tables_names(tmp_path: Path) -> None:
    capture = write(tmp_path / "in.cap", traffic(8))
    settings = config(capture, "http://127.0.0.1:9")
    replay = Replay(load_plan(settings), settings)
    ends = [Outcome.OK, Outcome.LATE, Outcome.REJECTED, Outcome.REJECTED, Outcome.EXPIRED]
    for at, outcome in enumerate(ends):
        replay.recorder.sent(at)
        replay.recorder.ended(at + 1000, 1000, outcome)
    replay.next = len(ends)
    snap = replay.snapshot()
    assert (snap.sent, snap.late, snap.rejected, snap.expired, snap.errors) == (5, 1, 2, 1, 0)


def test_loop_and_speed(scale_server: RunningServer, tmp_path: Path) -> None:
    original = traffic(10)
    capture = write(tmp_path / "in.cap", original)
    settings = config(capture, f"http://{scale_server.http}", loops=3, speed=4.0)
    plan = load_plan(settings)
    first = original[0].arrival_ns
    assert plan.offsets_ns == [round((r.arrival_ns - first) / 4) for r in original]
    replay = Replay(plan, settings)
    replay.start = 1_000
    gap = plan.offsets_ns[-1] // 9  # one mean gap between loops
    assert plan.span_ns == plan.offsets_ns[-1] + gap
    assert replay.scheduled(10) == 1_000 + plan.span_ns
    assert replay.scheduled(23) == 1_000 + 2 * plan.span_ns + plan.offsets_ns[3]
    doc = run_replay(settings, plan).to_json()
    assert (doc["sent"], doc["ok"] + doc["late"]) == (30, 30)
    assert (doc["loops"], doc["requests_in_capture"]) == (3, 10)
    assert doc["duration_s"] == pytest.approx(3 * plan.span_ns / 1e9 - gap / 1e9, abs=0.1)


# -- a slow target: open loop must not wait for answers ------------------------------------------


class SlowTarget:
    """A v2-ish HTTP server answering each request after `delay_s`, noting when it arrived."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.arrivals: list[tuple[int, str, bytes]] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
                body = await reader.readexactly(int(headers["content-length"]))
                self.arrivals.append((time.perf_counter_ns(), lines[0], head + body))
                await asyncio.sleep(self.delay_s)
                answer = b'{"model_name":"m","outputs":[]}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(answer), answer))  # fmt: skip
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def test_slow_answers_do_not_delay_later_sends(tmp_path: Path) -> None:
    records = [captured(i, i * 10 * MS, inputs(i), model="m") for i in range(12)]
    capture = write(tmp_path / "in.cap", records)

    async def scenario() -> tuple[dict[str, Any], SlowTarget]:
        target = SlowTarget(delay_s=0.3)
        port = await target.start()
        try:
            settings = config(capture, f"127.0.0.1:{port}", connections=2)
            result = await replay_async(settings, load_plan(settings))
            return result.to_json(), target
        finally:
            await target.aclose()

    loop = new_event_loop()
    try:
        doc, target = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert doc["ok"] == 12
    assert doc["replayer"]["connections_opened"] >= 12  # none reused while busy
    assert doc["replayer"]["waited_for_connection"] == 0
    spread_ms = (target.arrivals[-1][0] - target.arrivals[0][0]) / MS
    assert spread_ms < 200  # 110 ms of schedule; one slow answer would have added 300
    assert doc["latency_us"]["p50"] > 290_000  # measured from the scheduled send
    line, raw = target.arrivals[0][1], target.arrivals[0][2]
    assert line == "POST /v2/models/m/infer HTTP/1.1"
    head, _, body = raw.partition(b"\r\n\r\n")
    length = int(head.split(b"Inference-Header-Content-Length: ")[1].split(b"\r\n")[0])
    request, _ = parse_infer_request(body, length, "m", None)
    np.testing.assert_array_equal(request.inputs["x"], inputs(0))
    assert request.id == "q0"


# -- comparing outputs ---------------------------------------------------------------------------


def changed_traffic() -> list[CapturedRequest]:
    """Answers recorded from version 1 (2x); the last five named no version (now 3x)."""
    records = []
    for i in range(10):
        x = inputs(i, rows=2)
        records.append(captured(
            i, i * 2 * MS, x, model="changed", version="1" if i < 5 else None,
            outputs=[CapturedTensor.of("y", 2 * x)],
        ))  # fmt: skip
    return records


def test_compare_outputs_finds_the_changed_version(
    scale_server: RunningServer, tmp_path: Path
) -> None:
    capture = write(tmp_path / "in.cap", changed_traffic())
    target = f"http://{scale_server.http}"
    doc = run_replay(config(capture, target, compare_outputs=True)).to_json()
    compare = doc["compare"]
    assert (compare["compared"], compare["mismatched"]) == (10, 5), doc["error_messages"]
    first = compare["first_mismatches"]
    assert [m["index"] for m in first] == [5, 6, 7, 8, 9]
    x = inputs(5, rows=2)
    assert first[0]["request_id"] == "q5"
    assert first[0]["output"] == "y"
    assert first[0]["max_abs_error"] == pytest.approx(float(np.abs(x).max()), rel=1e-5)
    loose = run_replay(config(capture, target, compare_outputs=True, rtol=1.0)).to_json()
    assert loose["compare"]["mismatched"] == 0
    grpc = run_replay(config(capture, f"grpc://{scale_server.grpc}", compare_outputs=True))
    assert grpc.to_json()["compare"]["mismatched"] == 5, grpc.to_json()["error_messages"]


def test_cli_replay_exits_3_on_differences_and_writes_json(
    scale_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = write(tmp_path / "in.cap", changed_traffic())
    out = tmp_path / "out.json"
    argv = ["replay", str(capture), "--target", f"http://{scale_server.http}",
            "--compare-outputs", "--json", str(out), "--report", str(tmp_path / "r.html"),
            "-q"]  # fmt: skip
    assert cli_main(argv) == 3
    assert "data:image/png;base64," in (tmp_path / "r.html").read_text()
    printed = capsys.readouterr().out
    assert "10 compared, 5 differ" in printed
    assert "request 5 (id 'q5'" in printed
    assert "within 1 ms" in printed
    doc = json.loads(out.read_text())
    assert {"sent", "ok", "errors", "latency_us", "schedule_error_us", "statuses", "timeline",
            "histogram", "compare", "replayer"} <= set(doc)  # fmt: skip
    assert set(doc["latency_us"]) >= {"p50", "p99", "p999"}
    assert set(doc["schedule_error_us"]) >= {"p50", "p99", "within_1ms"}
    assert sum(doc["timeline"]["sent"]) == 10


def test_compare_outputs_fails_when_recorded_answers_are_not_answered_again(
    scale_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # answered (and recorded) by a model the target does not serve: every replay is a 404,
    # nothing is compared, and that is a failed comparison, not a pass; and the target serves
    # none of the capture's models: it failed the replay (1, ahead of the comparison's 3)
    records = changed_traffic()[:3]
    for record in records:
        record.model = "gone"
    capture = write(tmp_path / "in.cap", records)
    argv = ["replay", str(capture), "--target", f"http://{scale_server.http}",
            "--compare-outputs", "--json", str(tmp_path / "out.json"), "-q"]  # fmt: skip
    assert cli_main(argv) == 1
    captured = capsys.readouterr()
    assert "the target answered every request 404 (NOT_FOUND)" in captured.err
    printed = captured.out
    assert "0 compared, 0 differ" in printed
    assert "outputs: FAILED (3 of 3 recorded answers not answered 200)" in printed
    compare = json.loads((tmp_path / "out.json").read_text())["compare"]
    assert (compare["recorded"], compare["compared"], compare["not_answered"]) == (3, 0, 3)


def test_a_recorded_output_that_does_not_read_is_not_comparable_and_settles(
    scale_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # CRC-valid, but element 0 of the BYTES output claims 255 bytes: raised while comparing,
    # it once left the request unsettled (the whole --drain waited, "errors 1", exit 0)
    bad = CapturedTensor("y", "BYTES", (1, 4), b"\xff\x00\x00\x00ab")
    capture = write(tmp_path / "in.cap", [captured(0, 0, inputs(0), outputs=[bad])])
    out = tmp_path / "out.json"
    argv = ["replay", str(capture), "--target", f"http://{scale_server.http}",
            "--compare-outputs", "--drain", "3", "--json", str(out), "-q"]  # fmt: skip
    assert cli_main(argv) == 3
    printed = capsys.readouterr().out
    assert "1 not comparable (recorded outputs unreadable)" in printed
    assert "request 0: not comparable, its recorded outputs do not read" in printed
    doc = json.loads(out.read_text())
    assert (doc["ok"], doc["errors"], doc["unanswered"]) == (1, 0, 0)
    compare = doc["compare"]
    assert (compare["compared"], compare["not_comparable"], compare["not_answered"]) == (0, 1, 0)


def test_a_fault_while_settling_an_answer_settles_it_as_an_error(tmp_path: Path) -> None:
    capture = write(tmp_path / "in.cap", [captured(0, 0, inputs(0))])
    plan = load_plan(config(capture, "127.0.0.1:1"))
    replay = Replay(plan, config(capture, "127.0.0.1:1"))
    replay.next = replay.outstanding = 1
    plan.dues_ns = []  # (read while settling a 200: raises IndexError)
    replay.answered(0, 200, None, None, None)
    assert replay.outstanding == 0
    assert replay.tally.errors == 1
    assert replay.tally.messages == [
        "request 0: the replay failed on its answer: IndexError: list index out of range"
    ]


def test_unknown_model_counts_errors_by_status(scale_server: RunningServer, tmp_path: Path) -> None:
    records = [captured(i, i * MS, inputs(i), model="nosuch") for i in range(3)]
    doc = run_replay(config(write(tmp_path / "in.cap", records), scale_server.http)).to_json()
    assert (doc["sent"], doc["ok"], doc["errors"]) == (3, 0, 3)
    assert doc["statuses"] == {"404": 3}
    assert "nosuch" in doc["error_messages"][0]


# -- broken captures and flags -------------------------------------------------------------------


@pytest.fixture
def listening() -> Iterator[str]:
    """HOST:PORT of a socket that takes connections (and never answers)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        host, port = server.getsockname()
        yield f"{host}:{port}"


def test_truncated_and_corrupt_captures_name_the_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], listening: str
) -> None:
    path = write(tmp_path / "in.cap", traffic(5))
    data = path.read_bytes()
    truncated = tmp_path / "truncated.cap"
    truncated.write_bytes(data[:-10])
    assert cli_main(["replay", str(truncated), "--target", listening, "-q"]) == 2
    err = capsys.readouterr().err
    assert "record 4" in err
    assert "ends" in err
    assert "Traceback" not in err
    corrupt = tmp_path / "corrupt.cap"
    broken = bytearray(data)
    broken[-5] ^= 0xFF  # in the last record's tensor data
    corrupt.write_bytes(bytes(broken))
    assert cli_main(["replay", str(corrupt), "--target", listening, "-q"]) == 2
    err = capsys.readouterr().err
    assert "record 4" in err
    assert "CRC32" in err
    empty = write(tmp_path / "empty.cap", [])
    assert cli_main(["replay", str(empty), "--target", listening]) == 2
    assert "holds no requests" in capsys.readouterr().err
    assert cli_main(["replay", str(tmp_path / "none.cap"), "--target", listening]) == 2
    assert "no such capture file" in capsys.readouterr().err


def test_the_target_is_reached_before_the_capture_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # (a replay to no server once read and encoded all of a 517 MiB capture, 33 s, first)
    data = bytearray(write(tmp_path / "in.cap", traffic(5)).read_bytes())
    data[-5] ^= 0xFF  # the last record is corrupt: found only by reading it
    corrupt = tmp_path / "corrupt.cap"
    corrupt.write_bytes(bytes(data))
    assert cli_main(["replay", str(corrupt), "--target", "127.0.0.1:1", "-q"]) == 1
    assert "--target: cannot connect to 127.0.0.1:1" in capsys.readouterr().err


def test_the_plan_holds_the_capture_once(tmp_path: Path) -> None:
    # each record encoded as it is read: decoded records and their encoded copies were once
    # held together (2.3 times the file here, 1.35 GB for a 517 MiB capture)
    x = np.random.default_rng(0).standard_normal((64, 40)).astype(np.float32)  # 10 KiB
    capture = write(tmp_path / "in.cap", [captured(i, i * MS, x) for i in range(200)])
    tracemalloc.start()
    try:
        plan = load_plan(config(capture, "127.0.0.1:1"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(plan) == 200
    assert peak < 1.5 * capture.stat().st_size


def test_bad_flags_and_an_unreachable_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = str(write(tmp_path / "in.cap", traffic(2)))
    assert cli_main(["replay", capture, "--target", "ftp://x:1"]) == 2
    assert "--target: expected http://HOST:PORT" in capsys.readouterr().err
    assert cli_main(["replay", capture, "--target", "http://x:1/v2/models"]) == 2  # (a path
    assert "--target: expected http://HOST:PORT" in capsys.readouterr().err  # was dropped)
    assert cli_main(["replay", capture, "--target", "127.0.0.1:1", "--speed", "0"]) == 2
    assert "--speed" in capsys.readouterr().err
    assert cli_main(["replay", capture, "--target", "grpc://h:1", "--protocol", "http"]) == 2
    assert "contradicts" in capsys.readouterr().err
    assert cli_main(["replay", capture, "--target", "127.0.0.1:1", "-q"]) == 1
    assert "cannot connect" in capsys.readouterr().err


def test_an_http_target_at_a_grpc_port_is_refused_before_sending(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It sent the whole capture, every request failing ("malformed HTTP response"), and exited
    0 (found by a tester)."""
    capture = str(write(tmp_path / "in.cap", traffic(3)))
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert cli_main(["replay", capture, "--target", f"http://127.0.0.1:{port}", "-q"]) == 1
    finally:
        server.stop(0)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert f"--target http://127.0.0.1:{port}: not an HTTP/1.1 server (is it the gRPC port?)" in err
    assert err.isprintable()
    assert len(err.splitlines()) == 1
    assert "sent" not in captured.out  # (stopped before sending)


@contextlib.contextmanager
def http_to_get_only() -> Iterator[str]:
    """HOST:PORT of a target that answers a GET in HTTP/1.1, anything else in bytes that are
    not HTTP (then hangs up)."""

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            if self.rfile.readline().startswith(b"GET "):
                self.wfile.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            else:
                self.wfile.write(b"SSH-2.0-not-http\r\n")

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler) as server:
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, name="get-only", daemon=True)
        thread.start()
        try:
            host, port = server.server_address[:2]
            yield f"{host}:{port}"
        finally:
            server.shutdown()
            thread.join(timeout=10)


def test_a_replay_the_target_answered_none_of_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every request failing without an answer once read as a replay that went through (exit
    0; found by a tester)."""
    capture = str(write(tmp_path / "in.cap", traffic(3)))
    out = tmp_path / "out.json"
    with http_to_get_only() as target:  # (its GET answer passes the check of the target)
        argv = ["replay", capture, "--target", target, "-q", "--drain", "5", "--json", str(out)]
        assert cli_main(argv) == 1
    printed = capsys.readouterr().out
    assert "warning: the target answered none of the 3 requests it was sent" in printed
    doc = json.loads(out.read_text())
    assert (doc["sent"], doc["ok"], doc["errors"], doc["statuses"]) == (3, 0, 3, {"0": 3})


@pytest.mark.parametrize(
    ("statuses", "none"),
    [({"0": 3}, True), ({"0": 2, "503": 1}, False), ({"200": 3}, False), ({}, False)],
)  # fmt: skip
def test_answered_none_means_no_request_had_a_status(statuses: dict[str, int], none: bool) -> None:
    assert answered_none({"statuses": statuses}) is none


# -- bench --record: a bench run's traffic, replayed ---------------------------------------------


def test_bench_record_then_replay(
    server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / "bench.cap"
    out = tmp_path / "bench.json"
    argv = ["bench", "--http", server.http, "--model", "mlp", "--rate", "300", "--duration",
            "0.3", "--warmup", "0.1", "--timeout-ms", "100,400", "--priority", "1",
            "--json", str(out), "--record", str(capture), "-q"]  # fmt: skip
    assert cli_main(argv) == 0
    assert f"wrote {capture}" in capsys.readouterr().out
    records = list(read_capture(capture))
    assert len(records) > 60  # warm-up and measured requests alike
    arrivals = [r.arrival_ns for r in records]
    assert arrivals[0] == 0
    assert arrivals == sorted(arrivals)
    assert arrivals[-1] < 0.4e9
    assert {r.due_in_ns for r in records} == {100 * MS, 400 * MS}
    assert {r.parameters["timeout"] for r in records} == {100_000, 400_000}
    assert {r.priority for r in records} == {1}
    assert {r.inputs[0].shape for r in records} == {(1, 40)}
    assert {r.status for r in records} <= {200, 429, 504}
    doc = run_replay(config(capture, f"http://{server.http}")).to_json()
    assert doc["sent"] == len(records)
    assert doc["ok"] + doc["late"] + doc["rejected"] + doc["expired"] == len(records)
