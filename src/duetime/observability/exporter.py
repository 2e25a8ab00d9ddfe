"""MetricsExporter: serves `/metrics` on a port of its own, from threads of its own.

A scrape is answered by prometheus_client's WSGI app on a small threaded HTTP server, so it
never waits for the event loop and the loop never formats a metric; the collector only reads
snapshots. Binding, and shutting the server down (which waits up to its poll interval), run in a
worker thread too, so the loop is not held up either.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import re
import socket
import threading
import time
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector

from duetime.errors import ConfigError
from duetime.execution.affinity import pin_current_thread
from duetime.frontend.http import host_refusal
from duetime.observability.gc_pauses import GcPauses
from duetime.observability.metrics import MetricsCollector, metrics_app

if TYPE_CHECKING:
    from duetime.engine import Engine
    from duetime.overload import LoadShedder

POLL_S = 0.5
"""How often the server thread checks for shutdown between connections (socketserver's own
default); `aclose` waits at most this long for it."""

READ_TIMEOUT_S = 5.0
"""How long a connection may take to send its whole request head, from its accept, and wait
silent (a scraper not reading the answer), before it is closed."""

MAX_CONNECTIONS = 32
"""Connections served at once (a thread each). One more closes the one that has been sending
its request head longest, or, with none, is closed at once. A few scrapers need a few."""


class MetricsExporter:
    """`/metrics` for an engine (and the load shedder, if any), plus GC pause timing.

    `start` binds and starts the server thread (raising ConfigError if the port cannot be had)
    and installs the GC callbacks; `aclose` removes them and stops the thread.
    """

    def __init__(self, engine: Engine, shedder: LoadShedder | None = None) -> None:
        self.gc_pauses = GcPauses()
        self.registry = CollectorRegistry()
        self.registry.register(MetricsCollector(engine, shedder, self.gc_pauses))
        # The process's CPU time and resident memory, and the collector's own counts.
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    async def start(self, host: str, port: int, cpus: frozenset[int] | None = None) -> int:
        """Listen on `host`:`port` (0 picks a free port); returns the port. The server's threads
        run on `cpus` (None: wherever they may), best kept off the event loop's."""
        server = await asyncio.to_thread(_bind, host, port, metrics_app(self.registry))
        self._server = server
        self._thread = threading.Thread(
            target=_serve, args=(server, cpus), name="duetime-metrics", daemon=True
        )
        self._thread.start()
        self.gc_pauses.install()
        return int(server.server_port)

    async def aclose(self) -> None:
        self.gc_pauses.uninstall()
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None and thread is not None:
            await asyncio.to_thread(_shut_down, server, thread)


class _QuietHandler(WSGIRequestHandler):
    protocol_version = "HTTP/1.1"
    """The version of the status line of the answers http.server writes itself: its refusals
    (400, 414, 431, 505, with `Connection: close`) and 100 Continue. (A scrape's answer is
    wsgiref's, HTTP/1.0: one request a connection.)"""

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        server = self.server
        assert isinstance(server, _MetricsServer)
        if not (server.head_read(self.connection) and parsed):  # (not answered if it was cut)
            return False
        if self.request_version not in _VERSIONS:  # (HTTP/0.9, with no version; HTTP/1.2)
            self.send_error(
                505, explain=f"{self.request_version} is not supported here; send HTTP/1.1"
            )
            return False
        # NOTE: the Host checks were the inference port's alone: a request with none, two, or
        # one that is no host[:port] was served (found by a tester; RFC 9112 3.2: 400)
        hosts = self.headers.get_all("Host", [])
        refusal = host_refusal(hosts[0] if hosts else None, self.request_version == "HTTP/1.0")
        if len(hosts) > 1:
            refusal = "header 'host' is sent more than once; send it once"
        if refusal is not None:
            self.send_error(400, explain=refusal)
            return False
        absolute = _ABSOLUTE_FORM.match(self.path)
        if absolute is not None:
            # NOTE: refused as a path not served, "the metrics are at /metrics" (found by a
            # tester); RFC 9112 3.2.2: a server must take the absolute-form, as the inference
            # port does
            rest = self.path[absolute.end() :]
            self.path = rest if rest.startswith("/") else f"/{rest}"
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # NOTE: http.server refuses HTTP/2.0 (505), or a version that is no version (400),
        # before it takes the request's version, and so answers as to HTTP/0.9: an HTML page
        # with no status line and no headers, garbage to an HTTP client (found by a tester)
        if self.request_version == "HTTP/0.9":
            self.request_version = self.protocol_version
        super().send_error(code, message, explain)

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:  # (timed out, or the client went: nothing to answer, nothing to say)
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds are not news."""


_VERSIONS = ("HTTP/1.0", "HTTP/1.1")
_ABSOLUTE_FORM = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^/?#]*")
"""The scheme and authority of an absolute-form request target (RFC 9112 3.2.2)."""


class _MetricsServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most `MAX_CONNECTIONS` of them; a connection's request head
    must all come within READ_TIMEOUT_S of its accept.

    NOTE: neither bounded nor timed out, 300 silent connections held 300 threads (and
    descriptors) for good (found by a tester).

    NOTE: the read timeout was a socket's, for each read: 32 connections that each sent a
    header line every 2 s held every slot for good, and every scrape was closed unanswered
    (found by a tester). The head is now timed as a whole (`service_actions`, every POLL_S), and
    at the bound a new connection closes the one that has been sending its head longest."""

    daemon_threads = True
    request_queue_size = 128
    """The listen backlog. NOTE: socketserver's default, 5, dropped connection attempts of 10
    scrapers at once, well under `MAX_CONNECTIONS`: each waited a second for its SYN to be sent
    again (found by a tester)."""

    def server_activate(self) -> None:
        super().server_activate()
        self._lock = threading.Lock()
        self._held: set[socket.socket] = set()
        """Connections served (each holds a slot)."""
        self._reading: dict[socket.socket, float] = {}
        """Connections served whose request head has not all come -> when each was accepted
        (monotonic); in that order."""

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            full = len(self._held) >= MAX_CONNECTIONS
            if full and self._reading:
                self._cut(next(iter(self._reading)))  # (its slot is this one's)
                full = False
            if not full:
                self._held.add(request)
                self._reading[request] = time.monotonic()
        if full:
            self.shutdown_request(request)
            return
        request.settimeout(READ_TIMEOUT_S)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._leave(request)
            raise

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            super().finish_request(request, client_address)
        finally:
            self._leave(request)  # (before its socket is closed: `_cut` shuts only those held)

    def head_read(self, request: socket.socket) -> bool:
        """`request`'s head has all come (or was cut short): False where it was cut."""
        with self._lock:
            return self._reading.pop(request, None) is not None

    def service_actions(self) -> None:
        """Cut the connections whose head has not all come within READ_TIMEOUT_S."""
        since = time.monotonic() - READ_TIMEOUT_S
        with self._lock:
            for request in [r for r, at in self._reading.items() if at <= since]:
                self._cut(request)

    def _leave(self, request: socket.socket) -> None:
        with self._lock:
            self._reading.pop(request, None)
            self._held.discard(request)

    def _cut(self, request: socket.socket) -> None:
        """(With the lock held.) End `request`'s read: its thread sees the end and answers
        nothing; its slot is free at once."""
        del self._reading[request]
        self._held.discard(request)
        with contextlib.suppress(OSError):  # (its client went meanwhile)
            request.shutdown(socket.SHUT_RDWR)


def _bind(host: str, port: int, app: Any) -> WSGIServer:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        server_class = type("MetricsServer", (_MetricsServer,), {"address_family": family[0][0]})
        return make_server(host, port, app, server_class, handler_class=_QuietHandler)
    except OSError as exc:
        where = f"{host}:{port}: {exc.strerror or exc}"
        if exc.errno != errno.EADDRINUSE:  # (not an address here, or a name that resolves to none)
            raise ConfigError(
                f"server settings: field 'host': cannot listen on {where}; pass --host with an "
                "address of this host (127.0.0.1, 0.0.0.0 or :: for every one)"
            ) from exc
        raise ConfigError(
            f"metrics endpoint: cannot listen on {where}; pass --metrics-port with a free port "
            "(0 picks one), or --no-metrics"
        ) from exc


def port_taken(error: ConfigError) -> bool:
    """Whether `error` (from `MetricsExporter.start`) says the port is taken, not the host
    unusable."""
    cause = error.__cause__
    return isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE


def _serve(server: WSGIServer, cpus: frozenset[int] | None) -> None:
    pin_current_thread(cpus)  # the threads answering scrapes start from this one and inherit it
    server.serve_forever(POLL_S)


def _shut_down(server: WSGIServer, thread: threading.Thread) -> None:
    server.shutdown()
    server.server_close()
    thread.join()
