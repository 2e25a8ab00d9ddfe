"""The HTTP front end on a real engine, its connections fed in memory by the test.

1. A request that fails after it was queued leaves no reference cycle behind. Raising the
   exception a future holds ties it into a cycle (its traceback's frames hold the future); the
   cyclic collector then frees the request's frames, arrays and connection slot in one pause.
   Under overload thousands of requests a second fail this way: the pauses grew to 30-70 ms and
   the event loop missed every due time meanwhile (engine.py `Ticket.failure`).
2. A request's timeout counts from the start of the loop turn that read it (frontend/arrival.py).
"""

from __future__ import annotations

import asyncio
import gc
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np
import pytest

from duetime.config import ServerSettings
from duetime.engine import Ticket
from duetime.errors import DeadlineExceeded, Overloaded
from duetime.frontend.http import HttpConnection
from duetime.server import Server
from duetime.tools.payloads import PayloadSpec, http_request_bytes


@contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Transport:
    """What HttpConnection writes to, kept in memory."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def close(self) -> None: ...


def test_a_raised_failure_is_a_copy_and_makes_no_cycle() -> None:
    async def body() -> None:
        ticket = Ticket("m", "1", ("y",))
        ticket.future = asyncio.get_running_loop().create_future()
        held = Overloaded("queue full", retry_after_s=0.25)
        ticket.future.set_exception(held)
        copy = ticket.failure()
        assert isinstance(copy, Overloaded)
        assert copy is not held
        assert (copy.message, copy.retry_after_s) == ("queue full", 0.25)
        with collector_off():
            with suppress(Overloaded):
                ticket.response()
            del ticket
            assert gc.collect() == 0

    asyncio.run(body())


@pytest.fixture(scope="module")
def mlp_repo(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mlp-only")
    shutil.copytree(demo_repo / "mlp", root / "mlp")
    # inline: a batch forms on the loop's next turn, which the tests hold back
    with (root / "mlp" / "config.toml").open("a") as config:
        config.write('\nexecution = "inline"\n')
    return root


def test_requests_that_expire_in_the_queue_leave_no_cycle(mlp_repo: Path) -> None:
    settings = ServerSettings(
        model_repository=mlp_repo, http_port=0, grpc_port=0, metrics=False,
        tune_runtime=False, cpus="none",
    )  # fmt: skip
    x = np.ones((1, 40), np.float32)
    spec = PayloadSpec("http-binary", "mlp", 1, None, "127.0.0.1", 1)
    due_in_5ms = http_request_bytes(spec, {"x": x}, {"timeout": 5_000}, binary=True)

    async def body() -> None:
        server = Server(settings)
        await server.start()
        engine = server.engine
        try:
            connection = HttpConnection(server._rest, settings, server._connections)
            transport = Transport()
            connection.connection_made(transport)  # type: ignore[arg-type]
            with collector_off():
                for _ in range(20):
                    # admitted, then the loop is held past its due time before the batch forms
                    connection.data_received(due_in_5ms)
                    time.sleep(0.01)  # noqa: ASYNC251 - the loop is held before the batch forms
                    call = asyncio.ensure_future(engine.infer_async("mlp", {"x": x}, timeout=0.005))
                    # ...and held again once the call has queued its request
                    asyncio.get_running_loop().call_soon(time.sleep, 0.01)
                    await asyncio.wait([call])
                    assert isinstance(call.exception(), DeadlineExceeded)
                    del call
                assert len(transport.written) == 20  # each answered as its batch failed
                assert all(b" 504 " in answer.split(b"\r\n")[0] for answer in transport.written)
                assert gc.collect() == 0
            connection.connection_lost(None)
        finally:
            await server.stop()

    asyncio.run(body())


def test_a_timeout_counts_from_the_start_of_the_turn_that_read_the_request(
    mlp_repo: Path,
) -> None:
    settings = ServerSettings(
        model_repository=mlp_repo, http_port=0, grpc_port=0, metrics=False,
        tune_runtime=False, cpus="none",
    )  # fmt: skip
    x = np.ones((1, 40), np.float32)
    spec = PayloadSpec("http-binary", "mlp", 1, None, "127.0.0.1", 1)
    due_in_5ms = http_request_bytes(spec, {"x": x}, {"timeout": 5_000}, binary=True)

    async def body() -> None:
        server = Server(settings)
        await server.start()
        try:
            first, second = Transport(), Transport()
            connections = [
                HttpConnection(server._rest, settings, server._connections) for _ in range(2)
            ]
            connections[0].connection_made(first)  # type: ignore[arg-type]
            connections[1].connection_made(second)  # type: ignore[arg-type]
            # one turn reads both connections; the first read took 10 ms of it
            connections[0].data_received(due_in_5ms)
            time.sleep(0.01)  # noqa: ASYNC251 - the loop is busy on purpose
            connections[1].data_received(due_in_5ms)
            await asyncio.sleep(0.05)
            assert second.written[0].startswith(b"HTTP/1.1 504 ")
            assert b"before it reached the scheduler" in second.written[0]
            # in a turn of its own the same request is answered
            connections[1].data_received(due_in_5ms)
            await asyncio.sleep(0.05)
            assert second.written[1].startswith(b"HTTP/1.1 200 ")
            for connection in connections:
                connection.connection_lost(None)
        finally:
            await server.stop()

    asyncio.run(body())
