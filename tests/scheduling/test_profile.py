"""LatencyProfile, batch_buckets and profile_from_samples."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.scheduling.profile import (
    OVERRUN_EVERY,
    OVERRUN_MAX,
    OVERRUN_WINDOW,
    SHIFT_RUNS,
    TAIL_MEMORY_NS,
    TAIL_REFRESH_NS,
    LatencyProfile,
    Overrun,
    ProfilePoint,
    RecentTail,
    batch_buckets,
    profile_from_samples,
)


@pytest.mark.parametrize(
    ("max_batch_size", "expected"),
    [
        (0, (1,)),
        (1, (1,)),
        (2, (1, 2)),
        (3, (1, 2, 3)),
        (5, (1, 2, 3, 4, 5)),
        (8, (1, 2, 3, 4, 6, 8)),
        (10, (1, 2, 3, 4, 6, 8, 10)),
        (32, (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)),
        (33, (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 33)),
    ],
)
def test_batch_buckets(max_batch_size: int, expected: tuple[int, ...]) -> None:
    assert batch_buckets(max_batch_size) == expected


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=100_000))
def test_batch_buckets_cover_one_to_max_in_small_steps(max_batch_size: int) -> None:
    buckets = batch_buckets(max_batch_size)
    assert buckets[0] == 1
    assert buckets[-1] == max_batch_size
    assert all(a < b for a, b in pairwise(buckets))
    assert all(b <= 1.5 * a for a, b in pairwise(buckets) if a >= 4)


def flat(samples: dict[int, int]) -> LatencyProfile:
    return profile_from_samples({rows: [ns] * 5 for rows, ns in samples.items()})


def test_profile_from_samples_takes_median_and_p99() -> None:
    profile = profile_from_samples({1: [50, 10, 40, 20, 30], 2: [100] * 99 + [1100]})
    snapshot = {row["batch_size"]: row for row in profile.snapshot()}
    assert snapshot[1]["measured_median_us"] == pytest.approx(0.030)
    assert snapshot[1]["measured_p99_us"] == pytest.approx(0.050)
    assert snapshot[2]["measured_median_us"] == pytest.approx(0.100)
    assert snapshot[2]["measured_p99_us"] == pytest.approx(0.100)
    assert snapshot[1]["estimate_us"] == pytest.approx(0.030)
    # the prediction adds half the measured p99 spread, so it errs on the late side
    assert profile.predict(1) == 30 + (50 - 30) // 2
    assert profile.predict(2) == 100


def test_a_profile_needs_a_point() -> None:
    with pytest.raises(ValueError, match="at least one"):
        LatencyProfile([])


def test_bucket_of_and_predict_cover_the_rows_between_buckets() -> None:
    profile = flat({1: 100, 4: 400, 2: 200})  # unordered on purpose
    assert profile.buckets == (1, 2, 4)
    assert profile.max_rows == 4
    assert profile.bucket_of == [0, 1, 2, 4, 4]
    assert [profile.predict(rows) for rows in range(1, 5)] == [100, 200, 400, 400]


@settings(max_examples=100, deadline=None)
@given(st.sets(st.integers(min_value=1, max_value=64), min_size=1, max_size=10))
def test_bucket_of_is_the_smallest_bucket_at_least_rows(sizes: set[int]) -> None:
    profile = flat({rows: 1000 * rows for rows in sizes})
    assert profile.buckets == tuple(sorted(sizes))
    for rows in range(1, profile.max_rows + 1):
        bucket = profile.bucket_of[rows]
        assert bucket in sizes
        assert bucket >= rows
        assert not any(rows <= b < bucket for b in sizes)


@st.composite
def monotone_samples(draw: st.DrawFn) -> dict[int, list[int]]:
    """Per bucket a list of timings, each one at least the same-rank timing of the bucket below."""
    max_rows = draw(st.integers(min_value=1, max_value=48))
    count = draw(st.integers(min_value=1, max_value=9))
    previous = [0] * count
    samples: dict[int, list[int]] = {}
    for rows in batch_buckets(max_rows):
        steps = draw(st.lists(st.integers(0, 10_000), min_size=count, max_size=count))
        current = sorted(p + s for p, s in zip(previous, steps, strict=True))
        samples[rows] = draw(st.permutations(current))
        previous = current
    return samples


@settings(max_examples=100, deadline=None)
@given(monotone_samples())
def test_predict_is_monotone_in_rows_for_monotone_samples(samples: dict[int, list[int]]) -> None:
    profile = profile_from_samples(samples)
    predictions = [profile.predict(rows) for rows in range(1, profile.max_rows + 1)]
    assert predictions == sorted(predictions)


def test_per_row_ns_is_the_cheapest_row() -> None:
    assert flat({1: 100, 2: 150, 4: 240}).per_row_ns() == pytest.approx(60.0)
    assert flat({1: 100, 2: 300}).per_row_ns() == pytest.approx(100.0)


def test_observe_moves_the_estimate_toward_observations() -> None:
    profile = flat({1: 1000, 2: 2000, 4: 4000})
    profile.observe(2, 3000)
    assert 2000 < profile.predict(2) < 3000
    after_one = profile.predict(2)
    for _ in range(500):
        profile.observe(2, 3000)
    assert after_one < profile.predict(2) <= 3000
    assert profile.predict(2) == pytest.approx(3000, abs=2)
    profile.observe(2, 0)
    assert profile.predict(2) < 3000, "it comes back down too"
    # buckets that never ran follow the one that did (see the next test)
    assert profile.predict(1) == pytest.approx(1500, rel=0.05)
    assert profile.predict(4) == pytest.approx(6000, rel=0.05)


def test_observe_updates_every_row_count_of_the_bucket() -> None:
    profile = flat({1: 1000, 4: 4000, 8: 8000})
    profile.observe(3, 5000)  # three rows run as the 4-row bucket
    updated = profile.predict(4)
    assert updated > 4000
    assert profile.predict(2) == profile.predict(3) == updated
    profile.observe(100, 9000)  # more rows than the largest bucket: folded into it
    assert profile.predict(8) > 8000


def test_alpha_sets_how_fast_the_estimate_moves() -> None:
    fast = LatencyProfile([ProfilePoint(1, 1000, 1000)], alpha=0.5)
    fast.observe(1, 2000)
    assert fast.predict(1) == 1500


def test_buckets_not_run_yet_follow_the_ones_that_ran() -> None:
    from duetime.scheduling.profile import ProfilePoint

    # profiled on a busy CPU: every figure twice the truth
    profile = LatencyProfile([ProfilePoint(r, 200_000 * r, 200_000 * r) for r in (1, 2, 4, 8)])
    for _ in range(400):
        profile.observe(1, 100_000)
    assert profile.predict(1) == pytest.approx(100_000, rel=0.05)
    assert profile.predict(8) == pytest.approx(800_000, rel=0.1)  # never ran, followed
    for _ in range(400):
        profile.observe(8, 1_200_000)
    assert profile.predict(8) == pytest.approx(1_200_000, rel=0.05)  # its own runs rule now
    assert profile.predict(4) == pytest.approx(4 * 200_000 * (1_300_000 / 1_800_000), rel=0.1)


def test_runs_in_a_row_far_past_the_estimate_shift_the_whole_profile() -> None:
    """Capped at twice the estimate and weighed 0.05, 60 runs of 120 ms moved an 8 µs profile to
    153 µs (a Loop whose trip count is an input: the tester's loopy), and a request due in 50 ms
    was admitted, to be answered late."""
    profile = flat({1: 8_000, 2: 16_000, 4: 32_000})
    for _ in range(SHIFT_RUNS - 1):
        profile.observe(1, 120_000_000)
    assert profile.predict(1) < 1_000_000  # (each run alone moves it 5% at most)
    profile.observe(1, 110_000_000)  # the fifth in a row: the shortest of them rules
    assert profile.predict(1) == pytest.approx(110_000_000, rel=0.01)
    # (scaled by the same ratio: to bucket 1's estimate, which its capped runs had raised 20%)
    assert 3 * 110_000_000 < profile.predict(4) < 4 * 110_000_000
    for _ in range(60):
        profile.observe(1, 120_000_000)  # (then it follows the runs as usual)
    assert 110_000_000 < profile.predict(1) <= 125_000_000


def test_stalls_apart_do_not_shift_the_profile() -> None:
    profile = flat({1: 8_000, 2: 16_000})
    for _ in range(3 * SHIFT_RUNS):
        profile.observe(1, 8_000_000)  # a stall...
        profile.observe(1, 8_000)  # ...then a run as profiled
    assert profile.predict(1) < 100_000
    for _ in range(SHIFT_RUNS):
        profile.observe(2, 16_000_000)  # (counted per bucket: 1's stalls are gone)
    assert profile.predict(2) > 1_000_000


# -- Overrun -------------------------------------------------------------------------------------


def test_overrun_is_one_until_a_window_of_runs_then_the_tail_ratio() -> None:
    overrun = Overrun()
    for index in range(OVERRUN_WINDOW - 1):
        overrun.observe(1_000, 3_000 if index % 50 == 0 else 900, 0)
        assert overrun.factor == 1.0, "too few runs to say"
    overrun.observe(1_000, 900, 0)
    assert overrun.factor == pytest.approx(3.0), "2% of runs took 3x: the 99th percentile"


def test_overrun_never_goes_below_one_and_is_capped() -> None:
    fast = Overrun()
    for _ in range(OVERRUN_WINDOW):
        fast.observe(1_000, 500, 0)
    assert fast.factor == 1.0
    stalled = Overrun()
    for _ in range(OVERRUN_WINDOW):
        stalled.observe(1_000, 100_000, 0)
    assert stalled.factor == OVERRUN_MAX


def test_overrun_forgets_a_bad_stretch_after_a_window() -> None:
    overrun = Overrun()
    for _ in range(OVERRUN_WINDOW):
        overrun.observe(1_000, 4_000, 0)
    assert overrun.factor == pytest.approx(4.0)
    for _ in range(OVERRUN_WINDOW - OVERRUN_EVERY):
        overrun.observe(1_000, 1_000, 0)
    assert overrun.factor == pytest.approx(4.0), "a few slow runs are still in the window"
    for _ in range(OVERRUN_EVERY):
        overrun.observe(1_000, 1_000, 0)
    assert overrun.factor == 1.0


def test_overrun_ignores_runs_with_no_prediction() -> None:
    overrun = Overrun()
    for _ in range(2 * OVERRUN_WINDOW):
        overrun.observe(0, 5_000, 0)
    assert overrun.factor == 1.0


def test_overrun_forgets_a_stall_older_than_its_memory_though_few_runs_followed() -> None:
    overrun = Overrun()
    for index in range(OVERRUN_WINDOW):
        overrun.observe(1_000, 8_000 if index == 0 else 1_000, index)
    assert overrun.factor == 1.0, "one stall in a window is past the quantile"
    for index in range(OVERRUN_WINDOW):
        overrun.observe(1_000, 8_000, index)
    assert overrun.factor == 8.0
    overrun.observe(1_000, 1_000, TAIL_MEMORY_NS + OVERRUN_WINDOW)
    assert overrun.factor == 1.0, "a run a second later: the stalls no longer count"


# -- RecentTail (the hand-offs' tail) --------------------------------------------------------------


def test_handoff_tail_is_zero_until_a_window_then_its_tail() -> None:
    tail = RecentTail()
    for index in range(OVERRUN_WINDOW - 1):
        tail.observe(3_000_000 if index % 50 == 0 else 40_000, index * 1_000)
        assert tail.value == 0, "too few hand-offs to say"
    tail.observe(40_000, OVERRUN_WINDOW * 1_000)
    assert tail.value == 3_000_000, "2% of hand-offs took 3 ms: the tail, not the median"


def test_handoff_tail_forgets_stalls_older_than_its_memory() -> None:
    tail = RecentTail()
    for index in range(OVERRUN_WINDOW):
        tail.observe(5_000_000, index)
    assert tail.value == 5_000_000
    # runs a while later (everything else was refused): the old stalls no longer count
    later = TAIL_MEMORY_NS + OVERRUN_WINDOW
    tail.observe(50_000, later)
    assert tail.value == 0, "one alone sets no tail"
    tail.observe(60_000, later + 1)
    assert tail.value == 50_000


def test_tail_forgets_stalls_in_the_block_being_filled_once_they_are_old() -> None:
    """The block being filled counted as recent whatever its age: stalls there kept the tail up
    while the observations after them were short (the overrun held at 6-7.75x)."""
    tail = RecentTail()
    for index in range(OVERRUN_WINDOW):
        tail.observe(40_000, index)
    for stall_ns in (TAIL_REFRESH_NS, 2 * TAIL_REFRESH_NS):  # (a refresh is due: read at each)
        tail.observe(5_000_000, stall_ns)
    assert tail.value == 5_000_000
    later = 2 * TAIL_REFRESH_NS + TAIL_MEMORY_NS + 1
    tail.observe(40_000, later)
    tail.observe(30_000, later)
    assert tail.value == 30_000


def test_tail_ages_without_observations_to_nothing_then_reads_the_next_at_once() -> None:
    tail = RecentTail()
    for index in range(OVERRUN_WINDOW):
        tail.observe(5_000_000, index)
    tail.age(TAIL_REFRESH_NS)
    assert tail.value == 5_000_000, "within its memory"
    later = OVERRUN_WINDOW + TAIL_MEMORY_NS
    tail.age(later)
    assert tail.value == 0, "nothing observed within its memory"
    tail.observe(3_000_000, later + 1)
    tail.observe(4_000_000, later + 2)
    assert tail.value == 3_000_000, "read at each, not at the next refresh"


def test_overrun_ages_to_one_without_runs() -> None:
    overrun = Overrun()
    for _ in range(OVERRUN_WINDOW):
        overrun.observe(1_000, 4_000, 0)
    overrun.age(TAIL_MEMORY_NS // 2)
    assert overrun.factor == pytest.approx(4.0)
    overrun.age(TAIL_MEMORY_NS + 1)
    assert overrun.factor == 1.0


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(OVERRUN_WINDOW, 3 * OVERRUN_WINDOW),
    st.sampled_from([None, 1, 3, 50]),
)
def test_tail_read_at_each_block_is_the_second_longest_of_the_window(
    seed: int, count: int, distinct: int | None
) -> None:
    """(Values drawn from a seed, `distinct` values at most, or any: hypothesis took 15 s of the
    suite to draw lists of 512-1,536 floats.)"""
    rng = np.random.default_rng(seed)
    drawn = rng.uniform(0.0, 1e7, count) if distinct is None else rng.integers(0, distinct, count)
    values = [float(v) for v in drawn]
    tail = RecentTail()
    for count, value in enumerate(values, start=1):
        tail.observe(value, 5_000)
        if count >= OVERRUN_WINDOW and count % OVERRUN_EVERY == 0:
            assert tail.value == sorted(values[count - OVERRUN_WINDOW : count])[-2]


def test_profile_followers_track_the_estimates_of_every_bucket_that_ran() -> None:
    profile = LatencyProfile([ProfilePoint(r, 100_000 * r, 100_000 * r) for r in (1, 2, 4, 8, 16)])
    for index in range(2_000):  # sizes 1 and 2 run, at 1.5x and 0.5x their load figures
        rows = 1 + index % 2
        profile.observe(rows, 150_000 if rows == 1 else 100_000)
    ratio = (150_000 + 100_000) / (100_000 + 200_000)
    assert profile.predict(16) == pytest.approx(16 * 100_000 * ratio, rel=0.02)


def test_a_spread_measured_at_load_comes_down_to_what_the_runs_show() -> None:
    """Three preempted runs among 200 at load made the p99 27x the median, and every prediction
    carried half of that for good (orderbook: 281 µs for a ~20 µs run; a stall's 8x overrun then
    kept 2 ms). Steady runs bring the spread down; a slower stretch raises it again, never above
    the spread measured at load."""
    profile = profile_from_samples({1: [20_000] * 197 + [540_000] * 3})
    assert profile.predict(1) == 20_000 + 260_000
    for _ in range(200):
        profile.observe(1, 20_000)
    assert 20_000 <= profile.predict(1) < 21_000
    for _ in range(100):
        profile.observe(1, 40_000)  # a stretch of runs twice as long
    settled = profile.predict(1)
    assert 40_000 < settled < 40_000 + 260_000
    for _ in range(200):
        profile.observe(1, 1_000_000)  # (observations count at most twice the estimate)
    assert profile.predict(1) <= profile._ewma[1] + 260_000


def test_a_spread_the_runs_show_does_not_outgrow_the_one_measured_at_load() -> None:
    profile = flat({1: 100_000})  # no spread at load
    for elapsed in [100_000, 150_000] * 50:
        profile.observe(1, elapsed)
    assert profile.predict(1) == int(profile._ewma[1])


def test_the_snapshot_says_which_sizes_the_load_measured() -> None:
    """Sizes past the largest measured are estimated at its cost per row: the statistics showed
    their figures as measured (a tester read p99 equal to the median as one sample)."""
    profile = profile_from_samples({1: [10] * 5, 2: [20] * 5}, up_to=8)
    said = {row["batch_size"]: row["measured_at_load"] for row in profile.snapshot()}
    assert said == {1: True, 2: True, 3: False, 4: False, 6: False, 8: False}


def test_an_idle_run_far_under_the_prediction_scales_a_busy_load_s_spread_at_once() -> None:
    """A variant of 0.65 ms profiled on a busy CPU measured a p99 of 45 ms: predicted at 22.7 ms
    (its estimate and half the spread), it refused every 3 ms request; its idle runs (one a
    second) shrank the spread 5% each, and it starved for 45 s (found by a tester)."""
    profile = LatencyProfile(
        [ProfilePoint(1, 685_000, 45_000_000), ProfilePoint(2, 1_300_000, 46_000_000)]
    )
    assert profile.predict(1) > 20_000_000
    profile.recalibrate(1, 650_000)
    assert profile.predict(1) < 1_500_000  # (22.7 ms before)
    assert profile.predict(2) < 3_000_000
    snapshot = profile.snapshot()
    assert snapshot[0]["predicted_us"] == pytest.approx(profile.predict(1) / 1e3)


def test_an_idle_run_near_the_prediction_leaves_the_spread() -> None:
    profile = LatencyProfile([ProfilePoint(1, 1_000_000, 3_000_000)])
    before = profile.predict(1)
    profile.recalibrate(1, 1_000_000)
    assert profile.predict(1) == pytest.approx(before, rel=0.05)
