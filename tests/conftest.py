"""Shared fixtures: the demo repository, a real server on ephemeral ports in a thread, and the
models a test loads by hand (closed after it)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import importlib
import logging
import shutil
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from duetime.config import ServerSettings
from duetime.demo import write_demo_repository
from duetime.loops import new_event_loop
from duetime.repository.loader import LoadedModel
from duetime.server import Addresses, Server


@pytest.fixture
def loaded() -> Iterator[list[LoadedModel]]:
    """Collects the models a test loads (`load_version`) and closes their executors after it."""
    models: list[LoadedModel] = []
    yield models
    for model in models:
        model.executor.close()


BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_module(name: str) -> Any:
    """The module bench/`name`.py (bench/ is no package: its scripts import each other by
    name)."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="session")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_repository(tmp_path_factory.mktemp("demo"))


def demo_models(demo_repo: Path, root: Path, *names: str) -> Path:
    """A repository at `root` holding only the demo models `names` (copied from `demo_repo`)."""
    for name in names:
        shutil.copytree(demo_repo / name, root / name)
    return root


@pytest.fixture(scope="session")
def mlp_repo(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Only the demo mlp: loads in ~0.5 s where the whole demo takes ~5 s (not to be changed)."""
    return demo_models(demo_repo, tmp_path_factory.mktemp("demo-mlp"), "mlp")


@pytest.fixture(scope="session")
def mlp_resnet_repo(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Only the demo mlp and resnet (no order-book models), for tests of those two."""
    return demo_models(demo_repo, tmp_path_factory.mktemp("demo-mlp-resnet"), "mlp", "resnet")


@dataclass
class RunningServer:
    """A server running on its own loop thread; `http` and `grpc` are host:port strings."""

    server: Server
    addresses: Addresses
    loop: asyncio.AbstractEventLoop

    @property
    def http(self) -> str:
        return f"{self.addresses.host}:{self.addresses.http_port}"

    @property
    def grpc(self) -> str:
        return f"{self.addresses.host}:{self.addresses.grpc_port}"

    def statistics(self, model: str, version: str = "1") -> Any:
        """The scheduler statistics of `model`'s `version` (its primary variant), read now."""
        served = self.server.engine.registry.snapshot.models[model]
        return served.versions[version].primary.scheduler.statistics()

    def samples(self, name: str, *labels: str) -> dict[tuple[str, ...], float]:
        """The samples named `name` its metrics port serves now, by the values of `labels`."""
        port = self.addresses.metrics_port
        url = f"http://127.0.0.1:{port}/metrics"
        text = urllib.request.urlopen(url, timeout=30).read().decode()
        return {
            tuple(sample.labels[label] for label in labels): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        }


def start_server(
    settings: ServerSettings, **options: Any
) -> tuple[RunningServer, threading.Thread]:
    """Start a Server on a private loop thread; returns once it listens (a handshake, no sleep).
    `options` go to `Server` (e.g. `tracing`)."""
    # gc.freeze() and GC thresholds would reach into the whole pytest process.
    settings = settings.model_copy(update={"tune_runtime": False})
    if "metrics_port" not in settings.model_fields_set:
        settings = settings.model_copy(update={"metrics_port": 0})  # never the shared 8002
    loop = new_event_loop()
    server = Server(settings, **options)
    started: concurrent.futures.Future[Addresses] = concurrent.futures.Future()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            started.set_result(loop.run_until_complete(server.start()))
        except BaseException as exc:
            started.set_exception(exc)
            return
        loop.run_forever()

    thread = threading.Thread(target=run, name="test-server", daemon=True)
    thread.start()
    return RunningServer(server, started.result(timeout=120), loop), thread


def stop_server(running: RunningServer, thread: threading.Thread) -> None:
    asyncio.run_coroutine_threadsafe(running.server.stop(), running.loop).result(timeout=60)
    running.loop.call_soon_threadsafe(running.loop.stop)
    thread.join(timeout=60)
    running.loop.close()


def read_answers(stream: Any, count: int) -> list[tuple[int, bytes]]:
    """The status and body of the next `count` answers read from `stream` (a binary file)."""
    got = []
    for _ in range(count):
        status = int(stream.readline().split()[1])
        length = 0
        while (line := stream.readline()) != b"\r\n":
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        got.append((status, stream.read(length)))
    return got


def on_loop(running: RunningServer, call: Callable[[], Any]) -> Any:
    """`call()`'s result, run on the server's loop (where its state lives)."""

    async def run() -> Any:
        return call()

    return asyncio.run_coroutine_threadsafe(run(), running.loop).result(timeout=10)


@contextlib.contextmanager
def shedder_refusing(running: RunningServer) -> Iterator[None]:
    """The server's load shedder at a share that refuses every request it may while the block
    runs (its sampling stopped, so the share stays); it still spares a model with capacity
    idle (`Engine.has_idle_capacity`)."""
    shedder = running.server.shedder
    assert shedder is not None

    def hold() -> Any:
        sample = shedder.sample
        shedder.sample = lambda *args, **kwargs: None  # type: ignore[method-assign]
        shedder.share = 1.0
        return sample

    sample = on_loop(running, hold)
    try:
        yield
    finally:

        def restore() -> None:
            shedder.sample = sample  # type: ignore[method-assign]
            shedder.share = 0.0

        on_loop(running, restore)


@contextlib.contextmanager
def serving(settings: ServerSettings, **options: Any) -> Iterator[RunningServer]:
    """`start_server(settings, **options)` for the block, stopped at its end."""
    running, thread = start_server(settings, **options)
    try:
        yield running
    finally:
        stop_server(running, thread)


@contextlib.contextmanager
def tight_tile_server(repo: Path) -> Iterator[RunningServer]:
    """A server of `repo` with model tile (400 KB of answer a row: repo_models.wide_tile_model)
    whose big answers not yet read are bounded to 1 MiB."""
    from repo_models import wide_tile_model, write_version

    write_version(repo, "tile", 1, wide_tile_model())
    (repo / "tile" / "config.toml").write_text("[breaker]\nslow_min_us = 60000000\n")
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, max_unsent_answer_bytes=1 << 20
    )
    with serving(settings) as running:
        yield running


@contextlib.contextmanager
def recording_server(repository: Path, capture: Path) -> Iterator[RunningServer]:
    """A server of `repository` that records every request, with outputs, to `capture`; the
    capture is complete once the block ends."""
    settings = ServerSettings(
        model_repository=repository, http_port=0, grpc_port=0, record_path=capture,
        record_outputs=True,
    )  # fmt: skip
    with serving(settings) as running:
        yield running


@contextlib.contextmanager
def explicit_serving(repository: Path, *load: str) -> Iterator[RunningServer]:
    """A server of `repository` in explicit control mode (the repository API loads and
    unloads), with the models `load` loaded at start."""
    settings = ServerSettings(
        model_repository=repository, http_port=0, grpc_port=0, model_control_mode="explicit",
        load_model=load,
    )  # fmt: skip
    with serving(settings) as running:
        yield running


@pytest.fixture(scope="session")
def server(demo_repo: Path) -> Iterator[RunningServer]:
    """The demo models served over HTTP and gRPC on ports picked by the OS."""
    settings = ServerSettings(
        model_repository=demo_repo,
        http_port=0,
        grpc_port=0,
        max_body_bytes=8 * 1024 * 1024,
    )
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """The cyclic collector off (the servers of these tests run in the test's process): what
    a request leaves in a reference cycle stays, and can be counted."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put the root logger's handlers and level back after a test that configures logging."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.fixture
def evict_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model may be unloaded to make room as soon as nothing is queued or running for it (not
    only after `EVICT_QUIET_S` without a request): for tests of what the budget unloads."""
    from duetime.repository import manager

    monkeypatch.setattr(manager, "EVICT_QUIET_S", 0.0)
