"""The thread boundary: each model instance is a thread that owns one ONNX Runtime session.

The event loop hands a `BatchJob` to an instance with `Executor.submit`; the instance gathers the
inputs, runs the session (ORT releases the GIL), splits the outputs per request and hands a
`BatchResult` back with `loop.call_soon_threadsafe`. Instance threads never touch scheduler state.
An inline executor (one instance, no thread) runs a job on the loop itself with `run_now`.

Each instance's runs share one `onnxruntime.RunOptions`: `close` sets its `terminate`, so a run
still going when the server stops ends between two nodes, and its requests are told so;
`terminate` does so for one instance's current run (its requests past their due times, or
withdrawn), and the flag is reset before that instance's next run.
"""

from __future__ import annotations

import asyncio
import atexit
import copy
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from duetime.errors import DuetimeError, InvalidInput, ModelOutputError, ModelUnavailable
from duetime.execution.affinity import (
    BACKGROUND_NICENESS,
    lower_thread_priority,
    pin_current_thread,
)
from duetime.execution.ort import (
    Run,
    bfloat16_run,
    direct_run,
    out_of_memory,
    strings_from_ort,
)
from duetime.execution.turns import Turns

log = logging.getLogger("duetime.executor")

Feeds = dict[str, np.ndarray]


class Unreturned(dict[str, np.ndarray]):
    """A request's outputs but those ONNX Runtime's Python API could not return (string
    outputs holding bytes that are not UTF-8), and the error a client asking for one of those
    gets (`error_for`).

    NOTE: the run failed for every output: a client asking for a BOOL output beside a string
    output it did not ask for, whose bytes were not UTF-8, got 500 where ONNX Runtime asked for
    that BOOL output alone answers (found by a tester)."""

    __slots__ = ("error", "missing")

    def __init__(self, outputs: Feeds, missing: frozenset[str], error: DuetimeError) -> None:
        super().__init__(outputs)
        self.missing = missing
        self.error = error

    def error_for(self, wanted: Iterable[str]) -> DuetimeError | None:
        """The error of a request for the outputs `wanted` (a copy), if one is missing."""
        if any(name in self.missing for name in wanted):
            return copy.copy(self.error)
        return None


class Settles(Protocol):
    """What an instance thread needs of a request's future: whether it is settled already."""

    def done(self) -> bool: ...


@dataclass(slots=True, eq=False)
class BatchJob:
    """Requests to run together: their inputs and rows (all share the non-batch dims)."""

    feeds: list[Feeds]
    rows: list[int]
    bucket: int
    """Rows ORT runs: the batch is padded up to this size (0: the model does not batch)."""
    on_done: Callable[[BatchResult], None]
    """Called on the event loop with the result."""
    turn: tuple[Turns, int] | None = None
    """Its place among the batches of the instance threads sharing its CPU (None: runs at once)."""
    hold_s: float | None = None
    """How long its run holds its `turn` at most, as it was taken (`Turns.take`) before the
    next batch runs beside it (None: no turn, or `turns.STUCK_S`)."""
    start_by: tuple[Callable[[], int], int] | None = None
    """A clock and the last instant on it at which running still helps: a thread that takes the
    job later skips it (`BatchResult.skipped`). None: it always runs."""
    revoked: bool = False
    """Set by the loop while the job waits for its thread: the thread skips it
    (`BatchResult.skipped`) and the loop plans its requests again."""
    futures: Sequence[Settles] = ()
    """The requests' futures, in the order of `feeds` (empty: not known, all run). A request
    whose future is done when its thread takes the job (its client withdrew it, or the loop
    failed it) is not run (`BatchResult.withdrawn`); if none is left, the job is skipped."""


@dataclass(slots=True, eq=False)
class BatchResult:
    """What one execution produced: per request, either its outputs or the error it caused."""

    job: BatchJob
    instance: int
    outputs: Sequence[Feeds | DuetimeError] = ()
    """(A tuple until it ran: a list made for every result, and replaced, was an allocation and
    a call of the default factory per batch.)"""
    compute_ns: int = 0
    """Time inside `session.run`, summed over runs (an isolated retry runs more than once)."""
    input_ns: int = 0
    """Time gathering the requests' inputs into the batch ORT runs (copying them into the
    pooled buffer, padding included): Triton's compute_input."""
    output_ns: int = 0
    """Time splitting the outputs per request (and decoding string outputs): Triton's
    compute_output."""
    waited_ns: int = 0
    """Time its thread waited for its turn on a shared CPU (see `BatchJob.turn`)."""
    skipped: bool = False
    """Not run (no outputs): revoked, taken after `BatchJob.start_by`, or every request of it
    already settled (`withdrawn`)."""
    withdrawn: int = 0
    """Requests of the job not run because their futures were done when its thread took it; their
    outputs are empty (the loop finds their futures done, and answers nothing)."""
    terminated: bool = False
    """Its run was stopped by `Executor.terminate` before it ended: every output is an error,
    and its times tell nothing of the model."""
    alone: list[tuple[int, int] | None] | None = None
    """Where its requests ran one by one (`Executor._each_alone`: a batch that failed, or a model
    whose batches cannot be split), each one's own run's time in ONNX Runtime and splitting its
    outputs (None: not run); None where they ran as one batch. Its statistics count each run
    that answered as an execution of that request's rows, not the batch as one."""


class _Stop:
    """Tells an instance thread to finish (queued after any pending job)."""


class LoadAbandoned(BaseException):
    """A load's warm-up or profiling was stopped: nobody waits for the load any more (its
    manager closed). A BaseException, as the load's own handlers of model errors must let it
    through."""


_LOADING = threading.local()
"""The calling thread's `abandoned` event, where `abandon_with` gave it one."""


def abandon_with(event: threading.Event) -> None:
    """Have `run_sync` on the calling thread (a loader's) raise LoadAbandoned once `event` is
    set.

    NOTE: a load its manager's close abandoned went on warming up and profiling for seconds
    (7.8 s of CPU for a model nobody would serve), and, on a non-daemon thread, held the
    process's exit that long (found by a tester). It now stops at its next run."""
    _LOADING.abandoned = event


class Executor:
    """The instance threads of one model version, with ORT sessions they own exclusively."""

    def __init__(
        self,
        sessions: Sequence[Any],
        *,
        output_names: Sequence[str],
        string_outputs: frozenset[str],
        batched: bool,
        label: str,
        inline: bool = False,
        splits_batches: bool = False,
        output_shapes: Mapping[str, tuple[int, ...]] | None = None,
        named: str | None = None,
    ) -> None:
        """`output_shapes`: the outputs answers give in another shape than the graph's (a
        config's `reshape`), by name: that shape, without the batch dim. `named`: the model as
        errors to clients name it (`'m' version 1`; `label`, its threads' name, where not
        given: a tester read 'hugeexp-1' as no model's name)."""
        if inline and len(sessions) != 1:
            raise ValueError(f"an inline executor has one session, got {len(sessions)}")
        self.inline = inline
        """Run on the event loop itself (ModelConfig.execution 'inline'): no instance thread."""
        self.splits_batches = splits_batches
        """Each request runs on its own, at its own rows, whatever batches it is handed (see
        `_execute`): the loader knew the model's outputs do not follow a batch (an output sized
        by the values: Unique, NonZero, TopK of a count read from an input), or a run showed
        it. A batch's answers, or a padded one's, cannot be told apart. A scheduler may read it
        to stop forming batches of this model."""
        self._pool = InputPool()
        self._sessions = list(sessions)
        # NOTE: one RunOptions per instance, reused by each of its runs (ORT documents reuse:
        # `terminate` is checked between nodes of the runs given it, and stays set): one made per
        # run would cost an allocation per batch, and `close` would have to find the live ones
        self._run_options = [ort.RunOptions() for _ in self._sessions]
        self._runs = [
            direct_run(session, options)
            for session, options in zip(self._sessions, self._run_options, strict=True)
        ]
        self._sync_runs: dict[int, Run] = {}
        """`run_sync`'s run of each instance: the public `session.run`, checking its feeds,
        with BF16 tensors as numpy arrays. NOTE: made once each: made at each call (2.4 µs for
        mlp, whose run takes 15.6), they were timed into the load's latency profile."""
        self._output_names = list(output_names)
        self._string_outputs = string_outputs
        self._output_shapes = dict(output_shapes or {})
        self._batched = batched
        self._label = label
        self._named = named or label
        self._closing = False
        self._split_lock = threading.Lock()
        self._stop_lock = threading.Lock()
        """Guards `_current`, `_stopping` and the run options' `terminate` (see `terminate`)."""
        self._current: list[BatchJob | None] = [None] * len(self._sessions)
        """The job each instance's thread runs now (None: none)."""
        self._stopping = [False] * len(self._sessions)
        """`terminate` stopped the instance's current run: its thread resets the flag after it."""
        self._queues: list[queue.SimpleQueue[BatchJob | _Stop]] = []
        self._threads: list[threading.Thread] = []

    @property
    def instances(self) -> int:
        return len(self._sessions)

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        cpus: Sequence[frozenset[int] | None] = (),
        *,
        background: bool = False,
    ) -> None:
        """Start one thread per instance, pinned to `cpus[i]` where given; `background` threads
        (a shadow version's) run at the lowest CPU priority, so they take only the time real
        traffic leaves over."""
        if self.inline:
            return
        for index, run in enumerate(self._runs):
            jobs: queue.SimpleQueue[BatchJob | _Stop] = queue.SimpleQueue()
            pinned = cpus[index] if index < len(cpus) else None
            thread = threading.Thread(
                target=self._serve,
                args=(index, run, jobs, loop, pinned, background),
                name=f"duetime-{self._label}-i{index}",
                daemon=True,
            )
            self._queues.append(jobs)
            self._threads.append(thread)
            thread.start()
        _STARTED.add(self)

    def submit(self, instance: int, job: BatchJob) -> None:
        """Queue `job` on one instance's thread; the scheduler submits only to an idle instance.
        `job.on_done` gets the result on the loop."""
        self._queues[instance].put(job)

    def run_now(self, instance: int, job: BatchJob) -> BatchResult:
        """Inline: run `job` on the calling thread (the loop) and return its result."""
        result = BatchResult(job, instance)
        self._execute(self._runs[instance], job, result, self._pool)
        return result

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the threads and drop the sessions. A run still going is terminated (ORT stops
        between two nodes) and jobs still queued are not run: their requests get
        ModelUnavailable, handed back to the loop as any result.

        NOTE: the scheduler has drained for its grace period before this is called. A run that
        outlasted it (25 s of a Loop) kept its thread inside ORT past the join's timeout, and the
        process exited under it: SIGABRT ("terminate called without an active exception"), and
        its client got no answer at all."""
        self.stop()
        for index, thread in enumerate(self._threads):
            thread.join(timeout_s)
            if thread.is_alive():  # (one node that runs for long: ORT checks between nodes)
                log.warning(
                    "model %s instance %d: its run did not stop within %.1f s of the close",
                    self._label, index, timeout_s,
                )  # fmt: skip
        self._sessions.clear()
        self._runs.clear()
        self._sync_runs.clear()  # (each holds its session)
        _STARTED.discard(self)

    def stop(self) -> None:
        """Tell the threads to stop (a run going on is terminated, jobs queued are not run), not
        waiting for them: each ends on its own, and its session goes with the executor (see
        `close`, which waits)."""
        self._closing = True
        for options in self._run_options:
            options.terminate = True
        for jobs in self._queues:
            jobs.put(_Stop())

    def terminate(self, instance: int, job: BatchJob) -> bool:
        """Stop `job`'s run if `instance`'s thread runs it now: ORT ends it between two nodes,
        and its result comes back `terminated` (unless it ended first, with its outputs). False
        if the thread does not run it now (not taken yet, or over), or stops it already.
        Called from the loop; the thread resets the options' `terminate` before its next run.

        NOTE: the instance's RunOptions is shared by its runs (see `__init__`), and ORT keeps
        `terminate` set: left set, every later run of the instance would fail at once."""
        with self._stop_lock:
            if self._closing or self._stopping[instance] or self._current[instance] is not job:
                return False
            self._stopping[instance] = True
            self._run_options[instance].terminate = True
        return True

    def _stopped_error(self) -> ModelUnavailable:
        return ModelUnavailable(
            f"model {self._named}: this run was stopped: its requests were past their due "
            "times or withdrawn by their clients"
        )

    def run_sync(self, feeds: Feeds, instance: int = 0) -> list[np.ndarray]:
        """Run one set of feeds on the calling thread (load-time warm-up and profiling only);
        LoadAbandoned once the loads of the calling thread are abandoned (see `abandon_with`)."""
        abandoned: threading.Event | None = getattr(_LOADING, "abandoned", None)
        if abandoned is not None and abandoned.is_set():
            raise LoadAbandoned
        run = self._sync_runs.get(instance)
        if run is None:
            session = self._sessions[instance]
            run = self._sync_runs[instance] = bfloat16_run(session, session.run)
        return list(run(self._output_names, feeds))

    def _serve(
        self,
        index: int,
        run: Run,
        jobs: queue.SimpleQueue[BatchJob | _Stop],
        loop: asyncio.AbstractEventLoop,
        cpus: frozenset[int] | None,
        background: bool,
    ) -> None:
        pin_current_thread(cpus)
        if background:
            lower_thread_priority(BACKGROUND_NICENESS)
        pool = InputPool()
        while True:
            job = jobs.get()
            if isinstance(job, _Stop):
                return
            result = BatchResult(job, index)
            if job.turn is None:
                self._execute_stoppable(index, run, job, result, pool)
            else:
                turns, ticket = job.turn
                waiting = time.perf_counter_ns()
                turns.wait(ticket)
                result.waited_ns = time.perf_counter_ns() - waiting
                try:
                    self._execute_stoppable(index, run, job, result, pool)
                finally:
                    turns.done(ticket)
            try:
                loop.call_soon_threadsafe(job.on_done, result)
            except RuntimeError:  # the loop closed under us: nobody is waiting any more
                return
            # NOTE: kept while the thread waits for its next job, the last job's inputs and
            # outputs stayed resident after their answer was sent: 960 MB after a big answer,
            # until the model's next request (found by a tester)
            del job, result

    def _execute_stoppable(
        self, index: int, run: Run, job: BatchJob, result: BatchResult, pool: InputPool
    ) -> None:
        """`_execute_in_time`, as the instance's current job (see `terminate`)."""
        with self._stop_lock:
            self._current[index] = job
        try:
            self._execute_in_time(run, job, result, pool)
        finally:
            with self._stop_lock:
                self._current[index] = None
                stopped = self._stopping[index]
                if stopped:
                    self._stopping[index] = False
                    if not self._closing:  # (`close` keeps it set: no run after it)
                        self._run_options[index].terminate = False
        if stopped and not result.skipped and not _answered(result.outputs):
            result.terminated = True
            result.outputs = [self._stopped_error()] * len(job.feeds)

    def _execute_in_time(
        self, run: Run, job: BatchJob, result: BatchResult, pool: InputPool
    ) -> None:
        """Run `job` as its thread takes it, unless running it no longer helps anyone."""
        if self._closing:
            result.outputs = [self._closed_error()] * len(job.feeds)
            return
        start_by = job.start_by
        if job.revoked or (start_by is not None and start_by[0]() > start_by[1]):
            result.skipped = True
            return
        if not job.futures:
            self._execute(run, job, result, pool)
            return
        live = _unsettled(job.futures)
        if len(live) == len(job.feeds):
            self._execute(run, job, result, pool)
            return
        # NOTE: a job waits on its thread behind the running one (a lookahead batch), and its
        # clients may withdraw meanwhile: a cancelled 300-row run delayed the next request by
        # 300-600 ms and counted as an execution. Settled requests are not run; a job left with
        # none is skipped (no execution), as one whose start_by passed.
        result.withdrawn = len(job.feeds) - len(live)
        if not live:
            result.skipped = True
            return
        self._execute_some(run, job, live, result, pool)

    def _execute_some(
        self, run: Run, job: BatchJob, live: list[int], result: BatchResult, pool: InputPool
    ) -> None:
        """Run the requests of `job` at indices `live` only; the others get empty outputs.

        NOTE: padded to the job's bucket still: it may be the only size a model with a fixed
        batch dim takes, and the scheduler planned (and learns) the run at that bucket."""
        rest = BatchJob(
            [job.feeds[i] for i in live], [job.rows[i] for i in live], job.bucket, job.on_done
        )
        self._execute(run, rest, result, pool)
        outputs: list[Feeds | DuetimeError] = [{} for _ in job.feeds]
        for index, outcome in zip(live, result.outputs, strict=True):
            outputs[index] = outcome
        result.outputs = outputs
        if result.alone is not None:
            alone: list[tuple[int, int] | None] = [None] * len(job.feeds)
            for index, times in zip(live, result.alone, strict=True):
                alone[index] = times
            result.alone = alone

    def _execute(self, run: Run, job: BatchJob, result: BatchResult, pool: InputPool) -> None:
        # whether it runs rows other than one request's own: several requests, or padding
        sizes = job.rows
        shared = len(sizes) > 1 or (job.bucket != 0 and job.bucket != sizes[0])
        if shared and self.splits_batches:
            result.outputs = self._each_alone(run, job, result)
            return
        try:
            # NOTE: one clock read between stages: each ends where the next begins
            started = time.perf_counter_ns()
            # (a lone request at its own rows runs its feeds as they are: `gather`'s own test,
            # made here already, without its frame)
            feeds = pool.gather(job.feeds, job.rows, job.bucket) if shared else job.feeds[0]
            gathered = time.perf_counter_ns()
            result.input_ns = gathered - started
            try:
                outputs = run(self._output_names, feeds)
            except Exception:
                # NOTE: a failed run took its time too: left out, every failed execution
                # showed in duetime_compute_duration_seconds with 0 s (found by a tester)
                result.compute_ns += time.perf_counter_ns() - gathered
                raise
            ran = time.perf_counter_ns()
            result.compute_ns += ran - gathered
            if not shared and feeds:
                # (a lone request that was not padded gets its outputs whole, whatever their
                # shape: it ran its own rows, so there is nothing to check, nor to trim)
                result.outputs = self._split(outputs, job.rows, trim=False)
                result.output_ns += time.perf_counter_ns() - ran
                return
            rows = len(next(iter(feeds.values()))) if self._batched and feeds else None
            misfit = None if rows is None else _misfit(self._output_names, outputs, rows)
            if misfit is not None:
                self._stop_batching(misfit, outputs, rows)
                result.outputs = self._each_alone(run, job, result)
                return
            result.outputs = self._split(outputs, job.rows, trim=misfit is None)
            result.output_ns += time.perf_counter_ns() - ran
        except Exception as exc:
            if self._closing:
                result.outputs = [self._closed_error()] * len(job.feeds)
                return
            if self._stopping[result.instance]:  # (stopped: nothing to run each alone)
                result.outputs = [self._stopped_error()] * len(job.feeds)
                return
            if len(job.feeds) == 1:
                result.outputs = [self._run_error(exc, run, job.feeds[0])]
                return
            # NOTE: one request's values can make ORT fail (an index out of range, say); run each
            # alone so that only the request that caused it fails, not the whole batch.
            result.outputs = self._each_alone(run, job, result)

    def _each_alone(
        self, run: Run, job: BatchJob, result: BatchResult
    ) -> list[Feeds | DuetimeError]:
        """Each request of `job` run on its own feeds (no padding), in this thread; each run's
        times in `result.alone`."""
        alone: list[tuple[int, int] | None] = []
        result.alone = alone
        return [
            self._isolated(run, feeds, rows, result, alone)
            for feeds, rows in zip(job.feeds, job.rows, strict=True)
        ]

    def _stop_batching(self, name: str, outputs: list[np.ndarray], rows: int | None) -> None:
        """Run each request of this model alone from now on (`splits_batches`); warn once.

        NOTE: the load-time check runs sample inputs, on which a data-dependent output (Unique
        of random floats) may have the batch's rows; real values then broke every batch that
        held a repeated value with a 500. Each client's request, run alone, has an answer."""
        with self._split_lock:
            if self.splits_batches:
                return
            self.splits_batches = True
        shape = list(outputs[self._output_names.index(name)].shape)
        log.warning(
            "model %s: output '%s' has shape %s for a batch of %s rows: its first dim is not the "
            "batch (its size depends on the values), so batched requests' answers cannot be told "
            "apart; each request now runs on its own (set max_batch_size = 0 to say so)",
            self._label, name, shape, rows,
        )  # fmt: skip

    def _isolated(
        self,
        run: Run,
        feeds: Feeds,
        rows: int,
        result: BatchResult,
        alone: list[tuple[int, int] | None],
    ) -> Feeds | DuetimeError:
        """One request run on its own feeds; its run's times appended to `alone`."""
        before = result.compute_ns
        output_ns = 0
        try:
            outputs = self._run(run, feeds, result)
            ran = time.perf_counter_ns()
            (split,) = self._split(outputs, [rows], trim=False)
            output_ns = time.perf_counter_ns() - ran
            result.output_ns += output_ns
            return split
        except Exception as exc:
            return self._run_error(exc, run, feeds)
        finally:
            alone.append((result.compute_ns - before, output_ns))

    def _closed_error(self) -> ModelUnavailable:
        return ModelUnavailable(
            f"model {self._named}: the server is shutting down (or this version is unloading) "
            "and stopped this request's run; retry, on another replica if there is one"
        )

    def _run_error(self, exc: Exception, run: Run, feeds: Feeds) -> Feeds | DuetimeError:
        """What a request whose run on its own `feeds` raised `exc` gets: an error, or, where
        only string outputs that are not UTF-8 failed it, the other outputs (`Unreturned`)."""
        if self._closing:  # (ORT's "Exiting due to terminate flag": not the request's fault)
            return self._closed_error()
        if isinstance(exc, UnicodeDecodeError):
            return self._without_not_utf8(exc, run, feeds)
        memory = out_of_memory(exc, self._named)
        if memory is not None:
            return memory
        return _run_error(exc)

    def _without_not_utf8(
        self, exc: UnicodeDecodeError, run: Run, feeds: Feeds
    ) -> Unreturned | ModelOutputError:
        """What a run that raised `exc` means: ORT's Python API decodes each string output to
        `str` as UTF-8, and ONNX strings are bytes; the culprits are found by running each
        string output alone (after the failure: no answer waits on it), and the other outputs
        are run again without them, for the clients that did not ask for those."""
        names = [name for name in self._output_names if name in self._string_outputs]
        if len(names) > 1:
            names = [name for name in names if _not_utf8(run, name, feeds)]
        which = " and ".join(f"'{name}'" for name in names) or "a string output"
        error = ModelOutputError(
            f"the model made string output {which} holding bytes that are not valid UTF-8 "
            f"({exc}), which ONNX Runtime's Python API cannot return: a fault of the model, not "
            "of the request"
        )
        others = [name for name in self._output_names if name not in names]
        if not names or not others:
            return error
        try:
            outputs = run(others, feeds)
        except Exception:  # (another failure besides: the request's error stands)
            return error
        named = self._by_name(outputs, others)
        if self._output_shapes:
            self._reshape(named)
        return Unreturned(named, frozenset(names), error)

    def _run(self, run: Run, feeds: Feeds, result: BatchResult) -> list[np.ndarray]:
        started = time.perf_counter_ns()
        try:
            return run(self._output_names, feeds)
        finally:  # (a failed run's time too)
            result.compute_ns += time.perf_counter_ns() - started

    def _split(self, outputs: list[np.ndarray], rows: list[int], *, trim: bool) -> list[Feeds]:
        """Each request's rows of `outputs`, whose first dim is the batch run (padding rows
        included: `trim` drops them from a lone request's) unless there is one request and
        `trim` is False: it gets them whole."""
        if self._string_outputs:
            named = self._by_name(outputs, self._output_names)
        elif len(outputs) == 1:  # (one output, the usual: no zip, whose strict check costs more
            named = {self._output_names[0]: outputs[0]}  # than the dict: 1.2 against 0.14 µs)
        else:  # (no comprehension: its frame costs more than the dict)
            named = dict(zip(self._output_names, outputs, strict=True))
        if len(rows) == 1:
            if trim and self._batched and rows[0] != next(iter(named.values())).shape[0]:
                named = {name: array[: rows[0]] for name, array in named.items()}
            parts = [named]
        else:
            parts = [{} for _ in rows]
            for name, array in named.items():
                start = 0
                for part, count in zip(parts, rows, strict=True):
                    part[name] = array[start : start + count]
                    start += count
        if self._output_shapes:
            for part in parts:
                self._reshape(part)
        return parts

    def _by_name(self, outputs: list[np.ndarray], names: Sequence[str]) -> Feeds:
        """`outputs` of a run asked for `names`, by name, its string outputs as bytes."""
        strings = self._string_outputs
        return {
            name: strings_from_ort(array) if name in strings else array
            for name, array in zip(names, outputs, strict=True)
        }

    def _reshape(self, part: Feeds) -> None:
        """One request's outputs in the shapes answers give (`output_shapes`): views."""
        for name, inner in self._output_shapes.items():
            array = part.get(name)
            if array is not None:  # (one not returned: see `Unreturned`)
                part[name] = array.reshape((len(array), *inner) if self._batched else inner)


_STARTED: weakref.WeakSet[Executor] = weakref.WeakSet()
"""Executors with instance threads, not closed yet (see `_close_at_exit`)."""


@atexit.register
def _close_at_exit() -> None:
    """Stop the instance threads of executors still open as the interpreter exits: their runs
    terminated (ORT stops between two nodes), their threads joined.

    NOTE: an engine made by `Engine.start` and never `aclose`d (its loop is gone by now) left
    its threads, daemons, inside ONNX Runtime: at exit the process aborted (SIGABRT,
    "terminate called without an active exception", exit 134), even for a run whose
    `infer_async` had been cancelled. (Engines made by `Engine.open` are closed by the engine's
    own hook, which runs first: registered later.)"""
    for executor in list(_STARTED):
        executor.close()


class InputPool:
    """Preallocated input buffers of one instance, one per (input, bucket, inner shape, dtype).

    A batch is copied once into the buffer of its bucket; rows past the batch are copies of its
    last row, and their outputs are dropped.

    NOTE: padding rows must be inputs the model takes and must not change the real rows'
    answers. Zeros (or what an earlier batch left) were neither: a 5-row request to y = 100 / x
    failed with a division by zero in its 6th row, string rows "" failed a Cast, and a
    dynamically quantized model (its scale is the batch's largest value) answered all zeros
    after other clients' batches of big values had left them in the buffer. A copy of a real
    row is valid wherever that row is, and moves no batch-wide statistic (max, min) at all.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], np.ndarray] = {}

    def gather(self, feeds: list[Feeds], rows: list[int], bucket: int) -> Feeds:
        """The feeds ORT runs: a lone request at its bucket size as is, others copied once."""
        if len(feeds) == 1 and (bucket == 0 or rows[0] == bucket):
            return feeds[0]
        return {name: self._fill(name, [f[name] for f in feeds], bucket) for name in feeds[0]}

    def _fill(self, name: str, parts: list[np.ndarray], bucket: int) -> np.ndarray:
        first = parts[0]
        key = (name, bucket, first.shape[1:], first.dtype)
        buffer = self._buffers.get(key)
        if buffer is None:
            buffer = self._buffers[key] = np.empty((bucket, *first.shape[1:]), first.dtype)
        start = 0
        for part in parts:
            buffer[start : start + part.shape[0]] = part
            start += part.shape[0]
        if start < bucket:
            buffer[start:] = buffer[start - 1] if start else ("" if first.dtype == object else 0)
        return buffer


def _answered(outputs: Sequence[Feeds | DuetimeError]) -> bool:
    """Whether a run gave every request its outputs (none failed)."""
    return bool(outputs) and not any(isinstance(o, DuetimeError) for o in outputs)


def _unsettled(futures: Sequence[Settles]) -> list[int]:
    """The indices of the futures not done yet."""
    return [index for index, future in enumerate(futures) if not future.done()]


def _misfit(names: Sequence[str], outputs: Sequence[np.ndarray], rows: int) -> str | None:
    """The first output whose first dim is not the `rows` run (None: all have them)."""
    for name, array in zip(names, outputs, strict=True):
        if array.ndim == 0 or len(array) != rows:
            return name
    return None


def _not_utf8(run: Run, name: str, feeds: Feeds) -> bool:
    try:
        run([name], feeds)
    except UnicodeDecodeError:
        return True
    except Exception:  # (another failure: not this one)
        return False
    return False


def _run_error(exc: Exception) -> DuetimeError:
    if isinstance(exc, DuetimeError):  # (a batch's outputs that do not follow it, say)
        return exc
    # Inputs were checked against the signature before they got here, so what ORT still refuses
    # depends on the values a client sent (an index out of range, a shape a Reshape rejects).
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return InvalidInput(f"ONNX Runtime could not run the model on these inputs: {reason}")
