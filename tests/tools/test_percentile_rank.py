"""Latency percentiles by nearest rank: at least p of the answers are at or below P(p), however
few there are (hdrh's own percentiles round the rank to the nearest)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from duetime.tools.hdr import (
    RunReport,
    histogram_of,
    percentiles_us,
    record_arrays,
    run_fields,
)
from duetime.tools.outcomes import Outcome
from duetime.tools.report import latency_summary

QUANTILES = {"p50": 50, "p90": 90, "p99": 99, "p999": 99.9}


def _nearest_rank(values: np.ndarray, q: float) -> int:
    """The value that at least q% of `values` are at or below, the fewest such (exact: numpy's
    inverted_cdf takes 99.9% of 5000 as 4995.000000000001, one rank too far)."""
    rank = max(1, math.ceil(Fraction(str(q)) / 100 * values.size))
    return int(np.sort(values)[rank - 1])


def _latencies_us(count: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    return (rng.exponential(1000.0, count) + 100).astype(np.int64)


@pytest.mark.parametrize("count", [1, 7, 100, 880, 1001, 5000])
def test_percentiles_are_the_nearest_rank_to_3_significant_digits(count: int) -> None:
    values = _latencies_us(count)
    at = percentiles_us(histogram_of(values))
    for name, q in QUANTILES.items():
        want = _nearest_rank(values, q)
        assert want <= at[name] <= want * 1.001  # (3 significant digits: the bucket's top)
        assert np.count_nonzero(values <= at[name]) >= Fraction(str(q)) / 100 * count
    assert at["count"] == count


def test_880_answers_p999_is_the_largest_and_p99_holds_99_percent() -> None:
    latency_ns = _latencies_us(880) * 1000
    summary = latency_summary(latency_ns)
    assert summary.p999_ms == summary.max_ms
    assert summary.p99_ms is not None
    assert np.count_nonzero(latency_ns / 1e6 <= summary.p99_ms) >= 0.99 * 880


def test_the_ranks_are_exact_integers() -> None:
    from duetime.tools.hdr import nearest_ranks

    # (99.9% of 5000 in floats is 4995.000000000001: a ceil of it is one rank too far)
    assert nearest_ranks(5000) == {"p50": 2500, "p90": 4500, "p99": 4950, "p999": 4995}
    assert nearest_ranks(880) == {"p50": 440, "p90": 792, "p99": 872, "p999": 880}
    assert nearest_ranks(1) == {"p50": 1, "p90": 1, "p99": 1, "p999": 1}


def test_the_bench_table_its_json_and_the_report_show_the_same_percentiles() -> None:
    latency_us = _latencies_us(880)
    outcome = np.full(880, Outcome.OK, dtype=np.int8)
    recorded = record_arrays(np.arange(880) * 1000, latency_us * 1000, outcome)
    doc = run_fields("bench", "x", 1.0, recorded, unsent=0, unanswered=0)
    summary = latency_summary(latency_us * 1000)
    assert doc["latency_us"]["p999"] / 1000 == summary.p999_ms
    assert doc["latency_us"]["p99"] / 1000 == summary.p99_ms
    assert RunReport.from_json(doc, "a.json").latency_us == doc["latency_us"]
