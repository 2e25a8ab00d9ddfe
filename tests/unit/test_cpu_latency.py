"""CpuLatencyLimit: the PM QoS wake-up latency a server holds while it serves (a file stands in
for /dev/cpu_dma_latency, so the tests change nothing about the machine)."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from pathlib import Path

import pytest
from conftest import start_server, stop_server

import duetime.server
from duetime.config import ServerSettings
from duetime.errors import ConfigError
from duetime.execution.affinity import CpuLatencyLimit


def open_descriptors_on(path: Path) -> int:
    """How many of this process's file descriptors point at `path`."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
        except OSError:  # closed since the listing
            continue
    return count


def test_the_limit_is_written_as_a_native_s32_and_held_open_until_released(
    tmp_path: Path,
) -> None:
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    limit = CpuLatencyLimit(20, device)
    limit.hold()
    limit.hold()  # a second hold keeps the one request
    assert limit.held
    assert device.read_bytes() == struct.pack("=i", 20)
    assert open_descriptors_on(device) == 1  # the kernel drops the limit when it closes
    limit.release()
    assert not limit.held
    assert open_descriptors_on(device) == 0
    limit.release()  # (nothing held: nothing to do)


def test_as_a_context_the_limit_is_held_inside_it_only(tmp_path: Path) -> None:
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    with CpuLatencyLimit(3, device) as limit:
        assert limit.held
        assert open_descriptors_on(device) == 1
    assert not limit.held
    assert open_descriptors_on(device) == 0


def test_a_device_that_cannot_be_opened_is_a_config_error_naming_the_setting(
    tmp_path: Path,
) -> None:
    limit = CpuLatencyLimit(0, tmp_path / "missing" / "cpu_dma_latency")
    with pytest.raises(ConfigError) as raised:
        limit.hold()
    message = raised.value.message
    assert "'cpu_dma_latency_us'" in message
    assert str(tmp_path / "missing" / "cpu_dma_latency") in message
    assert "root" in message
    assert not limit.held


def settings_holding(
    limit_us: int, device: Path, repository: Path, monkeypatch: pytest.MonkeyPatch
) -> ServerSettings:
    """Settings asking for `limit_us`, with the servers' limits taken on `device`."""
    monkeypatch.setattr(
        duetime.server, "CpuLatencyLimit", lambda limit_us: CpuLatencyLimit(limit_us, device)
    )
    return ServerSettings(
        model_repository=repository, http_port=0, grpc_port=0, metrics=False, cpus="none",
        cpu_dma_latency_us=limit_us,
    )  # fmt: skip


def test_a_server_holds_the_limit_while_it_serves(
    tmp_path: Path, mlp_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    running, thread = start_server(settings_holding(0, device, mlp_repo, monkeypatch))
    try:
        assert device.read_bytes() == struct.pack("=i", 0)
        assert open_descriptors_on(device) == 1
    finally:
        stop_server(running, thread)
    assert open_descriptors_on(device) == 0


def test_a_server_that_cannot_hold_the_limit_does_not_start(
    tmp_path: Path, mlp_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_holding(5, tmp_path / "missing", mlp_repo, monkeypatch)
    server = duetime.server.Server(settings)
    with pytest.raises(ConfigError, match="cpu_dma_latency_us"):
        asyncio.run(server.start())  # refused first: nothing was loaded or listening
    assert server.addresses is None
    assert server.engine.repository is None


def test_a_start_that_fails_later_lets_the_limit_go(
    tmp_path: Path, mlp_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = settings_holding(0, device, mlp_repo, monkeypatch).model_copy(
            update={"http_port": taken.getsockname()[1]}
        )
        server = duetime.server.Server(settings)
        with pytest.raises(ConfigError, match="field 'http_port': cannot listen on 127"):
            asyncio.run(server.start())
    assert device.read_bytes() == struct.pack("=i", 0)  # it was held...
    assert not server.cpu_latency.held  # ...and let go
    assert open_descriptors_on(device) == 0
