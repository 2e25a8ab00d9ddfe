"""A bad `timeout` or `priority` parameter is quoted back as the JSON the client sent."""

from __future__ import annotations

from typing import Any

import pytest

from duetime.errors import InvalidInput
from duetime.frontend.parameters import due_from_timeout_us, priority_of


@pytest.mark.parametrize(
    ("value", "shown"), [(True, "got true"), ("abc", 'got "abc"'), (1.5, "got 1.5"), (-1, "got -1")]
)
def test_a_bad_timeout_is_quoted_as_json(value: Any, shown: str) -> None:
    with pytest.raises(InvalidInput, match=f"'timeout' .*{shown}$"):
        due_from_timeout_us({"timeout": value}, 0)


@pytest.mark.parametrize(("value", "shown"), [(False, "got false"), ("x", 'got "x"')])
def test_a_bad_priority_is_quoted_as_json(value: Any, shown: str) -> None:
    with pytest.raises(InvalidInput, match=f"'priority' .*{shown}$"):
        priority_of({"priority": value})
