"""Helpers the fuzz tests share: example counts, and raw HTTP clients of live servers."""

from __future__ import annotations

import os
import socket

EXAMPLES_VARIABLE = "DUETIME_FUZZ_EXAMPLES"


def _long_run() -> int:
    value = os.environ.get(EXAMPLES_VARIABLE, "")
    return int(value) if value.isdigit() else 0


def examples(default: int) -> int:
    """Hypothesis examples per test: `default` in CI, or DUETIME_FUZZ_EXAMPLES for a long run."""
    return _long_run() or default


TIMEOUT_S = 120 if not _long_run() else 6 * 3600
"""Per test: a hang fails CI within two minutes; a long run gets hours."""


def http_request(method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: fuzz"]
    if body:
        headers.setdefault("Content-Length", str(len(body)))
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of one response on `sock` (Content-Length framed), or EOFError."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError(f"closed after {data[:100]!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise EOFError("closed inside a body")
        rest += chunk
    return int(head[9:12]), rest[:length]
