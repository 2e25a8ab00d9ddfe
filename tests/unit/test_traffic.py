"""The traffic policy: A/B weights, sticky keys by weighted rendezvous hashing, shadows; pure."""

from __future__ import annotations

import hashlib
import random
from collections import Counter

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from duetime.config import TrafficConfig, parse_model_config
from duetime.errors import ConfigError
from duetime.routing.traffic import plan_traffic, rendezvous, routing_key, unit_hash

KEYS = [f"user-{i}" for i in range(10_000)]


def shares(weights: dict[str, float], served: list[str] | None = None) -> dict[str, float]:
    plan = plan_traffic(TrafficConfig(weights=weights), served or list(weights), "1")
    counts = Counter(plan.pick(key, 0.0) for key in KEYS)
    return {version: counts[version] / len(KEYS) for version in plan.versions}


def test_a_70_30_split_over_10000_keys_lands_within_2_percent() -> None:
    found = shares({"1": 70, "2": 30})
    assert found["1"] == pytest.approx(0.70, abs=0.02)
    assert found["2"] == pytest.approx(0.30, abs=0.02)


@pytest.mark.parametrize(
    "weights", [{"1": 1, "2": 1, "3": 2}, {"1": 5, "2": 90, "3": 5}, {"4": 33, "7": 67}]
)
def test_key_shares_follow_the_weights(weights: dict[str, float]) -> None:
    total = sum(weights.values())
    for version, share in shares(weights).items():
        assert share == pytest.approx(weights[version] / total, abs=0.02)


def test_random_draws_follow_the_weights() -> None:
    plan = plan_traffic(TrafficConfig(weights={"1": 70, "2": 30}), ["1", "2"], "2")
    rng = random.Random(7)
    counts = Counter(plan.pick(None, rng.random()) for _ in range(20_000))
    assert counts["1"] / 20_000 == pytest.approx(0.70, abs=0.02)
    assert plan.pick(None, 0.0) == "1"
    assert plan.pick(None, 0.9999999) == "2"


def test_changing_one_weight_moves_only_keys_to_or_from_that_version() -> None:
    before = plan_traffic(TrafficConfig(weights={"1": 50, "2": 30, "3": 20}), ["1", "2", "3"], "3")
    raised = plan_traffic(TrafficConfig(weights={"1": 50, "2": 45, "3": 20}), ["1", "2", "3"], "3")
    moved = 0
    for key in KEYS:
        old, new = before.pick(key, 0), raised.pick(key, 0)
        if old != new:
            moved += 1
            assert new == "2"  # keys only move to the version whose weight grew
    # the least possible movement: 2's share goes from 30% to 45/115 = 39.1%
    assert moved / len(KEYS) == pytest.approx(45 / 115 - 0.30, abs=0.02)


def test_lowering_a_weight_moves_keys_only_away_from_it() -> None:
    before = plan_traffic(TrafficConfig(weights={"1": 70, "2": 30}), ["1", "2"], "2")
    after = plan_traffic(TrafficConfig(weights={"1": 50, "2": 30}), ["1", "2"], "2")
    for key in KEYS[:3000]:
        if before.pick(key, 0) == "2":
            assert after.pick(key, 0) == "2"


def test_a_new_version_takes_keys_only_for_itself() -> None:
    before = plan_traffic(TrafficConfig(weights={"1": 50, "2": 50}), ["1", "2"], "2")
    after = plan_traffic(TrafficConfig(weights={"1": 50, "2": 50, "3": 25}), ["1", "2", "3"], "3")
    for key in KEYS[:3000]:
        new = after.pick(key, 0)
        assert new in (before.pick(key, 0), "3")


def test_weights_of_versions_not_served_are_ignored() -> None:
    plan = plan_traffic(TrafficConfig(weights={"1": 70, "9": 30}), ["1", "2"], "2")
    assert plan.versions == ("1",)
    assert not plan.split
    nothing = plan_traffic(TrafficConfig(weights={"9": 1}), ["1", "2"], "2")
    assert nothing.versions == ("2",)  # all to the default


def test_no_weights_sends_everything_to_the_default() -> None:
    plan = plan_traffic(TrafficConfig(), ["1", "2"], "2")
    assert plan.versions == ("2",)
    assert plan.shadows == ()


@given(st.text(max_size=40), st.sampled_from(["1", "2", "10"]))
def test_unit_hash_is_in_the_open_unit_interval(key: str, version: str) -> None:
    value = unit_hash(key.encode("utf-8", "surrogatepass"), version)
    assert 0.0 < value < 1.0
    assert value == unit_hash(key.encode("utf-8", "surrogatepass"), version)


DIGITS = "0123456789"


def test_versions_sharing_their_first_16_digits_split_keys_by_the_weights() -> None:
    """Timestamp versions (17 digits) that differ only in their last digit: every key went to
    the first of them, as only 16 bytes of a version were hashed."""
    a, b = "20241201120000123", "20241201120000124"
    found = shares({a: 50, b: 50})
    assert found[a] == pytest.approx(0.5, abs=0.02)
    assert found[b] == pytest.approx(0.5, abs=0.02)


@given(
    st.text(max_size=40),
    st.text(DIGITS, min_size=16, max_size=40),
    st.text(DIGITS, max_size=20),
    st.text(DIGITS, min_size=1, max_size=20),
)
def test_the_whole_version_is_hashed_whatever_its_length(
    key: str, prefix: str, tail: str, other: str
) -> None:
    """Two versions that share their first 16 bytes (or more) hash a key apart, so rendezvous
    scores them independently; a 16-byte version and its longer extension too."""
    assume(tail != other)
    encoded = key.encode("utf-8", "surrogatepass")
    first, second = unit_hash(encoded, prefix + tail), unit_hash(encoded, prefix + other)
    assert 0.0 < first < 1.0
    assert 0.0 < second < 1.0
    assert first != second


@given(st.text(max_size=40), st.text(DIGITS, min_size=1, max_size=16))
def test_versions_of_at_most_16_bytes_keep_their_hashes(key: str, version: str) -> None:
    """What a key scored before long versions were hashed whole: its version stays its own."""
    encoded = key.encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(encoded, digest_size=8, person=version.encode()).digest()
    assert unit_hash(encoded, version) == (int.from_bytes(digest, "big") + 0.5) / 2.0**64


@given(st.text(max_size=40))
def test_rendezvous_is_deterministic(key: str) -> None:
    assert rendezvous(key, ["1", "2"], [1.0, 1.0]) == rendezvous(key, ["1", "2"], [1.0, 1.0])


def test_routing_key_prefers_the_request_parameter() -> None:
    assert routing_key("x-routing-key", {"x-routing-key": "p"}, {"x-routing-key": "h"}) == "p"
    assert routing_key("X-Routing-Key", {}, {"x-routing-key": "h"}) == "h"
    assert routing_key("x-routing-key", {"x-routing-key": 42}, {}) == "42"
    # (a boolean keys as JSON writes it, as a header would: it pinned nothing, found by a tester)
    assert routing_key("x-routing-key", {"x-routing-key": True}, {}) == "true"
    assert routing_key("x-routing-key", {"x-routing-key": False}, {}) == "false"
    assert routing_key("x-routing-key", {}, {}) is None
    assert routing_key(None, {"x-routing-key": "p"}, {}) is None


def test_a_key_is_the_same_as_a_parameter_and_as_a_header() -> None:
    """Found by a tester: HTTP header values are read as Latin-1, and lose spaces at either
    end on the wire, so a non-ASCII or padded key pinned another version as a header."""
    as_header = "Zürich-🙂".encode().decode("latin-1")  # (as the HTTP front end reads it)
    assert routing_key("k", {}, {"k": as_header}) == "Zürich-🙂"
    assert routing_key("k", {"k": " padded\t"}, {}) == routing_key("k", {}, {"k": "padded"})
    assert routing_key("k", {}, {"k": "caf\xe9"}) == "caf\xe9"  # (Latin-1, not UTF-8: kept)
    assert routing_key("k", {}, {"k": "日本"}) == "日本"  # (gRPC metadata: already text)


def test_versions_are_named_as_requests_name_them() -> None:
    config = parse_model_config(
        {"traffic": {"weights": {"01": 90, "2": 10}, "shadow": {"003": 0.5}}}, source="c"
    )
    assert config.traffic.weights == {"1": 90, "2": 10}
    assert config.traffic.shadow == {"3": 0.5}


@pytest.mark.parametrize(
    ("traffic", "message"),
    [
        ({"weights": {"one": 1}}, "'one' is not an integer version"),
        ({"weights": {"1": 0}}, "at least one version needs a weight above 0"),
        ({"weights": {"1": -1}}, "greater than or equal to 0"),
        ({"shadow": {"2": 1.5}}, "less than or equal to 1"),
        ({"sticky_key": ""}, "at least 1 character"),
        ({"mirror": {}}, "Extra inputs are not permitted"),
        ({"weights": {"1": float("inf"), "2": 1}}, "Input should be a finite number"),
        ({"weights": {"1": 1e308, "2": 1e308}}, "less than or equal to 1000000000"),
        ({"weights": {"1": float("nan")}}, "Input should be a finite number (got nan)"),
        ({"weights": {"1": 1, "01": 2}}, "version 1 is given twice ('01')"),
    ],
)
def test_bad_traffic_config_names_the_field(traffic: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match="field 'traffic") as caught:
        parse_model_config({"traffic": traffic}, source="config.toml")
    assert message in caught.value.message


def test_a_version_left_out_has_its_keys_spread_by_the_others_weights() -> None:
    """Failover (a version's breakers all open): the keys of the version left out go where
    rendezvous puts them next, so by the others' weights; the others' keys stay. Found by a
    tester: the first working version in version order took every one (weights 1, 1, 98 sent
    99% of requests to the canary)."""
    plan = plan_traffic(TrafficConfig(weights={"1": 1, "2": 1, "3": 2}), ["1", "2", "3"], "3")
    moved = Counter()
    for key in KEYS:
        before, after = plan.pick(key, 0), plan.pick_among({"1", "2"}, key, 0)
        if before == "3":
            moved[after] += 1
        else:
            assert after == before
    assert moved["1"] / sum(moved.values()) == pytest.approx(0.5, abs=0.03)
    canary = plan_traffic(TrafficConfig(weights={"1": 1, "2": 9}), ["1", "2", "3"], "3")
    rng = random.Random(3)
    counts = Counter(canary.pick_among({"1", "2"}, None, rng.random()) for _ in range(20_000))
    assert counts["1"] / 20_000 == pytest.approx(0.1, abs=0.01)
    assert canary.pick_among({"2"}, "k", 0.0) == "2"
    assert canary.pick_among({"3"}, "k", 0.0) is None  # (3 takes no traffic)
    assert canary.pick_among(set(), None, 0.5) is None
