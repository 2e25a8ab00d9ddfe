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
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from memory_fakes import Transport, in_memory_server
from repo_models import scale_model, write_version

from duetime.frontend.http import _KEPT_READING_BYTES, HttpConnection, Intake
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


def feed(connection: HttpConnection, data: bytes) -> None:
    """Hand `data` to `connection` as uvloop does: into the buffer its `get_buffer` gives (a
    binary body's own, where it reads one in place), then `buffer_updated`."""
    view = memoryview(data)
    while view:
        buffer = connection.get_buffer(len(view))
        size = min(len(buffer), len(view))
        buffer[:size] = view[:size]
        connection.buffer_updated(size)
        view = view[size:]


def test_a_binary_body_begun_in_bytes_kept_behind_the_quota_is_read_in_order(
    tmp_path: Path,
) -> None:
    """A busy loop keeps what a pipelining client sent past its quota unparsed, and reads on:
    a binary body read in place (into its own buffer) whose first bytes were among those kept
    had the next reads land ahead of them. Answered 200 on a scrambled tensor, or 500 where
    they overran its buffer (a tester's)."""
    write_version(tmp_path, "echo", 1, scale_model(1.0))
    (tmp_path / "echo" / "config.toml").write_text("max_batch_size = 0\n")
    x = np.arange(4096 * 4, dtype=np.float32).reshape(4096, 4)
    head = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4096, 4],
                     "parameters": {"binary_data_size": x.nbytes}}]}
    ).encode()  # fmt: skip
    infer = (
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream"
        b"\r\nInference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n%s%s"
        % (len(head), len(head) + x.nbytes, head, x.tobytes())
    )
    probes = HEALTH.replace(b"live", b"ready") * 5  # (past the quota of 4 pipelined)
    data = probes + infer
    first = len(probes) + 2400  # (a piece past the probes: the body's head and first bytes)

    async def body() -> list[bytes]:
        async with in_memory_server(tmp_path) as served:
            shedder = served.server.shedder
            assert shedder is not None
            shedder.sample = lambda *args, **kwargs: None  # type: ignore[method-assign]
            shedder.watching = True  # (a busy loop: the quota holds)
            connection, transport = served.connect(WatchedTransport())
            feed(connection, data[:first])
            assert connection._unparsed, "the body's first bytes wait for the next period"
            for at in range(first, len(data), 1500):  # (the rest as it comes)
                feed(connection, data[at : at + 1500])
                await asyncio.sleep(0)
            for _ in range(2000):
                if len(transport.written) >= 6:
                    break
                await asyncio.sleep(0.001)
            return transport.written

    written = asyncio.run(body())
    assert [answer.split(b" ", 2)[1] for answer in written] == [b"200"] * 6
    answer = json.loads(written[5].split(b"\r\n\r\n", 1)[1])
    assert np.array_equal(np.array(answer["outputs"][0]["data"], np.float32), x.ravel())


def test_a_request_whose_bytes_the_server_keeps_is_not_timed_out_meanwhile(
    mlp_resnet_repo: Path,
) -> None:
    """Bytes kept unparsed behind a busy loop's quota are held by the server, not late from
    the client: the request they complete is not refused 408 ("its head was not complete")
    however long they wait, and its read timeout counts again once they are parsed. A tester's
    3,000 connections, each writing 30 pipelined requests at once to an overloaded loop, had
    231-594 of them answered 408 (1 s read timeout) and none of their requests run."""
    requests = 12  # (past the quota of 4 after the second 2 KiB piece, which cuts the tenth)

    async def body() -> list[bytes]:
        async with in_memory_server(mlp_resnet_repo, request_read_timeout_s=1.0) as served:
            shedder = served.server.shedder
            assert shedder is not None
            shedder.sample = lambda *args, **kwargs: None  # type: ignore[method-assign]
            shedder.watching = True  # (a busy loop: the quota holds)
            connection, transport = served.connect(WatchedTransport())
            connection.data_received(LIGHT * requests)
            assert connection._unparsed, "the rest waits for the next quota period"
            assert connection._window_start is not None, "a request begun, its rest kept"
            connection._window_start -= 60.0  # (as if the loop had been held up for a minute)
            connection._check_timeouts()
            for _ in range(2000):
                if len(transport.written) >= requests:
                    break
                await asyncio.sleep(0.001)
            return transport.written

    written = asyncio.run(body())
    assert [answer.split(b" ", 2)[1] for answer in written] == [b"200"] * requests


def test_a_request_begun_within_a_hold_is_moved_on_by_its_own_part_of_it(
    mlp_resnet_repo: Path,
) -> None:
    """Time the server held a connection's bytes is not the client's, but only what of it the
    request's own window held: a request begun within the hold (parsed from bytes kept) was
    moved on by all of it, past now, and a client trickling a head to a busy loop got its 408
    after 3-4 read timeouts (a tester's)."""

    async def body() -> tuple[float, float, float]:
        async with in_memory_server(mlp_resnet_repo) as served:
            connection, _ = served.connect(WatchedTransport())
            loop = asyncio.get_running_loop()
            now = loop.time()
            connection._held_since = now - 10.0  # (held for 10 s)
            connection._window_start = now - 1.0  # (a request begun 1 s ago, within it)
            connection._update_reading()  # (nothing kept, nothing paused: the hold ends)
            moved = connection._window_start
            assert moved is not None
            connection._held_since = loop.time() - 5.0  # (one begun before a hold of 5 s)
            connection._window_start = loop.time() - 6.0
            connection._update_reading()
            before = connection._window_start
            assert before is not None
            return now, moved, before - loop.time()

    now, moved, before = asyncio.run(body())
    assert now - 0.1 <= moved <= now + 0.1, "its window starts as the hold ends"
    assert -1.1 <= before <= -0.9, "one begun before it is moved on by all of it"


class OrderedTransport(WatchedTransport):
    """A WatchedTransport whose writes are also noted, with its name, in `order`."""

    def __init__(self, name: str, order: list[str]) -> None:
        super().__init__()
        self.name = name
        self.order = order

    def write(self, data: bytes) -> None:
        super().write(data)
        self.order.append(self.name)

    def writelines(self, pieces: list[bytes]) -> None:
        super().writelines(pieces)
        self.order.append(self.name)


def test_a_connection_sending_one_request_at_a_time_is_read_before_pipelining_ones(
    mlp_resnet_repo: Path,
) -> None:
    """Of the reads waiting for a turn of the loop, those of connections that do not pipeline
    are parsed first. In one queue, a request due in 20 ms on a new connection waited behind
    300 connections of one client writing 200 requests each (each parsing a quota or up to 64
    of them in its turn), and was read 4.6-12.6 s after it came (found by a tester)."""
    pipelining = 12

    async def body() -> tuple[list[bool], bool, list[str]]:
        async with in_memory_server(mlp_resnet_repo) as served:
            ticks = itertools.count()
            intake = Intake(served.settings, clock=lambda: next(ticks) * 0.001)
            order: list[str] = []
            flood = [
                served.connect(OrderedTransport(f"flood{i}", order), intake=intake, shedder=None)
                for i in range(pipelining)
            ]
            for connection, _ in flood:  # (two requests in one read: each turn's only read)
                connection.data_received(LIGHT * 2)
                await asyncio.sleep(0)
            marked = [connection.pipelined for connection, _ in flood]
            for _ in range(5000):
                if all(len(transport.written) == 2 for _, transport in flood):
                    break
                await asyncio.sleep(0.001)
            order.clear()
            # one turn: the flood's reads spend its budget and wait, then a lone request's
            for connection, _ in flood:
                connection.data_received(LIGHT * 2)
            lone, lone_transport = served.connect(
                OrderedTransport("lone", order), intake=intake, shedder=None
            )
            lone.data_received(LIGHT)
            waited = bool(lone._unparsed)
            for _ in range(5000):
                if lone_transport.written and all(len(t.written) == 4 for _, t in flood):
                    break
                await asyncio.sleep(0.001)
            return marked, waited and not lone.pipelined, order

    marked, lone_waited, order = asyncio.run(body())
    assert all(marked), "a connection sending two requests in one read pipelines"
    assert lone_waited, "the lone request waited for a turn, and does not pipeline"
    assert len(order) == 2 * pipelining + 1
    waited_before = [name for name in order[: order.index("lone")] if name != "lone"]
    # (the turn's first reads are parsed in it, before any waits: at most its budget's worth)
    assert len(waited_before) <= 2 * 6, order


def test_a_request_due_when_its_turn_to_be_read_came_is_refused_as_the_servers_lateness(
    mlp_resnet_repo: Path,
) -> None:
    """Its client sent one request and owed no answer: the 504 says it waited to be read, and
    does not tell the client to read its answers (found by a tester)."""
    due_in_1ms = http_request_bytes(
        PayloadSpec("http-binary", "mlp", 1, None, "127.0.0.1", 1),
        {"x": np.ones((1, 40), np.float32)},
        {"timeout": 1_000},
        binary=True,
    )

    async def body() -> bytes:
        async with in_memory_server(mlp_resnet_repo) as served:
            ticks = itertools.count()
            intake = Intake(served.settings, clock=lambda: next(ticks) * 0.001)
            busy = [served.connect(intake=intake, shedder=None) for _ in range(8)]
            for connection, _ in busy:  # (the turn's budget is spent by these)
                connection.data_received(LIGHT)
            late, transport = served.connect(intake=intake, shedder=None)
            late.data_received(due_in_1ms)
            assert late._unparsed, "it waits for a turn"
            time.sleep(0.005)  # noqa: ASYNC251 - the loop is busy: the request is due meanwhile
            for _ in range(5000):
                if transport.written:
                    break
                await asyncio.sleep(0.001)
            return transport.written[0]

    answer = asyncio.run(body())
    assert answer.startswith(b"HTTP/1.1 504 ")
    assert b"it waited to be read behind other requests (the server is overloaded)" in answer
    assert b"read answers as they come" not in answer


class Waiting:
    """A connection waiting for a turn of the loop, as the Intake sees one."""

    def __init__(self, name: str, pipelined: bool, fed: list[str]) -> None:
        self.name = name
        self.pipelined = pipelined
        self.fed = fed

    def turn_came(self) -> None:
        self.fed.append(self.name)


class HeldLoop:
    """Keeps what the Intake asks to run soon, for the test to run."""

    def __init__(self) -> None:
        self.soon: list[tuple[Any, tuple[Any, ...]]] = []

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.soon.append((callback, args))

    def run(self) -> None:
        while self.soon:
            callback, args = self.soon.pop(0)
            callback(*args)


def test_pipelining_connections_take_turns_with_the_others_waiting(
    mlp_resnet_repo: Path,
) -> None:
    """A pipelining connection is fed in turn with those that are not, not only once none of
    them waits: fed last, one waited 1.8-4.6 s beside 150 clients sending one request at a time
    (found by a tester)."""

    async def body() -> list[str]:
        async with in_memory_server(mlp_resnet_repo) as served:
            ticks = itertools.count()
            intake = Intake(served.settings, clock=lambda: next(ticks) * 0.0001)
            fed: list[str] = []
            loop = HeldLoop()
            for name in ("p1", "p2"):
                intake.wait_turn(Waiting(name, True, fed), loop)  # type: ignore[arg-type]
            for i in range(6):
                intake.wait_turn(Waiting(f"s{i}", False, fed), loop)  # type: ignore[arg-type]
            loop.run()
            return fed

    fed = asyncio.run(body())
    assert fed == ["s0", "p1", "s1", "p2", "s2", "s3", "s4", "s5"]


def test_a_connection_that_pipelined_once_is_not_marked_once_it_sends_one_at_a_time(
    mlp_resnet_repo: Path,
) -> None:
    """A request sent with none owed, in a read of its own, clears the mark: two requests
    written at once when the connection opened cost it its turns for its life (a tester)."""

    async def body() -> list[bool]:
        async with in_memory_server(mlp_resnet_repo) as served:
            connection, transport = served.connect(WatchedTransport(), shedder=None)
            marks = []
            connection.data_received(LIGHT * 2)
            marks.append(connection.pipelined)
            for _ in range(2000):
                if len(transport.written) == 2:
                    break
                await asyncio.sleep(0.001)
            connection.data_received(LIGHT)
            marks.append(connection.pipelined)
            return marks

    assert asyncio.run(body()) == [True, False]
