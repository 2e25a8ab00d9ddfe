"""OrderBook / Books: every operation and every policy case on hand-built message sequences."""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import pytest

from duetime.feeds.itch import spec
from duetime.feeds.itch.book import ANOMALY_KINDS, ASK, BID, REJECTING, BookError, BookEvent, Books

AAPL, MSFT = 1, 2


def directory(locate: int, symbol: str) -> spec.StockDirectory:
    return spec.StockDirectory(
        "R", locate, 0, 1, symbol, "Q", "N", 100, "N", "C", "Z", "P", "N", " ", "1", "N", 0, "N"
    )


def add(ref: int, side: str, shares: int, price: int, locate: int = AAPL, ts: int = 10) -> Any:
    return spec.AddOrder("A", locate, 0, ts, ref, side, shares, "AAPL", price)


def add_mpid(ref: int, side: str, shares: int, price: int, locate: int = AAPL) -> Any:
    return spec.AddOrderMpid("F", locate, 0, 11, ref, side, shares, "AAPL", price, "GSCO")


def execute(ref: int, shares: int, locate: int = AAPL, ts: int = 20) -> Any:
    return spec.OrderExecuted("E", locate, 0, ts, ref, shares, 7)


def execute_price(ref: int, shares: int, price: int, locate: int = AAPL) -> Any:
    return spec.OrderExecutedWithPrice("C", locate, 0, 21, ref, shares, 8, "Y", price)


def cancel(ref: int, shares: int, locate: int = AAPL) -> Any:
    return spec.OrderCancel("X", locate, 0, 22, ref, shares)


def delete(ref: int, locate: int = AAPL) -> Any:
    return spec.OrderDelete("D", locate, 0, 23, ref)


def replace(old: int, new: int, shares: int, price: int, locate: int = AAPL) -> Any:
    return spec.OrderReplace("U", locate, 0, 24, old, new, shares, price)


def run(*messages: Any, strict: bool = False) -> tuple[Books, list[BookEvent | None]]:
    books = Books(strict=strict)
    books.apply(directory(AAPL, "AAPL"))
    books.apply(directory(MSFT, "MSFT"))
    return books, [books.apply(m) for m in messages]


def side_of(books: Books, locate: int = AAPL) -> tuple[list[Any], list[Any]]:
    book = books.books[locate]
    return book.depth(BID, 10), book.depth(ASK, 10)


# -- operations ---------------------------------------------------------------------------------


def test_adds_build_levels_best_first_with_fifo_queues() -> None:
    books, events = run(
        add(1, "B", 100, 100_0000),
        add(2, "B", 50, 101_0000),
        add(3, "B", 30, 100_0000),
        add(4, "S", 10, 103_0000),
        add_mpid(5, "S", 20, 102_0000),
        add(6, "S", 5, 102_0000),
    )
    book = books.books[AAPL]
    assert book.symbol == "AAPL"
    assert book.depth(BID, 5) == [(101_0000, 50, 1), (100_0000, 130, 2)]
    assert book.depth(ASK, 5) == [(102_0000, 25, 2), (103_0000, 10, 1)]
    assert book.depth(BID, 1) == [(101_0000, 50, 1)]
    assert book.depth(BID, 0) == []
    assert book.best_bid() == (101_0000, 50, 1)
    assert book.best_ask() == (102_0000, 25, 2)
    assert book.top() == (101_0000, 50, 102_0000, 25)
    assert book.live_orders == books.live_orders == 6
    assert book.queue_ahead(1) == 0
    assert book.queue_ahead(3) == 100
    assert book.queue_ahead(6) == 20
    assert [e.kind for e in events if e] == ["A", "A", "A", "A", "F", "A"]
    assert events[0] == BookEvent(10, AAPL, "A", BID, 100_0000, 100, 0, 0, 0, True)
    assert [e.top_changed for e in events if e] == [True, True, False, True, True, True]
    assert list(book.orders(BID)) == [(2, 101_0000, 50), (1, 100_0000, 100), (3, 100_0000, 30)]


def test_empty_book_reads() -> None:
    books, _ = run()
    book = books.books[AAPL]
    assert book.best_bid() is None
    assert book.best_ask() is None
    assert book.depth(BID, 5) == []
    assert book.top() == (None, 0, None, 0)
    assert not book.crossed()
    with pytest.raises(KeyError):
        book.queue_ahead(1)


def test_execute_reduces_then_removes_the_order() -> None:
    books, events = run(
        add(1, "S", 100, 50_0000), add(2, "S", 40, 50_0000), execute(1, 30), execute(1, 70)
    )
    assert events[2] == BookEvent(20, AAPL, "E", ASK, 50_0000, -30, 30, 50_0000, 0, True)
    assert side_of(books) == ([], [(50_0000, 40, 1)])
    assert books.books[AAPL].order(1) is None
    assert books.books[AAPL].queue_ahead(2) == 0
    assert events[3] is not None
    assert events[3].shares == -70


def test_execute_with_price_prints_at_the_message_price() -> None:
    books, events = run(add(1, "B", 100, 50_0000), execute_price(1, 40, 49_9900))
    assert events[1] == BookEvent(21, AAPL, "C", BID, 50_0000, -40, 40, 49_9900, 0, True)
    assert side_of(books) == ([(50_0000, 60, 1)], [])


def test_cancel_keeps_queue_position() -> None:
    books, events = run(add(1, "B", 100, 10_0000), add(2, "B", 100, 10_0000), cancel(1, 60))
    book = books.books[AAPL]
    assert events[2] == BookEvent(22, AAPL, "X", BID, 10_0000, -60, 0, 0, 0, True)
    assert book.queue_ahead(2) == 40
    assert book.order(1) == (BID, 10_0000, 40)


def test_delete_removes_the_level_when_empty() -> None:
    books, events = run(add(1, "B", 100, 10_0000), add(2, "B", 100, 9_0000), delete(1))
    assert events[2] == BookEvent(23, AAPL, "D", BID, 10_0000, -100, 0, 0, 0, True)
    assert side_of(books) == ([(9_0000, 100, 1)], [])
    books2, events2 = run(add(1, "B", 100, 10_0000), add(2, "B", 100, 9_0000), delete(2))
    assert events2[2] is not None
    assert not events2[2].top_changed
    assert side_of(books2) == ([(10_0000, 100, 1)], [])


def test_replace_moves_to_the_back_at_the_new_price_same_side() -> None:
    books, events = run(
        add(1, "S", 100, 20_0000),
        add(2, "S", 100, 20_0000),
        add(3, "S", 50, 21_0000),
        replace(1, 10, 80, 21_0000),
    )
    book = books.books[AAPL]
    assert events[3] == BookEvent(24, AAPL, "U", ASK, 21_0000, 80, 0, 0, 20_0000, True, 100)
    assert book.order(1) is None
    assert book.order(10) == (ASK, 21_0000, 80)
    assert book.queue_ahead(10) == 50
    assert book.depth(ASK, 5) == [(20_0000, 100, 1), (21_0000, 130, 2)]


def test_replace_at_the_same_price_loses_priority() -> None:
    books, events = run(
        add(1, "B", 100, 20_0000), add(2, "B", 100, 20_0000), replace(1, 3, 100, 20_0000)
    )
    book = books.books[AAPL]
    assert book.queue_ahead(3) == 100
    assert book.queue_ahead(2) == 0
    assert events[2] is not None
    assert not events[2].top_changed


def test_top_changed_only_when_the_best_level_moves() -> None:
    books, events = run(
        add(1, "B", 100, 10_0000),
        add(2, "B", 100, 9_0000),  # behind the best
        cancel(2, 10),  # behind the best
        add(3, "S", 100, 11_0000),
        replace(2, 4, 90, 8_0000),  # deep to deeper
        replace(4, 5, 90, 10_5000),  # deep to a new best
    )
    assert [e.top_changed for e in events if e] == [True, False, False, True, False, True]
    assert books.books[AAPL].top() == (10_5000, 90, 11_0000, 100)


def test_trade_and_counts() -> None:
    trade = spec.Trade("P", AAPL, 0, 30, 0, "S", 300, "AAPL", 12_3400, 9)
    cross = spec.CrossTrade("Q", AAPL, 0, 31, 1000, "AAPL", 12_0000, 10, "O")
    broken = spec.BrokenTrade("B", AAPL, 0, 32, 9)
    system = spec.SystemEvent("S", 0, 0, 0, "O")
    books, events = run(
        system, trade, cross, broken, add(1, "B", 1, 1), add(2, "B", 1, 1, locate=MSFT)
    )
    assert events[0] is None
    assert events[1] == BookEvent(30, AAPL, "P", ASK, 12_3400, 0, 300, 12_3400, 0, False)
    assert events[2] is None
    assert events[3] is None
    assert side_of(books) == ([(1, 1, 1)], [])  # the trades left the book alone
    assert dict(books.market_counts) == {"S": 1}
    assert dict(books.books[AAPL].counts) == {"R": 1, "P": 1, "Q": 1, "B": 1, "A": 1}
    assert dict(books.books[MSFT].counts) == {"R": 1, "A": 1}
    assert books.messages == 8


def test_a_trade_of_locate_0_is_only_counted() -> None:
    """Locate 0 is market-wide: its trade made `itch run` build a book '#0' and predict for it."""
    trade = spec.Trade("P", 0, 0, 30, 0, "S", 300, "AAPL", 12_3400, 9)
    books, events = run(trade)
    assert events == [None]
    assert 0 not in books.books
    assert dict(books.market_counts) == {"P": 1}


def test_locates_without_a_directory_get_a_book() -> None:
    books = Books()
    books.apply(add(1, "B", 10, 1_0000, locate=9))
    assert books.books[9].symbol == ""
    assert books.books[9].best_bid() == (1_0000, 10, 1)


# -- policy ---------------------------------------------------------------------------------------


def anomalies(books: Books) -> dict[str, int]:
    return dict(books.anomalies.counts)


def test_unknown_reference_is_ignored() -> None:
    msgs = [execute(9, 1), execute_price(9, 1, 1), cancel(9, 1), delete(9), replace(9, 10, 1, 1)]
    books, events = run(add(1, "B", 5, 1_0000), *msgs)
    assert events[1:] == [None] * 5
    assert anomalies(books) == {"unknown_ref": 5}
    assert books.anomalies.samples["unknown_ref"][0] == (3, 20, AAPL, 9)
    assert side_of(books) == ([(1_0000, 5, 1)], [])
    assert books.anomalies.as_dict()["unknown_ref"]["count"] == 5


def test_anomaly_samples_are_capped() -> None:
    books = Books(keep_samples=2)
    for ref in range(5):
        books.apply(delete(100 + ref))
    assert books.anomalies.counts == {"unknown_ref": 5}
    assert [s.ref for s in books.anomalies.samples["unknown_ref"]] == [100, 101]
    assert books.anomalies.as_dict() == {
        "unknown_ref": {"count": 5, "samples": [[0, 23, AAPL, 100], [1, 23, AAPL, 101]]}
    }


def test_duplicate_add_evicts_the_stale_order() -> None:
    books, events = run(
        add(1, "B", 100, 10_0000), add(2, "B", 10, 9_0000), add(1, "S", 50, 12_0000)
    )
    assert anomalies(books) == {"duplicate_ref": 1}
    assert side_of(books) == ([(9_0000, 10, 1)], [(12_0000, 50, 1)])
    assert events[2] == BookEvent(10, AAPL, "A", ASK, 12_0000, 50, 0, 0, 0, True)
    assert books.live_orders == 2


def test_duplicate_add_in_another_stock_evicts_there() -> None:
    books, events = run(add(1, "B", 100, 10_0000), add(1, "B", 7, 5_0000, locate=MSFT))
    assert anomalies(books) == {"duplicate_ref": 1}
    assert books.books[AAPL].live_orders == 0
    assert books.books[MSFT].order(1) == (BID, 5_0000, 7)
    assert events[1] is not None
    assert events[1].locate == MSFT


def test_replace_onto_a_live_reference_evicts_it() -> None:
    books, events = run(
        add(1, "B", 100, 10_0000), add(2, "S", 10, 11_0000), replace(1, 2, 50, 10_1000)
    )
    assert anomalies(books) == {"duplicate_ref": 1}
    assert side_of(books) == ([(10_1000, 50, 1)], [])
    assert events[2] is not None
    assert events[2].top_changed


def test_replace_keeping_its_reference_is_plain() -> None:
    books, _ = run(add(1, "B", 100, 10_0000), replace(1, 1, 50, 10_1000))
    assert anomalies(books) == {}
    assert books.books[AAPL].order(1) == (BID, 10_1000, 50)


@pytest.mark.parametrize(
    ("message", "kind", "shares"),
    [
        (execute(1, 150), "oversize", 100),
        (execute_price(1, 101, 1_0000), "oversize", 100),
        (cancel(1, 1000), "oversize", 100),
    ],
)
def test_oversize_removal_is_clamped(message: Any, kind: str, shares: int) -> None:
    books, events = run(add(1, "B", 100, 10_0000), message)
    assert anomalies(books) == {kind: 1}
    assert side_of(books) == ([], [])
    event = events[1]
    assert event is not None
    assert event.shares == -shares
    if event.kind != "X":
        assert event.trade_shares == message.executed_shares


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (add(2, "B", 0, 10_0000), "zero_shares"),
        (add(2, "B", 10, 0), "zero_price"),
        (add(2, "X", 10, 10_0000), "bad_side"),
        (add(2, "B", 10, 10_0000, locate=0), "market_locate"),
        (execute(1, 0), "zero_shares"),
        (execute_price(1, 0, 1), "zero_shares"),
        (cancel(1, 0), "zero_shares"),
    ],
)
def test_rejected_messages_change_nothing(message: Any, kind: str) -> None:
    books, events = run(add(1, "B", 100, 10_0000), message)
    assert events[1] is None
    assert kind in REJECTING
    assert anomalies(books) == {kind: 1}
    assert side_of(books) == ([(10_0000, 100, 1)], [])
    assert books.live_orders == 1


@pytest.mark.parametrize(
    ("shares", "price", "kind"), [(0, 10_0000, "zero_shares"), (5, 0, "zero_price")]
)
def test_replace_with_nothing_to_add_still_removes_the_original(
    shares: int, price: int, kind: str
) -> None:
    books, events = run(add(1, "B", 100, 10_0000), replace(1, 2, shares, price))
    assert anomalies(books) == {kind: 1}
    assert side_of(books) == ([], [])
    assert events[1] == BookEvent(24, AAPL, "U", BID, price, 0, 0, 0, 10_0000, True, 100)


def test_locate_mismatch_trusts_the_reference() -> None:
    books, events = run(add(1, "B", 100, 10_0000), execute(1, 10, locate=MSFT), delete(1, locate=0))
    assert anomalies(books) == {"locate_mismatch": 2}
    assert events[1] is not None
    assert events[1].locate == AAPL
    assert events[1].shares == -10
    assert books.books[AAPL].live_orders == 0
    assert books.books[MSFT].counts["E"] == 1
    assert books.market_counts["D"] == 1


def test_crossed_book_is_applied_and_counted() -> None:
    books, events = run(
        add(1, "B", 100, 10_0000),
        add(2, "S", 100, 10_0000),  # locked
        add(3, "S", 100, 9_0000),  # crossed
        add(4, "S", 100, 12_0000),  # deep: not counted again
        replace(4, 5, 10, 8_0000),  # joins the best: counted
    )
    assert anomalies(books) == {"crossed": 3}
    assert books.books[AAPL].crossed()
    assert all(e is not None for e in events)


def test_crossed_does_not_raise_in_strict_mode() -> None:
    books, _ = run(add(1, "B", 100, 10_0000), add(2, "S", 100, 9_0000), strict=True)
    assert anomalies(books) == {"crossed": 1}


@pytest.mark.parametrize(
    ("setup", "message", "kind"),
    [
        ([], execute(9, 1), "unknown_ref"),
        ([], replace(9, 10, 1, 1), "unknown_ref"),
        ([add(2, "S", 1, 20_0000)], add(2, "B", 1, 1), "duplicate_ref"),
        ([add(2, "S", 1, 20_0000)], replace(1, 2, 1, 1), "duplicate_ref"),
        ([], execute(1, 101), "oversize"),
        ([], cancel(1, 0), "zero_shares"),
        ([], add(3, "B", 0, 1), "zero_shares"),
        ([], replace(1, 3, 0, 1), "zero_shares"),
        ([], replace(1, 3, 1, 0), "zero_price"),
        ([], delete(1, locate=MSFT), "locate_mismatch"),
        ([], add(3, "?", 1, 1), "bad_side"),
        ([], add(3, "B", 1, 1, locate=0), "market_locate"),
    ],
)
def test_strict_mode_raises_before_changing_anything(
    setup: list[Any], message: Any, kind: str
) -> None:
    books, _ = run(add(1, "B", 100, 10_0000), *setup, strict=True)
    before = [side_of(books, AAPL), side_of(books, MSFT), books.live_orders]
    with pytest.raises(BookError) as info:
        books.apply(message)
    assert info.value.kind == kind
    assert kind in ANOMALY_KINDS
    assert "strict=False" in str(info.value)
    assert [side_of(books, AAPL), side_of(books, MSFT), books.live_orders] == before
    assert not books.anomalies


# -- against a naive model ------------------------------------------------------------------------


def naive_depth(orders: dict[int, list[Any]], side: int) -> list[tuple[int, int, int]]:
    levels: dict[int, list[int]] = {}
    for o_side, price, shares in orders.values():
        if o_side == side:
            level = levels.setdefault(price, [0, 0])
            level[0] += shares
            level[1] += 1
    prices = sorted(levels, reverse=side == BID)
    return [(p, levels[p][0], levels[p][1]) for p in prices]


def random_flow(seed: int, n: int) -> Iterable[Any]:
    rng = random.Random(seed)
    live: dict[int, int] = {}
    next_ref = 1
    for _ in range(n):
        if not live or rng.random() < 0.4:
            side = rng.choice("BS")
            price = (100 - rng.randint(0, 6) if side == "B" else 101 + rng.randint(0, 6)) * 100
            shares = rng.randint(1, 5) * 100
            live[next_ref] = shares
            yield add(next_ref, side, shares, price)
            next_ref += 1
            continue
        ref = rng.choice(list(live))
        what = rng.random()
        if what < 0.3:
            del live[ref]
            yield delete(ref)
        elif what < 0.5:
            n_shares = rng.randint(1, live[ref])
            live[ref] -= n_shares
            if not live[ref]:
                del live[ref]
            yield execute(ref, n_shares) if what < 0.4 else cancel(ref, n_shares)
        else:
            shares = rng.randint(1, 5) * 100
            del live[ref]
            live[next_ref] = shares
            yield replace(ref, next_ref, shares, rng.randint(95, 106) * 100)
            next_ref += 1


@pytest.mark.parametrize("seed", [1, 2])
def test_depth_matches_a_naive_model_after_every_message(seed: int) -> None:
    books = Books()
    orders: dict[int, list[Any]] = {}
    for msg in random_flow(seed, 3000):
        books.apply(msg)
        if msg.type == "A":
            orders[msg.order_reference_number] = [
                _side(msg.buy_sell_indicator),
                msg.price,
                msg.shares,
            ]
        elif msg.type == "D":
            del orders[msg.order_reference_number]
        elif msg.type in "EX":
            order = orders[msg.order_reference_number]
            order[2] -= msg.executed_shares if msg.type == "E" else msg.cancelled_shares
            if not order[2]:
                del orders[msg.order_reference_number]
        elif msg.type == "U":
            side = orders.pop(msg.original_order_reference_number)[0]
            orders[msg.new_order_reference_number] = [side, msg.price, msg.shares]
        book = books.books[AAPL]
        assert book.depth(BID, 100) == naive_depth(orders, BID)
        assert book.depth(ASK, 100) == naive_depth(orders, ASK)
    assert books.live_orders == len(orders)
    assert set(books.anomalies.counts) <= {"crossed"}


def _side(indicator: str) -> int:
    return BID if indicator == "B" else ASK
