"""SizeCost: the extra run time of inputs far bigger than the profile's samples, by size."""

from __future__ import annotations

from duetime.scheduling.sizecost import PROBE_GAP_MIN_NS, SizeCost

US = 1000
MS = 1_000_000
S = 1_000_000_000


def test_nothing_known_predicts_no_extra_and_a_run_teaches_its_size() -> None:
    cost = SizeCost()
    assert not cost
    assert cost.predict(1_000_000) == 0
    cost.observe(1_000_000, 10 * MS, 100 * US, 0)
    assert cost
    assert cost.predict(1_000_000) == 10 * MS
    assert cost.predict(1_500_000) == 15 * MS  # (the same size class: the same cost a byte)


def test_runs_whose_fixed_cost_dominates_teach_nothing() -> None:
    """A 24-byte excess run 20 µs over a 100 µs fixed cost: its jitter, not its bytes."""
    cost = SizeCost()
    cost.observe(24, 20 * US, 100 * US, 0)
    assert not cost
    cost.observe(24, 150 * US, 100 * US, 0)  # the bytes took more than the fixed cost
    assert cost.predict(24) == 150 * US


def test_an_unmeasured_size_borrows_the_nearest_measured_class_below_else_above() -> None:
    cost = SizeCost()
    cost.observe(1_000, 1 * MS, 10 * US, 0)  # 1 µs a byte
    cost.observe(1_000_000, 2 * S, 10 * US, 0)  # 2 µs a byte
    assert cost.predict(100_000) == 100 * MS  # the class below's
    assert cost.predict(10) == 10 * US  # nothing below: the nearest above
    assert cost.predict(10_000_000) == 20 * S


def test_a_run_far_shorter_than_its_class_estimate_replaces_it_and_a_stall_counts_twice() -> None:
    cost = SizeCost()
    cost.observe(1_000, 1 * MS, 10 * US, 0)
    cost.observe(1_000, 100 * MS, 10 * US, 0)  # a stall: counts as 2 ms, at the EWMA's weight
    assert cost.predict(1_000) == 1_200 * US
    cost.observe(1_000, 10 * US, 10 * US, 0)  # far shorter, even where the fixed cost dominates
    assert cost.predict(1_000) == 10 * US


def test_probes_wait_for_a_stale_estimate_and_back_off_while_runs_confirm_it() -> None:
    cost = SizeCost()
    cost.observe(1_000, 1 * MS, 10 * US, 0)
    assert not cost.may_probe(1_000, PROBE_GAP_MIN_NS - 1), "measured within the gap"
    assert cost.may_probe(1_000, PROBE_GAP_MIN_NS)
    cost.observe(1_000, 1 * MS, 10 * US, PROBE_GAP_MIN_NS + 1)  # confirmed
    assert not cost.may_probe(1_000, 3 * PROBE_GAP_MIN_NS), "the gap doubled"
    assert cost.may_probe(1_000, 4 * PROBE_GAP_MIN_NS)
    cost.observe(1_000, 100 * US, 10 * US, 4 * PROBE_GAP_MIN_NS)  # 10x shorter than predicted
    assert cost.may_probe(2_000_000, 5 * PROBE_GAP_MIN_NS), "back to the shortest gap"
