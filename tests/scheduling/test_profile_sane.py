"""`LatencyProfile` keeps its buckets' estimates consistent with each other where the whole
profile is rescaled from one bucket's runs (`_shifted`, `recalibrate`): a bucket left far below
its neighbours was carried along by every rescale, and a backlog's shift then multiplied every
other bucket's prediction by ~10^4 (found by a tester: `slow`'s batch of 8 at 1.5 µs against
6.8 ms at load, 1 row predicted at 36-342 s)."""

from __future__ import annotations

import pytest

from duetime.scheduling.profile import SHIFT_RUNS, LatencyProfile, ProfilePoint

MS = 1_000_000
FASTER = 2.0
"""`profile.FASTER` (not imported: the test runs on the code before it too)."""

# (the tester's `slow` at load, ns: 8 MatMuls of 1024x1024, on the 2-core VM)
LOADED = {
    1: (3_899_503, 4_455_451),
    2: (4_343_913, 8_095_109),
    3: (4_656_998, 8_925_901),
    4: (4_932_823, 53_677_174),
    6: (5_164_996, 9_194_743),
    8: (6_836_629, 10_187_888),
}
IDLE_1 = 4 * MS
"""An idle run of the samples (1 row)."""
BACKLOG_8 = 20 * MS
"""A batch of 8 in a backlog, the CPU shared with the floods' threads."""


def loaded() -> LatencyProfile:
    return LatencyProfile([ProfilePoint(b, m, p) for b, (m, p) in LOADED.items()])


def backlog(profile: LatencyProfile, batches: int = 60) -> None:
    for _ in range(batches):
        profile.observe(8, BACKLOG_8)


def assert_sane(profile: LatencyProfile) -> None:
    """No prediction off by orders of magnitude: under a second, a batch of 8 not predicted
    much faster than 1 row."""
    for b in profile.buckets:
        assert profile.predict(b) < 200 * MS, (b, profile.snapshot())
    assert profile.predict(8) * FASTER >= profile.predict(1) * 0.9, profile.snapshot()


def test_idle_runs_after_floods_of_small_batches_leave_the_large_ones_sane() -> None:
    """Floods with due times keep the batches small (1-3 rows), each run 3x its idle time on a
    CPU the floods' threads share; between floods an idle run of 1 row finds bucket 1's estimate
    over twice the idle time, and scaled the whole profile down by that: a batch of 8, never run
    meanwhile, went down with each (6.8 ms to 3 µs after 40 floods). Then a backlog's batches
    of 8 (20 ms) shifted every bucket by their ratio to it: 1 row predicted at 23 s, and the
    next idle run put the batch of 8 back at 3.5 µs (the cycle the tester saw)."""
    profile = loaded()
    for _ in range(40):
        for rows in (1, 1, 2, 3) * 5:
            profile.observe(rows, 3 * LOADED[rows][0])
        profile.recalibrate(1, IDLE_1)
        assert_sane(profile)
        assert profile.predict(8) > LOADED[8][0] / 10
    for _ in range(5):  # the cycle the tester saw repeat: a backlog, then an idle run
        backlog(profile)
        assert_sane(profile)
        assert profile.predict(8) >= BACKLOG_8 * 0.9
        profile.recalibrate(1, IDLE_1)
        assert_sane(profile)


def test_a_bucket_far_below_its_neighbours_is_not_carried_through_a_backlog() -> None:
    """The tester's saved state: bucket 8's estimate at 1.5 µs while the others sat at 8-50 ms.
    Its backlog's batches of 8 shifted bucket 1 from 5.5 ms to 89 s (a request due in 1 s was
    refused, "predicted to finish in 245476510 µs"), and the next idle run put bucket 8 back at
    ~2 µs."""
    profile = loaded()
    for b, estimate_us in {1: 4963, 2: 7925, 3: 19551, 4: 30598, 6: 48568, 8: 1.5}.items():
        profile._ewma[b] = estimate_us * 1_000
    profile._refresh()
    for _ in range(SHIFT_RUNS):
        profile.observe(8, BACKLOG_8)
    assert profile.predict(8) >= BACKLOG_8 * 0.9  # (the shift: its runs' word)
    assert_sane(profile)
    assert profile.predict(1) <= FASTER * profile.predict(8)
    backlog(profile)
    profile.recalibrate(1, 8_637_000)  # (the tester's idle run)
    assert_sane(profile)
    assert profile.predict(8) >= 8_637_000 / FASTER
    for _ in range(3):
        backlog(profile)
        assert_sane(profile)
        profile.recalibrate(1, 8_637_000)
        assert_sane(profile)


def test_a_consistent_profile_is_rescaled_as_before() -> None:
    """The bounds leave alone what every bucket agrees on: a load on a busy CPU (every figure 38
    times the truth) comes down by the idle run's ratio, and a model slower than its samples (a
    Loop whose trip count is an input) goes up by its runs' ratio, every bucket alike."""
    busy = LatencyProfile([ProfilePoint(b, 50 * MS * b, 50 * MS * b) for b in (1, 2, 4, 8)])
    busy.recalibrate(1, 1_300_000)
    for b in (1, 2, 4, 8):
        assert busy._ewma[b] == 1_300_000 * b
    loopy = LatencyProfile([ProfilePoint(b, 8_000 * b, 8_000 * b) for b in (1, 2, 4, 8)])
    for _ in range(SHIFT_RUNS):
        loopy.observe(8, 960 * MS)
    assert loopy._ewma[8] == pytest.approx(960 * MS)
    # (by the shortest run over bucket 8's estimate, which its capped runs had raised 1.05^4)
    assert loopy._ewma[1] == pytest.approx(960 * MS / 8 / 1.05**4, rel=0.001)
    for b in (2, 4):
        assert loopy._ewma[b] == pytest.approx(b * loopy._ewma[1])
        assert loopy.predict(b) == pytest.approx(b * loopy.predict(1), rel=0.001)
