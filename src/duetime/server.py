"""Server: the composition root. Builds the engine and front ends, starts and stops them in order."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from duetime.config import ServerSettings
from duetime.engine import Engine
from duetime.errors import ConfigError
from duetime.frontend.grpc import InferenceService, serve_grpc
from duetime.frontend.http import HttpConnection, serve_http
from duetime.frontend.rest import RestApi

log = logging.getLogger("duetime.server")


@dataclass(frozen=True, slots=True)
class Addresses:
    """Where a started server listens."""

    host: str
    http_port: int
    grpc_port: int

    def describe(self) -> str:
        return f"duetime ready: http://{self.host}:{self.http_port} grpc://{self.host}:{self.grpc_port}"


class Server:
    """One duetime process: the engine with its models, the HTTP and the gRPC front ends."""

    def __init__(self, settings: ServerSettings, engine: Engine | None = None) -> None:
        self.settings = settings
        self.engine = engine or Engine()
        self._rest = RestApi(self.engine, settings)
        self._grpc_service = InferenceService(self.engine)
        self._connections: set[HttpConnection] = set()
        self._http: asyncio.Server | None = None
        self._grpc: Any = None
        self.addresses: Addresses | None = None

    async def start(self) -> Addresses:
        """Load the repository, then listen; returns once both front ends accept connections."""
        repository = self.settings.model_repository
        if repository is None:
            raise ConfigError("no model repository given: pass a folder, or --demo")
        if self.engine.repository is None:
            await self.engine.load_repository(repository)
        self._http = await serve_http(self._rest, self.settings, self._connections)
        self._grpc, grpc_port = await serve_grpc(self._grpc_service, self.settings)
        http_port = self._http.sockets[0].getsockname()[1]
        self.addresses = Addresses(self.settings.host, http_port, grpc_port)
        return self.addresses

    async def stop(self) -> None:
        """Stop accepting, report not-ready, drain queued work, close connections and models."""
        grace = self.settings.shutdown_grace_s
        self._rest.accepting = False
        self._grpc_service.accepting = False
        if self._http is not None:
            self._http.close()
        grpc_stopped = self._grpc.stop(grace) if self._grpc is not None else None
        await self.engine.aclose(grace)
        for connection in list(self._connections):
            connection.shutdown()
        if grpc_stopped is not None:
            await grpc_stopped
        if self._http is not None:
            await self._http.wait_closed()
        log.info("stopped; %d HTTP connections were open", len(self._connections))
