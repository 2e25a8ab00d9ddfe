"""Reads past the loop turn's budget wait for later turns, oldest first, and are all answered;
a GET is parsed at once (a real engine; connections fed in memory; the Intake's turn clock
moved by the test: 1 ms a reading, so which reads wait does not depend on timing).

A tester found 3,000 connections sending one small mlp request each within 0.1 s all parsed
in one turn of over a second: mlp's batches waited for its end (its queue full: 429), most
requests were due before they reached the scheduler (504), a health check waited 0.65-1.4 s.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import numpy as np
from memory_fakes import Transport, in_memory_server

from duetime.frontend.http import _KEPT_READING_BYTES, Intake
from duetime.tools.payloads import PayloadSpec, http_request_bytes

LIGHT = http_request_bytes(
    PayloadSpec("http-binary", "mlp", 1, None, "127.0.0.1", 1),
    {"x": np.ones((1, 40), np.float32)},
    {},
    binary=True,
)
HEALTH = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
BURST = 40


class WatchedTransport(Transport):
    """A Transport that keeps whether the connection reads."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def status(transport: Transport) -> bytes | None:
    return transport.written[0].split(b" ", 2)[1] if transport.written else None


def test_a_burst_is_parsed_over_several_turns_and_a_probe_at_once(mlp_resnet_repo: Path) -> None:
    async def body() -> dict[str, object]:
        async with in_memory_server(mlp_resnet_repo) as served:
            ticks = itertools.count()
            intake = Intake(served.settings, clock=lambda: next(ticks) * 0.001)
            connections = [
                served.connect(WatchedTransport(), intake=intake, shedder=None)
                for _ in range(BURST + 1)
            ]
            # one turn of the loop reads them all (nothing in between)
            for connection, _ in connections[:BURST]:
                connection.data_received(LIGHT)
            probe, probe_transport = connections[BURST]
            probe.data_received(HEALTH)
            waiting = [bool(connection._unparsed) for connection, _ in connections[:BURST]]
            paused = [not transport.reading for _, transport in connections[:BURST]]
            probe_status = status(probe_transport)
            for _ in range(5000):  # (generous: each later turn parses ~5 of them)
                if all(transport.written for _, transport in connections[:BURST]):
                    break
                await asyncio.sleep(0.001)
            return {
                "waiting": waiting,
                "paused": paused,
                "probe": probe_status,
                "statuses": [status(transport) for _, transport in connections[:BURST]],
            }

    found = asyncio.run(body())
    waiting = found["waiting"]
    assert isinstance(waiting, list)
    assert not any(waiting[:5]), "the turn's first reads are parsed in it"
    assert all(waiting[10:]), "reads past the turn's budget wait unparsed"
    assert not any(found["paused"]), "a request waiting for a turn does not pause reading"
    assert found["probe"] == b"200", "a GET is parsed at once, behind no waiting read"
    assert found["statuses"] == [b"200"] * BURST


def test_a_connection_waiting_for_a_turn_pauses_reading_past_its_kept_bytes(
    mlp_resnet_repo: Path,
) -> None:
    """What comes while a connection's bytes wait for a turn is kept with them, reading going
    on, until they are more than `_KEPT_READING_BYTES`: then TCP holds the client back. Every
    request is answered, in order, once the turns come."""
    pipelined = 40  # (about 19 KB: past the kept bytes)
    assert len(LIGHT) * pipelined > _KEPT_READING_BYTES

    async def body() -> dict[str, object]:
        async with in_memory_server(mlp_resnet_repo) as served:
            ticks = itertools.count()
            intake = Intake(served.settings, clock=lambda: next(ticks) * 0.001)
            busy = [
                served.connect(WatchedTransport(), intake=intake, shedder=None) for _ in range(8)
            ]
            for connection, _ in busy:  # (the turn's budget is spent by these)
                connection.data_received(LIGHT)
            late, transport = served.connect(WatchedTransport(), intake=intake, shedder=None)
            late.data_received(LIGHT)
            after_one = (bool(late._unparsed), transport.reading)
            for _ in range(pipelined - 1):
                late.data_received(LIGHT)
            after_all = (len(late._unparsed), transport.reading)
            for _ in range(5000):
                if len(transport.written) == pipelined and transport.reading:
                    break
                await asyncio.sleep(0.001)
            return {
                "after_one": after_one,
                "after_all": after_all,
                "statuses": [response.split(b" ", 2)[1] for response in transport.written],
                "reading": transport.reading,
            }

    found = asyncio.run(body())
    assert found["after_one"] == (True, True), "one request waits for its turn, reading on"
    kept, reading = found["after_all"]  # type: ignore[misc]
    assert kept == len(LIGHT) * pipelined
    assert not reading, "paused once past the kept bytes"
    assert found["statuses"] == [b"200"] * pipelined
    assert found["reading"], "reading goes on once they are parsed"
