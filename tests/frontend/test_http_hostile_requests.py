"""Requests shaped to cost the server more than they cost the client, over raw sockets: each
must cost it no more than reading it, and leave other clients served."""

from __future__ import annotations

import pytest
from conftest import RunningServer
from test_http_protocol import RawClient, request

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
