"""Traffic capture on a real server (`record_path`): HTTP binary and JSON, gRPC unary and stream,
in-process calls and failures read back from the capture; the recorder's sampling and its
bounded buffer driven directly."""

from __future__ import annotations

import asyncio
import errno
import os
import queue
import random
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, recording_server, start_server
from tritonclient.utils import InferenceServerException

from duetime.clock import FakeClock
from duetime.config import ServerSettings
from duetime.engine import Engine, Ticket
from duetime.errors import ConfigError, InvalidInput
from duetime.frontend.rest import parse_infer_request
from duetime.frontend.sharedmemory import SharedMemoryRegions
from duetime.tools.capture import CapturedRequest, CaptureReader, read_capture
from duetime.tools.capture import format as fmt
from duetime.tools.capture.recorder import CANCELLED_STATUS, UNFINISHED, Recorder
from duetime.types import InferRequest

pytestmark = pytest.mark.timeout(120)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def mlp_input(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 40)).astype(np.float32)


def http_input(array: np.ndarray, binary: bool) -> httpclient.InferInput:
    tensor = httpclient.InferInput("x", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def grpc_input(array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("x", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


def send_traffic(server: RunningServer) -> dict[str, np.ndarray]:
    """One request of each kind; returns the inputs sent, by request id."""
    sent = {f"req-{i}": mlp_input(i + 1, seed=i) for i in range(6)}
    http = httpclient.InferenceServerClient(server.http)
    try:
        http.infer(
            "mlp", [http_input(sent["req-0"], binary=True)], request_id="req-0", timeout=50_000,
            priority=2, headers={"traceparent": TRACEPARENT, "authorization": "Bearer secret",
                                 "x-tenant": "blue"},
        )  # fmt: skip
        http.infer(
            "mlp", [http_input(sent["req-1"], binary=False)], request_id="req-1",
            model_version="1", outputs=[httpclient.InferRequestedOutput("y", binary_data=False)],
        )  # fmt: skip
        with pytest.raises(InferenceServerException):
            http.infer("nosuch", [http_input(sent["req-2"], binary=True)], request_id="req-2")
    finally:
        http.close()
    grpc = grpcclient.InferenceServerClient(server.grpc)
    try:
        grpc.infer(
            "mlp", [grpc_input(sent["req-3"])], request_id="req-3", timeout=80_000,
            headers={"x-ctx-bin": b"\x00\x01\xff", "x-plain": "hello"},
        )  # fmt: skip
        answers: queue.Queue[Any] = queue.Queue()
        grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
        grpc.async_stream_infer("mlp", [grpc_input(sent["req-4"])], request_id="req-4")
        _result, error = answers.get(timeout=30)
        assert error is None
        grpc.stop_stream()
    finally:
        grpc.close()
    engine = server.server.engine
    call = engine.infer_async("mlp", {"x": sent["req-5"]}, timeout=1.0)
    asyncio.run_coroutine_threadsafe(call, server.loop).result(timeout=30)
    return sent


@pytest.fixture(scope="module")
def captured(mlp_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("capture") / "traffic.cap"
    with recording_server(mlp_repo, path) as running:
        send_traffic(running)
        (path.parent / "metrics.txt").write_text(scrape(running))
    return path


def scrape(server: RunningServer) -> str:
    port = server.addresses.metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


@pytest.fixture(scope="module")
def records(captured: Path) -> dict[str, CapturedRequest]:
    return {record.request_id or record.protocol: record for record in read_capture(captured)}


def test_every_request_is_captured_with_its_protocol(records: dict[str, CapturedRequest]) -> None:
    protocols = {key: r.protocol for key, r in records.items()}
    assert protocols == {
        "req-0": "http", "req-1": "http", "req-2": "http", "req-3": "grpc",
        "req-4": "grpc-stream", "engine": "engine",
    }  # fmt: skip


def test_inputs_come_back_byte_for_byte(records: dict[str, CapturedRequest]) -> None:
    for i in range(5):
        (tensor,) = records[f"req-{i}"].inputs
        assert (tensor.name, tensor.datatype, tensor.shape) == ("x", "FP32", (i + 1, 40))
        np.testing.assert_array_equal(tensor.array(), mlp_input(i + 1, seed=i))
    np.testing.assert_array_equal(records["engine"].inputs[0].array(), mlp_input(6, seed=5))


def test_due_times_priority_and_parameters(records: dict[str, CapturedRequest]) -> None:
    binary, json_, grpc, engine = (records[k] for k in ("req-0", "req-1", "req-3", "engine"))
    assert binary.due_in_ns is not None
    # the client's budget exactly: arrivals are stamped at receipt, whence due times count (they
    # were stamped after decoding: each record -> replay round gave the server a tighter one)
    assert binary.due_in_ns == 50_000_000
    assert binary.priority == 2
    assert binary.parameters["timeout"] == 50_000
    assert json_.due_in_ns is None
    assert json_.version == "1"
    assert json_.outputs_wanted == ("y",)
    assert binary.version is None
    assert binary.outputs_wanted is None
    assert grpc.due_in_ns is not None
    assert grpc.due_in_ns == 80_000_000
    assert engine.due_in_ns is not None
    assert 0.99e9 < engine.due_in_ns <= 1e9


def test_outcomes_versions_and_outputs(records: dict[str, CapturedRequest]) -> None:
    for key in ("req-0", "req-1", "req-3", "req-4", "engine"):
        record = records[key]
        assert (record.status, record.error) == (200, None)
        assert (record.answered_version, record.variant) == ("1", "default")
        assert 0 < record.latency_ns < 30e9
        assert record.outputs is not None
        (output,) = record.outputs
        assert (output.name, output.datatype, output.shape[1]) == ("y", "FP32", 3)
    missing = records["req-2"]
    assert missing.status == 404
    assert missing.error is not None
    assert "nosuch" in missing.error
    assert (missing.answered_version, missing.variant, missing.outputs) == (None, None, None)


def record_flags(path: Path) -> list[int]:
    """The flags of each record in the capture at `path`, in file order."""
    with CaptureReader(path) as reader:
        data = path.read_bytes()[reader.header.size :]
    flags, offset = [], 0
    while offset < len(data):
        (length, _crc) = fmt.RECORD_PREFIX.unpack_from(data, offset)
        flags.append(fmt.RECORD_FIXED.unpack_from(data, offset + fmt.RECORD_PREFIX.size)[5])
        offset += fmt.RECORD_PREFIX.size + length
    return flags


def test_http_requests_are_kept_as_their_raw_body(
    captured: Path, records: dict[str, CapturedRequest]
) -> None:
    raw = [bool(flags & fmt.RAW_HTTP) for flags in record_flags(captured)]
    protocols = [r.protocol for r in read_capture(captured)]
    assert raw == [protocol == "http" for protocol in protocols]
    assert records["req-0"].parameters == {
        "timeout": 50_000, "priority": 2, "binary_data_output": True
    }  # fmt: skip
    assert records["req-1"].parameters == {}
    assert records["req-2"].model == "nosuch"


def test_headers_without_credentials_and_trace_id(records: dict[str, CapturedRequest]) -> None:
    record = records["req-0"]
    assert record.trace_id == TRACE_ID
    assert record.headers["x-tenant"] == "blue"
    assert "authorization" not in record.headers
    assert record.headers["inference-header-content-length"].isdigit()  # kept: not a secret
    assert records["req-1"].trace_id is None
    assert "user-agent" in records["req-3"].headers  # gRPC metadata
    # binary metadata (a -bin key's bytes) is left out, as docs/capture-format.md says
    assert records["req-3"].headers["x-plain"] == "hello"
    assert not any(name.endswith("-bin") for name in records["req-3"].headers)


def test_arrivals_are_relative_to_the_capture_start(captured: Path) -> None:
    with CaptureReader(captured) as reader:
        assert reader.header.meta["source"] == "duetime serve"
        assert reader.header.meta["sample"] == 1.0
        arrivals = [r.arrival_ns for r in reader]
    assert all(0 <= t < 120e9 for t in arrivals)


def test_capture_counts_are_exported(captured: Path) -> None:
    text = (captured.parent / "metrics.txt").read_text()
    assert 'duetime_capture_records_total{outcome="dropped"} 0.0' in text
    assert "duetime_capture_buffered" in text


def test_existing_capture_is_not_overwritten(mlp_repo: Path, tmp_path: Path) -> None:
    path = tmp_path / "old.cap"
    path.write_bytes(b"precious")
    settings = ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0,
                              record_path=path)  # fmt: skip
    with pytest.raises(Exception, match="never overwritten"):
        start_server(settings)
    assert path.read_bytes() == b"precious"


def test_a_capture_in_folders_not_made_yet_makes_them(mlp_repo: Path, tmp_path: Path) -> None:
    """It failed "No such file or directory (a capture is never overwritten: choose a new file
    name)", a hint for a file that exists, after the models had loaded (found by a tester):
    its folders are made, as the other tools' outputs' are."""
    path = tmp_path / "new" / "folder" / "live.cap"
    with recording_server(mlp_repo, path):
        pass
    assert path.is_file()


@pytest.mark.parametrize("where", ["a folder", "a name too long"])
def test_a_capture_that_cannot_be_made_fails_before_the_models_load(
    mlp_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A name over 255 bytes failed with a traceback, from the check made ahead of the file
    (found by a tester): the file is made before the models load, and its error told."""
    loaded: list[Path] = []
    monkeypatch.setattr(Engine, "load_repository", lambda self, root: loaded.append(root))
    path, error = {
        "a folder": (tmp_path, "it is a folder; give a file name"),
        "a name too long": (tmp_path / ("x" * 300), "File name too long"),
    }[where]
    settings = ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0,
                              record_path=path)  # fmt: skip
    with pytest.raises(ConfigError, match=rf"'record_path' \(--record\): .*{error}") as refused:
        start_server(settings)
    assert "never overwritten" not in str(refused.value)
    assert loaded == []


# -- the recorder on its own ---------------------------------------------------------------------


class FakeSubmit:
    """Stands in for Engine._submit: tickets whose futures the test settles."""

    def __init__(self) -> None:
        self.tickets: list[Ticket] = []

    def __call__(self, request: InferRequest) -> Ticket:
        if request.model == "bad":
            raise InvalidInput("input 'x' is wrong")
        ticket = Ticket(request.model, "3", ("y",), "fp16")
        ticket.future = asyncio.get_running_loop().create_future()
        self.tickets.append(ticket)
        return ticket


def request(model: str = "m") -> InferRequest:
    return InferRequest(model, {"x": np.arange(4, dtype=np.float32)}, protocol="http")


def test_sampling_share_is_honoured(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path / "c.cap", sample=0.25, rng=random.Random(7))
    taken = sum(recorder.sampled() for _ in range(4000))
    assert 850 < taken < 1150
    assert not any(Recorder(tmp_path / "d.cap", sample=0.0).sampled() for _ in range(100))
    assert all(Recorder(tmp_path / "e.cap", sample=1.0).sampled() for _ in range(100))


def test_full_buffer_drops_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "small.cap"
    recorder = Recorder(path, buffer=2, flush_s=3600, outputs=True)  # the writer waits
    submit = FakeSubmit()

    async def scenario() -> None:
        for _ in range(3):
            recorder.record(request(), submit)
        with pytest.raises(InvalidInput):
            recorder.record(request("bad"), submit)
        submit.tickets[0].future.set_result({"y": np.ones(2, np.float32)})
        submit.tickets[1].future.set_exception(InvalidInput("no"))
        for ticket in submit.tickets[:2]:
            ticket._settled()
        submit.tickets[2].future.cancel()

    recorder.start()
    asyncio.run(scenario())
    stats = recorder.stop()
    assert (stats.sampled, stats.written, stats.dropped, stats.failed) == (4, 2, 2, 0)
    first, second = read_capture(path)
    assert (first.status, first.answered_version, first.variant) == (200, "3", "fp16")
    assert first.outputs is not None
    np.testing.assert_array_equal(first.outputs[0].array(), np.ones(2, np.float32))
    assert (second.status, second.error, second.outputs) == (400, "no", None)


def test_refused_request_is_recorded_with_its_error(tmp_path: Path) -> None:
    path = tmp_path / "refused.cap"
    recorder = Recorder(path)

    async def scenario() -> None:
        with pytest.raises(InvalidInput):
            recorder.record(request("bad"), FakeSubmit())

    recorder.start()
    asyncio.run(scenario())
    recorder.stop()
    (record,) = read_capture(path)
    assert (record.model, record.status, record.error) == ("bad", 400, "input 'x' is wrong")
    assert (record.answered_version, record.variant) == (None, None)


def test_the_ticket_stamps_when_it_settled(tmp_path: Path) -> None:
    """The latency ends when the scheduler settles the request, not when the writer sees it."""
    path = tmp_path / "stamp.cap"
    clock = FakeClock(1_000)
    recorder = Recorder(path, clock=clock, flush_s=3600)
    submit = FakeSubmit()

    async def scenario() -> None:
        ticket = recorder.record(request(), submit)
        clock.advance(250_000)
        ticket.future.set_result({"y": np.ones(2, np.float32)})
        ticket._settled()  # as the scheduler does
        clock.advance(7_000_000)  # the writer looks later

    recorder.start()
    asyncio.run(scenario())
    recorder.stop()
    (record,) = read_capture(path)
    assert (record.status, record.latency_ns) == (200, 250_000)


def test_unsettled_requests_wait_for_a_later_turn(tmp_path: Path) -> None:
    """The writer takes what settled and keeps the rest, in order, for its next turn."""
    path = tmp_path / "order.cap"
    recorder = Recorder(path, flush_s=0.001)
    submit = FakeSubmit()
    loop = asyncio.new_event_loop()

    async def submit_three() -> list[Ticket]:
        return [recorder.record(request(f"m{i}"), submit) for i in range(3)]

    recorder.start()
    slow, fast, later = loop.run_until_complete(submit_three())
    for ticket in (fast, later):
        ticket.future.set_result({"y": np.ones(2, np.float32)})
        ticket._settled()
    deadline = time.monotonic() + 30
    while recorder.statistics().written < 2:  # the writer thread's next turns (1 ms apart)
        assert time.monotonic() < deadline, "the writer did not write the settled requests"
        time.sleep(0.001)
    assert recorder.statistics().buffered == 1
    slow.future.set_exception(InvalidInput("late"))
    slow._settled()
    stats = recorder.stop()
    loop.close()
    assert (stats.written, stats.buffered) == (3, 0)
    assert [(r.model, r.status) for r in read_capture(path)] == [
        ("m1", 200), ("m2", 200), ("m0", 400)
    ]  # fmt: skip


def test_cancelled_request_is_recorded_as_499(tmp_path: Path) -> None:
    path = tmp_path / "cancel.cap"
    recorder = Recorder(path)
    submit = FakeSubmit()

    async def scenario() -> None:
        recorder.record(request(), submit).future.cancel()
        await asyncio.sleep(0)

    recorder.start()
    asyncio.run(scenario())
    recorder.stop()
    (record,) = read_capture(path)
    assert (record.status, record.error) == (
        CANCELLED_STATUS, "cancelled by the client before its answer"
    )  # fmt: skip
    assert record.outputs is None
    assert record.latency_ns >= 0


def test_request_unfinished_at_shutdown_is_recorded_as_such(tmp_path: Path) -> None:
    path = tmp_path / "unfinished.cap"
    clock = FakeClock(5_000)
    recorder = Recorder(path, clock=clock, flush_s=3600)
    submit = FakeSubmit()

    async def scenario() -> None:
        recorder.record(request(), submit)
        clock.advance(40_000)

    recorder.start()
    asyncio.run(scenario())
    stats = recorder.stop()
    assert (stats.written, stats.buffered) == (1, 0)
    (record,) = read_capture(path)
    assert (record.status, record.error, record.latency_ns) == (
        CANCELLED_STATUS,
        UNFINISHED,
        40_000,
    )
    assert (record.answered_version, record.variant) == ("3", "fp16")


def test_http_request_is_written_as_its_body(tmp_path: Path) -> None:
    """An InferRequest decoded from an HTTP body (`wire`) is written as that body, and reads
    back as the same request."""
    path = tmp_path / "wire.cap"
    recorder = Recorder(path)
    x = np.arange(4, dtype=np.float32)
    head = orjson.dumps({
        "id": "w1", "parameters": {"timeout": 1000},
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4],
                    "parameters": {"binary_data_size": 16}}],
    })  # fmt: skip
    wired = request()
    wired.id, wired.parameters, wired.wire = (
        "w1",
        {"timeout": 1000},
        (head + x.tobytes(), len(head)),
    )

    async def scenario() -> None:
        ticket = recorder.record(wired, FakeSubmit())
        ticket.future.set_result({"y": np.ones(2, np.float32)})
        ticket._settled()

    recorder.start()
    asyncio.run(scenario())
    recorder.stop()
    assert record_flags(path) == [fmt.RAW_HTTP]
    (record,) = read_capture(path)
    assert (record.request_id, record.parameters, record.status) == ("w1", {"timeout": 1000}, 200)
    np.testing.assert_array_equal(record.inputs[0].array(), x)


def test_http_request_from_shared_memory_is_recorded_with_its_data(tmp_path: Path) -> None:
    """An HTTP request whose input comes from (and whose output goes to) shared memory: its body
    names only the regions, so it is written field by field with the tensors it read, as over
    gRPC, and reads back (a tester's capture holding one was refused whole: 'the HTTP body does
    not decode: ... shared memory is not available here'). Decoded as the front end does."""
    x = mlp_input(2, seed=9)
    (tmp_path / "in").write_bytes(x.tobytes())
    (tmp_path / "out").write_bytes(bytes(64))
    regions = SharedMemoryRegions(root=tmp_path)
    regions.register("in", "/in", 0, x.nbytes)
    regions.register("out", "/out", 0, 64)
    shared = orjson.dumps({
        "id": "shm", "parameters": {"timeout": 50_000},
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 40],
                    "parameters": {"shared_memory_region": "in",
                                   "shared_memory_byte_size": x.nbytes}}],
        "outputs": [{"name": "y", "parameters": {"shared_memory_region": "out",
                                                 "shared_memory_byte_size": 24}}],
    })  # fmt: skip
    plain = orjson.dumps({"id": "plain", "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]})  # fmt: skip
    path = tmp_path / "shm.cap"
    recorder = Recorder(path)

    async def scenario() -> None:
        for body in (plain, shared):
            wired, _ = parse_infer_request(body, None, "mlp", None, regions, strict=True)
            wired.protocol, wired.wire = "http", (body, None)  # as RestApi does
            wired.due_ns = wired.arrival_ns = 1
            ticket = recorder.record(wired, FakeSubmit())
            ticket.future.set_result({"y": np.ones(2, np.float32)})
            ticket._settled()

    recorder.start()
    try:
        asyncio.run(scenario())
    finally:
        recorder.stop()
        regions.close()
    assert record_flags(path) == [
        fmt.RAW_HTTP | fmt.HAS_DUE, fmt.HAS_DUE
    ]  # fmt: skip
    first, second = read_capture(path, strict=True)
    assert first.request_id == "plain"
    assert (second.protocol, second.request_id, second.status) == ("http", "shm", 200)
    assert (second.parameters, second.outputs_wanted) == ({"timeout": 50_000}, ("y",))
    (tensor,) = second.inputs
    np.testing.assert_array_equal(tensor.array(), x)


class FullDisk:
    """A capture file on a disk with `room` bytes left: a write past it fails (ENOSPC) after
    writing what fits, as a real one does."""

    def __init__(self, file: Any, room: int) -> None:
        self.file, self.room = file, room

    def write(self, data: memoryview) -> int:
        if not self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        taken = min(len(data), self.room)
        self.room -= taken
        return int(self.file.write(data[:taken]))

    def __getattr__(self, name: str) -> Any:  # truncate, seek, close, closed
        return getattr(self.file, name)


def test_a_write_error_stops_the_capture_not_the_server(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tester's capture hit its file size limit: the writer thread died with a traceback,
    nothing counted failed, the buffer filled and held every sample after, each counted as
    dropped ('the writer fell behind'). Now the error is logged once, what was held and every
    later sample count failed, nothing is buffered, and the file reads to its last whole record."""
    path = tmp_path / "full.cap"
    recorder = Recorder(path, buffer=8, flush_s=3600)  # the test writes (`_drain`), not the thread
    submit = FakeSubmit()

    async def settled(count: int, held: int = 0) -> None:
        for _ in range(count):
            ticket = recorder.record(request(), submit)
            ticket.future.set_result({"y": np.ones(2, np.float32)})
            ticket._settled()
        for _ in range(held):
            recorder.record(request(), submit)  # not settled yet: held

    recorder.start()
    writer = recorder._writer
    assert writer is not None
    asyncio.run(settled(1))
    recorder._drain(writer)  # written whole
    writer._file = FullDisk(writer._file, room=10)  # type: ignore[assignment]
    asyncio.run(settled(3, held=1))
    with caplog.at_level("WARNING", logger="duetime.capture"):
        recorder._drain(writer)
        stats = recorder.statistics()
        assert (stats.written, stats.failed, stats.dropped, stats.buffered) == (1, 4, 0, 0)
        assert stats.stopped == "writing it failed: No space left on device (errno 28)"
        asyncio.run(settled(20))  # past the buffer's bound: refused, not held, not "dropped"
        assert not recorder._buffer
        stats = recorder.stop()
    assert (stats.sampled, stats.written, stats.failed, stats.dropped) == (25, 1, 24, 0)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        f"capture {path} stopped: writing it failed: No space left on device (errno 28); the "
        "server serves on, recording nothing more (1 requests were written; the file ends at "
        "the last whole one)"
    ]
    assert "writer fell behind" not in caplog.text
    assert len(list(read_capture(path, strict=True))) == 1


def test_classified_outputs_are_recorded(tmp_path: Path) -> None:
    """A gRPC request asking for an output as its top 2 classes: the capture kept only the
    output's name, so a replay asked for the whole tensor (a tester's report)."""
    path = tmp_path / "classes.cap"
    recorder = Recorder(path)
    asked = InferRequest(
        "m", {"x": np.arange(4, dtype=np.float32)}, outputs=("y",), classes={"y": 2},
        protocol="grpc",
    )  # fmt: skip

    async def scenario() -> None:
        ticket = recorder.record(asked, FakeSubmit())
        ticket.future.set_result({"y": np.ones(2, np.float32)})
        ticket._settled()

    recorder.start()
    asyncio.run(scenario())
    recorder.stop()
    (record,) = read_capture(path, strict=True)
    assert (record.outputs_wanted, record.output_parameters) == (
        ("y",), {"y": {"classification": 2}}
    )  # fmt: skip
