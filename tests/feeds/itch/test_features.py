"""Features per book event: each formula on hand-computed cases, the rolling windows, the DeepLOB
ring, and FeatureState on a scripted session through the real order book.

Prices are raw Price(4) (100 = one cent); the arithmetic behind each expected value is written
next to it.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from duetime.feeds.itch import spec
from duetime.feeds.itch.book import BookEvent, Books, Level
from duetime.feeds.itch.deeplob import DeepLobWindow, lob_row, reference_price
from duetime.feeds.itch.features import (
    DAY_NS,
    EMPTY_TOP,
    FEATURE_NAMES,
    N_FEATURES,
    EventWindow,
    Features,
    FeatureState,
    TimeWindow,
    depth_imbalance,
    micro_price,
    mid_price,
    order_flow_imbalance,
    queue_imbalance,
    signed_trade,
    slog,
    spread,
    top_of,
)

L1 = math.log1p
T0 = 34_200_000_000_000  # 09:30:00 in ns since midnight


class FakeBook:
    """Just `depth()`, from fixed level lists."""

    def __init__(self, bids: list[Level], asks: list[Level]) -> None:
        self.bids, self.asks = bids, asks

    def depth(self, side: int, k: int) -> list[Level]:
        return (self.bids if side == 1 else self.asks)[:k]


def event(kind: str = "A", ts: int = T0, side: int = 1, trade: int = 0, price: int = 0) -> Any:
    return BookEvent(ts, 1, kind, side, price, 0, trade, price, 0, True)


def approx(x: float) -> Any:
    return pytest.approx(x, rel=1e-6, abs=1e-6)


# -- top of book ----------------------------------------------------------------------------


def test_mid_spread_and_micro_price() -> None:
    assert mid_price(100_000, 100_100) == 100_050.0
    assert spread(100_000, 100_100) == 100  # one cent
    # (bid·q_ask + ask·q_bid) / (q_bid + q_ask) = (100·100 + 102·300) / 400 = 40600 / 400
    assert micro_price(100, 300, 102, 100) == 101.5  # the heavy bid pulls it above the mid 101
    assert micro_price(100, 100, 102, 300) == 100.5  # (100·300 + 102·100) / 400 = 40200 / 400
    assert micro_price(100, 0, 102, 0) == 101.0  # no sizes: the mid


def test_queue_imbalance() -> None:
    assert queue_imbalance(300, 100) == 0.5  # (300 - 100) / 400
    assert queue_imbalance(0, 5) == -1.0  # (0 - 5) / 5
    assert queue_imbalance(0, 0) == 0.0


def test_depth_imbalance_over_k_levels() -> None:
    bids = [(100, 300, 1), (99, 200, 2), (98, 100, 1)]
    asks = [(101, 100, 1), (102, 400, 3)]
    assert depth_imbalance(bids, asks, 1) == 0.5  # (300 - 100) / 400
    assert depth_imbalance(bids, asks, 2) == 0.0  # (300+200 - (100+400)) / 1000
    assert depth_imbalance(bids, asks, 3) == 100 / 1100  # (600 - 500) / 1100
    assert depth_imbalance([], asks, 2) == -1.0  # (0 - 500) / 500
    assert depth_imbalance([], [], 5) == 0.0


def test_top_of_matches_order_book_top() -> None:
    assert top_of([(100, 3, 1)], [(101, 5, 2)]) == (100, 3, 101, 5)
    assert top_of([], [(101, 5, 2)]) == (None, 0, 101, 5)
    assert top_of([(100, 3, 1)], []) == (100, 3, None, 0)
    assert top_of([], []) == EMPTY_TOP


# -- order-flow imbalance -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        # Bid price unchanged, size 100 -> 150: +q_n - q_{n-1} = 150 - 100; ask unchanged: 0.
        ((100, 100, 102, 200), (100, 150, 102, 200), 50),
        # Bid up (100 -> 101, new size 20): only 1{P_n ≥ P_{n-1}}·q_n = +20.
        ((100, 100, 102, 200), (101, 20, 102, 200), 20),
        # Bid down (100 -> 99): only -1{P_n ≤ P_{n-1}}·q_{n-1} = -100.
        ((100, 100, 102, 200), (99, 300, 102, 200), -100),
        # Ask unchanged, size 200 -> 150: -q_n + q_{n-1} = -150 + 200 (a cancel: buy pressure).
        ((100, 100, 102, 200), (100, 100, 102, 150), 50),
        # Ask down (102 -> 101, new size 30): only -1{P_n ≤ P_{n-1}}·q_n = -30.
        ((100, 100, 102, 200), (100, 100, 101, 30), -30),
        # Ask up (102 -> 103): only +1{P_n ≥ P_{n-1}}·q_{n-1} = +200.
        ((100, 100, 102, 200), (100, 100, 103, 500), 200),
        # Both move up a tick: bid +20, ask +200.
        ((100, 100, 102, 200), (101, 20, 103, 500), 220),
        # Nothing changed: 0.
        ((100, 100, 102, 200), (100, 100, 102, 200), 0),
    ],
)
def test_ofi_cases_of_the_paper(before: Any, after: Any, expected: int) -> None:
    assert order_flow_imbalance(before, after) == expected


def test_ofi_with_empty_sides() -> None:
    # A bid appears in an empty book: from -inf up to 100, +q_n = +300.
    assert order_flow_imbalance(EMPTY_TOP, (100, 300, None, 0)) == 300
    # An ask appears: from +inf down to 101, -q_n = -200.
    assert order_flow_imbalance(EMPTY_TOP, (None, 0, 101, 200)) == -200
    # The bid vanishes (to -inf): -q_{n-1} = -300; the ask is unchanged: -200 + 200.
    assert order_flow_imbalance((100, 300, 101, 200), (None, 0, 101, 200)) == -300
    # The ask vanishes (to +inf): +q_{n-1} = +200.
    assert order_flow_imbalance((100, 300, 101, 200), (100, 300, None, 0)) == 200
    assert order_flow_imbalance(EMPTY_TOP, EMPTY_TOP) == 0


# -- trade sign -----------------------------------------------------------------------------


def test_executions_are_signed_by_the_resting_side() -> None:
    top = (100, 10, 102, 10)
    assert signed_trade("E", 1, 100, 100, top) == -100  # hit the bid: seller-initiated
    assert signed_trade("E", -1, 100, 102, top) == 100  # lifted the offer: buyer-initiated
    assert signed_trade("C", 1, 50, 99, top) == -50
    assert signed_trade("C", -1, 50, 103, top) == 50


def test_hidden_trades_are_signed_against_the_mid() -> None:
    top = (100, 10, 102, 10)  # mid 101
    assert signed_trade("P", 1, 70, 102, top) == 70  # above the mid: a buy
    assert signed_trade("P", 1, 70, 100, top) == -70  # below: a sell (the flag is ignored)
    assert signed_trade("P", -1, 70, 101, top) == 0  # at the mid: undecided
    assert signed_trade("P", 1, 70, 101, (100, 10, 101, 10)) == 70  # 101 > mid 100.5
    assert signed_trade("P", 1, 70, 102, (100, 10, None, 0)) == 0  # no mid
    for kind in "AFXDU":
        assert signed_trade(kind, 1, 0, 100, top) == 0


def test_slog() -> None:
    assert slog(0) == 0.0
    assert slog(math.e - 1) == approx(1.0)
    assert slog(-(math.e - 1)) == approx(-1.0)


# -- rolling windows ------------------------------------------------------------------------


def test_event_window_keeps_the_last_n() -> None:
    w = EventWindow(3)
    for ofi, flow in [(1, -1), (2, 0), (4, 5)]:
        w.push(ofi, flow)
    assert (w.ofi, w.flow) == (7, 4)  # 1+2+4, -1+0+5
    w.push(8, 0)  # (1, -1) leaves
    assert (w.ofi, w.flow) == (14, 5)  # 2+4+8, 0+5+0
    for _ in range(3):
        w.push(0, 0)
    assert (w.ofi, w.flow) == (0, 0)
    with pytest.raises(ValueError, match="n ≥ 1"):
        EventWindow(0)


def test_time_window_expires_by_age() -> None:
    w = TimeWindow(100)  # the window is (t - 100, t]
    w.push(0, 5, 1)
    w.push(50, 7, 0)
    assert (w.ofi, w.flow, w.count) == (12, 1, 2)
    w.push(100, 1, 0)  # horizon 0: the event at 0 is exactly 100 old and leaves
    assert (w.ofi, w.flow, w.count) == (8, 0, 2)  # 7 + 1
    w.push(149, 0, 2)  # horizon 49: the event at 50 stays
    assert (w.ofi, w.flow, w.count) == (8, 2, 3)
    w.push(150, 0, 0)  # horizon 50: it leaves
    assert (w.ofi, w.flow, w.count) == (1, 2, 3)
    for _ in range(3):  # a sweep: several events in the same nanosecond all count
        w.push(400, -1, -3)
    assert (w.ofi, w.flow, w.count) == (-3, -9, 3)
    with pytest.raises(ValueError, match="span_ns ≥ 1"):
        TimeWindow(0)


# -- DeepLOB --------------------------------------------------------------------------------


def test_lob_row_full_book_in_deeplob_column_order() -> None:
    asks = [(1000 + i, 10 + i, 1) for i in range(10)]
    bids = [(999 - i, 20 + i, 1) for i in range(10)]
    row = lob_row(bids, asks, 10, 1, 0)
    assert len(row) == 40
    # [ask_p1, ask_s1, bid_p1, bid_s1, ask_p2, ...], sizes as log1p(shares)
    assert row[:8] == [1000, L1(10), 999, L1(20), 1001, L1(11), 998, L1(21)]
    assert row[-4:] == [1009, L1(19), 990, L1(29)]


def test_lob_row_fills_missing_levels_one_tick_further_out() -> None:
    asks = [(101, 5, 1), (103, 7, 2)]
    bids = [(100, 3, 1)]
    # asks 101, 103, then 103+1; bids 100, then 99, 98; filled sizes are log1p(0) = 0
    level_1, level_2, level_3 = [101, L1(5), 100, L1(3)], [103, L1(7), 99, 0], [104, 0, 98, 0]
    assert lob_row(bids, asks, 3, 1, 0) == level_1 + level_2 + level_3
    # No bids: the ladder starts one tick under the best ask.
    assert lob_row([], [(101, 5, 1)], 2, 1, 0) == [101, L1(5), 100, 0, 102, 0, 99, 0]
    # No asks: one tick over the best bid.
    assert lob_row([(100, 3, 1)], [], 2, 1, 0) == [101, 0, 100, L1(3), 102, 0, 99, 0]
    # Empty book: either side of the anchor.
    assert lob_row([], [], 2, 10, 500) == [510, 0, 490, 0, 520, 0, 480, 0]


def test_reference_price() -> None:
    assert reference_price([(100, 1, 1)], [(103, 1, 1)], 7.0) == 101.5
    assert reference_price([(100, 1, 1)], [], 7.0) == 100.0
    assert reference_price([], [(103, 1, 1)], 7.0) == 103.0
    assert reference_price([], [], 7.0) == 7.0


def test_tensor_is_normalised_against_the_current_mid() -> None:
    w = DeepLobWindow(length=2, levels=2, tick=100)
    w.push([(100_000, 300, 1), (99_900, 100, 1)], [(100_100, 200, 1), (100_200, 50, 1)])
    w.push([(100_100, 40, 1)], [(100_200, 60, 1), (100_300, 70, 1)])
    t = w.tensor()
    assert t.shape == (2, 8)
    assert t.dtype == np.float32
    # Reference: the newest mid (100100 + 100200) / 2 = 100150; prices in ticks (/100) from it.
    assert w.reference == 100_150.0
    # Old row: ask 100100 -> (100100 - 100150) / 100 = -0.5, bid 100000 -> -1.5,
    # ask_2 100200 -> +0.5, bid_2 99900 -> -2.5.
    old = [-0.5, L1(200), -1.5, L1(300), 0.5, L1(50), -2.5, L1(100)]
    # New row: asks 100200, 100300 -> +0.5, +1.5; bid 100100 -> -0.5, then filled 100000 -> -1.5.
    new = [0.5, L1(60), -0.5, L1(40), 1.5, L1(70), -1.5, 0.0]
    assert t[0].tolist() == [approx(v) for v in old]
    assert t[1].tolist() == [approx(v) for v in new]


def test_tensor_pads_with_the_first_snapshot_and_fills_out() -> None:
    w = DeepLobWindow(length=3, levels=1, tick=1)
    assert not w.tensor().any()  # before the first push: zeros
    w.push([(10, 1, 1)], [(12, 1, 1)])
    assert not w.ready
    t = w.tensor()
    # Three copies of the one snapshot: ask 12 - mid 11 = +1, bid -1, sizes log1p(1).
    assert t.tolist() == [[1.0, approx(L1(1)), -1.0, approx(L1(1))]] * 3
    out = np.full((3, 4), np.nan, dtype=np.float32)
    assert w.tensor(out) is out
    assert np.array_equal(out, t)
    with pytest.raises(ValueError, match="out must be float32"):
        w.tensor(np.empty((3, 4), dtype=np.float64))
    with pytest.raises(ValueError, match="≥ 1"):
        DeepLobWindow(length=0)


def test_ring_wraps_and_stays_in_time_order() -> None:
    w = DeepLobWindow(length=3, levels=1, tick=1)
    history: list[int] = []
    for i in range(20):  # storage holds 6 rows: this wraps six times
        bid = 1000 + 7 * i
        w.push([(bid, i + 1, 1)], [(bid + 2, 1, 1)])
        history.append(i)
        # Expected rows: the last 3 events, the first one repeated while fewer than 3.
        expected = ([history[0]] * 3 + history)[-3:]
        mid = bid + 1
        t = w.tensor()
        assert t[:, 2].tolist() == [1000 + 7 * j - mid for j in expected]  # bid_p1 in ticks
        assert t[:, 3].tolist() == [approx(L1(j + 1)) for j in expected]  # bid_s1
    assert w.ready
    assert w.count == 20


# -- FeatureState ---------------------------------------------------------------------------


def add(ts: int, ref: int, side: str, shares: int, price: int) -> Any:
    return spec.AddOrder("A", 1, 0, ts, ref, side, shares, "ABCD", price)


def named(vector: np.ndarray) -> dict[str, float]:
    assert vector.shape == (N_FEATURES,)
    assert vector.dtype == np.float32
    return dict(zip(FEATURE_NAMES, vector.tolist(), strict=True))


def check(vector: np.ndarray, **expected: float) -> None:
    got = named(vector)
    for name, value in expected.items():
        assert got[name] == approx(value), name


def test_feature_names_are_fixed() -> None:
    assert len(FEATURE_NAMES) == N_FEATURES == 21
    assert len(set(FEATURE_NAMES)) == N_FEATURES


def test_scripted_session_through_the_real_book() -> None:
    """Seven messages; windows of 3 events and 1 ms; a DeepLOB window of 4 events."""
    books = Books()
    state = FeatureState(window_events=3, window_ns=1_000_000, deeplob_length=4)

    def step(msg: Any) -> np.ndarray:
        ev = books.apply(msg)
        assert ev is not None
        return state.update(ev, books.book(1)).copy()

    # 1. A bid of 300 at $10.00 in an empty book.
    v = step(add(T0, 1, "B", 300, 100_000))
    check(
        v,
        has_bid=1,
        has_ask=0,
        spread_bps=0,  # no ask: no mid
        micro_offset_bps=0,
        queue_imbalance=1,  # (300 - 0) / 300
        log_bid_size=L1(300),
        log_ask_size=0,
        depth_imbalance_5=1,
        depth_imbalance_10=1,
        log_bid_depth_10=L1(300),
        log_ask_depth_10=0,
        ofi_event=L1(300),  # the bid appears: +300
        ofi_n=L1(300),
        ofi_t=L1(300),
        trade_flow_n=0,
        trade_sign=0,
        mid_change_bps=0,
        log_dt_us=0,  # first event
        log_events_t=L1(1),
        time_of_day=34_200 / 86_400,
    )
    # 2. An offer of 200 at $10.01, 1 µs later.
    v = step(add(T0 + 1_000, 2, "S", 200, 100_100))
    check(
        v,
        has_ask=1,
        spread_bps=100 / 100_050 * 1e4,  # one cent over the mid 100050
        # micro = (100000·200 + 100100·300) / 500 = 50_030_000 / 500 = 100060: 10 over the mid
        micro_offset_bps=10 / 100_050 * 1e4,
        queue_imbalance=0.2,  # (300 - 200) / 500
        depth_imbalance_10=0.2,
        ofi_event=-L1(200),  # bid unchanged (+300 - 300); the ask appears: -200
        ofi_n=L1(100),  # 300 - 200
        ofi_t=L1(100),
        mid_change_bps=0,  # no previous mid
        log_dt_us=L1(1),  # 1000 ns = 1 µs
        log_events_t=L1(2),
    )
    # 3. Another 100 joins the bid.
    v = step(add(T0 + 2_000, 3, "B", 100, 100_000))
    check(
        v,
        queue_imbalance=200 / 600,  # (400 - 200) / 600
        # micro = (100000·200 + 100100·400) / 600 = 60_040_000 / 600 = 100066.67
        micro_offset_bps=(60_040_000 / 600 - 100_050) / 100_050 * 1e4,
        ofi_event=L1(100),  # bid size 300 -> 400 at the same price
        ofi_n=L1(200),  # 300 - 200 + 100
    )
    # 4. Order 1 (the bid, 300) is executed: a sell of 300; 100 rests at the bid.
    v = step(spec.OrderExecuted("E", 1, 0, T0 + 3_000, 1, 300, 9))
    check(
        v,
        ofi_event=-L1(300),  # 100 - 400
        ofi_n=-L1(400),  # the last 3: -200 + 100 - 300
        ofi_t=-L1(100),  # all 4 within 1 ms: 300 - 200 + 100 - 300
        trade_flow_n=-L1(300),
        trade_flow_t=-L1(300),
        trade_sign=-1,
        queue_imbalance=-100 / 300,  # (100 - 200) / 300
    )
    # 5. A hidden trade of 50 at $10.01, above the mid 100050: a buy; the book is unchanged.
    v = step(spec.Trade("P", 1, 0, T0 + 4_000, 0, "B", 50, "ABCD", 100_100, 10))
    check(
        v,
        ofi_event=0,
        ofi_n=-L1(200),  # 100 - 300 + 0
        ofi_t=-L1(100),
        trade_flow_n=-L1(250),  # -300 + 50
        trade_flow_t=-L1(250),
        trade_sign=1,
        log_events_t=L1(5),
    )
    # 6. 1 ms after event 4: events 1-4 (ts ≤ now - 1 ms) leave the time window.
    v = step(spec.OrderCancel("X", 1, 0, T0 + 1_003_000, 2, 50))  # ask 200 -> 150
    check(
        v,
        ofi_event=L1(50),  # -150 + 200
        ofi_n=-L1(250),  # -300 + 0 + 50
        ofi_t=L1(50),  # events 5 and 6: 0 + 50
        trade_flow_n=-L1(250),  # -300 + 50 + 0
        trade_flow_t=L1(50),  # only the hidden buy left
        trade_sign=0,
        log_dt_us=L1(999),  # 999_000 ns
        log_events_t=L1(2),
    )
    # 7. The bid (order 3, 100 shares) is replaced one cent lower: the mid falls half a cent.
    v = step(spec.OrderReplace("U", 1, 0, T0 + 1_004_000, 3, 4, 100, 99_900))
    check(
        v,
        ofi_event=-L1(100),  # bid down: -q_{n-1}
        mid_change_bps=(100_000 - 100_050) / 100_050 * 1e4,
        spread_bps=200 / 100_000 * 1e4,
        queue_imbalance=-50 / 250,  # (100 - 150) / 250
    )
    assert state.mid == 100_000.0

    # The DeepLOB window holds events 4..7, normalised against the mid now (100000), in ticks.
    t = state.deeplob.tensor() if state.deeplob else None
    assert t is not None
    assert t.shape == (4, 40)
    # Events 4 and 5 (same book): ask 100100 x 200 -> +1 tick; bid 100000 x 100 -> 0 ticks.
    for row in (0, 1):
        assert t[row, :4].tolist() == [1.0, approx(L1(200)), 0.0, approx(L1(100))]
    assert t[2, :4].tolist() == [1.0, approx(L1(150)), 0.0, approx(L1(100))]  # after the cancel
    # Event 7: bid 99900 -> -1 tick; the missing levels continue one tick apart, size 0.
    assert t[3, :4].tolist() == [1.0, approx(L1(150)), -1.0, approx(L1(100))]
    assert t[3, 4:8].tolist() == [2.0, 0.0, -2.0, 0.0]
    assert t[3, 36:].tolist() == [10.0, 0.0, -10.0, 0.0]


def test_update_reuses_its_buffer() -> None:
    state = FeatureState()
    book = FakeBook([(100, 1, 1)], [(101, 1, 1)])
    first = state.update(event(), book)
    assert state.update(event(ts=T0 + 1), book) is first


@pytest.mark.parametrize(
    ("bids", "asks"),
    [
        ([], []),
        ([(100, 300, 1)], []),
        ([], [(101, 300, 1)]),
        ([(100, 0, 0)], [(101, 0, 0)]),  # zero sizes (a book never shows them; stay finite)
        ([(101, 5, 1)], [(100, 5, 1)]),  # crossed
        ([(0, 5, 1)], [(0, 5, 1)]),  # zero prices (the book rejects them): no mid to divide by
    ],
)
def test_vector_is_finite_on_degenerate_books(bids: list[Level], asks: list[Level]) -> None:
    state = FeatureState(deeplob_length=5)
    book = FakeBook(bids, asks)
    for i, kind in enumerate("AEPXDCUP"):
        v = state.update(event(kind, ts=T0 + i, trade=100, price=100), book)
        assert np.isfinite(v).all(), named(v)
    assert state.deeplob is not None
    assert np.isfinite(state.deeplob.tensor()).all()


def test_empty_book_vector_is_all_but_time_zero() -> None:
    state = FeatureState()
    v = named(state.update(event("D", ts=DAY_NS // 2), FakeBook([], [])))
    assert v.pop("time_of_day") == 0.5
    assert v.pop("log_events_t") == approx(L1(1))
    assert set(v.values()) == {0.0}


def test_random_session_matches_the_pure_formulas() -> None:
    """A random session through the real book: every vector finite, and its depth entries
    equal to what the pure functions compute from the book."""
    rng = random.Random(7)
    books = Books()
    features = Features(window_events=20, window_ns=50_000, deeplob_length=10)
    live: list[int] = []
    ts, ref = T0, 0
    for _ in range(2_000):
        ts += rng.randint(0, 3_000)
        r = rng.random()
        msg: Any
        if r < 0.5 or len(live) < 5:
            ref += 1
            side = rng.choice("BS")
            price = 100_000 + (-rng.randint(0, 12) if side == "B" else rng.randint(1, 13)) * 100
            msg = add(ts, ref, side, rng.randint(1, 9) * 100, price)
            live.append(ref)
        elif r < 0.65:
            msg = spec.OrderExecuted("E", 1, 0, ts, rng.choice(live), 100, 0)
        elif r < 0.7:
            msg = spec.Trade(
                "P", 1, 0, ts, 0, "B", 10, "ABCD", 100_000 + rng.randint(-2, 2) * 50, 0
            )
        else:
            msg = spec.OrderDelete("D", 1, 0, ts, live.pop(rng.randrange(len(live))))
        ev = books.apply(msg)
        if ev is None:
            continue
        book = books.book(1)
        v = named(features.update(ev, book))
        assert all(math.isfinite(x) for x in v.values())
        bids, asks = book.depth(1, 10), book.depth(-1, 10)
        assert v["depth_imbalance_5"] == approx(depth_imbalance(bids, asks, 5))
        assert v["depth_imbalance_10"] == approx(depth_imbalance(bids, asks, 10))
        bid, bid_size, ask, ask_size = book.top()
        assert v["queue_imbalance"] == approx(queue_imbalance(bid_size, ask_size))
        if bid is not None and ask is not None:
            mid = mid_price(bid, ask)
            assert v["spread_bps"] == approx(spread(bid, ask) / mid * 1e4)
    deeplob = features.state(1).deeplob
    assert deeplob is not None
    assert np.isfinite(deeplob.tensor()).all()


def test_features_keeps_one_state_per_locate() -> None:
    features = Features(window_events=2, deeplob_length=0)
    book = FakeBook([(100, 10, 1)], [])
    features.update(event(), book)
    other = BookEvent(T0, 2, "A", 1, 100, 10, 0, 0, 0, True)
    features.update(other, book)
    assert set(features.states) == {1, 2}
    # Each stock saw its bid appear once: OFI +10 each, not +10 then 0.
    assert features.state(1).events.ofi == 10
    assert features.state(2).events.ofi == 10
    assert features.state(1).deeplob is None
    assert features.state(3).events.ofi == 0  # created empty on demand
