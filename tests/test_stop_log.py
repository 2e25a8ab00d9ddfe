"""The stop's log line counts the HTTP connections open as the server stops."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest
from conftest import start_server, stop_server
from repo_models import scale_model, write_version

from duetime.config import ServerSettings


def test_the_stop_log_counts_the_connections_open_at_the_stop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With 3 idle keep-alive connections open it logged "stopped; 0 HTTP connections were
    open": the count was taken once it had closed them."""
    write_version(tmp_path, "m", 1, scale_model(1.0))
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0)
    running, thread = start_server(settings)
    host, port = running.http.rsplit(":", 1)
    clients = []
    try:
        for _ in range(3):
            client = socket.create_connection((host, int(port)), timeout=30)
            clients.append(client)
            client.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert client.recv(4096).startswith(b"HTTP/1.1 200")  # (answered: it is open)
        with caplog.at_level(logging.INFO, logger="duetime.server"):
            stop_server(running, thread)
    finally:
        for client in clients:
            client.close()
    lines = [r.getMessage() for r in caplog.records if "connections were open" in r.getMessage()]
    assert lines == ["stopped; 3 HTTP connections were open"]
