"""How good and how fast a variant is next to the primary: `compare` for answers, medians over
rounds in random order (and the noise around their ratios) for speed, and `verdict` for whether
it is worth listing."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from duetime.config import VariantQuality, VariantSpeed
from duetime.tools.optimize.report import Status
from duetime.tools.optimize.samples import Feeds, batches_of, first_rows
from duetime.types import ModelSignature

FASTER_BY = 0.02
"""A variant counts as faster when its median time is at least this share below the primary's:
smaller differences are within run-to-run noise."""
CLOSE_RTOL = CLOSE_ATOL = 1e-2
"""For a first output with one value per sample (nothing to take an argmax over), a sample
agrees when the values are within these tolerances (`numpy.isclose`)."""
MIN_TIMING_ROUNDS, MAX_TIMING_ROUNDS = 5, 200


def compare(reference: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> VariantQuality:
    """Max abs error over the floating-point outputs; argmax agreement over the first output.

    The argmax is taken over the last axis of each sample's first output and compared at every
    remaining position. Where a sample's first output has no axis longer than 1 (a score, a
    label), a sample agrees when `numpy.isclose` (CLOSE_RTOL, CLOSE_ATOL) holds for it.

    NOTE: integer and boolean outputs (class ids, counts, masks) are left out of the error: a
    label flipped from 3 to 5 read as an error of 2.0, and variants were ranked by it. And a
    NaN (or an infinity) where the primary answers the same counts as no difference: a model
    answering NaN for half its samples gave every variant an infinite error, fp16 (2 places
    apart) as int8 (434) (found by a tester).
    """
    error = 0.0
    for ref, out in zip(reference, outputs, strict=True):
        if ref.shape != out.shape:
            raise ValueError(
                f"an output has shape {list(out.shape)}, the primary's {list(ref.shape)}"
            )
        if ref.dtype.kind == "f" and out.dtype.kind == "f":
            theirs, mine = ref.astype(np.float64), out.astype(np.float64)
            same = (theirs == mine) | (np.isnan(theirs) & np.isnan(mine))
            with np.errstate(invalid="ignore"):
                diff = np.where(same, 0.0, np.abs(theirs - mine))
            error = max(error, float(np.max(np.where(np.isnan(diff), np.inf, diff), initial=0.0)))
    ref, out = reference[0], outputs[0]
    count = len(ref)
    if ref.dtype.kind not in "biuf":
        agree = np.mean(ref.reshape(count, -1) == out.reshape(count, -1), axis=1)
    elif ref.ndim > 1 and ref.shape[-1] > 1:
        agree = np.mean((ref.argmax(-1) == out.argmax(-1)).reshape(count, -1), axis=1)
    else:
        close = np.isclose(out, ref, rtol=CLOSE_RTOL, atol=CLOSE_ATOL).reshape(count, -1)
        agree = close.all(axis=1)
    agreement = float(np.mean(agree)) if count else 0.0
    return VariantQuality(max_abs_error=error, argmax_agreement=agreement, samples=count)


ARGMAX_NOISE = 0.01
"""Argmax agreements that differ by less than this share of the samples rank as equal: on 256
samples, int8-static's 0.992 ranked above int8-dynamic's 0.984 (two samples) despite a max abs
error six times int8-dynamic's."""
UNRANKED = 1 << 30
"""The rank of a variant with no recorded quality: after all that have one."""


def argmax_tolerance(samples: int) -> float:
    """The difference in argmax agreement that is noise on `samples`: ARGMAX_NOISE, or more
    than one sample's worth on few samples."""
    return max(ARGMAX_NOISE, 1.5 / samples) if samples > 0 else 1.0


def constant_class(reference: np.ndarray) -> int | None:
    """The class the primary's first output (`reference`, samples first) picks for every sample
    and position, when it always picks the same one (its argmax agreement then says nothing);
    None otherwise, or when it has no classes to pick from."""
    if reference.dtype.kind not in "biuf" or reference.ndim < 2 or reference.shape[-1] < 2:
        return None
    classes = reference.argmax(-1)
    if len(reference) < 2 or not np.all(classes == classes.flat[0]):
        return None
    return int(classes.flat[0])


def ranking_keys(
    qualities: Sequence[VariantQuality | None], by_argmax: bool = True
) -> list[tuple[int, float]]:
    """Sort keys, best first, for `qualities` ranked together: how many noise widths
    (`argmax_tolerance`) a variant's argmax agreement lies below the best one's (0: within the
    noise of it), then its max abs error. `by_argmax` False (see `constant_class`): the error
    alone.

    NOTE: measured from the best one rather than pairwise: "within noise of each other" is not
    transitive, and a sort needs keys that are."""
    best = max((q.argmax_agreement for q in qualities if q is not None), default=1.0)
    return [
        (UNRANKED, float("inf"))
        if q is None
        else (_noise_widths(best, q) if by_argmax else 0, q.max_abs_error)
        for q in qualities
    ]


def _noise_widths(best: float, quality: VariantQuality) -> int:
    return int((best - quality.argmax_agreement) / argmax_tolerance(quality.samples))


Bounds = tuple[float, float]
"""A 95% interval of a variant's median time as a share of the primary's, from the rounds."""
BOOTSTRAP_RESAMPLES = 1000


ORDER_SEED = 0
"""Seeds the order the sessions run in each round (`round_times_ns`): the same in every run."""


def round_times_ns(sessions: Sequence[Any], feeds: Feeds, budget_s: float) -> list[list[int]]:
    """Execution times of each session on `feeds`, timed in rounds (one timed run of each per
    round, so drift in the machine's speed touches all alike) until `budget_s` is spent.

    Each round runs the sessions in a new random order (seeded: the same orders every time),
    and each timed run right after an untimed run of the same session.

    NOTE: in the same order every round (the primary, fp16, int8-dynamic, int8-static), the
    primary always ran right after the int8 variants, which leave the next run a few percent
    slower: fp16, no faster, was timed 4-7% faster and kept (found by a tester). Timed after a
    run of its own, a session's time holds what it leaves behind, not what another left (in
    random order alone, the int8 variants passed their cost on and timed 5% faster); the random
    order spreads what is left over (with the untimed runs in the fixed order, fp16 still timed
    5% faster than in random order, on the tester's two-input MLP)."""
    for session in sessions:
        session.run(None, feeds)
    times: list[list[int]] = [[] for _ in sessions]
    order = np.random.default_rng(ORDER_SEED)
    deadline = time.perf_counter() + budget_s
    rounds = 0
    while rounds < MIN_TIMING_ROUNDS or (
        rounds < MAX_TIMING_ROUNDS and time.perf_counter() < deadline
    ):
        for i in order.permutation(len(sessions)):
            sessions[i].run(None, feeds)
            started = time.perf_counter_ns()
            sessions[i].run(None, feeds)
            times[i].append(time.perf_counter_ns() - started)
        rounds += 1
    return times


def ratio_bounds(primary: Sequence[int], variant: Sequence[int]) -> Bounds:
    """A 95% bootstrap interval of the median, over the rounds, of the variant's time over the
    primary's in the same round.

    NOTE: per round, not of two medians: a round's two runs share the machine's load of the
    moment, so the ratio cancels much of it; the interval's width is the noise left. Seeded: the
    same times give the same interval."""
    ratios = np.asarray(variant, dtype=np.float64) / np.maximum(np.asarray(primary), 1)
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(ratios), (BOOTSTRAP_RESAMPLES, len(ratios)))
    low, high = np.percentile(np.median(ratios[picks], axis=1), [2.5, 97.5])
    return float(low), float(high)


def _timed(times: list[list[int]]) -> tuple[list[float], list[Bounds]]:
    medians = [statistics.median(samples) / 1e3 for samples in times]
    return medians, [ratio_bounds(times[0], variant) for variant in times[1:]]


def speeds(
    sessions: Sequence[Any], samples: Feeds, signature: ModelSignature, budget_s: float
) -> tuple[list[float], list[float] | None, list[tuple[Bounds, Bounds | None]]]:
    """Medians in µs (in the order of `sessions`, the primary first) at batch 1 and at the max
    batch (None: no batching), and each variant's `ratio_bounds` at both."""
    if signature.max_batch_size == 0:
        feeds = batches_of(samples, signature)[0]
    else:
        feeds = first_rows(samples, 1)
    one, one_bounds = _timed(round_times_ns(sessions, feeds, budget_s))
    if signature.max_batch_size <= 1:
        return one, None, [(b, None) for b in one_bounds]
    top_feeds = first_rows(samples, signature.max_batch_size)
    top, top_bounds = _timed(round_times_ns(sessions, top_feeds, budget_s))
    return one, top, list(zip(one_bounds, top_bounds, strict=True))


def verdict(
    speed: VariantSpeed,
    max_batch: int,
    keep_slower: bool,
    bounds: tuple[Bounds, Bounds | None] | None = None,
) -> tuple[Status, str]:
    """Keep a variant that is FASTER_BY faster than the primary at batch 1 or the max batch, and
    (given its `bounds`) beyond the noise: the whole interval of its time ratio below 1 - FASTER_BY.
    """
    at_1, at_top = bounds if bounds is not None else (None, None)
    sizes = [("batch 1", speed.batch_1_us, speed.primary_batch_1_us, at_1)]
    top, primary_top = speed.max_batch_us, speed.primary_max_batch_us
    if top is not None and primary_top is not None:
        sizes.append((f"batch {max_batch}", top, primary_top, at_top))
    faster, unclear = [], []
    for label, mine, theirs, bound in sizes:
        if mine < theirs * (1 - FASTER_BY):
            if bound is None or bound[1] < 1 - FASTER_BY:
                faster.append(label)
            else:
                unclear.append(f"{label} (noise ±{(bound[1] - bound[0]) / 2:.0%})")
    if faster:
        return "kept", f"faster at {' and '.join(faster)}"
    if keep_slower:
        return "kept", "not faster; kept by --keep-slower"
    if unclear:
        return "dropped", f"not clearly faster at {' or '.join(unclear)}"
    return "dropped", f"not {FASTER_BY:.0%} faster than the primary at any batch size"


def rounded(value: float) -> float:
    """`value` to 4 significant digits, as recorded in the config."""
    return float(f"{value:.4g}")


def nan_share(reference: Sequence[np.ndarray]) -> float:
    """The share of the primary's floating-point answers (all outputs, all samples) that are
    NaN."""
    floats = [r for r in reference if r.dtype.kind == "f" and r.size]
    total = sum(r.size for r in floats)
    return sum(int(np.isnan(r).sum()) for r in floats) / total if total else 0.0
