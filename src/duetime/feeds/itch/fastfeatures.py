"""`features.FeatureState` compiled (numba): the feature vector of each book event, computed in
the compiled book pass (`fastbook_kernel._run` in its features mode) right after the event's
message is applied, from the pass's own level tables.

The formulas are features.py's, written out on plain ints and floats in the same order of
operations, so the vector is the one `Features.update` gives (tests/feeds/test_fastfeed.py
compares them, event by event, on generated sessions). Per stock the state is a row of `slots`
(the top of book and mid after its last event, its last event time, the event window's sums)
and of `ring` (the event window's values); the time window's events are nodes of one shared pool
(`nodes`), linked per stock in time order, freed as they leave the window.

NOTE: numba freezes the column constants into the compiled code (see fastbook_tables' note:
after changing one, touch fastbook_kernel.py and this file).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from duetime.feeds.itch.fastbook_tables import BEST, L_PRICE, L_SHARES, L_WORSE
from duetime.feeds.itch.features import DAY_NS, DEPTH_LEVELS, N_FEATURES, SHALLOW_LEVELS

# `slots` columns, one row per stock with an event: the top of book after its last event (price
# -1: the side was empty), its last event's time (-1: none yet), the event window's position and
# sums, the time window's first and last node, count and sums, the events the trigger counted,
# whether `mids` holds a mid (both sides were there).
(
    F_BID,
    F_BID_SZ,
    F_ASK,
    F_ASK_SZ,
    F_LAST_TS,
    F_RING_I,
    F_EW_OFI,
    F_EW_FLOW,
    F_TW_HEAD,
    F_TW_TAIL,
    F_TW_COUNT,
    F_TW_OFI,
    F_TW_FLOW,
    F_SEEN,
    F_HAS_MID,
) = range(15)
SLOT_FIELDS = 15
# `nodes` columns: one time-window event (NEXT also chains the free list).
N_TS, N_OFI, N_FLOW, N_NEXT = range(4)
NODE_FIELDS = 4
# `control` scalars: slots in use, the node free list and high-water mark, the time window's
# span (ns), the trigger (every N-th event of a stock, or each top-of-book change), event rows
# written by the current step, messages applied so far (the index of the next one), book
# events so far, and the rows the current step may write (at most len(rows)).
K_SLOTS, K_NODE_FREE, K_NODE_HIGH, K_SPAN, K_EVERY, K_TOP_CHANGE, K_ROWS, K_MESSAGES = range(8)
K_BOOK_EVENTS, K_ROOM = 8, 9
CONTROL_FIELDS = 10
# `meta` columns of an event row: its stock locate, the index of its message in the stream.
M_LOCATE, M_MESSAGE = 0, 1
META_FIELDS = 2

_NO_ASK = 1 << 62
"""features._NO_ASK: the +inf price of an empty ask side in the OFI comparisons."""


class FeatureTables(NamedTuple):
    """What the features mode of the compiled pass reads and writes (see the module)."""

    control: np.ndarray
    slot_of: np.ndarray
    """Per locate: its row of `slots` (-1: no event yet)."""
    slots: np.ndarray
    mids: np.ndarray
    ring: np.ndarray
    nodes: np.ndarray
    rows: np.ndarray
    """The vectors of the events that fired (float32, one row each), written from row 0 by each
    step; a call stops once `control[K_ROOM]` are written."""
    meta: np.ndarray


def new_feature_tables(
    *,
    window_events: int = 100,
    window_ns: int = 1_000_000_000,
    every: int = 1,
    top_change: bool = False,
    rows: int = 64,
    slots: int = 1 << 8,
    nodes: int = 1 << 12,
) -> FeatureTables:
    """Empty tables for `features.Features(window_events=..., window_ns=...)`, firing on every
    `every`-th event of a stock (or, with `top_change`, each top-of-book change), with room for
    `rows` event rows a call and `slots` stocks and `nodes` time-window events before a grow."""
    if window_events < 1 or window_ns < 1:
        raise ValueError(f"windows need ≥ 1 event and ≥ 1 ns; got {window_events}, {window_ns}")
    control = np.zeros(CONTROL_FIELDS, np.int64)
    control[K_NODE_FREE] = -1
    control[K_SPAN] = window_ns
    control[K_EVERY] = every
    control[K_TOP_CHANGE] = top_change
    return FeatureTables(
        control=control,
        slot_of=np.full(65536, -1, np.int64),
        slots=np.empty((slots, SLOT_FIELDS), np.int64),
        mids=np.empty(slots, np.float64),
        ring=np.empty((slots, window_events, 2), np.int64),
        nodes=np.empty((nodes, NODE_FIELDS), np.int64),
        rows=np.empty((max(rows, 1), N_FEATURES), np.float32),
        meta=np.empty((max(rows, 1), META_FIELDS), np.int64),
    )


FEATURES_OFF = FeatureTables(
    control=np.zeros(CONTROL_FIELDS, np.int64),
    slot_of=np.zeros(0, np.int64),
    slots=np.zeros((0, SLOT_FIELDS), np.int64),
    mids=np.zeros(0, np.float64),
    ring=np.zeros((0, 1, 2), np.int64),
    nodes=np.zeros((0, NODE_FIELDS), np.int64),
    rows=np.zeros((0, N_FEATURES), np.float32),
    meta=np.zeros((0, META_FIELDS), np.int64),
)
"""The book pass without features (`rows` empty: `fastbook`'s whole-file pass)."""


def grow_slots(f: FeatureTables) -> FeatureTables:
    n = 2 * len(f.slots)
    slots = np.empty((n, SLOT_FIELDS), np.int64)
    slots[: len(f.slots)] = f.slots
    mids = np.empty(n, np.float64)
    mids[: len(f.mids)] = f.mids
    ring = np.empty((n, *f.ring.shape[1:]), np.int64)
    ring[: len(f.ring)] = f.ring
    return f._replace(slots=slots, mids=mids, ring=ring)


def grow_nodes(f: FeatureTables) -> FeatureTables:
    nodes = np.empty((2 * len(f.nodes), NODE_FIELDS), np.int64)
    nodes[: len(f.nodes)] = f.nodes
    return f._replace(nodes=nodes)


@njit(cache=True)
def has_room(control: np.ndarray, slots: np.ndarray, nodes: np.ndarray) -> int:
    """0 when one more event fits; 1 when `slots` must grow first, 2 when `nodes` must."""
    if control[K_SLOTS] >= len(slots):
        return 1
    if control[K_NODE_FREE] < 0 and control[K_NODE_HIGH] >= len(nodes):
        return 2
    return 0


@njit(cache=True)
def _slog(x: int) -> float:
    """features.slog: sign(x)·log1p(|x|)."""
    return math.log1p(x) if x >= 0 else -math.log1p(-x)


@njit(cache=True)
def _slot(control: np.ndarray, slot_of: np.ndarray, slots: np.ndarray, ring: np.ndarray,
          locate: int) -> int:  # fmt: skip
    """The stock's row, set up empty on its first event (as `Features.state`)."""
    slot = slot_of[locate]
    if slot >= 0:
        return int(slot)
    slot = control[K_SLOTS]
    control[K_SLOTS] = slot + 1
    slot_of[locate] = slot
    slots[slot, :] = 0
    slots[slot, F_BID] = -1
    slots[slot, F_ASK] = -1
    slots[slot, F_LAST_TS] = -1
    slots[slot, F_TW_HEAD] = -1
    slots[slot, F_TW_TAIL] = -1
    ring[slot, :, :] = 0
    return int(slot)


@njit(cache=True, inline="always")
def _side(levels: np.ndarray, ends: np.ndarray, book: int) -> tuple[int, int, int, int]:
    """One side of a stock's book as the features read it: the best price (-1: empty) and its
    shares, the shares on the best `SHALLOW_LEVELS` and on the best `DEPTH_LEVELS` levels."""
    best = -1
    best_size = shallow = deep = 0
    lv = ends[book, BEST]
    for k in range(DEPTH_LEVELS):
        if lv < 0:
            break
        shares = levels[lv, L_SHARES]
        if k == 0:
            best, best_size = levels[lv, L_PRICE], shares
        if k < SHALLOW_LEVELS:
            shallow += shares
        deep += shares
        lv = levels[lv, L_WORSE]
    return best, best_size, shallow, deep


@njit(cache=True)
def event_features(
    levels: np.ndarray,
    ends: np.ndarray,
    f_control: np.ndarray,
    f_slot_of: np.ndarray,
    f_slots: np.ndarray,
    f_mids: np.ndarray,
    f_ring: np.ndarray,
    f_nodes: np.ndarray,
    f_rows: np.ndarray,
    f_meta: np.ndarray,
    locate: int,
    ts: int,
    trade: int,
    trade_shares: int,
    trade_price: int,
    top_changed: bool,
    index: int,
) -> bool:
    """`FeatureState.update` for one event of stock `locate` at `ts`, its book as the level
    tables hold it now; `trade` is the signed side of an E/C execution (+1 against a resting bid,
    -1 an ask), 2 for a P trade (signed by its price against the mid), 0 for no trade. Writes the
    vector and its meta to the next row if the event fires (True), else only updates the state.
    The caller has checked `has_room`."""
    control = f_control
    slots = f_slots
    slot = _slot(control, f_slot_of, slots, f_ring, locate)

    # -- the book: best 10 levels of each side (depth), top of book ---------------------------
    bid, bid_size, bid_5, bid_10 = _side(levels, ends, 2 * locate)
    ask, ask_size, ask_5, ask_10 = _side(levels, ends, 2 * locate + 1)

    # -- order-flow imbalance against the top at the stock's last event ------------------------
    bid0, bid_size0, ask0, ask_size0 = (
        slots[slot, F_BID], slots[slot, F_BID_SZ], slots[slot, F_ASK], slots[slot, F_ASK_SZ]
    )  # fmt: skip
    b0 = 0 if bid0 < 0 else bid0
    b1 = 0 if bid < 0 else bid
    a0 = _NO_ASK if ask0 < 0 else ask0
    a1 = _NO_ASK if ask < 0 else ask
    e = 0
    if b1 >= b0:
        e += bid_size
    if b1 <= b0:
        e -= bid_size0
    if a1 <= a0:
        e -= ask_size
    if a1 >= a0:
        e += ask_size0

    # -- signed trade flow (features.signed_trade) ---------------------------------------------
    flow = 0
    if trade == 2:
        if bid >= 0 and ask >= 0:
            doubled = 2 * trade_price - bid - ask
            if doubled > 0:
                flow = trade_shares
            elif doubled < 0:
                flow = -trade_shares
    elif trade != 0:
        flow = -trade * trade_shares

    # -- the event window (EventWindow.push) and the time window (TimeWindow.push) -------------
    ring = f_ring
    i = slots[slot, F_RING_I]
    slots[slot, F_EW_OFI] += e - ring[slot, i, 0]
    slots[slot, F_EW_FLOW] += flow - ring[slot, i, 1]
    ring[slot, i, 0] = e
    ring[slot, i, 1] = flow
    slots[slot, F_RING_I] = i + 1 if i + 1 < ring.shape[1] else 0
    nodes = f_nodes
    node = control[K_NODE_FREE]
    if node >= 0:
        control[K_NODE_FREE] = nodes[node, N_NEXT]
    else:
        node = control[K_NODE_HIGH]
        control[K_NODE_HIGH] = node + 1
    nodes[node, N_TS] = ts
    nodes[node, N_OFI] = e
    nodes[node, N_FLOW] = flow
    nodes[node, N_NEXT] = -1
    tail = slots[slot, F_TW_TAIL]
    if tail >= 0:
        nodes[tail, N_NEXT] = node
    else:
        slots[slot, F_TW_HEAD] = node
    slots[slot, F_TW_TAIL] = node
    slots[slot, F_TW_COUNT] += 1
    slots[slot, F_TW_OFI] += e
    slots[slot, F_TW_FLOW] += flow
    horizon = ts - control[K_SPAN]
    head = slots[slot, F_TW_HEAD]
    while nodes[head, N_TS] <= horizon:  # (never the newest: the span is ≥ 1 ns)
        slots[slot, F_TW_COUNT] -= 1
        slots[slot, F_TW_OFI] -= nodes[head, N_OFI]
        slots[slot, F_TW_FLOW] -= nodes[head, N_FLOW]
        following = nodes[head, N_NEXT]
        nodes[head, N_NEXT] = control[K_NODE_FREE]
        control[K_NODE_FREE] = head
        head = following
    slots[slot, F_TW_HEAD] = head

    # -- prices in basis points of the mid ------------------------------------------------------
    spread_bps = micro_bps = change_bps = 0.0
    had_mid = slots[slot, F_HAS_MID]
    if bid >= 0 and ask >= 0 and bid + ask > 0:
        mid = (bid + ask) / 2
        to_bps = 1e4 / mid
        spread_bps = (ask - bid) * to_bps
        total = bid_size + ask_size
        if total == 0:
            micro = (bid + ask) / 2
        else:  # (in floats: exact as features.micro_price's ints below 2**53, never overflows)
            micro = (float(bid) * ask_size + float(ask) * bid_size) / total
        micro_bps = (micro - mid) * to_bps
        if had_mid:
            prev_mid = f_mids[slot]
            change_bps = (mid - prev_mid) * 1e4 / prev_mid
        f_mids[slot] = mid
        slots[slot, F_HAS_MID] = 1
    else:
        slots[slot, F_HAS_MID] = 0
    last_ts = slots[slot, F_LAST_TS]
    dt_us = 0.0 if last_ts < 0 else (ts - last_ts) / 1000
    slots[slot, F_BID] = bid
    slots[slot, F_BID_SZ] = bid_size
    slots[slot, F_ASK] = ask
    slots[slot, F_ASK_SZ] = ask_size
    slots[slot, F_LAST_TS] = ts

    # -- does it fire (run.Trigger)? -------------------------------------------------------------
    if control[K_TOP_CHANGE]:
        if not top_changed:
            return False
    else:
        seen = slots[slot, F_SEEN] + 1
        slots[slot, F_SEEN] = seen
        if seen % control[K_EVERY] != 0:
            return False

    n = control[K_ROWS]
    row = f_rows[n]
    total = bid_size + ask_size
    row[0] = 1.0 if bid >= 0 else 0.0
    row[1] = 1.0 if ask >= 0 else 0.0
    row[2] = spread_bps
    row[3] = micro_bps
    row[4] = (bid_size - ask_size) / total if total else 0.0
    row[5] = math.log1p(float(bid_size))
    row[6] = math.log1p(float(ask_size))
    row[7] = (bid_5 - ask_5) / (bid_5 + ask_5) if bid_5 + ask_5 else 0.0
    row[8] = (bid_10 - ask_10) / (bid_10 + ask_10) if bid_10 + ask_10 else 0.0
    row[9] = math.log1p(float(bid_10))
    row[10] = math.log1p(float(ask_10))
    row[11] = _slog(e)
    row[12] = _slog(slots[slot, F_EW_OFI])
    row[13] = _slog(slots[slot, F_TW_OFI])
    row[14] = _slog(slots[slot, F_EW_FLOW])
    row[15] = _slog(slots[slot, F_TW_FLOW])
    row[16] = float((flow > 0) - (flow < 0))
    row[17] = change_bps
    row[18] = math.log1p(max(dt_us, 0.0))
    row[19] = math.log1p(float(slots[slot, F_TW_COUNT]))
    row[20] = ts / DAY_NS
    f_meta[n, M_LOCATE] = locate
    f_meta[n, M_MESSAGE] = index
    control[K_ROWS] = n + 1
    return True
