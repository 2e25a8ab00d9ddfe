"""LatencyProfile: predicted execution time of each batch size for one variant; pure.

Measured at load (median and p99 of repeated runs at each batch bucket), then kept current from
real executions with an EWMA. `predict(rows)` is a list lookup: every scheduling decision asks it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def batch_buckets(max_batch_size: int) -> tuple[int, ...]:
    """The batch sizes ORT is run at: 1, 2, 3, 4, 6, 8, 12, 16, ... up to and including the max.

    Powers of two and their 1.5 multiples, so a batch padded up to the next bucket wastes at most
    a third of it, while ORT and the profile see a small, fixed set of shapes.
    """
    if max_batch_size <= 1:
        return (1,)
    sizes = {1, max_batch_size}
    power = 2
    while power < max_batch_size:
        sizes.add(power)
        if power * 3 // 2 < max_batch_size:
            sizes.add(power * 3 // 2)
        power *= 2
    return tuple(sorted(sizes))


@dataclass(frozen=True, slots=True)
class ProfilePoint:
    """Measured execution time of one batch size, in nanoseconds."""

    rows: int
    median_ns: int
    p99_ns: int


_FOLLOW_EVERY = 16
"""Observations between two corrections of the buckets not run yet."""
FOLLOW_TOLERANCE = 0.05
"""The buckets not run yet are rescaled when the ratio they follow has moved this much."""

OVERRUN_WINDOW = 512
"""Executions the overrun tail looks back over. The tail is the second-longest of the window.
NOTE: a batch holds many requests, so one run in a hundred overrunning (the 0.99 quantile) made
1.5-2% of resnet's answers late at 200% load; with the second-longest 0.5-0.6% (two runs each,
same build)."""
OVERRUN_EVERY = 64
"""Executions between two readings of the tail: the window is kept in blocks of this many."""
OVERRUN_MAX = 8.0
TAIL_MEMORY_NS = 1_000_000_000
"""Observations older than this no longer count towards a tail (see `RecentTail`)."""
TAIL_REFRESH_NS = 100_000_000
"""A tail is recomputed at least this often while observations come (and every
`OVERRUN_EVERY`)."""
SPREAD_PER_EXCESS = 6.0
"""A bucket's spread as runs show it (p99 less median; its prediction adds half of it, or of
the spread at load where that is smaller) is the EWMA of this many times what each run took
past the estimate (0 for a run within it): for normal jitter the mean excess is 0.4 standard
deviations, and the p99 less the median 2.3 (see `LatencyProfile.observe`)."""
SHIFT_RUNS = 5
"""Runs of one bucket in a row that each took over twice its estimate (the most a run may move
it, see `LatencyProfile.observe`) after which the profile takes the runs' word: every bucket
is scaled by the shortest of them over the estimate.

NOTE: capped at twice the estimate and weighed 0.05, a run moves the estimate by 5% at most: a
model whose real inputs cost 15,000x its samples (a Loop whose trip count is an input, profiled
at 8 µs, running 120 ms) was still predicted at 153 µs after 60 such runs, and a request due in
50 ms was admitted and answered late, 123 ms on, where it should have been refused (found by a
tester). One stalled run is no shift: five in a row of one bucket are."""
SHAPE_FASTER = 2.0
"""After a rescale of the whole profile from one bucket's runs (`SHIFT_RUNS`, or an idle run in
`LatencyProfile.recalibrate`), no bucket of more rows is predicted more than this many times
faster than that bucket, nor one of fewer rows this many times slower (see
`LatencyProfile._keep_shape`)."""
SHAPE_PER_ROW = 4.0
"""...nor any bucket's cost per row more than this many times apart from that bucket's, beyond
how the load measured them apart."""
_NO_VALUE_NS = 1 << 62
"""When a value a block has not got came (never too old: its value is -inf)."""


class RecentTail:
    """The second-longest of the last `OVERRUN_WINDOW` values observed within `TAIL_MEMORY_NS`
    (`value`; 0 until a window's worth has been observed, and 0 again while fewer than two are
    that recent).

    NOTE: it forgets within a second. A margin grown from one stall refuses the requests near
    their due time, so fewer batches run, and a tail that only a window of new batches could
    replace stayed up for minutes: with `duetime itch run --every 10` (about 200 batches a
    second at the recorded pace), 4 runs in 8 refused 36-91% of their 5,850 requests once a
    stall had set the overrun to its cap (without this memory); with it, 7-76 in each of 4.
    It forgets without new observations too (`age`, asked by a scheduler that refuses), and
    each value by when it came: a scheduler refusing everything read no tail at all, and the
    block being filled counted as recent whatever its age, so stalls there held the overrun at
    7.75x through seconds of probes (`duetime itch run --deadline-us 200`: 82-99.9% of its
    requests refused, most of them for a margin of 5-7 runs).

    NOTE: the window is kept as blocks of `OVERRUN_EVERY` values, each remembered by its two
    longest and when each came, so an observation costs a few comparisons and a reading sorts
    18 numbers. Sorting the whole window (512 values as Python lists) took 40-65 µs, more with
    cold caches, inside every 64th batch's completion: that was 1.6% of answers, and at the
    recorded pace of `itch run` most of the P99 between a model run's end and its answer (166
    µs, 138 of them in this reading). Where a block's longest two are both too old, its recent
    values (not kept) are not counted.
    """

    __slots__ = (
        "_blocks", "_count", "_first", "_first_ns", "_refreshed_ns", "_second", "_second_ns",
        "value",
    )  # fmt: skip

    def __init__(self) -> None:
        self._blocks: deque[tuple[float, int, float, int]] = deque(
            maxlen=OVERRUN_WINDOW // OVERRUN_EVERY
        )
        """The last full blocks: their longest and second-longest, each with when it came."""
        self._first = self._second = -math.inf
        self._first_ns = self._second_ns = _NO_VALUE_NS
        """The longest two of the block being filled, and when they came."""
        self._count = 0
        self._refreshed_ns = 0
        self.value = 0.0

    def observe(self, value: float, now_ns: int) -> None:
        since = now_ns - TAIL_MEMORY_NS
        if self._second_ns < since or self._first_ns < since:
            self._forget_in_block(since)
        if value > self._second:
            if value > self._first:
                self._second, self._second_ns = self._first, self._first_ns
                self._first, self._first_ns = value, now_ns
            else:
                self._second, self._second_ns = value, now_ns
        self._count = count = self._count + 1
        if count % OVERRUN_EVERY == 0:
            self._blocks.append((self._first, self._first_ns, self._second, self._second_ns))
            self._first = self._second = -math.inf
            self._first_ns = self._second_ns = _NO_VALUE_NS
        elif now_ns - self._refreshed_ns < TAIL_REFRESH_NS and self.value:
            return  # (a tail aged to nothing is read again at its next observation)
        if count >= OVERRUN_WINDOW:
            self._read(now_ns)

    def _forget_in_block(self, since: int) -> None:
        """Drop the block being filled's longest values that came before `since`."""
        if self._first_ns < since:
            self._first, self._first_ns = self._second, self._second_ns
            self._second, self._second_ns = -math.inf, _NO_VALUE_NS
        if self._second_ns < since:
            self._second, self._second_ns = -math.inf, _NO_VALUE_NS
        if self._first_ns < since:
            self._first, self._first_ns = -math.inf, _NO_VALUE_NS

    def age(self, now_ns: int) -> None:
        """Read the tail again without a new observation, when it was last read long enough
        ago: the observations older than `TAIL_MEMORY_NS` no longer count."""
        if self.value and now_ns - self._refreshed_ns >= TAIL_REFRESH_NS:
            self._read(now_ns)

    def _read(self, now_ns: int) -> None:
        self._refreshed_ns = now_ns
        since = now_ns - TAIL_MEMORY_NS
        longest = []
        for first, first_ns, second, second_ns in (
            (self._first, self._first_ns, self._second, self._second_ns),
            *self._blocks,
        ):
            if first_ns >= since:
                longest.append(first)
            if second_ns >= since:
                longest.append(second)
        longest.sort()
        # NOTE: never the longest: one stall alone sets no margin (after a quiet stretch, the
        # first run is cold: see `ModelScheduler._record`)
        self.value = longest[-2] if len(longest) >= 2 and longest[-2] > -math.inf else 0.0


class Overrun:
    """How far executions lately ran past their prediction: the `RecentTail` of actual /
    predicted (1.0 until a window's worth of runs; at most `OVERRUN_MAX`).

    NOTE: a batch is planned to end a margin before the earliest due time in it; a run that takes
    longer than that margin answers late. On a quiet machine runs stay within a few percent of
    the profile; on a shared or virtual one, one in a hundred takes 2-3x (measured: resnet on the
    2-core VM, p99 2.6x). A margin learnt from the tail of what this machine does now keeps those
    answers on time; at overload it costs no throughput (the queue is never empty), only some
    requests refused up front instead of answered late.
    """

    __slots__ = ("_tail", "factor")

    def __init__(self) -> None:
        self._tail = RecentTail()
        self.factor = 1.0

    def observe(self, predicted_ns: int, actual_ns: int, now_ns: int) -> None:
        if predicted_ns <= 0:
            return
        tail = self._tail
        value = tail.value
        tail.observe(actual_ns / predicted_ns, now_ns)
        if tail.value != value:  # (read again: most observations leave it as it was)
            self.factor = min(OVERRUN_MAX, max(1.0, tail.value))

    def age(self, now_ns: int) -> None:
        """Forget the runs older than `TAIL_MEMORY_NS` though none came since (see
        `RecentTail.age`): 1.0 when none is left."""
        tail = self._tail
        tail.age(now_ns)
        self.factor = min(OVERRUN_MAX, max(1.0, tail.value))


LATE_HALF_LIFE_NS = 4_000_000_000
"""A `LateMargin` halves each time this passes without a late answer.

NOTE: on the 2-core VM (resnet at 200% load, 10/50 ms due times, 6 s runs, interleaved) its
late answers came one batch at a time, a second or a few apart: with a half-life of 1 s each
found the margin mostly given back, 47 late of 27,987 answers (6 runs), 2 s 28 of 15,200 (3
runs), 4 s 15 of 30,032 and 8 of 15,195 (6 and 3 runs), at the same goodput. For mlp (2/10 ms)
it stayed under 200 µs (a tenth of 2 ms), 112 µs on average at twice its capacity."""
LATE_SHARE_MAX = 0.1
"""A `LateMargin` grows no further, on a late answer, than this share of its request's time
budget (due time less arrival): it must not refuse requests that a stall ran late.

NOTE: tried on the 2-core VM, two servers up, 5 s runs alternated (late answers by the
client's clock, against this rule):
- a quarter of the late request's budget: resnet at 200% 26 late of 25,261 against 55 of
  25,168 in 6 pairs, mlp at 8,000 a second 83 against 74;
- a quarter of the shortest budget among the late requests and those that came in the last
  8-16 s (so that a 10 ms request late cannot take a 2 ms one's budget): resnet 101 late
  against 80 over 16 pairs (~67,000 answers each), mlp 326 against 392 over 22 pairs, goodput
  within the noise: no gain;
- a tenth of that shortest budget: resnet 101 late of 47,741 against 50 of 46,942 in 10 pairs,
  its 50 ms requests' margin held to a tenth of 10 ms. A cap per request (its own budget's
  share, where the margin is used) would keep both; estimates are by rows alone for now."""


class LateMargin:
    """Time kept before every due time because answers were lately late by the scheduler's own
    clock (`value`, ns): grown by how late each late batch was, halved every
    `LATE_HALF_LIFE_NS` (4 s) after that; pure.

    NOTE: the margins learnt from their parts (`Overrun`, the hand-off tail) follow the tail
    of each part over the last second, and the sum of parts that are each within their tail
    still ends late when a few come together: the 2-core VM, resnet at 200% load (answers due
    10 or 50 ms after they were sent, EDF ending most batches just before the earliest due in
    them) answered 0.2-0.5% late with the fixed 300 µs margin, each 0.1-3.8 ms past its due,
    in clusters: the VM's speed changes for a second at a time. A fixed 1.5 ms margin answered
    0.04-0.1% late (three runs each, interleaved) at about the same goodput, but would cost a
    model due in 2 ms most of its budget on a machine that is never late. This learns the margin
    from the answers that were late, and gives it back when they stop: at 200% load resnet
    answered 99.95% on time (9 runs of 6 s) against 99.6% before.
    """

    __slots__ = ("_since_ns", "value")

    def __init__(self) -> None:
        self.value = 0
        self._since_ns = 0
        """When `value` last grew, or last halved."""

    def late(self, late_ns: int, budget_ns: int, now_ns: int) -> None:
        """A batch ended `now_ns`, `late_ns` past the earliest due time of its late answers, the
        shortest time budget among them `budget_ns`."""
        self.age(now_ns)
        # (what it learnt stays, though this request's budget caps it lower)
        self.value = max(self.value, min(self.value + late_ns, int(LATE_SHARE_MAX * budget_ns)))
        self._since_ns = now_ns

    def age(self, now_ns: int) -> bool:
        """Halve `value` for each `LATE_HALF_LIFE_NS` since it last changed (0 below 1 µs);
        True if it changed."""
        if not self.value:
            return False
        halvings = (now_ns - self._since_ns) // LATE_HALF_LIFE_NS
        if halvings <= 0:
            return False
        self.value = self.value >> halvings if halvings < 63 else 0
        if self.value < 1000:
            self.value = 0
        self._since_ns += halvings * LATE_HALF_LIFE_NS
        return True


SPEED_MAX = 8.0
"""An `InstanceSpeed` stays within this factor of 1, either way."""
SPEED_ALPHA = 0.02
"""An `InstanceSpeed`'s weight on each new run, once it has seen 1/SPEED_ALPHA of them (the mean
of those until then)."""
SPEED_MIN_RUNS = 8
"""An instance's speed stays 1 until this many of its runs have set it."""
SPEED_BAND = 1.25
"""A pace under this reads as 1: identical instances differ by noise alone, and an instance is
never predicted faster than the variant's profile.

NOTE: on the 2-core VM, two identical mlp instances (~20 µs a run) read paces of 0.79-1.78
between bursts, and 0.38-1.34 with their threads unpinned (`--cpus none`), with a mean of
ratios over 20 runs (found by a tester): a fast model's runs are mostly noise. Averaged as
logarithms over 50 runs, and read as 1 below this, they read 1.
NOTE: a pace under 1 was taken too: two instances of a 1 ms model pinned to one core read 0.6
for instance 1, whose runs were timed alone while instance 0's shared the core with them; it
would have been booked at 0.6 of the profile for runs that take twice it when both run. An
instance slower than instance 0 is planned at its pace; one faster, at the profile's, as
before paces were learnt."""


class InstanceSpeed:
    """An instance's pace: how long its runs take against instance 0's (`value`, 1.0: as long,
    or less); pure. An instance's own latency profile is its variant's times its speed (see
    `ModelScheduler._learn_speed`, which tells it each run's ratio).

    NOTE: a variant's instances are one session each on their own CPU (`--cpus`). The variant's
    `LatencyProfile` is measured at load on one of them and learns from the runs of all (each
    divided by its instance's speed); where the instances' CPUs differ (one shares its core with
    the event loop, or with another model's instances, or a VM's cores differ), each runs at its
    own pace, and the batches planned for it, and the time it is booked for, follow that pace.
    One profile per instance, each learnt from its own runs alone, would have few runs each to
    learn from where one instance takes most of the batches (the first idle instance takes the
    next), and would go stale; a speed is one number, which a few runs set.

    NOTE: each instance's runs were first compared with the profile itself: after a load whose
    profile read 0.5-0.7 ms a run where served runs took 1.3 ms (on every instance), instance
    1's first runs were read as its own slowness, and identical instances were given paces of
    1.5-2.4 (found by a tester); the profile follows the runs slowly. A speed now compares
    the instance's runs with instance 0's last runs of the same batch size: what they share
    cancels out."""

    __slots__ = ("_log", "_min_runs", "runs", "value")

    def __init__(self, min_runs: int = SPEED_MIN_RUNS) -> None:
        self.value = 1.0
        """The pace predictions use: `_log`'s, once `min_runs` runs have set it and where it is
        `SPEED_BAND` or more; else 1."""
        self._log = 0.0
        """The mean (an EWMA, once past 1/SPEED_ALPHA runs) of the runs' ratios' logarithms: a
        ratio of 2 and one of 0.5 cancel out, as they should."""
        self.runs = 0
        self._min_runs = min_runs

    @property
    def known(self) -> bool:
        """Enough runs have set `value`."""
        return self.runs >= self._min_runs

    @property
    def pace(self) -> float:
        """The pace the runs show, under 1 too, once known (else 1): what a run is divided by
        to teach the variant's profile (a faster instance's runs, taken as they are, would
        bring instance 0's predictions under its runs)."""
        return math.exp(self._log) if self.known else 1.0

    def observe(self, ratio: float) -> None:
        """Fold in one run that took `ratio` times the reference's. One run counts at most
        twice or half the current pace (a stall must not double every prediction), and the
        pace stays within `SPEED_MAX` of 1."""
        if ratio <= 0:
            return
        now = self._log
        taken = math.log(ratio)
        if taken > now + _LN2:
            taken = now + _LN2
        elif taken < now - _LN2:
            taken = now - _LN2
        self.runs += 1
        alpha = 1.0 / self.runs
        if alpha < SPEED_ALPHA:
            alpha = SPEED_ALPHA
        now += alpha * (taken - now)
        self._log = now = min(_LN_SPEED_MAX, max(-_LN_SPEED_MAX, now))
        pace = math.exp(now)
        if self.runs < self._min_runs or pace < SPEED_BAND:
            pace = 1.0
        self.value = pace


_LN2 = math.log(2)
_LN_SPEED_MAX = math.log(SPEED_MAX)


class LatencyProfile:
    """Execution time per batch size, updated online.

    `bucket_of[rows]` is the bucket a batch of `rows` is padded to; `predict(rows)` the time the
    batch is expected to take (the EWMA of observed runs, seeded with the median at load, plus
    half the spread, p99 less median, measured at load or as the runs show it where smaller, so
    that predictions err on the late side).
    """

    def __init__(self, points: Sequence[ProfilePoint], *, alpha: float = 0.05) -> None:
        if not points:
            raise ValueError("a profile needs at least one measured batch size")
        ordered = sorted(points, key=lambda p: p.rows)
        self.max_rows = ordered[-1].rows
        self.buckets = tuple(p.rows for p in ordered)
        self._alpha = alpha
        self._points = {p.rows: p for p in ordered}
        self._ewma = {p.rows: float(p.median_ns) for p in ordered}
        self._margin: dict[int, float] = {
            p.rows: float(max(0, p.p99_ns - p.median_ns)) for p in ordered
        }
        """Per bucket: the spread, p99 less median, measured at load (scaled with the
        estimate by `recalibrate` and `_follow`)..."""
        self._spread = dict(self._margin)
        """...and as the runs show it (see `observe`): predictions add half the smaller."""
        self._load_margin = dict(self._margin)
        self._unseen = set(self.buckets)
        """Buckets no real execution has run yet: they follow the others (see `observe`)."""
        self._observed = 0
        self._over: dict[int, tuple[int, int]] = {}
        """Per bucket: its runs in a row past twice its estimate, and the shortest of them (see
        `SHIFT_RUNS`)."""
        self.sample_output_row_bytes: int | None = None
        """The output bytes of one row of the samples it was measured on (None: not known); an
        execution making far more (a model whose output size follows its input values) is
        expected to take longer than predicted."""
        self._seen_measured = 0
        self._seen_estimated = 0.0
        """Of the buckets that have run: their medians at load, and their current estimates."""
        self._followed = 1.0
        """The ratio the buckets not run yet were last scaled by."""
        self.estimated: frozenset[int] = frozenset()
        """Buckets the load did not run, their figures estimated from those it did (see
        `profile_from_samples`): like every bucket not run yet, they follow the others (see
        `_follow`) until a real execution runs them."""
        self.guessed = False
        """Its figures are a guess, not measured (the samples failed to run at load): the first
        real run replaces them all (see `_replace_guess`), and until then the scheduler lets
        probes through whatever it predicts."""
        self.bucket_of = [0] * (self.max_rows + 1)
        self._predicted = [0] * (self.max_rows + 1)
        for rows in range(1, self.max_rows + 1):
            self.bucket_of[rows] = next(b for b in self.buckets if b >= rows)
        self._rows_of = {
            b: range(self.buckets[i - 1] + 1 if i else 1, b + 1) for i, b in enumerate(self.buckets)
        }
        """The batch sizes each bucket runs."""
        self._refresh()

    def predict(self, rows: int) -> int:
        """Predicted ns to execute a batch of `rows` (padded to its bucket)."""
        return self._predicted[rows]

    def estimate_ns(self, rows: int) -> float:
        """The current estimate (EWMA) for a batch of `rows`, without the spread `predict` adds."""
        return self._ewma[self.bucket_of[rows]]

    def per_row_ns(self) -> float:
        """The best sustained cost of one row: what a saturated instance spends per row."""
        return min(self._predicted[b] / b for b in self.buckets)

    def observe(self, rows: int, elapsed_ns: int) -> None:
        """Fold one real execution of a batch of `rows` (after padding) into the estimate."""
        # (conditionals, not min(): a builtin's call costs more on every run)
        bucket = self.bucket_of[rows if rows <= self.max_rows else self.max_rows]
        if self.guessed:
            self._replace_guess(bucket, elapsed_ns)
            return
        previous = self._ewma[bucket]
        # NOTE: one run stalled by something else (a preempted vCPU, say) must not double every
        # prediction that follows: observations count at most twice the current estimate,
        # unless `SHIFT_RUNS` in a row go past it (see `_shifted`)
        cap = int(2 * previous) + 1
        if elapsed_ns > cap:
            if self._shifted(bucket, elapsed_ns):
                return
            elapsed_ns = cap
        elif self._over:
            self._over.pop(bucket, None)
        alpha = self._alpha
        self._ewma[bucket] = estimate = previous + alpha * (elapsed_ns - previous)
        # NOTE: the spread measured at load was kept for good: 200 warm-up runs of orderbook
        # (~20 µs) with two preempted ones made its p99 540 µs, so every 1-row run was
        # predicted at 281 µs; a stall's overrun (8x, the cap) was then 8x that, a margin of
        # 2 ms that refused every event of `duetime itch run --deadline-us 1000` (94%), and
        # the few probes let through left it there. Where the runs show less, it follows
        # them now (a conditional, not max(): on every run).
        excess = elapsed_ns - previous
        if excess < 0:
            excess = 0
        spread = self._spread[bucket]
        self._spread[bucket] = spread + alpha * (SPREAD_PER_EXCESS * excess - spread)
        self._refresh_bucket(bucket)
        if self._unseen:
            if bucket in self._unseen:
                self._unseen.discard(bucket)
                self._seen_measured += self._points[bucket].median_ns
                self._seen_estimated += estimate
            else:
                self._seen_estimated += estimate - previous
            self._observed += 1
            if self._observed % _FOLLOW_EVERY == 0:
                self._follow()

    def _shifted(self, bucket: int, elapsed_ns: int) -> bool:
        """Count a run of `bucket` past twice its estimate; at the `SHIFT_RUNS`th in a row,
        scale every bucket by the shortest of them over the estimate (True: done)."""
        runs, shortest = self._over.get(bucket, (0, elapsed_ns))
        runs, shortest = runs + 1, min(shortest, elapsed_ns)
        if runs < SHIFT_RUNS:
            self._over[bucket] = (runs, shortest)
            return False
        self._over.clear()
        self._scale(shortest / max(1.0, self._ewma[bucket]), spread=True)
        self._keep_shape(bucket)
        self._unseen.clear()  # (all follow the runs now: the load's figures are no guide)
        return True

    def _scale(self, ratio: float, *, estimate: bool = True, spread: bool = False) -> None:
        """Every bucket's margin at load times `ratio`, and its estimate (`estimate`) and the
        spread its runs show (`spread`)."""
        for b in self.buckets:
            if estimate:
                self._ewma[b] *= ratio
            if spread:
                self._spread[b] *= ratio
            self._margin[b] = int(self._margin[b] * ratio)
        self._refresh()

    def recalibrate(self, rows: int, elapsed_ns: int) -> None:
        """Fold in a run on an idle instance (see `ModelScheduler.refresh_if_stale`): where the
        estimate is more than twice what it took, the profile was taken on a busy CPU, and every
        bucket is scaled down by the same ratio at once.

        NOTE: a version reloaded while other work held the CPU measured 50 ms a run for a model
        of 1.3 ms; the router then sent everything to its cheaper variants, the version never
        ran again, and nothing corrected it (the EWMA would take ~70 runs)."""
        bucket = self.bucket_of[min(rows, self.max_rows)]
        if self.guessed:
            self._replace_guess(bucket, elapsed_ns)
            return
        ratio = elapsed_ns / max(1.0, self._ewma[bucket])
        if ratio >= 0.5:
            self.observe(rows, elapsed_ns)
            tail = elapsed_ns / max(1.0, self._predicted[bucket])
            if tail < 0.5:
                # NOTE: the estimate was right but the spread, p99 less median at load, was a
                # busy CPU's: a variant of 0.65 ms measured a p99 of 45 ms, was predicted at
                # 22.7 ms, and refused every 3 ms request; its spread shrank 5% a second (one
                # run a second), so it starved for 45 s (found by a tester). It is scaled to
                # the run as the estimate would be.
                self._scale(tail, estimate=False, spread=True)
            return
        self._scale(ratio)
        self._keep_shape(bucket)

    def _keep_shape(self, anchor: int) -> None:
        """Bring each bucket's estimate (its margin and spread with it) within bounds of
        `anchor`'s, which the profile was just rescaled to from that bucket's runs: a bucket of
        more rows at least 1/`SHAPE_FASTER` of it, one of fewer rows at most `SHAPE_FASTER`
        times it (or as far apart as the load measured them, where that is further), and their
        costs per row within `SHAPE_PER_ROW` of each other (or of the load's ratio); and no
        bucket's margin at load (scaled) more than its estimate times its ratio to the median
        at load (or once the estimate, where that is more).

        NOTE: `_shifted` and `recalibrate` scale every bucket by one bucket's ratio, so an
        inconsistency between buckets was never repaired, only carried along, and idle runs
        added to it: an idle run of 1 row finding bucket 1 over twice its time (its runs under
        floods had taught it their pace) scaled the whole profile down by that, and a bucket
        not run since (batches of 8, while due times kept the batches small) stayed scaled
        down, and went down again at the next (40 such rounds took a batch of 8 from 6.8 ms to
        3 µs, the profile alone). A tester's server, after 25 minutes of floods with and
        without due times, had `slow`'s batch of 8 at 1.5 µs (6.8 ms at load) while the
        others were at 8-50 ms; every backlog's batches of 8 (20 ms each) then shifted the
        whole profile by their 10^4 ratio, predicting 1 row at 36-342 s and refusing every
        request with a due time until the next idle run scaled it back (found by a tester).
        Nothing else moves a bucket but its own runs, so the bounds are kept where the whole
        profile moves.

        NOTE: the margin too: bucket 8's (p99 less median at load, scaled with the profile)
        stood at 34 ms or more against its estimate of 1.5 µs (predicted at 16.9 ms in the
        tester's statistics), and the shift scaled it by 10^4 with the rest: a batch of 8 would
        have been predicted at minutes with its estimate put right at 20 ms."""
        ewma = self._ewma
        at = ewma[anchor]
        points = self._points
        measured = max(1, points[anchor].median_ns)
        changed = False
        for b in self.buckets:
            most = ewma[b] * max(1.0, self._load_margin[b] / max(1, points[b].median_ns))
            if self._margin[b] > most:
                self._margin[b] = int(most)
                changed = True
            if b == anchor:
                continue
            shape = points[b].median_ns / measured
            if b > anchor:
                low = at * min(1.0, shape) / SHAPE_FASTER
                high = at * max(b / anchor, shape) * SHAPE_PER_ROW
            else:
                low = at * min(b / anchor, shape) / SHAPE_PER_ROW
                high = at * max(1.0, shape) * SHAPE_FASTER
            value = ewma[b]
            if low <= value <= high:
                continue
            ewma[b] = bound = low if value < low else high
            if value > 0:  # (the spread and margin at load move with the estimate, as in `_scale`)
                ratio = bound / value
                self._spread[b] *= ratio
                self._margin[b] = int(self._margin[b] * ratio)
            changed = True
        if changed:
            self._refresh()

    def _replace_guess(self, seen: int, elapsed_ns: int) -> None:
        """Take a first real run of bucket `seen` for the profile a guess stood for: that bucket
        takes what it took, a smaller one as long, a larger one as long per row; the others
        then follow the runs as a measured profile's do (see `_follow`).

        NOTE: the loader's guess (1 ms a row) is no measure: a pipeline whose samples fail
        (a OneHotEncoder refusing made-up strings) ran in ~30 µs, and with the guess kept as if
        measured (an EWMA takes ~70 runs to move, and no probe was let through for a due time
        under half the guess) clients with budgets under ~1 ms were refused for good."""
        self.guessed = False
        elapsed_ns = max(1, elapsed_ns)
        for bucket in self.buckets:
            value = elapsed_ns if bucket <= seen else elapsed_ns * bucket // seen
            self._points[bucket] = ProfilePoint(bucket, value, value)
            self._ewma[bucket] = float(value)
            self._margin[bucket] = self._load_margin[bucket] = self._spread[bucket] = 0
        self._unseen = set(self.buckets) - {seen}
        self._seen_measured = self._points[seen].median_ns
        self._seen_estimated = float(elapsed_ns)
        self._followed = 1.0
        self._observed = 1
        self._refresh()

    def _follow(self) -> None:
        """Scale the buckets not run yet by how the run ones compare with their load figures.

        NOTE: a version loaded while another serves is profiled on a busy CPU, so its figures
        can be twice the truth; real executions correct the batch sizes that run, and this
        carries the correction over to the sizes that have not run yet (which admission and
        batch planning still ask about)."""
        if not self._seen_measured:
            return
        ratio = min(4.0, max(0.25, self._seen_estimated / self._seen_measured))
        # NOTE: a bucket never run is a guess: rewriting its predictions at every 1% the ratio
        # jitters by cost 25 µs (cold) in one batch completion in sixteen (`itch run`)
        if abs(ratio - self._followed) < FOLLOW_TOLERANCE * self._followed:
            return
        self._followed = ratio
        for bucket in self._unseen:
            self._ewma[bucket] = self._points[bucket].median_ns * ratio
            self._margin[bucket] = int(self._load_margin[bucket] * ratio)
            self._refresh_bucket(bucket)

    def measured_median_ns(self, rows: int) -> int:
        """The median measured at load for a batch of `rows` (its bucket's)."""
        return self._points[self.bucket_of[rows]].median_ns

    def snapshot(self, speed: float = 1.0) -> list[dict[str, float | bool]]:
        """Per bucket: median and p99 at load, the current estimate and the prediction admission
        uses (µs: the estimate and half the spread; a tester read the estimate alone while
        requests were refused on the prediction, 60 times it), and whether the load measured
        them (false: estimated from the sizes it measured, or a guess where no sample ran; a
        tester took the estimated sizes' figures, p99 equal to the median, for measurements).
        `speed`: an instance's (see `InstanceSpeed`): its estimates and predictions are these
        times it; the figures measured at load stay as measured."""
        guessed, estimated = self.guessed, self.estimated
        return [
            {
                "batch_size": b,
                "measured_median_us": self._points[b].median_ns / 1e3,
                "measured_p99_us": self._points[b].p99_ns / 1e3,
                "estimate_us": self._ewma[b] * speed / 1e3,
                "predicted_us": self._predicted[b] * speed / 1e3,
                "measured_at_load": not guessed and b not in estimated,
            }
            for b in self.buckets
        ]

    def _refresh(self) -> None:
        for bucket in self.buckets:
            self._refresh_bucket(bucket)

    def _refresh_bucket(self, bucket: int) -> None:
        margin, spread = self._margin[bucket], self._spread[bucket]
        value = int(self._ewma[bucket] + (spread if spread < margin else margin) / 2)
        predicted = self._predicted
        if predicted[bucket] == value:
            return
        for rows in self._rows_of[bucket]:
            predicted[rows] = value


def profile_from_samples(samples: Mapping[int, Sequence[int]], *, up_to: int = 0) -> LatencyProfile:
    """A profile from raw timings: batch size -> list of ns. With `up_to`, the buckets of
    `batch_buckets(up_to)` larger than the largest measured are estimated at its cost per row
    (median and p99 alike; see `LatencyProfile.estimated`)."""
    points = []
    for rows, times in samples.items():
        ordered = sorted(times)
        median = ordered[len(ordered) // 2]
        p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
        points.append(ProfilePoint(rows, median, p99))
    largest = max(points, key=lambda p: p.rows)
    estimated = [
        ProfilePoint(
            rows, largest.median_ns * rows // largest.rows, largest.p99_ns * rows // largest.rows
        )
        for rows in batch_buckets(up_to)
        if rows > largest.rows
    ]
    profile = LatencyProfile(points + estimated)
    profile.estimated = frozenset(p.rows for p in estimated)
    return profile
