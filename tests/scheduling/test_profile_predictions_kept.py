"""`LatencyProfile.observe` keeps every batch size's prediction what its bucket's estimate makes
it (the estimate plus half the smaller of the spread at load and the spread the runs show),
whatever runs it folds in (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.scheduling.profile import LatencyProfile, ProfilePoint

US = 1_000


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 2 * US), st.integers(0, 500 * US)), min_size=6, max_size=6),
    st.lists(st.tuples(st.integers(1, 20), st.integers(0, 5_000 * US)), max_size=80),
    st.booleans(),
)
def test_observed_predictions_are_those_the_estimates_make(
    points: list[tuple[int, int]], runs: list[tuple[int, int]], guessed: bool
) -> None:
    buckets = (1, 2, 4, 8, 12, 16)
    profile = LatencyProfile(
        [ProfilePoint(b, b * m, b * m + s) for b, (m, s) in zip(buckets, points, strict=True)]
    )
    profile.guessed = guessed
    for rows, elapsed in runs:
        profile.observe(rows, elapsed)
        assert profile._predicted[1:] == [
            int(profile._ewma[b] + min(profile._margin[b], profile._spread[b]) / 2)
            for b in profile.bucket_of[1:]
        ]
