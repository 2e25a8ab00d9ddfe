"""The metrics port as an HTTP server: only /metrics (and /metrics/) serves the metrics, as
Triton's; `?name[]=` filters duetime's families too; HEAD is GET without the body; a silent
connection is closed after a read timeout, and connections beyond a bound are closed at once.
Before: any path served the metrics, the filter answered an empty body for every duetime and
nv_* family (the collector had no describe()), HEAD was 405, and 300 silent connections held
300 threads for good."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.client
import select
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from test_triton_accounting import harness

from duetime.observability import exporter as exporter_module
from duetime.observability.exporter import MetricsExporter
from duetime.observability.metrics import CaptureCollector

pytestmark = pytest.mark.timeout(60)


class _Model:
    """What the collector reads of a loaded model (weakly referenced)."""

    name, version = "m", "1"
    path = SimpleNamespace(stat=lambda: SimpleNamespace(st_size=10))
    config = SimpleNamespace(instances=1)


def fake_engine() -> SimpleNamespace:
    """One deployment, model 'm' version 1 (see test_triton_accounting); on a running loop."""
    scheduler = harness().scheduler
    deployment = SimpleNamespace(model=_Model(), variant="default", scheduler=scheduler)
    snapshot = SimpleNamespace(
        deployments=lambda: [deployment],
        draining_only=list,
        statistics=lambda d: d.scheduler.statistics(),
    )
    return SimpleNamespace(
        registry=SimpleNamespace(snapshot=snapshot),
        router=SimpleNamespace(invalid={}, shadows={}),
    )


@pytest.fixture
def port() -> Iterator[int]:
    """A MetricsExporter listening on 127.0.0.1, on a loop thread of its own."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def on_loop(coroutine: object) -> object:
        future: concurrent.futures.Future[object] = asyncio.run_coroutine_threadsafe(
            coroutine,  # type: ignore[arg-type]
            loop,
        )
        return future.result(timeout=30)

    exporter = on_loop(_make())
    try:
        yield on_loop(exporter.start("127.0.0.1", 0))  # type: ignore[attr-defined,misc]
    finally:
        on_loop(exporter.aclose())  # type: ignore[attr-defined]
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


async def _make() -> MetricsExporter:
    return MetricsExporter(fake_engine())  # type: ignore[arg-type]


def get(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def test_only_the_metrics_path_serves_the_metrics(port: int) -> None:
    for path in ("/metrics", "/metrics/"):
        status, body = get(port, path)
        assert status == 200
        assert b'nv_inference_request_success{model="m",version="1"} 0' in body
    for path in ("/", "/foo", "/metrics/x", "/v2/models"):
        status, body = get(port, path)
        assert status == 400
        assert b"nv_inference" not in body


def test_the_name_filter_keeps_the_families_asked_for(port: int) -> None:
    status, body = get(port, "/metrics?name[]=nv_inference_count&name[]=duetime_requests_total")
    assert status == 200
    assert b'nv_inference_count{model="m",version="1"} 0' in body
    assert b'duetime_requests_total{model="m",outcome="success"' in body
    assert b"duetime_queue_depth" not in body
    assert b"nv_inference_request_success" not in body


def test_head_is_get_without_the_body(port: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("HEAD", "/metrics")
        answer = connection.getresponse()
        assert answer.status == 200
        assert int(answer.headers["Content-Length"]) > 0
        assert answer.read() == b""
    finally:
        connection.close()


def test_a_silent_connection_is_closed(monkeypatch: pytest.MonkeyPatch, port: int) -> None:
    monkeypatch.setattr(exporter_module, "READ_TIMEOUT_S", 0.2)
    with socket.create_connection(("127.0.0.1", port)) as silent:
        silent.settimeout(30)  # (a guard: the server closes it well before)
        assert silent.recv(1) == b""


def test_connections_beyond_the_bound_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every connection being answered (none still sending its head), one more is closed
    at once."""
    monkeypatch.setattr(exporter_module, "MAX_CONNECTIONS", 2)
    monkeypatch.setattr(exporter_module, "READ_TIMEOUT_S", 30.0)
    collecting = threading.Semaphore(0)
    release = threading.Event()

    class Held:
        """A collector whose scrapes wait for `release`."""

        def describe(self) -> list[object]:
            return []

        def collect(self) -> Iterator[object]:
            collecting.release()
            release.wait(30)
            yield from ()

    def held_and_refused(port: int, server: Any) -> None:
        def both_answered() -> bool:  # (each head read: one renders, one waits for its turn)
            with server._lock:
                return len(server._held) == 2 and not server._reading

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            scrapes = [pool.submit(get, port, "/metrics") for _ in range(2)]
            try:
                assert collecting.acquire(timeout=20)
                deadline = time.monotonic() + 20
                while not both_answered():
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                with socket.create_connection(("127.0.0.1", port)) as third:
                    third.settimeout(20)  # (held, it would wait for the read timeout: 30 s)
                    with contextlib.suppress(ConnectionResetError):  # (a reset is as good)
                        assert third.recv(1) == b""
            finally:
                release.set()
            assert [scrape.result(timeout=30)[0] for scrape in scrapes] == [200, 200]

    async def body() -> None:
        exporter = MetricsExporter(fake_engine())  # type: ignore[arg-type]
        exporter.registry.register(Held())  # type: ignore[arg-type]
        port = await exporter.start("127.0.0.1", 0)
        try:
            await asyncio.to_thread(held_and_refused, port, exporter._server)
        finally:
            await exporter.aclose()

    asyncio.run(body())


def test_at_the_bound_the_connection_sending_its_head_longest_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NOTE: a connection past the bound was closed however long the others had been sending
    their heads: connections that each sent a header line every 2 s held every slot, and every
    scrape was closed unanswered (found by a tester). The scrape now closes the one sending its
    head longest, and is answered."""
    monkeypatch.setattr(exporter_module, "MAX_CONNECTIONS", 2)
    monkeypatch.setattr(exporter_module, "READ_TIMEOUT_S", 30.0)

    def scraped_past_trickles(port: int) -> None:
        trickles = []
        try:
            for _ in range(2):
                trickle = socket.create_connection(("127.0.0.1", port), timeout=20)
                trickle.sendall(b"GET /metrics HTTP/1.1\r\nX-A: b\r\n")  # (and no end)
                trickles.append(trickle)
                time.sleep(0.2)  # (the first is the older by far)
            status, body = get(port, "/metrics")
            assert status == 200
            assert b"nv_inference_request_success" in body
            oldest, younger = trickles
            with contextlib.suppress(ConnectionResetError):  # (a reset is as good)
                assert oldest.recv(1) == b""
            younger.sendall(b"X-A: b\r\n")
            assert select.select([younger], [], [], 0.5)[0] == []  # (still open, unanswered)
        finally:
            for trickle in trickles:
                trickle.close()

    async def body() -> None:
        exporter = MetricsExporter(fake_engine())  # type: ignore[arg-type]
        port = await exporter.start("127.0.0.1", 0)
        try:
            await asyncio.to_thread(scraped_past_trickles, port)
        finally:
            await exporter.aclose()

    asyncio.run(body())


def test_a_request_head_trickled_in_is_closed_after_the_read_timeout(
    monkeypatch: pytest.MonkeyPatch, port: int
) -> None:
    """NOTE: the read timeout was each read's: a header line every 2 s (5 s each) kept a slot
    for good (found by a tester). The whole head must come within it of the accept."""
    monkeypatch.setattr(exporter_module, "READ_TIMEOUT_S", 1.0)
    with socket.create_connection(("127.0.0.1", port), timeout=20) as trickle:
        trickle.sendall(b"GET /metrics HTTP/1.1\r\n")
        started = time.monotonic()
        closed = False
        while not closed and time.monotonic() - started < 10:
            if select.select([trickle], [], [], 0.3)[0]:  # (a line every 0.3 s otherwise)
                with contextlib.suppress(ConnectionResetError):  # (a reset is as good)
                    assert trickle.recv(1) == b""  # (nothing answered: the head never ended)
                closed = True
            else:
                try:
                    trickle.sendall(b"X-A: b\r\n")
                except OSError:  # (closed meanwhile)
                    closed = True
        took = time.monotonic() - started
    assert closed
    assert took < 6  # (1 s, checked every POLL_S; trickling on for the 10 s before)


def test_every_collector_describes_its_families() -> None:
    recorder = SimpleNamespace(
        statistics=lambda: SimpleNamespace(written=1, dropped=0, failed=0, buffered=0)
    )
    names = [m.name for m in CaptureCollector(recorder).describe()]  # type: ignore[arg-type]
    assert names == ["duetime_capture_records", "duetime_capture_buffered"]


def test_connections_wait_in_the_listen_backlog_while_the_server_is_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """socketserver's backlog of 5 dropped the connection attempts of 10 scrapers at once: each
    waited a second for its SYN to be sent again (found by a tester). While the server thread
    is held after one accept, 40 more connections still complete their handshakes at once."""
    held, release = threading.Event(), threading.Event()
    process = exporter_module._MetricsServer.process_request

    def holding(self: Any, request: Any, client_address: Any) -> None:
        held.set()
        release.wait(30)
        process(self, request, client_address)

    monkeypatch.setattr(exporter_module._MetricsServer, "process_request", holding)

    def connect_all(port: int) -> list[bool]:
        first = socket.create_connection(("127.0.0.1", port), timeout=10)
        sockets = [first]
        try:
            assert held.wait(10)
            opened = []
            for _ in range(40):
                try:
                    sockets.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))
                    opened.append(True)
                except OSError:
                    opened.append(False)
            return opened
        finally:
            release.set()
            for each in sockets:
                each.close()

    async def body() -> list[bool]:
        exporter = MetricsExporter(fake_engine())  # type: ignore[arg-type]
        port = await exporter.start("127.0.0.1", 0)
        try:
            return await asyncio.to_thread(connect_all, port)
        finally:
            await exporter.aclose()

    assert all(asyncio.run(body()))
