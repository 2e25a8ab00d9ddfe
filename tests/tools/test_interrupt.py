"""Ctrl-C in `duetime bench` and `duetime replay`: sending stops, the report of what was
measured so far comes out marked as interrupted, --json is written, the exit status is 130 and
no traceback is printed. In process with `Interrupt.fire`, then SIGINT to a real command."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fake_v2 import FakeV2, fake_v2_server

from duetime.loops import new_event_loop
from duetime.tools.capture import CapturedRequest, CapturedTensor, CaptureWriter
from duetime.tools.config import BenchConfig
from duetime.tools.interrupt import Interrupt
from duetime.tools.loadgen import BenchResult, run_bench_async
from duetime.tools.replay import ReplayConfig, load_plan, replay_async
from duetime.tools.transports import GrpcTransport

pytestmark = pytest.mark.timeout(60)

MS = 1_000_000


def write_capture(path: Path, count: int = 20) -> Path:
    with CaptureWriter(path) as writer:
        for i in range(count):
            writer.write(CapturedRequest(
                arrival_ns=i * 10 * MS, protocol="http", model="m", version=None,
                request_id=f"q{i}", inputs=[CapturedTensor.of("x", np.ones((1, 4), np.float32))],
                outputs_wanted=None, parameters={}, due_in_ns=None, priority=0, headers={},
                trace_id=None, status=200, error=None, latency_ns=0, answered_version=None,
                variant=None, outputs=None,
            ))  # fmt: skip
    return path


async def ctrl_c_once_sending(interrupt: Interrupt, fake: FakeV2) -> None:
    """`interrupt.fire()` a little after the first request reached the server."""
    assert await asyncio.to_thread(fake.posted.wait, 30), "nothing was sent"
    await asyncio.sleep(0.2)
    interrupt.fire()


def test_ctrl_c_before_sending_cancels_the_run_and_raises_keyboard_interrupt() -> None:
    cleaned: list[bool] = []

    async def setup() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append(True)

    interrupt = Interrupt()
    loop = new_event_loop()
    try:
        loop.call_later(0.05, interrupt.fire)
        with pytest.raises(KeyboardInterrupt):
            interrupt.run(loop, setup())
    finally:
        loop.close()
    assert cleaned == [True]


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_an_interrupted_bench_reports_what_it_measured(mode: str) -> None:
    interrupt = Interrupt()
    with fake_v2_server() as fake:
        config = BenchConfig(
            model="m", address=fake.address, mode=mode, rate=200.0, duration_s=30.0,
            warmup_s=0.0, drain_s=5.0, concurrency=2, connections=2,
        )  # type: ignore[arg-type]  # fmt: skip

        async def scenario() -> BenchResult:
            ctrl_c = asyncio.create_task(ctrl_c_once_sending(interrupt, fake))
            result = await run_bench_async(config, interrupt=interrupt)
            await ctrl_c
            return result

        loop = new_event_loop()
        try:
            result = loop.run_until_complete(scenario())
        finally:
            loop.close()
    assert result.interrupted
    assert result.measured_s is not None
    assert 0 < result.measured_s < 5
    assert result.overall.sent > 0
    assert "INTERRUPTED (Ctrl-C)" in result.format()
    assert result.to_json()["interrupted"] is True


def test_an_interrupted_replay_reports_what_it_sent(tmp_path: Path) -> None:
    capture = write_capture(tmp_path / "t.cap")
    interrupt = Interrupt()
    with fake_v2_server() as fake:
        config = ReplayConfig(capture, f"http://{fake.address}", loops=1000, progress=False)

        async def scenario() -> dict[str, object]:
            ctrl_c = asyncio.create_task(ctrl_c_once_sending(interrupt, fake))
            result = await replay_async(config, load_plan(config), interrupt)
            await ctrl_c
            assert "INTERRUPTED (Ctrl-C)" in result.format()
            return result.to_json()

        loop = new_event_loop()
        try:
            doc = loop.run_until_complete(scenario())
        finally:
            loop.close()
    assert doc["interrupted"] is True
    assert 0 < doc["sent"] < 20 * 1000  # type: ignore[operator]


@pytest.mark.parametrize("tool", ["bench", "replay"])
def test_sigint_prints_the_partial_report_writes_json_and_exits_130(
    tool: str, tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    with fake_v2_server() as fake:
        if tool == "bench":
            args = ["bench", "--http", fake.address, "--model", "m", "--rate", "100",
                    "--duration", "30", "--warmup", "0", "-q", "--json", str(out)]  # fmt: skip
        else:
            capture = write_capture(tmp_path / "t.cap")
            args = ["replay", str(capture), "--target", f"http://{fake.address}", "--loop",
                    "1000", "-q", "--json", str(out)]  # fmt: skip
        process = subprocess.Popen(
            [sys.executable, "-m", "duetime", *args], cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert fake.posted.wait(45), "the command sent nothing"
            os.kill(process.pid, signal.SIGINT)
            stdout, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "destroyed but it is pending" not in stderr
    assert "INTERRUPTED (Ctrl-C)" in stdout
    assert json.loads(out.read_text())["interrupted"] is True


def test_ctrl_c_while_grpc_connects_leaves_no_unread_error() -> None:
    """A gRPC channel that cannot connect (a port that takes connections but never speaks)
    waits till CONNECT_TIMEOUT_S."""
    unhandled: list[str] = []
    interrupt = Interrupt()
    with socket.create_server(("127.0.0.1", 0)) as silent:  # never accepts: TCP only
        target = f"127.0.0.1:{silent.getsockname()[1]}"
        transport = GrpcTransport(target, lambda rid, outcome, message: None)
        loop = new_event_loop()
        loop.set_exception_handler(lambda loop, context: unhandled.append(context["message"]))
        try:
            loop.call_later(0.3, interrupt.fire)
            with pytest.raises(KeyboardInterrupt):
                interrupt.run(loop, transport.open(1))
            gc.collect()  # an unread error is reported when its future is collected
            loop.run_until_complete(transport.aclose())
        finally:
            loop.close()
    assert unhandled == []


def spawned_children(pid: int) -> list[int]:
    """The multiprocessing children (spawned) of process `pid` (Linux /proc)."""
    try:
        listed = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    found = []
    for child in map(int, listed):
        with contextlib.suppress(OSError):
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
    return found


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
def test_ctrl_c_while_generator_processes_start_prints_no_traceback() -> None:
    """The parent forwards Ctrl-C to its generator processes, which were still importing."""
    with fake_v2_server() as fake:
        args = ["bench", "--http", fake.address, "--model", "m", "--processes", "2",
                "--duration", "30", "-q"]  # fmt: skip
        process = subprocess.Popen(
            [sys.executable, "-m", "duetime", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while len(spawned_children(process.pid)) < 2 and time.monotonic() < deadline:
                time.sleep(0.001)
            os.kill(process.pid, signal.SIGINT)  # (the parent alone, as `kill -INT` does)
            _, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "KeyboardInterrupt" not in stderr
    assert stderr.strip().splitlines()[-1] == "duetime bench: interrupted before sending started"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_generator_processes_end_with_their_parent(signum: int) -> None:
    """After `kill -TERM` of the parent alone (a supervisor, `timeout`), its orphaned generator
    processes kept sending until their run's end, and one hung for good writing its records
    to a parent that was gone (found by a tester). SIGTERM goes on to them; and they end
    when their parent does, however it ends."""
    with fake_v2_server() as fake:
        args = ["bench", "--http", fake.address, "--model", "m", "--processes", "2",
                "--rate", "100", "--duration", "60", "--warmup", "0", "-q"]  # fmt: skip
        process = subprocess.Popen(
            [sys.executable, "-m", "duetime", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        children: list[int] = []
        try:
            assert fake.posted.wait(45), "the command sent nothing"
            children = spawned_children(process.pid)
            assert len(children) == 2
            os.kill(process.pid, signum)
            process.communicate(timeout=30)
            deadline = time.monotonic() + 10
            while any(Path(f"/proc/{pid}").exists() for pid in children):
                assert time.monotonic() < deadline, "a generator process outlived its parent"
                time.sleep(0.01)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            for pid in children:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    assert process.returncode == -signum
