"""Unit tests for `duetime.frontend.arrival.ReadTurn` and `duetime.loops.BusyPoll`."""

from __future__ import annotations

import asyncio
import http.client
import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import start_server, stop_server
from repo_models import scale_model, write_version

from duetime.clock import FakeClock
from duetime.config import ServerSettings
from duetime.frontend.arrival import IDLE_AFTER_NS, ReadTurn
from duetime.loops import BusyPoll, new_event_loop


def test_requests_read_in_one_turn_arrive_when_the_turn_began() -> None:
    async def body() -> None:
        clock = FakeClock(1_000)
        slept = itertools.count()  # a loop that sleeps between turns
        turn = ReadTurn(clock, switches=slept.__next__)
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


def test_a_loop_busy_since_the_last_turn_began_dates_new_requests_from_then() -> None:
    """What a poll returns arrived after the poll before it: a loop that has not slept (no
    voluntary context switch) polled last as its last turn began; one that slept was woken by
    what it reads (or by a timer shortly before)."""

    async def body() -> None:
        loop = asyncio.get_running_loop()
        clock, switches = FakeClock(10_000), [0]
        turn = ReadTurn(clock, switches=lambda: switches[0])
        turn.mark(loop)  # the first turn: nothing before it to go by
        assert turn.arrival_ns(clock.now_ns()) == 10_000
        clock.advance(2_000)  # the loop ran the turn, batches and timers (or waited for a CPU)
        await asyncio.sleep(0)
        turn.mark(loop)
        assert turn.arrival_ns(clock.now_ns()) == 10_000  # since the last turn began
        clock.advance(3_000)
        switches[0] += 1  # it slept until this read woke it
        await asyncio.sleep(0)
        turn.mark(loop)
        assert turn.arrival_ns(clock.now_ns()) == 15_000

    asyncio.run(body())


def test_a_loop_kept_polling_dates_requests_from_the_turn_that_reads_them() -> None:
    """With `busy_poll_us` the loop polls between its ready callbacks without sleeping: what it
    reads came since the last poll, microseconds ago."""

    async def body() -> None:
        loop = asyncio.get_running_loop()
        clock = FakeClock(10_000)
        turn = ReadTurn(clock, switches=lambda: 0)
        turn.busy_poll = BusyPoll(loop, 0.001)
        turn.mark(loop)
        clock.advance(400_000)
        await asyncio.sleep(0)
        turn.mark(loop)
        assert turn.arrival_ns(clock.now_ns()) == 410_000

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
        turn = ReadTurn(clock, switches=itertools.count().__next__)
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


def test_busy_poll_keeps_the_loop_turning_for_its_window_then_lets_it_sleep() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        poll = BusyPoll(loop, 0.005)
        started = time.monotonic()
        poll.poke()
        turns = 0
        while poll.spinning:
            turns += 1
            await asyncio.sleep(0)
        assert time.monotonic() - started >= 0.005  # never stops early
        assert turns > 10  # the loop kept turning meanwhile
        poll.poke()  # a new read starts a new window
        assert poll.spinning

    asyncio.run(body())


def test_a_server_with_busy_poll_answers_keep_alive_requests(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(3))
    settings = ServerSettings(
        model_repository=tmp_path, http_port=0, grpc_port=0, metrics=False, busy_poll_us=300
    )
    running, thread = start_server(settings)
    try:
        assert running.server._rest.turn.busy_poll is not None
        body = json.dumps(
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
        )
        connection = http.client.HTTPConnection(running.addresses.host, running.addresses.http_port)
        for _ in range(20):
            connection.request("POST", "/v2/models/m/infer", body)
            response = connection.getresponse()
            assert response.status == 200
            assert json.loads(response.read())["outputs"][0]["data"] == [3, 6, 9, 12]
        connection.close()
    finally:
        stop_server(running, thread)


def test_a_loop_reading_turn_after_turn_without_sleeping_is_busy_for_that_long() -> None:
    """What the load shedder reads besides the loop's CPU use: a loop waiting for its turn on a
    shared CPU uses little of it, and never sleeps."""

    async def body() -> None:
        loop = asyncio.get_running_loop()
        clock, switches = FakeClock(10_000_000), [0]
        turn = ReadTurn(clock, switches=lambda: switches[0])
        turn.mark(loop)  # the first: a stretch starts
        for _ in range(5):
            clock.advance(4_000_000)  # never sleeping
            await asyncio.sleep(0)
            turn.mark(loop)
        await asyncio.sleep(0)
        assert turn.busy_for_ns(clock.now_ns()) == 20_000_000
        clock.advance(IDLE_AFTER_NS + 1)  # nothing read since: idle
        assert turn.busy_for_ns(clock.now_ns()) == 0
        switches[0] += 1  # it slept: the next turn starts a new stretch
        turn.mark(loop)
        assert turn.busy_for_ns(clock.now_ns()) == 0

    asyncio.run(body())


class KernelSays:
    """A socket whose TCP_INFO gives `age_ms` as the age of its last data."""

    def __init__(self, age_ms: int) -> None:
        self.age_ms = age_ms

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        assert (level, option) == (socket.IPPROTO_TCP, socket.TCP_INFO)
        return bytes(52) + self.age_ms.to_bytes(4, "little" if sys.byteorder == "little" else "big")


def test_the_kernel_bounds_what_the_loop_guesses_of_a_request_arrival() -> None:
    """A wait for the GIL looks like a sleep (requests would count from now), a preemption like
    a busy stretch (they would count from before it): TCP_INFO's age of the connection's last
    data, in whole kernel ticks, keeps the guess within a tick of it either way."""

    async def body() -> None:
        loop = asyncio.get_running_loop()
        clock, switches = FakeClock(1_000_000_000), [0]
        turn = ReadTurn(clock, switches=lambda: switches[0])
        turn.mark(loop)
        await asyncio.sleep(0)
        clock.advance(200_000_000)  # the loop was held 200 ms where it looks asleep
        switches[0] += 1
        turn.mark(loop)
        now = clock.now_ns()
        turn.reading(KernelSays(200))  # the data came 200 ms ago (give or take a tick)
        assert turn.arrival_ns(now) == now - 200_000_000 + 10_000_000  # no tick seen yet: 10 ms
        turn.done_reading()
        assert turn.arrival_ns(now) == now  # the guess alone again
        turn.reading(KernelSays(4))  # a 4 ms tick (HZ=250) is learnt
        turn.done_reading()
        await asyncio.sleep(0)
        clock.advance(62_000_000)  # preempted for 62 ms: not a sleep
        turn.mark(loop)
        now = clock.now_ns()
        assert turn.arrival_ns(now) == now - 62_000_000  # from the turn before, by the loop
        turn.reading(KernelSays(0))  # the data came this tick
        assert turn.arrival_ns(now) == now - 4_000_000
        turn.done_reading()
        turn.reading(KernelSays(60))  # within a tick of the loop's guess: it stands
        assert turn.arrival_ns(now) == now - 62_000_000
        turn.done_reading()
        turn.reading(KernelSays(0), whole=False)  # a body read in pieces: its last bytes
        assert turn.arrival_ns(now) == now - 62_000_000  # came now, its first may not have
        turn.done_reading()
        turn.reading(None)  # not a TCP socket: nothing to go by
        assert turn.arrival_ns(now) == now - 62_000_000

    asyncio.run(body())


class Unasked:
    """A socket the kernel must not be asked about."""

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        raise AssertionError("TCP_INFO read where no bound could move the guess")


def test_the_kernel_is_not_asked_where_its_window_could_not_move_the_guess() -> None:
    """A read costs 2-3 µs through uvloop's socket: a loop turning back to back, its guess
    younger than a tick, skips it."""

    async def body() -> None:
        loop = asyncio.get_running_loop()
        clock, switches = FakeClock(1_000_000_000), [0]
        turn = ReadTurn(clock, switches=lambda: switches[0])
        turn.mark(loop)
        turn.reading(KernelSays(4))  # the first turn: away since ever; a 4 ms tick learnt
        turn.done_reading()
        await asyncio.sleep(0)
        clock.advance(500_000)  # busy: batches and timers
        turn.mark(loop)
        clock.advance(1_000_000)
        turn.reading(Unasked())  # guess 1.5 ms old, away 0.5 ms: under a tick both
        assert turn.arrival_ns(clock.now_ns()) == 1_000_000_000
        turn.done_reading()
        await asyncio.sleep(0)
        clock.advance(5_000_000)  # away a tick and more: asked
        switches[0] += 1
        turn.mark(loop)
        turn.reading(KernelSays(12))
        assert turn.arrival_ns(clock.now_ns()) == clock.now_ns() - 8_000_000
        turn.done_reading()

    asyncio.run(body())


def test_a_request_that_waited_for_the_gil_in_its_socket_counts_that_wait(
    tmp_path: Path,
) -> None:
    """A loop waiting for the GIL (a thread in C code holding it: a big body joined and
    decoded, a model's instance thread) looks asleep: its requests counted from when it got
    the GIL back and were answered "on time", long after their clients' timeouts. The kernel's
    age of the data says better. (The client is another process: a send from this one would
    let the loop take the GIL and read the request before the hold.)"""
    write_version(tmp_path, "m", 1, scale_model(3))
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0, metrics=False)
    running, thread = start_server(settings)
    host, port = running.addresses.host, running.addresses.http_port
    client = subprocess.Popen(
        [sys.executable, "-c", _GIL_CLIENT, host, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout is not None
        assert client.stdout.readline().strip() == "200"  # the warm-up
        _hold_the_gil(0.6)  # the client sends its request 0.2 s into this
        status = client.stdout.readline().strip()
        assert client.wait(timeout=30) == 0
        assert status == "504"
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(timeout=30)
        if client.stdout is not None:
            client.stdout.close()
        stop_server(running, thread)


_GIL_CLIENT = """
import json, socket, sys, time
body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                   "data": [1, 2, 3, 4]}], "parameters": {"timeout": 50000}}).encode()
head = b"POST /v2/models/m/infer HTTP/1.1\\r\\nHost: t\\r\\nContent-Length: %d\\r\\n\\r\\n"
request = head % len(body) + body
with socket.create_connection((sys.argv[1], int(sys.argv[2]))) as c:
    c.sendall(request)
    print(c.recv(65536).split()[1].decode(), flush=True)
    time.sleep(0.2)
    c.sendall(request)
    print(c.recv(65536).split()[1].decode(), flush=True)
"""


def _hold_the_gil(seconds: float) -> None:
    """Keep the GIL for about `seconds`: `sum` over a range runs in C and never lets go."""
    n = 1_000_000
    started = time.monotonic()
    sum(range(n))
    took = max(time.monotonic() - started, 1e-6)
    sum(range(int(n * seconds / took)))


def test_a_connections_first_request_always_asks_the_kernel() -> None:
    """A connection waits in the listen backlog until a turn accepts it, and is read in a turn
    right after: a guess younger than a tick, the loop away less than one, yet its data may
    have waited a whole stall (a server stopped 1 s answered such requests as fresh)."""

    async def body() -> None:
        loop = asyncio.get_running_loop()
        clock, switches = FakeClock(1_000_000_000), [0]
        turn = ReadTurn(clock, switches=lambda: switches[0])
        turn.mark(loop)
        turn.reading(KernelSays(4))  # (a 4 ms tick learnt)
        turn.done_reading()
        await asyncio.sleep(0)
        clock.advance(500_000)  # the turn that accepted the connection, just before
        turn.mark(loop)
        now = clock.now_ns()
        turn.reading(Unasked())  # (a connection's later request: skipped, as before)
        turn.done_reading()
        turn.reading(KernelSays(1000), first=True)  # its data came 1 s ago
        assert turn.arrival_ns(now) == now - 1_000_000_000 + 4_000_000
        turn.done_reading()

    asyncio.run(body())


def test_a_socket_view_asks_the_kernel_and_never_closes_the_transports_socket() -> None:
    """A connection keeps one `SocketView` of its transport's socket (uvloop's stand-in makes a
    socket object for every question): it reads TCP_INFO, and neither its collection nor its
    detaching closes the descriptor, which the transport owns (and may be another connection's
    after it closes)."""
    import gc

    from duetime.frontend.arrival import last_data_age_ns, tcp_view

    listener = socket.create_server(("127.0.0.1", 0))
    with listener, socket.create_connection(listener.getsockname()) as client:
        served, _ = listener.accept()
        with served:
            client.sendall(b"x")
            view = tcp_view(served)
            assert view is not None
            assert view.fileno() == served.fileno()
            assert last_data_age_ns(view) is not None
            del view
            gc.collect()  # (collected: detached, not closed)
            os.fstat(served.fileno())  # (EBADF once closed)
            again = tcp_view(served)
            assert again is not None
            again.detach()
            os.fstat(served.fileno())
            assert served.recv(1) == b"x"
    assert tcp_view(None) is None
    unix_a, unix_b = socket.socketpair()
    with unix_a, unix_b:
        assert tcp_view(unix_a) is None, "TCP only: a Unix socket has no TCP_INFO"
