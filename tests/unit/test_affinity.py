"""`--cpus` lists: what `parse_cpus` refuses rather than reading as some other set."""

from __future__ import annotations

import os

import pytest

from duetime.execution.affinity import parse_cpus


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
