"""Engine: the in-process API every front end is built on, usable directly from Python.

Async code uses `await Engine.start(repo)` and `await engine.infer_async(...)` on its own loop.
Synchronous code uses `Engine.open(repo)`, which runs the engine's loop on a private thread, and
`engine.infer(...)` from any other thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import numpy as np

from duetime.clock import Clock, MonotonicClock
from duetime.errors import ConfigError
from duetime.execution.affinity import CpuPlan
from duetime.execution.executor import Feeds
from duetime.repository.layout import ModelSource, scan_repository
from duetime.repository.loader import LoadedModel, load_version
from duetime.repository.registry import Deployment, Registry
from duetime.scheduling.scheduler import ModelScheduler
from duetime.types import InferRequest, InferResponse

log = logging.getLogger("duetime.engine")


@dataclass(slots=True, eq=False)
class Ticket:
    """A submitted request: which version took it, the outputs wanted, and its pending result."""

    model: str
    version: str
    outputs: tuple[str, ...]
    future: asyncio.Future[Feeds] = field(init=False)
    on_done: Callable[[], None] | None = None
    """Set by a front end before control returns to the loop: called once the future settles
    (not on cancellation), a loop turn sooner than a future callback."""

    def _settled(self) -> None:
        if self.on_done is not None:
            self.on_done()

    def response(self, request_id: str = "") -> InferResponse:
        """The response once `future` is done (raises the request's error if it failed)."""
        produced = self.future.result()
        outputs = {name: produced[name] for name in self.outputs}
        return InferResponse(self.model, self.version, request_id, outputs)


class Engine:
    """Models loaded from a repository, each behind its scheduler; the one way to run inference."""

    def __init__(self, *, clock: Clock | None = None, cpus: CpuPlan | None = None) -> None:
        self.clock: Clock = clock or MonotonicClock()
        self.cpus = cpus or CpuPlan(None)
        self.registry = Registry()
        self.repository: Path | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._placed = 0

    # -- lifecycle -----------------------------------------------------------------------------

    @classmethod
    async def start(cls, repository: str | Path, *, clock: Clock | None = None) -> Engine:
        """An engine serving every model in `repository`, loaded on the running loop's behalf."""
        engine = cls(clock=clock)
        await engine.load_repository(Path(repository))
        return engine

    async def load_repository(self, root: Path) -> None:
        """Load the latest version of every model under `root`; failures are recorded, not fatal."""
        self._loop = asyncio.get_running_loop()
        self.repository = root
        scan = scan_repository(root)
        for name, reason in scan.errors.items():
            log.error("model %s not loaded: %s", name, reason)
            self.registry.record_failure(name, reason)
        for source in scan.models:
            await self.load_model(source, source.latest)

    async def load_model(self, source: ModelSource, version: int) -> bool:
        """Load one version in a worker thread and publish it; False (and recorded) on failure."""
        try:
            loaded = await asyncio.to_thread(load_version, source, version)
        except ConfigError as exc:
            log.error("model %s version %d not loaded: %s", source.name, version, exc.message)
            self.registry.record_failure(source.name, exc.message)
            return False
        self.registry.publish(self._deploy(loaded))
        log.info("model %s version %s ready", loaded.name, loaded.version)
        return True

    def _deploy(self, loaded: LoadedModel) -> Deployment:
        loop = asyncio.get_running_loop()
        pins = self.cpus.for_instances(
            loaded.config.instances, loaded.profile.predict(1), offset=self._placed
        )
        self._placed += loaded.config.instances
        loaded.executor.start(loop, pins)
        timeout_ms = loaded.config.default_timeout_ms
        scheduler = ModelScheduler(
            executor=loaded.executor,
            config=loaded.config.scheduling,
            max_batch_size=loaded.signature.max_batch_size,
            profile=loaded.profile,
            default_timeout_ns=None if timeout_ms is None else int(timeout_ms * 1e6),
            clock=self.clock,
            label=f"'{loaded.name}' version {loaded.version}",
        )
        return Deployment(loaded, scheduler)

    async def aclose(self, grace_s: float = 5.0) -> None:
        """Stop serving: drain each scheduler for up to `grace_s`, then stop the instances."""
        deployments = self.registry.clear()
        await asyncio.gather(*(d.scheduler.aclose(grace_s) for d in deployments))
        for deployment in deployments:
            await asyncio.to_thread(deployment.model.executor.close)

    @property
    def ready(self) -> bool:
        return bool(self.registry.snapshot.models)

    # -- inference -----------------------------------------------------------------------------

    def submit(self, request: InferRequest) -> Ticket:
        """Validate and queue `request` on the loop; raise a DuetimeError if it cannot be queued."""
        deployment = self.registry.resolve(request.model, request.version)
        model = deployment.model
        prepared = model.validator.prepare(request.inputs, request.outputs)
        ticket = Ticket(model.name, model.version, prepared.outputs)
        ticket.future = deployment.scheduler.submit_nowait(
            prepared.feeds,
            rows=prepared.rows,
            shape_key=prepared.shape_key,
            due_ns=request.due_ns,
            priority=request.priority,
            on_done=ticket._settled,
        )
        return ticket

    async def infer_async(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | int | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - a due time for the server, not a wait
        priority: int = 0,
        outputs: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run `model` on `inputs`; `timeout` in seconds sets the request's due time."""
        ticket = self.submit(self._request(model, inputs, version, timeout, priority, outputs))
        try:
            await ticket.future
        except asyncio.CancelledError:
            ticket.future.cancel()
            raise
        return ticket.response().outputs

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | int | None = None,
        timeout: float | None = None,
        priority: int = 0,
        outputs: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Blocking `infer_async` for synchronous code; never call it on the engine's own loop."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the engine has no loop yet: use Engine.open() for synchronous use")
        if _running_loop() is loop:
            raise RuntimeError("Engine.infer blocks; on the engine's loop use await infer_async")
        request = self._request(model, inputs, version, timeout, priority, outputs)
        result: concurrent.futures.Future[dict[str, np.ndarray]] = concurrent.futures.Future()
        loop.call_soon_threadsafe(self._submit_for_thread, request, result)
        return result.result()

    def _submit_for_thread(
        self, request: InferRequest, result: concurrent.futures.Future[dict[str, np.ndarray]]
    ) -> None:
        try:
            ticket = self.submit(request)
        except Exception as exc:
            result.set_exception(exc)
            return

        def settle() -> None:
            try:
                result.set_result(ticket.response().outputs)
            except BaseException as exc:
                result.set_exception(exc)

        ticket.on_done = settle

    def _request(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        version: str | int | None,
        timeout: float | None,
        priority: int,
        outputs: Sequence[str] | None,
    ) -> InferRequest:
        due = None if timeout is None else self.clock.now_ns() + int(timeout * 1e9)
        return InferRequest(
            model=model,
            inputs=dict(inputs),
            version=None if version is None else str(version),
            outputs=None if outputs is None else tuple(outputs),
            due_ns=due,
            priority=priority,
        )

    # -- synchronous use -----------------------------------------------------------------------

    @classmethod
    def open(cls, repository: str | Path, *, clock: Clock | None = None) -> Engine:
        """An engine whose loop runs on a private thread, for synchronous callers; `close()` it."""
        engine = cls(clock=clock)
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        engine._thread = threading.Thread(
            target=engine._run_loop, args=(Path(repository), started), name="duetime-engine",
            daemon=True,
        )  # fmt: skip
        engine._thread.start()
        started.result()
        return engine

    def _run_loop(self, repository: Path, started: concurrent.futures.Future[None]) -> None:
        from duetime.loops import new_event_loop

        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self.load_repository(repository))
        except BaseException as exc:
            started.set_exception(exc)
            loop.close()
            return
        started.set_result(None)
        loop.run_forever()
        loop.run_until_complete(self.aclose())
        loop.close()

    def close(self) -> None:
        """Stop an engine made by `open()`: drain its models and end its loop thread."""
        if self._thread is None or self._loop is None:
            raise RuntimeError("close() is for engines made by Engine.open(); await aclose()")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._thread = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
