"""Request parameters both protocols share: `timeout` (µs, as tritonclient sends it), `priority`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from duetime.errors import InvalidInput

_MAX_TIMEOUT_US = 10**12
_MAX_PRIORITY = 2**64 - 1
"""Triton's priority is a uint64."""


def due_from_timeout_us(parameters: Mapping[str, Any], now_ns: int) -> int | None:
    """The due time set by the `timeout` parameter, or None when the request has none."""
    value = parameters.get("timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_TIMEOUT_US:
        raise InvalidInput(
            f"request parameter 'timeout' must be an integer count of microseconds between 0 "
            f"and {_MAX_TIMEOUT_US}, got {value!r}"
        )
    return now_ns + value * 1000 if value > 0 else None


def priority_of(parameters: Mapping[str, Any]) -> int:
    """The `priority` parameter (1 is highest; 0 or absent: the model's default level)."""
    value = parameters.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_PRIORITY:
        raise InvalidInput(
            f"request parameter 'priority' must be an integer between 0 and {_MAX_PRIORITY} "
            f"(a uint64), got {value!r}"
        )
    return value
