"""Stock keys: `stock_keys` for a whole file, and `StockKeys` keeping the same keys current while
a feed names its stocks in any order."""

from __future__ import annotations

import random

import pytest

from duetime.feeds.itch.keys import StockKeys, stock_keys

NAMES = ["", "A", "B", "A@2", "A@3", "A@2@3", "#2", "#3", "#3@3", "B@1", "A@02", "A@²"]
"""Symbols that clash every way a key can: twice the same, a symbol spelling another locate's
made key or a `#<locate>`, digits that are not a locate's number."""


def test_keys_of_a_file() -> None:
    assert stock_keys([(1, "AAPL"), (2, "AAPL"), (3, ""), (4, "#3"), (5, " LEAD")]) == {
        1: "AAPL",
        2: "AAPL@2",
        3: "#3",
        4: "#3@4",
        5: " LEAD",
    }


@pytest.mark.parametrize("seed", range(200))
def test_kept_keys_are_those_of_the_names_so_far(seed: int) -> None:
    rng = random.Random(seed)
    keys = StockKeys()
    named: dict[int, str] = {}
    for _ in range(40):
        locate = rng.randint(1, 6)
        symbol = rng.choice(NAMES)
        keys.name(locate, symbol)
        named[locate] = symbol
        expected = stock_keys(sorted(named.items()))
        asked = rng.sample(sorted(named), k=len(named))  # in any order: the cache must hold
        assert {locate: keys.key(locate) for locate in asked} == expected
