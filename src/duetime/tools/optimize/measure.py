"""How good and how fast a variant is next to the primary: `compare` for answers, round-robin
medians for speed, and `verdict` for whether it is worth listing."""

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
    """Max abs error over all numeric outputs; argmax agreement over the first output.

    The argmax is taken over the last axis of each sample's first output and compared at every
    remaining position. Where a sample's first output has no axis longer than 1 (a score, a
    label), a sample agrees when `numpy.isclose` (CLOSE_RTOL, CLOSE_ATOL) holds for it.
    """
    error = 0.0
    for ref, out in zip(reference, outputs, strict=True):
        if ref.shape != out.shape:
            raise ValueError(
                f"an output has shape {list(out.shape)}, the primary's {list(ref.shape)}"
            )
        if ref.dtype.kind in "biuf" and out.dtype.kind in "biuf":
            diff = np.abs(ref.astype(np.float64) - out.astype(np.float64))
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


def quality_key(quality: VariantQuality | None) -> tuple[float, float]:
    """Sorts best first: argmax agreement descending, then max abs error ascending."""
    if quality is None:
        return (1.0, float("inf"))
    return (-quality.argmax_agreement, quality.max_abs_error)


def median_times_us(sessions: Sequence[Any], feeds: Feeds, budget_s: float) -> list[float]:
    """Median execution time of each session on `feeds`, timed in rounds (one run of each per
    round, so drift in the machine's speed touches all alike) until `budget_s` is spent."""
    for session in sessions:
        session.run(None, feeds)
    times: list[list[int]] = [[] for _ in sessions]
    deadline = time.perf_counter() + budget_s
    rounds = 0
    while rounds < MIN_TIMING_ROUNDS or (
        rounds < MAX_TIMING_ROUNDS and time.perf_counter() < deadline
    ):
        for session, samples in zip(sessions, times, strict=True):
            started = time.perf_counter_ns()
            session.run(None, feeds)
            samples.append(time.perf_counter_ns() - started)
        rounds += 1
    return [statistics.median(samples) / 1e3 for samples in times]


def speeds(
    sessions: Sequence[Any], samples: Feeds, signature: ModelSignature, budget_s: float
) -> tuple[list[float], list[float] | None]:
    """Medians in µs (in the order of `sessions`, the primary first) at batch 1 and at the max
    batch (None: no batching)."""
    if signature.max_batch_size == 0:
        return median_times_us(sessions, batches_of(samples, signature)[0], budget_s), None
    one = median_times_us(sessions, first_rows(samples, 1), budget_s)
    if signature.max_batch_size == 1:
        return one, None
    return one, median_times_us(sessions, first_rows(samples, signature.max_batch_size), budget_s)


def verdict(speed: VariantSpeed, max_batch: int, keep_slower: bool) -> tuple[Status, str]:
    """Keep a variant that is FASTER_BY faster than the primary at batch 1 or the max batch."""
    faster = []
    if speed.batch_1_us < speed.primary_batch_1_us * (1 - FASTER_BY):
        faster.append("batch 1")
    top, primary_top = speed.max_batch_us, speed.primary_max_batch_us
    if top is not None and primary_top is not None and top < primary_top * (1 - FASTER_BY):
        faster.append(f"batch {max_batch}")
    if faster:
        return "kept", f"faster at {' and '.join(faster)}"
    if keep_slower:
        return "kept", "not faster; kept by --keep-slower"
    return "dropped", f"not {FASTER_BY:.0%} faster than the primary at any batch size"


def rounded(value: float) -> float:
    """`value` to 4 significant digits, as recorded in the config."""
    return float(f"{value:.4g}")
