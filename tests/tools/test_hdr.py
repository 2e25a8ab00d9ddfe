"""Latency recording (`duetime.tools.hdr`): histograms encode, decode and merge exactly; the
streaming recorder and the after-the-fact one agree; the shared JSON reads back."""

from __future__ import annotations

import json

import numpy as np
import pytest

from duetime.tools import hdr
from duetime.tools.outcomes import Outcome

MS = 1_000_000
S = 1_000_000_000


def test_encode_decode_and_merge_are_exact() -> None:
    one, two = hdr.new_histogram(), hdr.new_histogram()
    for value in range(1, 1001):
        hdr.record_us(one, value)
    for value in (5_000, 7_000, 10**9):  # the last is above 60 s: kept as 60 s
        hdr.record_us(two, value)
    back = hdr.decode(hdr.encode(one))
    assert back.get_total_count() == 1000
    assert back.get_value_at_percentile(50) == one.get_value_at_percentile(50)
    merged = hdr.merge([hdr.encode(one), hdr.encode(two)])
    assert merged.get_total_count() == 1003
    summary = hdr.percentiles_us(merged)
    assert summary["count"] == 1003
    assert summary["p50"] == pytest.approx(502, abs=1)
    assert summary["max"] == pytest.approx(hdr.HIGHEST_US, rel=1e-3)
    assert hdr.percentiles_us(hdr.new_histogram())["p99"] is None
    with pytest.raises(ValueError, match="not an encoded HDR histogram"):
        hdr.decode("bm90IGEgaGlzdG9ncmFt")


def test_percentiles_keep_three_significant_digits() -> None:
    histogram = hdr.new_histogram()
    values = np.random.default_rng(0).lognormal(7, 1, 20_000).astype(np.int64) + 1
    for value in values.tolist():
        hdr.record_us(histogram, value)
    summary = hdr.percentiles_us(histogram)
    for key, q in (("p50", 50), ("p99", 99), ("p999", 99.9)):
        assert summary[key] == pytest.approx(np.percentile(values, q), rel=2e-3)
    values_us, fractions = hdr.cdf_points(histogram)
    assert fractions[-1] == pytest.approx(1.0)
    assert np.all(np.diff(values_us) > 0)
    assert np.all(np.diff(fractions) >= 0)


def run_arrays(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sent = np.sort(rng.integers(0, 5 * S, 3_000))
    latency = rng.integers(100_000, 400 * MS, sent.size)
    outcome = rng.choice([Outcome.OK, Outcome.LATE, Outcome.REJECTED, Outcome.EXPIRED,
                          Outcome.ERROR, Outcome.NO_ANSWER], sent.size,
                         p=[0.8, 0.05, 0.05, 0.04, 0.03, 0.03]).astype(np.int8)  # fmt: skip
    return sent, latency, outcome


def test_streaming_and_array_recorders_agree() -> None:
    sent, latency, outcome = run_arrays(np.random.default_rng(3))
    recorder = hdr.LatencyRecorder(0)
    for at in sent.tolist():
        recorder.sent(at)
    answered = (outcome == Outcome.OK) | (outcome == Outcome.LATE)
    ends = np.where(answered, sent + latency, sent)
    order = np.argsort(ends, kind="stable")
    for at, lat, kind in zip(ends[order].tolist(), latency[order].tolist(),
                             outcome[order].tolist(), strict=True):  # fmt: skip
        recorder.ended(at, lat, kind)
    streamed = recorder.finish()
    computed = hdr.record_arrays(sent, latency, outcome)
    assert streamed.timeline.to_json() == computed.timeline.to_json()
    assert hdr.encode(streamed.histogram) == hdr.encode(computed.histogram)
    timeline = computed.timeline
    assert sum(timeline.sent) == sent.size
    ended = sum(timeline.ok) + sum(timeline.late) + sum(timeline.rejected)
    assert ended + sum(timeline.expired) + sum(timeline.errors) == sent.size
    assert sum(timeline.ok) == int(np.count_nonzero(outcome == Outcome.OK))
    assert len(timeline) == 6  # answers of the 5th second end in the 6th


def test_timeline_percentiles_per_second() -> None:
    recorder = hdr.LatencyRecorder(start_ns=10 * S)
    for i in range(100):  # second 0: 1..100 ms
        recorder.sent(10 * S + i * MS)
        recorder.ended(10 * S + 500 * MS + i, (i + 1) * MS, Outcome.OK)
    recorder.ended(12 * S + 1, 0, Outcome.REJECTED)  # second 2: no answers, a rejection
    recorded = recorder.finish()
    timeline = recorded.timeline
    assert timeline.sent == [100, 0, 0]
    assert timeline.ok == [100, 0, 0]
    assert timeline.rejected == [0, 0, 1]
    assert timeline.p50_us[0] == pytest.approx(50_500)
    assert timeline.p99_us[0] == pytest.approx(99_010)
    assert timeline.max_us == [100_000, None, None]
    assert recorder.p99_us() == pytest.approx(99_000, rel=1e-3)


def test_run_fields_read_back_as_a_report() -> None:
    sent, latency, outcome = run_arrays(np.random.default_rng(4))
    recorded = hdr.record_arrays(sent, latency, outcome)
    doc = json.loads(
        json.dumps(
            hdr.run_fields("bench", "a run", 5.0, recorded, {"x": 1}, unsent=0, unanswered=0)
        )
    )
    assert doc["x"] == 1
    assert doc["sent"] == sent.size
    assert doc["goodput_rps"] == pytest.approx(doc["ok"] / 5.0)
    assert set(doc["latency_us"]) >= {"p50", "p99", "p999", "max", "count"}
    report = hdr.RunReport.from_json(doc, "a.json")
    assert (report.label, report.description) == ("a.json", "a run")
    assert (report.kind, report.counts["sent"]) == ("bench", sent.size)
    assert report.latency_us == doc["latency_us"]
    with pytest.raises(ValueError, match="not a result of `duetime bench --json`"):
        hdr.RunReport.from_json({"overall": {}}, "old.json")
    # (a result without its unsent or unanswered count, at the top or in `overall`, was read
    # as complete and ranked: found by a tester)
    missing = {k: v for k, v in doc.items() if k != "unanswered"}
    with pytest.raises(ValueError, match=r"c\.json: unanswered: missing"):
        hdr.RunReport.from_json(missing, "c.json")
    assert hdr.RunReport.from_json({**missing, "overall": {"unanswered": 2}}, "d").unanswered == 2
    doc["timeline"]["ok"] = doc["timeline"]["ok"][:-1]
    with pytest.raises(ValueError, match=r"b\.json: timeline\.ok"):
        hdr.RunReport.from_json(doc, "b.json")


def test_an_exact_max_given_is_the_max_and_bounds_the_percentiles() -> None:
    """Found by a tester: ITCH's report gave a bucket's bound as its max, 1000447 µs in a run
    with a 1 s deadline and no late answer (the largest latency was 999958 µs)."""
    histogram = hdr.new_histogram()
    for value in (10, 20, 999_958):
        hdr.record_us(histogram, value)
    assert hdr.percentiles_us(histogram)["max"] > 999_958  # (the bucket's bound)
    exact = hdr.percentiles_us(histogram, 999_958)
    assert exact["max"] == 999_958
    assert exact["p999"] == exact["p99"] == 999_958
    assert exact["p50"] == pytest.approx(20, abs=0.1)
