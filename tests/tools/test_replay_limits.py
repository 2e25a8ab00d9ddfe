"""`duetime replay`'s limits: a --speed whose schedule no timer can keep, a send timer thread
that dies, a --target urlsplit cannot read."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from duetime.errors import ConfigError
from duetime.tools.capture import CapturedRequest, CapturedTensor, CaptureWriter
from duetime.tools.drivers import Waker
from duetime.tools.replay import ReplayConfig, load_plan
from duetime.tools.transports import BenchError

MS = 1_000_000


def _capture(path: Path, count: int = 10, gap_ns: int = 100 * MS) -> Path:
    x = CapturedTensor.of("x", np.zeros((1, 4), np.float32))
    with CaptureWriter(path) as writer:
        for i in range(count):
            writer.write(CapturedRequest(
                arrival_ns=i * gap_ns, protocol="http", model="m", version=None,
                request_id=f"r{i}", inputs=[x], outputs_wanted=None, parameters={},
                due_in_ns=None, priority=0, headers={}, trace_id=None, status=200, error=None,
                latency_ns=0, answered_version=None, variant=None, outputs=None,
            ))  # fmt: skip
    return path


@pytest.mark.parametrize("speed", [1e-300, 1e-12, 1e-7])
def test_a_speed_past_the_schedule_limit_is_refused(tmp_path: Path, speed: float) -> None:
    config = ReplayConfig(_capture(tmp_path / "c.dtcap"), "http://127.0.0.1:9", speed=speed)
    with pytest.raises(ConfigError, match=r"--speed .*over the 1e\+06 s a replay may"):
        load_plan(config)


def test_loops_count_against_the_limit(tmp_path: Path) -> None:
    path = _capture(tmp_path / "c.dtcap")
    load_plan(ReplayConfig(path, "http://127.0.0.1:9", speed=1e-3, loops=1))  # 900 s: fine
    config = ReplayConfig(path, "http://127.0.0.1:9", speed=1e-3, loops=10_000)
    with pytest.raises(ConfigError, match="--loop 10000"):
        load_plan(config)


def test_a_slow_speed_within_the_limit_is_kept(tmp_path: Path) -> None:
    config = ReplayConfig(_capture(tmp_path / "c.dtcap"), "http://127.0.0.1:9", speed=1e-5)
    plan = load_plan(config)
    assert plan.offsets_ns[-1] == 900 * MS * 100_000


def test_the_send_timer_waits_past_the_longest_wait_a_thread_may() -> None:
    loop = asyncio.new_event_loop()
    try:
        failures: list[BaseException] = []
        far = time.perf_counter_ns() + int(threading.TIMEOUT_MAX * 1e9) * 10
        waker = Waker(loop, iter([far]), lambda: None, failed=failures.append)
        waker.start()
        waker.join(0.2)
        assert waker.is_alive()  # waiting, not dead of OverflowError
        waker.stop()
        assert not waker.is_alive()
        loop.run_until_complete(asyncio.sleep(0))
        assert failures == []
    finally:
        loop.close()


def test_a_send_timer_that_dies_ends_the_run() -> None:
    def instants() -> object:
        yield time.perf_counter_ns()
        raise OverflowError("timestamp out of range")

    async def run() -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def failed(exc: BaseException) -> None:
            done.set_exception(BenchError(str(exc)))

        waker = Waker(asyncio.get_running_loop(), instants(), lambda: None, failed=failed)  # type: ignore[arg-type]
        waker.start()
        await asyncio.wait_for(done, 10)

    with pytest.raises(BenchError, match="timestamp out of range"):
        asyncio.run(run())


@pytest.mark.parametrize("target", ["http://[::1:80", "grpc://[:9", "[::1:80"])
def test_a_target_urlsplit_cannot_read_is_a_config_error(tmp_path: Path, target: str) -> None:
    with pytest.raises(ConfigError, match="--target: expected http://HOST:PORT"):
        ReplayConfig(tmp_path / "c.dtcap", target)


def test_a_bracketed_ipv6_target_is_read() -> None:
    config = ReplayConfig(Path("c.dtcap"), "http://[::1]:8000")
    assert config.address() == ("http", "::1", 8000)
