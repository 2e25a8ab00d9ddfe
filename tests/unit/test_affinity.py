"""`--cpus` lists: what `parse_cpus` refuses rather than reading as some other set; where
`CpuPlan` puts a model's instance threads."""

from __future__ import annotations

import os

import pytest

from duetime.execution.affinity import SMALL_MODEL_NS, CpuPlan, parse_cpus


@pytest.mark.parametrize("spec", ["3-1", "1-0", "0-", "0,-1", "-", "abc"])
def test_malformed_and_reversed_ranges_are_refused(spec: str) -> None:
    # (a reversed range once parsed as no CPUs at all, which means no pinning, silently)
    with pytest.raises(ValueError, match=r"CPU list|reversed range"):
        parse_cpus(spec)


def test_a_range_and_a_single_cpu_parse() -> None:
    first = min(os.sched_getaffinity(0))
    assert parse_cpus(f"{first}-{first}") == (first,)
    assert parse_cpus(f" {first} ") == (first,)
    assert parse_cpus("none") is None


def test_a_small_model_shares_the_loop_s_core_and_a_big_one_takes_the_others() -> None:
    plan = CpuPlan((0, 1, 2))
    assert plan.for_instances(2, SMALL_MODEL_NS - 1) == [frozenset({0})] * 2
    assert plan.for_instances(2, SMALL_MODEL_NS) == [frozenset({1}), frozenset({2})]


def test_a_model_whose_cost_varies_never_shares_the_loop_s_core() -> None:
    """Its profile (10 µs, on small samples) said nothing of a 95 ms run (a tester's Loop)."""
    plan = CpuPlan((0, 1))
    assert plan.for_instances(1, 10_000, cost_varies=True) == [frozenset({1})]
    assert CpuPlan((0,)).for_instances(1, 10_000, cost_varies=True) == [frozenset({0})]
