"""After the compiled book pass: its change records grouped by stock, written out as the digest's
text lines, and the final depth of each book, all compiled too.

The summary digests every stock's top-of-book lines (`ts,bid_px,bid_sz,ask_px,ask_sz\\n`, '-'
for an empty side's price). Formatting a million lines with Python f-strings would cost more
than the book itself, so the bytes are written here into one buffer, stock after stock, and
`hashlib` reads each stock's slice of it without a copy.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from duetime.feeds.itch.fastbook_tables import (
    BEST,
    C_ASK_SZ,
    C_BID_SZ,
    C_PRICES,
    C_STAMP,
    H_ROW,
    L_ORDERS,
    L_PRICE,
    L_SHARES,
    L_WORSE,
    LOCATES,
    O_BOOK,
    TS_BITS,
)

_COMMA, _NEWLINE, _DASH, _ZERO = b",\n-0"
_TS_MASK = (1 << TS_BITS) - 1
_PRICE_MASK = 0xFFFFFFFF


def unpack_changes(changes: np.ndarray) -> np.ndarray:
    """Packed change rows as (ts, bid_px, bid_sz, ask_px, ask_sz, locate), price -1 for an
    empty side."""
    stamp = changes[:, C_STAMP]
    prices = changes[:, C_PRICES]
    out = np.empty((len(changes), 6), np.int64)
    out[:, 0] = stamp & _TS_MASK
    out[:, 1] = (prices >> 32) & _PRICE_MASK
    out[:, 2] = changes[:, C_BID_SZ]
    out[:, 3] = prices & _PRICE_MASK
    out[:, 4] = changes[:, C_ASK_SZ]
    out[:, 5] = (stamp >> TS_BITS) & 0xFFFF
    out[:, [1, 3]] = np.where(out[:, [1, 3]] == 0, -1, out[:, [1, 3]])
    return out


@njit(cache=True)
def _locate(stamp: int) -> int:
    return (stamp >> TS_BITS) & 0xFFFF


@njit(cache=True)
def _line(stamp: int, prices: int, bid_sz: int, ask_sz: int) -> tuple[int, int, int, int, int]:
    """The five digest fields of a packed row, -1 for an empty side's price."""
    bid_px = (prices >> 32) & _PRICE_MASK
    ask_px = prices & _PRICE_MASK
    return (
        stamp & _TS_MASK,
        bid_px if bid_px else -1,
        bid_sz,
        ask_px if ask_px else -1,
        ask_sz,
    )


@njit(cache=True)
def group_by_locate(changes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, starts): the row numbers of `changes` grouped by locate, feed order kept within
    each group (a counting sort), and `starts[locate]:starts[locate + 1]` each group's span."""
    starts = np.zeros(LOCATES + 1, np.int64)
    for i in range(len(changes)):
        starts[_locate(changes[i, C_STAMP]) + 1] += 1
    for locate in range(LOCATES):
        starts[locate + 1] += starts[locate]
    fill = starts[:-1].copy()
    rows = np.empty(len(changes), np.int64)
    for i in range(len(changes)):
        locate = _locate(changes[i, C_STAMP])
        rows[fill[locate]] = i
        fill[locate] += 1
    return rows, starts


_POW10 = np.array([10**k for k in range(19)], np.int64)
_LAST_FIELD = 4


@njit(cache=True)
def _width(value: int) -> int:
    """Characters of `value` in decimal; 1 for a negative one (written '-')."""
    n = 1
    while n < 19 and value >= _POW10[n]:
        n += 1
    return n


@njit(cache=True)
def digest_text(changes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(text, starts): every stock's digest lines, stock after stock, and where each stock's
    bytes start: `text[starts[locate]:starts[locate + 1]]`.

    Both passes read `changes` in feed order and write each line at its stock's cursor: reading
    the rows grouped by stock instead would be a cache miss per row. NOTE: the digits are
    written inline rather than by a helper taking `text`, since a compiled call with an array
    argument may reference-count it on every call.
    """
    n = len(changes)
    widths = np.empty(n, np.int64)
    starts = np.zeros(LOCATES + 1, np.int64)
    for r in range(n):
        line = _line(changes[r, 0], changes[r, 1], changes[r, 2], changes[r, 3])
        width = 0
        for f in range(_LAST_FIELD + 1):
            width += _width(line[f]) + 1  # and the comma or newline
        widths[r] = width
        starts[_locate(changes[r, C_STAMP]) + 1] += width
    for locate in range(LOCATES):
        starts[locate + 1] += starts[locate]
    cursor = starts[:-1].copy()
    text = np.empty(starts[LOCATES], np.uint8)
    for r in range(n):
        locate = _locate(changes[r, C_STAMP])
        at = cursor[locate]
        cursor[locate] = at + widths[r]
        line = _line(changes[r, 0], changes[r, 1], changes[r, 2], changes[r, 3])
        for f in range(_LAST_FIELD + 1):
            value = line[f]
            if value < 0:  # an empty side's price
                text[at] = _DASH
                at += 1
            else:
                at += _width(value)
                i = at
                while True:
                    i -= 1
                    q = value // 10
                    text[i] = _ZERO + (value - 10 * q)
                    value = q
                    if value == 0:
                        break
            text[at] = _NEWLINE if f == _LAST_FIELD else _COMMA
            at += 1
    return text, starts


@njit(cache=True)
def live_orders(orders: np.ndarray, order_hash: np.ndarray) -> np.ndarray:
    """Live orders per locate: one walk of the order hash (no counter in the hot loop)."""
    live = np.zeros(LOCATES, np.int64)
    for slot in range(len(order_hash)):
        row = order_hash[slot, H_ROW]
        if row >= 0:
            live[orders[row, O_BOOK] >> 1] += 1
    return live


@njit(cache=True)
def book_depth(
    levels: np.ndarray, ends: np.ndarray, locates: np.ndarray, depth: int
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, starts): for each locate and side (0 bids, 1 asks) up to `depth` levels of
    (price, shares, orders), best first: book k = 2 * i + side (i the locate's index) is
    `rows[starts[k]:starts[k + 1]]`.

    NOTE: ragged, so the memory follows the levels the books hold, not `depth`: a dense
    (locates, 2, depth, 3) array raised MemoryError for `itch book --depth 10000000`.
    """
    books = 2 * len(locates)
    starts = np.zeros(books + 1, np.int64)
    for k in range(books):
        lv = ends[2 * locates[k >> 1] + (k & 1), BEST]
        n = 0
        while lv >= 0 and n < depth:
            lv = levels[lv, L_WORSE]
            n += 1
        starts[k + 1] = starts[k] + n
    rows = np.empty((starts[books], 3), np.int64)
    for k in range(books):
        lv = ends[2 * locates[k >> 1] + (k & 1), BEST]
        for r in range(starts[k], starts[k + 1]):
            rows[r, 0] = levels[lv, L_PRICE]
            rows[r, 1] = levels[lv, L_SHARES]
            rows[r, 2] = levels[lv, L_ORDERS]
            lv = levels[lv, L_WORSE]
    return rows, starts
