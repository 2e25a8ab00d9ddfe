"""The model config's `scheduling` field: the table and the string shorthand for its policy."""

from __future__ import annotations

import pytest

from duetime.config import parse_model_config
from duetime.errors import ConfigError


@pytest.mark.parametrize("policy", ["fifo", "edf"])
def test_a_policy_string_is_short_for_a_scheduling_table_holding_only_it(policy: str) -> None:
    config = parse_model_config({"scheduling": policy}, source="config.toml")
    assert config.scheduling.policy == policy
    assert config.scheduling.max_queue_size == 1024  # the rest keep their defaults


def test_the_scheduling_table_still_sets_every_field() -> None:
    config = parse_model_config(
        {"scheduling": {"policy": "fifo", "max_queue_delay_us": 500}}, source="config.toml"
    )
    assert (config.scheduling.policy, config.scheduling.max_queue_delay_us) == ("fifo", 500)


def test_an_unknown_policy_string_is_refused_naming_the_field_and_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"scheduling\.policy.*'edf' or 'fifo'"):
        parse_model_config({"scheduling": "lifo"}, source="config.toml")


def test_a_bound_per_priority_level_is_off_unless_set() -> None:
    assert parse_model_config({}, source="config.toml").scheduling.max_queue_size_per_level == 0
    config = parse_model_config(
        {"scheduling": {"max_queue_size_per_level": 2, "priority_levels": 2}},
        source="config.toml",
    )
    assert config.scheduling.max_queue_size_per_level == 2
    with pytest.raises(ConfigError, match=r"scheduling\.max_queue_size_per_level"):
        parse_model_config({"scheduling": {"max_queue_size_per_level": -1}}, source="config.toml")
