"""A connection answered 429 leaves its next request unread for a short while (`_BACK_OFF_S`),
then reads again (a real engine; a connection fed in memory, its reading watched; the load
shedder's clocks moved by the test).

A tester found clients resending each 429 at once (16 connections, a model with 256 KB bodies)
kept the loop saturated by their refusals alone: ~3,000 a second, the few requests taken in
due before they reached their scheduler, a light model's gRPC calls 120-500 ms late.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from memory_fakes import ShedderClocks, Transport

from duetime.config import ServerSettings
from duetime.frontend.http import HttpConnection
from duetime.overload import LoadShedder
from duetime.scheduling.scheduler import ModelScheduler
from duetime.server import Server
from duetime.tools.payloads import PayloadSpec, http_request_bytes

RESNET = http_request_bytes(
    PayloadSpec("http-binary", "resnet", 1, None, "127.0.0.1", 1),
    {"image": np.ones((1, 3, 64, 64), np.float32)},
    {},
    binary=True,
)
METADATA = b"GET /v2/models/resnet HTTP/1.1\r\nHost: x\r\n\r\n"


class WatchedTransport(Transport):
    """A Transport that keeps whether the connection reads."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True
        self.pauses = 0

    def pause_reading(self) -> None:
        self.reading = False
        self.pauses += 1

    def resume_reading(self) -> None:
        self.reading = True


async def answered(connection: HttpConnection, transport: Transport, request: bytes) -> bytes:
    """The status of `request`, fed to `connection` and answered."""
    before = len(transport.written)
    connection.data_received(request)
    for _ in range(5000):  # (resnet runs on its instance's thread)
        if len(transport.written) > before:
            break
        await asyncio.sleep(0.001)
    return b"".join(transport.written[before:]).split(b" ", 2)[1]


def test_a_connection_answered_429_reads_again_after_a_pause(
    mlp_resnet_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (resnet busy: the shedder refuses its share of resnet's requests, see
    # test_http_shed_spare.py)
    monkeypatch.setattr(ModelScheduler, "idle", property(lambda self: False))
    monkeypatch.setattr(ModelScheduler, "backlogged", lambda self, now: True)

    async def body() -> dict[str, object]:
        settings = ServerSettings(
            model_repository=mlp_resnet_repo, http_port=0, grpc_port=0, metrics=False,
            tune_runtime=False, cpus="none",
        )  # fmt: skip
        server = Server(settings)
        await server.start()
        clocks = ShedderClocks()
        shedder = LoadShedder(
            cpu_clock=lambda: clocks.cpu, wall_clock=lambda: clocks.wall, wait_clock=lambda: 0.0
        )
        connection = HttpConnection(server._rest, settings, server._connections, shedder=shedder)
        transport = WatchedTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        try:
            first = await answered(connection, transport, METADATA)
            reading_after_200 = transport.reading
            for _ in range(40):  # saturated, requests missing their due times; resnet weighed
                shedder.refuse("resnet", len(RESNET))
                clocks.run(busy=1.0)
                shedder.sample(clocks.failing)
            statuses = []
            while b"429" not in statuses and len(statuses) < 40:
                statuses.append(await answered(connection, transport, RESNET))
            reading_after_429 = transport.reading
            for _ in range(5000):  # (generous: the pause is 10 ms)
                if transport.reading:
                    break
                await asyncio.sleep(0.001)
            return {
                "first": first,
                "reading_after_200": reading_after_200,
                "statuses": statuses,
                "reading_after_429": reading_after_429,
                "reading_later": transport.reading,
                "pauses": transport.pauses,
                "next": await answered(connection, transport, METADATA),
            }
        finally:
            connection.connection_lost(None)
            await server.stop()

    found = asyncio.run(body())
    assert found["first"] == b"200"
    assert found["reading_after_200"], "an answer that is not a refusal pauses nothing"
    assert found["statuses"][-1] == b"429"
    assert not found["reading_after_429"], "its next request is left unread a while"
    assert found["reading_later"], "then read"
    assert found["pauses"] == 1
    assert found["next"] == b"200"
