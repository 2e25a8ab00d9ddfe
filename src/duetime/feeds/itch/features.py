"""Features per book event: pure formulas for the top of book, order-flow imbalance and signed
trade flow, and `FeatureState`, which turns each event into one fixed-length float32 vector.

Prices are raw ITCH Price(4) ints (price * 10^4) and sizes are shares throughout; the pure
functions return raw units, and only the vector rescales them (see FEATURE_NAMES). The hot path
is plain Python scalar arithmetic: a numpy call costs about a microsecond whatever it computes,
so the vector is built as a list and written into its preallocated array in one assignment.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from duetime.feeds.itch.book import Level, Top
from duetime.feeds.itch.deeplob import DEFAULT_TICK, DeepLobWindow

EMPTY_TOP: Top = (None, 0, None, 0)
"""The top of an empty book, in `OrderBook.top()`'s form (an empty side: price None, size 0)."""

_NO_ASK = 1 << 62
"""Stands for the +inf price of an empty ask side in OFI's comparisons (the empty bid's -inf is
0: ITCH prices are positive)."""

DEPTH_LEVELS = 10
SHALLOW_LEVELS = 5
DAY_NS = 86_400_000_000_000

FEATURE_NAMES: tuple[str, ...] = (
    "has_bid",  # 1.0 when the bid side has a level, else 0.0
    "has_ask",  # 1.0 when the ask side has a level, else 0.0
    "spread_bps",  # (ask - bid) / mid * 10^4; 0 when a side is empty
    "micro_offset_bps",  # (micro-price - mid) / mid * 10^4; 0 when a side is empty
    "queue_imbalance",  # (q_bid - q_ask) / (q_bid + q_ask) at the best level, in [-1, 1]
    "log_bid_size",  # log1p(shares at the best bid)
    "log_ask_size",  # log1p(shares at the best ask)
    "depth_imbalance_5",  # (Σ bid - Σ ask) / Σ both over the best 5 levels, in [-1, 1]
    "depth_imbalance_10",  # the same over the best 10 levels
    "log_bid_depth_10",  # log1p(shares on the best 10 bid levels)
    "log_ask_depth_10",  # log1p(shares on the best 10 ask levels)
    "ofi_event",  # slog(e_n), the order-flow imbalance of this event
    "ofi_n",  # slog(Σ e over the last N events)
    "ofi_t",  # slog(Σ e over the events in the last T ns)
    "trade_flow_n",  # slog(Σ signed traded shares over the last N events)
    "trade_flow_t",  # slog(Σ signed traded shares over the last T ns)
    "trade_sign",  # sign of this event's trade: +1 buy, -1 sell, 0 none or undecided
    "mid_change_bps",  # (mid - previous mid) / previous mid * 10^4; 0 if either is undefined
    "log_dt_us",  # log1p(µs since this stock's previous event)
    "log_events_t",  # log1p(number of events in the last T ns, this one included)
    "time_of_day",  # ns since midnight / 86 400 * 10^9, in [0, 1)
)
"""The order of `FeatureState.update`'s vector; slog(x) = sign(x)·log1p(|x|)."""

N_FEATURES = len(FEATURE_NAMES)


class BookView(Protocol):
    """What the features read of one stock's book (`OrderBook` satisfies it)."""

    def depth(self, side: int, k: int) -> Sequence[Level]: ...


class EventView(Protocol):
    """What the features read of a `BookEvent`."""

    @property
    def ts(self) -> int: ...
    @property
    def locate(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def side(self) -> int: ...
    @property
    def trade_shares(self) -> int: ...
    @property
    def trade_price(self) -> int: ...


# -- top of book ----------------------------------------------------------------------------


def top_of(bids: Sequence[Level], asks: Sequence[Level]) -> Top:
    """The best level of each side, as `OrderBook.top()` gives it, from two depth lists."""
    if bids:
        bid: int | None = bids[0][0]
        bid_size = bids[0][1]
    else:
        bid, bid_size = None, 0
    if asks:
        return bid, bid_size, asks[0][0], asks[0][1]
    return bid, bid_size, None, 0


def mid_price(bid: int, ask: int) -> float:
    """(bid + ask) / 2, in the prices' units."""
    return (bid + ask) / 2


def spread(bid: int, ask: int) -> int:
    """ask - bid, in the prices' units (100 = one cent in Price(4))."""
    return ask - bid


def micro_price(bid: int, bid_size: int, ask: int, ask_size: int) -> float:
    """Size-weighted mid: (bid·q_ask + ask·q_bid) / (q_bid + q_ask).

    The simple form of Stoikov's micro-price ("The micro-price: a high-frequency estimator of
    future prices", Quantitative Finance 18(12), 2018): each price is weighted by the size on
    the *opposite* side, so a heavy bid pulls the estimate towards the ask. The mid when both
    sizes are 0.
    """
    total = bid_size + ask_size
    if total == 0:
        return (bid + ask) / 2
    return (bid * ask_size + ask * bid_size) / total


def queue_imbalance(bid_size: int, ask_size: int) -> float:
    """(q_bid - q_ask) / (q_bid + q_ask) at the best level, in [-1, 1]; 0 when both are 0.

    Gould & Bonart, "Queue imbalance as a one-tick-ahead price predictor in a limit order
    book", Market Microstructure and Liquidity 2(2), 2016.
    """
    total = bid_size + ask_size
    return (bid_size - ask_size) / total if total else 0.0


def depth_imbalance(bids: Sequence[Level], asks: Sequence[Level], k: int) -> float:
    """(Σ bid shares - Σ ask shares) / (Σ both) over the best k levels of each side, in
    [-1, 1]; 0 when both are empty. Queue imbalance (k = 1) extended deeper into the book."""
    bid_total = sum(level[1] for level in bids[:k])
    ask_total = sum(level[1] for level in asks[:k])
    total = bid_total + ask_total
    return (bid_total - ask_total) / total if total else 0.0


# -- order flow -----------------------------------------------------------------------------


def order_flow_imbalance(before: Top, after: Top) -> int:
    """The order-flow imbalance e_n of one event, in shares, from the top of book before and
    after it (Cont, Kukanov & Stoikov, "The price impact of order book events", Journal of
    Financial Econometrics 12(1), 2014, eq. 2):

        e_n = 1{P^B_n ≥ P^B_{n-1}}·q^B_n - 1{P^B_n ≤ P^B_{n-1}}·q^B_{n-1}
            - 1{P^A_n ≤ P^A_{n-1}}·q^A_n + 1{P^A_n ≥ P^A_{n-1}}·q^A_{n-1}

    Bid unchanged: the change of bid size; bid up: + the new bid size; bid down: - the old bid
    size; mirrored with opposite sign for the ask. Positive e_n is buying pressure. An empty
    side (price None) counts as price ∓∞ with no shares, so a side appearing adds its new size with
    the sign of the side, and a side vanishing removes its old size.
    """
    bid0, bid_size0, ask0, ask_size0 = before
    bid1, bid_size1, ask1, ask_size1 = after
    b0 = 0 if bid0 is None else bid0
    b1 = 0 if bid1 is None else bid1
    a0 = _NO_ASK if ask0 is None else ask0
    a1 = _NO_ASK if ask1 is None else ask1
    e = 0
    if b1 >= b0:
        e += bid_size1
    if b1 <= b0:
        e -= bid_size0
    if a1 <= a0:
        e -= ask_size1
    if a1 >= a0:
        e += ask_size0
    return e


def signed_trade(kind: str, side: int, shares: int, price: int, top: Top) -> int:
    """Traded shares signed by the aggressor: + buyer-initiated, - seller-initiated; 0 for an
    event that is not a trade.

    E/C (execution of a displayed order) are signed by the resting side: an execution against
    a resting bid (side +1) is a sell, so the sign is -side. P (a trade against a hidden
    order, whose buy/sell flag Nasdaq no longer fills in reliably) is signed by its price
    against the mid of `top` at that moment (Lee & Ready, "Inferring trade direction from
    intraday data", Journal of Finance 46(2), 1991): above the mid a buy, below a sell, at the
    mid — or with a side empty, so no mid — 0.
    """
    if kind == "E" or kind == "C":
        return -side * shares
    if kind != "P":
        return 0
    bid, _, ask, _ = top
    if bid is None or ask is None:
        return 0
    doubled = 2 * price - bid - ask  # 2·(price - mid), kept in exact ints
    if doubled > 0:
        return shares
    if doubled < 0:
        return -shares
    return 0


def slog(x: float) -> float:
    """sign(x)·log1p(|x|): a signed log that keeps 0 at 0 and compresses heavy-tailed flows."""
    return math.log1p(x) if x >= 0 else -math.log1p(-x)


# -- rolling windows ------------------------------------------------------------------------


class EventWindow:
    """Sums of (OFI, trade flow) over the last `n` events; O(1) per event with a ring of the
    values pushed, whose overwritten entry is subtracted as the new one is added. Integer
    shares, so the sums are exact at any length of run."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"EventWindow needs n ≥ 1 events; got {n}")
        self._ofi = [0] * n
        self._flow = [0] * n
        self._i = 0
        self.ofi = 0
        self.flow = 0

    def push(self, ofi: int, flow: int) -> None:
        i = self._i
        self.ofi += ofi - self._ofi[i]
        self.flow += flow - self._flow[i]
        self._ofi[i] = ofi
        self._flow[i] = flow
        self._i = i + 1 if i + 1 < len(self._ofi) else 0


class TimeWindow:
    """Sums of (OFI, trade flow) and the event count over the events in (t - span, t], t the
    newest event's time: an event exactly `span` ns older than the newest has left. O(1)
    amortised per event: a deque in time order, expired from the left as time advances.
    Timestamps must not go backwards (ITCH's are in order within a stock)."""

    def __init__(self, span_ns: int) -> None:
        if span_ns < 1:
            raise ValueError(f"TimeWindow needs span_ns ≥ 1; got {span_ns}")
        self.span_ns = span_ns
        self._events: deque[tuple[int, int, int]] = deque()
        self.ofi = 0
        self.flow = 0

    @property
    def count(self) -> int:
        return len(self._events)

    def push(self, ts: int, ofi: int, flow: int) -> None:
        events = self._events
        events.append((ts, ofi, flow))
        self.ofi += ofi
        self.flow += flow
        horizon = ts - self.span_ns
        while events[0][0] <= horizon:
            _, old_ofi, old_flow = events.popleft()
            self.ofi -= old_ofi
            self.flow -= old_flow


# -- per stock and all stocks ---------------------------------------------------------------


class FeatureState:
    """The features of one stock, updated once per book event.

    Keeps what the formulas need from before the event (the previous top of book and mid, the
    previous event time), the two rolling windows, and the stock's `DeepLobWindow` (`deeplob`),
    which every update also advances. Call `update` after the book has applied the event, for
    every event of the stock: OFI compares the top now with the top at the previous update.
    """

    def __init__(
        self,
        *,
        window_events: int = 100,
        window_ns: int = 1_000_000_000,
        deeplob_length: int = 100,
        tick: int = DEFAULT_TICK,
    ) -> None:
        self.events = EventWindow(window_events)
        self.recent = TimeWindow(window_ns)
        self.deeplob = DeepLobWindow(deeplob_length, DEPTH_LEVELS, tick) if deeplob_length else None
        """The stock's DeepLOB window (None when `deeplob_length` is 0: a model fed only the
        vector saves the row write, about a third of an update)."""
        self.top: Top = EMPTY_TOP
        """The top of book after the last update."""
        self.mid: float | None = None
        """The mid after the last update (raw price units); None while a side is empty."""
        self._last_ts: int | None = None
        self._vector = np.zeros(N_FEATURES, dtype=np.float32)
        self._sums: dict[int, tuple[Sequence[Level], int, int]] = {}
        """Per side: the depth list last read and its shares over 5 and 10 levels (a book
        hands back the same list while the side is unchanged: one side changes per event)."""

    def update(self, event: EventView, book: BookView) -> np.ndarray:
        """The feature vector after `event` (order: FEATURE_NAMES); every value finite.

        Returns this state's own buffer, overwritten by the next update: copy it to keep it.
        """
        bids = book.depth(1, DEPTH_LEVELS)
        asks = book.depth(-1, DEPTH_LEVELS)
        if self.deeplob is not None:
            self.deeplob.push(bids, asks)
        top = top_of(bids, asks)
        bid, bid_size, ask, ask_size = top

        # OFI compares with the top this state saw last, so it must see every event of the stock.
        e = order_flow_imbalance(self.top, top)
        flow = signed_trade(event.kind, event.side, event.trade_shares, event.trade_price, top)
        self.events.push(e, flow)
        recent = self.recent
        recent.push(event.ts, e, flow)

        has_bid = bid is not None
        has_ask = ask is not None
        if bid is not None and ask is not None and bid + ask > 0:  # a zero mid: no bps
            mid = (bid + ask) / 2
            to_bps = 1e4 / mid
            spread_bps = (ask - bid) * to_bps
            micro_bps = (micro_price(bid, bid_size, ask, ask_size) - mid) * to_bps
            prev_mid = self.mid
            change_bps = 0.0 if prev_mid is None else (mid - prev_mid) * 1e4 / prev_mid
            self.mid = mid
        else:
            spread_bps = micro_bps = change_bps = 0.0
            self.mid = None

        # depth_imbalance() at 5 and 10 levels, from one pass over each side's sizes.
        bid_5, bid_10 = self._depth_sums(1, bids)
        ask_5, ask_10 = self._depth_sums(-1, asks)
        last_ts = self._last_ts
        dt_us = 0.0 if last_ts is None else (event.ts - last_ts) / 1000

        self._vector[:] = [
            1.0 if has_bid else 0.0,
            1.0 if has_ask else 0.0,
            spread_bps,
            micro_bps,
            queue_imbalance(bid_size, ask_size),
            math.log1p(bid_size),
            math.log1p(ask_size),
            (bid_5 - ask_5) / (bid_5 + ask_5) if bid_5 + ask_5 else 0.0,
            (bid_10 - ask_10) / (bid_10 + ask_10) if bid_10 + ask_10 else 0.0,
            math.log1p(bid_10),
            math.log1p(ask_10),
            slog(e),
            slog(self.events.ofi),
            slog(recent.ofi),
            slog(self.events.flow),
            slog(recent.flow),
            float((flow > 0) - (flow < 0)),
            change_bps,
            math.log1p(max(dt_us, 0.0)),
            math.log1p(recent.count),
            event.ts / DAY_NS,
        ]
        self.top = top
        self._last_ts = event.ts
        return self._vector

    def _depth_sums(self, side: int, levels: Sequence[Level]) -> tuple[int, int]:
        """Shares over the best `SHALLOW_LEVELS` and over all of `levels` (one side's depth)."""
        known = self._sums.get(side)
        if known is not None and known[0] is levels:
            return known[1], known[2]
        sizes = [level[1] for level in levels]
        shallow, deep = sum(sizes[:SHALLOW_LEVELS]), sum(sizes)
        self._sums[side] = (levels, shallow, deep)
        return shallow, deep


class Features:
    """One `FeatureState` per stock locate, created on the stock's first event with the
    settings given here."""

    def __init__(
        self,
        *,
        window_events: int = 100,
        window_ns: int = 1_000_000_000,
        deeplob_length: int = 100,
        tick: int = DEFAULT_TICK,
    ) -> None:
        self._settings = (window_events, window_ns, deeplob_length, tick)
        self.states: dict[int, FeatureState] = {}

    def state(self, locate: int) -> FeatureState:
        """The stock's state, created empty if it has had no event yet."""
        state = self.states.get(locate)
        if state is None:
            window_events, window_ns, deeplob_length, tick = self._settings
            state = FeatureState(
                window_events=window_events,
                window_ns=window_ns,
                deeplob_length=deeplob_length,
                tick=tick,
            )
            self.states[locate] = state
        return state

    def update(self, event: EventView, book: BookView) -> np.ndarray:
        """`FeatureState.update` for the event's stock; `book` must be that stock's book."""
        return self.state(event.locate).update(event, book)
