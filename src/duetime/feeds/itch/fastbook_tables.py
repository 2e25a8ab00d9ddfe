"""The arrays the compiled book pass works on (`Tables`), their open-addressing hash tables, and
growing them when a pass runs out of room.

Records are rows of int64 tables (an order is 7 words, about one cache line); column numbers
are module constants, which numba folds into the compiled code. A hash table is an (n, 2) array
of (key, row) pairs, row -1 for an empty slot, with linear probing and backward-shift deletion:
deletes leave no tombstones, so the table never needs a cleanup pass, and a probe reads one
cache line for both the key and the row.

NOTE: numba freezes these constants into the compiled code, and its disk cache checks only the
compiled function's own file: after changing a constant here, delete the `fastbook*.nb[ic]`
files in `__pycache__` (or touch fastbook_kernel.py and fastbook_changes.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

# Order table columns. PREV/NEXT link the order into its level's FIFO (NEXT also chains the
# free list).
O_REF, O_PRICE, O_SHARES, O_BOOK, O_LEVEL, O_PREV, O_NEXT = range(7)
ORDER_FIELDS = 7
# Level table columns. BETTER/WORSE link a book's levels in price order (WORSE also chains the
# free list); HEAD/TAIL are the ends of the level's order FIFO.
L_PRICE, L_SHARES, L_ORDERS, L_HEAD, L_TAIL, L_BETTER, L_WORSE, L_BOOK = range(8)
LEVEL_FIELDS = 8
# Level tree columns (`level_tree`, one row per level row): each book's levels also form a treap
# in price order, better prices to the LEFT, so a new level far from both ends of its book is
# placed in O(log levels) (see fastbook_kernel._link_level). Kept apart from the level rows,
# which stay one cache line: only creating and dropping a level touch the tree.
T_LEFT, T_RIGHT, T_UP = range(3)
TREE_FIELDS = 3
# Change table columns: the top of book after each applied change, packed into 4 words (the
# table is written once per change, so its size is the pass's memory traffic): C_STAMP is
# ts | locate << 48, C_PRICES bid_px << 32 | ask_px (0 for an empty side: no order rests at
# price 0), then the shares at each best price.
C_STAMP, C_PRICES, C_BID_SZ, C_ASK_SZ = range(4)
CHANGE_FIELDS = 4
TS_BITS = 48
# `state` scalars, kept in an array so a pass can stop and resume; the anomaly counts follow.
# S_FIRST_BAD: the offset of the first frame skipped (-1: none yet).
S_POS, S_ORDER_FREE, S_ORDER_HIGH, S_LEVEL_FREE, S_LEVEL_HIGH, S_CHANGES, S_BAD_FRAMES = range(7)
S_FIRST_BAD = 7
S_ANOMALIES = 8
ANOMALY_KINDS = 9
STATE_FIELDS = S_ANOMALIES + ANOMALY_KINDS
# Hash table columns.
H_KEY, H_ROW = 0, 1

LOCATES = 65536
BOOKS = LOCATES * 2
"""One book per (locate, side): index locate * 2 + side, side 0 = buy, 1 = sell."""
BEST, WORST = 0, 1
"""`ends` columns: a book's best and worst level rows (-1: the side is empty)."""
STOCK_COLUMNS = 64
"""`stocks` columns: message counts by type letter in column `letter & 63` (distinct for every
ASCII letter: 'A'..'Z' are 1..26, 'a'..'z' 33..58), and the one below."""
ST_MESSAGES = 0
"""Messages carrying the locate, all types: non-zero once the locate was seen."""
SYMBOL_BYTES = 8


class Tables(NamedTuple):
    """Everything the compiled pass reads and writes."""

    state: np.ndarray
    orders: np.ndarray
    order_hash: np.ndarray
    levels: np.ndarray
    level_hash: np.ndarray
    level_tree: np.ndarray
    ends: np.ndarray
    stocks: np.ndarray
    symbols: np.ndarray
    """Per locate: the stock directory's 8 symbol bytes, as last set by an R message."""
    changes: np.ndarray


def new_tables(orders: int = 1 << 16, levels: int = 1 << 12, changes: int = 1 << 16) -> Tables:
    """Empty tables with room for `orders` live orders, `levels` live levels and `changes`
    change records before the first grow."""
    state = np.zeros(STATE_FIELDS, np.int64)
    state[S_ORDER_FREE] = -1
    state[S_LEVEL_FREE] = -1
    state[S_FIRST_BAD] = -1
    return Tables(
        state=state,
        orders=np.empty((orders, ORDER_FIELDS), np.int64),
        order_hash=_empty_hash(orders),
        levels=np.empty((levels, LEVEL_FIELDS), np.int64),
        level_hash=_empty_hash(levels),
        level_tree=np.empty((levels, TREE_FIELDS), np.int64),
        ends=np.full((BOOKS, 2), -1, np.int64),
        stocks=np.zeros((LOCATES, STOCK_COLUMNS), np.int64),
        symbols=np.zeros((LOCATES, SYMBOL_BYTES), np.uint8),
        changes=np.empty((changes, CHANGE_FIELDS), np.int64),
    )


def _empty_hash(rows: int) -> np.ndarray:
    """Room for `rows` entries in a power of two of slots at least twice that: the table is
    never more than half full, so probe runs stay short."""
    table = np.empty((1 << (2 * rows - 1).bit_length(), 2), np.int64)
    table[:, H_ROW] = -1
    return table


def grow_orders(t: Tables) -> Tables:
    grown = _empty_hash(2 * len(t.orders))
    rehash(t.order_hash, grown)
    return t._replace(orders=_grown_rows(t.orders), order_hash=grown)


def grow_levels(t: Tables) -> Tables:
    grown = _empty_hash(2 * len(t.levels))
    rehash(t.level_hash, grown)
    return t._replace(
        levels=_grown_rows(t.levels), level_hash=grown, level_tree=_grown_rows(t.level_tree)
    )


def grow_changes(t: Tables) -> Tables:
    return t._replace(changes=_grown_rows(t.changes))


def _grown_rows(table: np.ndarray) -> np.ndarray:
    grown = np.empty((2 * len(table), table.shape[1]), table.dtype)
    grown[: len(table)] = table
    return grown


_MIX = np.int64(-7046029254386353131)  # 0x9E3779B97F4A7C15 as int64: Fibonacci hashing
_ONE = np.uint64(1)

ix = np.uint64
"""A row index for the compiled code: `table[ix(row), COLUMN]`. Numba counts a negative
signed index from the end, which costs a compare and a conditional move at every access (and
keeps LLVM from merging `_be`'s byte loads into one); an unsigned index is used as it is, and
the book pass runs about 20% faster. Only for rows known to be >= 0: -1 as a uint64 is far
out of bounds."""


@njit(cache=True)
def _home(key: int, mask: int) -> int:
    h = key * _MIX
    return int((h ^ (h >> 29)) & mask)


@njit(cache=True)
def hash_find(table: np.ndarray, key: int) -> int:
    """Slot holding `key`, or -1 - (the empty slot where it would go)."""
    mask = len(table) - 1
    i = ix(_home(key, mask))  # (probed unsigned: see `ix`)
    while True:
        if table[i, H_ROW] < 0:
            return -1 - int(np.int64(i))
        if table[i, H_KEY] == key:
            return int(np.int64(i))
        i = (i + _ONE) & ix(mask)


@njit(cache=True)
def hash_remove(table: np.ndarray, slot: int) -> None:
    """Empty `slot`, shifting later entries of its probe run back into the gap."""
    mask = len(table) - 1
    i = slot
    j = slot
    while True:
        j = (j + 1) & mask
        if table[ix(j), H_ROW] < 0:
            break
        home = _home(table[ix(j), H_KEY], mask)
        # The entry at j may fill the gap at i only if its home is not cyclically in (i, j].
        stays = (i < home <= j) if i <= j else (home > i or home <= j)
        if not stays:
            table[ix(i), H_KEY] = table[ix(j), H_KEY]
            table[ix(i), H_ROW] = table[ix(j), H_ROW]
            i = j
    table[ix(i), H_ROW] = -1


@njit(cache=True)
def rehash(table: np.ndarray, grown: np.ndarray) -> None:
    """Move every entry into the (empty, larger) `grown` table."""
    for i in range(len(table)):
        if table[i, H_ROW] >= 0:
            slot = -1 - hash_find(grown, table[i, H_KEY])
            grown[slot, H_KEY] = table[i, H_KEY]
            grown[slot, H_ROW] = table[i, H_ROW]
