"""Engine: the in-process API every front end is built on, usable directly from Python.

Async code uses `await Engine.start(repo)` and `await engine.infer_async(...)` on its own loop.
Synchronous code uses `Engine.open(repo)`, which runs the engine's loop on a private thread, and
`engine.infer(...)` from any other thread.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import copy
import functools
import logging
import numbers
import os
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from duetime import classification
from duetime.classification import check_classifiable, top_classes
from duetime.clock import Clock, MonotonicClock
from duetime.config import ModelConfig
from duetime.datatypes import NUMPY_OF
from duetime.errors import (
    MODEL_CONTROL_OFF,
    TIMEOUT_EXPIRED,
    ConfigError,
    DeadlineExceeded,
    DuetimeError,
    InternalError,
    InvalidInput,
    ModelControlOff,
    ModelNotFound,
    ModelUnavailable,
    Overloaded,
)
from duetime.execution.affinity import SMALL_MODEL_NS, CpuPlan
from duetime.execution.executor import Feeds, Unreturned
from duetime.loops import in_thread
from duetime.repository.loader import LoadedModel, sample_inputs, sample_row_bytes
from duetime.repository.manager import IndexEntry, ModelManager, RepositoryOptions
from duetime.repository.registry import (
    PRIMARY,
    UNKNOWN_MODEL,
    Deployment,
    Registry,
    Snapshot,
    retry_after_s,
)
from duetime.repository.tritonconfig import read_model_config
from duetime.requestparams import (
    MAX_DUE_US,
    MAX_PRIORITY,
    check_http_parameters,
    check_parameter_count,
    check_scalar_parameters,
    due_from_timeout_us,
    priority_of,
)
from duetime.routing.router import Routed, Router
from duetime.scheduling.edf import QueuedRequest
from duetime.scheduling.ledger import CoreLedger
from duetime.scheduling.scheduler import ModelScheduler, batch_bytes_bound
from duetime.statistics import statistics_json
from duetime.types import InferRequest, InferResponse, model_words
from duetime.validation import c_ordered

if TYPE_CHECKING:
    from duetime.repository.outputsizes import OutputSizes

log = logging.getLogger("duetime.engine")

_T = TypeVar("_T")

CLOSE_GRACE_S = 5.0
"""How long a close lets the models' queued requests finish, unless `aclose` is given another."""


@dataclass(slots=True, eq=False)
class Ticket:
    """A submitted request: which version took it, the outputs wanted, and its pending result."""

    model: str
    version: str
    outputs: tuple[str, ...]
    variant: str = PRIMARY
    """The variant that answers: the one its request was queued on, or a cheaper one that took
    it over as its time ran out there (see `_hand_down`)."""
    future: asyncio.Future[Feeds] = field(init=False)
    on_done: Callable[[], None] | None = None
    """Called once the future settles (not on cancellation), a loop turn sooner than a future
    callback; set it with `when_done`, which also covers a future settled already."""
    stamp: Callable[[], int] | None = None
    """Set by traffic capture on the tickets it records: a clock read into `done_ns` as the
    future settles (not on cancellation)."""
    done_ns: int = 0
    """When the future settled, on `stamp`'s clock (0: not yet, or not stamped)."""
    classes: Mapping[str, int] | None = None
    """Outputs returned as their top classes, and how many (see duetime/classification.py)."""
    batched: bool = True
    """Whether the model's outputs have a batch dimension (classes are per batch element)."""
    labels: Mapping[str, tuple[str, ...]] | None = None
    """The classified outputs' class labels, where the model has them."""
    units: tuple[str, ...] = ()
    """Outputs answered with a trailing dim of 1 (see `Prepared.units`)."""

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the future settles (not if it is cancelled): now, if it has.

        NOTE: `submit` can return a ticket already settled: the scheduler may fail a request
        within the call that queued it (a dispatch in the same call found it could no longer
        finish in time). A callback stored after that would never run, and the client of an
        HTTP keep-alive connection would wait for its answer forever."""
        future = self.future
        if future.done():
            if not future.cancelled():
                callback()
            return
        self.on_done = callback

    def failure(self) -> DuetimeError | None:
        """The request's error once `future` is done (None if it succeeded), not raised: a copy
        of what the future holds, which the caller may raise.

        NOTE: raising the future's own exception ties it into a reference cycle: its traceback
        holds the frames it passed through (and, through `f_back`, their callers), they hold the
        ticket, and the ticket's future holds the exception. Only the cyclic collector frees that,
        with all the frames refer to: the request's arrays, its connection's slot, its closures.
        Under overload, where thousands of requests a second fail, those piled up into gen-0
        collections of 40,000 objects that stopped the event loop for 30-70 ms each."""
        error = self.future.exception()
        if error is None:
            produced = self.future.result()
            # (outputs ONNX Runtime could not return, which this request may have asked for)
            return produced.error_for(self.outputs) if type(produced) is Unreturned else None
        if not isinstance(error, DuetimeError):  # the scheduler settles with DuetimeErrors only
            return InternalError(f"internal error: {type(error).__name__}: {error}")
        return copy.copy(error)

    def _settled(self) -> None:
        if self.stamp is not None:
            self.done_ns = self.stamp()
        if self.on_done is not None:
            self.on_done()

    def response(self, request_id: str = "") -> InferResponse:
        """The response once `future` is done; raises the request's error (a copy of it, see
        `failure`) if it failed."""
        error = self.failure()
        if error is not None:
            try:
                raise error
            finally:
                error = None  # this frame is in the copy's traceback: it must not hold the copy
        outputs = _wanted(self.future.result(), self.outputs)
        for name in self.units:
            if name in outputs and not (self.classes and name in self.classes):
                outputs[name] = outputs[name][..., None]  # ([] -> [1], [batch] -> [batch, 1])
        if self.classes:
            for name, count in self.classes.items():
                labels = self.labels.get(name, ()) if self.labels else ()
                outputs[name] = top_classes(outputs[name], count, self.batched, labels)
        return InferResponse(self.model, self.version, request_id, outputs, self.variant)


class RequestRecorder(Protocol):
    """Sees requests as the engine takes them (traffic capture: tools/capture/recorder.py)."""

    def sampled(self) -> bool:
        """Whether to record the next request; called on the loop for every request."""
        ...

    def record(self, request: InferRequest, submit: Callable[[InferRequest], Ticket]) -> Ticket:
        """`submit(request)`, noting the request and, once it settles, its outcome (the ticket's
        `stamp` may be set to have it record when it settled)."""
        ...

    def refused_unread(
        self,
        protocol: str,
        target: bytes,
        data: bytes,
        headers: Mapping[str, str],
        error: DuetimeError,
        due_in_ns: int | None = None,
    ) -> None:
        """Note a request a front end refused before decoding it (the load shedder's): its
        HTTP body and target, or its serialised gRPC message; called on the loop for each."""
        ...


class Engine:
    """Models loaded from a repository, each behind its scheduler; the one way to run inference."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        cpus: CpuPlan | None = None,
        options: RepositoryOptions | None = None,
    ) -> None:
        if options is not None and not isinstance(options, RepositoryOptions):
            raise TypeError(
                "options: expected a duetime.repository.manager.RepositoryOptions (or None), got "
                f"{type(options).__name__}"
            )
        self.clock: Clock = clock or MonotonicClock()
        self.cpus = cpus or CpuPlan(None)
        self.options = options or RepositoryOptions()
        self.registry = Registry()
        self._answers_cache: dict[str, _Answers] = {}
        self._answers_snapshot: object = None
        """The registry snapshot `_answers_cache` holds its models' answer estimates for."""
        self.router = Router(self.registry, self.clock)
        self.manager: ModelManager | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        """`close()` has begun: synchronous calls are refused (an engine made by `open()`)."""
        self._closing = False
        """`aclose()` has begun (what fails then fails for that: see `_in_process`)."""
        self._waiting: set[concurrent.futures.Future[Any]] = set()
        """Calls handed over from other threads not answered yet: failed at `close()` if the
        loop never took them."""
        self._sync_lock = threading.Lock()
        self._shut = threading.Event()
        """`close()` is over: the loop thread has ended (what a second `close()` waits for)."""
        self._grace_s = CLOSE_GRACE_S
        """How long an `open()` engine's loop thread lets its models drain as it closes."""
        self._shutting: asyncio.Task[None] | None = None
        """The close `aclose()` began, on the engine's loop (what a second `aclose()` waits for)."""
        self._python_words = False
        """Made by `start()` or `open()`, for Python callers: a load that `aclose` ended is
        refused in their words (see `_load`); a plain `Engine()`'s are a server's."""
        self._opening: asyncio.Task[None] | None = None
        """The load an engine made by `open()` starts with, while it runs (see `_abandon`)."""
        self._serving = False
        """Its loading done, an `open()` engine's loop thread serves (see `_abandon`)."""
        self._forked = False
        """This process is a fork of the one that opened the engine (see `_after_fork`)."""
        self._placed = 0
        self._pending_loads: set[asyncio.Task[None]] = set()
        self._lazy_loads: dict[str, asyncio.Task[None]] = {}
        """Models being loaded on demand -> their load, shared by every request that needs it."""
        self._lazy_defaults: dict[str, int | None] = {}
        """Models being loaded on demand -> their `default_timeout_ms` in ns, as their config
        file gave it when the load began (None: none, or no config read: see `_due_by_default`)."""
        self._ledgers: dict[frozenset[int], CoreLedger] = {}
        """Per CPU: what the schedulers of instances pinned there have running."""
        self.recorder: RequestRecorder | None = None
        """Traffic capture: sees every request `submit` takes (None: off)."""

    # -- lifecycle -----------------------------------------------------------------------------

    @classmethod
    async def start(
        cls,
        repository: str | Path,
        *,
        clock: Clock | None = None,
        options: RepositoryOptions | None = None,
    ) -> Engine:
        """An engine serving the models in `repository` (as `options` say), on this loop."""
        engine = cls(clock=clock, options=options)
        engine._python_words = True
        try:
            await engine.load_repository(_repository_path(repository))
        except BaseException:
            # NOTE: a start cancelled as it loaded (`wait_for(Engine.start(repo), 30)` timing
            # out) left the instance threads and sessions of the models loaded so far running,
            # with no engine returned to close them (found by a tester). Their threads are
            # told to stop first: a second cancel may end the close (a second tester)
            for deployment in engine.registry.snapshot.deployments():
                deployment.model.executor.stop()
            await engine.aclose(0.0)
            raise
        return engine

    @property
    def repository(self) -> Path | None:
        return None if self.manager is None else self.manager.root

    async def load_repository(self, root: str | os.PathLike[str]) -> None:
        """Serve the models under `root`; failures are recorded in the index, not fatal. On an
        engine made by `open()`, awaited from another loop, the load is handed to the engine's
        loop (as `load_model` is); a `start()` engine refuses it off its own loop.

        NOTE: it took the awaiting loop as the engine's: awaited with `asyncio.run` on an
        `open()` engine, every infer after it said "the engine is closed", close() raised
        "Event loop is closed", and the engine's threads were left running."""
        path = _repository_path(root)
        if self._loop is not None and _running_loop() is not self._loop:
            work = functools.partial(self._load_repository, path)
            await self._on_engine_loop(work, "load_repository")
            return
        await self._load_repository(path)

    async def _load_repository(self, root: Path) -> None:
        self._loop = asyncio.get_running_loop()
        spare = frozenset(self.cpus.cpus[1:]) if self.cpus.cpus else None
        self.manager = ModelManager(
            root, self.options, self.registry, self._deploy, loader_cpus=spare or None,
            python_words=self._python_words,
        )  # fmt: skip
        await self.manager.start()

    def _deploy(self, loaded: LoadedModel, variant: str, background: bool) -> Deployment:
        """Start `loaded`'s instances (at the lowest CPU priority if it is `background`: a
        shadow version's) and give it a scheduler."""
        loop = asyncio.get_running_loop()
        pins = self.cpus.for_instances(
            loaded.config.instances, loaded.profile.predict(1), offset=self._placed,
            cost_varies=loaded.cost_depends_on_values,
        )  # fmt: skip
        self._placed += loaded.config.instances
        if background and loaded.config.execution == "auto":
            loaded.executor.inline = False  # a shadow takes only the CPU time others leave
        loaded.executor.start(loop, pins, background=background)
        ledger = None
        if (
            not loaded.executor.inline
            and pins
            and pins[0] is not None
            and all(p == pins[0] for p in pins)
        ):
            ledger = self._ledgers.setdefault(pins[0], CoreLedger())
        timeout_ms = loaded.config.default_timeout_ms
        row_bytes = sample_row_bytes(loaded.signature, loaded.sample_free)
        row_out = loaded.profile.sample_output_row_bytes
        max_rows = max(1, loaded.signature.max_batch_size)
        scheduler = ModelScheduler(
            executor=loaded.executor,
            config=loaded.config.scheduling,
            max_batch_size=loaded.signature.max_batch_size,
            profile=loaded.profile,
            default_timeout_ns=None if timeout_ms is None else int(timeout_ms * 1e6),
            clock=self.clock,
            label=model_words(loaded.name, loaded.version, None if variant == PRIMARY else variant),
            breaker=loaded.config.breaker,
            ledger=None if background else ledger,
            sample_row_bytes=row_bytes,
            sample=functools.partial(
                sample_inputs, loaded.signature, 1, fill=loaded.sample_fill, free=loaded.sample_free
            ),
            # (where they failed at load, a request's row that ran replaces them: see
            # `ModelScheduler._keep_sample`)
            learn_sample=loaded.profile.guessed,
            predictable_cost=not loaded.cost_depends_on_values,
            max_batch_bytes=batch_bytes_bound(
                loaded.validator.max_run_bytes,
                row_bytes,
                row_out,
                loaded.signature.max_batch_size,
                loaded.cost_depends_on_values,
            ),
            # NOTE: none for sizes that follow its inputs' values: its samples' answers (a
            # ConstantOfShape of 1) said nothing of a request's (60 MB): 40 calls at once, each
            # held as small, made 3.9 GB of answers under a 1 GiB bound (found by a tester)
            answer_guess=(
                None if loaded.cost_depends_on_values or row_out is None else row_out * max_rows
            ),
        )
        return Deployment(loaded, scheduler, variant)

    async def aclose(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Stop serving: drain each scheduler, those of versions still draining after an unload
        or a reload too, for up to `grace_s` in all; fail what is still queued then
        (ModelUnavailable), then stop the instances. An `aclose()` while another runs waits
        until that one is over (its own `grace_s` unused); after it, it does nothing. Once
        begun, a close runs to its end: cancelling its caller only stops it waiting.

        Awaited off the engine's loop: an engine made by `open()` is closed as `close()` closes
        it, on another thread, with this grace; one made by `start()` refuses (RuntimeError),
        as its other calls do there, changing nothing.

        NOTE: awaited on another loop, it failed half-way ("The future belongs to a different
        loop") with the registry cleared already: a later close() found nothing to close, and
        the models' instance threads and sessions ran on. A second aclose() returned at once,
        the first still draining (requests unanswered, instance threads running)."""
        if self._loop is not None and _running_loop() is not self._loop:
            if self._thread is None:
                if self._loop.is_closed():  # (its loop ended without aclose: see `close`)
                    self._close_orphaned()
                    return
                raise _started_elsewhere("aclose", self._loop)
            await in_thread(functools.partial(self._close, grace_s))
            return
        shutting = self._shutting
        if shutting is None:
            self._closing = True
            shutting = asyncio.get_running_loop().create_task(self._aclose(grace_s))
            self._shutting = shutting
        await asyncio.shield(shutting)

    async def _aclose(self, grace_s: float) -> None:
        """`aclose`'s work, in a task of its own (see `aclose`)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + grace_s
        loads = [*self._pending_loads, *self._lazy_loads.values()]
        for task in loads:  # (on-demand loads: their requests are told the engine stopped)
            task.cancel()
        await asyncio.gather(*loads, return_exceptions=True)
        if self.manager is not None:
            # NOTE: the versions still draining after an unload or a reload drain within the
            # same grace: their drains were waited for whole (up to --drain-s, 30 s), and an
            # aclose(grace_s=0.2) after an unload with 30 requests queued took 7.8 s
            await self.manager.aclose(grace_s)
        deployments = self.registry.clear()
        left_s = max(end - loop.time(), 0.0)
        await asyncio.gather(*(d.scheduler.aclose(left_s) for d in deployments))
        for deployment in deployments:
            await in_thread(deployment.model.executor.close)

    # -- the repository API --------------------------------------------------------------------

    def statistics(self, model: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Model statistics, as Triton's statistics extension gives them (`{"model_stats":
        [...]}`, what `GET /v2/models/stats` answers, with duetime's own figures: the latency
        profile, refusals, batches by size): of every served version of `model` (or of
        `version` alone), or of every model. ModelNotFound (or another error its client would
        get: see `Registry.resolve`) for a model or version not served.

        NOTE: the in-process API had none: a caller read the HTTP endpoint or the metrics, or
        nothing (found by a tester)."""
        if model is not None:
            self.registry.resolve(model, version)
        return statistics_json(self.registry.snapshot, model, version, self.router.shadows)

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every model in the repository with the state of each version (Triton's index).

        NOTE: a closed engine (or one closing, or an `open()` engine in a forked child) still
        listed its versions READY, while every infer raised ModelUnavailable: its versions are
        UNAVAILABLE, "the engine is closed"."""
        manager = self.manager
        if manager is None:
            return []
        if not (self._closing or self._closed):
            return manager.index(ready_only)
        if ready_only:
            return []
        return [_closed_entry(entry) for entry in manager.index()]

    def load_model(
        self, name: str, config: ModelConfig | None = None, files: Mapping[str, bytes] | None = None
    ) -> Coroutine[Any, Any, None]:
        """Load `name` (or reload what changed), with `config` in place of its config file; with
        `files` (path in the model folder, or Triton's `file:<path>` load parameter key ->
        content, and a `config`), from those instead of its folder in the repository, until it
        is unloaded. Await it; `load_model_blocking` is
        its blocking form, for an engine made by `open()`.

        NOTE: called from synchronous code on an `open()` engine, a refusal (NotAllowed, a
        config or files of the wrong type: TypeError) is raised by the call itself:
        `engine.load_model("m")` not awaited returned a coroutine and did nothing, without a
        word but a RuntimeWarning."""
        if self._thread is not None and _running_loop() is None:
            self._check_load(name, config, files)
        return self._load_model(name, config, files)

    async def _load_model(
        self, name: str, config: ModelConfig | None, files: Mapping[str, bytes] | None
    ) -> None:
        manager = self._check_load(name, config, files)
        work = functools.partial(self._load, manager, name, config, files)
        await self._on_engine_loop(work, "load_model")

    async def _load(
        self,
        manager: ModelManager,
        name: str,
        config: ModelConfig | None,
        files: Mapping[str, bytes] | None,
    ) -> None:
        """`manager.load`, on the engine's loop; a load that `aclose` ended (rolled back) is
        refused with ModelUnavailable, saying the engine closed, while a cancellation of the
        caller's own task goes on up as it came.

        NOTE: the caller, whose task nobody had cancelled, got a bare CancelledError: its task
        then ended as cancelled, `except Exception` did not see it, and a TaskGroup took it for
        a cancellation of its own. A plain `Engine()` (a server's) words it as the front ends
        word a load the server's stop ended, for the server's clients."""
        try:
            await manager.load(name, config=config, files=files)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not (self._closing or self._closed) or (task is not None and task.cancelling()):
                raise
            if self._python_words:
                again = "open a new one" if self._thread is not None else "start a new one"
                reason = f"the engine closed before answering; {again}"
            else:
                reason = SHUTTING_DOWN
            raise ModelUnavailable(f"the load of model '{name}' did not finish: {reason}") from None

    def _check_load(
        self, name: str, config: ModelConfig | None, files: Mapping[str, bytes] | None
    ) -> ModelManager:
        """The manager, if it may load `name` with `config` and `files` (see `load_model`)."""
        if config is not None and not isinstance(config, ModelConfig):
            # NOTE: a dict or a JSON string (what Triton's load API takes) failed deep in the
            # load with "'dict' object has no attribute 'version_policy'"
            raise TypeError(
                "config: expected a duetime.config.ModelConfig (or None), got "
                f"{type(config).__name__}; build one with ModelConfig.model_validate(...)"
            )
        if files is not None:
            _check_files(files)
        return self._control("load", name)

    def unload_model(self, name: str) -> Coroutine[Any, Any, None]:
        """Stop routing to `name`; requests already queued on it still finish. Await it;
        `unload_model_blocking` is its blocking form (see `load_model`)."""
        if self._thread is not None and _running_loop() is None:
            self._control("unload", name)
        return self._unload_model(name)

    async def _unload_model(self, name: str) -> None:
        manager = self._control("unload", name)
        await self._on_engine_loop(functools.partial(manager.unload, name), "unload_model")

    def load_model_blocking(
        self, name: str, config: ModelConfig | None = None, files: Mapping[str, bytes] | None = None
    ) -> None:
        """Blocking `load_model` for synchronous code, on an engine made by `open()` (as `infer`
        is `infer_async`'s); never call it on the engine's own loop."""
        self._check_blocking("load_model")
        manager = self._check_load(name, config, files)
        self._run_blocking(functools.partial(self._load, manager, name, config, files))

    def unload_model_blocking(self, name: str) -> None:
        """Blocking `unload_model` (see `load_model_blocking`)."""
        self._check_blocking("unload_model")
        manager = self._control("unload", name)
        self._run_blocking(functools.partial(manager.unload, name))

    def _check_blocking(self, name: str) -> None:
        """RuntimeError unless this thread may wait for the engine's loop (see `infer`)."""
        if self._thread is None:
            if self._loop is None:
                raise _started_elsewhere(name, None)
            raise RuntimeError(
                f"Engine.{name}_blocking is for engines made by Engine.open() (their loop runs "
                "on a thread of their own); this one runs on the loop that started it "
                f"(Engine.start): await {name} there"
            )
        if _running_loop() is self._loop:
            raise RuntimeError(
                f"Engine.{name}_blocking blocks; on the engine's loop use await {name}"
            )

    def _run_blocking(self, work: Callable[[], Awaitable[_T]]) -> _T:
        """`work()` handed to the engine's loop, waited for on this thread."""
        result: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._hand_over(functools.partial(self._work_for_thread, work, result), result)
        return _waited(result)

    def _control(self, action: str, name: str) -> ModelManager:
        """The manager, if its control mode lets the repository API `action` (load, unload)
        model `name`; NotAllowed, saying why, if not.

        NOTE: as Triton's ("explicit model load / unload is not allowed if polling is
        enabled"), polling refuses loads as well as unloads: a load, uploaded files included,
        was taken while every unload was refused, so an upload could never be dropped and
        outlived even the removal of the model's folder.

        NOTE: a closed engine (or one closing) refuses with ModelUnavailable, as its infers
        do: a `load_model` awaited after `aclose()` reached the closed loader and failed
        InvalidInput, "internal error while loading: RuntimeError: cannot schedule new futures
        after shutdown", with a traceback logged. (An `open()` engine in a forked child is
        refused as its other calls are, by `_hand_over`.)"""
        if (self._closing or self._closed) and not self._forked:
            again = "open a new one" if self._thread is not None else "start a new one"
            raise ModelUnavailable(f"cannot {action} model '{name}': the engine is closed; {again}")
        manager = self.manager
        if manager is None and self._loop is None:  # (a bare Engine(): see `_started_elsewhere`)
            raise _started_elsewhere(f"{action}_model", None)
        if manager is None or manager.options.control_mode == "none":
            raise ModelControlOff(
                f"{MODEL_CONTROL_OFF}: model {action} is off: the repository is served with "
                "--model-control-mode none (in process: RepositoryOptions(control_mode='none')); "
                "load and unload models in explicit mode"
            )
        if manager.options.control_mode == "poll":
            instead = {"load": "change its folder", "unload": "remove its folder"}[action]
            raise ModelControlOff(
                f"{MODEL_CONTROL_OFF}: cannot {action} model '{name}' while the repository is "
                f"polled (--model-control-mode poll): {instead} and the next poll applies it, "
                "or use explicit mode"
            )
        return manager

    @property
    def ready(self) -> bool:
        """Models are served, or the repository API / first requests will load them; and
        (strict readiness, as Triton) none failed to load with nothing serving it. A closed
        engine (or one closing) is not ready (see `repository_index`)."""
        manager = self.manager
        if manager is None or self._closing or self._closed:
            return False
        snapshot = self.registry.snapshot
        if manager.options.strict_readiness and snapshot.failures:
            return False
        waiting = manager.options.control_mode == "explicit" or manager.options.lazy
        return waiting or bool(snapshot.models)

    def has_idle_capacity(self, model: str, version: str | None = None) -> bool:
        """Whether `model` (`version`; None: its default) has capacity idle now: nothing queued
        and nothing running, or nothing queued, an instance free for its next batch and no
        request turned away lately (see `ModelScheduler.backlogged`). The server's load shedder
        refuses none of its requests then (its `idle`, see `LoadShedder.refuse`): the model would
        sit idle for nothing. False for a model not served.

        Only a model whose run takes `SMALL_MODEL_NS` or more: a shorter one shares the loop's
        core (or runs on the loop), and is idle again by the loop's next turn.
        NOTE: asked of every model, an mlp flood over HTTP (open loop, 2/10 ms timeouts, past
        its capacity) had one request let through each turn of the loop, most of them when
        turns were short: refusals fell from ~4,800 to 650-2,900 of ~5,900, expiries rose
        from ~600 to 2,800-5,200, and goodput fell from 110-200/s to 0-84/s."""
        scheduler = self.registry.scheduler_of(model, version)
        if scheduler is None or scheduler.profile.predict(1) < SMALL_MODEL_NS:
            return False
        return scheduler.idle or not scheduler.backlogged(self.clock.now_ns())

    def answer_guess(self, model: str) -> int | None:
        """The most output bytes `model`'s versions and variants made for their sample inputs
        at load, at their largest batch (`ModelScheduler.answer_guess`): what the front ends
        expect its answers to weigh where nothing else is known (see `LargestAnswers.expected`).
        0 for a model the server does not have (its requests are refused); None where it is
        not known (loading) or some version's outputs' sizes follow its inputs (no answer
        tells the next one's). Asked for every inference request: a lookup, per snapshot.

        NOTE: the default version's alone stood for all: a request naming another version (or
        sent to it by the traffic split, or failed over to it) was held at the default's size
        (found by a tester: a version 1 of x·xᵀ beside a version 2 of -x ran 22 of 24 calls
        for 16 MB answers under a 100 MB bound)."""
        return self._answers(model).guess

    def answer_sizes(self, model: str) -> tuple[OutputSizes, ...] | None:
        """What a request's shapes say of the size of `model`'s answers (each version's and
        variant's outputs' sizes: see repository/outputsizes.py); None where one has none."""
        return self._answers(model).sizes

    def class_bytes(self, model: str) -> float:
        """The most bytes an output element of `model` can become in an answer as one of its
        top classes (the classification extension), per byte of the element: a class's text
        (`classification.max_class_bytes`) over the element's size; 1.0 where not known."""
        return self._answers(model).class_bytes

    def _answers(self, model: str) -> _Answers:
        snapshot = self.registry.snapshot
        cache = self._answers_cache
        if snapshot is not self._answers_snapshot:
            self._answers_snapshot = snapshot
            cache.clear()
        found = cache.get(model)
        if found is None:
            found = _answers_of(snapshot, model)
            if len(cache) < ANSWERS_CACHED:  # (a client names models at will)
                cache[model] = found
        return found

    def cancelled_unqueued(self, model: str, version: str | None, arrival_ns: int) -> None:
        """A request for `model` (`version`; None: its default) that arrived at `arrival_ns` was
        withdrawn by its client before it was queued: counted cancelled in the model's
        statistics, as a request withdrawn from its queue is (nothing where it is not served)."""
        scheduler = self.registry.scheduler_of(model, version)
        if scheduler is not None:
            scheduler.cancelled_unqueued(self.clock.now_ns() - arrival_ns)

    # -- inference -----------------------------------------------------------------------------

    def submit(self, request: InferRequest, *, run_now: bool = False) -> Ticket:
        """Route, validate and queue `request` on the loop; raise a DuetimeError if it cannot be
        queued. A model not loaded yet (lazy loading) is loaded first if the request can wait.
        `run_now`: a model that runs on the loop (inline) and is idle may run the request within
        this call (the ticket comes back settled), instead of on the loop's next turn; for a
        caller that makes its own batches or waits for each answer, not for a front end whose
        next requests of the turn should join the batch (see `ModelScheduler._runs_now`)."""
        if self._thread is not None and _running_loop() is not self._loop:
            raise RuntimeError(
                "Engine.submit runs on the engine's own loop; from other threads or loops use "
                "infer() or infer_async()"
            )
        recorder = self.recorder
        if recorder is not None and recorder.sampled():
            return recorder.record(request, self._submit)
        return self._submit(request, run_now=run_now)

    def submit_now(
        self, request: InferRequest, deliver: Callable[[Feeds], object] | None = None
    ) -> Ticket | tuple[Routed, Feeds | DuetimeError]:
        """`submit(request, run_now=True)` on the engine's loop, or, where the model is inline,
        idle and nothing unusual is on (`_answered_alone`), `request` run within this call: then
        how it was routed and its outputs (all the model's: `Routed.prepared.outputs` names
        those asked for), or the error its run ended in. Raises as `submit` does. Run within
        the call and answered, its outputs also go to `deliver` as soon as the run ends, before
        the scheduler's books are updated (see `ModelScheduler.answer_alone`); what `deliver`
        raises comes out of this call then, the request answered and counted.

        NOTE: for callers that take each answer at once (`infer_async`, a feed's predictor):
        a ticket and its future, settled within the call all the same, cost `infer_async` ~35
        µs of its ~75 µs over ONNX Runtime on the 2-core VM, and `duetime itch run` spent more
        of each event in `Engine.submit` (54% at --pace max) than in the book, the features
        and the model's run together."""
        # (`submit`'s own checks less the loop's: the callers are on it)
        if self.recorder is not None:
            return self.submit(request, run_now=True)
        try:
            routed = self.router.route(request)
        except (ModelNotFound, ModelUnavailable):
            # (loaded on demand, or refused so again: routing changed nothing)
            return self._submit(request, run_now=True)
        outcome = _answered_alone(routed, request, deliver)
        if outcome is None:
            return self._queue(routed, request, run_now=True)
        return routed, outcome

    def refuse_late(self, request: InferRequest, late: DeadlineExceeded) -> DuetimeError:
        """The refusal of `request`, whose due time passed before it could start (`late`, in
        words that say why): handed to its scheduler to be refused as a request due before it
        is queued, so it counts as expired in the model's statistics and metrics, or the error
        it meets first (a breaker open, an unknown model). It never runs. A front end that
        holds requests back (answers unread) refuses them so.

        NOTE: it is refused as due now: a front end's timer fires up to a millisecond early
        (uvloop's are whole milliseconds), and a gRPC call refused 235 µs before its due time
        met admission instead, RESOURCE_EXHAUSTED "cannot finish in time", where its client's
        timer had said it was due (DEADLINE_EXCEEDED, as the same call an instant later)."""
        now = self.clock.now_ns()
        if request.due_ns is not None and request.due_ns > now:
            request.due_ns = now
        try:
            ticket = self.submit(request)  # (the recorder's too, as any request's)
        except DeadlineExceeded:
            return late
        except DuetimeError as exc:
            return exc.with_traceback(None)
        ticket.future.cancel()  # (due: refused at admission; should it not be, it never runs)
        return late

    def _submit(self, request: InferRequest, lazy: bool = True, *, run_now: bool = False) -> Ticket:
        """`submit` without the recorder; `lazy=False`: never load the model first (the
        request that follows a load must not start another)."""
        try:
            routed = self.router.route(request)
        except (ModelNotFound, ModelUnavailable):
            # NOTE: ModelUnavailable from routing is a model whose last load failed: lazily,
            # a later request retries it (`can_load_lazily` spaces the retries out).
            manager = self.manager
            if not lazy or manager is None or not manager.can_load_lazily(request.model):
                raise
            return self._submit_after_load(request, manager)
        return self._queue(routed, request, run_now)

    def _queue(self, routed: Routed, request: InferRequest, run_now: bool) -> Ticket:
        """Queue `request`, routed, on its variant's scheduler (see `_submit`)."""
        model = routed.deployment.model
        prepared = routed.prepared
        ticket = Ticket(model.name, model.version, prepared.outputs, routed.deployment.variant)
        ticket.units = prepared.units
        if request.classes:
            signature = model.signature
            check_classifiable(request.classes, signature.outputs, prepared.outputs)
            ticket.classes, ticket.batched = request.classes, signature.max_batch_size > 0
            ticket.labels = model.labels
        deployment = routed.deployment
        variants = routed.version.variants
        # (a request with a due time may go to a cheaper variant, unless it gives optional
        # inputs: a variant may lack one, see loader.load_version)
        passable = (
            len(variants) > 1
            and routed.due_ns is not None
            and not routed.version.primary.model.validator.overrides(prepared)
        )
        fallback = None
        if passable and deployment is not variants[-1]:
            fallback = functools.partial(_hand_down, ticket, variants, request.priority)
        # NOTE: the router chose by `fits`; admission a moment later can still refuse (the clock
        # moved, the request's size): a cheaper variant may yet take it. A variant that passes
        # it on does not count its refusal (`passes_on`): the request counts where it ran, or
        # at the variant whose refusal its client gets (both counted it; found by a tester)
        while True:
            cheaper = _cheaper(variants, deployment) if passable else None
            try:
                ticket.future = deployment.scheduler.submit_nowait(
                    prepared.feeds,
                    rows=prepared.rows,
                    shape_key=prepared.shape_key,
                    due_ns=routed.due_ns,
                    priority=request.priority,
                    on_done=ticket._settled,
                    timing=request.timing,
                    fallback=fallback,
                    arrival_ns=request.arrival_ns,
                    run_now=run_now,
                    passes_on=cheaper is not None,
                    by_default=routed.by_default,
                )
                break
            except Overloaded:
                if cheaper is None:
                    raise
                deployment = cheaper
                ticket.variant = deployment.variant
        if routed.served.traffic.shadows:
            self.router.mirror(routed, request, ticket.future)
        return ticket

    def _submit_after_load(self, request: InferRequest, manager: ModelManager) -> Ticket:
        """A ticket for a model being loaded on demand; refused at once if loading would take
        longer than the request may wait (the load starts anyway, for the requests after it)."""
        load = self._lazy_load(request.model, manager)
        estimate_ns = int(manager.load_estimate_s(request.model) * 1e9)
        now = self.clock.now_ns()
        due_ns = self._due_by_default(request, now)
        if due_ns is not None and now + estimate_ns > due_ns:
            # NOTE: the load has started above: raising first (as before) started none, and a
            # client that always sends a due time shorter than the load (a 50 ms budget, a load
            # of 1 s) was refused for good, 40 times out of 40 over 4 s
            # NOTE: Triton's words first, and a Retry-After of about the load, as for a request
            # refused while a model's first load is under way (the registry's `served`): this
            # said "model 'x' is not loaded" with none, and "due in -0 ms" for one already due
            # (found by a tester)
            why = "" if request.due_ns is not None else " (its model's default_timeout_ms)"
            left_ms = (due_ns - now) / 1e6
            due = f"due in {left_ms:.0f} ms" if left_ms >= 0.5 else "already due"
            raise ModelUnavailable(
                f"{UNKNOWN_MODEL}'{request.model}' has no available versions: it is loading (a "
                f"load takes about {estimate_ns / 1e6:.0f} ms) and the request is {due}{why}; "
                "retry shortly",
                retry_after_s=retry_after_s(estimate_ns / 1e9),
            )
        ticket = Ticket(request.model, "", ())
        ticket.future = asyncio.get_running_loop().create_future()
        task = asyncio.get_running_loop().create_task(
            self._load_then_submit(request, ticket, load, due_ns)
        )
        self._pending_loads.add(task)
        task.add_done_callback(self._pending_loads.discard)
        task.add_done_callback(functools.partial(_unsettled, ticket))
        return ticket

    def _due_by_default(self, request: InferRequest, now: int) -> int | None:
        """The due time of `request`, which waits for its model's on-demand load: its own, else
        the one its model's `default_timeout_ms` sets, counted from its arrival (`now` if its
        front end did not say: `request` is dated so). Its own stays as it was (None: none):
        the scheduler tells a due time the default set by that (see `submit_nowait`).

        NOTE: the default applied only once the model was loaded (the scheduler's admission):
        a request without a timeout of its own, for a lazy model whose default is 60 ms, was
        answered 504 after the whole load (994-1380 ms), where one with a 60 ms timeout was
        refused in 2 ms. The config file is read when the load begins (`_lazy_load`), in the
        same words the load reads it; where it cannot be read then (the load will say why),
        the default counts from the arrival still once the model serves (`arrival_ns`, which
        the router counts it from), but the request waits for the load."""
        if request.arrival_ns is None:
            request.arrival_ns = now
        default_ns = self._lazy_defaults.get(request.model)
        if default_ns is not None and request.due_ns is None:
            return request.arrival_ns + default_ns
        return request.due_ns

    def _lazy_load(self, name: str, manager: ModelManager) -> asyncio.Task[None]:
        """The on-demand load of `name`: started by the first request that needs it, joined by
        those arriving while it runs (one load, not one queued behind another per request)."""
        task = self._lazy_loads.get(name)
        if task is None:
            self._lazy_defaults[name] = _default_timeout_ns(manager.root / name)
            task = asyncio.get_running_loop().create_task(manager.load(name, explicit=False))
            self._lazy_loads[name] = task
            task.add_done_callback(functools.partial(self._lazy_load_done, name))
        return task

    def _lazy_load_done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._lazy_loads.get(name) is task:
            del self._lazy_loads[name]
            self._lazy_defaults.pop(name, None)
        if not task.cancelled():
            # (retrieved: a load no request waited for fails in the index, not in asyncio's log)
            task.exception()

    async def _load_then_submit(
        self, request: InferRequest, ticket: Ticket, load: asyncio.Task[None], due_ns: int | None
    ) -> None:
        outer = ticket.future
        try:
            await self._await_load(request, load, due_ns)
            if outer.done():
                return
            try:
                inner = self._submit(request, lazy=False)
            except DeadlineExceeded:  # (the scheduler's words would blame a busy server)
                raise DeadlineExceeded(
                    f"{TIMEOUT_EXPIRED}: model '{request.model}' was loaded on demand, and the "
                    "load ended after "
                    "the request was due; retry now that it is loaded"
                ) from None
        except DuetimeError as exc:
            if not outer.done():
                outer.set_exception(_for_the_request(exc, request.model))
                ticket._settled()
            return
        ticket.version, ticket.outputs, ticket.variant = inner.version, inner.outputs, inner.variant
        ticket.classes, ticket.batched = inner.classes, inner.batched

        def relay(done: asyncio.Future[Feeds]) -> None:
            if outer.done():
                return
            if done.cancelled():
                outer.cancel()
                return
            ticket.variant = inner.variant  # (a cheaper one may have taken it over meanwhile)
            error = done.exception()
            if error is not None:
                outer.set_exception(error)
            else:
                outer.set_result(done.result())
            ticket._settled()

        inner.future.add_done_callback(relay)
        outer.add_done_callback(lambda f: inner.future.cancel() if f.cancelled() else None)

    async def _await_load(
        self, request: InferRequest, load: asyncio.Task[None], due_ns: int | None
    ) -> None:
        """Wait for the on-demand `load` (raising its error), but no longer than `request`'s
        due time `due_ns`: DeadlineExceeded then, and the load goes on for the requests after
        it.

        NOTE: waiting for the whole load, a request due in 1.2 s was answered 504 at 2.95 s
        (33 s under load), long after its client had stopped waiting."""
        if due_ns is None:
            await asyncio.shield(load)  # (shared: one request's end must not end it)
            return
        left_s = max(0.0, (due_ns - self.clock.now_ns()) / 1e9)
        done, _ = await asyncio.wait({load}, timeout=left_s)  # (never cancels the load)
        if not done:
            raise DeadlineExceeded(
                f"{TIMEOUT_EXPIRED}: model '{request.model}' is still loading on demand and the "
                "request is due; "
                "the load goes on: retry shortly"
            )
        load.result()

    async def infer_async(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | int | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - a due time for the server, not a wait
        priority: int = 0,
        outputs: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run `model` on `inputs`; `timeout` in seconds sets the request's due time. None, 0
        (as Triton's `timeout` of 0 over HTTP and gRPC: not "due at once"), a timeout over
        NO_DUE_BEYOND_NS (11.6 days) or infinity set none of its own: the model's
        `default_timeout_ms` applies, if it has one. `priority`: 1 is served first, 0 (the
        default) the model's default level; at most 2**64 - 1 (a uint64, as over the wire).
        `parameters` are the request's, as over HTTP and gRPC (a traffic policy's sticky key,
        say), `timeout` (microseconds, as tritonclient sends it) and `priority` included, read
        and checked as HTTP reads them (InvalidInput naming the parameter): beside the
        keywords, the earlier of the two due times applies (as a gRPC deadline beside a
        `timeout` parameter), and a `priority` parameter and a `priority` keyword other than 0
        must agree (InvalidInput if they differ). C-ordered arrays in this machine's byte
        order are not copied: leave them unchanged until the answer; others are copied into
        such arrays first, on the calling thread. `infer_response_async` also says which
        version and variant answered.

        On an engine made by `open()`, awaited from another loop, the request is handed to the
        engine's loop as `infer` does."""
        request = self._request(model, inputs, version, timeout, priority, outputs, parameters)
        return (await self._answer(request)).outputs

    async def infer_response_async(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | int | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - a due time for the server, not a wait
        priority: int = 0,
        outputs: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> InferResponse:
        """`infer_async`'s answer whole: its outputs, and the model, version and variant that
        answered (an A/B split or a cheaper variant under a tight due time tell apart here)."""
        request = self._request(model, inputs, version, timeout, priority, outputs, parameters)
        return await self._answer(request)

    async def _answer(self, request: InferRequest) -> InferResponse:
        """`request` run, on the engine's loop or handed to it (see `infer_async`)."""
        if _running_loop() is not self._loop:
            if self._thread is None:  # (its futures belong to the loop that started it)
                raise _started_elsewhere("infer_async", self._loop)
            return await asyncio.wrap_future(self._submit_threadsafe(request))
        try:
            done = self.submit_now(request)
        except DuetimeError as exc:
            raise self._in_process(exc, request, queued=False) from None
        error: DuetimeError | None
        if isinstance(done, Ticket):
            if not done.future.done():  # (an idle inline model answered within `submit`)
                await settled(done.future)
            error = done.failure()
            if error is None:
                return done.response()
        else:
            routed, outcome = done
            if type(outcome) is Unreturned:  # (see `Ticket.failure`)
                outcome = outcome.error_for(routed.prepared.outputs) or outcome
            if not isinstance(outcome, DuetimeError):
                return _alone_response(routed, outcome)
            error = outcome  # (its run failed: raised as a ticket's failure)
        try:
            raise self._in_process(error, request, queued=True)
        finally:
            error = None  # (this frame is in its traceback: see Ticket.response)

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | int | None = None,
        timeout: float | None = None,
        priority: int = 0,
        outputs: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> dict[str, np.ndarray]:
        """Blocking `infer_async` for synchronous code, on an engine made by `open()` (whose
        loop runs on a thread of its own); never call it on the engine's own loop.
        `infer_response` also says which version and variant answered.

        NOTE: an engine made by `start()` answers only on the loop that started it, as its
        `infer_async` does: handed to that loop from another thread, a call waited forever (past
        its due time) whenever the loop was not running, and after `asyncio.run(Engine.start())`
        it was told "the engine is closed" though nothing had closed it."""
        request = self._request(model, inputs, version, timeout, priority, outputs, parameters)
        return self._blocking(request).outputs

    def infer_response(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | int | None = None,
        timeout: float | None = None,
        priority: int = 0,
        outputs: Sequence[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> InferResponse:
        """Blocking `infer_response_async` (see `infer`)."""
        request = self._request(model, inputs, version, timeout, priority, outputs, parameters)
        return self._blocking(request)

    def _blocking(self, request: InferRequest) -> InferResponse:
        """`request` handed to the engine's loop, waited for on this thread (see `infer`)."""
        if self._thread is None:
            if self._loop is None:
                raise _started_elsewhere("infer_async", None)
            raise RuntimeError(
                "Engine.infer is for engines made by Engine.open() (their loop runs on a thread "
                "of their own); this one runs on the loop that started it (Engine.start): await "
                "infer_async there"
            )
        if _running_loop() is self._loop:
            raise RuntimeError("Engine.infer blocks; on the engine's loop use await infer_async")
        return _waited(self._submit_threadsafe(request))

    def _submit_threadsafe(self, request: InferRequest) -> concurrent.futures.Future[InferResponse]:
        """Hand `request` to the engine's loop from another thread; its answer's future."""
        result: concurrent.futures.Future[InferResponse] = concurrent.futures.Future()
        self._hand_over(functools.partial(self._submit_for_thread, request, result), result)
        return result

    def _hand_over(self, call: Callable[[], None], result: concurrent.futures.Future[_T]) -> None:
        """Run `call` on the engine's loop (an engine made by `open()`), from another thread;
        `result`, which it settles, is failed at `close()` if the loop never takes it."""
        with self._sync_lock:  # (against close(): a call it misses would wait forever)
            loop = self._loop
            if self._closed or loop is None or loop.is_closed():
                if self._forked:
                    raise RuntimeError(
                        "this engine was opened in another process, which forked this one "
                        "(its loop thread did not come along): open a new engine here"
                    )
                raise ModelUnavailable("the engine is closed; open a new one")
            self._waiting.add(result)
            loop.call_soon_threadsafe(call)
        result.add_done_callback(self._waiting.discard)

    async def _on_engine_loop(self, work: Callable[[], Awaitable[_T]], name: str) -> _T:
        """Await `work()` on the engine's loop, whichever loop awaits this: the manager's locks,
        tasks and futures, and the schedulers a load starts, belong to that loop.

        NOTE: awaited on a loop of the caller's (`asyncio.run(engine.load_model(...))`, the
        only way synchronous code can call it on an `open()` engine), a load ran there: its
        model's executor and scheduler were bound to that loop, and once it ended every infer
        raised "Event loop is closed" (or, while it lived, hung); an unload's drain failed "The
        future belongs to a different loop". An `open()` engine hands the work over, as
        `infer_async` does; a `start()` engine refuses, as `infer_async` does."""
        if _running_loop() is self._loop:
            return await work()
        if self._thread is None:
            raise _started_elsewhere(name, self._loop)
        result: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._hand_over(functools.partial(self._work_for_thread, work, result), result)
        return await asyncio.wrap_future(result)

    def _work_for_thread(
        self, work: Callable[[], Awaitable[_T]], result: concurrent.futures.Future[_T]
    ) -> None:
        """On the loop: run `work()` handed over by `_on_engine_loop` and settle `result` with
        its outcome; a caller that gives up (cancels `result`) cancels it."""
        if result.cancelled():  # (given up before the loop took it)
            return
        loop = asyncio.get_running_loop()

        async def run() -> None:
            try:
                outcome = await work()
            except Exception as exc:
                _answer(result, None, exc)
            else:
                _answer(result, outcome, None)

        task = loop.create_task(run())

        def withdraw(done: concurrent.futures.Future[_T]) -> None:
            if done.cancelled():
                with contextlib.suppress(RuntimeError):  # (the loop has closed: nothing runs)
                    loop.call_soon_threadsafe(task.cancel)

        result.add_done_callback(withdraw)

    def _submit_for_thread(
        self, request: InferRequest, result: concurrent.futures.Future[InferResponse]
    ) -> None:
        """On the loop: submit a request handed over by `_submit_threadsafe`, and answer
        `result`. A caller that gives up (an `infer_async` awaited on another loop, cancelled)
        cancels `result`, from its own thread: that withdraws the request as a cancelled ticket
        does, and its answer, if it came anyway, is dropped."""
        if result.cancelled():  # (given up before the loop took it: never queued)
            return
        try:
            ticket = self.submit(request)
        except Exception as exc:
            _answer(result, None, self._in_process(exc, request, queued=False))
            return

        def settle() -> None:
            error = ticket.failure()
            if error is None:
                _answer(result, ticket.response(), None)
            else:
                _answer(result, None, self._in_process(error, request, queued=True))

        ticket.when_done(settle)
        loop = self._loop
        assert loop is not None

        def withdraw(done: concurrent.futures.Future[InferResponse]) -> None:
            if done.cancelled():
                with contextlib.suppress(RuntimeError):  # (the loop has closed: nothing runs)
                    loop.call_soon_threadsafe(ticket.future.cancel)

        result.add_done_callback(withdraw)

    def _in_process(
        self, error: BaseException, request: InferRequest, *, queued: bool
    ) -> BaseException:
        """`error` in words for an in-process caller (`infer`, `infer_async`), whose request
        was refused (`queued` False) or failed after it was queued.

        NOTE: the registry and the schedulers word their errors for a server's clients, and
        HTTP and gRPC answer them as they are; in process they misled: after `aclose()` a call
        was told "the server is shutting down; retry on another replica", and `timeout=0`
        "... it waited that long to be read: the server is overloaded"."""
        if isinstance(error, ModelUnavailable) and (self._closing or self._closed):
            again = "open a new one" if self._thread is not None else "start a new one"
            if queued:
                return ModelUnavailable(
                    f"model '{request.model}': the engine closed before answering; {again}"
                )
            return ModelUnavailable(f"model '{request.model}': the engine is closed; {again}")
        if isinstance(error, DeadlineExceeded) and not queued and request.due_ns is not None:
            # (refused as it was queued: only a request due before it reached the scheduler)
            late_us = max(self.clock.now_ns() - request.due_ns, 0) / 1e3
            return DeadlineExceeded(
                f"{TIMEOUT_EXPIRED}: model '{request.model}': the request was due before the "
                "engine could queue it "
                f"(by {late_us:.0f} µs): its timeout is too short (or the engine's loop was "
                "busy); give a longer timeout, or None for no due time"
            )
        return error

    def _request(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        version: str | int | None,
        timeout: float | None,
        priority: int,
        outputs: Sequence[str] | None,
        parameters: Mapping[str, Any] | None = None,
    ) -> InferRequest:
        # (`type(x) is ...` first: the ABCs' isinstance costs a µs a call on the request path)
        if timeout is not None and (
            (
                type(timeout) is not float  # (a float, nearly every timeout: no ABC's frames)
                and (isinstance(timeout, bool) or not isinstance(timeout, numbers.Real))
            )
            or not timeout >= 0
        ):
            raise InvalidInput(f"timeout: expected seconds >= 0 (or None), got {timeout!r}")
        if (
            type(priority) is not int
            and (isinstance(priority, bool) or not isinstance(priority, numbers.Integral))
        ) or not 0 <= priority <= MAX_PRIORITY:
            # NOTE: 2**64 was taken, and the scheduler read such a level as a shadow copy's
            # (edf.SHADOW_LEVEL): it expired as "shadow copy dropped unrun", uncounted
            raise InvalidInput(
                f"priority: expected an integer >= 0, at most {MAX_PRIORITY} (a uint64, as "
                f"over HTTP and gRPC), got {priority!r}"
            )
        if (
            version is not None
            and type(version) is not str
            and (isinstance(version, bool) or not isinstance(version, numbers.Integral))
        ):
            raise InvalidInput(f"version: expected a version number or name, got {version!r}")
        if not isinstance(model, str):  # (None was "unknown model 'None'")
            raise InvalidInput(f"model: expected a model name (str), got {model!r}")
        if type(inputs) is not dict and not isinstance(inputs, Mapping):
            raise InvalidInput(
                f"inputs: expected a mapping of input name to array, got {type(inputs).__name__}"
            )
        if isinstance(outputs, (str, bytes)):  # (a tuple: `str | bytes` is made on each call)
            raise InvalidInput(f"outputs: expected a sequence of output names, got {outputs!r}")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise InvalidInput(
                f"parameters: expected a mapping of parameter name to value, got "
                f"{type(parameters).__name__}"
            )
        try:
            wanted = () if outputs is None else tuple(outputs)
        except TypeError:  # (5: "'int' object is not iterable", naming nothing)
            raise InvalidInput(
                f"outputs: expected a sequence of output names, got {outputs!r}"
            ) from None
        if wanted and not all(isinstance(name, str) for name in wanted):
            raise InvalidInput(f"outputs: expected a sequence of output names, got {outputs!r}")
        # (0, as over HTTP and gRPC, a due time past NO_DUE_BEYOND_NS, or infinity: none)
        due = None
        if timeout:
            # NOTE: as a Python float: numpy's float16 took `timeout * 1e9` in float16 (inf:
            # OverflowError from int()), and an int past a float's range raised one from the
            # product (found by a tester); either is seconds, the latter beyond any due time
            seconds = timeout if type(timeout) is float else _seconds(timeout)
            if seconds * 1e9 <= NO_DUE_BEYOND_NS:
                due = self.clock.now_ns() + int(seconds * 1e9)
        priority = int(priority)
        given: dict[str, Any] = {}
        if parameters:
            # NOTE: `sequence_*` and `triton_` keys were taken unchecked ({"sequence_start":
            # 5} ran), where the README says the parameters are checked as HTTP checks them
            # (found by a tester)
            check_parameter_count(len(parameters), "request")
            # (`timeout` or `priority` None: not given, as the keywords'; numpy's scalars as
            # the Python values they hold, as JSON's)
            given = {
                name: value.item() if isinstance(value, np.generic) else value
                for name, value in parameters.items()
                if value is not None or name not in ("timeout", "priority")
            }
            # NOTE: keys not strings raised AttributeError, and values HTTP refuses (an object,
            # a list, null) were taken (found by a tester)
            check_scalar_parameters(given, "request")
            check_http_parameters(given)
            if "timeout" in given or "priority" in given:
                due, priority = self._parameters_due(given, due, priority)
        return InferRequest(
            model=model,
            inputs=_contiguous(inputs),
            version=None if version is None else str(version),
            outputs=wanted or None,  # (none named: all of them, as over HTTP and gRPC)
            due_ns=due,
            priority=priority,
            parameters=given,
        )

    def _parameters_due(
        self, parameters: dict[str, Any], due: int | None, priority: int
    ) -> tuple[int | None, int]:
        """The due time and priority of a request whose `parameters` hold `timeout` or
        `priority`, read and checked as HTTP and gRPC read them (microseconds, a uint64 each;
        the same words where one is bad), with `due` and `priority` from the keywords: the
        earlier due time applies (as a gRPC deadline beside a `timeout`), and two priorities
        must agree. Either one None is not given (Python's way to say so): `_request` left it
        out.

        NOTE: they were ignored, a bad one too ("x", -1), and `parameters={"timeout": 1}` ran
        as a request without a due time, where the README says the parameters are the
        request's, as over HTTP and gRPC. Then `{"timeout": None}` was no timeout while
        `{"priority": None}` was refused ("got null"); over the wire both are refused now."""
        timed = due_from_timeout_us(parameters, self.clock.now_ns())
        if timed is not None and (due is None or timed < due):
            due = timed
        asked = priority_of(parameters)
        if asked and priority and asked != priority:
            raise InvalidInput(
                f"priority: the keyword says {priority} and request parameter 'priority' says "
                f"{asked}; give one of them (or the same level in both)"
            )
        return due, asked or priority

    # -- synchronous use -----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        repository: str | Path,
        *,
        clock: Clock | None = None,
        options: RepositoryOptions | None = None,
    ) -> Engine:
        """An engine whose loop runs on a private thread, for synchronous callers; `close()` it."""
        engine = cls(clock=clock, options=options)
        engine._python_words = True
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        engine._thread = threading.Thread(
            target=engine._run_loop, args=(_repository_path(repository), started),
            name="duetime-engine",
            daemon=True,
        )  # fmt: skip
        engine._thread.start()
        try:
            started.result()
        except BaseException:
            engine._abandon()
            raise
        _OPEN.add(engine)
        return engine

    def _abandon(self) -> None:
        """`open()` given up (Ctrl-C while it loaded, or its load failed): its load cancelled,
        what it started closed, its loop thread ended.

        NOTE: a KeyboardInterrupt while `open()` waited left an engine nobody could close: its
        loop thread and instance threads ran on, loading the repository's remaining models."""
        with self._sync_lock:
            self._closed = True
            loop, opening, serving = self._loop, self._opening, self._serving
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # (the loop has closed: its thread is done)
                if serving:
                    loop.call_soon_threadsafe(loop.stop)
                elif opening is not None:
                    loop.call_soon_threadsafe(opening.cancel)
        assert self._thread is not None
        self._thread.join()
        self._shut.set()

    def _run_loop(self, repository: Path, started: concurrent.futures.Future[None]) -> None:
        from duetime.loops import new_event_loop

        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        with self._sync_lock:  # (against `_abandon`: the load it cancels, or none)
            self._loop = loop
            opening = self._opening = loop.create_task(self.load_repository(repository))
        try:
            if self._closed:
                opening.cancel()
            loop.run_until_complete(opening)
        except BaseException as exc:
            started.set_exception(exc)
            with contextlib.suppress(Exception):  # (models a cancelled load had started)
                loop.run_until_complete(self.aclose())
            loop.close()
            return
        finally:
            self._opening = None
        with self._sync_lock:
            self._serving = not self._closed
        if not self._serving:  # (abandoned as the load ended)
            loop.run_until_complete(self.aclose())
            loop.close()
            return
        started.set_result(None)
        loop.run_forever()
        loop.run_until_complete(self.aclose(self._grace_s))
        loop.close()

    def close(self) -> None:
        """Stop an engine made by `open()`: drain its models and end its loop thread. Calls
        made meanwhile from other threads end too (answered, or ModelUnavailable); closing a
        closed engine does nothing; a `close()` while another thread closes it waits until
        it is closed. An engine made by `start()` is closed by `await aclose()` on its loop;
        where that loop has ended without it, `close()` (or `aclose()` on another loop) stops
        its model threads and its loader, with nothing to drain (RuntimeError while the loop
        lives). An `Engine()` that serves no repository has nothing to close.

        NOTE: a second close() from another thread returned at once, the first still draining
        (the engine's loop thread alive): a caller could not rely on close() meaning closed.
        NOTE: a model load under way is failed at once, but its loader thread finishes building
        the ONNX Runtime session it started (which cannot be interrupted: 0.8-1.3 s for a 200 MB
        model, measured by a tester), then ends, loading nothing more."""
        self._close(CLOSE_GRACE_S)

    def _close(self, grace_s: float) -> None:
        """`close()`, its models drained for up to `grace_s` (that of `aclose` awaited off the
        engine's loop: see there)."""
        thread, loop = self._thread, self._loop
        if thread is None:
            if loop is None or loop.is_closed():
                self._close_orphaned()
                return
            raise RuntimeError("close() is for engines made by Engine.open(); await aclose()")
        assert loop is not None  # (an open() engine's loop thread runs its loop)
        with self._sync_lock:
            closing = self._closed
            self._closed = True
            if not closing:
                self._grace_s = grace_s
        if closing:
            if not self._forked and threading.current_thread() is not thread:
                self._shut.wait()  # (closed by another thread: done when it is)
            return
        try:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
        finally:
            closed = ModelUnavailable("the engine closed before answering; open a new one")
            for waiting in list(self._waiting):  # (handed over as the loop stopped: never taken)
                if not waiting.done():
                    waiting.set_exception(closed)
            self._shut.set()

    def __del__(self) -> None:
        """An engine made by `start()` collected unclosed (a program that failed between its
        start and its `aclose()`): its models' threads are told to stop, and the log says so.

        NOTE: its instance threads and sessions ran on for the life of the process, and nothing
        said why (5 forgotten engines: 5 threads, +21 MB; found by a tester). Stopped, not
        joined: the collector may run this on any thread, one of those too."""
        if getattr(self, "_loop", None) is None or self._thread is not None:
            return
        if self._closed or self._closing or sys.is_finalizing():  # (at exit: all goes)
            return
        with contextlib.suppress(Exception):  # (modules half torn down, say)
            log.warning(
                "an Engine was collected without aclose(): its models' threads stop now; close "
                "engines with `await engine.aclose()` or `async with await Engine.start(...)`"
            )
            self._close_orphaned(wait=False)

    def _close_orphaned(self, *, wait: bool = True) -> None:
        """Close an engine made by `start()` whose loop ended without `aclose()` (or one that
        never served): nothing can run on that loop again, and nothing can be waiting on it
        (its futures ended with it). Its loader stops and its models' instance threads and
        sessions close; closing it again does nothing.

        NOTE: nothing could close it: `close()` was for `open()` engines and `aclose()` for
        its loop, which had ended, and its threads and ORT sessions stayed for the life of the
        process (5 engines forgotten by `asyncio.run(main())`: +10 threads, +129 MB; found by
        a tester)."""
        with self._sync_lock:
            if self._closed:
                return
            self._closing = self._closed = True
        executors = []
        if self.manager is not None:
            executors += [d.model.executor for d in self.manager.abandon()]
        executors += [d.model.executor for d in self.registry.clear()]
        for executor in executors:
            if wait:
                executor.close()
            else:
                executor.stop()

    def __enter__(self) -> Engine:
        """`with Engine.open(repo) as engine:`, closed (`close`) at the end; an engine made by
        `start()` is refused here (RuntimeError), before the block runs: its close is awaited
        (`async with`).

        NOTE: the block ran, and its end raised "close() is for engines made by Engine.open()"
        in place of the block's own exception, the engine left open (found by a tester)."""
        if self._thread is None and self._loop is not None and not self._loop.is_closed():
            raise RuntimeError(
                "`with` is for engines made by Engine.open(); an engine made by Engine.start() "
                "is closed on its loop: `async with await Engine.start(repo) as engine:`"
            )
        return self

    async def __aenter__(self) -> Engine:
        """`async with await Engine.start(repo) as engine:`, closed (`aclose`) at the end."""
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._thread is not None:  # (made by open(): its own loop thread stops it)
            await in_thread(self.close)
        else:
            await self.aclose()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


SHUTTING_DOWN = "the server is shutting down; retry on another replica"
"""Why a request waiting for its model's load fails at `aclose` (as the registry words it)."""

NO_DUE_BEYOND_NS = MAX_DUE_US * 1000
"""A timeout longer than this (11.6 days; infinity too) sets no due time, as a `timeout`
parameter over MAX_DUE_US does over HTTP and gRPC (it was a century here)."""

_OPEN: weakref.WeakSet[Engine] = weakref.WeakSet()
"""Engines made by `open()` and not closed yet."""


CLOSED = "the engine is closed"
"""Why a closed engine's index lists each version UNAVAILABLE."""


def _default_timeout_ns(directory: Path) -> int | None:
    """The `default_timeout_ms`, in ns, of the model whose config file is in `directory`, read
    before the model loads (None: none, or a config that cannot be read now: its load reports
    that). Its warnings are left to the load, which logs them."""
    try:
        timeout_ms = read_model_config(directory).config.default_timeout_ms
    except (DuetimeError, OSError, ValueError):
        return None
    return None if timeout_ms is None else int(timeout_ms * 1e6)


ANSWERS_CACHED = 1024
"""Models whose answer estimates `Engine` keeps per registry snapshot."""


@dataclass(frozen=True, slots=True)
class _Answers:
    """What a model's answers are expected to weigh (see `Engine.answer_guess`)."""

    guess: int | None
    sizes: tuple[OutputSizes, ...] | None
    class_bytes: float


def _answers_of(snapshot: Snapshot, model: str) -> _Answers:
    """`model`'s answer estimates over every deployment that may answer it."""
    served = snapshot.models.get(model)
    if served is None:
        return _Answers(None if model in snapshot.loading else 0, None, 1.0)
    deployments = [d for version in served.versions.values() for d in version.variants]
    guesses = [d.scheduler.answer_guess for d in deployments]
    sizes = [d.model.output_sizes for d in deployments]
    class_bytes = max(
        (
            classification.max_class_bytes(spec.datatype, d.model.labels.get(spec.name, ()))
            / NUMPY_OF[spec.datatype].itemsize
            for d in deployments
            for spec in d.model.signature.outputs
            if spec.datatype != "BYTES"
        ),
        default=1.0,
    )
    return _Answers(
        None if None in guesses else max(g for g in guesses if g is not None),
        None if None in sizes else tuple(s for s in sizes if s is not None),
        max(1.0, class_bytes),
    )


def _closed_entry(entry: IndexEntry) -> IndexEntry:
    """`entry` of a closed engine's index: a version that was loaded, loading or unloading is
    UNAVAILABLE now, for that reason (see `Engine.repository_index`)."""
    if entry.get("state") in (None, "UNAVAILABLE"):
        return entry
    return {**entry, "state": "UNAVAILABLE", "reason": CLOSED}


def _unsettled(ticket: Ticket, task: asyncio.Task[None]) -> None:
    """Fail `ticket` if `task`, which was to settle it (or have its request's settle it),
    ended otherwise: cancelled by `aclose` (perhaps before it ever ran) while the model
    loaded, or failed on a bug of ours."""
    if ticket.future.done():
        return
    if task.cancelled():
        error: DuetimeError = ModelUnavailable(f"model '{ticket.model}': {SHUTTING_DOWN}")
    else:
        fault = task.exception()
        if fault is None:
            return  # (its request is queued: the scheduler settles it)
        error = InternalError(f"internal error while loading '{ticket.model}': {fault!r}")
    ticket.future.set_exception(error)
    ticket._settled()


def _wanted(produced: Feeds, wanted: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The outputs `wanted` of those a run `produced`, in the order asked for."""
    if tuple(produced) == wanted:  # all of them, in order (the usual): a copy, no frame
        return dict(produced)
    return {name: produced[name] for name in wanted}


def _answered_alone(
    routed: Routed, request: InferRequest, deliver: Callable[[Feeds], object] | None = None
) -> Feeds | DuetimeError | None:
    """An in-process request run within this call by its scheduler's lean path
    (`ModelScheduler.answer_alone`): its outputs, or the error its run ended in; None where
    that path does not apply (nothing was done: it is queued as any request).

    NOTE: only a request that nothing else follows: no classification, not traced, no variant
    to hand it to, no shadow to mirror it to. It makes no ticket, future or queue record (see
    `answer_alone`); its admission (a due time), errors and statistics are a queued request's."""
    if (
        request.classes
        or request.timing is not None
        or len(routed.version.variants) > 1
        or routed.served.traffic.shadows
    ):
        return None
    prepared = routed.prepared
    return routed.deployment.scheduler.answer_alone(
        prepared.feeds,
        prepared.rows,
        due_ns=routed.due_ns,
        priority=request.priority,
        arrival_ns=request.arrival_ns,
        deliver=deliver,
        by_default=routed.by_default,
    )


def _alone_response(routed: Routed, outputs: Feeds) -> InferResponse:
    """The answer to a request `_answered_alone` ran, whose run gave `outputs`."""
    deployment = routed.deployment
    model = deployment.model
    wanted = _wanted(outputs, routed.prepared.outputs)
    for name in routed.prepared.units:
        if name in wanted:
            wanted[name] = wanted[name][..., None]  # (see `Ticket.units`)
    return InferResponse(model.name, model.version, "", wanted, deployment.variant)


def _cheaper(variants: Sequence[Deployment], deployment: Deployment) -> Deployment | None:
    """The variant after `deployment` in quality order (None: it is the cheapest)."""
    index = variants.index(deployment)
    return variants[index + 1] if index + 1 < len(variants) else None


def _hand_down(
    ticket: Ticket,
    variants: tuple[Deployment, ...],
    priority: int,
    item: QueuedRequest,
    now: int,
) -> bool:
    """`ticket`'s request (`item`), which the variant holding it (`ticket.variant`) can no
    longer answer in time, taken over by the best cheaper variant that still can (its `fits`),
    which then answers it; False if none can (it fails as it would have). The request's
    `fallback`: see `_submit`."""
    held = next(i for i, d in enumerate(variants) if d.variant == ticket.variant)
    for deployment in variants[held + 1 :]:
        if deployment.scheduler.take_over(item, priority, now):
            ticket.variant = deployment.variant
            return True
    return False


@atexit.register
def _close_open_engines() -> None:
    """Close what `open()` made and was left open as the interpreter exits.

    NOTE: its instance threads are daemons: killed in the middle of an ONNX Runtime run, they
    abort the whole process ("terminate called without an active exception", exit 134)."""
    for engine in list(_OPEN):
        with contextlib.suppress(Exception):
            engine.close()


def _after_fork() -> None:
    """In a forked child, the engines `open()` made have no loop thread: a call would wait for
    it forever. They refuse calls instead, saying why."""
    for engine in list(_OPEN):
        engine._forked = engine._closed = True
        engine._sync_lock = threading.Lock()  # (another thread may have held it at the fork)
    _OPEN.clear()  # (nothing to close at the child's exit)


os.register_at_fork(after_in_child=_after_fork)


def _answer(
    result: concurrent.futures.Future[_T], outputs: _T | None, error: BaseException | None
) -> None:
    """Settle `result` unless its caller cancelled it meanwhile (from its own thread: checking
    first would race). Called on the loop, from the scheduler's settling of a whole batch, where
    an exception would leave the batch's other requests unsettled."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is None:
            result.set_result(outputs)  # type: ignore[arg-type]
        else:
            result.set_exception(error)


_running_loop: Callable[[], asyncio.AbstractEventLoop | None] = asyncio._get_running_loop
"""The running loop of this thread, None where none runs.

NOTE: asyncio's own (C) function, not `get_running_loop` wrapped in a try: that was a Python
frame and a try on every in-process call, twice for an engine made by `open()`."""


def _check_files(files: object) -> None:
    """TypeError unless `files` maps paths (str) to contents (bytes-like), naming `files`.

    NOTE: a list of pairs, a str content or an int key failed deep in the load with "'list'
    object has no attribute 'items'", "memoryview: a bytes-like object is required, not 'str'"
    or "'int' object has no attribute 'removeprefix'", naming no argument (found by a tester)."""
    if not isinstance(files, Mapping):
        raise TypeError(
            "files: expected a mapping of path in the model folder -> content (bytes), such as "
            f"{{'1/model.onnx': data}}, or None; got {type(files).__name__}"
        )
    for key, content in files.items():
        if not isinstance(key, str):
            raise TypeError(
                "files: expected paths in the model folder (str) as keys, such as "
                f"'1/model.onnx'; got {type(key).__name__} {key!r:.80}"
            )
        try:
            memoryview(content).release()
        except TypeError:
            raise TypeError(
                f"files[{key!r:.200}]: expected the file's content as bytes (or bytearray, "
                f"memoryview); got {type(content).__name__}"
            ) from None


def _repository_path(repository: str | os.PathLike[str]) -> Path:
    """`repository` as a path; ConfigError if it is empty.

    NOTE: `Path("")` is the current directory: `Engine.open("")` (an unset variable's
    default, say) served it, every folder there a model UNAVAILABLE, where a missing path
    fails with ConfigError."""
    if isinstance(repository, str | bytes) and not repository:
        raise ConfigError(
            "model repository: the path is empty; give the repository's folder ('.' for the "
            "current directory)"
        )
    return Path(repository)


def _waited(result: concurrent.futures.Future[_T]) -> _T:
    """`result`'s outcome, waited for on this thread; a wait given up (KeyboardInterrupt, say)
    cancels `result`, which withdraws its request or cancels its work on the engine's loop.

    NOTE: `.result()` alone left a blocking `infer` interrupted by Ctrl-C running: its run went
    on to its end, and the next 1 ms infer waited 8.4 s behind it (27.9 s with a longer run),
    where a cancelled `infer_async` stops it in ~0.1 s."""
    try:
        return result.result()
    except BaseException:
        result.cancel()  # (does nothing to a settled one)
        raise


def _for_the_request(error: DuetimeError, model: str) -> DuetimeError:
    """`error`, which ended a request waiting for its model's on-demand load, in the words of a
    request for a model not served: a load's own failure ("failed to load 'x': ...", a load
    request's words) starts with Triton's ("Request for unknown model: 'x' has no available
    versions: ..."), keeping its Retry-After; others as they are.

    NOTE: a request refused because the loaded-models budget was full got the load request's
    words, which a Triton client does not look for (found by a tester)."""
    if not isinstance(error, ModelUnavailable) or not error.message.startswith(
        f"failed to load '{model}'"
    ):
        return error
    return ModelUnavailable(
        f"{UNKNOWN_MODEL}'{model}' has no available versions: {error.message}",
        retry_after_s=error.retry_after_s,
    )


def _started_elsewhere(name: str, loop: asyncio.AbstractEventLoop | None) -> RuntimeError:
    """The error of a call awaited off the loop of an engine made by `Engine.start` (`loop`;
    None: an `Engine()` that serves no repository yet)."""
    if loop is None:
        return RuntimeError(
            f"this engine serves no repository yet: make one with Engine.open(repository), or "
            f"await Engine.start(repository) on your loop, before {name}"
        )
    return RuntimeError(
        f"this engine runs on the loop that started it (Engine.start); await {name} there, or "
        "make an engine for many loops with Engine.open()"
    )


async def settled(future: asyncio.Future[Feeds]) -> None:
    """Wait until `future` is done, without raising its exception here (read it with
    `Ticket.failure`); cancelling the wait cancels `future`.

    NOTE: an awaited exception is raised into this frame, and its traceback would then hold the
    caller's frames, which hold the future that holds the exception: a cycle (see
    `Ticket.failure`). Clearing the traceback breaks it."""
    try:
        await future
    except asyncio.CancelledError:
        future.cancel()
        raise
    except BaseException as exc:
        exc.__traceback__ = None


def _contiguous(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`inputs` with each numeric array that ONNX Runtime cannot take as it is (not C-ordered,
    or not in this machine's byte order) copied into one that it can, on the calling thread;
    InvalidInput naming the input where there is no memory for the copy.

    NOTE: the copy was made as the engine's loop checked the request: a transposed 120 MB array
    held every other caller's requests, on every model, for 3 s, and a zero-stride view of
    8 GB (a few bytes of memory) for 43 s (found by a tester). The caller's thread pays for
    its own copy now, before its request is handed to the loop (its time counts against its
    due time, as the copy's did there)."""
    feeds = dict(inputs)
    for name, array in feeds.items():
        # (subclasses too: a transposed np.memmap was copied on the loop still, a tester saw)
        if not isinstance(array, np.ndarray) or (array.flags.c_contiguous and array.dtype.isnative):
            continue
        if array.dtype.kind not in "biufc":  # (strings and objects: the checks' to judge)
            continue
        try:
            feeds[name] = c_ordered(array)
        except MemoryError:
            raise InvalidInput(
                f"input '{name}': no memory to copy the array ({array.nbytes} bytes, shape "
                f"{array.shape}) into the C-ordered one ONNX Runtime takes"
            ) from None
    return feeds


def _seconds(timeout: float) -> float:
    """A timeout that is not a float (an int, a numpy scalar) as one: infinite past a float's
    range (beyond any due time, so none)."""
    try:
        return float(timeout)
    except OverflowError:
        return float("inf")
