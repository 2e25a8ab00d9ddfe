"""A first end-to-end check that the fixtures start a real server."""

from __future__ import annotations

import http.client

from conftest import RunningServer


def test_server_answers_health(server: RunningServer) -> None:
    conn = http.client.HTTPConnection(server.addresses.host, server.addresses.http_port, timeout=10)
    try:
        conn.request("GET", "/v2/health/ready")
        assert conn.getresponse().status == 200
    finally:
        conn.close()
