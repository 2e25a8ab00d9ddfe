"""Throughput and goodput of an overloaded server: answers per second of the time they took
(from the start of the measured window to the last answer counted, `report.rate_span`), not
per second of the window they were sent in.

The serial target below answers one request at a time, each after SERVICE_S: however busy the
machine, N answers take at least N x SERVICE_S, so its rate can never read above 1/SERVICE_S.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from duetime.cli import main as cli_main
from duetime.tools.arrivals import due_classes
from duetime.tools.capture import CapturedRequest, CapturedTensor, CaptureWriter
from duetime.tools.drivers import Ledger
from duetime.tools.outcomes import Outcome
from duetime.tools.report import Records, merge_records, summarize

pytestmark = pytest.mark.timeout(120)

SERVICE_S = 0.02
CAPACITY_RPS = 1 / SERVICE_S
META = {"name": "m", "versions": ["1"], "platform": "x",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]}  # fmt: skip
OUTPUT = {"name": "y", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}
ANSWER = {"model_name": "m", "outputs": [OUTPUT]}


@pytest.fixture
def serial_target() -> Iterator[str]:
    """HOST:PORT of a v2 HTTP server answering one inference at a time, SERVICE_S each."""
    loop = asyncio.new_event_loop()
    lock = asyncio.Lock()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                method, path, _ = line.decode().split(" ", 2)
                length = 0
                while (header := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = header.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
                doc: dict[str, object] = {"max_batch_size": 8} if path.endswith("/config") else META
                if method == "POST":
                    async with lock:
                        await asyncio.sleep(SERVICE_S)
                    doc = ANSWER
                body = json.dumps(doc).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        server.close()
        loop.close()


def test_bench_rates_count_the_answers_over_the_time_they_took(
    serial_target: str, tmp_path: Path
) -> None:
    out = tmp_path / "b.json"
    argv = ["bench", "--http", serial_target, "--model", "m", "--rate", "200", "--arrival",
            "constant", "--duration", "0.2", "--warmup", "0", "--drain", "10", "-q",
            "--json", str(out)]  # fmt: skip
    assert cli_main(argv) == 0
    doc = json.loads(out.read_text())
    overall = doc["overall"]
    assert overall["ok"] == overall["sent"] >= 30  # (all answered, in ~0.8 s: after the window)
    assert 0 < overall["throughput_rps"] <= CAPACITY_RPS
    assert overall["goodput_rps"] <= overall["throughput_rps"]
    assert 0 < doc["throughput_rps"] <= CAPACITY_RPS  # (the fields `duetime report` reads)
    assert doc["rate_span_s"] >= overall["ok"] * SERVICE_S


def test_replay_rates_count_the_answers_over_the_time_they_took(
    serial_target: str, tmp_path: Path
) -> None:
    capture = tmp_path / "c.dtcap"
    x = CapturedTensor.of("x", np.zeros((1, 4), np.float32))
    with CaptureWriter(capture) as writer:
        for i in range(20):
            writer.write(CapturedRequest(
                arrival_ns=i * 1_000_000, protocol="http", model="m", version=None,
                request_id=f"r{i}", inputs=[x], outputs_wanted=None, parameters={},
                due_in_ns=None, priority=0, headers={}, trace_id=None, status=200, error=None,
                latency_ns=0, answered_version=None, variant=None, outputs=None,
            ))  # fmt: skip
    out = tmp_path / "r.json"
    argv = ["replay", str(capture), "--target", f"http://{serial_target}", "--drain", "10",
            "-q", "--json", str(out)]  # fmt: skip
    assert cli_main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["ok"] == 20
    assert 0 < doc["throughput_rps"] <= CAPACITY_RPS  # (sent at 1,000/s, over 19 ms)
    assert doc["goodput_rps"] <= doc["throughput_rps"]
    assert doc["duration_s"] < doc["rate_span_s"]


class _Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def test_answers_after_the_window_stretch_the_span_the_rates_divide_by() -> None:
    clock = _Clock()
    ledger = Ledger(clock)
    second = 1_000_000_000
    for i in range(80):  # sent at 40/s over the 2 s window, answered at 20/s
        clock.now = i * second // 40
        rid = ledger.add(clock.now, 0)
        clock.now = (i + 1) * second // 20
        ledger.finish(rid, Outcome.OK, None)
    clock.now = 7 * second  # (the drain ends later still: no answer then)
    records = ledger.records((0, 2 * second), cpu_s=0.0, waited=0)
    assert records.duration_s == 2.0
    assert records.last_answer_s == 4.0
    summary = summarize(records, due_classes((), ()), open_loop=True)
    assert summary.overall.throughput_rps == pytest.approx(20.0)
    assert summary.overall.goodput_rps == pytest.approx(20.0)
    assert summary.generator.offered_rps == pytest.approx(40.0)  # (sends: over the window)


def test_a_run_answered_within_its_window_divides_by_the_window() -> None:
    records = Records(
        due_class=np.zeros(10, np.int64), outcome=np.zeros(10, np.int8),
        latency_ns=np.full(10, 1_000_000), send_lag_ns=np.zeros(10, np.int64),
        duration_s=2.0, cpu_s=0.0, last_answer_s=1.5,
    )  # fmt: skip
    overall = summarize(records, due_classes((), ()), open_loop=True).overall
    assert overall.throughput_rps == pytest.approx(5.0)
    merged = merge_records([records, Records(**{**_fields(records), "last_answer_s": 4.0})])
    assert merged.last_answer_s == 4.0
    assert summarize(merged, due_classes((), ()), open_loop=True).overall.throughput_rps == 5.0


def _fields(records: Records) -> dict[str, object]:
    return {name: getattr(records, name) for name in Records.__dataclass_fields__}
