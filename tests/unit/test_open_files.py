"""The server raises its open-files limit far enough for `max_connections` (a soft limit of 1024
under the default 4096 connections reset clients at accept instead of answering 503)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from duetime.config import ServerSettings
from duetime.server import FILES_BESIDE_CONNECTIONS, grpc_connections_within

resource = pytest.importorskip("resource")

SCRIPT = """
import logging, resource, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))
from duetime.server import open_files_for
print(open_files_for({connections}), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def run(soft: int, hard: int, connections: int) -> subprocess.CompletedProcess[str]:
    script = SCRIPT.format(soft=soft, hard=hard, connections=connections)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )


def hard_limit() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1 << 20 if hard == resource.RLIM_INFINITY else int(hard)


def test_the_soft_limit_is_raised_for_the_connections() -> None:
    if hard_limit() < 4096 + 256:
        pytest.skip("this machine's hard limit is below what the test raises to")
    result = run(1024, hard_limit(), 4096)
    assert result.stdout.split() == ["4352", "4352"]
    assert result.stderr == ""


def test_a_hard_limit_below_the_connections_is_reported() -> None:
    result = run(512, 600, 4096)
    assert result.stdout.split() == ["600", "600"]
    assert "the open-files limit is 600 (hard limit 600), below 4096 connections" in (result.stderr)


def test_grpc_connections_fit_the_descriptors_the_server_may_open() -> None:
    """Bounded by --max-grpc-connections alone, gRPC took every descriptor of a server whose
    limit was 1,280 (1,300 idle connections), and new HTTP clients were reset (a tester)."""
    settings = ServerSettings(max_connections=1024, max_grpc_connections=4096)
    assert grpc_connections_within(settings, 1024 + 4096 + FILES_BESIDE_CONNECTIONS) == 4096
    assert grpc_connections_within(settings, 1280) == 512  # (half of what is left, at most)
    small = ServerSettings(max_connections=100, max_grpc_connections=4096)
    assert grpc_connections_within(small, 1280) == 924
    assert grpc_connections_within(settings, 100) == 1
