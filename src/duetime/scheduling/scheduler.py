"""ModelScheduler: drives the pure queue, admission and batch policy for one model version.

It owns the queue, the record of which instances are busy until when, and the latency profile.
It acts on three events only: a request arrives (`submit_nowait`), an instance finishes a batch,
or a batching window closes (a loop timer); an inline model (`Executor.inline`) instead runs its
batches in one callback per loop turn that brought requests (`_kick`). NOTE: these event
callbacks are the "small async loop per variant" of the design, without a task of their own: a
task would add a loop iteration (~5-10 µs) to every request's path for no gain. Everything runs
on the loop that created it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any, NamedTuple, TypeVar

from duetime.clock import Clock
from duetime.config import BreakerConfig, SchedulingConfig
from duetime.errors import (
    QUEUE_FULL,
    TIMEOUT_EXPIRED,
    DeadlineExceeded,
    DuetimeError,
    InvalidInput,
    ModelUnavailable,
    Overloaded,
)
from duetime.execution.affinity import SMALL_MODEL_NS
from duetime.execution.executor import BatchJob, BatchResult, Executor, Feeds
from duetime.execution.turns import Turns
from duetime.resilience.breaker import BreakerState, CircuitBreaker
from duetime.scheduling.admission import admit, predict_finish
from duetime.scheduling.batching import (
    Wait,
    drop_hopeless,
    is_hopeless,
    plan_batch,
    sweep_hopeless,
    sweep_outranked,
)
from duetime.scheduling.edf import SHADOW_LEVEL, EDFQueue, Key, QueuedRequest
from duetime.scheduling.ledger import NO_SLACK, CoreLedger, Queued
from duetime.scheduling.profile import (
    InstanceSpeed,
    LateMargin,
    LatencyProfile,
    Overrun,
    RecentTail,
)
from duetime.scheduling.sizecost import SizeCost
from duetime.types import RequestTiming

log = logging.getLogger("duetime.scheduler")

_OVERHEAD_ALPHA = 0.05
TURN_WAIT_ALPHA = 0.125
"""The weight of each turn of the loop in `ModelScheduler.turn_wait_ns`: at overload, a few
hundred turns a second, it follows a change of load within ~50 ms."""
OWN_TIME_ALPHA = 0.25
"""The weight of each run of instance 0 in its time per bucket (see `_learn_speed`)."""
PACE_WINDOW_NS = 100_000_000
"""A run of another instance is compared with instance 0's runs of its size only where one of
them ended during it or this long before its end: under the same load of the machine (see
`_learn_speed`)."""
_LOOKAHEAD_MIN_NS = 1_000_000
"""Plan an instance's next batch at most this long (or two hand-offs, or the recent tail of the
hand-offs) before the batches handed to it end: earlier would commit the next batch before the
requests that could fill it have arrived, and the loop's timers are only good to about a
millisecond."""
LOOKAHEAD_BATCHES = 4
"""At most this many batches handed to an instance's thread at once (the one running and those
waiting behind it), where its runs are long enough to be handed ahead (`SMALL_MODEL_NS`)."""
_SLACK_SCAN = 16
"""Queued requests looked at for the slack another scheduler of the CPU must leave them."""
WAKE_SLACK_NS = 2_000_000
"""How late a wake-up of the loop's timers may come (libuv's are good to a millisecond): a batch
waiting for more requests is started this much before the last instant it could start on time
(twice the timers' grain: a wake-up also waits for the loop turn it lands in).
NOTE: without it, a lone request with a due time on a model with a batching window was woken a
few µs past that instant, found hopeless, and failed unrun on an idle server. Where wake-ups
come later (a loaded machine: 0.1-4 ms, measured), the slack follows them, up to
`WAKE_SLACK_MAX_NS`, and decays back: the window's wake-ups and the sweeper's (every
millisecond while requests queue) raise it, the window's own on time let it decay. A request
woken later still is run while its run alone fits (see `batching.is_hopeless`)."""
WAKE_SLACK_MAX_NS = 5_000_000
REFRESH_NS = 1_000_000_000
"""A variant refusing on its predictions, and not run for this long, runs its sample inputs
once to check its profile (see `ModelScheduler.refresh_if_stale`)."""
_BIG_INPUT_FACTOR = 4
"""Inputs this many times the profile samples' bytes a row are predicted by their size."""
_REVOKE_AFTER_NS = 1_000_000
"""A running batch this far past its predicted end has overrun: the lookahead batch behind it
may be taken back for a more urgent request (see `_revoke_passed`)."""
_NO_TASK = object()
"""`_runs_now`: a request that ran within its call though it came from no task."""
_SWEEP_S = 0.001
"""While requests queue, how often the whole queue is checked for hopeless ones."""
_SWEEP_NS = int(_SWEEP_S * 1e9)
_OUTRANKED_EVERY = 8
"""Where nothing was queued ahead of a lower priority level's requests since the last sweep
(`EDFQueue.outranked`), a sweep asks which of them the work ahead leaves no time for
(`_expire_outranked`) only this often: runs that overran can do that too, but the walk costs up
to 40 µs (`batching.OUTRANKED_WALK`)."""
HANDOFF_TAIL_MAX = 2
"""The hand-offs' tail is kept in hand for at most this many runs of the batch. NOTE: a tail
longer than that comes from a loop saturated by the requests themselves (the load shedder's
business), which refusing them does not shorten: measured on the 2-core VM, mlp on a thread at
twice its capacity had a 50 ms tail, and keeping it in hand cut its answers on time from 2,230/s
to 177/s. Resnet's tail (2-3 ms, the load generator preempting the loop) stays within it."""
SHADOW_IN_FLIGHT = 8
"""Shadow copies one instance may hold, queued or running (or its `max_batch_size`, if more):
copies beyond it are dropped, as shadows are best effort (see `submit_shadow`)."""
REFUSALS_SEEN_NS = 50_000_000
"""A model that refused or expired a request this recently counts as backlogged (`backlogged`)."""
PROBE_NS = 100_000_000
"""An idle model that has refused every request for this long admits one it predicts to miss:
its predictions come from what it measures, and a model that refuses everything measures
nothing, so one bad stretch (another process on its core) would otherwise keep every tight due
time refused for good. The probe may answer late; its run corrects the prediction."""
SAMPLE_KEEP_BYTES = 1 << 20
"""The most a request's row kept as a model's sample inputs may weigh (see `_keep_sample`)."""
PROBE_MAX_NS = 5_000_000_000
"""...and the period doubles at each probe, up to this, until a request is predicted to fit
again: a probe that only confirms the miss is answered late. NOTE: the period stayed 100 ms,
and a model sent a request every 120 ms with due times its runs on a slowed machine could not
meet admitted every one of them as a probe, 9 of 10 answered late (found by a tester): a probe
slower than predicted teaches nothing (see `_record`), so each found the same estimates."""
PROBE_FACTOR = 2
"""...but only one that would need at most this many times the time it has: a prediction off
by more than that is not what a stretch of bad luck does, and the request is hopeless. A
profile that is a guess (`LatencyProfile.guessed`: the load-time samples failed) says nothing
of the kind, and its probes are let through whatever it predicts."""
COLD_AFTER_NS = 10_000_000
"""A run this long after the last one, with requests refused meanwhile, is cold (its code and
data out of the CPU's caches): its times are not those of the runs admitting more would bring
(see `_record`). NOTE: measured on the 2-core VM, orderbook's 14 µs run (ONNX Runtime alone in
a process) took 90-180 µs after 10 ms without one and 250-300 µs after 50-100 ms; in `duetime
itch run`, whose feed keeps it warm between messages, its 1-row runs after 90 ms or more took
18.7 µs (p50) against 9.3 and reached the loop 56 µs after their end against 19. A model whose
traffic is that sparse without refusals learns from its cold runs as from any."""
STOP_GRACE_NS = 100_000_000
"""A run on an instance thread is stopped (`Executor.terminate`) once every request of it is
this far past its due time, or withdrawn by its client (see `_watch`)."""
TURN_HOLD_FACTOR = 2.0
TURN_HOLD_SLACK_NS = 10_000_000
"""A batch on a CPU shared with other models' instances holds the CPU's turn for its predicted
run times `TURN_HOLD_FACTOR`, or that plus `TURN_HOLD_SLACK_NS` if longer; past that the next
batch runs beside it (see execution/turns.py)."""
WATCH_EVERY_NS = 20_000_000
"""How often the runs on instance threads are looked at (`_watch`), while there are any: a run
is stopped `STOP_GRACE_NS` to that plus this past its due time.

NOTE: looked at every `STOP_GRACE_NS`, a run was stopped 100-200 ms past its due time (a
tester's 50 ms request heard at ~210 ms, stopped 151-156 ms past due, 4 of 4), where README
says 100 ms."""


_US, _MS, _S = 1_000, 1_000_000, 1_000_000_000
LATENCY_BOUNDS_NS: tuple[int, ...] = (
    5 * _US, 10 * _US, 25 * _US, 50 * _US, 100 * _US, 250 * _US, 500 * _US,
    1 * _MS, 2_500 * _US, 5 * _MS, 10 * _MS, 25 * _MS, 50 * _MS, 100 * _MS, 250 * _MS, 500 * _MS,
    1 * _S, 2_500 * _MS, 5 * _S, 10 * _S,
)  # fmt: skip
"""Upper bounds (inclusive) of the latency histograms' buckets: 5 µs, 10, 25, 50, 100, 250 µs,
... 10 s, a 1-2.5-5 series; durations above the last fall in an overflow bucket."""


class HistogramSnapshot(NamedTuple):
    """Counts of durations per bucket of `bounds_ns` (not cumulative; one more count than bounds,
    for durations above the last bound) and their sum.

    NOTE: a NamedTuple, not a frozen dataclass: it is built three times per `statistics()`, which
    the load shedder calls every few ms on the loop, and a frozen dataclass takes 4x as long."""

    bounds_ns: tuple[int, ...]
    counts: tuple[int, ...]
    sum_ns: int

    @property
    def total(self) -> int:
        """Durations counted (`count` is tuple's)."""
        return sum(self.counts)


class LatencyHistogram:
    """Durations counted into the fixed buckets of `LATENCY_BOUNDS_NS`: a bisect and two integer
    additions per observation, cheap enough for the request path."""

    __slots__ = ("counts", "sum_ns")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BOUNDS_NS) + 1)
        self.sum_ns = 0

    def observe(self, ns: int) -> None:
        self.counts[bisect_left(LATENCY_BOUNDS_NS, ns)] += 1
        self.sum_ns += ns

    def snapshot(self) -> HistogramSnapshot:
        # NOTE: tuple() of a list of ints copies it without letting another thread in, so a
        # scrape on another thread sees each list whole (the sum may trail it by one update).
        return HistogramSnapshot(LATENCY_BOUNDS_NS, tuple(self.counts), self.sum_ns)


@dataclass(slots=True)
class BatchSizeStatistics:
    """Executions of one batch size (rows sent) that answered some request, and their summed
    compute time."""

    count: int = 0
    compute_ns: int = 0
    input_ns: int = 0
    """Gathering their inputs (`BatchResult.input_ns`)."""
    output_ns: int = 0
    """Splitting their outputs (`BatchResult.output_ns`)."""


@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    """A snapshot of one scheduler's counters (durations in ns, timestamps in ms since epoch).

    Safe to take from another thread than the loop's (a metrics scrape): it copies plain ints
    and lists, and never touches the loop's objects.
    """

    queued: int
    peak_queued: int
    busy_instances: int
    instances: int
    succeeded: int
    failed: int
    rejected: int
    expired: int
    late: int
    """Answered after their due time (the batch ran longer than predicted)."""
    on_time: int
    """Answered by their due time (or had none): `succeeded - late`, counted on its own so that a
    snapshot taken on another thread (a metrics scrape) never shows it going down."""
    cancelled: int
    unavailable: int
    """Failed unrun because no instance would take them any more: refused on arrival or failed
    while queued with every instance's breaker open, or failed while queued as the scheduler
    shut down; Triton's failure reason OTHER."""
    executions: int
    """Executions that answered some request (Triton's execution_count: one in which every
    request failed is not counted; `compute_time` counts every execution)."""
    inferences: int
    success_ns: int
    queue_ns: int
    """Summed over the requests that succeeded: arrival to the start of its batch (Triton's
    `queue`, whose count is the successes'; `queue_time` measures every request started)."""
    compute_ns: int
    """Time inside ONNX Runtime, summed over executions (`batch_sizes` splits it by size)."""
    request_compute_ns: int
    """Summed over the requests that succeeded: each one's batch's time inside ONNX Runtime
    (Triton's per-request compute_infer: every request sat through its whole batch)."""
    request_input_ns: int
    """Likewise its batch's time gathering the inputs (Triton's compute_input)."""
    request_output_ns: int
    """Likewise its batch's time splitting the outputs (Triton's compute_output)."""
    fail_ns: int
    """Summed over every request that failed (the model failed, refused, expired, cancelled by
    its client), from its arrival to its failure: for one refused or expired at admission, the
    time admission took; for one its client cancelled, until the scheduler let go of it (one
    still queued: until now), as Triton's scheduler times a request until it finds it cancelled.
    """
    overhead_ns: int
    last_inference_ms: int
    """When the last execution counted in `executions` ended."""
    request_time: HistogramSnapshot
    """Arrival to result on the loop, of each request that succeeded (late ones too)."""
    queue_time: HistogramSnapshot
    """Arrival to the start of its batch (for a batch queued behind a running one, that one's
    predicted end), of each request that was started."""
    compute_time: HistogramSnapshot
    """Time inside ONNX Runtime, of each batch executed."""
    batch_sizes: dict[int, BatchSizeStatistics] = field(default_factory=dict)
    """The executions of `executions`, by batch size."""
    batch_bounds: tuple[int, ...] = (1,)
    """The batch-size histogram's bounds: the model's batch buckets (and 1), ascending."""
    histogram_sizes: dict[int, int] = field(default_factory=dict)
    """Executions by batch size for the batch-size histogram: `batch_sizes`' counts, of the
    deployments `combined` with the same `batch_bounds` only (a histogram's bounds stay fixed
    per series: one of another model's bounds starts it from 0)."""
    breaker_states: tuple[int, ...] = ()
    """Each instance's circuit breaker: 0 closed, 1 half-open, 2 open."""
    breakers_opened: int = 0
    """Times any of the instances' breakers opened."""
    probes: int = 0
    """Requests admitted though predicted to miss, to measure again (see PROBE_NS)."""
    overrun: float = 1.0
    """How far executions lately ran past their prediction (see profile.Overrun)."""
    handoff_tail_ns: int = 0
    """The tail of the hand-offs from ONNX Runtime to the loop (see `ModelScheduler._handoff`)."""
    late_margin_ns: int = 0
    """Kept before every due time since answers were lately late (see profile.LateMargin)."""
    instance_speeds: tuple[float, ...] = ()
    """Each instance's pace against instance 0's, as predictions use it (see
    profile.InstanceSpeed): its latency profile is the variant's times this."""
    instance_runs: tuple[int, ...] = ()
    """Each instance's runs (batches, sample runs too), failed ones included."""
    instance_compute_ns: tuple[int, ...] = ()
    """The time each instance's runs took in ONNX Runtime."""
    answer_ns: int = 0
    """Time settling one request of a finished batch takes on the loop, its answer included."""
    committed: int = 0
    """Requests in batches handed to a busy instance, waiting behind its running batch (a
    lookahead batch): no longer queued, not started either."""
    handed_over: int = 0
    """Requests it admitted, then could no longer answer in time, that a cheaper variant of the
    version took over (see `QueuedRequest.fallback`); each is counted in that variant's
    outcomes, where it ran, and in none of these."""
    answers_failed: dict[str, int] = field(default_factory=dict)
    """Requests it answered (counted in `succeeded`) whose front end could not deliver the
    answer, by reason (see `ModelScheduler.answer_failed`)."""
    late_by_cause: dict[str, int] = field(default_factory=dict)
    """The `late` answers by what made them late (`LATE_CAUSES`, see `late_cause`)."""


_SUMMED = (
    "succeeded", "failed", "rejected", "expired", "late", "on_time", "cancelled", "unavailable",
    "executions", "inferences", "success_ns", "queue_ns", "compute_ns", "request_compute_ns",
    "request_input_ns", "request_output_ns", "fail_ns", "breakers_opened", "probes",
    "handed_over", "queued", "busy_instances", "committed",
)  # fmt: skip


def combined(live: SchedulerStatistics, *others: SchedulerStatistics) -> SchedulerStatistics:
    """`live`'s statistics with the counts of `others` (deployments it replaced, draining or
    closed, newest first) added: counters, histograms and batch sizes summed (for the
    batch-size histogram, only those newer than the first with other bounds than `live`'s),
    requests waiting or running summed; the rest (instances, breakers, estimates) is `live`'s
    own.

    NOTE: the batch-size histogram summed every deployment's sizes, whatever its bounds: after
    a reload from max_batch_size 64 to 8, le="6" kept the 64 one's counts while le="12" to
    le="64" were gone, and back at 64 those came back with the old counts in their first
    sample (found by a tester): not cumulative over a window spanning the reload."""
    if not others:
        return live
    every = (live, *others)
    sums: dict[str, Any] = {name: sum(getattr(s, name) for s in every) for name in _SUMMED}
    batch_sizes: dict[int, BatchSizeStatistics] = {}
    histogram_sizes: dict[int, int] = {}
    answers_failed: dict[str, int] = {}
    late_by_cause: dict[str, int] = {}
    same_bounds = True
    for stats in every:
        same_bounds = same_bounds and stats.batch_bounds == live.batch_bounds
        if same_bounds:
            _add_counts(histogram_sizes, stats.histogram_sizes)
        for size, batch in stats.batch_sizes.items():
            into = batch_sizes.setdefault(size, BatchSizeStatistics())
            into.count += batch.count
            into.compute_ns += batch.compute_ns
            into.input_ns += batch.input_ns
            into.output_ns += batch.output_ns
        _add_counts(answers_failed, stats.answers_failed)
        _add_counts(late_by_cause, stats.late_by_cause)
    return replace(
        live,
        **sums,
        peak_queued=max(s.peak_queued for s in every),
        last_inference_ms=max(s.last_inference_ms for s in every),
        request_time=_summed(s.request_time for s in every),
        queue_time=_summed(s.queue_time for s in every),
        compute_time=_summed(s.compute_time for s in every),
        batch_sizes=batch_sizes,
        histogram_sizes=histogram_sizes,
        answers_failed=answers_failed,
        late_by_cause=late_by_cause,
    )


_Key = TypeVar("_Key")


def _add_counts(into: dict[_Key, int], counts: dict[_Key, int]) -> None:
    for key, count in counts.items():
        into[key] = into.get(key, 0) + count


def _summed(histograms: Iterable[HistogramSnapshot]) -> HistogramSnapshot:
    first, *rest = histograms
    counts = list(first.counts)
    sum_ns = first.sum_ns
    for histogram in rest:
        counts = [a + b for a, b in zip(counts, histogram.counts, strict=True)]
        sum_ns += histogram.sum_ns
    return HistogramSnapshot(first.bounds_ns, tuple(counts), sum_ns)


LATE_CAUSES = ("start", "run", "delivery", "plan")
"""Why a batch's answers came after their due time (`late_cause`): it started later than
planned, its run took longer than predicted, its result reached the loop later than the
hand-offs usually take, or none of these: it was planned to finish after its due time."""


def late_cause(
    *,
    planned_start_ns: int,
    started_ns: int,
    waited_ns: int,
    predicted_ns: int,
    overhead_ns: int,
    compute_ns: int,
    ended_ns: int,
) -> str:
    """Which part of a batch's way overran its plan most (one of `LATE_CAUSES`). Pure.

    The plan: start at `planned_start_ns` and have the result on the loop `predicted_ns` later,
    `overhead_ns` of which for the hand-offs (the rest: the model's run). What happened: handed
    to its instance at `started_ns` (for a batch that waited behind another: when that one
    ended), waited `waited_ns` there for its turn on a shared CPU, ran `compute_ns` inside
    ONNX Runtime, and its result reached the loop at `ended_ns`. The three overruns (start and
    turn; run; the rest, hand-offs) sum to how much later than planned the result came."""
    start = started_ns - planned_start_ns + waited_ns
    run = compute_ns - (predicted_ns - overhead_ns)
    delivery = ended_ns - started_ns - waited_ns - compute_ns - overhead_ns
    worst = max(start, run, delivery)
    if worst <= 0:
        return "plan"
    if worst == run:
        return "run"
    return "start" if worst == start else "delivery"


@dataclass(slots=True, eq=False)
class _Running:
    requests: list[QueuedRequest]
    bucket: int
    started_ns: int
    """When it was handed to an idle instance, or when the batch before it ended."""
    rows: int
    job: BatchJob | None = None
    """What its instance's thread was given (None: run inline)."""
    queued_until_ns: int = 0
    """Where its requests' queue time ends: the start it was planned for (see `_start`)."""
    predicted_ns: int = 0
    """Its predicted run, from its start to its result on the loop (see `_run_ns`)."""
    taken: bool = False
    """Its thread took it (set on that thread, by the clock of its `BatchJob.start_by`): it
    runs, or has run. Meaningful only for a job given a `start_by` (one that waits)."""
    swept: Sequence[QueuedRequest] = ()
    """Its requests failed unrun while it waited (`_sweep_committed`): counted as expired, or
    taken over by a cheaper variant, which answers them (see `_expire`).
    (A tuple until then: a list made for every batch was one more allocation per request.)"""
    stopping: bool = False
    """Its run is being stopped, its requests answered (see `_watch`)."""
    cold: bool = False
    """It runs the probe (see PROBE_NS), or after `COLD_AFTER_NS` of refusals: its times teach
    only where they are shorter than the estimates (see `_record`)."""


class ModelScheduler:
    """Queue, admit, batch and dispatch the requests of one model version to its instances."""

    def __init__(
        self,
        *,
        executor: Executor,
        config: SchedulingConfig,
        max_batch_size: int,
        profile: LatencyProfile,
        default_timeout_ns: int | None,
        clock: Clock,
        label: str,
        breaker: BreakerConfig | None = None,
        ledger: CoreLedger | None = None,
        sample_row_bytes: int = 0,
        wake_slack_ns: int = WAKE_SLACK_NS,
        sample: Callable[[], Feeds] | None = None,
        predictable_cost: bool = True,
        max_batch_bytes: int = 0,
        answer_guess: int | None = None,
        learn_sample: bool = False,
    ) -> None:
        """`ledger`: the CPU its instances run on, when other models' instances run there too
        (see scheduling/ledger.py). `sample_row_bytes`: the input bytes a row of the samples the
        profile was measured on had (0: not known). `wake_slack_ns`: see `WAKE_SLACK_NS`.
        `sample`: inputs of one row for `refresh_if_stale` and `_suspect` (None: it never
        runs one). `predictable_cost`: False for a model whose run time follows its inputs'
        values (a Loop's trip count, a size read from an input) or free non-batch dims: its
        executions are never judged slow, since its profile cannot say what a run should take
        (5 valid Loop requests of 60-120 ms opened the breaker of one profiled at 1 ms).
        Failures still count. `max_batch_bytes`: see `batch_bytes_bound` (0: none).
        `answer_guess`: what its answers are expected to weigh before it made one (see
        `Engine.answer_guess`). `learn_sample`: `sample` failed at load; the first row of a
        request that runs replaces it (see `_keep_sample`)."""
        self.answer_guess = answer_guess
        self._sample = sample
        self._learns_sample = learn_sample
        self._refreshing = False
        """A sample run of `refresh_if_stale` is planned (`_refresh_soon`) or running."""
        self._wake_slack_base_ns = self._wake_slack_ns = wake_slack_ns
        self._preferred = (
            () if config.policy == "edf" else tuple(sorted(set(config.preferred_batch_size)))
        )
        if config.preferred_batch_size and config.policy == "edf":
            log.warning(
                "model %s: scheduling.preferred_batch_size has no effect in EDF mode (batches "
                "are sized by due times); set policy 'fifo' for it", label,
            )  # fmt: skip
        self._executor = executor
        self._sample_row_bytes = sample_row_bytes
        self._size_cost = SizeCost()
        """Extra execution time of inputs far bigger than the profile's samples, by size, learnt
        from their runs: what admission predicts such requests by (see `_extra_bytes`)."""
        self._config = config
        self._edf = config.policy == "edf"
        self._queue = EDFQueue(
            config.max_queue_size, config.policy, clock.now_ns, config.max_queue_size_per_level,
            yielding_level=SHADOW_LEVEL, on_displaced=self._displaced,
        )  # fmt: skip
        self._shadows = 0
        """Shadow copies queued or running (see `submit_shadow`)."""
        self._shadow_cap = executor.instances * max(SHADOW_IN_FLIGHT, max_batch_size)
        self._max_rows = max_batch_size
        self._max_delay_ns = config.max_queue_delay_us * 1000
        self.profile = profile
        """The variant's latency profile, measured at load on instance 0 (see `_speeds`)."""
        self._speeds = [InstanceSpeed() for _ in range(executor.instances)]
        """Each instance's pace against instance 0's (whose stays 1: `profile` is its own): an
        instance's latency profile is `profile` times its speed (see `InstanceSpeed`)."""
        self._own_times: dict[int, tuple[float, int]] = {}
        """Per bucket: instance 0's last few runs' time (an EWMA) and when the last ended: what
        each other instance's runs are compared with (see `_learn_speed`)."""
        self._paced = False
        """Some instance's speed is not 1 (the fast path's test)."""
        self._instance_runs = [0] * executor.instances
        self._instance_compute_ns = [0] * executor.instances
        """Each instance's runs, and the time they took in ONNX Runtime (statistics)."""
        self.default_timeout_ns = default_timeout_ns
        """The model's `default_timeout_ms`, in ns (None: none)."""
        self._clock = clock
        self._label = label
        self._loop = asyncio.get_running_loop()
        self._outstanding: list[deque[_Running]] = [deque() for _ in range(executor.instances)]
        self._busy_until = [0] * executor.instances
        self._ledger = ledger
        self._owners = [(id(self), i) for i in range(executor.instances)]
        if ledger is not None:
            for owner in self._owners:
                ledger.join(owner, self._queued_work)
        # NOTE: a model whose batches take long gets its next batch queued on the instance before
        # the current one ends, so the instance never waits for a round trip through the loop.
        # Small models keep one batch per instance: their hand-off is cheap next to the batching
        # a lookahead batch would forgo. How far ahead: see `_slot`.
        self._depth = 1 if profile.predict(1) < SMALL_MODEL_NS else LOOKAHEAD_BATCHES
        self._breaker_config = breaker or BreakerConfig()
        self._breakers = [CircuitBreaker(self._breaker_config) for _ in range(executor.instances)]
        self._tripped = 0
        """Instances whose breaker is not closed: 0 on the fast path."""
        self._slow_floor_ns = self._breaker_config.slow_min_us * 1000
        self._answered_ns = -(1 << 62)
        """When an execution last gave some request an answer (not a failure)."""
        self._trust_ns = int(self._breaker_config.open_s * 1e9)
        """How recent such an answer clears the model of a string output's failure (see
        `_judge`); and the least time between two sample checks (see `_suspect`)."""
        self._clients_failures = 0
        """Executions in a row that failed on their clients' data (see `_suspect`)."""
        self._checked_ns = -(1 << 62)
        """When `_suspect` last ran the sample inputs."""
        self._predictable_cost = predictable_cost
        self._max_batch_bytes = max_batch_bytes
        """The most input bytes a batch of several requests takes (0: no bound; see
        `batch_bytes_bound`)."""
        slow_set = {"slow_factor", "slow_min_us", "slow_executions"}
        if not predictable_cost and self._breaker_config.model_fields_set & slow_set:
            # NOTE: said at info at most, a config's slow settings were ignored unseen: a Loop's
            # 66-106 ms runs, three in a row twice, left a breaker set to open on 3 over 5 ms
            # closed (found by a tester)
            log.warning(
                "model %s: its run time follows its inputs' values, so its runs are never judged "
                "slow: breaker.slow_factor, slow_min_us and slow_executions do not apply to it "
                "(failures still open its breaker, and a run past every due time in it is "
                "stopped)", label,
            )  # fmt: skip
        self._queued_cache: tuple[tuple[int, int, int], int, Queued] | None = None
        """`_queued_work`'s last answer: (queue length, rows, first free instance), when, what."""
        self._admitted_others: Queued | None = None
        """What `_admit` found the others of a shared CPU had queued, for `submit_nowait`'s
        `_holds_back` in the same call (None: not computed)."""
        self._inline = executor.inline
        """Batches run on this loop, inside `_dispatch` (see `_kick`)."""
        self._kicked = False
        self._ran_now: object = None
        """The task whose request ran within its `submit_nowait` this turn, `_NO_TASK` where it
        came from no task, None where none did (see `_runs_now`)."""
        self._settling = False
        """Inline: a batch's answers are being settled (see `_runs_now`)."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0
        self._timer_due_bound = False
        """The timer ends a batching window early for a due time (`Wait.due_bound`): a raised
        wake slack ends it earlier (see `_on_sweep_timer`)."""
        self._overhead_ns = 0.0
        self._answer_ns = 0.0
        """What settling one request of a finished batch takes on the loop (its client's answer
        encoded and written, where a front end answers from the settle callback); EWMA. Per
        request, not per row: a feed handler's burst of events is one request of many rows,
        settled by one callback (counting it per row refused 7% of an ITCH replay's bursts)."""
        self._kicked_ns = 0
        """When the first request of the loop's turn was queued (`_kick`)."""
        self.turn_wait_ns = 0.0
        """Inline: how long the first request queued in a turn of the loop waited for the end
        of the dispatch that ran it (`_kick`), lately (EWMA over turns, `TURN_WAIT_ALPHA`):
        the rest of the turn's reads, then the batches run and their answers settled. This is
        the wait admission does not predict (it predicts the model's runs); a saturated front
        end refuses, unread, a request whose due time is nearer than its lag plus this
        (`HttpConnection._due`). 0 for a model whose instances run on threads."""
        self._last_run_ns = clock.now_ns()
        """When an execution last ended, or the last probe was admitted (see PROBE_NS)."""
        self._refusing = False
        """It refused a request on its predictions since its last run ended (see
        `COLD_AFTER_NS`)."""
        self._probe: QueuedRequest | None = None
        """The request last admitted as a probe, until its batch starts: predicted to miss, it
        is spared the checks that fail hopeless requests unrun (see `_expire_hopeless`)."""
        self._probe_gap_ns = PROBE_NS
        """How long a model refusing everything waits before its next probe (see PROBE_MAX_NS)."""
        self._probed_ns = 0
        """When the last probe was admitted.

        NOTE: the gap was counted from `_last_run_ns`, which the profile's refresh runs (about
        one a second while refusing) set too: once the gap passed a second no probe ever came
        again (found by a tester)."""
        self._margin_ns = config.delivery_margin_us * 1000
        self._exec_margin = config.exec_margin
        self._overrun = Overrun()
        self._handoff = RecentTail()
        """How long results lately took from ONNX Runtime to the loop, in ns (its tail).

        NOTE: the mean hand-off is in every prediction (`_overhead_ns`); its tail is not, and it
        does not scale with the batch: a result waits for a loop busy reading requests, or
        preempted by another process on its core. Measured on the 2-core VM, resnet at 200% load
        with the load generator on the loop's core: median 37 µs, p99 1.5 ms, p99.9 3.1 ms,
        where the whole batch took 1-6 ms (see `_margin_for`)."""
        self._late_margin = LateMargin()
        """Kept before every due time since answers were late by this scheduler's clock."""
        self._late_ns = 0
        self._late_budget_ns = NO_SLACK
        """Of the answers late since the last batch's were counted: the latest, and the shortest
        time budget (due less arrival) among them (see `_count_late`)."""
        self._refused_ns = -REFUSALS_SEEN_NS
        """When it last refused or expired a request."""
        self._sweeper: asyncio.TimerHandle | None = None
        self._sweep_at = 0
        """When the sweeper's timer was asked to fire (see `_on_sweep_timer`)."""
        self._watcher: asyncio.TimerHandle | None = None
        """Armed while batches run on instance threads (see `_watch`)."""
        self._closed = False
        self._drained = False
        """`aclose` is past its drain: its timers are cancelled, and none is armed again."""
        self.last_arrival_ns = clock.now_ns()
        """When the last request arrived (or the scheduler started): the least recently used
        model is the first unloaded when the memory budget is reached."""
        self._drain_waiter: asyncio.Future[None] | None = None
        """Set while `aclose` waits for `idle`; resolved by the dispatch that gets there."""
        self._batch_sizes: dict[int, BatchSizeStatistics] = {}
        self._peak = self._succeeded = self._failed = self._rejected = self._expired = 0
        self._late = self._on_time = self._probes = 0
        self._sweeps = 0
        self._late_by: dict[str, int] = {}
        """Late answers by what made them late (see `late_cause`)."""
        self._cancelled = self._executions = self._inferences = self._last_ms = 0
        self._request_compute_ns = self._fail_ns = self._queue_ns = 0
        self._request_input_ns = self._request_output_ns = 0
        self._handed_over = 0
        self._answers_failed: dict[str, int] = {}
        """Answers its front ends could not deliver, by reason (see `answer_failed`)."""
        self._full = self._unavailable = 0
        """Refused for a full queue, with a due time or without: none missed (see `outcomes`)."""
        self._impossible = 0
        """Refused at admission for a due time no idle instance could meet: none missed."""
        self._given_up = 0
        """Counted expired as their run was stopped past their due time (see `_stopped`): none
        missed (see `outcomes`)."""
        self._own_capacity = 0
        """Refused at admission for the work its instance threads had, however soon the loop
        had taken it in (see `_refused_for_own_work`): none missed (see `outcomes`)."""
        self._request_time = LatencyHistogram()
        self._queue_time = LatencyHistogram()
        self._compute_time = LatencyHistogram()
        self._shed = 0
        """Refused by the front end's load shedder (counted rejected): none missed."""

    # -- the request path ----------------------------------------------------------------------

    def submit_nowait(
        self,
        feeds: Feeds,
        *,
        rows: int,
        shape_key: tuple[object, ...],
        due_ns: int | None,
        priority: int,
        on_done: Callable[[], None] | None = None,
        timing: RequestTiming | None = None,
        fallback: Callable[[QueuedRequest, int], bool] | None = None,
        arrival_ns: int | None = None,
        run_now: bool = False,
        passes_on: bool = False,
        by_default: bool = False,
    ) -> asyncio.Future[Feeds]:
        """Admit and queue one validated request; its future resolves to the model's outputs.
        `arrival_ns`: when it reached the server, where known (a due time already past that
        was too short for a run even from then is the client's, not a miss: see `outcomes`).
        `run_now`: the caller takes an inline model's run within this call (see `_runs_now`).

        Raises `Overloaded` when the queue is full or (EDF) the request is predicted to finish
        after its due time, `DeadlineExceeded` when its due time has already passed, and
        `ModelUnavailable` after `aclose`. Cancelling the future withdraws the request unless it
        has started. `on_done`, if given, is called on the loop as soon as the future settles.
        `fallback` (EDF, a request with a due time): offered the request before it would fail
        unrun as hopeless, to hand it over to a cheaper variant (`QueuedRequest.fallback`).
        `passes_on`: the caller offers the request to a cheaper variant should this one refuse
        it with `Overloaded` (its due time, a full queue): that refusal is not counted here
        (see `_admit`). `by_default`: `due_ns` is the one the model's `default_timeout_ms` set
        (the router gave it: see `due_by_default`), not the request's own, as a refusal says.
        """
        if self._closed:
            # NOTE: counted as those failed in the queue at the close: uncounted, the requests
            # a draining model refused moved no statistic and no metric
            self._unavailable += 1
            raise ModelUnavailable(
                f"model {self._label} is shutting down; retry on another replica"
            )
        now = self._clock.now_ns()
        self.last_arrival_ns = now
        if self._tripped and not self.available(now):
            # NOTE: counted as those failed in the queue when the last breaker opened (Triton's
            # reason OTHER): uncounted, 20 requests refused 503 moved no metric and no
            # statistic, and dashboards showed a model taking 5 requests during an incident
            self._unavailable += 1
            raise self.unavailable_error(now)
        due_ns, key, probe = self._admission(
            now, feeds, rows, due_ns, priority, arrival_ns, passes_on, by_default
        )
        queue = self._queue
        future: asyncio.Future[Feeds] = self._loop.create_future()
        item = QueuedRequest(feeds, rows, shape_key, now, due_ns, key[0], future, key, on_done)
        if self._max_batch_bytes:
            item.nbytes = _bytes(feeds)
        if probe:
            self._probe = item
        if timing is not None:
            timing.queued_ns = now
            item.timing = timing
        if fallback is not None and due_ns is not None and self._edf:
            item.fallback = fallback
        if (
            not len(queue)
            and self._max_delay_ns == 0
            and (not self._inline or self._runs_now(run_now))
        ):
            instance = self._idle_instance(now)
            others, self._admitted_others = self._admitted_others, None
            if instance is not None and (
                self._ledger is None or not self._holds_back(item, instance, now, others)
            ):
                self._start_alone(item, instance, now)
                if self._inline and self._drain_waiter is not None:
                    self._wake_drain_waiter()
                return future
        if not queue.push(item):
            if not passes_on:  # (counted where it ends: see `_admit`)
                self._rejected += 1
                self._fail_ns += self._clock.now_ns() - now  # (Triton's fail times every failure)
                self._full += 1
            self._refused_ns = now
            raise self._full_error(item.level)
        if len(queue) > self._peak:
            self._peak = len(queue)
        if self._depth > 1:
            self._revoke_passed(now)
        if self._inline:
            # NOTE: its batch waits for the requests the rest of this turn of the loop reads
            # (`_kick`): held, as by a batching window, it is judged on its bare prediction
            # (`_bare_estimate`) when it starts. Judged on the margins admission kept, requests
            # admitted with a little slack expired as a busy loop's turn ended: mlp on the
            # 2-core VM at 13,200 requests/s (150% of capacity; 2/10 ms due times), ~1,000 a
            # second, and the load shedder, counting them missed, refused the 10 ms requests
            # too. 15 s runs interleaved: 9,074, 8,143 and 8,860 answers a second on time
            # against 7,176 and 6,534; at 17,600/s 8,311-8,477 against 8,481 and 8,573
            item.held = True
            self._kick()  # the sweeper is armed by the dispatch if anything is left
            return future
        if self._has_slot():
            self._dispatch()
        self._arm_sweeper()
        return future

    def due_by_default(self, due_ns: int | None, arrival_ns: int | None, now: int) -> int | None:
        """`due_ns`, the request's own due time, or where it has none the model's
        `default_timeout_ms` after the request's arrival (`now` if not known).

        NOTE: the default was the latest any request was due, a request's own timeout only
        shortening it, as Triton's `allow_timeout_override` allows: a request that sent 10 s to
        a model of 10 ms default was refused at once, where a request's timeout is to be
        honoured always, not only below a model default (found by a tester). And it counts from
        the arrival: it counted from admission, after decoding (another tester)."""
        if due_ns is not None:
            return due_ns
        default = self.default_timeout_ns
        if default is None:
            return None
        return (now if arrival_ns is None else arrival_ns) + default

    def _admission(
        self,
        now: int,
        feeds: Feeds,
        rows: int,
        due_ns: int | None,
        priority: int,
        arrival_ns: int | None,
        passes_on: bool = False,
        by_default: bool = False,
    ) -> tuple[int | None, Key, bool]:
        """Admit a request arriving `now` (see `submit_nowait`), or raise why not: its due time
        (the model's default one applied), its place in the queue, and whether it is admitted
        as a probe (see PROBE_NS). `passes_on`, `by_default`: see `submit_nowait`."""
        if self.default_timeout_ns is not None and due_ns is None:
            by_default = True
            due_ns = self.due_by_default(due_ns, arrival_ns, now)
        # (the default level without `_level`'s frame: priority 0, nearly every request's)
        level = self._config.default_priority_level if priority == 0 else self._level(priority)
        key = self._queue.key_for(level, due_ns)
        probe = False
        self._admitted_others = None
        if due_ns is not None:
            extra_bytes = self._extra_bytes(_bytes(feeds), rows) if self._size_cost else 0
            probe = self._admit(
                now, due_ns, rows, key, extra_bytes, arrival_ns, passes_on, by_default
            )
        return due_ns, key, probe

    def answer_alone(
        self,
        feeds: Feeds,
        rows: int,
        *,
        due_ns: int | None = None,
        priority: int = 0,
        arrival_ns: int | None = None,
        deliver: Callable[[Feeds], object] | None = None,
        by_default: bool = False,
    ) -> Feeds | DuetimeError | None:
        """Admit a validated request as `submit_nowait(..., run_now=True)` does (raising its
        refusals), run it alone within this call and return its outputs (or the error its run
        ended in), where that call would start it at once as a batch of its own on an idle
        inline instance and nothing unusual is on (no breaker tripped, no probe waiting, no
        shared CPU, no close): the in-process Engine's usual call. None where it does not
        apply: nothing was done, and the caller submits the request as usual.

        `deliver`, where given, gets the outputs of a run that succeeded as soon as it ends,
        before the books (profile, margins, breaker, statistics) are updated for it, which they
        are before this call returns, also when `deliver` raises: a caller that acts on each
        answer at once (a feed) has it ~12 µs sooner on the 2-core VM (the books, `_record`
        alone 7 µs, were most of what the lean path spent after the model's run). A request
        `deliver` submits meanwhile is queued for the next turn of the loop.

        NOTE: the lean path. It keeps the books as a queued request's run (`_start`, then
        `_complete`) keeps them, through the same methods (`_cold`, `_ran`, `_record`, `_judge`,
        `_count_success`, `_count_answered`, `_count_failure`, `_learn_answer`; the queue-time
        histogram's `observe`, of the 0 a request started as it arrives waited), and
        test_engine_run_now checks the two move every statistic alike. What it leaves out is
        what nothing can see: the future (the caller is answered by the return), the
        `QueuedRequest` and `_Running` records, and the instance's busy-until and outstanding
        batch, which nothing reads while the loop is inside this call (no other model shares
        its CPU's ledger here: `_ledger` is None). Measured on the 2-core VM (mlp batch 1,
        Engine.infer_async, P50 added over ONNX Runtime alone, median of 3 runs of 5,000
        calls, alternated, on a machine shared with other work): 76.9 µs before it, 40.7 µs
        with it and the cuts that followed (sys.settrace: 53.6 Python frames and ~2,340
        opcodes a call before, ~39 and ~1,730 with it); with a 1 s timeout, ~86 -> ~66 µs.
        Its admission in one frame where the request fits (`_fits_alone`): 61.7 -> 58.0 µs
        with a timeout on a loaded machine (median of 3, alternated; 43 µs without one), and
        in a quieter stretch 36-38 µs with one against 37-41 µs without."""
        if (
            self._tripped
            or self._closed
            or not self._inline
            or len(self._queue)
            or self._max_delay_ns
            or self._ledger is not None
            or self._probe is not None
            or self._drain_waiter is not None
            or self._outstanding[0]
        ):
            return None
        task = self._turn_for(True)
        if task is None:
            return None
        now = self._clock.now_ns()
        self.last_arrival_ns = now
        probe = False
        if self.default_timeout_ns is not None and due_ns is None:
            by_default = True  # (`_admission` leaves it as it is from here)
            due_ns = self.due_by_default(due_ns, arrival_ns, now)
        if due_ns is not None and not self._fits_alone(now, feeds, rows, due_ns):
            # (without a due time there is nothing to admit: `_admission` would only number
            # its place in a queue it never enters; nor where it fits, as nearly all do)
            due_ns, _, probe = self._admission(
                now, feeds, rows, due_ns, priority, arrival_ns, by_default=by_default
            )
        self._take_turn(task)  # (after admission, as `submit_nowait` takes it: nothing if refused)
        self._queue_time.observe(0)  # (started as it arrived: `_start`'s `start - arrival_ns`)
        cold = probe or self._cold(now)  # (a probe's run is cold: see `_start`)
        bucket = self.profile.bucket_of[rows] if self._max_rows else 0
        result = self._executor.run_now(0, BatchJob([feeds], [rows], bucket, self._finish))
        end = self._ran()
        outcome = result.outputs[0]
        answered = not isinstance(outcome, DuetimeError)
        delivered = 0
        try:
            if deliver is not None and answered:
                # (a request `deliver` makes waits for the next turn, as one from the answer of
                # a queued batch does: `_turn_for`; run within, its books would come first)
                self._settling = True
                delivered = self._clock.now_ns()  # (the answer's hand-back ends here)
                deliver(outcome)  # type: ignore[arg-type]  # (answered: not an error)
        finally:
            self._settling = False
            sent = _bytes(feeds) if self._sample_row_bytes else 0
            self._record(result, answered, rows, bucket, now, cold, end, sent)
            self._judge(0, rows, result, end, sent)
            outcome = result.outputs[0]  # (after `_judge`, which words a failure its client caused)
            if isinstance(outcome, DuetimeError):
                self._count_failure(end - now)
            else:
                late = self._late
                self._count_success(end - now, due_ns, rows, end)
                self._count_answered(1, 0, result)  # (queued for no time)
                if self._late != late:  # (planned to start now and end a run later)
                    self._count_late(1, now, now, self._exec_ns(rows), result, end)
            # NOTE: what the caller does with its answer (`deliver`) is not the hand-back: a
            # deliver of 2 ms learnt as one kept 923 µs before every due time (a tester)
            self._learn_answer((delivered or self._clock.now_ns()) - end, 1, cold)
        return outcome

    def _fits_alone(self, now: int, feeds: Feeds, rows: int, due_ns: int) -> bool:
        """Whether `_admit` admits at its first prediction (no probe, nothing refused, nothing
        counted) a request of `rows` due at `due_ns` that `answer_alone` runs `now`: False
        where it would refuse it, or admit it only as a probe or once its margins are aged,
        which `_admission` then decides.

        NOTE: `_admit`'s prediction, for an empty queue on a CPU of its own (`answer_alone`'s
        case: no ledger): nothing ahead (`_predict`'s `ahead` and `rows_ahead` 0, so no
        per-row cost), no other scheduler's work (`_others` None), then `_exec_ns`,
        `_size_cost.predict` and `_kept_for`, the very methods `_admit` sums. Through
        `_admission`'s frames a timeout made `Engine.infer_async` on the demo mlp 58 Python
        frames and ~2,110 opcodes a call against 41 and ~1,850 without one (`_admission` alone:
        6.3 µs a call, timeit, warm, on the 2-core VM). (Its first version summed `_kept_for`
        and `_exec_ns` again in its own frame, 3 frames less, a copy to keep in step.) It
        numbers no place in the queue (`key_for`): a request that never queues needs none, as
        one without a due time never had one. tests/scheduling/test_fits_alone checks it decides
        as `_admit`'s first prediction and that a request answered alone ends and counts as it
        does through `_admission` alone, on random states (hypothesis)."""
        if due_ns <= now:
            return False
        busy = self._busy_until
        first_free = min(busy) if len(busy) > 1 else busy[0]
        finish = (first_free if first_free > now else now) + self._exec_ns(rows)
        if self._size_cost:
            finish += self._size_cost.predict(self._extra_bytes(_bytes(feeds), rows))
        return finish + self._kept_for(rows) <= due_ns

    def take_over(self, item: QueuedRequest, priority: int, now: int) -> bool:
        """Queue `item`, a request another variant of this version admitted and can no longer
        answer in time, if this one would admit it now (`fits`); False, changing nothing, if not.

        It keeps its future (its client's answer comes from here), due time, arrival and
        `fallback` (a cheaper variant still may take it from here); its statistics are this
        scheduler's from now on, as a request it admitted (see `_expire`)."""
        due = item.due_ns
        if self._closed or due is None or not self.fits(now, due, item.rows, priority):
            return False
        queue = self._queue
        item.key = queue.key_for(self._level(priority), due)
        item.level = item.key[0]
        queue.push(item)  # (`fits` found room)
        self.last_arrival_ns = now
        if len(queue) > self._peak:
            self._peak = len(queue)
        if self._depth > 1:
            self._revoke_passed(now)
        if self._inline:
            self._kick()
            return True
        if self._has_slot():
            self._dispatch()
        self._arm_sweeper()
        return True

    def _full_error(self, level: int) -> Overloaded:
        """The refusal of a request of `level` the queue had no room for, naming the bound in
        the terms of either config file (the scheduler does not know which the model has).

        NOTE: a config.pbtxt's `default_queue_policy.max_queue_size` with priority levels (a
        queue per level) was named `scheduling.max_queue_size_per_level`, a config.toml name,
        and with every level full the refusal cited the whole queue's bound, the levels times
        the file's (found by a tester): a full level is named first, as the file wrote it."""
        queue = self._queue
        if queue.level_capacity and queue.at_level(level) >= queue.level_capacity:
            return Overloaded(
                f"{QUEUE_FULL}: model {self._label}: queue full for priority level {level} "
                f"({queue.level_capacity} requests of that level waiting: its bound per level, "
                "config.pbtxt's dynamic_batching.default_queue_policy.max_queue_size with "
                "priority_levels, config.toml's scheduling.max_queue_size_per_level); retry "
                "later or raise the limit"
            )
        levels = self._config.priority_levels and not self._config.ignore_priority
        whole = (
            "config.pbtxt's parameters['duetime'] scheduling.max_queue_size, else its "
            "priority_levels times dynamic_batching.default_queue_policy.max_queue_size"
            if levels
            else "config.pbtxt's dynamic_batching.default_queue_policy.max_queue_size"
        )
        return Overloaded(
            f"{QUEUE_FULL}: model {self._label}: queue full ({queue.capacity} requests "
            f"waiting: its max_queue_size, config.toml's scheduling.max_queue_size or {whole}); "
            "retry later or raise the limit"
        )

    def fits(self, now: int, due_ns: int, rows: int, priority: int) -> bool:
        """Whether a request of `rows` due at `due_ns`, submitted now, is predicted to be
        answered in time: EDF admission's test (the router asks before choosing a variant, a
        feed before making a batch); pure, changes nothing.

        NOTE: a FIFO model admits whatever fits its queue, as Triton's does, in time or not;
        this still says whether it would be in time, which is what a variant is chosen by."""
        return self._fits(now, due_ns, rows, self._level(priority))

    def _fits(self, now: int, due_ns: int, rows: int, level: int) -> bool:
        queue = self._queue
        if not len(queue) and self._ledger is None and not self._tripped:
            # NOTE: nothing queued, a CPU of its own, no breaker open: what `_predict` comes to
            # then (nothing ahead, no other scheduler's work) is `_fits_alone`'s prediction for
            # inputs of the profile's size, without `_predict`'s ~10 frames; a feed asks it of
            # each burst (16 µs a call on the VM, more than the ask of a lone event cost over
            # the model's run)
            return not queue.full(level) and self._fits_alone(now, _SIZED_AS_SAMPLES, rows, due_ns)
        if queue.full(level) or due_ns <= now or not self.available(now):
            return False
        # (`_admit`'s prediction: where its batch would make the others' queued requests
        # late, it finishes behind their work, see `_predict`)
        finish, _ = self._predict(now, rows, queue.key_for(level, due_ns), self._others(now))
        return finish + self._kept_for(rows) <= due_ns

    def has_room(self, priority: int) -> bool:
        """Whether a request of `priority` would find room in the queue now (the router asks
        before sending a request with no due time to a variant); pure, changes nothing."""
        return not self._queue.full(self._level(priority))

    def submit_shadow(
        self, feeds: Feeds, *, rows: int, shape_key: tuple[object, ...], due_ns: int
    ) -> asyncio.Future[Feeds] | None:
        """Queue a shadow copy of a request (see routing/router.py `mirror`) behind every real
        request; None, changing nothing, where it would take room or time from them (it is
        dropped; its caller counts it).

        A copy is dropped when the version holds its cap of copies already (`SHADOW_IN_FLIGHT`),
        when its queue is full, or when it is predicted to miss `due_ns` (or the version's
        `default_timeout_ms` where that is earlier: a copy is best effort); a queued copy gives
        its place to a real request that finds the queue full, and one that becomes hopeless as
        it waits is dropped then. None of these counts as a refusal, an expiry or a failure (in
        the statistics, or in the outcomes the load shedder reads): only the copies that run
        count, as the version's requests.

        NOTE: copies took the room and time of real requests to the version: with every request
        to v1 mirrored to v2, copies without a due time never expired and filled v2's queue, and
        89 of 100 real requests to v2 were refused 429 "queue full" (max_queue_size 8; 83 of 100
        with 1024 and 50 ms timeouts, where the copies' expiries also counted as missed due
        times, and the load shedder refused requests "the server is saturated")."""
        now = self._clock.now_ns()
        if self.default_timeout_ns is not None:
            due_ns = min(due_ns, now + self.default_timeout_ns)
        if (
            self._closed
            or self._shadows >= self._shadow_cap
            or not self._fits(now, due_ns, rows, SHADOW_LEVEL)
        ):
            return None
        self.last_arrival_ns = now
        queue = self._queue
        future: asyncio.Future[Feeds] = self._loop.create_future()
        key = queue.key_for(SHADOW_LEVEL, due_ns)
        item = QueuedRequest(
            feeds, rows, shape_key, now, due_ns, SHADOW_LEVEL, future, key, self._shadow_settled
        )
        self._shadows += 1
        if not len(queue) and self._max_delay_ns == 0 and not self._inline:
            instance = self._idle_instance(now)
            if instance is not None and (
                self._ledger is None or not self._holds_back(item, instance, now)
            ):
                self._start_alone(item, instance, now)
                return future
        queue.push(item)  # (`_fits` found room)
        if len(queue) > self._peak:
            self._peak = len(queue)
        if self._inline:
            self._kick()
            return future
        if self._has_slot():
            self._dispatch()
        self._arm_sweeper()
        return future

    def _shadow_settled(self) -> None:
        """A shadow copy's `on_done`: one fewer in flight (`_settle` settles every one)."""
        self._shadows -= 1

    def _displaced(self, item: QueuedRequest) -> None:
        """Drop a shadow copy that gave its place in the full queue to a real request."""
        _settle(item, Overloaded(
            f"{QUEUE_FULL}: model {self._label}: shadow copy dropped from the full queue for a "
            "request"
        ))  # fmt: skip

    def _drop_shadows(self, hopeless: list[QueuedRequest], now: int) -> list[QueuedRequest]:
        """Drop the shadow copies of `hopeless` (uncounted: see `submit_shadow`); the rest."""
        if all(item.level < SHADOW_LEVEL for item in hopeless):
            return hopeless
        for item in hopeless:
            if item.level >= SHADOW_LEVEL:
                _settle(item, DeadlineExceeded(
                    f"{TIMEOUT_EXPIRED}: model {self._label}: shadow copy dropped unrun: it "
                    "could not finish by its due time"
                ))  # fmt: skip
        return [item for item in hopeless if item.level < SHADOW_LEVEL]

    def _level(self, priority: int) -> int:
        """The queue level of a request's `priority`: the default for 0, and (as Triton's) for
        one beyond the model's `priority_levels` where it sets them."""
        config = self._config
        if priority <= 0 or (config.priority_levels and priority > config.priority_levels):
            return config.default_priority_level
        return priority

    def backlogged(self, now: int) -> bool:
        """Requests wait in the queue, or every instance has as many batches as it takes (the
        next batch would wait for one of them), or it turned a request away lately (its queue
        empties between arrivals even while it refuses most of them)."""
        return (
            bool(len(self._queue))
            or not self._has_slot()
            or now - self._refused_ns < REFUSALS_SEEN_NS
        )

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        return not len(self._queue) and not any(self._outstanding)

    def quiet_ns(self) -> int | None:
        """How long no request has arrived, with nothing queued or running (None: busy)."""
        if not self.idle:
            return None
        return max(0, self._clock.now_ns() - self.last_arrival_ns)

    def _predict(
        self, now: int, rows: int, key: tuple[int, int, int], others: Queued | None
    ) -> tuple[int, int]:
        """Predicted finish of a request of `rows` with queue key `key`, and how many are ahead;
        `others`: what the other schedulers of a shared CPU have queued (see `_others`)."""
        queue = self._queue
        ahead = queue.ahead_of(key) if self._edf else len(queue)
        rows_ahead = ahead * queue.rows // len(queue) if ahead else 0
        busy_until: list[int] = self._busy_until
        if self._paced:
            # (each instance free when its batches end, plus what its own run of `rows` takes
            # over the profile's: `exec_ns` below is the profile's)
            run = self.profile.predict(rows)
            busy_until = [
                max(now, busy) + int((speed.value - 1.0) * run)
                for busy, speed in zip(busy_until, self._speeds, strict=True)
            ]
        if others is not None:
            # NOTE: the CPU runs the others' booked batches first. Its batches take turns (see
            # ledger.py), so this model's instances there run one batch at a time, as one
            # instance: the work ahead of a request is not shared out between them (two
            # instances on the one core of a 2-core machine admitted requests as if each had a
            # core)
            busy_until = [max(self._core_free(now), *busy_until)]
        finish = predict_finish(
            now_ns=now,
            rows=rows,
            rows_ahead=rows_ahead,
            busy_until_ns=busy_until,
            # NOTE: a min over every batch size: only worth it with a backlog to cost
            per_row_ns=self.profile.per_row_ns() if rows_ahead else 0.0,
            exec_ns=self._exec_ns(rows),
        )
        if others is not None and others.slack_ns < NO_SLACK:
            # NOTE: the others' queued work goes ahead only where it cannot wait for this
            # request's batch (their slack): otherwise its batch takes the CPU's next turn (see
            # `_holds_back`). Counted ahead of every request whatever its due time, a flood of
            # resnet requests without one had deeplob, sharing its CPU, refuse 305 of 355
            # requests due in 20 ms as "predicted to finish in 2,417,714 µs (0 requests ahead)".
            # But the part of their work that cannot wait (all of it but its slack) goes ahead
            # whatever this request's run: counted all or nothing, two schedulers each found the
            # other's slack roomy and admitted as if the CPU were theirs alone (38 requests due
            # in 25 ms on a CPU that runs 25)
            if others.slack_ns < self._estimate(rows):
                finish += others.backlog_ns
            else:
                finish += max(0, others.backlog_ns - others.slack_ns)
        return finish, ahead

    def _extra_bytes(self, sent: int, rows: int) -> int:
        """Input bytes `sent` for `rows` beyond their rows' worth of the profile samples' bytes,
        where they are far bigger than them (0: predicted by the profile alone)."""
        base = rows * self._sample_row_bytes
        return 0 if sent <= _BIG_INPUT_FACTOR * base else sent - base

    def _admit(
        self,
        now: int,
        due_ns: int,
        rows: int,
        key: tuple[int, int, int],
        extra_bytes: int = 0,
        arrival_ns: int | None = None,
        passes_on: bool = False,
        by_default: bool = False,
    ) -> bool:
        """Admit a request due at `due_ns`, or raise why not; True when it is admitted as a
        probe though predicted to miss (see PROBE_NS). `passes_on`: a refusal for its due time
        (`Overloaded`) is not counted, a cheaper variant is offered the request next (see
        `submit_nowait`). `by_default`: the model's `default_timeout_ms` set `due_ns`, as a
        refusal says.

        NOTE: a refusal for the due time told every request to "send a larger timeout", which
        could not help one due by the default (a KServe V1 predict can send none; found by a
        tester). Then it was told by the due time's length: a request's own timeout of the
        default's length was "due by the default, it sent no timeout", and an Engine call that
        sent none, with no arrival time, was told to send a larger timeout (another tester).

        NOTE: a refusal the engine passes on to a cheaper variant (`Engine._queue`) counted here
        too (rejected, the failures' time, a miss for the load shedder), and the request counted
        again where it ran, or was refused in the end: one request counted once per variant it
        passed through (model statistics' `fail.count` rose for requests answered 200, 1500
        requests sent were counted 1501; found by a tester). It counts where it ends, as one
        handed over after admission does; passing it on still marks this variant refusing
        (`_refused_ns`, `_refusing`: it is backlogged for the router, and refreshes a stale
        profile)."""
        others = self._others(now)
        self._admitted_others = others
        finish, ahead = self._predict(now, rows, key, others)
        extra_ns = self._size_cost.predict(extra_bytes)
        finish += extra_ns
        needed = finish + self._kept_for(rows)
        rejection = admit(now_ns=now, due_ns=due_ns, predicted_finish_ns=needed)
        if rejection is not None and self._forget_old_margins(now):
            needed = finish + self._kept_for(rows)
            rejection = admit(now_ns=now, due_ns=due_ns, predicted_finish_ns=needed)
        if rejection is None:
            if self._probe_gap_ns != PROBE_NS:  # (it fits again: see PROBE_MAX_NS)
                self._probe_gap_ns = PROBE_NS
            return False
        impossible = now + self._exec_ns(rows) + extra_ns + self._kept_for(rows) > due_ns
        if not impossible:
            # NOTE: only a refusal for the work ahead of it tells of a backlog: one whose due
            # time no idle instance could meet (a client's impossible timeouts) told the router
            # so too, and it sent every other client's requests to cheaper variants meanwhile
            self._refused_ns = now
        if rejection.late:
            self._expired += 1
            if arrival_ns is not None and arrival_ns + self._exec_ns(rows) > due_ns:
                # NOTE: its timeout was shorter than a run even from its arrival: the
                # client's, not a miss of a busy server. Counted as one, a test sending
                # 1 µs timeouts on a loaded machine had the load shedder refuse the next
                # test's requests (RESOURCE_EXHAUSTED, 1 full suite in 2)
                self._impossible += 1
            self._fail_ns += self._clock.now_ns() - now
            default = self.default_timeout_ns if by_default else None
            if default is None:
                why = (
                    "its timeout is too short, or it waited that long to be read: the server "
                    "is overloaded"
                )
                advice = "send a larger timeout or retry later"
            elif self._exec_ns(rows) > default:
                why = f"{_default_words(default)}, less than a run of the model takes"
                advice = "raise the model's default_timeout_ms"
            else:
                why = (
                    f"{_default_words(default)}, and it waited that long to be read: the "
                    "server is overloaded"
                )
                advice = "retry later, or raise the model's default_timeout_ms"
            raise DeadlineExceeded(
                f"{TIMEOUT_EXPIRED}: model {self._label}: the request was due "
                f"{(now - due_ns) / 1e3:.0f} µs before it reached the scheduler ({why}); {advice}"
            )
        if not self._edf:
            return False  # FIFO, like Triton, admits whatever fits the queue
        if (
            now - self._last_run_ns >= PROBE_NS
            and now - self._probed_ns >= self._probe_gap_ns
            and (needed - now <= PROBE_FACTOR * (due_ns - now) or self.profile.guessed)
            and self.idle
        ):
            self._last_run_ns = self._probed_ns = now
            self._probes += 1
            gap = 2 * self._probe_gap_ns
            self._probe_gap_ns = gap if gap < PROBE_MAX_NS else PROBE_MAX_NS
            return True
        if (
            extra_ns
            and needed - extra_ns <= due_ns
            and self.idle
            and self._size_cost.may_probe(extra_bytes, now)
        ):
            # NOTE: refused for its size's cost alone, which only runs of that size measure:
            # an estimate too long would refuse the size for good (see SizeCost). The profile
            # alone predicts it on time: no hopeless check fails it unrun.
            self._probes += 1
            return False
        if not passes_on:
            self._rejected += 1
            if impossible:
                self._impossible += 1
            elif self._refused_for_own_work(now, needed, due_ns, arrival_ns):
                self._own_capacity += 1
            self._fail_ns += self._clock.now_ns() - now
        self._refusing = True
        self.refresh_if_stale(now)
        kept = needed - finish
        margins = f" (+{kept / 1e3:.0f} µs kept for margins and delivery)" if kept >= 1000 else ""
        default = self.default_timeout_ns if by_default else None
        if default is None:
            advice = "; retry with a larger timeout or later"
        elif self._exec_ns(rows) + extra_ns + kept > default:
            advice = (
                f": {_default_words(default)}, less than a run of the model takes; raise the "
                "model's default_timeout_ms"
            )
        else:
            advice = (
                f": {_default_words(default)}; retry later, or raise the model's default_timeout_ms"
            )
        raise Overloaded(
            f"model {self._label}: predicted to finish in {(finish - now) / 1e3:.0f} µs"
            f"{margins} but due in {(due_ns - now) / 1e3:.0f} µs ({ahead} requests ahead)"
            f"{advice}",
            retry_after_s=max(0.001, (finish - now) / 1e9),
        )

    def _refused_for_own_work(
        self, now: int, needed: int, due_ns: int, arrival_ns: int | None
    ) -> bool:
        """Whether a request refused at admission, predicted to need until `needed` but due at
        `due_ns`, would have been refused had the loop taken it in as it arrived (`arrival_ns`;
        None: now): its model's instance threads, on cores of their own, are busy, and refusing
        requests early cannot make them go faster. The load shedder counts no miss for it.

        NOTE: counted as misses, they had the load shedder refuse a growing share of every
        request unread, the loop of a model on threads being busy (its core shared with the
        client), until the instance ran short of work: resnet on the 2-core VM at twice its
        capacity (2,750 requests/s, 10/50 ms due times, 12 s runs interleaved) shed 9,602 and
        10,203 requests unread, its instance's core idle 16-18% of the time, and answered
        1,198 and 1,235 a second on time; not counted, it shed 2,299 and 1,561, its core idle
        8-9%, and answered 1,347 and 1,370 (the fuller queue made larger batches). Refused for
        the loop's lateness (taken in as it came, it would have been admitted), a refusal
        still counts: a loop behind its sockets still sheds. A model
        run on the loop, or sharing its core (`SMALL_MODEL_NS`), has no capacity apart from
        the loop's: its refusals count too."""
        if self._inline or self._depth == 1:
            return False
        lag = 0 if arrival_ns is None or arrival_ns > now else now - arrival_ns
        return needed - lag > due_ns

    def _run_ns(self, requests: list[QueuedRequest], rows: int, instance: int) -> int:
        """Predicted time from starting a batch of `requests` (`rows`) to its result on the
        loop: `_exec_ns`, or more for inputs far bigger than the profile's samples, as
        admission predicts them (see `SizeCost`).

        NOTE: the instance's busy-until used the profile alone: a 400-row request to a model
        of free size, admitted on its size (hundreds of ms), was booked at 15 ms, and the
        requests behind it were admitted and planned for a start long before it ended."""
        run = self.profile.predict(rows)  # (`_exec_ns`, its frame less)
        speed = self._speeds[instance].value
        if speed != 1.0:
            run = int(run * speed)
        run += int(self._overhead_ns)
        if not self._size_cost:
            return run
        return run + self._size_cost.predict(self._extra_bytes(_input_bytes(requests), rows))

    def _exec_ns(self, rows: int) -> int:
        """Predicted time from starting a batch of `rows` to its result on the loop, on an
        instance at the profile's pace (see `_on` for a given one)."""
        return self.profile.predict(rows) + int(self._overhead_ns)

    def _on(self, instance: int, rule: Callable[[int], int] | None) -> Callable[[int], int] | None:
        """`rule` (what a batch of so many rows needs, at the profile's pace, as `_exec_ns`
        predicts) for a batch on `instance`: its run takes longer by as much as the instance is
        slower (see `InstanceSpeed`)."""
        excess = self._speeds[instance].value - 1.0
        if rule is None or excess == 0.0:
            return rule
        predict = self.profile.predict

        def on_instance(rows: int) -> int:
            needed = rule(rows)
            return needed if needed >= NO_SLACK else needed + int(excess * predict(rows))

        return on_instance

    def _queued_work(self, now: int) -> Queued:
        """The work queued and not started, at the saturated per-row cost, and its slack (what
        the ledger tells the other schedulers of the CPU). The slack looks at the first
        `_SLACK_SCAN` requests: in EDF order the tightest are near the head."""
        queue = self._queue
        if not len(queue):
            return Queued(0, NO_SLACK)
        # NOTE: the other schedulers ask at every arrival they route or admit; between two
        # changes of this queue only the time moves, which takes from the slack
        key = (len(queue), queue.rows, min(self._busy_until))
        cached = self._queued_cache
        if cached is not None and cached[0] == key:
            # (its work starts when the first instance is free: only the time past that
            # takes from the slack; taken from it whatever, a queue behind a long running
            # batch read slack 0, and the others never held for it or counted it late)
            _, at, work = cached
            free = key[2]
            spent = max(now, free) - max(at, free)
            return Queued(work.backlog_ns, max(0, work.slack_ns - max(0, spent)))
        # NOTE: shadow copies (last in the queue) are no work the other schedulers must leave
        # room or slack for: they run when the CPU has time (see `submit_shadow`)
        count, rows = len(queue), queue.rows
        while count and queue[count - 1].level >= SHADOW_LEVEL:
            count -= 1
            rows -= queue[count].rows
        per_row = self.profile.per_row_ns()
        finish = max(now, min(self._busy_until)) + int(self._overhead_ns)
        slack = NO_SLACK
        for index in range(min(count, _SLACK_SCAN)):
            item = queue[index]
            finish += int(item.rows * per_row)
            if item.due_ns is not None:
                slack = min(slack, item.due_ns - finish - self._margin_ns)
        work = Queued(int(rows * per_row), max(0, slack))
        self._queued_cache = (key, now, work)
        return work

    def _others(self, now: int) -> Queued | None:
        """What the other schedulers of this CPU have queued (None: the CPU is not shared)."""
        ledger = self._ledger
        if ledger is None or not ledger.shared:
            return None
        return ledger.others_queued(self._owners[0][0], now)

    def _core_free(self, now: int, instance: int = 0) -> int:
        """When the batches booked on this CPU by others than `instance` end (`now` if none
        runs): other schedulers' and this one's other instances'.

        NOTE: it left out instance 0's booking whichever instance asked: with two instances on
        one core, the second planned its batch to start at once while the first's ran, and it
        waited for its turn (see `_start`)."""
        ledger = self._ledger
        if ledger is None or not ledger.shared:
            return now
        return ledger.others_until(self._owners[instance], now)

    def _margin_for(self, rows: int) -> int:
        """Time kept before the due time of a batch of `rows`: `delivery_margin_us` for getting
        the answer out, plus a share of its predicted execution for its variance: `exec_margin`,
        or more where runs lately overran their predictions by more (see `Overrun`), plus what
        the tail of the hand-offs adds to their mean (see `_handoff`), plus what answers late
        all the same lately missed by (see `LateMargin`).

        NOTE: the loop's mean lag is already in `_overhead_ns` (measured up to the moment the
        loop takes the result); counting it here too made a saturated loop refuse everything.
        The tail counts for at most `HANDOFF_TAIL_MAX` runs of the batch, for the same reason."""
        run = self.profile.predict(rows)
        # (conditionals, not min() and max(): it is asked at every admission)
        share = self._overrun.factor - 1.0
        if share < self._exec_margin:
            share = self._exec_margin
        tail = int(self._handoff.value - self._overhead_ns)
        if tail < 0:
            tail = 0
        elif tail > HANDOFF_TAIL_MAX * run:
            tail = HANDOFF_TAIL_MAX * run
        return self._margin_ns + tail + int(share * run) + self._late_margin.value

    def _forget_old_margins(self, now: int) -> bool:
        """Let the margins learnt from runs (`_overrun`, `_handoff`) forget the runs older than
        a second, and the one learnt from late answers (`_late_margin`) halve as it does, though
        no run came since; True if that changed them.

        NOTE: they are read again only as runs end, and a scheduler that refuses everything
        runs nothing: its margins stayed those of its last bad stretch. `duetime itch run
        --deadline-us 200` (a 14 µs model, answers in ~100 µs) refused 60-99.7% of its
        requests, after a stall had set the overrun to 6x, every refusal keeping 146 µs "for
        margins"; on a machine that is still slow, the next run teaches them again."""
        overrun, handoff = self._overrun.factor, self._handoff.value
        self._overrun.age(now)
        self._handoff.age(now)
        aged = self._late_margin.age(now)
        return aged or self._overrun.factor != overrun or self._handoff.value != handoff

    def _estimate(self, rows: int) -> int:
        """What a request of `rows` needs before its due time, run at once: its batch's run and
        margin, and settling its own answer (see `_answer_ns`)."""
        return self._exec_ns(rows) + self._kept_for(rows)

    def _kept_for(self, rows: int) -> int:
        """Kept before the due time of a request of `rows` beyond its run: its batch's margin
        and settling its own answer."""
        return self._margin_for(rows) + int(self._answer_ns)

    def _bare_estimate(self, rows: int) -> int:
        """`_estimate` without the margins kept for what may go wrong: the profile's prediction
        of the run, settling the request's own answer, and what answers late all the same
        lately missed by (`LateMargin`: what did go wrong). A request its batch was held for
        is failed unrun only when this no longer fits (see `batching.is_hopeless`).

        NOTE: without the late answers' margin, the requests of an inline model held for its
        loop's turn (see `submit_nowait`) ran with what slack they had left: 0.15% of mlp's
        answers were late at 150% of capacity on the 2-core VM, not 0.08%."""
        return self._exec_ns(rows) + int(self._answer_ns) + self._late_margin.value

    def _batch_estimate(self, rows: int) -> int:
        """What a batch of `rows` needs before its first answer is settled; `plan_batch` adds
        the answers settled before each request's own (`answer_ns`)."""
        return self._exec_ns(rows) + self._margin_for(rows)

    # -- dispatch ------------------------------------------------------------------------------

    def _idle_instance(self, now: int) -> int | None:
        """An idle instance that may run, the fastest of them (see `_speeds`); None: none."""
        best, best_speed = None, 0.0
        for instance, jobs in enumerate(self._outstanding):
            if not jobs and (not self._tripped or self._breakers[instance].allows(now)):
                if not self._paced:
                    return instance
                speed = self._speeds[instance].value
                if best is None or speed < best_speed:
                    best, best_speed = instance, speed
        return best

    def _has_slot(self) -> bool:
        return any(len(jobs) < self._depth for jobs in self._outstanding)

    def _slot(self, now: int) -> tuple[int, int] | None:
        """The instance whose next batch starts soonest (of instances at different paces, whose
        run of a row would end soonest: see `_speeds`), and when; None if all are committed.

        A busy instance takes a lookahead batch only shortly before the batches handed to it
        end (a timer brings the scheduler back then): `_LOOKAHEAD_MIN_NS` before, or twice the
        mean hand-off, or the recent tail of the hand-offs (`_handoff`), the longest. A closed
        scheduler (`aclose`) takes one at once: no request can come any more to join it.

        NOTE: planned a millisecond (or two hand-offs) ahead, and one batch at most, the next
        batch of a busy loop came too late: a batch's result and the hand-over of the next one
        wait for the loop's turn, and resnet on the 2-core VM at twice its capacity (its loop
        reading ~2,750 requests a second) left its instance's thread idle 11% of the time,
        waiting ~650 µs (median) after each of a quarter of its runs for the next batch; its
        runs of 1-2 rows take 0.7-1.3 ms, shorter than the tail of the waits. Planned as far
        ahead as the tail of the hand-offs (2-5 ms there), up to `LOOKAHEAD_BATCHES` deep: 12 s
        runs interleaved with the code before, 1,202, 1,237 and 1,269 answers a second on time
        against 1,193, 1,159 and 1,163. In bench/scheduling.py, an hour apart (bare ONNX
        Runtime 4% faster in the second run), capacity went from 1,376 to 1,565 answers a
        second, and saturated throughput from 91% to 94% of bare ONNX Runtime's.

        NOTE: a request queued on a version at its reload waited 2.5-6.2 s (median 45 ms; with
        a 1 s deadline one a swap failed). Old and new version shared a CPU: the old one waited
        for the new one's booked batch to end, but the new one, its fresh profile
        overestimating its runs, ended each early and started its next at once (the old one had
        booked nothing), and the old one's timer always found the CPU booked again. Handed over
        now, the batch takes its turn on the CPU (see ledger.py) before the new one's next."""
        best: tuple[int, int] | None = None
        best_end = 0
        paced = self._paced
        one_row = self.profile.predict(1) if paced else 0
        if self._closed:
            lead = NO_SLACK
        else:
            lead = max(_LOOKAHEAD_MIN_NS, 2 * int(self._overhead_ns), int(self._handoff.value))
        for instance, jobs in enumerate(self._outstanding):
            if len(jobs) >= self._depth:
                continue
            if self._tripped and not self._breakers[instance].allows(now):
                breaker = self._breakers[instance]
                if breaker.state is BreakerState.OPEN:
                    self._arm_timer(breaker.open_until_ns, now)
                continue
            busy_until = self._busy_until[instance]
            if len(jobs) > 1 and busy_until + _REVOKE_AFTER_NS < now:
                continue  # overrunning: one batch waits behind it, no more (see `_revoke_passed`)
            start = max(now, busy_until) if jobs else now
            start = max(start, self._core_free(now, instance))
            if start - now > lead:
                self._arm_timer(start - lead, now)
                continue
            # (the one whose run of a row would end first: that starts first, at one pace)
            end = start + int((self._speeds[instance].value - 1.0) * one_row) if paced else start
            if best is None or end < best_end:
                best, best_end = (instance, start), end
        return best

    def _dispatch(self) -> None:
        queue = self._queue
        estimate = self._deadline_rule()
        bare = self._bare_rule()
        while len(queue):
            now = self._clock.now_ns()
            slot = self._slot(now)
            if slot is None:
                break
            instance, start = slot
            on = self._on
            hopeless = drop_hopeless(
                queue, now_ns=start, estimate=on(instance, estimate), bare=on(instance, bare)
            )
            self._expire_hopeless(hopeless, now, start)
            decision = plan_batch(
                queue,
                now_ns=start,
                max_rows=self._max_rows,
                max_delay_ns=self._max_delay_ns,
                estimate=self._within_others_slack(on(instance, self._batch_rule()), now),
                bucket_of=self.profile.bucket_of,
                answer_ns=int(self._answer_ns),
                wake_slack_ns=self._wake_slack_ns,
                preferred=self._preferred,
                bare=(
                    self._within_others_slack(on(instance, self._exec_ns), now)
                    if self._edf
                    else None
                ),
                window_estimate=None if self._edf else on(instance, self._batch_estimate),
                max_bytes=self._max_batch_bytes,
            )
            if decision is None:
                break
            if isinstance(decision, Wait):
                for item in decision.held:
                    item.held = True
                self._arm_timer(max(decision.until_ns, now), now, due_bound=decision.due_bound)
                return
            if decision.requests[0].level >= SHADOW_LEVEL and self._outstanding[instance]:
                # NOTE: shadow copies start on an idle instance only (its end dispatches again):
                # committed behind its running batch, a copy kept a real request that came in
                # meanwhile waiting for the copy's whole run
                break
            ledger = self._ledger
            if ledger is not None:
                others = self._others(now)
                held = 0
                if others is not None and 0 < others.slack_ns < NO_SLACK:
                    mine = self._queued_work(now).slack_ns
                    held = self._turn_held(start, decision.rows, mine, others)
                if held and ledger.hold(self._owners[0][0], self._others_booked, now):
                    self._arm_timer(now + held, now)
                    break
                ledger.unhold(self._owners[0][0])
            queue.take(decision.taken)
            self._start(decision.requests, decision.rows, decision.bucket, instance, start, now)
        if not len(queue) and self._ledger is not None:
            self._ledger.settled(self._owners[0][0])  # (nothing left to hold, or held for)
        if self._drain_waiter is not None:
            self._wake_drain_waiter()

    def _turn_held(self, start: int, rows: int, mine: int, others: Queued | None) -> int:
        """0 where a batch of `rows` may be handed over now to start at `start`, this
        scheduler's queued work having slack `mine` (see `_queued_work`); else it waits for the
        more urgent work the other schedulers of its shared CPU have queued (`others`) to take
        the CPU's next turn, and this is how long at most (until their slack is spent): it
        would end past their slack, and theirs is the shorter. Never where their slack is spent
        already (0: their work is late whoever goes, so the CPU goes on), and only one
        scheduler of a CPU holds at a time (see `CoreLedger.hold`).

        NOTE: the turns go in hand-over order (see ledger.py), and each scheduler hands its next
        batch over shortly before its last one ends (`_slot`): a scheduler with a backlog due
        whenever took every next turn, ahead of another's request its admission had placed
        behind the running batch alone (`_predict`), which then missed its due time. It
        compared the others' queue's slack with this batch's own due time: with both queues
        overloaded (each one's slack 0, each head batch with slack of its own) each held for
        the other, neither booked anything to wake the other, and the CPU stood idle while 19
        queued requests of each expired."""
        if others is None or not 0 < others.slack_ns < NO_SLACK:
            return 0
        if self._batch_estimate(rows) <= others.slack_ns or mine <= others.slack_ns:
            return 0
        return max(others.slack_ns, _LOOKAHEAD_MIN_NS)

    def _holds_back(
        self, item: QueuedRequest, instance: int, now: int, others: Queued | None = None
    ) -> bool:
        """`item`, started alone on idle `instance`, would take the turn of the others' more
        urgent work (see `_turn_held`): it goes through the queue and `_dispatch` instead.
        `others`: what admission found the others had queued (None: looked up here)."""
        if others is None:
            others = self._others(now)
        # (the common case first: the others have nothing due queued)
        if others is None or not 0 < others.slack_ns < NO_SLACK:
            return False
        start = self._core_free(now, instance)
        took = self._batch_estimate(item.rows)
        due = item.due_or_never
        mine = NO_SLACK if due >= NO_SLACK else max(0, due - start - took - self._margin_ns)
        if not self._turn_held(start, item.rows, mine, others):
            return False
        ledger = self._ledger
        return ledger is not None and ledger.hold(self._owners[0][0], self._others_booked, now)

    def _others_booked(self) -> None:
        """Another scheduler of the CPU booked its instance (a batch handed over, or one ended):
        a batch held back for its queued work (see `_turn_held`) may go now."""
        self._loop.call_soon(self._dispatch)

    def _kick(self) -> None:
        """Inline: dispatch once the loop has taken in what this turn brought.

        NOTE: one callback per loop turn, however many requests arrive in it: every request read
        in the turn can join the batch, and the batch's answers are written in the same turn.
        Dispatching at each arrival would run every request of a busy loop alone, and handing
        each result back by a callback of its own (as from a thread) would keep the instance
        busy, and the next batch waiting, for a whole extra turn of a busy loop."""
        if not self._kicked:
            self._kicked = True
            self._kicked_ns = self._clock.now_ns()
            self._loop.call_soon(self._kicked_dispatch)

    def _runs_now(self, run_now: bool) -> bool:
        """Inline: whether a request its caller would take the run of within `submit_nowait`
        (`run_now`: the in-process Engine's, a feed's) runs there, without waiting for the
        loop's next turn (`_kick`): the first such request of a turn, or one more of the task
        whose request ran so this turn (it had its answer: it calls one after another), not
        one submitted while a batch settles (a callback of its answer).

        NOTE: a call of `Engine.infer_async` on an idle inline model went through two more turns
        of the loop (the kick, then the awaiting task's wake-up): ~10% of the in-process path's
        cost for `mlp` on the 2-core VM. The first request of a turn alone: the others of that
        turn (an `asyncio.gather` of many, each its own task) wait for the kick and go
        together, as before. A task awaiting its calls one by one never yields between them
        (its answer is there at once): held to one a turn, every other call of its took the
        kick (P50 +80 µs added over ORT, not +40)."""
        task = self._turn_for(run_now)
        if task is None:
            return False
        self._take_turn(task)
        return True

    def _turn_for(self, run_now: bool) -> object | None:
        """`_runs_now`'s answer without taking the turn: the task (`_NO_TASK` for none) whose
        request would run within its call, None where it would wait for the kick."""
        if not run_now or self._settling:
            return None
        task = _current_task(self._loop) or _NO_TASK
        ran = self._ran_now
        if ran is None or (ran is task and task is not _NO_TASK):
            return task
        return None

    def _take_turn(self, task: object) -> None:
        """`task`'s request runs within its call (`_turn_for` said so): the first of the turn
        takes it, for the rest of the turn."""
        if self._ran_now is None:
            self._ran_now = task
            self._loop.call_soon(self._turn_over)

    def _turn_over(self) -> None:
        self._ran_now = None

    def _kicked_dispatch(self) -> None:
        self._kicked = False
        self._dispatch_turn()
        waited: float = self._clock.now_ns() - self._kicked_ns
        known = self.turn_wait_ns
        if waited > 2 * known + 1_000_000:  # one stall must not double it (see `_learn_answer`)
            waited = 2 * known + 1_000_000
        self.turn_wait_ns = known + TURN_WAIT_ALPHA * (waited - known)

    def _dispatch_turn(self) -> None:
        """The dispatch of a turn's requests (`_kicked_dispatch`): one alone at once, or
        `_dispatch`."""
        queue = self._queue
        if len(queue) == 1 and self._max_delay_ns == 0:
            now = self._clock.now_ns()
            if self._idle_instance(now) is not None:
                (item,) = queue.take(1)
                if not item.future.done():  # (done: cancelled by its client)
                    if item is not self._probe and is_hopeless(
                        item, now, self._deadline_rule(), self._bare_rule()
                    ):
                        # the loop was held past its due time since its admission
                        self._expire([item], now)
                    else:
                        self._start_alone(item, 0, now)
                if self._drain_waiter is not None:  # (an inline batch is over when it returns)
                    self._wake_drain_waiter()
                return
        self._dispatch()
        self._arm_sweeper()

    def _wake_drain_waiter(self) -> None:
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done() and self.idle:
            waiter.set_result(None)

    def _start_alone(self, item: QueuedRequest, instance: int, now: int) -> None:
        """Start `item` as a batch of its own on an idle instance.

        NOTE: the common case at light load, decided without the batch policy: an idle instance
        and nothing else waiting means the batch is this request alone, now. Its due time was
        checked at admission; a caller on a later turn of the loop checks it again. On a CPU
        whose batches take turns, it starts when the batches booked there end."""
        bucket = self.profile.bucket_of[item.rows] if self._max_rows else 0
        start = now if self._ledger is None else self._core_free(now, instance)
        self._start([item], item.rows, bucket, instance, start, now)

    def _arm_sweeper(self) -> None:
        if self._sweeper is None and (len(self._queue) or self._waiting()):
            self._sweep_at = self._clock.now_ns() + _SWEEP_NS
            self._sweeper = self._loop.call_later(_SWEEP_S, self._on_sweep_timer)

    def _waiting(self) -> bool:
        """Some batch handed to an instance waits for another to end (see `_sweep_committed`)."""
        for jobs in self._outstanding:
            for running in jobs:
                if running.job is not None and running.job.start_by and not running.taken:
                    return True
        return False

    def _arm_timer(self, until_ns: int, now_ns: int, *, due_bound: bool = False) -> None:
        """Wake `_dispatch` at `until_ns`, unless the timer is armed no later already.
        `due_bound`: see `_timer_due_bound`."""
        if self._timer is not None:
            if self._timer_at <= until_ns:
                if self._timer_at == until_ns and due_bound:
                    self._timer_due_bound = True
                return
            self._timer.cancel()
        self._timer_at = until_ns
        self._timer_due_bound = due_bound
        self._timer = self._loop.call_at(
            self._loop.time() + (until_ns - now_ns) / 1e9, self._on_timer
        )

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_due_bound = False
        late = self._clock.now_ns() - self._timer_at
        slack = self._wake_slack_ns
        if late > slack:
            self._wake_slack_ns = min(late, WAKE_SLACK_MAX_NS)
        elif slack > self._wake_slack_base_ns:
            self._wake_slack_ns = slack - ((slack - self._wake_slack_base_ns) >> 4)
        self._dispatch()

    def _on_sweep_timer(self) -> None:
        """The sweeper's timer: how late it came raises the wake slack too (see
        `WAKE_SLACK_NS`), and a batching window that ends early for a due time
        (`Wait.due_bound`) is planned again with it: it ends earlier, or its batch starts now.
        Other timers stay: a window bounded by `max_queue_delay_us` alone (no due time, or one
        far enough) and a batch held for another scheduler's turn (`_turn_held`) end when
        they end, whatever the slack.

        NOTE: only the window's own wake-ups measured their lateness, after the fact: on a busy
        machine a lone request held for batchmates (due in 50 ms, a 2.7 ms run, 1.6 ms of
        margins) was woken over 4 ms later than planned, with 2.2 ms left, and failed unrun.
        The sweeper wakes every millisecond while requests queue: its lateness is the loop's
        while the window waits.
        NOTE: it pulled any armed timer earlier by the raise: a window with no due time
        (max_queue_delay_us 5 ms) woke at 2.3 ms after one sweep 3 ms late, to plan the same
        wait again, an extra wake-up each time a busy loop raised the slack; and a window's
        timer pulled into the past woke only on a later loop turn, counting the pull as its
        own lateness."""
        now = self._clock.now_ns()
        late = now - self._sweep_at
        if late > self._wake_slack_ns:
            self._wake_slack_ns = min(late, WAKE_SLACK_MAX_NS)
            if self._timer is not None and self._timer_due_bound:
                self._dispatch()  # (`_arm_timer` keeps the earlier of the two wake-ups)
        self._sweep()

    def _sweep(self) -> None:
        """Fail every queued request that can no longer make it, not only those at the head."""
        self._sweeper = None
        now = self._clock.now_ns()
        hopeless = sweep_hopeless(
            self._queue, now_ns=now, estimate=self._deadline_rule(), bare=self._bare_estimate
        )
        self._expire_hopeless(hopeless, now)
        queue = self._queue
        self._sweeps += 1
        if self._edf and (queue.outranked or not self._sweeps % _OUTRANKED_EVERY):
            queue.outranked = False
            if queue.mixed:  # (one level: nothing is outranked; the walk's inputs cost)
                hopeless.extend(self._expire_outranked(now))
        if hopeless and self._ledger is not None:
            self._ledger.settled(self._owners[0][0])  # (a batch held for them may go)
        self._sweep_committed(now)
        if self._depth > 1:
            self._revoke_passed(now)
        if self._drain_waiter is not None:
            self._wake_drain_waiter()
        if not self._drained:  # (closed, it sweeps on while it drains)
            self._arm_sweeper()

    def _expire_outranked(self, now: int) -> list[QueuedRequest]:
        """Fail the requests that the levels of higher priority ahead of them leave no time for
        (see `batching.sweep_outranked`); those failed."""
        outranked = sweep_outranked(
            self._queue,
            free_ns=[max(now, busy) for busy in self._busy_until],
            per_row_ns=self.profile.per_row_ns(),
            bare=self._bare_estimate,
            max_rows=self._max_rows,
        )
        for item, start in outranked:
            self._expire_hopeless([item], now, start, outranked=True)
        return [item for item, _ in outranked]

    def _sweep_committed(self, now: int) -> None:
        """Fail the requests of batches handed over but not started (a lookahead batch behind
        an overrunning one, a batch waiting for its turn on a shared CPU) that can no longer be
        answered in time even alone, and take back (`BatchJob.revoked`) each batch that would
        answer one of its requests late: its thread skips it, and the rest are planned again.

        NOTE: such a batch has left the queue, so the queue's sweep never saw it, and
        `_revoke_passed` acts only when a more urgent request arrives: a hopeless request
        committed behind a batch that overran heard its 504 when that batch ended, 100-400 ms
        after its due time. A batch its thread took (`_Running.taken`) runs: its requests are
        left alone. The thread may take it just as it is revoked here; then it runs, and the
        requests failed here (each predicted to be late even started now) keep their 504, and
        those a cheaper variant took over here are answered there (`_settle_batch`).

        NOTE: a request a cheaper variant took over here stays in the batch, unsettled, until
        that variant answers it; each later round (every millisecond) found it hopeless again
        and offered it again: to the next cheaper variant, which queued it too (both ran it,
        the first answer was delivered, and the ticket named the last variant that took it:
        int8-dynamic's answers labelled `int8-static`, found by a tester), or, with none left,
        failed it 504 here while its variant was about to answer. It is offered once.

        FIFO mode fails a request of such a batch once its due time has passed, as Triton's
        queue does (its batcher hands a batch over only to a free instance: the rest wait in
        the queue), and runs the rest.
        NOTE: FIFO ran whatever it handed over: a request handed over behind a run that never
        ended waited with it, past its due time, for as long as the run took (CI's machine,
        slow enough at load to give a small model lookahead batches, timed out after 30 s)."""
        edf = self._edf
        for jobs in self._outstanding:
            ahead = now  # (a lookahead batch behind another waiting one starts after that one)
            for running in jobs:
                job = running.job
                if job is None or job.start_by is None or running.taken:
                    continue
                late = ahead + running.predicted_ns
                hopeless = []
                swept = running.swept
                for item in running.requests:
                    if item.due_ns is None or item.future.done() or (swept and _among(item, swept)):
                        continue
                    if not edf:
                        if item.due_ns <= now:
                            hopeless.append(item)
                    elif late + self._kept_for(item.rows) > item.due_ns:
                        job.revoked = True
                        if is_hopeless(item, now, self._estimate, self._bare_estimate):
                            hopeless.append(item)
                if hopeless:
                    running.swept = [*running.swept, *hopeless]
                self._expire(hopeless, now)
                if not job.revoked:  # (its thread skips one taken back)
                    ahead = late

    def _deadline_rule(self) -> Callable[[int], int] | None:
        return self._estimate if self._edf else None

    def _batch_rule(self) -> Callable[[int], int] | None:
        return self._batch_estimate if self._edf else None

    def _bare_rule(self) -> Callable[[int], int] | None:
        return self._bare_estimate if self._edf else None

    def _within_others_slack(
        self, estimate: Callable[[int], int] | None, now: int
    ) -> Callable[[int], int] | None:
        """`estimate` for planning a batch on a CPU other schedulers share: a batch longer than
        the slack of their queued requests would make them late, so it grows no further (its
        first request still runs: it was admitted; after theirs where they are the more urgent,
        see `_turn_held`)."""
        others = None if estimate is None else self._others(now)
        if estimate is None or others is None or others.slack_ns >= NO_SLACK:
            return estimate
        slack = others.slack_ns

        def bounded(rows: int) -> int:
            return estimate(rows) if self._exec_ns(rows) <= slack else NO_SLACK

        return bounded

    def _expire_hopeless(
        self,
        hopeless: list[QueuedRequest],
        now: int,
        start: int | None = None,
        outranked: bool = False,
    ) -> None:
        """Fail the requests the queue found hopeless, but the probe (see PROBE_NS), which goes
        back to the queue to run.

        NOTE: a probe is admitted because it is predicted to miss, so the dispatch found it
        hopeless and failed it unrun, and its run never corrected the margins: `duetime itch
        run --deadline-us 200` (an inline model) refused 82-99.9% of its requests, for the
        rest of the run once a stall had raised the overrun to 6x, with a probe admitted (and
        expired) every 100 ms."""
        probe = self._probe
        if probe is not None and _among(probe, hopeless):
            hopeless = [item for item in hopeless if item is not probe]
            self._queue.restore(probe)
        self._expire(hopeless, now, start=start, outranked=outranked)

    def _expire(
        self,
        hopeless: list[QueuedRequest],
        now: int,
        skipped: _Running | None = None,
        start: int | None = None,
        outranked: bool = False,
    ) -> None:
        """Fail `hopeless`, unrun, but those a cheaper variant of the version takes over (see
        `QueuedRequest.fallback`): counted there, where they run, not here.

        NOTE: a request admitted here with a tight due time that became hopeless as it waited
        (a run ahead of it overran, or the model ran slower than predicted) failed 504 while a
        cheaper variant sat idle that could still answer it: 0.5-3% of the requests at 40 req/s
        (found by a tester). The router and admission choose a variant by `fits` as a request
        arrives; this is the same choice made again as its time runs out."""
        if hopeless:
            hopeless = self._drop_shadows(hopeless, now)  # (not refused: see `submit_shadow`)
            if hopeless:
                self._refused_ns = now
        for item in hopeless:
            fallback = item.fallback
            if fallback is not None and fallback(item, now):
                self._handed_over += 1
                continue
            self._expired += 1
            self._fail_ns += now - item.arrival_ns
            if item.timing is not None:
                _timing_failed_unrun(item.timing, now)
            _settle(item, DeadlineExceeded(self._expiry(item, now, skipped, start, outranked)))

    def _expiry(
        self,
        item: QueuedRequest,
        now: int,
        skipped: _Running | None = None,
        start: int | None = None,
        outranked: bool = False,
    ) -> str:
        """Why `item` fails unrun (see `_expire`); `skipped`: the batch its instance's thread
        took past its latest start (see `_start_by`); `start`: the earliest an instance could
        start it, where it was judged from then (later than `now`: an instance is busy, or
        `outranked`: requests of higher priority go first).

        NOTE: judged from `start`, the message counted from now: "(3019 µs left): a run needs
        522 µs (+2452 µs kept for margins and delivery)", which fits (found by a tester).

        NOTE: a FIFO request held in its batching window (`max_queue_delay_us`) past its due
        time was told "(-498 µs left): a run needs 3692 µs": as if its run were the cause. And
        a skipped batch's requests were told of the profile's run of their rows, not of the
        batch's predicted run (which counts its inputs' size): "(160626 µs left): a run needs
        2889 µs" (found by a tester)."""
        due = item.due_ns if item.due_ns is not None else now
        said = f"{TIMEOUT_EXPIRED}: model {self._label}: could not finish before the due time"
        if skipped is not None:
            return (
                f"{said} ({(due - now) / 1e3:.0f} µs left): its batch's run needs "
                f"{skipped.predicted_ns / 1e3:.0f} µs, and its instance was free to start it "
                "only after the latest start that met the due time (a run ahead of it took "
                "longer than predicted); it was not run"
            )
        if item.held and self._inline and not self._max_delay_ns:
            why = "waited for its batch to gather the requests of the event loop's turn"
        elif item.held:
            why = (
                f"waited for more requests to join its batch (max_queue_delay_us "
                f"{self._max_delay_ns // 1000})"
            )
        else:
            why = "waited in the queue"
        if due <= now:
            return (
                f"{said}: it passed {(now - due) / 1e3:.0f} µs ago while the request {why}; "
                "it was not run"
            )
        kept = 0 if item.held and self._edf else self._kept_for(item.rows)
        margins = f" (+{kept / 1e3:.0f} µs kept for margins and delivery)" if kept > 999 else ""
        held = f"; the request {why}," if item.held else ";"
        busy = ""
        if start is not None and start > now:
            busy = f", and the earliest an instance can start it is in {(start - now) / 1e3:.0f} µs"
            if outranked:
                busy += " (requests of a higher priority level go first)"
        return (
            f"{said} ({(due - now) / 1e3:.0f} µs left): a run needs "
            f"{self._exec_ns(item.rows) / 1e3:.0f} µs{margins}{busy}{held} it was not run"
        )

    def _start(
        self,
        requests: list[QueuedRequest],
        rows: int,
        bucket: int,
        instance: int,
        start: int,
        now: int,
    ) -> None:
        """Start `requests` (`rows` in all, run padded to `bucket`) on `instance` at `start`.

        NOTE: given a batch's parts, not its `Run`: a request started alone (`_start_alone`, the
        common case at light load) made a frozen `Run` for nothing but this call."""
        probing = self._probe is not None and self._takes_probe(requests)
        queue_time = self._queue_time
        for item in requests:
            waited = start - item.arrival_ns  # (`LatencyHistogram.observe`, without its frame)
            queue_time.counts[bisect_left(LATENCY_BOUNDS_NS, waited)] += 1
            queue_time.sum_ns += waited
            if item.timing is not None:
                _timing_started(item.timing, now, start, rows, instance)
        if self._tripped:
            self._breakers[instance].started()
        predicted = self._run_ns(requests, rows, instance)
        running = _Running(requests, bucket, now, rows, None, start, predicted)
        running.cold = probing or self._cold(now)
        self._outstanding[instance].append(running)
        self._busy_until[instance] = start + predicted
        if self._ledger is not None:
            self._ledger.book(self._owners[instance], self._busy_until[instance])
        if len(requests) == 1:  # (no comprehensions: a frame each)
            job = BatchJob([requests[0].feeds], [rows], bucket, self._finish)
        else:
            job = BatchJob(
                [i.feeds for i in requests], [i.rows for i in requests], bucket, self._finish
            )
        if self._inline:
            self._complete(self._executor.run_now(instance, job))
            return
        if self._ledger is not None and self._ledger.shared:
            _take_turn(job, self._ledger.turns, predicted)
        if not probing and (len(self._outstanding[instance]) > 1 or job.turn is not None):
            # NOTE: it waits for another batch (its instance's, or its turn on a shared CPU),
            # which may overrun: its thread skips it past its `start_by`, and until then the
            # sweeper fails those of its requests that can no longer make it (see
            # `_sweep_committed`). The second of two instances sharing the one core of a 2-core
            # machine ran its batch whenever its turn came: answers 300-600 ms late. A probe's
            # batch runs whenever its turn comes: predicted to miss, it would be skipped. (FIFO
            # mode's waits too, until its due times pass: see `_sweep_committed`.)
            job.start_by = self._start_by(running)
        # (its thread runs only the requests not settled meanwhile: a client that withdrew from
        # a batch waiting its turn had its request run all the same)
        job.futures = [requests[0].future] if len(requests) == 1 else [i.future for i in requests]
        running.job = job
        if job.start_by is not None:
            self._arm_sweeper()  # (after `running.job`: `_waiting` finds the job by it)
        self._executor.submit(instance, job)
        if self._watcher is None:  # (one timer for all the runs of the model: no cost per batch)
            self._watcher = self._loop.call_later(WATCH_EVERY_NS / 1e9, self._watch)

    def _watch(self) -> None:
        """Stop each run on an instance thread whose every request is past its due time by
        `STOP_GRACE_NS` or withdrawn by its client (`Executor.terminate`): its requests are
        answered 504 (or counted cancelled) by `_stopped`, and the instance is free. Armed again
        while any batch is handed to a thread.

        NOTE: a run was never stopped: a Loop whose trip count came from the input ran 16 s for
        a request with a 1 s timeout (answered 200 then), and one whose client had gone 1 s in
        kept running while the next small request waited 35 s (found by a tester).

        NOTE: it stopped watching once `aclose` began (and `_sweep` stopped arming itself): on
        a version a reload replaced, a run past its due time ran on, its client unanswered,
        and the requests queued behind it waited up to the whole drain (30 s) to fail unrun
        (found reading the code for a tester's stalled swap, whose cause was another: see
        `_slot`). It watches, and sweeps, until the drain ends."""
        self._watcher = None
        if self._drained:
            return
        now = self._clock.now_ns()
        busy = False
        for instance, jobs in enumerate(self._outstanding):
            if not jobs:
                continue
            busy = True
            running = jobs[0]
            job = running.job
            if job is None or running.stopping or not running.requests:
                continue  # (inline, being stopped, or the samples' run)
            for item in running.requests:
                if not item.future.done() and (
                    item.due_ns is None or now < item.due_ns + STOP_GRACE_NS
                ):
                    break
            else:
                if self._executor.terminate(instance, job):
                    # NOTE: answered now, not when ORT returns: it stops between two nodes, and
                    # a run of one big node (a MatMul sized from the input: 2.6 s) kept its 504
                    # until it ended, 2.5 s past the due time (found by a tester). The instance
                    # stays busy till then (`_complete`)
                    running.stopping = True
                    self._stopped(running, now)
        if busy:
            self._watcher = self._loop.call_later(WATCH_EVERY_NS / 1e9, self._watch)

    def _stopped(self, running: _Running, now: int) -> None:
        """Settle the requests of a run `_watch` stopped: 504 for those past their due time,
        cancelled for those withdrawn. Not an execution, nor the model's failure, nor a time
        for its profile. A shadow copy's is dropped, uncounted (see `submit_shadow`).

        NOTE: a stopped copy was counted expired: a shadow of 0.4 s a run showed 98 expired
        requests that no client sent (the shadow's statistics counted them dropped too), and
        the load shedder, reading them as missed due times, refused 9 of 1,305 real requests
        to the answering version with 429 (found by a tester).

        NOTE: one a cheaper variant took over while the batch waited (`_sweep_committed`),
        which its thread took all the same, is that variant's to answer and count: it was
        failed 504 here (and counted expired here, then cancelled there)."""
        swept = running.swept
        for item in running.requests:
            if item.level >= SHADOW_LEVEL:
                _settle(item, DeadlineExceeded(
                    f"{TIMEOUT_EXPIRED}: model {self._label}: shadow copy's run stopped past "
                    "its due time"
                ))  # fmt: skip
                continue
            if swept and _among(item, swept):
                continue  # (failed unrun, counted then; or the cheaper variant's)
            if item.future.done():
                self._cancelled += 1
                self._fail_ns += now - item.arrival_ns
                continue
            self._expired += 1
            self._given_up += 1
            self._fail_ns += now - item.arrival_ns
            if item.timing is not None:
                _timing_failed_unrun(item.timing, now)
            late = (now - (item.due_ns or now)) / 1e6
            _settle(item, DeadlineExceeded(
                f"{TIMEOUT_EXPIRED}: model {self._label}: its run was still going {late:.0f} ms "
                "past its due time, and was given up (ONNX Runtime stops it at its next node)"
            ))  # fmt: skip

    def _takes_probe(self, requests: list[QueuedRequest]) -> bool:
        """Whether a batch of `requests` runs the probe (see PROBE_NS); a probe started, or
        withdrawn by its client, is no longer one."""
        probe = self._probe
        assert probe is not None
        taken = _among(probe, requests)
        if taken or probe.future.done():
            self._probe = None
        return taken

    def _revoke_passed(self, now: int) -> None:
        """Take back a lookahead batch that the queue's most urgent request should run before,
        while the batch ahead of it overruns its prediction: its requests are planned again
        when the instance is free. Asked at each arrival and each round of the sweeper.

        NOTE: a lookahead batch is planned shortly before the running one is predicted to end;
        one that then ran far longer (0.3 s against 15 ms predicted) kept the next batch
        committed all the while, and requests of a higher priority or an earlier due time that
        arrived meanwhile ran after it. On schedule, it stands: what arrives in the last
        millisecond waits for the next batch, and the pipeline keeps its thread busy. Asked at
        arrivals only, a request that arrived in that last millisecond still ran after the
        lookahead batch when the running one then overran by 300 ms: the sweeper's rounds
        catch it once the overrun shows."""
        for instance, jobs in enumerate(self._outstanding):
            if len(jobs) < 2:
                continue
            # (`_busy_until` is the last lookahead batch's predicted end: the running one's ends
            # where the lookahead batches' runs begin)
            running_ends = self._busy_until[instance]
            for committed in islice(jobs, 1, None):
                running_ends -= committed.predicted_ns
            if now <= running_ends + _REVOKE_AFTER_NS:
                continue
            item = self._most_urgent()
            if item is None:
                continue
            for committed in islice(jobs, 1, None):
                job = committed.job
                if job is not None and any(item.key < w.key for w in committed.requests):
                    job.revoked = True

    def _most_urgent(self) -> QueuedRequest | None:
        """The first queued request its client has not withdrawn (None: none)."""
        queue = self._queue
        for index in range(len(queue)):
            if not queue[index].future.done():
                return queue[index]
        return None

    def _start_by(self, running: _Running) -> tuple[Callable[[], int], int]:
        """For a batch that waits for another: a clock for its thread that marks it taken
        (`_Running.taken`), and the last instant it may start for its last-due request to be
        answered in time (never, if a request has no due time: it must run).

        NOTE: a lookahead batch waits on its instance's thread and is planned to start when the
        batch ahead of it is predicted to end; when that one overran (a stalled vCPU, say), the
        thread took the next batch whatever the time, and ran requests past their due times: 3
        of the 8 answers the server itself counted late in one resnet run at twice its
        capacity. Skipped, they fail as expired, and the thread moves on. FIFO mode's latest
        start is the last due time itself: its batch waits as its requests would in the queue
        (see `_sweep_committed`)."""
        last_due = 0
        for item in running.requests:
            if item.due_ns is None:
                last_due = NO_SLACK
                break
            last_due = max(last_due, item.due_ns)
        now_ns = self._clock.now_ns

        def taken() -> int:
            running.taken = True
            return now_ns()

        return taken, last_due - running.predicted_ns if self._edf else last_due

    def _finish(self, result: BatchResult) -> None:
        """An instance thread's result, on the loop."""
        self._complete(result)
        self._dispatch()

    def _ended(self, instance: int, now: int) -> _Running:
        """The instance's oldest batch, which just ended; the next (if any) starts."""
        jobs = self._outstanding[instance]
        running = jobs.popleft()
        job = running.job
        if job is not None:
            # NOTE: its `start_by` clock holds `running`, which holds the job: a cycle only the
            # collector frees, with every request of the batch (their inputs, so their whole
            # bodies), and the runtime tuning makes it rare. A model with two instances on a
            # shared core gave every batch a `start_by`: 2,500 requests of 1 MB grew the server
            # by 1.6 GB before a collection (found by a tester)
            job.start_by = None
        if jobs:  # the lookahead batch started as this one ended (the others wait behind it)
            jobs[0].started_ns = now
            ends = now
            for waiting in jobs:
                ends += waiting.predicted_ns
            self._busy_until[instance] = ends
        else:
            self._busy_until[instance] = 0
        if self._ledger is not None:
            self._ledger.book(self._owners[instance], self._busy_until[instance])
        return running

    def refresh_if_stale(self, now: int) -> None:
        """Run the sample inputs once on an idle instance, to check the profile, when this
        variant refuses requests (or the router passes it over) on its predictions and has not
        run for `REFRESH_NS`: a profile taken on a busy CPU would otherwise keep it refusing
        for good (see `LatencyProfile.recalibrate`). Thread-run models only.

        The run starts on a later callback of the loop (`_refresh_soon`), after the request
        that was refused or passed over has gone where it goes. The margins learnt from runs
        forget those older than a second first (see `_forget_old_margins`)."""
        self._forget_old_margins(now)
        if self._stale(now):
            self._refreshing = True
            self._loop.call_soon(self._refresh_soon)

    def _stale(self, now: int) -> bool:
        """`refresh_if_stale`'s conditions: a sample run would check the profile now."""
        return not (
            self._sample is None
            or self._refreshing
            or self._closed
            or self._inline
            or now - self._last_run_ns < REFRESH_NS
            or len(self._queue)
            or self._outstanding[0]
            or not self.available(now)
        )

    def _refresh_soon(self) -> None:
        """`refresh_if_stale`'s run, unless requests wait on this CPU: it never takes the CPU
        ahead of them (the next request refused or passed over asks again).

        NOTE: started at once, on a CPU a cheaper variant shares (see ledger.py), the run took
        its turn before the request the router then sent that variant: a request due in 5 ms
        after a second of quiet waited behind the primary's 3 ms sample run, and was refused
        or expired where the variant needed 0.7 ms. Now it runs after what the router and the
        schedulers did in the turn that asked for it, and only while nothing is queued on its
        CPU: a batch already handed over runs first, in the order of the CPU's turns."""
        now = self._clock.now_ns()
        self._refreshing = False
        others = self._others(now)
        if not self._stale(now) or (others is not None and others.backlog_ns):
            return
        if self._run_sample(0, now, self._refreshed):
            self._refreshing = True
            self._last_run_ns = now

    def _run_sample(self, instance: int, now: int, on_done: Callable[[BatchResult], None]) -> bool:
        """Hand the sample inputs (one row) to `instance` if it has no batch, for `on_done` to
        judge (it must end the run with `_ended`); False if it could not (no samples, an inline
        model, a busy instance, shutting down)."""
        if self._sample is None or self._inline or self._closed or self._outstanding[instance]:
            return False
        rows = 1
        bucket = self.profile.bucket_of[rows] if self._max_rows else 0
        job = BatchJob([self._sample()], [rows], bucket, on_done)
        predicted = self._run_ns([], rows, instance)
        start = self._core_free(now, instance)  # (after the batches booked on a shared CPU)
        self._outstanding[instance].append(_Running([], bucket, now, rows, job, start, predicted))
        self._busy_until[instance] = start + predicted
        if self._ledger is not None:
            self._ledger.book(self._owners[instance], self._busy_until[instance])
            if self._ledger.shared:  # (it takes its turn on the CPU, as a batch does)
                _take_turn(job, self._ledger.turns, predicted)
        if self._tripped:
            self._breakers[instance].started()
        self._executor.submit(instance, job)
        return True

    def _refreshed(self, result: BatchResult) -> None:
        now = self._clock.now_ns()
        running = self._ended(result.instance, now)
        self._refreshing = False
        outputs = result.outputs
        if not result.skipped and outputs and not isinstance(outputs[0], DuetimeError):
            pace = self._speeds[result.instance].pace
            self.profile.recalibrate(running.bucket or 1, int(result.compute_ns / pace))
        self._dispatch()

    def _complete(self, result: BatchResult) -> None:
        """Settle the requests of a finished batch and learn from its run."""
        now = self._ran()
        instance = result.instance
        running = self._ended(instance, now)
        if running.stopping or result.terminated:  # (see `_watch`)
            if self._tripped:
                self._breakers[instance].release()
            if not running.stopping:  # (its requests not answered yet)
                self._stopped(running, now)
            return
        if result.skipped:  # its thread took it too late to run (see `_start_by`), or revoked
            if self._tripped:  # (a probe not run tells nothing: without this, never another)
                self._breakers[instance].release()
            # (one swept unsettled was handed over to a cheaper variant: its answer comes there)
            live = [
                item
                for item in running.requests
                if not item.future.done() and not _among(item, running.swept)
            ]
            for item in running.requests:
                if item.future.done() and not _among(item, running.swept):
                    self._cancelled += 1
                    self._fail_ns += now - item.arrival_ns
            if result.job.revoked:
                for item in live:
                    self._queue.restore(item)
            else:  # (FIFO's: taken past its last due time, as if it had waited in the queue)
                self._expire(live, now, running if self._edf else None)
            return
        # (the inputs' bytes matter only where a request can be bigger than the samples)
        sent = _input_bytes(running.requests) if self._sample_row_bytes else 0
        requests = running.requests
        rows = running.rows
        # (a request whose future is done before its batch settles was cancelled by its client,
        # or failed unrun while its batch waited: it gets no answer from this run)
        outputs = result.outputs
        if len(outputs) == 1:
            answered = not isinstance(outputs[0], DuetimeError) and not requests[0].future.done()
        else:
            answered = any(
                not isinstance(o, DuetimeError) and not item.future.done()
                for item, o in zip(requests, outputs, strict=True)
            )
        cold = running.cold
        self._record(result, answered, rows, running.bucket, running.started_ns, cold, now, sent)
        self._judge(instance, rows, result, now, sent)
        late = self._late
        self._settling = True
        try:
            self._settle_batch(running, result, now)
        finally:
            self._settling = False
        if self._late != late:  # (rare: no cost per batch but this comparison)
            self._count_late(
                self._late - late, running.queued_until_ns, running.started_ns,
                running.predicted_ns, result, now,
            )  # fmt: skip
        self._learn_answer(self._clock.now_ns() - now, len(requests), cold)

    def _count_late(
        self, count: int, planned_ns: int, started_ns: int, predicted_ns: int,
        result: BatchResult, now: int,
    ) -> None:  # fmt: skip
        """`count` answers of a batch planned to start at `planned_ns` and end `predicted_ns`
        later, handed over at `started_ns` and settled `now`, were late: count them by cause."""
        cause = late_cause(
            planned_start_ns=planned_ns, started_ns=started_ns, waited_ns=result.waited_ns,
            predicted_ns=predicted_ns, overhead_ns=int(self._overhead_ns),
            compute_ns=result.compute_ns, ended_ns=now,
        )  # fmt: skip
        self._late_by[cause] = self._late_by.get(cause, 0) + count
        if cause != "plan":  # (a probe, planned past its due time, teaches no margin)
            self._late_margin.late(self._late_ns, self._late_budget_ns, now)
        self._late_ns, self._late_budget_ns = 0, NO_SLACK

    def _ran(self) -> int:
        """A run just ended: now, on the scheduler's clock."""
        now = self._last_run_ns = self._clock.now_ns()
        self._refusing = False
        return now

    def _cold(self, now: int) -> bool:
        """Whether a run starting `now` (not the probe's) is cold: see `COLD_AFTER_NS`."""
        return self._refusing and now - self._last_run_ns >= COLD_AFTER_NS

    def _learn_answer(self, took_ns: int, requests: int, cold: bool) -> None:
        """Fold the time a finished batch's answers took to settle (`took_ns` for `requests`)
        into `_answer_ns`.

        NOTE: the batch's last answer leaves after all the others are encoded and written:
        measured over HTTP on the 2-core VM, 25-75 µs a request for mlp and 115-135 µs for
        resnet (whose loop shares the GIL with its instance thread): milliseconds for 32"""
        # (conditionals, not min() and max(): a builtin's call costs more, on every run)
        known = self._answer_ns
        answer = took_ns / requests if requests > 1 else took_ns
        if answer > 2 * known + 100_000:  # one stall must not double it
            answer = 2 * known + 100_000
        if cold and known and answer > known:  # (see `_record`)
            answer = known
        self._answer_ns = known + _OVERHEAD_ALPHA * (answer - known)

    def _settle_batch(self, running: _Running, result: BatchResult, now: int) -> None:
        answered = queued = 0
        queued_until = running.queued_until_ns  # (the planned start, as `queue_time` has it)
        # NOTE: the run began its measured time on its thread before its result reached the
        # loop (at most the hand-off later than it really did). Traced requests had its planned
        # start (the predicted end of the batch ahead): a batch ahead that ended early left
        # their `execute` span shorter than its compute time, or dropped it (see `_timing_ran`)
        began = now - result.input_ns - result.compute_ns - result.output_ns
        swept = running.swept
        for item, outputs in zip(running.requests, result.outputs, strict=True):
            if item.future.done() or (swept and _among(item, swept)):
                # (cancelled by its client while it ran; or, swept, failed unrun while its batch
                # waited: counted so; or handed over to a cheaper variant then, which answers)
                if not _among(item, swept):
                    self._cancelled += 1
                    self._fail_ns += now - item.arrival_ns
            elif isinstance(outputs, DuetimeError):
                self._count_failure(now - item.arrival_ns)
                if item.timing is not None:  # (it ran: its span shows the run it failed in)
                    _timing_ran(item.timing, now, began, result.compute_ns)
                _settle(item, outputs)
            else:
                if item.timing is not None:
                    _timing_ran(item.timing, now, began, result.compute_ns)
                answered += 1
                queued += queued_until - item.arrival_ns
                self._count_success(now - item.arrival_ns, item.due_ns, item.rows, now, item.level)
                # (`_settle`, without its frame: its future was found not done above, and
                # nothing since ran a callback that could settle it)
                item.future.set_result(outputs)  # type: ignore[attr-defined]
                if item.on_done is not None:
                    item.on_done()
        if answered:
            self._count_answered(answered, queued, result)

    def _count_failure(self, took_ns: int) -> None:
        """A request its run failed, `took_ns` after it arrived."""
        self._failed += 1
        self._fail_ns += took_ns

    def _count_success(
        self, took_ns: int, due_ns: int | None, rows: int, now: int, level: int = 0
    ) -> None:
        """A request of `rows` at queue `level` answered `now`, `took_ns` after it arrived. A
        shadow copy's answer is never late: its due time only bounds how long it may wait to
        be dropped (see `submit_shadow`), no client waits for it (the tester's slow shadow
        showed 31-129 late answers of requests no client sent)."""
        self._succeeded += 1
        self._inferences += rows
        if due_ns is not None and now > due_ns and level < SHADOW_LEVEL:
            self._late += 1
            if now - due_ns > self._late_ns:
                self._late_ns = now - due_ns
            if due_ns - now + took_ns < self._late_budget_ns:
                self._late_budget_ns = due_ns - now + took_ns
        else:
            self._on_time += 1
        request_time = self._request_time  # (`LatencyHistogram.observe`, without its frame)
        request_time.counts[bisect_left(LATENCY_BOUNDS_NS, took_ns)] += 1
        request_time.sum_ns += took_ns

    def _count_answered(self, answered: int, queued_ns: int, result: BatchResult) -> None:
        """The `answered` requests of a batch (`queued_ns` their queue times, summed).

        NOTE: as Triton's, the queue and compute times count the requests that succeeded only,
        so that each has the successes' count (a failed or cancelled request's queue time is in
        `queue_time` alone); each got its whole batch's run"""
        self._queue_ns += queued_ns
        self._request_compute_ns += answered * result.compute_ns
        self._request_input_ns += answered * result.input_ns
        self._request_output_ns += answered * result.output_ns

    def _judge(self, instance: int, rows: int, result: BatchResult, now: int, sent: int) -> None:
        """Tell the instance's breaker how this execution went; fail the queue fast if that
        left no instance to run it."""
        outputs = result.outputs
        # NOTE: ordered so that a healthy execution costs two comparisons and two stores.
        failed = (
            bool(outputs)
            and isinstance(outputs[0], DuetimeError)
            and all(isinstance(o, DuetimeError) for o in outputs)
        )
        breaker = self._breakers[instance]
        if not failed:
            self._answered_ns = now
            self._clients_failures = 0
        elif _clients_fault(outputs):
            # NOTE: every request of the batch was answered 400: ONNX Runtime refused their
            # values (an index out of range, say). That is no fault of the model, nor a failed
            # probe, unless the model also fails on its own sample inputs (`_suspect` runs them,
            # rate-limited): the next batch probes. Counted as the model's failure once nobody
            # had been answered within `open_s`, 5 requests with a bad index from one client to
            # a healthy model that was idle opened its breaker, every other client got 503, and
            # one bad request per half-open period kept it open (found by a tester).
            result.outputs = self._explained(outputs)
            if self._tripped:
                breaker.release()
            self._suspect(instance, now)
            return
        elif now - self._answered_ns < self._trust_ns and all(
            isinstance(o, InvalidInput) for o in outputs
        ):
            # NOTE: a ModelOutputError (a string output that is not UTF-8) may follow some
            # requests' values too: while the model answered others lately, it is not counted.
            failed = False
        # (the floor first, without `_slow`'s frame: a run under it, nearly every one, is not)
        slow = (
            self._predictable_cost
            and result.compute_ns > self._slow_floor_ns
            and self._slow(rows, result, sent)
        )
        if not (failed or slow or self._tripped):
            breaker.clear()
            return
        was_closed = breaker.state is BreakerState.CLOSED
        opened = breaker.record(now, failed=failed, slow=slow)
        if was_closed and opened:
            self._tripped += 1
            self._opened(instance, now, "failures" if failed else "slow executions")
        elif not was_closed and breaker.state is BreakerState.CLOSED:
            self._tripped -= 1
            log.warning("model %s instance %d: breaker closed", self._label, instance)
        if opened and not self.available(now):
            self._fail_queued(self.unavailable_error(now), now)

    def _slow(self, rows: int, result: BatchResult, sent: int) -> bool:
        """Whether an execution ran far longer than its profile predicts for its batch, for no
        reason its inputs or outputs explain (see the NOTEs)."""
        compute = result.compute_ns
        factor = self._breaker_config.slow_factor
        expected = self.profile.predict(rows) * self._speeds[result.instance].value
        if compute <= self._slow_floor_ns or compute <= factor * expected:
            return False
        if sent > rows * self._sample_row_bytes:
            # NOTE: inputs bigger than the profile's samples (free dims: a model that does not
            # batch takes any size): a long run is their size, not a model fault. Any bigger,
            # not only `slow_factor` times: a cost that grows faster than the bytes (attention
            # over a longer sequence: 3x the bytes, 9x the time) made valid inputs "slow".
            return False
        sample_made = self.profile.sample_output_row_bytes
        if sample_made is not None:
            made = sum(
                a.nbytes
                for o in result.outputs
                if not isinstance(o, DuetimeError)
                for a in o.values()
            )
            if made > factor * rows * max(1, sample_made):
                # NOTE: likewise outputs far bigger than the samples' (their size follows the
                # input values: Expand, Range, NonZero): 25 M floats from a 16-byte request
                # opened the breaker of a model whose samples made none
                return False
        return True

    def _explained(self, outputs: Sequence[Feeds | DuetimeError]) -> list[Feeds | DuetimeError]:
        """The failures of a batch ONNX Runtime refused on its inputs' values, saying they were
        taken to be the clients' (400): the model's only where it fails its own samples too.

        NOTE: "against the circuit breaker": the request is counted as failed in the statistics
        and metrics (the model ran and failed on it, as Triton counts it); it said "not counted
        as the model's failure", which those figures contradicted."""
        explained: list[Feeds | DuetimeError] = []
        for output in outputs:
            if isinstance(output, InvalidInput) and output.http_status < 500:
                explained.append(InvalidInput(
                    f"{output.message}; not counted against model {self._label}'s circuit "
                    "breaker (it is checked on its own sample inputs), so check these inputs"
                ))  # fmt: skip
            else:
                explained.append(output)
        return explained

    def _opened(self, instance: int, now: int, why: str) -> None:
        log.warning(
            "model %s instance %d: breaker open for %.1f s after %s", self._label, instance,
            self._breakers[instance].retry_after_ns(now) / 1e9, why,
        )  # fmt: skip

    def _suspect(self, instance: int, now: int) -> None:
        """An execution failed on its clients' data, not counted (see `_judge`): after
        `breaker.failures` of them with no answer to anyone in between (or at once, for a
        failed half-open probe), check whether the model answers its own sample inputs
        (`_checked`): a model that fails on them opens at once. At most one check per `open_s`:
        a flood of bad requests does not run the samples for each."""
        self._clients_failures += 1
        if now - self._checked_ns < self._trust_ns:
            return
        if (
            self._clients_failures < self._breaker_config.failures
            and self._breakers[instance].state is BreakerState.CLOSED
        ):
            return
        if self._inline and self._sample is not None and not self._closed:
            # (on the loop, after the batch's answers: an inline model is short by definition)
            self._checked_ns = now
            self._clients_failures = 0
            self._loop.call_soon(self._check_inline, instance)
        elif self._run_sample(instance, now, self._checked):
            self._checked_ns = now
            self._clients_failures = 0

    def _check_inline(self, instance: int) -> None:
        """`_suspect`'s sample run for an inline model, on the loop."""
        if self._closed or self._sample is None:
            return
        rows = 1
        bucket = self.profile.bucket_of[rows] if self._max_rows else 0
        job = BatchJob([self._sample()], [rows], bucket, _ignore)
        result = self._executor.run_now(instance, job)
        outputs = result.outputs
        self._samples_judged(instance, not outputs or isinstance(outputs[0], DuetimeError))
        self._dispatch()

    def _checked(self, result: BatchResult) -> None:
        """The sample inputs' run that `_suspect` asked for, on the loop: a model that fails on
        the very inputs it answered at load is at fault, whatever its clients sent: its
        breaker opens (the breaker is for that model: it is shed, and the router sends its
        requests to a healthy version or variant). One that answers them stays as it was: its
        samples clear no real request's failure (see the NOTE below)."""
        now = self._clock.now_ns()
        instance = result.instance
        self._ended(instance, now)
        outputs = result.outputs
        # NOTE: samples that answered clear no request's failure (`_answered_ns` is for real
        # requests' answers): their clients' values are at fault
        failed = not outputs or isinstance(outputs[0], DuetimeError)
        if not result.skipped:
            self._samples_judged(instance, failed)
        self._dispatch()

    def _samples_judged(self, instance: int, failed: bool) -> None:
        """The sample inputs' run ended: open the instance's breaker if it `failed`; while
        half-open, a probe that answered them ends the probe (the next batch probes)."""
        now = self._clock.now_ns()
        breaker = self._breakers[instance]
        if not failed:
            if self._tripped:
                breaker.release()
            return
        was_closed = breaker.state is BreakerState.CLOSED
        if breaker.trip(now):
            if was_closed:
                self._tripped += 1
            self._opened(instance, now, "failing on its own sample inputs")
            if not self.available(now):
                self._fail_queued(self.unavailable_error(now), now)

    def available(self, now: int) -> bool:
        """Whether some instance's breaker lets work through (or will once its probe ends)."""
        if not self._tripped:
            return True
        return any(
            b.state is not BreakerState.OPEN or now >= b.open_until_ns for b in self._breakers
        )

    def unavailable_error(self, now: int) -> ModelUnavailable:
        wait_ns = min(b.retry_after_ns(now) for b in self._breakers)
        return ModelUnavailable(
            f"model {self._label} is failing (circuit breaker open on every instance); retry "
            f"in {wait_ns / 1e9:.1f} s",
            retry_after_s=max(0.001, wait_ns / 1e9),
        )

    def _record(
        self,
        result: BatchResult,
        answered: bool,
        rows: int,
        bucket: int,
        started_ns: int,
        cold: bool,
        now: int,
        sent: int,
    ) -> None:
        """Count a finished run of `rows` (run padded to `bucket`), handed to its instance at
        `started_ns`, and learn its times; `answered`: some request of it got its outputs."""
        compute = result.compute_ns
        compute_time = self._compute_time  # (`LatencyHistogram.observe`, without its frame)
        compute_time.counts[bisect_left(LATENCY_BOUNDS_NS, compute)] += 1
        compute_time.sum_ns += compute
        self._instance_runs[result.instance] += 1
        self._instance_compute_ns[result.instance] += compute
        outputs = result.outputs
        if len(outputs) == 1:
            clean = not isinstance(outputs[0], DuetimeError)
        else:
            clean = not any(isinstance(o, DuetimeError) for o in outputs)
        if answered:
            # NOTE: as Triton's, an execution in which every request failed is no execution
            # (its ONNX Runtime backend reports batch statistics only when not all responses
            # failed); `compute_time` counts it. Nor is one whose every request its client
            # cancelled while it ran: it answered none (counted, an HTTP client hanging up on
            # a long run made execution_count and nv_inference_exec_count 4 for 3 answers)
            self._last_ms = time.time_ns() // 1_000_000
            alone = result.alone
            if alone is None:
                # NOTE: by rows as sent, not the bucket run (5 rows padded to 6 show as 5):
                # Triton's batch_stats, and how full the batches are, is what a reader of them
                # wants to know
                self._count_execution(rows, compute, result.input_ns, result.output_ns)
            else:
                # NOTE: its requests ran one by one (the batch failed, or its outputs could not
                # be split): each run that answered is an execution of its request's rows. The
                # batch counted as one of all its rows, a failed request's among them: the
                # rows of batch_stats exceeded inference_count, which Triton's equal (a tester)
                for outcome, own, times in zip(result.outputs, result.job.rows, alone, strict=True):
                    if times is not None and outcome and not isinstance(outcome, DuetimeError):
                        self._count_execution(own, times[0], 0, times[1])
        if self._learns_sample:
            self._keep_sample(result.job, outputs)
        if not clean:
            return
        bucket = bucket or 1
        if sent and self._big_inputs(sent, rows, compute, now):
            return
        profile = self.profile
        predicted = profile.predict(bucket)
        instance = result.instance
        speed = self._speeds[instance].value
        if speed != 1.0:
            predicted = int(predicted * speed)
        # NOTE: a run after a stretch of refusals is cold (see COLD_AFTER_NS), and its times
        # are not those of the runs admitting more would bring: folded in, the probes and the
        # few requests admitted in such a stretch raised orderbook's 1-row estimate from 15
        # µs to 29, its overhead from 22 µs to 33 and the overrun to 5-8x, and `duetime itch
        # run --deadline-us 200` refused everything from then on. They count where they are
        # shorter (a profile taken on a busy CPU); the runs admitted after them teach what a
        # slow machine does.
        cold = cold and not profile.guessed
        if not cold or compute < predicted:
            self._overrun.observe(predicted, compute, now)
            teaches = True
            pace = 1.0
            if len(self._speeds) > 1:
                teaches = self._learn_speed(instance, bucket, compute, now)
                pace = self._speeds[instance].pace
            if teaches:
                profile.observe(bucket, compute if pace == 1.0 else int(compute / pace))
        # NOTE: a wait for the CPU's turn was planned for (`_core_free`): not hand-off cost
        overhead = now - started_ns - compute - result.waited_ns
        if overhead < 0:  # (conditionals, not min() and max(): see `_learn_answer`)
            overhead = 0
        known = self._overhead_ns
        if cold and known:  # (nor does its hand-off count towards the tail)
            if overhead > int(known):
                overhead = int(known)
        elif not self._inline:  # an inline batch's result is on the loop as it ends
            self._handoff.observe(overhead, now)
        if overhead > int(2 * known) + 200_000:  # see LatencyProfile
            overhead = int(2 * known) + 200_000
        self._overhead_ns = known + _OVERHEAD_ALPHA * (overhead - known)

    def _learn_speed(self, instance: int, bucket: int, compute_ns: int, now: int) -> bool:
        """Fold a run of `instance` (of `bucket`, that took `compute_ns`, ended `now`) into its
        speed (see `InstanceSpeed`): its time over instance 0's lately for the same bucket, where
        one of instance 0's runs of that bucket ended during it or `PACE_WINDOW_NS` before its
        end; instance 0's run into that time. (Against the profile, which follows the runs
        slowly, a slowdown every instance shared read as the first runs' own: see
        `InstanceSpeed`.) True where the run teaches the profile too: not while its instance's
        pace is still being learnt from instance 0's runs (a slow instance's first runs would
        drag the profile, and with it the pace of instance 0 that the others' are compared
        with)."""
        own = self._own_times.get(bucket)
        # (within the window of this run's end, or during the run: one of 300 ms on a slow
        # instance beside a 100 ms one on instance 0 ends 200 ms after instance 0's)
        recent = own is not None and now - own[1] <= PACE_WINDOW_NS + compute_ns
        if not instance:
            if own is not None and recent:
                compute_ns = int(own[0] + OWN_TIME_ALPHA * (compute_ns - own[0]))
            self._own_times[bucket] = (compute_ns, now)
            return True
        speed = self._speeds[instance]
        if own is None or not recent or own[0] <= 0:  # (nothing to compare with)
            return True
        speed.observe(compute_ns / own[0])
        self._paced = any(other.value != 1.0 for other in self._speeds)
        return speed.known

    def _keep_sample(self, job: BatchJob, outputs: Sequence[Feeds | DuetimeError]) -> None:
        """Keep a copy of the first row of `job`'s first request that ran cleanly (its
        `outputs` not an error) as the sample inputs `_suspect` checks the model with (and
        `refresh_if_stale` runs), where the made-up samples failed at load; one over
        SAMPLE_KEEP_BYTES (a string counted by its length) is not kept (the next is looked at).
        A batch whose other requests failed counts: a tester's first good request shared one
        with bad ones, and was not learnt.

        NOTE: with samples that fail (a OneHotEncoder refusing the made-up strings, a graph
        that runs at one sequence length only), the check after 5 requests refused on their
        values (400) found the model failing its samples and opened its breaker: one client's
        5 bad requests had every client refused 503 for 5 s, again and again (found by a
        tester). A model that has answered nobody yet is still checked on the made-up samples:
        one failing every input, its samples too, is taken to be at fault."""
        # (an output for each request, but a whole batch's one failure: no request ran)
        pairs = zip(job.feeds, outputs, strict=False)
        batched = self._max_rows > 1 or job.bucket > 0
        for feeds, out in pairs:
            if isinstance(out, DuetimeError):
                continue
            rows = {
                name: array[:1] if batched and array.ndim else array
                for name, array in feeds.items()
            }
            if sum(_weight(array) for array in rows.values()) > SAMPLE_KEEP_BYTES:
                continue
            kept = {name: array.copy() for name, array in rows.items()}
            self._learns_sample = False
            self._sample = functools.partial(dict, kept)
            return

    def _count_execution(self, rows: int, compute_ns: int, input_ns: int, output_ns: int) -> None:
        """Count an execution that answered some request, of `rows` rows."""
        self._executions += 1
        size = rows if self._max_rows else 1
        stats = self._batch_sizes.get(size)
        if stats is None:
            stats = self._batch_sizes[size] = BatchSizeStatistics()
        stats.count += 1
        stats.compute_ns += compute_ns
        stats.input_ns += input_ns
        stats.output_ns += output_ns

    def _big_inputs(self, sent: int, rows: int, compute_ns: int, now: int) -> bool:
        """Whether a batch's inputs were far bigger than the profile's samples (free dims);
        if so, teach `_size_cost` what its extra bytes cost instead of updating the profile.

        NOTE: a model of free size is profiled on samples of size 1; a request 30,000 times
        bigger ran 5 s against 15 ms predicted, was admitted under a 20 ms due time, and was
        answered seconds late, and its run dragged the profile of the small ones. Runs this
        big teach admission what their size costs over the profile's run (the fixed cost), and
        leave the profile alone."""
        extra = self._extra_bytes(sent, rows)
        if not extra:
            return False
        fixed = self.profile.predict(rows)
        self._size_cost.observe(extra, compute_ns - fixed, fixed, now)
        return True

    # -- introspection and shutdown ------------------------------------------------------------

    def count_shed(self) -> None:
        """Count a request of this model that the front end's load shedder refused before
        decoding it, as rejected (Triton counts every failed request of a model in its
        statistics); it counts in neither of `outcomes`: the shedder's own refusals read as
        misses would raise its share further."""
        self._rejected += 1
        self._shed += 1

    def outcomes(self) -> tuple[int, int]:
        """`(missed, seen)`: requests that failed their due time (refused at admission or dropped
        as hopeless), and all requests taken in that ended; running totals, as in `statistics()`.

        NOTE: the load shedder reads these a hundred times a second; a full `statistics()` (its
        histograms and breakers, for every loaded variant) there took 1.2% of the loop's CPU
        with the demo's models loaded (an idle server: 3.3% -> 2.1%), more with more models."""
        refused = self._rejected + self._expired
        # (a request without a due time misses none; nor does one refused for a due time no
        # idle instance could meet: the load shedder, reading that as a busy server's misses,
        # refused other clients' requests with 429 after a few impossible timeouts beside one
        # big JSON body)
        # NOTE: nor does one refused for a full queue, due time or not: its bound
        # (scheduling.max_queue_size) refused it, not time. Counted as misses, 12 clients
        # sending 1 s timeouts to a 7 ms model with max_queue_size = 2 got 753 429s "requests
        # are missing their due times" beside 4843 queue-full ones, slowest answer 99 ms.
        # NOTE: nor does one whose run was stopped past its due time (`_stopped`): it ran for
        # far longer than its prediction (a Loop whose trip count is an input), which refusing
        # other requests cannot shorten. Counted as misses, one client's Loop requests given up
        # again and again had another client's mlp requests refused "the server is saturated"
        # on a busy machine (found by a tester)
        # NOTE: nor does one refused for the work its instance threads had, however soon the
        # loop had taken it in: the model's capacity refused it, not the loop's (see
        # `_refused_for_own_work`)
        missed = (
            refused - self._full - self._impossible - self._shed - self._given_up
            - self._own_capacity
        )  # fmt: skip
        return missed, refused - self._shed + self._succeeded + self._failed

    def answer_failed(self, reason: str = "unmade") -> None:
        """Count a request this scheduler answered whose answer its front end could not deliver
        (`reason`: "unmade", its answer could not be made, an output window too small or an
        answer over a size limit; "held_late", a gRPC stream held it past its due time). Its
        run stays counted a success of the model, as Triton's statistics count an inference as
        it ran; only this count moves.

        NOTE: it took the success back (success counts, the latency histogram and its sum went
        down by one): counters that decrease read as a reset to Prometheus, and the request
        stayed in the inference, execution and batch counts, which then disagreed with the
        successes (found by a tester)."""
        counts = self._answers_failed
        counts[reason] = counts.get(reason, 0) + 1

    @property
    def finished(self) -> bool:
        """Closed, drained, and nothing running: its counts are final."""
        return self._drained and self.idle

    def cancelled_unqueued(self, waited_ns: int) -> None:
        """Count a request of this model its client withdrew before it was queued (it waited
        `waited_ns` for room for its answer: see the gRPC front end's `AnswerBudget`), as one
        withdrawn from the queue counts: cancelled, its wait in the failures' time."""
        self._cancelled += 1
        self._fail_ns += max(0, waited_ns)

    def statistics(self) -> SchedulerStatistics:
        # NOTE: a request its client withdrew ends then, though the queue drops it only when it
        # reaches it (or sweeps it): counted at once, it is cancelled and no longer queued
        queue = self._queue
        gone, gone_ns = queue.settled_waiting(self._clock.now_ns())
        # NOTE: list() copies the items before the loop can add a batch size to the dict
        batch_sizes = {
            k: BatchSizeStatistics(v.count, v.compute_ns, v.input_ns, v.output_ns)
            for k, v in list(self._batch_sizes.items())
        }
        return SchedulerStatistics(
            queued=len(self._queue) - gone,
            peak_queued=self._peak,
            busy_instances=sum(1 for jobs in self._outstanding if jobs),
            instances=self._executor.instances,
            succeeded=self._succeeded,
            failed=self._failed,
            rejected=self._rejected,
            expired=self._expired,
            late=self._late,
            on_time=self._on_time,
            cancelled=self._cancelled + queue.withdrawn + gone,
            unavailable=self._unavailable,
            executions=self._executions,
            inferences=self._inferences,
            success_ns=self._request_time.sum_ns,
            queue_ns=self._queue_ns,
            compute_ns=self._compute_time.sum_ns,
            request_compute_ns=self._request_compute_ns,
            request_input_ns=self._request_input_ns,
            request_output_ns=self._request_output_ns,
            fail_ns=self._fail_ns + queue.withdrawn_ns + gone_ns,
            overhead_ns=int(self._overhead_ns),
            last_inference_ms=self._last_ms,
            request_time=self._request_time.snapshot(),
            queue_time=self._queue_time.snapshot(),
            compute_time=self._compute_time.snapshot(),
            batch_sizes=batch_sizes,
            batch_bounds=tuple(sorted({*self.profile.buckets, 1})),
            histogram_sizes={size: batch.count for size, batch in batch_sizes.items()},
            breaker_states=tuple(int(b.state) for b in self._breakers),
            breakers_opened=sum(b.opened for b in self._breakers),
            probes=self._probes,
            overrun=self._overrun.factor,
            handoff_tail_ns=int(self._handoff.value),
            late_margin_ns=self._late_margin.value,
            instance_speeds=tuple(speed.value for speed in self._speeds),
            instance_runs=tuple(self._instance_runs),
            instance_compute_ns=tuple(self._instance_compute_ns),
            answer_ns=int(self._answer_ns),
            # NOTE: list() copies each instance's batches before the loop can change them
            committed=sum(len(r.requests) for jobs in self._outstanding for r in list(jobs)[1:]),
            handed_over=self._handed_over,
            answers_failed=dict(list(self._answers_failed.items())),
            late_by_cause=dict(list(self._late_by.items())),
        )

    async def aclose(self, grace_s: float) -> None:
        """Refuse new requests, let queued ones finish for up to `grace_s`, fail the rest.

        NOTE: no request joins a closed queue, so none is held for more to join its batch: a
        version replaced while a request waited for its batch to fill (max_queue_delay_us
        100 s) kept it waiting the whole drain, then failed it unrun (found by a tester)."""
        self._closed = True
        self._max_delay_ns = 0
        if len(self._queue) and not self._drained:
            self._dispatch()
        if not self.idle:
            self._drain_waiter = self._loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._drain_waiter), grace_s)
        self._drained = True
        for timer in (self._timer, self._sweeper, self._watcher):
            if timer is not None:
                timer.cancel()
        error = ModelUnavailable(f"model {self._label} shut down before it ran")
        self._fail_queued(error, self._clock.now_ns())
        if self._ledger is not None:
            for owner in self._owners:
                self._ledger.leave(owner)

    def _fail_queued(self, error: ModelUnavailable, now: int) -> None:
        """Fail every queued request with `error`: no instance will take them any more."""
        for item in self._queue.drain():
            if item.level >= SHADOW_LEVEL:
                _settle(item, error)  # (a shadow copy: uncounted, see `submit_shadow`)
            elif not item.future.done():  # (else withdrawn by its client: counted so)
                self._unavailable += 1
                self._fail_ns += now - item.arrival_ns
                if item.timing is not None:
                    _timing_failed_unrun(item.timing, now)
                _settle(item, error)


_current_task: Callable[[asyncio.AbstractEventLoop], asyncio.Task[object] | None] = (
    getattr(getattr(asyncio.tasks, "_current_tasks", None), "get", asyncio.current_task)
    if sys.version_info < (3, 14)
    else asyncio.current_task
)
"""The task running on a loop (None: none): asyncio's own dict of them, read without
`asyncio.current_task`'s Python frame on 3.11 (0.23 against 0.05 µs on the 2-core VM).
`asyncio.current_task` from 3.14, whose C tasks keep the current one per thread: the module's
dict is left, empty, for its Python tasks."""


def _weight(array: Any) -> int:
    """What an input array holds, in bytes: a string array's strings by their length (its
    `nbytes` counts 8 bytes a reference: a 40 MB string was kept as a sample of 8 bytes)."""
    if array.dtype.kind == "O":
        return sum(len(value) if isinstance(value, (bytes, str)) else 8 for value in array.flat)
    return int(array.nbytes)


def _ignore(result: BatchResult) -> None:
    """The `on_done` of a job run inline (`run_now` returns its result)."""


def _clients_fault(outputs: Sequence[Feeds | DuetimeError]) -> bool:
    """Every request failed on its own data: answered 400 (InvalidInput), not 500 (a
    ModelOutputError is an InvalidInput answered 500: the model's output was at fault)."""
    return all(isinstance(o, DuetimeError) and o.http_status < 500 for o in outputs)


def _among(item: QueuedRequest, items: Sequence[QueuedRequest]) -> bool:
    """`item` is one of `items` (by identity: requests compare by value)."""
    return any(item is other for other in items)


def _input_bytes(requests: list[QueuedRequest]) -> int:
    return sum(a.nbytes for item in requests for a in item.feeds.values())


_SIZED_AS_SAMPLES: Feeds = {}
"""No inputs to weigh (`_fits_alone`'s size cost nothing): a request taken as the profile's
samples' size, as `fits` takes every request. Never written."""


def batch_bytes_bound(
    run_memory_bytes: int,
    row_in_bytes: int,
    row_out_bytes: int | None,
    max_rows: int,
    sizes_vary: bool,
) -> int:
    """The most input bytes a batch of several requests may take (0: no bound needed): where
    its inputs and the outputs they make, at the samples' ratio of output to input bytes, would
    exceed `run_memory_bytes` (the most one run may allocate; 0: not bounded, nor is a batch).

    NOTE: a model whose outputs are a fixed multiple of its inputs (a Tile by 32) batched ten
    requests of 16 MB into one run of 5 GB of outputs, and the server was killed for its
    memory (found by a tester): the run-memory check bounds what a request's values ask for,
    not what a batch adds up to. Where every input's size is fixed, a full batch's bytes are
    known, and need no bound where they fit."""
    if run_memory_bytes <= 0 or row_in_bytes <= 0 or max_rows <= 1:
        return 0
    ratio = (row_out_bytes or 0) / row_in_bytes
    bound = int(run_memory_bytes / (1.0 + ratio))
    if not sizes_vary and max_rows * row_in_bytes <= bound:
        return 0
    return max(1, bound)


def _bytes(feeds: Feeds) -> int:
    total = 0
    for array in feeds.values():  # (a loop: a generator is a frame)
        total += array.nbytes
    return total


def _timing_started(timing: RequestTiming, now: int, start: int, rows: int, instance: int) -> None:
    """Stamp a traced request taken into a batch planned to start at `start`; `_timing_ran`
    stamps when it really ran."""
    timing.dispatched_ns, timing.started_ns = now, max(now, start)
    timing.batch_rows, timing.instance = rows, instance


def _timing_ran(timing: RequestTiming, now: int, began: int, compute_ns: int) -> None:
    """Stamp a traced request whose batch ran from `began` (see `_settle_batch`) to its result
    on the loop `now`: its `execute` span covers the run, whenever the batch ahead ended.

    NOTE: `started_ns` was the planned start alone (the predicted end of the batch ahead):
    when that batch ended early, 4 traces of 1,500 had no `execute` span (it ended before it
    began) and one an `execute` span of 168 µs for 203 µs of compute (found by a tester)."""
    timing.started_ns = min(now, max(timing.dispatched_ns, began))
    timing.finished_ns, timing.compute_ns = now, compute_ns


def _timing_failed_unrun(timing: RequestTiming, now: int) -> None:
    """Stamp a traced request failed without running, in the queue or in a batch handed to an
    instance that never started it: its wait ends now, and it has no run (see Tracing.record).

    NOTE: unstamped, the span of a request that expired after 57 ms in the queue had no `queue`
    child, and its `encode` child covered those 57 ms."""
    timing.started_ns = 0
    timing.finished_ns = now


def _take_turn(job: BatchJob, turns: Turns, predicted_ns: int) -> None:
    """Give `job`, predicted to run `predicted_ns`, its place among the batches of its CPU's
    `turns`, held for that with a margin (`TURN_HOLD_FACTOR`, `TURN_HOLD_SLACK_NS`)."""
    job.hold_s = max(predicted_ns * TURN_HOLD_FACTOR, predicted_ns + TURN_HOLD_SLACK_NS) / 1e9
    job.turn = (turns, turns.take(job.hold_s))


def _settle(item: QueuedRequest, outcome: Feeds | DuetimeError) -> None:
    future: asyncio.Future[Feeds] = item.future  # type: ignore[assignment]
    if future.done():  # cancelled by its client while it ran
        return
    if isinstance(outcome, DuetimeError):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
    if item.on_done is not None:
        item.on_done()


def _default_words(default_ns: int) -> str:
    """Why a request is due when it is, where its model's `default_timeout_ms` (`default_ns`)
    set that (see `ModelScheduler._admit`), as a refusal says it."""
    return (
        f"its due time is its model's default_timeout_ms ({default_ns / 1e6:g} ms after its "
        "arrival: it sent no timeout of its own)"
    )
