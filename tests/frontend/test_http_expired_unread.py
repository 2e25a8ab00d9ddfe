"""An inference request that is due before its loop turn reads it, while the load shedder
weighs requests (a busy loop), is refused 504 undecoded: its `timeout` is read from its JSON
head (`_timeout_unread`), and the model's scheduler counts it expired, as it counts one due
before it reached the scheduler (a real engine; connections fed in memory; the shedder scripted
to let every request through, so nothing depends on timing but the 1 µs timeouts).

An undecoded request is told by its tensor: one shaped [1, 41] for mlp's [-1, 40] is refused
400 once decoded.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from memory_fakes import in_memory_server
from test_http_shed_at_once import Scripted, answers

from duetime.frontend.http import _timeout_unread
from duetime.requestparams import MAX_DUE_US
from duetime.tools.payloads import PayloadSpec, http_request_bytes


def infer(timeout_us: int | None, columns: int = 40, **input_parameters: object) -> bytes:
    """An mlp request over HTTP binary, with `timeout_us` (None: none) and `input_parameters`
    on its input."""
    request = http_request_bytes(
        PayloadSpec("http-binary", "mlp", 1, None, "127.0.0.1", 1),
        {"x": np.ones((1, columns), np.float32)},
        {} if timeout_us is None else {"timeout": timeout_us},
        binary=True,
    )
    if not input_parameters:
        return request
    head, body = request.split(b"\r\n\r\n", 1)
    length = int(head.split(b"Inference-Header-Content-Length: ")[1].split(b"\r\n")[0])
    header = json.loads(body[:length])
    header["inputs"][0]["parameters"].update(input_parameters)
    new = json.dumps(header, separators=(",", ":")).encode()
    body = new + body[length:]
    head = head.replace(b"Content-Length: %d" % (len(request) - len(head) - 4),
                        b"Content-Length: %d" % len(body))  # fmt: skip
    head = head.replace(b"Inference-Header-Content-Length: %d" % length,
                        b"Inference-Header-Content-Length: %d" % len(new))  # fmt: skip
    return head + b"\r\n\r\n" + body


async def exchange(
    repo: Path, requests: list[bytes], *, watching: bool = True, at_once: bool = False
) -> tuple[list[bytes], list[bytes], int]:
    """The statuses and written bytes of the answers to `requests`, each sent as its
    connection owes nothing (or all in one read: `at_once`), and mlp's expired count."""
    shedder = Scripted([False] * len(requests))
    shedder.watching = watching
    if not watching:
        shedder.share = 0.0
    async with in_memory_server(repo) as served:
        connection, transport = served.connect(shedder=shedder)
        if at_once:
            connection.data_received(b"".join(requests))
            found = await answers(connection, transport, len(requests))
        else:
            found = []
            for sent, request in enumerate(requests, 1):
                connection.data_received(request)
                found = await answers(connection, transport, sent)
        scheduler = served.server.engine.registry.scheduler_of("mlp", None)
        assert scheduler is not None
        written = b"".join(transport.written).split(b"HTTP/1.1 ")[1:]
        return found, written, scheduler.statistics().expired


def test_a_request_due_before_it_was_read_is_refused_undecoded(mlp_repo: Path) -> None:
    found, written, expired = asyncio.run(exchange(mlp_repo, [infer(1, columns=41)]))
    assert found == [b"504"]
    assert expired == 1
    message = json.loads(written[0].split(b"\r\n\r\n", 1)[1])["error"]
    assert "model 'mlp' version 1" in message
    assert "before it reached the scheduler" in message
    assert b"x-trace-id: " in written[0]
    assert b"Connection: close" not in written[0]  # (the connection stays open)


def test_requests_still_in_time_or_of_no_timeout_are_decoded_and_answered(
    mlp_repo: Path,
) -> None:
    requests = [infer(10_000_000), infer(None), infer(10_000_000, columns=41)]
    found, _, expired = asyncio.run(exchange(mlp_repo, requests))
    assert found == [b"200", b"200", b"400"]
    assert expired == 0


def test_behind_an_owed_answer_the_refusal_keeps_its_place(mlp_repo: Path) -> None:
    requests = [infer(10_000_000), infer(1, columns=41), infer(10_000_000)]
    found, _, expired = asyncio.run(exchange(mlp_repo, requests, at_once=True))
    assert found == [b"200", b"504", b"200"]
    assert expired == 1


@pytest.mark.parametrize(
    ("watching", "parameters"),
    [
        (False, {}),  # an idle loop decodes every request, as before
        (True, {"timeout": 5}),  # "timeout" twice: which is the request's is left to decoding
    ],
)
def test_where_the_head_is_not_read_for_it_the_request_is_decoded(
    mlp_repo: Path, watching: bool, parameters: dict[str, object]
) -> None:
    request = infer(1, columns=41, **parameters)
    found, _, _ = asyncio.run(exchange(mlp_repo, [request], watching=watching))
    assert found == [b"400"]


def body_of(header: dict[str, object], tail: bytes = b"") -> tuple[dict[str, str], bytes]:
    data = json.dumps(header).encode()
    return {"inference-header-content-length": str(len(data))}, data + tail


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        ({}, b'{"inputs":[],"parameters":{"timeout":2000}}', 2000),
        (*body_of({"parameters": {"timeout": 7}}, b"\x00" * 64), 7),
        ({}, b'{"parameters":{"timeout":2000},"inputs":[{"parameters":{"timeout":1}}]}', None),
        ({}, b'{"parameters":{"timeout":0}}', None),  # 0: no due time
        ({}, b'{"parameters":{"timeout":%d}}' % (MAX_DUE_US + 1), None),
        ({}, b'{"parameters":{"timeout":true}}', None),
        ({}, b'{"parameters":{"timeout":"2000"}}', None),
        ({}, b'{"parameters":{"timeout":2.5}}', None),
        ({}, b'{"parameters":["timeout",2]}', None),
        ({}, b'{"parameters":{"timeout":2000', None),  # not JSON
        ({}, b'{"inputs":[{"name":"timeout"}]}', None),
        ({"content-encoding": "gzip"}, b'{"parameters":{"timeout":2000}}', None),
        ({}, b'{"parameters":{"timeout":2000},"pad":"%s"}' % (b"x" * 5000), None),  # too big
    ],
)
def test_the_timeout_read_from_a_head(
    headers: dict[str, str], body: bytes, expected: int | None
) -> None:
    assert _timeout_unread(headers, body) == expected
    assert _timeout_unread(headers, memoryview(body)) == expected
    assert _timeout_unread(headers, np.frombuffer(body, np.uint8)) == expected
