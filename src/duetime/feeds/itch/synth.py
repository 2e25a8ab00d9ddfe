"""A synthetic but valid ITCH 5.0 trading day, the same bytes for the same seed.

The day has the shape of a real one: start of messages, the stock directory and the other
start-of-day messages, system and market hours, an opening cross, continuous order flow, a
closing cross and the end-of-day events. The order flow is what book builders are tested on,
so it is valid by construction: it never references a dead order, never executes or cancels
more shares than remain, replaces only live orders, and never leaves a book crossed or locked
(an add that would cross executes against the other side first, like a marketable limit order,
and only its remainder rests). Order reference numbers are spread over all 64 bits, most above
2**32 and about half above 2**63, to catch readers that keep them in 32 or signed 64 bits.

Only the standard library is used (no numba, no numpy), and the flow is packed in bulk with
precompiled structs: a million messages take seconds.
"""

from __future__ import annotations

import itertools
import math
import os
import random
from collections.abc import Iterator, Sequence

from duetime.feeds.itch.writer import ItchWriter, encode, frame, framed_struct

DEFAULT_SYMBOLS = ("A", "AAPL", "MSFT", "NVDA", "QQQ", "SPY", "ZVZZT", "ZVZZTXYZ")
"""One-character and eight-character symbols included on purpose."""

_SECOND = 1_000_000_000
START_OF_MESSAGES = 3 * 3600 * _SECOND
START_OF_SYSTEM_HOURS = 4 * 3600 * _SECOND
MARKET_OPEN = 9 * 3600 * _SECOND + 30 * 60 * _SECOND
FLOW_END = 15 * 3600 * _SECOND + 55 * 60 * _SECOND
MARKET_CLOSE = 16 * 3600 * _SECOND
END_OF_SYSTEM_HOURS = 20 * 3600 * _SECOND
TICK = 100
"""Price(4) units per tick: one cent."""
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # odd, so i -> i * _GOLDEN + c is a bijection mod 2**64
_MPIDS = (b"GSCO", b"MSCO", b"UBSS", b"CDRG", b"VIRT", b"JPMS")
_FLUSH_EVERY = 8192
_ACTIONS = ("delete", "cancel", "replace", "sweep", "execute_with_price", "hidden_trade",
            "broken_trade", "retail_interest")  # fmt: skip
_ACTION_WEIGHTS = (0.6, 0.1, 0.15, 0.03, 0.02, 0.05, 0.005, 0.045)
"""What happens when a flow event is not an add, by relative frequency."""


def write_session(
    path: str | os.PathLike[str],
    *,
    seed: int,
    messages: int,
    symbols: Sequence[str] | None = None,
    gzip: bool = False,
    rate: float | None = None,
) -> int:
    """Write a session of exactly `messages` messages to `path`; returns that count.

    The order flow is spread over the trading day, or, with `rate`, arrives at about `rate`
    messages a second from the open (Poisson arrivals; sweeps share a timestamp), so that a
    replay at the recorded pace is as busy as a live feed of that rate. `ValueError` for too
    few messages or a rate that is not positive, before the file is made.
    """
    chunks = _session(seed, messages, symbols, rate)
    first = next(chunks)  # (the checks run here)
    with ItchWriter(path, gzip=gzip) as writer:
        for chunk, count in itertools.chain([first], chunks):
            writer.write_framed(chunk, count)
        return writer.messages


def session_chunks(
    *, seed: int, messages: int, symbols: Sequence[str] | None = None
) -> Iterator[bytes]:
    """The session as consecutive blocks of length-prefixed messages (a few thousand each)."""
    for chunk, _ in _session(seed, messages, symbols):
        yield chunk


def session_bytes(*, seed: int, messages: int, symbols: Sequence[str] | None = None) -> bytes:
    """The whole session in memory, for tests and small fixtures."""
    return b"".join(session_chunks(seed=seed, messages=messages, symbols=symbols))


def _session(
    seed: int, messages: int, symbols: Sequence[str] | None, rate: float | None = None
) -> Iterator[tuple[bytes, int]]:
    session = _Session(seed, _checked_symbols(symbols))
    session.prologue()
    epilogue = 2 * len(session.books) + 3
    session.left = messages - session.count - epilogue
    if session.left < 0:
        raise ValueError(f"messages must be at least {session.count + epilogue}, got {messages}")
    if rate is not None and not (math.isfinite(rate) and rate > 0):  # (NaN passed `<= 0`)
        raise ValueError(f"rate must be a finite positive number of messages a second, got {rate}")
    day = (FLOW_END - session.now) / max(1, session.left)
    session.mean_gap = day if rate is None else min(day, _SECOND / rate)
    halfway = session.left // 2
    while session.left > 0:
        session.step(halfway)
        if len(session.out) >= _FLUSH_EVERY:
            yield session.drain()
    session.epilogue()
    yield session.drain()


def _checked_symbols(symbols: Sequence[str] | None) -> list[str]:
    chosen = list(DEFAULT_SYMBOLS if symbols is None else symbols)
    if not 0 < len(chosen) < 65536 or len(set(chosen)) != len(chosen):
        raise ValueError(f"symbols must be 1..65535 distinct names, got {len(chosen)}")
    for name in chosen:
        if not (0 < len(name) <= 8 and name.isascii() and name.isprintable() and " " not in name):
            raise ValueError(f"a symbol is 1..8 printable ASCII characters, got {name!r}")
    return chosen


class _Session:
    """The generator's state: books, clock, counters and the output not yet handed out."""

    def __init__(self, seed: int, symbols: list[str]) -> None:
        self.rng = random.Random(seed)
        self.books = [
            Book(locate, name, self.rng.randrange(500, 50_000))
            for locate, name in enumerate(symbols, start=1)
        ]
        self.weights = [1.0 / (i + 1) ** 0.5 for i in range(len(symbols))]
        self.orders: dict[int, Order] = {}
        self.out: list[bytes] = []
        self.count = 0
        self.pending = 0  # messages in `out`
        self.left = 0  # flow messages still to emit
        self.now = START_OF_MESSAGES
        self.match = 0
        self.matches: list[int] = []
        self.refs = 0
        self.ref_salt = self.rng.getrandbits(64)
        self.halt_done = False
        self.mean_gap = 1.0  # ns between flow events, set once the flow's size is known
        self.pack = {letter: framed_struct(letter).pack for letter in "AFECXDUPBN"}

    # --- output ---------------------------------------------------------------------------

    def drain(self) -> tuple[bytes, int]:
        chunk, count = b"".join(self.out), self.pending
        self.out.clear()
        self.pending = 0
        return chunk, count

    def emit(self, letter: str, **fields: int | str) -> None:
        """One checked message (start and end of day: few, so readability wins)."""
        self.out.append(frame(encode(letter, timestamp=self.now, **fields)))
        self.count += 1
        self.pending += 1
        self.left -= 1
        self.now += 1000  # a microsecond apart: the start and end of day are not a burst

    def fast(self, letter: str, locate: int, *values: int | bytes) -> None:
        """One flow message packed without checks: the flow builds valid values itself."""
        now = self.now
        body = self.pack[letter]
        self.out.append(body(_LENGTHS[letter], _TYPE[letter], locate, self.count & 7, now >> 32,
                             now & 0xFFFFFFFF, *values))  # fmt: skip
        self.count += 1
        self.pending += 1
        self.left -= 1

    def next_ref(self) -> int:
        self.refs += 1
        ref = (self.refs * _GOLDEN + self.ref_salt) & _MASK64
        return ref if ref else self.next_ref()

    def next_match(self) -> int:
        self.match += 1
        if len(self.matches) < 1024:
            self.matches.append(self.match)
        return self.match

    # --- start and end of day ---------------------------------------------------------------

    def at(self, now: int) -> None:
        self.now = max(self.now, now)

    def prologue(self) -> None:
        """Start of messages, the directory and other start-of-day messages, the open."""
        books = self.books
        self.at(START_OF_MESSAGES)
        self.emit("S", event_code="O")
        self.emit("V", level1=5_200 * 10**8, level2=4_800 * 10**8, level3=4_200 * 10**8)
        for book in books:
            etf = book.name in ("QQQ", "SPY")
            self.emit("R", stock_locate=book.locate, stock=book.name, market_category="Q",
                      financial_status_indicator="N", round_lot_size=100, round_lots_only="N",
                      issue_classification="Q" if etf else "C", issue_sub_type="Z",
                      authenticity="P", short_sale_threshold_indicator="N", ipo_flag="N",
                      luld_reference_price_tier="1", etp_flag="Y" if etf else "N",
                      etp_leverage_factor=1 if etf else 0, inverse_indicator="N")  # fmt: skip
        for book in books:
            self.emit("Y", stock_locate=book.locate, stock=book.name, reg_sho_action="0")
        for book, mpid in zip(books, ("GSCO", "VIRT"), strict=False):
            self.emit("L", stock_locate=book.locate, mpid=mpid, stock=book.name,
                      primary_market_maker="Y", market_maker_mode="N",
                      market_participant_state="A")  # fmt: skip
        first, last, other = books[0], books[-1], books[-2 if len(books) > 1 else -1]
        self.emit("J", stock_locate=first.locate, stock=first.name,
                  auction_collar_reference_price=first.mid * TICK,
                  upper_auction_collar_price=first.mid * TICK * 11 // 10,
                  lower_auction_collar_price=first.mid * TICK * 9 // 10,
                  auction_collar_extension=0)  # fmt: skip
        self.emit("K", stock_locate=last.locate, stock=last.name,
                  ipo_quotation_release_time=9 * 3600 + 45 * 60,
                  ipo_quotation_release_qualifier="A", ipo_price=last.mid * TICK)  # fmt: skip
        self.emit("O", stock_locate=other.locate, stock=other.name, open_eligibility_status="Y",
                  minimum_allowable_price=other.mid * TICK * 8 // 10,
                  maximum_allowable_price=other.mid * TICK * 12 // 10,
                  near_execution_price=other.mid * TICK, near_execution_time=MARKET_OPEN,
                  lower_price_range_collar=other.mid * TICK * 9 // 10,
                  upper_price_range_collar=other.mid * TICK * 11 // 10)  # fmt: skip
        self.at(START_OF_SYSTEM_HOURS)
        self.emit("S", event_code="S")
        for book in books:
            self.emit("H", stock_locate=book.locate, stock=book.name, trading_state="T",
                      reserved=" ", reason="")  # fmt: skip
        self.at(MARKET_OPEN - 120 * _SECOND)
        self.imbalances("O")
        self.at(MARKET_OPEN)
        self.emit("S", event_code="Q")
        self.crosses("O")

    def imbalances(self, cross: str) -> None:
        rng = self.rng
        for book in self.books:
            price = book.mid * TICK
            self.emit("I", stock_locate=book.locate, paired_shares=100 * rng.randint(10, 5000),
                      imbalance_shares=100 * rng.randint(0, 500),
                      imbalance_direction=rng.choice("BSNO"), stock=book.name, far_price=price,
                      near_price=price, current_reference_price=price, cross_type=cross,
                      price_variation_indicator=rng.choice("L12 "))  # fmt: skip

    def crosses(self, cross: str) -> None:
        for book in self.books:
            self.emit("Q", stock_locate=book.locate, shares=100 * self.rng.randint(10, 5000),
                      stock=book.name, cross_price=book.mid * TICK,
                      match_number=self.next_match(), cross_type=cross)  # fmt: skip

    def epilogue(self) -> None:
        """Closing imbalances and cross, end of market and system hours, end of messages."""
        self.at(FLOW_END + 60 * _SECOND)
        self.imbalances("C")
        self.at(MARKET_CLOSE)
        self.crosses("C")
        self.emit("S", event_code="M")
        self.at(END_OF_SYSTEM_HOURS)
        self.emit("S", event_code="E")
        self.at(END_OF_SYSTEM_HOURS + 300 * _SECOND)
        self.emit("S", event_code="C")

    def midday(self) -> None:
        """Once: a market-wide circuit breaker status, an operational halt and its lifting."""
        book = self.books[0]
        self.emit("W", breached_level="1")
        self.emit("h", stock_locate=book.locate, stock=book.name, market_code="Q",
                  operational_halt_action="H")  # fmt: skip
        self.now += _SECOND // 1000
        self.emit("h", stock_locate=book.locate, stock=book.name, market_code="Q",
                  operational_halt_action="T")  # fmt: skip
        self.halt_done = True

    # --- continuous trading -----------------------------------------------------------------

    def step(self, halfway: int) -> None:
        """One flow event: an order action on one book, or now and then a market message."""
        rng = self.rng
        self.now = min(FLOW_END, self.now + int(rng.expovariate(1.0) * self.mean_gap))
        if self.left <= halfway and self.left >= 3 and not self.halt_done:
            self.midday()
            return
        book = rng.choices(self.books, self.weights)[0]
        if rng.random() < 0.04:
            book.mid = max(20, book.mid + (1 if rng.random() < 0.5 else -1))
        live = len(book.live)
        if live < 8 or rng.random() < (0.52 if live < 150 else 0.4):
            self.add(book, buy=rng.random() < 0.5)
            return
        action = rng.choices(_ACTIONS, _ACTION_WEIGHTS)[0]
        if action == "delete":
            self.delete(book, self.pick(book))
        elif action == "cancel":
            self.cancel(book, self.pick(book))
        elif action == "replace":
            self.replace(book, self.pick(book))
        elif action == "sweep":
            self.sweep(book, buy=rng.random() < 0.5, shares=100 * rng.randint(1, 8))
        elif action == "execute_with_price":
            self.execute_with_price(book)
        elif action == "hidden_trade":
            self.hidden_trade(book)
        elif action == "broken_trade" and self.matches:
            self.fast("B", book.locate, rng.choice(self.matches))
        else:
            self.fast("N", book.locate, book.stock, rng.choice((b"B", b"S", b"A", b"N")))

    def pick(self, book: Book) -> Order:
        return self.orders[book.live[self.rng.randrange(len(book.live))]]

    def shares(self) -> int:
        rng = self.rng
        if rng.random() < 0.1:
            return rng.randint(1, 99)
        return 100 * rng.choice((1, 1, 1, 2, 2, 3, 5, 10))

    def add(self, book: Book, *, buy: bool) -> None:
        rng = self.rng
        away = int(rng.expovariate(0.35))
        price = book.mid - 1 - away if buy else book.mid + 1 + away
        if rng.random() < 0.02:  # an aggressive limit order, priced through the other side
            best = book.best(not buy)
            if best is not None:
                price = best + rng.randint(0, 3) if buy else max(1, best - rng.randint(0, 3))
        price = max(1, price)
        shares = self.shares()
        opposite = book.best(not buy)
        if opposite is not None and (price >= opposite if buy else price <= opposite):
            shares = self.take(book, buy=buy, shares=shares, limit=price)
            opposite = book.best(not buy)
            if shares == 0 or self.left < 1:
                return
            if opposite is not None and (price >= opposite if buy else price <= opposite):
                return  # out of budget mid-sweep: the remainder is cancelled, never shown
        ref = self.next_ref()
        side = b"B" if buy else b"S"
        if rng.random() < 0.1:
            mpid = rng.choice(_MPIDS)
            self.fast("F", book.locate, ref, side, shares, book.stock, price * TICK, mpid)
        else:
            self.fast("A", book.locate, ref, side, shares, book.stock, price * TICK)
        self.orders[ref] = book.add(ref, buy, price, shares)

    def take(self, book: Book, *, buy: bool, shares: int, limit: int | None) -> int:
        """Execute up to `shares` against the other side from its best price (no worse than
        `limit`), one message per resting order touched, all at this instant: a sweep."""
        while shares and self.left > 1:
            best = book.best(not buy)
            if best is None or (limit is not None and (best > limit if buy else best < limit)):
                break
            order = self.orders[book.first(not buy, best)]
            done = min(shares, order.shares)
            self.fast("E", book.locate, order.ref, done, self.next_match())
            shares -= done
            self.reduce(book, order, done)
        return shares

    def sweep(self, book: Book, *, buy: bool, shares: int) -> None:
        if book.best(not buy) is None:
            self.add(book, buy=buy)
        else:
            self.take(book, buy=buy, shares=shares, limit=None)

    def reduce(self, book: Book, order: Order, shares: int) -> None:
        order.shares -= shares
        if order.shares == 0:
            book.remove(order)
            del self.orders[order.ref]

    def delete(self, book: Book, order: Order) -> None:
        self.fast("D", book.locate, order.ref)
        book.remove(order)
        del self.orders[order.ref]

    def cancel(self, book: Book, order: Order) -> None:
        if order.shares < 2:
            self.delete(book, order)
            return
        cancelled = self.rng.randint(1, order.shares - 1)
        self.fast("X", book.locate, order.ref, cancelled)
        order.shares -= cancelled

    def replace(self, book: Book, order: Order) -> None:
        """Same side, new reference, price and size; never priced through the other side."""
        price = max(1, order.price + self.rng.randint(-3, 3))
        opposite = book.best(not order.buy)
        if opposite is not None:
            price = min(price, opposite - 1) if order.buy else max(price, opposite + 1)
        if price < 1:
            self.delete(book, order)
            return
        ref, shares = self.next_ref(), self.shares()
        self.fast("U", book.locate, order.ref, ref, shares, price * TICK)
        book.remove(order)
        del self.orders[order.ref]
        self.orders[ref] = book.add(ref, order.buy, price, shares)

    def execute_with_price(self, book: Book) -> None:
        """A 'C' execution of the best order of one side, at a price one tick better for the
        taker than the order's, printable or not."""
        buy = self.rng.random() < 0.5
        best = book.best(buy)
        if best is None:
            self.add(book, buy=buy)
            return
        order = self.orders[book.first(buy, best)]
        done = self.rng.randint(1, order.shares)
        printable = b"Y" if self.rng.random() < 0.7 else b"N"
        price = order.price + 1 if not buy else max(1, order.price - 1)
        if price == order.price:
            price += 1
        self.fast("C", book.locate, order.ref, done, self.next_match(), printable, price * TICK)
        self.reduce(book, order, done)

    def hidden_trade(self, book: Book) -> None:
        """A 'P' trade against a hidden order: the visible book does not change."""
        side = b"B" if self.rng.random() < 0.5 else b"S"
        shares, match = self.shares(), self.next_match()
        self.fast("P", book.locate, 0, side, shares, book.stock, book.mid * TICK, match)


class Order:
    """A resting order of the generated flow (prices in ticks)."""

    __slots__ = ("buy", "price", "ref", "shares")

    def __init__(self, ref: int, buy: bool, price: int, shares: int) -> None:
        self.ref = ref
        self.buy = buy
        self.price = price
        self.shares = shares


class Book:
    """One symbol's visible book: price levels of FIFO queues per side, and its live orders in
    a list (with their positions) so that a uniformly random one is picked in O(1)."""

    def __init__(self, locate: int, name: str, mid: int) -> None:
        self.locate = locate
        self.name = name
        self.stock = name.encode("ascii").ljust(8)
        self.mid = mid  # ticks; a random walk the flow is priced around
        self.bids: dict[int, dict[int, None]] = {}
        self.asks: dict[int, dict[int, None]] = {}
        self.live: list[int] = []
        self.where: dict[int, int] = {}

    def best(self, buy: bool) -> int | None:
        """The best bid (buy) or ask price, None when that side is empty."""
        if buy:
            return max(self.bids) if self.bids else None
        return min(self.asks) if self.asks else None

    def first(self, buy: bool, price: int) -> int:
        """The reference of the oldest order at `price` on one side."""
        return next(iter((self.bids if buy else self.asks)[price]))

    def add(self, ref: int, buy: bool, price: int, shares: int) -> Order:
        (self.bids if buy else self.asks).setdefault(price, {})[ref] = None
        self.where[ref] = len(self.live)
        self.live.append(ref)
        return Order(ref, buy, price, shares)

    def remove(self, order: Order) -> None:
        levels = self.bids if order.buy else self.asks
        level = levels[order.price]
        del level[order.ref]
        if not level:
            del levels[order.price]
        at, last = self.where.pop(order.ref), self.live.pop()
        if last != order.ref:
            self.live[at] = last
            self.where[last] = at


_LENGTHS = {letter: framed_struct(letter).size - 2 for letter in "AFECXDUPBN"}
_TYPE = {letter: letter.encode() for letter in _LENGTHS}
