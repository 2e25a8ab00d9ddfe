"""When each request of an open-loop run is sent and which due class it takes: pure and seeded."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

ArrivalKind = Literal["poisson", "constant"]
ARRIVAL_KINDS: tuple[ArrivalKind, ...] = ("poisson", "constant")


def arrival_offsets_ns(
    rate: float, duration_s: float, kind: ArrivalKind, rng: np.random.Generator
) -> np.ndarray:
    """Send times in ns after the start, ascending and below `duration_s`, at `rate` per second.

    `constant` spaces requests exactly 1/rate apart from 0; `poisson` draws exponential gaps, so
    the count over the duration is Poisson-distributed with mean `rate * duration_s`.
    """
    if rate <= 0 or duration_s < 0:
        raise ValueError(f"rate must be > 0 and duration >= 0, got {rate} and {duration_s}")
    end_ns = int(duration_s * 1e9)
    if kind == "constant":
        count = math.ceil(rate * duration_s)
        offsets = (np.arange(count, dtype=np.float64) * (1e9 / rate)).astype(np.int64)
        return offsets[offsets < end_ns]
    return _poisson_offsets(rate, end_ns, rng)


def _poisson_offsets(rate: float, end_ns: int, rng: np.random.Generator) -> np.ndarray:
    mean_gap_ns = 1e9 / rate
    expected = rate * end_ns / 1e9
    chunks: list[np.ndarray] = []
    last = 0.0
    while last < end_ns:
        # Enough gaps to pass the end almost always in one draw (mean + 6 standard deviations).
        size = int(expected + 6 * math.sqrt(expected) + 16)
        times = last + np.cumsum(rng.exponential(mean_gap_ns, size))
        chunks.append(times)
        last = float(times[-1])
    offsets = np.concatenate(chunks)
    return offsets[offsets < end_ns].astype(np.int64)


def choose_classes(shares: Sequence[float], count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` class indices drawn independently with probabilities proportional to `shares`."""
    if len(shares) == 1:
        return np.zeros(count, dtype=np.int64)
    weights = np.asarray(shares, dtype=np.float64)
    return rng.choice(len(weights), size=count, p=weights / weights.sum()).astype(np.int64)


@dataclass(frozen=True, slots=True)
class DueClass:
    """Requests sharing one timeout (None: no due time), drawn with probability `share`."""

    label: str
    timeout_ms: float | None
    share: float

    @property
    def timeout_us(self) -> int | None:
        return None if self.timeout_ms is None else max(1, round(self.timeout_ms * 1000))

    @property
    def timeout_ns(self) -> int | None:
        timeout_us = self.timeout_us
        return None if timeout_us is None else timeout_us * 1000


def due_classes(timeouts_ms: Sequence[float], mix: Sequence[float]) -> tuple[DueClass, ...]:
    """One class per timeout (equal shares when `mix` is empty); one class "none" without any."""
    if not timeouts_ms:
        return (DueClass("none", None, 1.0),)
    shares = list(mix) or [1.0 / len(timeouts_ms)] * len(timeouts_ms)
    return tuple(
        DueClass(f"{timeout:g}ms", float(timeout), share)
        for timeout, share in zip(timeouts_ms, shares, strict=True)
    )
