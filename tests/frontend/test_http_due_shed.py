"""While the event loop is saturated, an inference request whose `timeout` is no longer than the
loop's lag (the time since the earliest the loop can tell it came: by then it is due) is
refused by the load shedder with 429, unread, in words of its own (`HttpConnection._due`);
one it lets through is not weighed twice. Priority 1 is spared, and so is every request while
the loop is not saturated: those are decoded, and admission answers them as before (504 for
one due). A real engine; connections fed in memory; the shedder scripted (saturated or not,
letting every request through itself), so nothing depends on timing but the 1 µs timeouts.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from memory_fakes import in_memory_server
from test_http_shed_at_once import answers

from duetime.overload import LoadShedder
from duetime.tools.payloads import PayloadSpec, http_request_bytes

DUE_WORDS = "this request's timeout is no longer than requests wait to be read and answered now"


def infer(x: np.ndarray | None = None, gzipped: bool = False, **parameters: int) -> bytes:
    """An mlp request over HTTP binary with `parameters` (`x`: its input, ones by default);
    `gzipped`: its body compressed."""
    x = np.ones((1, 40), np.float32) if x is None else x
    request = http_request_bytes(
        PayloadSpec("http-binary", "mlp", 1, None, "127.0.0.1", 1), {"x": x}, parameters,
        binary=True,
    )  # fmt: skip
    if not gzipped:
        return request
    head, body = request.split(b"\r\n\r\n", 1)
    packed = gzip.compress(body)
    head = head.replace(b"Content-Length: %d" % len(body), b"Content-Length: %d" % len(packed))
    return head + b"\r\nContent-Encoding: gzip\r\n\r\n" + packed


class Saturated:
    """A shedder that refuses nothing itself, saturated or not, counting what it refuses for
    due times (as `LoadShedder.refuse_due` does)."""

    def __init__(self, saturated: bool) -> None:
        self.share = 0.0
        self.watching = True
        self.saturated = saturated
        self.weighed = 0
        self.due: list[str | None] = []

    def refuse(
        self, model: str | None = None, size: int = 0, top: bool = False, version: object = None
    ) -> bool:
        self.weighed += 1
        return False

    def refusing(self, model: str | None) -> bool:
        return False

    def refuse_due(self, model: str | None = None) -> None:
        self.due.append(model)


async def exchange(
    repo: Path,
    requests: list[bytes],
    saturated: bool = True,
    at_once: bool = False,
    turn_wait_ns: float | None = None,
) -> tuple[list[bytes], list[bytes], Saturated, int]:
    """The statuses and bytes of the answers to `requests` (each sent once its connection owes
    nothing, or all in one read: `at_once`), the shedder, and the API's shed count.
    `turn_wait_ns`: mlp's scheduler's recent wait for a turn's dispatch (its own by default)."""
    shedder = Saturated(saturated)
    async with in_memory_server(repo) as served:
        if turn_wait_ns is not None:
            scheduler = served.server.engine.registry.scheduler_of("mlp", None)
            assert scheduler is not None
            scheduler.turn_wait_ns = turn_wait_ns
        connection, transport = served.connect(shedder=shedder)
        if at_once:
            connection.data_received(b"".join(requests))
            found = await answers(connection, transport, len(requests))
        else:
            found = []
            for sent, request in enumerate(requests, 1):
                connection.data_received(request)
                found = await answers(connection, transport, sent)
        written = b"".join(transport.written).split(b"HTTP/1.1 ")[1:]
        return found, written, shedder, served.server._rest.shed


def test_a_request_due_by_the_loop_s_lag_is_refused_unread(mlp_repo: Path) -> None:
    found, written, shedder, shed = asyncio.run(exchange(mlp_repo, [infer(timeout=1)]))
    assert found == [b"429"]
    head, body = written[0].split(b"\r\n\r\n", 1)
    assert DUE_WORDS in json.loads(body)["error"]
    assert b"Retry-After: 1" in head
    assert b"x-trace-id: " in head
    assert b"Connection: close" not in head
    assert (shedder.due, shedder.weighed, shed) == (["mlp"], 1, 1)


def test_requests_in_time_or_without_a_due_time_are_answered(mlp_repo: Path) -> None:
    requests = [infer(timeout=10_000_000), infer(timeout=0), infer()]
    found, _, shedder, shed = asyncio.run(exchange(mlp_repo, requests))
    assert found == [b"200", b"200", b"200"]
    assert (shedder.due, shedder.weighed, shed) == ([], 3, 0)


def test_behind_an_owed_answer_the_refusal_keeps_its_place(mlp_repo: Path) -> None:
    requests = [infer(timeout=10_000_000), infer(timeout=1), infer(timeout=10_000_000)]
    found, written, shedder, _ = asyncio.run(exchange(mlp_repo, requests, at_once=True))
    assert found == [b"200", b"429", b"200"]
    assert DUE_WORDS.encode() in written[1]
    assert shedder.due == ["mlp"]


def test_a_request_due_before_its_model_s_turn_comes_is_refused_unread(mlp_repo: Path) -> None:
    """Its timeout (60 s) is longer than the loop's lag, but not than that plus the wait for
    the dispatch of a turn mlp's requests had lately (its scheduler's `turn_wait_ns`, 90 s
    here); one with a longer timeout, or the same one while the loop is not saturated, is
    answered."""
    minute, two = infer(timeout=60_000_000), infer(timeout=120_000_000)
    found, written, shedder, shed = asyncio.run(
        exchange(mlp_repo, [minute, two], turn_wait_ns=90e9)
    )
    assert found == [b"429", b"200"]
    assert DUE_WORDS.encode() in written[0]
    assert (shedder.due, shed) == (["mlp"], 1)
    found, _, shedder, _ = asyncio.run(
        exchange(mlp_repo, [minute], saturated=False, turn_wait_ns=90e9)
    )
    assert (found, shedder.due) == ([b"200"], [])


def test_priority_one_a_compressed_body_and_an_unsaturated_loop_go_to_admission(
    mlp_repo: Path,
) -> None:
    """Decoded, each is found due by admission: 504, as before."""
    spared = [infer(timeout=1, priority=1), infer(gzipped=True, timeout=1)]
    found, _, shedder, _ = asyncio.run(exchange(mlp_repo, spared))
    assert found == [b"504", b"504"]
    assert shedder.due == []
    found, _, shedder, _ = asyncio.run(exchange(mlp_repo, [infer(timeout=1)], saturated=False))
    assert found == [b"504"]
    assert shedder.due == []


def test_only_the_json_head_is_read_for_the_timeout(mlp_repo: Path) -> None:
    """Tensor bytes that spell a timeout are not taken for one."""
    spelled = b'"timeout":1,' * 14  # (160 bytes of it: mlp's 40 floats, all finite)
    x = np.frombuffer(spelled[:160], np.float32).reshape(1, 40)
    assert np.isfinite(x).all()
    found, _, shedder, _ = asyncio.run(exchange(mlp_repo, [infer(x)]))
    assert found == [b"200"]
    assert shedder.due == []


def test_the_shedder_is_saturated_past_its_target_or_refusing() -> None:
    shedder = LoadShedder(target=0.85)
    assert not shedder.saturated
    shedder.demand = 0.9
    assert shedder.saturated
    shedder.demand, shedder.share = 0.1, 0.05
    assert shedder.saturated


def test_a_refusal_for_a_due_time_counts_as_the_shedder_s() -> None:
    shedder = LoadShedder()
    shedder.refuse_due("mlp")
    shedder.refuse_due(None)
    assert shedder.refused == 2
    assert shedder.refused_by_model == {"mlp": 1, "": 1}


def json_infer(parameters: bytes) -> bytes:
    """An mlp request over HTTP JSON whose parameters object is `parameters`, as written."""
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,40],"data":[%s]}],' % (
        b",".join([b"0.5"] * 40)
    )
    body += b'"parameters":' + parameters + b"}"
    head = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(
        body
    )
    return head + body


@pytest.mark.parametrize(
    ("parameters", "status"),
    [
        (b'{"timeout": 1}', b"429"),
        (b'{ "timeout" :\n1 }', b"429"),
        (b'{"timeout": 1.5}', b"400"),  # (not an integer: refused as the parameter says)
        (b'{"timeout": 1e3}', b"400"),
        (b'{"timeout": 01}', b"400"),  # (not JSON)
        (b'{"timeout": -1}', b"400"),
        (b'{"timeout": "1"}', b"400"),
        (b'{"timeout": 0}', b"200"),  # (no due time)
        (b'{"timeout": 99999999999999}', b"200"),  # (over MAX_DUE_US: no due time)
    ],
)
def test_only_a_timeout_that_sets_a_due_time_is_read(
    mlp_repo: Path, parameters: bytes, status: bytes
) -> None:
    found, _, _, _ = asyncio.run(exchange(mlp_repo, [json_infer(parameters)]))
    assert found == [status]


def test_a_model_not_served_is_answered_as_such(mlp_repo: Path) -> None:
    request = infer(timeout=1).replace(b"/v2/models/mlp/", b"/v2/models/nope/", 1)
    found, _, shedder, _ = asyncio.run(exchange(mlp_repo, [request]))
    assert found == [b"404"]
    assert shedder.due == []
