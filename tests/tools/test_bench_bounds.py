"""`duetime bench` flags with bounds: --connections (as replay's) and --pool (the payloads built
before the run)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fake_v2 import fake_v2_server

from duetime.cli import main
from duetime.errors import ConfigError
from duetime.tools.config import MAX_HTTP_CONNECTIONS, BenchConfig


@pytest.mark.parametrize("connections", [0, MAX_HTTP_CONNECTIONS + 1, 3000])
def test_connections_past_the_bound_are_refused(connections: int) -> None:
    with pytest.raises(ConfigError, match=rf"--connections: expected 1 to 1024, got {connections}"):
        BenchConfig(model="m", address="127.0.0.1:9", connections=connections)


@pytest.mark.parametrize("rate", [0.0, -5.0, float("inf"), float("nan")])
def test_a_rate_that_is_not_a_finite_positive_number_is_refused(rate: float) -> None:
    with pytest.raises(ConfigError, match=r"--rate: expected a finite number of requests"):
        BenchConfig(model="m", address="127.0.0.1:9", rate=rate)


def test_connections_up_to_the_bound_are_kept() -> None:
    config = BenchConfig(model="m", address="127.0.0.1:9", connections=MAX_HTTP_CONNECTIONS)
    assert config.lanes() == MAX_HTTP_CONNECTIONS


def test_an_open_loop_builds_no_more_payloads_than_it_sends() -> None:
    config = BenchConfig(
        model="m", address="127.0.0.1:9", rate=100, duration_s=1, warmup_s=0.5, pool_size=10**6
    )
    assert config.pool_size_used() == 150
    assert BenchConfig(model="m", address="127.0.0.1:9").pool_size_used() == 16
    closed = BenchConfig(model="m", address="127.0.0.1:9", mode="closed", pool_size=10**6)
    assert closed.pool_size_used() == 10**6


def test_a_pool_over_the_memory_bound_is_refused() -> None:
    from duetime.tools.loadgen import check_pool_bytes

    config = BenchConfig(model="m", address="127.0.0.1:9", mode="closed", pool_size=10**6,
                         batch=64, timeouts_ms=(10, 50))  # fmt: skip
    inputs = {"x": np.zeros((64, 4), np.float32)}
    with pytest.raises(ConfigError, match=r"--pool 1000000: 1,000,000 payloads x 2 due classes"):
        check_pool_bytes(config, 10**6, inputs, b"p" * 1000)
    check_pool_bytes(config, 1000, inputs, b"p" * 1000)  # (2.5 MB: fine)


def test_bench_refuses_a_pool_too_big_before_building_it(capsys: Any) -> None:
    with fake_v2_server() as fake:
        code = main(["bench", "--http", fake.address, "--model", "m", "--mode", "closed",
                     "--batch", "8", "--pool", "2000000", "--duration", "0.2", "--warmup", "0",
                     "-q"])  # fmt: skip
    assert code == 2
    assert "--pool 2000000: 2,000,000 payloads of about" in capsys.readouterr().err


def test_bench_builds_an_open_loops_pool_to_its_requests(capsys: Any) -> None:
    with fake_v2_server() as fake:
        code = main(["bench", "--http", fake.address, "--model", "m", "--rate", "20",
                     "--duration", "0.2", "--warmup", "0", "--batch", "8", "--pool", "20000000",
                     "-q"])  # fmt: skip
    assert code == 0
