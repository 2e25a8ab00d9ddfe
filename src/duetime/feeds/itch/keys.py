"""The name a stock goes by in a book summary (`itch book`) and in a run's predictions.

A locate is named by the symbol of its last stock directory (R) message, trailing spaces
removed; a locate with no R message, or whose symbol is all spaces, by `#<locate>` ("#17").
When a lower locate has that name already (two locates with one symbol), the locate's number
is appended: "AAPL", "AAPL@2". `stock_keys` names every locate of a whole file at once;
`StockKeys` keeps the same names current while a feed goes on, for its predictions.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable


def base_key(locate: int, symbol: str) -> str:
    """The name the locate asks for: its symbol, or `#<locate>` if it has none ('')."""
    return symbol or f"#{locate}"


def stock_keys(symbols: Iterable[tuple[int, str]]) -> dict[int, str]:
    """The key of each (locate, symbol) pair given in ascending locate order ('' for no
    symbol): its `base_key`, unless a lower locate has that key already, which gets
    `@<locate>` appended: "AAPL", "AAPL@2".

    NOTE: the lowest locate keeps the plain key, not the first one seen in the file: both paths
    (and any other tool) know it without the message order, and it is the first in the layout.
    """
    keys: dict[int, str] = {}
    taken: set[str] = set()
    for locate, symbol in symbols:
        key = base_key(locate, symbol)
        while key in taken:  # (repeated only if a symbol spells "X@<locate>" itself)
            key = f"{key}@{locate}"
        taken.add(key)
        keys[locate] = key
    return keys


def renamed_note(keys: dict[int, str], symbols: dict[int, str]) -> str | None:
    """One line (for stderr) on the locates `stock_keys` keyed with their locate because a lower
    one has their symbol; None if none was."""
    renamed = [key for locate, key in keys.items() if key != base_key(locate, symbols[locate])]
    if not renamed:
        return None
    return (
        f"{len(renamed)} locate(s) share their symbol with a lower locate and are keyed "
        f"<symbol>@<locate>: {', '.join(renamed[:5])}{', ...' if len(renamed) > 5 else ''}"
    )


class StockKeys:
    """`stock_keys` of the locates named so far, kept current as a feed names more (`name`), at
    a few dictionary reads a key however the directory changes.

    A locate's key depends only on the lower locates' keys, and of those only on the plain ones
    (a key made with a locate, "X@3", can only clash with the same locate's): so a key is worked
    out from the lowest locate that has each name (`_holders`), going down to a lower locate
    only when a name itself spells "<name>@<locate>".
    """

    __slots__ = ("_base", "_holders", "_keys")

    def __init__(self) -> None:
        self._base: dict[int, str] = {}
        self._holders: dict[str, list[int]] = {}
        """Base key -> the locates that ask for it, ascending."""
        self._keys: dict[int, str] = {}
        """Keys worked out since the names last changed."""

    def name(self, locate: int, symbol: str) -> None:
        """`locate` was seen (symbol '') or named by a stock directory message."""
        base = base_key(locate, symbol)
        old = self._base.get(locate)
        if old == base:
            return
        if old is not None:
            holders = self._holders[old]
            holders.remove(locate)
            if not holders:
                del self._holders[old]
        self._base[locate] = base
        bisect.insort(self._holders.setdefault(base, []), locate)
        self._keys.clear()

    def key(self, locate: int) -> str:
        """The key of a locate named before (`KeyError` for another)."""
        key = self._keys.get(locate)
        if key is None:
            key = self._keys[locate] = self._work_out(locate)
        return key

    def _work_out(self, locate: int) -> str:
        base = self._base[locate]
        if self._holders[base][0] == locate and not self._made_below(base, locate):
            return base
        key = f"{base}@{locate}"
        while self._plain_below(key, locate):
            key = f"{key}@{locate}"
        return key

    def _plain_below(self, key: str, locate: int) -> bool:
        """Whether a locate below `locate` has `key` as its plain key."""
        holders = self._holders.get(key)
        if not holders or holders[0] >= locate:
            return False
        return not self._made_below(key, holders[0])

    def _made_below(self, key: str, locate: int) -> bool:
        """Whether a locate below `locate` has `key` as a key made with its number."""
        _, at, number = key.rpartition("@")
        if not at or not number.isascii() or not number.isdigit():
            return False
        other = int(number)
        if other >= locate or str(other) != number or other not in self._base:
            return False
        return key.startswith(self._base[other] + "@") and self.key(other) == key
