"""Model config values refused for what they would do, not only for their type: a variant that
takes the primary's name, and numbers that are not numbers (NaN), named as such."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from duetime.config import ServerSettings, parse_model_config
from duetime.errors import ConfigError
from duetime.repository.registry import PRIMARY


def test_a_variant_may_not_take_the_primarys_name() -> None:
    """A variant named "default" was served, and every answer said `variant: default`, whether
    model.onnx or the variant computed it."""
    data = {"variants": [{"name": PRIMARY, "file": "model.small.onnx"}]}
    with pytest.raises(ConfigError) as caught:
        parse_model_config(data, source="config.toml")
    message = caught.value.message
    assert message.startswith("config.toml: field 'variants.0.name': ")
    assert f"'{PRIMARY}' is the name" in message
    assert "model.onnx" in message
    parse_model_config({"variants": [{"name": "Default", "file": "a.onnx"}]}, source="c")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"traffic": {"weights": {"1": float("nan")}}}, "traffic.weights.1"),
        ({"traffic": {"shadow": {"2": float("nan")}}}, "traffic.shadow.2"),
        ({"scheduling": {"exec_margin": float("nan")}}, "scheduling.exec_margin"),
        ({"default_timeout_ms": float("nan")}, "default_timeout_ms"),
    ],
    ids=str,
)
def test_a_nan_is_refused_as_no_finite_number(data: dict[str, object], field: str) -> None:
    """A NaN weight was refused with "Input should be less than or equal to 1000000000 (got
    nan)": a bound NaN does not exceed."""
    with pytest.raises(ConfigError) as caught:
        parse_model_config(data, source="config.toml")
    assert caught.value.message == (
        f"config.toml: field '{field}': Input should be a finite number (got nan)"
    )


def test_an_infinite_weight_is_refused_as_no_finite_number() -> None:
    with pytest.raises(ConfigError, match=r"Input should be a finite number \(got inf\)"):
        parse_model_config({"traffic": {"weights": {"1": float("inf")}}}, source="c")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"default_timeout_ms": math.inf}, "default_timeout_ms"),
        ({"breaker": {"slow_factor": math.inf}}, "breaker.slow_factor"),
        ({"default_timeout_ms": -math.inf}, "default_timeout_ms"),
    ],
)
def test_an_infinite_number_is_refused_naming_its_field(data: dict[str, Any], field: str) -> None:
    """`default_timeout_ms = inf` passed (it is bounded only below) and the server exited at
    start on an OverflowError (an explicit load of it: 500)."""
    with pytest.raises(ConfigError, match=rf"field '{field}': Input should be a finite number"):
        parse_model_config(data, source="config.toml")


def test_an_infinite_server_setting_is_refused_naming_its_field() -> None:
    with pytest.raises(ValidationError, match="finite number"):
        ServerSettings(shutdown_grace_s=math.inf)


def test_a_variants_error_may_be_infinite_as_optimize_writes_a_nan_answer() -> None:
    quality = {"max_abs_error": math.inf, "argmax_agreement": 1.0, "samples": 3}
    variant = {"name": "v", "file": "v.onnx", "kind": "fp16", "quality": quality}
    config = parse_model_config({"variants": [variant]}, source="config.toml")
    assert config.variants[0].quality is not None
    assert config.variants[0].quality.max_abs_error == math.inf


def test_a_default_timeout_too_long_for_tritons_form_is_refused() -> None:
    """1e20 ms passed; the config endpoints then failed (500 / UNKNOWN): Triton's form holds
    microseconds in a uint64."""
    with pytest.raises(ConfigError, match=r"field 'default_timeout_ms': Input should be less"):
        parse_model_config({"default_timeout_ms": 1e20}, source="config.toml")
    longest = parse_model_config({"default_timeout_ms": 2**64 / 1000}, source="c")
    assert longest.default_timeout_ms == 2**64 / 1000  # (Triton's uint64 max, in ms)
