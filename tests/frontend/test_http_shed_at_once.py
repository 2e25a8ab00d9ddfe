"""A request the load shedder refuses while its connection owes no answer is refused at once,
outside the connection's pipeline of answers (`HttpConnection._shed_at_once`); one it lets
through is weighed once, not again as it starts; and behind an answer still owed, refusals and
answers go out in the order their requests came (a real engine; connections fed in memory; the
shedder's decisions scripted, so they do not depend on timing).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from memory_fakes import Transport, in_memory_server

from duetime.frontend.http import HttpConnection, Intake
from duetime.frontend.rest import RestApi
from duetime.tools.payloads import PayloadSpec, http_request_bytes

MLP = http_request_bytes(
    PayloadSpec("http-binary", "mlp", 1, None, "127.0.0.1", 1),
    {"x": np.ones((1, 40), np.float32)},
    {},
    binary=True,
)


class Scripted:
    """A shedder refusing the requests `decisions` says, in turn (True: refuse), recording
    each request it weighs."""

    def __init__(self, decisions: list[bool]) -> None:
        self.share = 1.0
        self.watching = True
        self.saturated = True  # (as a LoadShedder refusing a share: its requests send no timeout)
        self.decisions = list(decisions)
        self.weighed: list[tuple[str | None, int]] = []

    def refuse(
        self, model: str | None = None, size: int = 0, top: bool = False, version: object = None
    ) -> bool:
        self.weighed.append((model, size))
        return self.decisions.pop(0)

    def refusing(self, model: str | None) -> bool:
        return True


async def answers(connection: HttpConnection, transport: Transport, count: int) -> list[bytes]:
    """The statuses of the first `count` answers written on `transport`, in order."""
    for _ in range(5000):
        data = b"".join(transport.written)
        if data.count(b"HTTP/1.1 ") >= count:
            break
        await asyncio.sleep(0.001)
    heads = b"".join(transport.written).split(b"HTTP/1.1 ")[1:]
    return [head[:3] for head in heads]


def test_each_request_is_weighed_once_refused_or_let_through(mlp_repo: Path) -> None:
    async def body() -> tuple[list[bytes], Scripted]:
        shedder = Scripted([True, False, True, True, False])
        async with in_memory_server(mlp_repo) as served:
            connection, transport = served.connect(shedder=shedder)
            found = []
            for sent in range(1, 6):  # one at a time: each owes nothing before it
                connection.data_received(MLP)
                found = await answers(connection, transport, sent)
            return found, shedder

    found, shedder = asyncio.run(body())
    assert found == [b"429", b"200", b"429", b"429", b"200"]
    size = len(MLP) - MLP.index(b"\r\n\r\n") - 4
    assert shedder.weighed == [("mlp", size)] * 5


def test_refusals_behind_an_owed_answer_keep_their_order(mlp_repo: Path) -> None:
    """Three requests in one read: the first let through (its answer owed while mlp runs),
    the second refused behind it, the third let through; then one refused at once."""

    async def body() -> tuple[list[bytes], Scripted, bytes]:
        shedder = Scripted([False, True, False, True])
        async with in_memory_server(mlp_repo) as served:
            connection, transport = served.connect(shedder=shedder)
            connection.data_received(MLP * 3)
            found = await answers(connection, transport, 3)
            connection.data_received(MLP)
            found = await answers(connection, transport, 4)
            return found, shedder, transport.written[-1]

    found, shedder, last = asyncio.run(body())
    assert found == [b"200", b"429", b"200", b"429"]
    assert len(shedder.weighed) == 4
    head = last.split(b"\r\n\r\n", 1)[0]
    assert b"Retry-After: 1" in head
    assert b"x-trace-id: " in head
    assert b"Connection: close" not in head  # (the connection stays open)


def test_a_refusal_bigger_than_a_small_answer_goes_through_the_pipeline(
    mlp_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where answers of a few hundred bytes count as big (held answer bytes shared by many
    connections), a refusal is written in its turn and counted as any such answer."""
    at_once: list[HttpConnection] = []
    monkeypatch.setattr(HttpConnection, "_shed_at_once", at_once.append)

    async def body() -> tuple[list[bytes], Scripted]:
        shedder = Scripted([True, False, True])
        # (100 connections sharing 20,000 bytes: 200 a connection, under a refusal's size)
        async with in_memory_server(
            mlp_repo, max_unsent_answer_bytes=20_000, max_connections=100
        ) as served:
            connection, transport = served.connect(shedder=shedder)
            found = []
            for sent in range(1, 4):
                connection.data_received(MLP)
                found = await answers(connection, transport, sent)
            return found, shedder

    found, shedder = asyncio.run(body())
    assert found == [b"429", b"200", b"429"]
    assert len(shedder.weighed) == 3
    assert at_once == []


def test_requests_that_waited_for_a_turn_are_weighed_before_they_are_decoded(
    mlp_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes read past the loop turn's budget wait for a later turn (`Intake.wait_turn`); the
    requests parsed from them then are weighed as they are parsed: those refused are never
    decoded (they were decoded and held first, and mostly refused as expired: a loop behind its
    sockets stayed there), the one let through is decoded once and answered."""
    decoded: list[bytes] = []
    real_hold_back = RestApi.hold_back

    def hold_back(self: RestApi, method: str, target: bytes, *args: Any, **kwargs: Any) -> Any:
        decoded.append(target)
        return real_hold_back(self, method, target, *args, **kwargs)

    monkeypatch.setattr(RestApi, "hold_back", hold_back)
    monkeypatch.setattr(Intake, "defers", lambda self, loop: True)  # (every read waits)

    async def body() -> tuple[list[bytes], Scripted]:
        shedder = Scripted([True, True, False, True])
        async with in_memory_server(mlp_repo) as served:
            connection, transport = served.connect(shedder=shedder)
            connection.data_received(MLP * 4)
            return await answers(connection, transport, 4), shedder

    found, shedder = asyncio.run(body())
    assert found == [b"429", b"429", b"200", b"429"]
    assert len(shedder.weighed) == 4
    assert len(decoded) == 1
