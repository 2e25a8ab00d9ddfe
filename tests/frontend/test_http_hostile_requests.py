"""Requests shaped to cost the server more than they cost the client, over raw sockets: each
must cost it no more than reading it, and leave other clients served."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from conftest import RunningServer, start_server, stop_server
from repo_models import WIDTH, scale_model, write_version
from test_http_protocol import RawClient, infer_body, infer_request, output_of, request

from duetime.config import ServerSettings

pytestmark = pytest.mark.timeout(60)

PROMPT_S = 3.0
"""How long an answer that takes milliseconds may take here before it counts as never coming
(the failures these tests catch take 20 s or forever)."""


def test_a_path_of_60000_slashes_costs_no_more_than_reading_it(server: RunningServer) -> None:
    """'/' + 60,000 slashes + 'v2/health/live' (60 KB, under the 64 KiB head limit) held the
    event loop for 21 s: the leading empty segments were dropped one list slice at a time."""
    with RawClient(server.http) as client:
        client.sock.settimeout(PROMPT_S)
        client.send(request("GET", "/" + "/" * 60_000 + "v2/health/live"))
        try:
            answer = client.response()
        except TimeoutError:
            pytest.fail(f"no answer within {PROMPT_S} s: the path's handling is not linear")
    assert (answer.status, answer.json()) == (200, {"live": True})


@pytest.mark.parametrize("framing", ["one write", "body in later writes", "chunked"])
def test_a_request_asking_to_upgrade_keeps_its_body(server: RunningServer, framing: str) -> None:
    """`curl --http2` on http:// sends `Connection: Upgrade, HTTP2-Settings` and `Upgrade: h2c`
    with its POST. The Upgrade is ignored (RFC 9110 7.8), as for a GET; the body was lost (400,
    'not valid JSON: zero-length'). Nothing after the request is read: the connection closes."""
    with RawClient(server.http) as plain:
        plain.send(infer_request())
        expected = output_of(plain.response())
    body = infer_body()
    upgrade = {"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": ""}
    if framing == "chunked":
        upgrade["Transfer-Encoding"] = "chunked"
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    wire = request("POST", "/v2/models/mlp/infer", body, upgrade)
    with RawClient(server.http) as client:
        if framing == "body in later writes":
            head = len(wire) - len(body)
            client.send(wire[:head])
            for start in range(head, len(wire), 100):
                time.sleep(0.001)  # (separate reads, most likely: either way, one body)
                client.send(wire[start : start + 100])
        else:
            client.send(wire + request("GET", "/v2/health/live"))
        answer = client.response()
        assert output_of(answer) == expected
        assert answer.headers["connection"] == "close"
        assert client.closed_by_server()


ROOM = 4 * 1024 * 1024
"""The room for big bodies of `roomy_server`: a body over 256 KiB reserves its length in it."""


@pytest.fixture(scope="module")
def roomy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server of model 'm' (y = 2x) with 4 MiB of room for bodies over 256 KiB."""
    repo = tmp_path_factory.mktemp("repo")
    write_version(repo, "m", 1, scale_model(2))
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, metrics=False,
        max_inflight_bytes=ROOM, max_connections=16,
    )  # fmt: skip
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


def test_a_slow_body_holding_the_room_for_bodies_cannot_keep_others_waiting(
    roomy_server: RunningServer,
) -> None:
    """A body announced as (nearly) the whole room, sent at 200 kB/s (above the minimum rate,
    20 s to arrive), held its room while a 1 MB request waited unread behind it for as long. Now,
    while a body waits, one holding room must be on course to arrive within
    `request_read_timeout_s` (10 s): the slow one is answered 408, the waiting one served."""
    slow = RawClient(roomy_server.http)
    big = ROOM - 1000
    head = request("POST", "/v2/models/m/infer", headers={"Content-Length": str(big)})
    slow.send(head[:-2] + b"Expect: 100-continue\r\n\r\n")
    assert slow.response().status == 100  # (its room is reserved)
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.1):
            try:
                slow.send(b" " * 20_000)
            except OSError:  # (refused, closed)
                return

    sender = threading.Thread(target=trickle)
    sender.start()
    try:
        doc = {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, WIDTH], "data": [1] * WIDTH}]
        }
        body = json.dumps(doc).encode().ljust(1_000_000)  # (JSON allows trailing whitespace)
        with RawClient(roomy_server.http) as waiting:
            waiting.sock.settimeout(PROMPT_S + 2)  # (the slow one is judged after 1 s of it)
            waiting.send(request("POST", "/v2/models/m/infer", body))
            try:
                answer = waiting.response()
            except TimeoutError:
                pytest.fail("the request waited behind a slow body holding the room for bodies")
        assert output_of(answer) == [2.0] * WIDTH
        refused = slow.response()
        assert refused.status == 408
        assert "while other requests wait for the room it holds" in refused.json()["error"]
        assert slow.closed_by_server()
    finally:
        stop.set()
        sender.join()
        slow.sock.close()


def test_a_slow_body_is_not_refused_where_that_would_let_no_waiting_body_in(
    roomy_server: RunningServer,
) -> None:
    """A 30 MB body coming at 2.5 MB/s (38 times the minimum rate) got 408 while a 50 MB body
    waited, though that could not fit beside a fast 60 MB one in 96 MiB either way: here, a slow
    body and one on course hold half the room each, and the body waiting needs more than half."""
    half = ROOM // 2 - 1000

    def holding(rate_bytes_s: int) -> tuple[RawClient, threading.Event, threading.Thread]:
        client = RawClient(roomy_server.http)
        head = request("POST", "/v2/models/m/infer", headers={"Content-Length": str(half)})
        client.send(head[:-2] + b"Expect: 100-continue\r\n\r\n")
        assert client.response().status == 100  # (its room is reserved)
        stop = threading.Event()

        def trickle() -> None:
            while not stop.wait(0.1):
                try:
                    client.send(b" " * (rate_bytes_s // 10))
                except OSError:
                    return

        sender = threading.Thread(target=trickle)
        sender.start()
        return client, stop, sender

    slow = holding(100_000)  # (20 s to arrive: past request_read_timeout_s)
    steady = holding(400_000)  # (5 s: on course)
    waiting = RawClient(roomy_server.http)
    try:
        waiting.send(request("POST", "/v2/models/m/infer", b" " * (ROOM // 2 + 100_000)))
        slow[0].sock.settimeout(2.5)  # (bodies are judged after 1 s, then every 0.25 s)
        with pytest.raises(TimeoutError):
            slow[0].response()
    finally:
        for client, stop, sender in (slow, steady):
            stop.set()
            sender.join()
            client.sock.close()
        waiting.sock.close()
