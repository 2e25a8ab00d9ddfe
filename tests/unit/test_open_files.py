"""The server raises its open-files limit far enough for `max_connections` (a soft limit of 1024
under the default 4096 connections reset clients at accept instead of answering 503)."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
