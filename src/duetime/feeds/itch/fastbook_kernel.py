"""The compiled pass behind `fastbook`: framing, decoding and every stock's level-3 book in one
numba loop over the raw buffer.

A level is found by a (book, price) hash and sits in a doubly linked list of its book's levels
in price order, so the best level is one read and a level that empties unlinks in O(1); a new
level walks in from the nearer end, which for real flow is a step or two from the top. A walk
that goes on for more than `_WALK` levels gives way to a search of the book's treap (the same
levels as a binary tree with pseudo-random priorities), so a book of many levels with new ones
arriving in the middle costs O(log levels) a level, not O(levels).

NOTE: the helpers take the few arrays they touch, not the `Tables` tuple. Numba passes a tuple
of arrays as every field of every array and reference-counts each one on every call: with the
whole tuple, half the time of a pass went to atomic increments.
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
    H_KEY,
    H_ROW,
    L_BETTER,
    L_BOOK,
    L_HEAD,
    L_ORDERS,
    L_PRICE,
    L_SHARES,
    L_TAIL,
    L_WORSE,
    O_BOOK,
    O_LEVEL,
    O_NEXT,
    O_PREV,
    O_PRICE,
    O_REF,
    O_SHARES,
    S_ANOMALIES,
    S_BAD_FRAMES,
    S_CHANGES,
    S_FIRST_BAD,
    S_LEVEL_FREE,
    S_LEVEL_HIGH,
    S_ORDER_FREE,
    S_ORDER_HIGH,
    S_POS,
    ST_MESSAGES,
    SYMBOL_BYTES,
    T_LEFT,
    T_RIGHT,
    T_UP,
    TS_BITS,
    WORST,
    Tables,
    hash_find,
    hash_remove,
    ix,
)
from duetime.feeds.itch.fastfeatures import (
    FEATURES_OFF,
    K_BOOK_EVENTS,
    K_MESSAGES,
    K_ROOM,
    K_ROWS,
    event_features,
    has_room,
)
from duetime.feeds.itch.parser import LENGTH_TABLE

DONE, GROW_ORDERS, GROW_LEVELS, GROW_CHANGES, BAD_FRAME = range(5)
ROWS_FULL, NAMED, GROW_SLOTS, GROW_NODES = range(5, 9)
"""`run_features`' statuses besides DONE, GROW_* and BAD_FRAME."""

# `state[S_ANOMALIES + k]`, k in book.ANOMALY_KINDS order.
(
    A_UNKNOWN_REF,
    A_DUPLICATE_REF,
    A_OVERSIZE,
    A_ZERO_SHARES,
    A_ZERO_PRICE,
    A_BAD_SIDE,
    A_MARKET_LOCATE,
    A_LOCATE_MISMATCH,
    A_CROSSED,
) = range(S_ANOMALIES, S_ANOMALIES + 9)

_A, _F, _E, _C, _X, _D, _U, _R, _B, _S, _P = b"AFECXDURBSP"
_CHANGES_BOOK = 1
_ROLE = np.zeros(256, np.int8)
"""Per type byte: _CHANGES_BOOK for A F E C X D U, else 0 (numba freezes it as a constant)."""
_ROLE[list(b"AFECXDU")] = _CHANGES_BOOK
_LENGTHS = LENGTH_TABLE
"""Message length by type byte, -1 for an unknown type: the parser's frame check."""


@njit(cache=True)
def _be(buf: np.ndarray, at: int, width: int) -> int:
    """The big-endian unsigned integer of `width` bytes at `at` (8 bytes wrap to int64)."""
    value = np.int64(0)
    for k in range(width):
        value = (value << 8) | np.int64(buf[ix(at + k)])
    return int(value)


@njit(cache=True)
def _better(side: int, a: int, b: int) -> bool:
    """Whether price `a` is strictly better than `b` on `side` (0 buy: higher; 1 sell: lower)."""
    return a > b if side == 0 else a < b


_WALK = 32
"""Levels a new level's walk from the nearer end may pass before the tree search takes over.

NOTE: the walk is kept for the common case (a step or two from the top of the book, cheaper
than a descent from the root); the cap makes it O(1). Before the cap, 80,000 adds at distinct
prices in random order took 37 s (the Python books: 1.3 s)."""
_PRIORITY_MIX = np.uint64(0x9E3779B97F4A7C15)
_PRIORITY_MIX2 = np.uint64(0xD6E8FEB86659FD93)
_SHIFT = np.uint64(32)


@njit(cache=True)
def _priority(lv: int) -> int:
    """The treap priority of level row `lv`: a fixed bijective scramble of the row number, so
    that priorities are distinct and unrelated to prices (the tree's expected depth is then
    O(log levels) whatever order the prices come in)."""
    h = np.uint64(lv) * _PRIORITY_MIX
    h ^= h >> _SHIFT
    h *= _PRIORITY_MIX2
    h ^= h >> _SHIFT
    return int(np.int64(h))


@njit(cache=True)
def _rotate_up(tree: np.ndarray, x: int) -> None:
    """Rotate the tree node `x` above its parent, keeping the in-order (price) order."""
    p = tree[ix(x), T_UP]
    g = tree[ix(p), T_UP]
    if tree[ix(p), T_LEFT] == x:
        inner = tree[ix(x), T_RIGHT]
        tree[ix(p), T_LEFT] = inner
        tree[ix(x), T_RIGHT] = p
    else:
        inner = tree[ix(x), T_LEFT]
        tree[ix(p), T_RIGHT] = inner
        tree[ix(x), T_LEFT] = p
    if inner >= 0:
        tree[ix(inner), T_UP] = p
    tree[ix(p), T_UP] = x
    tree[ix(x), T_UP] = g
    _relink(tree, g, p, x)


@njit(cache=True)
def _relink(tree: np.ndarray, up: int, old: int, new: int) -> None:
    """Make `new` the child of `up` that `old` was (nothing where `up` is -1: the root)."""
    if up >= 0:
        if tree[ix(up), T_LEFT] == old:
            tree[ix(up), T_LEFT] = new
        else:
            tree[ix(up), T_RIGHT] = new


@njit(cache=True)
def _neighbours(
    levels: np.ndarray, tree: np.ndarray, ends: np.ndarray, book: int, price: int
) -> tuple[int, int]:
    """(above, below): the levels of the (non-empty) `book` just better and just worse than
    `price` (-1 where there is none), which has no level of its own yet."""
    side = book & 1
    head = ends[ix(book), BEST]
    tail = ends[ix(book), WORST]
    steps = 0
    if abs(price - levels[ix(head), L_PRICE]) <= abs(price - levels[ix(tail), L_PRICE]):
        above = -1
        below = head
        while below >= 0 and _better(side, levels[ix(below), L_PRICE], price) and steps <= _WALK:
            above = below
            below = levels[ix(below), L_WORSE]
            steps += 1
    else:
        below = -1
        above = tail
        while above >= 0 and _better(side, price, levels[ix(above), L_PRICE]) and steps <= _WALK:
            below = above
            above = levels[ix(above), L_BETTER]
            steps += 1
    if steps <= _WALK:
        return above, below
    node = head  # the best level is the leftmost node: climb to the root, then descend
    while tree[ix(node), T_UP] >= 0:
        node = tree[ix(node), T_UP]
    above = -1
    below = -1
    while node >= 0:
        if _better(side, levels[ix(node), L_PRICE], price):
            above = node
            node = tree[ix(node), T_RIGHT]
        else:
            below = node
            node = tree[ix(node), T_LEFT]
    return above, below


@njit(cache=True)
def _link_level(levels: np.ndarray, tree: np.ndarray, ends: np.ndarray, lv: int) -> None:
    """Put the new level `lv` into its book's price-ordered list and tree."""
    book = levels[ix(lv), L_BOOK]
    tree[ix(lv), T_LEFT] = -1
    tree[ix(lv), T_RIGHT] = -1
    if ends[ix(book), BEST] < 0:
        levels[ix(lv), L_BETTER] = -1
        levels[ix(lv), L_WORSE] = -1
        tree[ix(lv), T_UP] = -1
        ends[ix(book), BEST] = lv
        ends[ix(book), WORST] = lv
        return
    above, below = _neighbours(levels, tree, ends, book, levels[ix(lv), L_PRICE])
    levels[ix(lv), L_BETTER] = above
    levels[ix(lv), L_WORSE] = below
    if above >= 0:
        levels[ix(above), L_WORSE] = lv
    else:
        ends[ix(book), BEST] = lv
    if below >= 0:
        levels[ix(below), L_BETTER] = lv
    else:
        ends[ix(book), WORST] = lv
    # In a binary search tree one of the in-order neighbours has a free slot on lv's side
    if above >= 0 and tree[ix(above), T_RIGHT] < 0:
        tree[ix(above), T_RIGHT] = lv
        tree[ix(lv), T_UP] = above
    else:
        tree[ix(below), T_LEFT] = lv
        tree[ix(lv), T_UP] = below
    priority = _priority(lv)  # then up while it outranks its parent: 2 rotations expected
    while tree[ix(lv), T_UP] >= 0 and _priority(tree[ix(lv), T_UP]) < priority:
        _rotate_up(tree, lv)


@njit(cache=True)
def _unlink_tree(tree: np.ndarray, lv: int) -> None:
    """Take the node `lv` out of its book's tree: down below its higher-priority child until
    it has at most one child, which then takes its place."""
    while True:
        left = tree[ix(lv), T_LEFT]
        right = tree[ix(lv), T_RIGHT]
        if left < 0 or right < 0:
            break
        _rotate_up(tree, left if _priority(left) > _priority(right) else right)
    child = left if left >= 0 else right
    up = tree[ix(lv), T_UP]
    if child >= 0:
        tree[ix(child), T_UP] = up
    _relink(tree, up, lv, child)


@njit(cache=True)
def _new_level(
    st: np.ndarray,
    levels: np.ndarray,
    lh: np.ndarray,
    tree: np.ndarray,
    ends: np.ndarray,
    slot: int,
    key: int,
) -> int:
    """A new empty level for `key` = book << 32 | price (`slot` is hash_find's miss)."""
    lv = st[S_LEVEL_FREE]
    if lv >= 0:
        st[S_LEVEL_FREE] = levels[ix(lv), L_WORSE]
    else:
        lv = st[S_LEVEL_HIGH]
        st[S_LEVEL_HIGH] = lv + 1
    lh[ix(-1 - slot), H_KEY] = key
    lh[ix(-1 - slot), H_ROW] = lv
    levels[ix(lv), L_PRICE] = key & 0xFFFFFFFF
    levels[ix(lv), L_SHARES] = 0
    levels[ix(lv), L_ORDERS] = 0
    levels[ix(lv), L_HEAD] = -1
    levels[ix(lv), L_TAIL] = -1
    levels[ix(lv), L_BOOK] = key >> 32
    _link_level(levels, tree, ends, lv)
    return int(lv)


@njit(cache=True)
def _drop_level(
    st: np.ndarray,
    levels: np.ndarray,
    lh: np.ndarray,
    tree: np.ndarray,
    ends: np.ndarray,
    lv: int,
) -> None:
    """Unlink the (empty) level `lv` from its book and free it."""
    book = levels[ix(lv), L_BOOK]
    above = levels[ix(lv), L_BETTER]
    below = levels[ix(lv), L_WORSE]
    if above >= 0:
        levels[ix(above), L_WORSE] = below
    else:
        ends[ix(book), BEST] = below
    if below >= 0:
        levels[ix(below), L_BETTER] = above
    else:
        ends[ix(book), WORST] = above
    _unlink_tree(tree, lv)
    hash_remove(lh, hash_find(lh, (book << 32) | levels[ix(lv), L_PRICE]))
    levels[ix(lv), L_WORSE] = st[S_LEVEL_FREE]
    st[S_LEVEL_FREE] = lv


@njit(cache=True)
def _top(levels: np.ndarray, ends: np.ndarray, book: int) -> tuple[int, int, int, int]:
    """The best price and the shares there of each side of `book`'s stock (price -1: empty)."""
    bid = ends[ix(book & ~1), BEST]
    ask = ends[ix(book | 1), BEST]
    return (
        levels[ix(bid), L_PRICE] if bid >= 0 else -1,
        levels[ix(bid), L_SHARES] if bid >= 0 else 0,
        levels[ix(ask), L_PRICE] if ask >= 0 else -1,
        levels[ix(ask), L_SHARES] if ask >= 0 else 0,
    )


@njit(cache=True)
def _rejected_add(st: np.ndarray, locate: int, side_byte: int, shares: int, price: int) -> bool:
    """Whether an A/F cannot rest, counting why (book.py's checks, in its order)."""
    if locate == 0:
        st[A_MARKET_LOCATE] += 1
    elif side_byte != _B and side_byte != _S:
        st[A_BAD_SIDE] += 1
    elif shares == 0:
        st[A_ZERO_SHARES] += 1
    elif price == 0:
        st[A_ZERO_PRICE] += 1
    else:
        return False
    return True


def run(buf: np.ndarray, t: Tables, skip: bool, record: bool) -> int:
    """Apply the length-prefixed messages of `buf` from `t.state[S_POS]` on, writing the top
    of the changed book after each change to `t.changes` if `record` (else the books only).

    DONE at the end of the buffer; GROW_* when a table is full, BAD_FRAME at a malformed frame
    (unknown type, a length that does not match the type, zero length) unless `skip`, which
    steps over it by its length prefix as `parser.read_messages(on_error="skip")` does. Either
    way S_POS is then the offset of the frame not applied. A frame cut off by the end of the
    buffer ends the pass (DONE, S_POS short of the end) in both policies.
    """
    status: int = _run(buf, skip, record, len(buf), *t, *FEATURES_OFF)
    return status


def run_features(buf: np.ndarray, stop: int, arrays: tuple[np.ndarray, ...]) -> int:
    """Apply the messages of `buf` from `state[S_POS]` up to (not including) the first frame
    at or after offset `stop`, computing each book event's features (`fastfeatures`) without
    change rows (`changes` is not written). `arrays` is `(*tables, *features)`: a `Tables` and
    a `FeatureTables`, unpacked once by the caller (each array argument costs ~0.35 µs a call
    on the VM). The vectors of the events that fire go to `features.rows` from row
    `control[K_ROWS]` on (the rows written so far: set it to 0 to start over; a call that
    returned to grow a table or name a stock goes on where it stopped).

    DONE at `stop`; ROWS_FULL once `control[K_ROOM]` rows are written (≤ len(rows)), NAMED
    right after a stock directory (R) message of a stock (its symbol is in `symbols`), GROW_*
    when a table is full (before the message, as `run`). S_POS is the offset of the next frame;
    `control[K_MESSAGES]` counts the messages applied. The buffer must be well framed
    (`parser.frame_index` found no bad frame): a bad one returns BAD_FRAME.
    """
    status: int = _run(buf, False, False, stop, *arrays)
    return status


@njit(cache=True)
def _run(
    buf: np.ndarray,
    skip: bool,
    record: bool,
    stop: int,
    st: np.ndarray,
    orders: np.ndarray,
    oh: np.ndarray,
    levels: np.ndarray,
    lh: np.ndarray,
    tree: np.ndarray,
    ends: np.ndarray,
    stocks: np.ndarray,
    symbols: np.ndarray,
    changes: np.ndarray,
    f_control: np.ndarray,
    f_slot_of: np.ndarray,
    f_slots: np.ndarray,
    f_mids: np.ndarray,
    f_ring: np.ndarray,
    f_nodes: np.ndarray,
    f_rows: np.ndarray,
    f_meta: np.ndarray,
) -> int:
    # NOTE: the order operations are written inline, not as helpers: a call between compiled
    # functions passes every field of every array argument and cost more than the operation
    # (the pass ran 3x slower split into handlers). Only the rarer level creation and removal
    # are calls. Each book message takes three steps: decide (reject, shrink in place, or
    # which order leaves and which reference rests), remove (a loop, since a U or a duplicate
    # add may evict a second order), insert.
    # With `f_rows` (run_features), each book event's features are computed after it (a call:
    # one per event, not per message) and no change row is written.
    features = len(f_rows) > 0
    pos = st[S_POS]
    end = len(buf)
    # NOTE: `<=`: a zero-length frame may be the last two bytes (no type byte to read), and
    # is a bad frame there as anywhere (the streaming reader reports it too)
    while pos + 2 <= end and pos < stop:
        size = (np.int64(buf[pos]) << 8) | np.int64(buf[pos + 1])
        m = pos + 2
        if m + size > end:
            break
        if size == 0 or _LENGTHS[buf[m]] != size:
            if not skip:
                st[S_POS] = pos
                return BAD_FRAME
            if st[S_BAD_FRAMES] == 0:
                st[S_FIRST_BAD] = pos
            st[S_BAD_FRAMES] += 1
            pos = m + size if size else m
            continue
        kind = buf[m]
        if _ROLE[kind] == _CHANGES_BOOK:  # room for an order, a level and a change row?
            room = DONE
            if st[S_ORDER_FREE] < 0 and st[S_ORDER_HIGH] >= len(orders):
                room = GROW_ORDERS
            elif st[S_LEVEL_FREE] < 0 and st[S_LEVEL_HIGH] >= len(levels):
                room = GROW_LEVELS
            elif record and st[S_CHANGES] >= len(changes):
                room = GROW_CHANGES
            if room != DONE:
                st[S_POS] = pos
                return room
        if features and (_ROLE[kind] == _CHANGES_BOOK or kind == _P):  # room for an event?
            room = has_room(f_control, f_slots, f_nodes)
            if room != 0:
                st[S_POS] = pos
                return GROW_SLOTS if room == 1 else GROW_NODES
        locate = _be(buf, m + 1, 2)
        stocks[ix(locate), ST_MESSAGES] += 1
        stocks[ix(locate), kind & 63] += 1
        pos = m + size
        index = 0
        if features:
            index = f_control[K_MESSAGES]
            f_control[K_MESSAGES] = index + 1
        if _ROLE[kind] != _CHANGES_BOOK:
            if kind == _R and locate != 0:
                for k in range(SYMBOL_BYTES):
                    symbols[ix(locate), k] = buf[m + 11 + k]
                if features:
                    st[S_POS] = pos
                    return NAMED
            elif features and kind == _P and locate != 0:  # a trade event, the book unchanged
                f_control[K_BOOK_EVENTS] += 1
                fired = event_features(
                    levels, ends, f_control, f_slot_of, f_slots, f_mids, f_ring, f_nodes,
                    f_rows, f_meta, locate, _be(buf, m + 5, 6), 2, _be(buf, m + 20, 4),
                    _be(buf, m + 32, 4), False, index,
                )  # fmt: skip
                if fired and f_control[K_ROWS] >= f_control[K_ROOM]:
                    st[S_POS] = pos
                    return ROWS_FULL
            continue

        # -- decide ---------------------------------------------------------------------------
        ref = _be(buf, m + 11, 8)
        victim = -1  # hash slot of the order that leaves the book
        rest_ref = ref  # the reference that rests afterwards, if `rests`
        rests = False
        book = 0
        price = 0
        shares = 0
        trade = 0  # (features: the signed side of an E/C, its shares and price)
        trade_shares = 0
        trade_price = 0
        top_before = (0, 0, 0, 0)  # (features: the event's book before the message)
        if kind in (_A, _F):
            side_byte = buf[m + 19]
            shares = _be(buf, m + 20, 4)
            price = _be(buf, m + 32, 4)
            if _rejected_add(st, locate, side_byte, shares, price):
                continue
            book = 2 * locate + (side_byte == _S)
            rests = True
            if features:
                top_before = _top(levels, ends, book)
        else:
            victim = hash_find(oh, ref)
            if victim < 0:
                st[A_UNKNOWN_REF] += 1
                continue
            o = oh[ix(victim), H_ROW]
            book = orders[ix(o), O_BOOK]
            if book >> 1 != locate:
                st[A_LOCATE_MISMATCH] += 1
            if features:
                top_before = _top(levels, ends, book)
            if kind == _U:
                rest_ref = _be(buf, m + 19, 8)
                shares = _be(buf, m + 27, 4)
                price = _be(buf, m + 31, 4)
                rests = True
            elif kind != _D:  # E, C, X: shares leave, the order keeps its place in the queue
                taken = _be(buf, m + 19, 4)
                left = orders[ix(o), O_SHARES]
                if taken == 0:
                    st[A_ZERO_SHARES] += 1
                    continue
                if kind != _X:  # (the print: the message's shares, clamped or not)
                    trade = 1 - 2 * (book & 1)
                    trade_shares = taken
                    trade_price = orders[ix(o), O_PRICE] if kind == _E else _be(buf, m + 32, 4)
                if taken > left:
                    st[A_OVERSIZE] += 1
                if taken < left:
                    orders[ix(o), O_SHARES] = left - taken
                    levels[ix(orders[ix(o), O_LEVEL]), L_SHARES] -= taken
                    victim = -1

        # -- remove ---------------------------------------------------------------------------
        slot = -1
        while True:
            if victim >= 0:
                o = oh[ix(victim), H_ROW]
                lv = orders[ix(o), O_LEVEL]
                prev = orders[ix(o), O_PREV]
                nxt = orders[ix(o), O_NEXT]
                if prev >= 0:
                    orders[ix(prev), O_NEXT] = nxt
                else:
                    levels[ix(lv), L_HEAD] = nxt
                if nxt >= 0:
                    orders[ix(nxt), O_PREV] = prev
                else:
                    levels[ix(lv), L_TAIL] = prev
                levels[ix(lv), L_SHARES] -= orders[ix(o), O_SHARES]
                levels[ix(lv), L_ORDERS] -= 1
                if levels[ix(lv), L_ORDERS] == 0:
                    _drop_level(st, levels, lh, tree, ends, lv)
                hash_remove(oh, victim)
                orders[ix(o), O_NEXT] = st[S_ORDER_FREE]
                st[S_ORDER_FREE] = o
                victim = -1
            if not rests:
                break
            slot = hash_find(oh, rest_ref)
            if slot < 0:
                break
            st[A_DUPLICATE_REF] += 1  # a live reference reused: the stale order goes first
            victim = slot

        # -- insert ---------------------------------------------------------------------------
        if rests and shares == 0:  # a U with nothing left to rest (A/F were checked above)
            st[A_ZERO_SHARES] += 1
        elif rests and price == 0:
            st[A_ZERO_PRICE] += 1
        elif rests:
            head = ends[ix(book), BEST]
            joined = head < 0 or not _better(book & 1, levels[ix(head), L_PRICE], price)
            key = (book << 32) | price
            lslot = hash_find(lh, key)
            lv = (
                lh[ix(lslot), H_ROW]
                if lslot >= 0
                else _new_level(st, levels, lh, tree, ends, lslot, key)
            )
            o = st[S_ORDER_FREE]
            if o >= 0:
                st[S_ORDER_FREE] = orders[ix(o), O_NEXT]
            else:
                o = st[S_ORDER_HIGH]
                st[S_ORDER_HIGH] = o + 1
            oh[ix(-1 - slot), H_KEY] = rest_ref
            oh[ix(-1 - slot), H_ROW] = o
            tail = levels[ix(lv), L_TAIL]
            orders[ix(o), O_REF] = rest_ref
            orders[ix(o), O_PRICE] = price
            orders[ix(o), O_SHARES] = shares
            orders[ix(o), O_BOOK] = book
            orders[ix(o), O_LEVEL] = lv
            orders[ix(o), O_PREV] = tail
            orders[ix(o), O_NEXT] = -1
            if tail >= 0:
                orders[ix(tail), O_NEXT] = o
            else:
                levels[ix(lv), L_HEAD] = o
            levels[ix(lv), L_TAIL] = o
            levels[ix(lv), L_SHARES] += shares
            levels[ix(lv), L_ORDERS] += 1
            bid = ends[ix(book & ~1), BEST]
            ask = ends[ix(book | 1), BEST]
            if joined and bid >= 0 and ask >= 0:
                st[A_CROSSED] += levels[ix(bid), L_PRICE] >= levels[ix(ask), L_PRICE]

        if features:  # the event's features, and no change row
            f_control[K_BOOK_EVENTS] += 1
            fired = event_features(
                levels, ends, f_control, f_slot_of, f_slots, f_mids, f_ring, f_nodes, f_rows,
                f_meta, book >> 1, _be(buf, m + 5, 6), trade, trade_shares, trade_price,
                _top(levels, ends, book) != top_before, index,
            )  # fmt: skip
            if fired and f_control[K_ROWS] >= f_control[K_ROOM]:
                st[S_POS] = pos
                return ROWS_FULL
            continue

        # -- record the top of the changed book -------------------------------------------------
        if not record:
            continue
        bid = ends[ix(book & ~1), BEST]
        ask = ends[ix(book | 1), BEST]
        n = st[S_CHANGES]
        changes[ix(n), C_STAMP] = _be(buf, m + 5, 6) | ((book >> 1) << TS_BITS)
        bid_px = levels[ix(bid), L_PRICE] if bid >= 0 else 0
        changes[ix(n), C_PRICES] = (bid_px << 32) | (levels[ix(ask), L_PRICE] if ask >= 0 else 0)
        changes[ix(n), C_BID_SZ] = levels[ix(bid), L_SHARES] if bid >= 0 else 0
        changes[ix(n), C_ASK_SZ] = levels[ix(ask), L_SHARES] if ask >= 0 else 0
        st[S_CHANGES] = n + 1
    st[S_POS] = pos
    return DONE
