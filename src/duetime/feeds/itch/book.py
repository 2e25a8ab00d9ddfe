"""Level-3 order books for ITCH 5.0: every resting order by reference, FIFO queues per price level.

`Books.apply(msg)` takes the parsed messages of a whole feed, one at a time, keeps one `OrderBook`
per stock locate and returns a `BookEvent` per applied order message, which is what the feature
code needs for order-flow imbalance and signed trade flow. It runs once per message in Python,
so the structures are chosen for the common case of a real day (most messages touch an existing
order near the touch): one dict from reference to order for the whole feed (references are unique
for the day across all stocks, so E/C/X/D/U never search a book); per side a dict of levels and a
sorted list of level keys with the best level at the *end* (adds and removals near the touch cost
an append or pop, not a memmove of the whole list); a level's FIFO queue is an insertion-ordered
dict of references, so removing from the middle of the queue is O(1) and queue order is kept.

A level key is `side * price` (side +1 bid, -1 ask), so both sides share one ascending order and
the best level of either side is `keys[-1]`.

Invalid flows (a feed that lost or reordered messages, or a corrupt file) follow one documented
policy, counted in `Books.anomalies` by kind with the first few samples; `strict=True` raises
`BookError` instead, before anything changes. See docs/itch_book.md, "Order book and policies".
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any, Final, NamedTuple

from duetime.feeds.itch.keys import StockKeys

BID: Final = 1
ASK: Final = -1

BOOK_KINDS: Final = frozenset("AFECXDU")
"""The message types that change a book when applied (P is a trade event, not a change)."""

ANOMALY_KINDS: Final = (
    "unknown_ref",
    "duplicate_ref",
    "oversize",
    "zero_shares",
    "zero_price",
    "bad_side",
    "market_locate",
    "locate_mismatch",
    "crossed",
)
"""Every kind `Anomalies` counts. Append only: fastbook keeps its counters in this order."""

REJECTING: Final = frozenset(
    {"unknown_ref", "zero_shares", "zero_price", "bad_side", "market_locate"}
)
"""Anomalies that stop a message from changing any book (the others are applied, adjusted)."""

LENIENT: Final = frozenset({"crossed"})
"""Anomalies that `strict` mode counts without raising: a locked or crossed book is market state
real feeds produce for a moment, not a feed error."""


class BookError(Exception):
    """A message broke the book policy in `strict` mode; nothing was changed by it."""

    def __init__(self, kind: str, sample: AnomalySample) -> None:
        self.where = (
            f"{kind} at message {sample.seq} (ts {sample.ts}, locate {sample.locate}, "
            f"ref {sample.ref})"
        )
        """The case and the message, without the advice (a command words its own)."""
        super().__init__(f"{self.where}; use strict=False to count and apply the documented policy")
        self.kind = kind
        self.sample = sample


class BookEvent(NamedTuple):
    """What one applied order message did to a book, or one non-displayed trade (kind 'P').

    `side` and `price` are the resting order's (for P the message's indicator and price);
    `shares` the signed change of resting shares (+ for A/F, - for E/C/X/D, the new order's
    shares for U); `trade_shares`/`trade_price` the print for E/C/P (E at the resting price, C
    at its execution price), else 0; `old_price`/`old_shares` the replaced order's for U, else 0.
    `top_changed`: the best price or the shares at the best price of either side differ from
    before the message. `locate` is the stock whose book changed (the order's, see policy).
    """

    ts: int
    locate: int
    kind: str
    side: int
    price: int
    shares: int
    trade_shares: int
    trade_price: int
    old_price: int
    top_changed: bool
    old_shares: int = 0


class AnomalySample(NamedTuple):
    """Where an anomaly happened: `seq` is the 0-based index of the message among all passed to
    `Books.apply` (map it to a file offset with the parser's `offsets=`)."""

    seq: int
    ts: int
    locate: int
    ref: int


class Anomalies:
    """Counts of policy cases by kind, with the first `keep` samples of each."""

    def __init__(self, keep: int = 5) -> None:
        self.counts: dict[str, int] = {}
        self.samples: dict[str, list[AnomalySample]] = {}
        self._keep = keep

    def add(self, kind: str, sample: AnomalySample) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        samples = self.samples.setdefault(kind, [])
        if len(samples) < self._keep:
            samples.append(sample)

    def __bool__(self) -> bool:
        return bool(self.counts)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """JSON-ready: kind -> {"count": n, "samples": [[seq, ts, locate, ref], ...]}."""
        return {
            kind: {"count": self.counts[kind], "samples": [list(s) for s in self.samples[kind]]}
            for kind in ANOMALY_KINDS
            if kind in self.counts
        }


class _Side:
    __slots__ = ("depth", "depth_k", "keys", "levels", "sign")

    def __init__(self, sign: int) -> None:
        self.sign = sign
        self.levels: dict[int, _Level] = {}
        self.keys: list[int] = []
        """Level keys (`sign * price`) ascending: the best level is the last."""
        self.depth: list[Level] | None = None
        """The last `OrderBook.depth` of this side (`depth_k` levels); None once it changed."""
        self.depth_k = 0


class _Level:
    __slots__ = ("key", "orders", "price", "shares", "side")

    def __init__(self, side: _Side, price: int) -> None:
        self.side = side
        self.price = price
        self.key = side.sign * price
        self.shares = 0
        self.orders: dict[int, _Order] = {}
        """The FIFO queue: reference -> order, oldest first."""


class _Order:
    __slots__ = ("book", "level", "price", "ref", "shares", "side")

    def __init__(self, ref: int, book: OrderBook, side: int, price: int, shares: int) -> None:
        self.ref = ref
        self.book = book
        self.side = side
        self.price = price
        self.shares = shares
        self.level: _Level


Level = tuple[int, int, int]
"""(price, shares, orders) of one price level; prices are raw Price(4) integers."""

Top = tuple[int | None, int, int | None, int]
"""(bid_px, bid_sz, ask_px, ask_sz); an empty side has price None and size 0."""


class OrderBook:
    """The resting orders of one stock. Read it through the methods; `Books` changes it."""

    def __init__(self, locate: int, symbol: str = "", index: dict[int, _Order] | None = None):
        self.locate = locate
        self.symbol = symbol
        self.counts: defaultdict[str, int] = defaultdict(int)
        """Messages carrying this stock locate, by type letter (all types, applied or not)."""
        self.bids = _Side(BID)
        self.asks = _Side(ASK)
        self.live_orders = 0
        self._index: dict[int, _Order] = {} if index is None else index

    def best_bid(self) -> Level | None:
        return _best(self.bids)

    def best_ask(self) -> Level | None:
        return _best(self.asks)

    def depth(self, side: int, k: int) -> list[Level]:
        """Up to `k` levels of one side (+1 bids, -1 asks), best first. The same list comes back
        until the side changes: read it, do not modify it.

        NOTE: an event changes one side, and the features read both after every event: the
        other side's list is the one they read last (a third of the features' time, measured)."""
        s = self.bids if side == BID else self.asks
        cached = s.depth
        if cached is not None and s.depth_k == k:
            return cached
        levels = s.levels
        s.depth = cached = [
            (lvl.price, lvl.shares, len(lvl.orders))
            for lvl in map(levels.__getitem__, s.keys[: -k - 1 : -1] if k > 0 else ())
        ]
        s.depth_k = k
        return cached

    def top(self) -> Top:
        """The best price and the total shares there on each side."""
        b, a = self.bids, self.asks
        if b.keys:
            bid = b.levels[b.keys[-1]]
            bid_px: int | None = bid.price
            bid_sz = bid.shares
        else:
            bid_px, bid_sz = None, 0
        if a.keys:
            ask = a.levels[a.keys[-1]]
            return bid_px, bid_sz, ask.price, ask.shares
        return bid_px, bid_sz, None, 0

    def crossed(self) -> bool:
        """True while the best bid is at or above the best ask (locked or crossed)."""
        b, a = self.bids.keys, self.asks.keys
        return bool(b and a and b[-1] + a[-1] >= 0)

    def queue_ahead(self, ref: int) -> int:
        """Shares queued ahead of order `ref` at its price level (0 at the head)."""
        order = self._index.get(ref)
        if order is None or order.book is not self:
            raise KeyError(f"order {ref} is not live in the book of locate {self.locate}")
        ahead = 0
        for other in order.level.orders.values():
            if other is order:
                return ahead
            ahead += other.shares
        raise AssertionError("order missing from its own level")  # pragma: no cover

    def order(self, ref: int) -> tuple[int, int, int] | None:
        """(side, price, shares) of a live order of this book, or None."""
        order = self._index.get(ref)
        if order is None or order.book is not self:
            return None
        return order.side, order.price, order.shares

    def orders(self, side: int) -> Iterator[tuple[int, int, int]]:
        """(ref, price, shares) of every live order on one side, in priority order."""
        s = self.bids if side == BID else self.asks
        for key in reversed(s.keys):
            for order in s.levels[key].orders.values():
                yield order.ref, order.price, order.shares

    def _top_key(self) -> tuple[int, int, int, int]:
        """`top()` as comparable keys, cheap enough to snapshot around a rare path."""
        b, a = self.bids, self.asks
        bk = b.keys[-1] if b.keys else 0
        ak = a.keys[-1] if a.keys else 0
        return (
            bk,
            b.levels[bk].shares if b.keys else 0,
            ak,
            a.levels[ak].shares if a.keys else 0,
        )

    def _insert(self, order: _Order) -> bool:
        """Queue `order` at the back of its level; True when that touched the best level."""
        side = self.bids if order.side == BID else self.asks
        price = order.price
        key = side.sign * price
        level = side.levels.get(key)
        keys = side.keys
        top = not keys or key >= keys[-1]
        if level is None:
            level = side.levels[key] = _Level(side, price)
            if top:
                keys.append(key)
            else:
                insort(keys, key)
        level.orders[order.ref] = order
        level.shares += order.shares
        side.depth = None
        order.level = level
        self._index[order.ref] = order
        self.live_orders += 1
        return top

    def _take(self, order: _Order, shares: int) -> bool:
        """Remove `shares` (≤ the order's) keeping queue position; True when at the best level."""
        level = order.level
        top = level.key == level.side.keys[-1]
        if shares >= order.shares:
            self._unlink(order)
        else:
            order.shares -= shares
            level.shares -= shares
            level.side.depth = None
        return top

    def _remove(self, order: _Order) -> bool:
        level = order.level
        top = level.key == level.side.keys[-1]
        self._unlink(order)
        return top

    def _unlink(self, order: _Order) -> None:
        level = order.level
        del level.orders[order.ref]
        level.shares -= order.shares
        level.side.depth = None
        del self._index[order.ref]
        self.live_orders -= 1
        if not level.orders:
            side = level.side
            del side.levels[level.key]
            keys = side.keys
            if keys[-1] == level.key:
                keys.pop()
            else:
                del keys[bisect_left(keys, level.key)]


def _best(side: _Side) -> Level | None:
    if not side.keys:
        return None
    level = side.levels[side.keys[-1]]
    return level.price, level.shares, len(level.orders)


_SIDES: Final = {"B": BID, "S": ASK}
_event: Final = tuple.__new__


def _add_problem(side: int, shares: int) -> str:
    """Why an order with a zero side, shares or price cannot rest (in that order of checks)."""
    if not side:
        return "bad_side"
    return "zero_price" if shares else "zero_shares"


_Handler = Callable[[Any, "OrderBook | None"], "BookEvent | None"]


class Books:
    """Every stock's book for one feed; `apply` each parsed message in feed order.

    Messages are the parser's per-type NamedTuples (`type`, `stock_locate`, `timestamp` and the
    spec fields in snake_case), typed `Any` here because 23 layouts share no useful base.
    """

    def __init__(self, *, strict: bool = False, keep_samples: int = 5) -> None:
        self.strict = strict
        self.books: dict[int, OrderBook] = {}
        """Stock locate -> book, for every non-zero locate seen in any message."""
        self.market_counts: defaultdict[str, int] = defaultdict(int)
        """Messages with stock locate 0 (market-wide: S, V, W, ...) by type letter."""
        self.anomalies = Anomalies(keep_samples)
        self.messages = 0
        """Messages passed to `apply` so far (the next message's `seq`)."""
        self.evictions = 0
        """Stale orders removed because a new order reused their reference: the one way a book
        changes without an event of its own (the event belongs to the new order's stock)."""
        self.keys = StockKeys()
        """Each book's key as the summary would give it after the messages so far (`keys`)."""
        self._orders: dict[int, _Order] = {}
        self._handlers: dict[str, _Handler] = {
            "A": self._on_add,
            "F": self._on_add,
            "E": self._on_execute,
            "C": self._on_execute_price,
            "X": self._on_cancel,
            "D": self._on_delete,
            "U": self._on_replace,
            "P": self._on_trade,
            "R": self._on_directory,
        }

    @property
    def live_orders(self) -> int:
        return len(self._orders)

    def book(self, locate: int) -> OrderBook:
        """The book of `locate`, created empty on first use."""
        book = self.books.get(locate)
        if book is None:
            book = self.books[locate] = OrderBook(locate, "", self._orders)
            self.keys.name(locate, "")
        return book

    def apply(self, msg: Any) -> BookEvent | None:
        """Count `msg`, apply it to its book; the event it caused, or None (no book change and
        not a trade event, or rejected by the policy)."""
        self.messages += 1
        letter = msg.type
        locate = msg.stock_locate
        book: OrderBook | None
        if locate:
            book = self.books.get(locate)
            if book is None:
                book = self.book(locate)
            book.counts[letter] += 1
        else:
            book = None
            self.market_counts[letter] += 1
        handler = self._handlers.get(letter)
        if handler is None:
            return None
        return handler(msg, book)

    # -- policy -------------------------------------------------------------------------------

    def _note(self, kind: str, msg: Any, ref: int) -> None:
        """Count an anomaly; in strict mode raise instead (before anything changed)."""
        sample = AnomalySample(self.messages - 1, msg.timestamp, msg.stock_locate, ref)
        if self.strict and kind not in LENIENT:
            raise BookError(kind, sample)
        self.anomalies.add(kind, sample)

    def _resolve(self, msg: Any, book: OrderBook | None, ref: int) -> _Order | None:
        """The live order `ref` names, or None after counting `unknown_ref`. An order found in
        another stock's book is used anyway (references are unique for the day; the locate is
        the likelier field to be wrong) after counting `locate_mismatch`."""
        order = self._orders.get(ref)
        if order is None:
            self._note("unknown_ref", msg, ref)
            return None
        if order.book is not book:
            self._note("locate_mismatch", msg, ref)
        return order

    def _evict(self, msg: Any, ref: int) -> None:
        """A new order reuses live reference `ref`: the stale order leaves its book."""
        self._note("duplicate_ref", msg, ref)
        self.evictions += 1
        stale = self._orders[ref]
        stale.book._remove(stale)

    # -- handlers -------------------------------------------------------------------------------
    # Events are built with `_event(BookEvent, (...))`: a NamedTuple's own constructor costs
    # four times as much, a quarter of the time of a whole message. Each handler takes the
    # common valid case inline and leaves the policy cases to `_resolve` and `_taken`.

    def _on_add(self, msg: Any, book: OrderBook | None) -> BookEvent | None:
        ref = msg.order_reference_number
        shares = msg.shares
        price = msg.price
        side = _SIDES.get(msg.buy_sell_indicator, 0)
        if book is None:
            self._note("market_locate", msg, ref)
            return None
        if not (side and shares and price):
            self._note(_add_problem(side, shares), msg, ref)
            return None
        order = _Order(ref, book, side, price, shares)
        if ref in self._orders:
            before = book._top_key()
            self._evict(msg, ref)
            joined = book._insert(order)
            top = book._top_key() != before
        else:
            top = joined = book._insert(order)
        if joined and book.crossed():
            self._note("crossed", msg, ref)
        return _event(
            BookEvent, (msg.timestamp, book.locate, msg.type, side, price, shares, 0, 0, 0, top, 0)
        )

    def _reduce(
        self, msg: Any, book: OrderBook | None, shares: int
    ) -> tuple[_Order, int, bool] | None:
        """Take `shares` off the order `msg` names (E, C, X): the order, the shares taken (the
        policy clamps too many) and whether the top of book changed; None when nothing is."""
        ref = msg.order_reference_number
        order = self._orders.get(ref)
        if order is None or order.book is not book:
            order = self._resolve(msg, book, ref)
            if order is None:
                return None
        taken = shares if 0 < shares <= order.shares else self._taken(msg, order, shares)
        if not taken:
            return None
        return order, taken, order.book._take(order, taken)

    def _on_execute(self, msg: Any, book: OrderBook | None) -> BookEvent | None:
        executed = msg.executed_shares
        reduced = self._reduce(msg, book, executed)
        if reduced is None:
            return None
        order, taken, top = reduced
        price = order.price
        return _event(
            BookEvent,
            (msg.timestamp, order.book.locate, "E", order.side, price, -taken, executed, price,
             0, top, 0),
        )  # fmt: skip

    def _on_execute_price(self, msg: Any, book: OrderBook | None) -> BookEvent | None:
        executed = msg.executed_shares
        reduced = self._reduce(msg, book, executed)
        if reduced is None:
            return None
        order, taken, top = reduced
        return _event(
            BookEvent,
            (msg.timestamp, order.book.locate, "C", order.side, order.price, -taken, executed,
             msg.execution_price, 0, top, 0),
        )  # fmt: skip

    def _on_cancel(self, msg: Any, book: OrderBook | None) -> BookEvent | None:
        reduced = self._reduce(msg, book, msg.cancelled_shares)
        if reduced is None:
            return None
        order, taken, top = reduced
        return _event(
            BookEvent,
            (msg.timestamp, order.book.locate, "X", order.side, order.price, -taken, 0, 0, 0,
             top, 0),
        )  # fmt: skip

    def _taken(self, msg: Any, order: _Order, shares: int) -> int:
        """Shares an E/C/X removes when not simply its own: 0 (`zero_shares`, rejected) or all
        that rests (`oversize`, clamped)."""
        if not shares:
            self._note("zero_shares", msg, order.ref)
            return 0
        self._note("oversize", msg, order.ref)
        return order.shares

    def _on_delete(self, msg: Any, book: OrderBook | None) -> BookEvent | None:
        ref = msg.order_reference_number
        order = self._orders.get(ref)
        if order is None or order.book is not book:
            order = self._resolve(msg, book, ref)
            if order is None:
                return None
        top = order.book._remove(order)
        return _event(
            BookEvent,
            (msg.timestamp, order.book.locate, "D", order.side, order.price, -order.shares, 0, 0,
             0, top, 0),
        )  # fmt: skip

    def _on_replace(self, msg: Any, book: OrderBook | None) -> BookEvent | None:
        old_ref = msg.original_order_reference_number
        old = self._orders.get(old_ref)
        if old is None or old.book is not book:
            old = self._resolve(msg, book, old_ref)
            if old is None:
                return None
        new_ref = msg.new_order_reference_number
        shares = msg.shares
        price = msg.price
        if self.strict:  # raise before the old order goes
            if new_ref != old_ref and new_ref in self._orders:
                self._note("duplicate_ref", msg, new_ref)
            if not (shares and price):
                self._note(_add_problem(old.side, shares), msg, new_ref)
        book = old.book
        before = book._top_key()
        book._remove(old)
        if new_ref in self._orders:
            self._evict(msg, new_ref)
        joined = False
        if shares and price:
            joined = book._insert(_Order(new_ref, book, old.side, price, shares))
        else:
            self._note(_add_problem(old.side, shares), msg, new_ref)
            shares = 0
        top = book._top_key() != before
        if joined and book.crossed():
            self._note("crossed", msg, new_ref)
        return _event(
            BookEvent,
            (msg.timestamp, book.locate, "U", old.side, price, shares, 0, 0, old.price, top,
             old.shares),
        )  # fmt: skip

    def _on_trade(self, msg: Any, book: OrderBook | None) -> BookEvent | None:
        if book is None:
            # NOTE: locate 0 is market-wide, only counted (as A/F are): its trade event made
            # `itch run` build a book '#0' and ask the model for it
            return None
        side = _SIDES.get(msg.buy_sell_indicator, 0)
        price = msg.price
        return _event(
            BookEvent,
            (msg.timestamp, msg.stock_locate, "P", side, price, 0, msg.shares, price, 0, False, 0),
        )

    def _on_directory(self, msg: Any, book: OrderBook | None) -> None:
        if book is not None:  # (alpha fields are left-justified: only trailing spaces pad)
            book.symbol = msg.stock.rstrip(" ")
            self.keys.name(book.locate, book.symbol)
