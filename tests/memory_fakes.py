"""Test doubles shared across test folders: an in-memory transport for `HttpConnection`, a
started server whose connections the test feeds in memory, and hand-moved clocks for
`LoadShedder`.

Imported as `from memory_fakes import ...` (pytest puts tests/ on `sys.path`, as for
`repo_models`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from duetime.config import ServerSettings
from duetime.frontend.http import HttpConnection
from duetime.server import Server


class Transport:
    """What HttpConnection writes to, kept in memory."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def writelines(self, pieces: list[bytes]) -> None:
        self.written.append(b"".join(pieces))

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0  # (its client reads everything at once)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def close(self) -> None: ...


class ShedderClocks:
    """Wall and CPU time a test moves by hand, and running totals of requests all missing."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0
        self.requests = 0

    def failing(self) -> tuple[int, int]:
        self.requests += 10
        return self.requests, self.requests

    def run(self, busy: float) -> None:
        self.wall += 0.01
        self.cpu += 0.01 * busy


class InMemoryServer:
    """A started server (`server`, `settings`) whose HTTP connections the test opens and feeds
    itself (`connect`); see `in_memory_server`."""

    def __init__(self, server: Server, settings: ServerSettings) -> None:
        self.server = server
        self.settings = settings
        self.opened: list[HttpConnection] = []

    def connect(
        self, transport: Transport | None = None, **options: Any
    ) -> tuple[HttpConnection, Transport]:
        """A connection made on `transport` (a new `Transport` by default); `options` go to
        `HttpConnection` (`shedder`: the server's by default, `intake`)."""
        options.setdefault("shedder", self.server.shedder)
        server = self.server
        connection = HttpConnection(server._rest, self.settings, server._connections, **options)
        transport = Transport() if transport is None else transport
        connection.connection_made(transport)  # type: ignore[arg-type]
        self.opened.append(connection)
        return connection, transport


@asynccontextmanager
async def in_memory_server(repository: Path, **overrides: Any) -> AsyncIterator[InMemoryServer]:
    """A server on `repository` (`overrides`: its other settings) with no metrics, runtime
    tuning or CPU plan, started; its connections are lost and it stops at the end."""
    settings = ServerSettings(
        model_repository=repository, http_port=0, grpc_port=0, metrics=False,
        tune_runtime=False, cpus="none", **overrides,
    )  # fmt: skip
    server = Server(settings)
    await server.start()
    served = InMemoryServer(server, settings)
    try:
        yield served
    finally:
        for connection in served.opened:
            connection.connection_lost(None)
        await server.stop()
