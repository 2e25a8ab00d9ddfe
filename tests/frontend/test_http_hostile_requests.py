"""Requests shaped to cost the server more than they cost the client, over raw sockets: each
must cost it no more than reading it, and leave other clients served."""

from __future__ import annotations

import time

import pytest
from conftest import RunningServer
from test_http_protocol import RawClient, infer_body, infer_request, output_of, request

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
