"""Unit tests for `duetime.frontend.arrival.ReadTurn`."""

from __future__ import annotations

import asyncio
import socket

from duetime.clock import FakeClock
from duetime.frontend.arrival import ReadTurn
from duetime.loops import new_event_loop


def test_requests_read_in_one_turn_arrive_when_the_turn_began() -> None:
    async def body() -> None:
        clock = FakeClock(1_000)
        turn = ReadTurn(clock)
        assert turn.arrival_ns(1_000) == 1_000  # outside a turn: now
        turn.mark(asyncio.get_running_loop())
        clock.advance(700)  # the loop parses and schedules the first request
        turn.mark(asyncio.get_running_loop())  # the second read of the same turn
        assert turn.arrival_ns(clock.now_ns()) == 1_000
        await asyncio.sleep(0)  # the turn is over
        assert turn.arrival_ns(clock.now_ns()) == 1_700
        turn.mark(asyncio.get_running_loop())
        assert turn.arrival_ns(clock.now_ns() + 50) == 1_700

    asyncio.run(body())


class Reader(asyncio.Protocol):
    def __init__(self, turn: ReadTurn, clock: FakeClock, seen: list[int], all_read: asyncio.Event):
        self.turn, self.clock, self.seen, self.all_read = turn, clock, seen, all_read

    def data_received(self, data: bytes) -> None:
        self.turn.mark(asyncio.get_running_loop())
        self.seen.append(self.turn.arrival_ns(self.clock.now_ns()))
        self.clock.advance(100)  # this read's work
        if len(self.seen) == 3:
            self.all_read.set()


def test_reads_that_one_poll_returns_share_a_turn_on_the_server_loop() -> None:
    """The turn ends in a ready callback: the loop must run those only after every read its poll
    returned (uvloop and asyncio both do)."""

    async def body() -> None:
        loop = asyncio.get_running_loop()
        clock = FakeClock(0)
        turn = ReadTurn(clock)
        seen: list[int] = []
        all_read = asyncio.Event()
        pairs = [socket.socketpair() for _ in range(3)]
        transports = []
        try:
            for ours, _ in pairs:
                transport, _ = await loop.connect_accepted_socket(
                    lambda: Reader(turn, clock, seen, all_read), ours
                )
                transports.append(transport)
            for _, theirs in pairs:
                theirs.send(b"x")
            await asyncio.wait_for(all_read.wait(), 5)
        finally:
            for transport in transports:
                transport.close()
            for _, theirs in pairs:
                theirs.close()
        assert seen == [0, 0, 0]

    loop = new_event_loop()
    try:
        loop.run_until_complete(body())
    finally:
        loop.close()
