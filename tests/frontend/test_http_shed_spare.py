"""The load shedder refuses no request of a model with capacity idle, however high its share:
only a busy model's requests are refused (a real engine; connections fed in memory; the
shedder's clocks moved by the test, so what it refuses does not depend on timing).

A tester found a closed-loop flood (16 connections resending each 429 at once) of a model
with 256 KB bodies held at the shedder's cap, 95% of its requests refused unread while its
instance sat idle 83% of the time: 5 answers/s on time against 101/s for one connection.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from memory_fakes import ShedderClocks, Transport, in_memory_server

from duetime.frontend.http import HttpConnection
from duetime.overload import LoadShedder
from duetime.scheduling.scheduler import ModelScheduler
from duetime.tools.payloads import PayloadSpec, http_request_bytes

RESNET = http_request_bytes(
    PayloadSpec("http-binary", "resnet", 1, None, "127.0.0.1", 1),
    {"image": np.ones((1, 3, 64, 64), np.float32)},
    {},
    binary=True,
)
"""A valid resnet request (48 KB of body): the costliest class the shedder weighs here."""


async def status(connection: HttpConnection, transport: Transport, request: bytes) -> bytes:
    """The status of `request`, sent alone on `connection` once the one before is answered."""
    before = len(transport.written)
    connection.data_received(request)
    for _ in range(5000):  # (resnet runs on its instance's thread)
        if len(transport.written) > before:
            break
        await asyncio.sleep(0.001)
    return b"".join(transport.written[before:]).split(b" ", 2)[1]


async def shed_statuses(repository: Path, requests: int) -> list[bytes]:
    """The statuses of `requests` resnet requests sent one after another (each once the one
    before is answered: a closed loop of one) to a shedder refusing all it may (95%) of them."""
    clocks = ShedderClocks()
    async with in_memory_server(repository) as served:
        shedder = LoadShedder(
            cpu_clock=lambda: clocks.cpu, wall_clock=lambda: clocks.wall, wait_clock=lambda: 0.0,
            idle=served.server.engine.has_idle_capacity,
        )  # fmt: skip
        connection, transport = served.connect(shedder=shedder)
        for _ in range(40):  # saturated, requests missing their due times; resnet weighed
            shedder.refuse("resnet", len(RESNET))
            clocks.run(busy=1.0)
            shedder.sample(clocks.failing)
        assert shedder.share == pytest.approx(0.95)
        return [await status(connection, transport, RESNET) for _ in range(requests)]


def test_requests_of_an_idle_model_are_not_shed(mlp_resnet_repo: Path) -> None:
    """Each request finds resnet idle (the one before was answered): none is refused, though
    the shedder refuses 95% of resnet's requests (all but one in 20 were, before)."""
    found = asyncio.run(shed_statuses(mlp_resnet_repo, 20))
    assert found == [b"200"] * 20


def test_requests_of_a_busy_model_are_still_shed(
    mlp_resnet_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With resnet busy (queued work, every instance taken), the shedder's share applies."""
    monkeypatch.setattr(ModelScheduler, "idle", property(lambda self: False))
    monkeypatch.setattr(ModelScheduler, "backlogged", lambda self, now: True)
    found = asyncio.run(shed_statuses(mlp_resnet_repo, 20))
    assert found.count(b"429") == 19
    assert found.count(b"200") == 1
