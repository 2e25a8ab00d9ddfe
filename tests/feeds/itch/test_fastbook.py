"""fastbook: the compiled pass gives the pure-Python summary dict for dict (and the same anomaly
counts), on synthetic sessions, on random damaged flows and on one case per policy."""

from __future__ import annotations

import gzip
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("numba")

from directory import R_FIELDS

from duetime.feeds.itch import fastbook
from duetime.feeds.itch.book import ASK, BID, Books
from duetime.feeds.itch.fastbook import FastBook, fast_book_summary
from duetime.feeds.itch.fastbook_tables import _empty_hash, hash_find, hash_remove
from duetime.feeds.itch.parser import ItchFormatError, read_messages
from duetime.feeds.itch.summary import book_summary
from duetime.feeds.itch.synth import session_bytes, write_session
from duetime.feeds.itch.writer import encode, frame


def feed(*messages: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(frame(encode(letter, **fields)) for letter, fields in messages)


def directory(locate: int, symbol: str) -> tuple[str, dict[str, Any]]:
    return "R", {"stock_locate": locate, "timestamp": 1, "stock": symbol, **R_FIELDS}


def add(locate: int, ref: int, side: str, shares: int, price: int, ts: int = 5) -> tuple[str, Any]:
    return "A", {
        "stock_locate": locate,
        "timestamp": ts,
        "order_reference_number": ref,
        "buy_sell_indicator": side,
        "shares": shares,
        "stock": "X",
        "price": price,
    }


def msg(letter: str, locate: int, ref: int, ts: int = 6, **fields: Any) -> tuple[str, Any]:
    key = "original_order_reference_number" if letter == "U" else "order_reference_number"
    return letter, {"stock_locate": locate, "timestamp": ts, key: ref, **fields}


def assert_same(data: bytes) -> FastBook:
    """The fast summary and anomaly counts equal the pure-Python ones; the FastBook."""
    books = Books()
    for message in read_messages(data):
        books.apply(message)
    fast = FastBook(data)
    assert fast.summary() == book_summary(data)
    assert fast.anomalies == books.anomalies.counts
    for locate, book in books.books.items():
        for side in (BID, ASK):
            for price, _, _ in book.depth(side, 1000):
                queue = [(ref, shares) for ref, p, shares in book.orders(side) if p == price]
                assert fast.queue(locate, side, price) == queue
    return fast


# -- whole sessions -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_synthetic_sessions_match_the_python_book(seed: int) -> None:
    data = session_bytes(seed=seed, messages=60_000)
    fast = assert_same(data)
    assert len(fast.changes) > 50_000


def test_gzip_file_and_depth_options(tmp_path: Path) -> None:
    path = tmp_path / "s.itch.gz"
    write_session(path, seed=7, messages=30_000, gzip=True)
    for depth, first in ((1, 10), (5, 1000), (12, 0)):
        want = book_summary(path, depth=depth, first_changes=first)
        assert fast_book_summary(path, depth=depth, first_changes=first) == want


def test_a_depth_past_any_book_lists_every_level() -> None:
    """The levels come out ragged, as deep as each book is: a dense stocks x 2 x depth array
    raised MemoryError for `itch book --depth 10000000` (here 200 stocks: 960 GB)."""
    adds = [add(locate, 10 * locate + k, "BS"[k % 2], 10, 100 + k) for locate in range(1, 201)
            for k in range(5)]  # fmt: skip
    data = feed(*adds)
    want = book_summary(data, depth=10**8)
    assert fast_book_summary(data, depth=10**8) == want
    assert want["stocks"]["#7"]["book"]["bids"] == [[104, 10, 1], [102, 10, 1], [100, 10, 1]]
    assert FastBook(data).depth(7, ASK, 10**8) == [(101, 10, 1), (103, 10, 1)]


def test_tables_grow_mid_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny starting tables: every table doubles many times, resuming where the pass stopped."""
    data = session_bytes(seed=4, messages=20_000)
    want = fast_book_summary(data)
    monkeypatch.setattr(fastbook, "_initial_sizes", lambda nbytes: (2, 2, 2))
    assert fast_book_summary(data) == want


@pytest.mark.parametrize("seed", [5, 6])
def test_books_only_pass_builds_the_same_books(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """record_changes=False keeps no change rows and leaves every book as the full pass does,
    tables growing mid-pass included (a change table of no rows must not ask to grow)."""
    data = session_bytes(seed=seed, messages=20_000) + random_flow(seed, 3000)
    full = FastBook(data)
    monkeypatch.setattr(fastbook, "_initial_sizes", lambda nbytes: (2, 2, 2))
    books = FastBook(data, record_changes=False)
    assert len(books.tables.changes) == 0
    assert books.anomalies == full.anomalies
    assert list(books.locates()) == list(full.locates())
    for locate in [0, *full.locates().tolist()]:
        assert books.counts(locate) == full.counts(locate)
        assert books.symbol(locate) == full.symbol(locate)
        assert books.live_orders(locate) == full.live_orders(locate)
        for side in (BID, ASK):
            levels = full.depth(locate, side, 10**6)
            assert books.depth(locate, side, 10**6) == levels
            for price, _, _ in levels:
                assert books.queue(locate, side, price) == full.queue(locate, side, price)
    for read in (lambda: books.changes, books.summary):
        with pytest.raises(ValueError, match="record_changes=True"):
            read()


def random_flow(seed: int, n: int) -> bytes:
    """Order flow with every kind of damage book.py has a policy for: unknown and reused
    references, oversize and zero-share executions, zero prices, bad sides, locate 0 and
    mismatched locates, crossing adds, replaces onto live references."""
    rng = random.Random(seed)
    out = [directory(1, "AAA"), directory(2, "BB"), directory(5, "AAA"), directory(0, "MKT")]
    live: list[tuple[int, int]] = []
    next_ref = 1 << 62
    ts = 10
    for _ in range(n):
        ts += rng.randrange(1000)
        locate = rng.choice([1, 2, 5, 6, 0]) if rng.random() < 0.05 else rng.choice([1, 2])
        if rng.random() < 0.4 or not live:
            ref = rng.choice(live)[0] if live and rng.random() < 0.02 else next_ref
            next_ref += rng.randrange(1, 1 << 40)
            side = "X" if rng.random() < 0.01 else rng.choice("BS")
            price = 0 if rng.random() < 0.01 else rng.randrange(990, 1010) * 100
            shares = 0 if rng.random() < 0.01 else rng.randrange(1, 500)
            letter, fields = add(locate, ref, side, shares, price, ts)
            if rng.random() < 0.5:
                letter, fields = "F", {**fields, "attribution": "GSCO"}
            out.append((letter, fields))
            live.append((ref, locate))
            continue
        i = rng.randrange(len(live))
        ref, own = live[i]
        ref = rng.randrange(1 << 64) if rng.random() < 0.03 else ref
        locate = locate if rng.random() < 0.03 else own
        shares = rng.randrange(0, 300)
        letter = rng.choice("ECXDU")
        if letter == "E":
            out.append(msg("E", locate, ref, ts, executed_shares=shares, match_number=1))
        elif letter == "C":
            out.append(msg("C", locate, ref, ts, executed_shares=shares, match_number=1,
                           printable="Y", execution_price=12345))  # fmt: skip
        elif letter == "X":
            out.append(msg("X", locate, ref, ts, cancelled_shares=shares))
        elif letter == "D":
            out.append(msg("D", locate, ref, ts))
            live.pop(i)
        else:
            new = rng.choice(live)[0] if rng.random() < 0.05 else next_ref
            next_ref += 1
            price = 0 if rng.random() < 0.02 else rng.randrange(990, 1010) * 100
            out.append(msg("U", locate, ref, ts, new_order_reference_number=new, shares=shares,
                           price=price))  # fmt: skip
            live[i] = (new, own)
        if rng.random() < 0.02:
            out.append(("P", {"stock_locate": locate, "timestamp": ts, "order_reference_number": 0,
                              "buy_sell_indicator": "B", "shares": 5, "stock": "X",
                              "price": 100, "match_number": 2}))  # fmt: skip
    return feed(*out)


@pytest.mark.parametrize("seed", range(4))
def test_random_damaged_flows_match_the_python_book(seed: int) -> None:
    fast = assert_same(random_flow(seed, 8000))
    assert set(fast.anomalies) >= {"unknown_ref", "duplicate_ref", "oversize", "crossed"}


# -- one case per rule ------------------------------------------------------------------------

CASES: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "fifo_and_levels": [add(1, 1, "B", 100, 100), add(1, 2, "B", 50, 100), add(1, 3, "B", 10, 99),
                        add(1, 4, "S", 70, 101), add(1, 5, "S", 5, 103), add(1, 6, "S", 5, 102)],
    "execute_keeps_queue": [add(1, 1, "B", 100, 100), add(1, 2, "B", 50, 100),
                            msg("E", 1, 1, executed_shares=30, match_number=1),
                            msg("C", 1, 2, executed_shares=50, match_number=2, printable="N",
                                execution_price=7)],
    "cancel_and_delete": [add(1, 1, "S", 100, 100), add(1, 2, "S", 50, 100),
                          msg("X", 1, 1, cancelled_shares=99), msg("D", 1, 2),
                          msg("X", 1, 1, cancelled_shares=1)],
    "replace_to_back_of_new_level": [add(1, 1, "B", 100, 100), add(1, 2, "B", 50, 101),
                                     msg("U", 1, 1, new_order_reference_number=3, shares=20,
                                         price=101)],
    "replace_same_reference": [add(1, 1, "B", 100, 100),
                               msg("U", 1, 1, new_order_reference_number=1, shares=5, price=98)],
    "unknown_ref": [msg("E", 1, 9, executed_shares=1, match_number=1), msg("D", 1, 9),
                    msg("U", 1, 9, new_order_reference_number=3, shares=20, price=101)],
    "duplicate_add_evicts_other_stock": [add(1, 1, "B", 100, 100), add(2, 1, "S", 5, 50)],
    "duplicate_replace": [add(1, 1, "B", 100, 100), add(2, 2, "S", 5, 50),
                          msg("U", 1, 1, new_order_reference_number=2, shares=20, price=101)],
    "oversize_clamps": [add(1, 1, "B", 100, 100), msg("E", 1, 1, executed_shares=500,
                                                      match_number=1)],
    "zero_shares": [add(1, 1, "B", 0, 100), add(1, 2, "B", 10, 100),
                    msg("X", 1, 2, cancelled_shares=0),
                    msg("U", 1, 2, new_order_reference_number=3, shares=0, price=100)],
    "zero_price_and_bad_side": [add(1, 1, "B", 10, 0), add(1, 2, "Q", 10, 100),
                                add(1, 3, "S", 10, 100),
                                msg("U", 1, 3, new_order_reference_number=4, shares=5, price=0)],
    "market_locate": [add(0, 1, "B", 10, 100), add(1, 2, "B", 10, 100), msg("D", 0, 2)],
    "locate_mismatch": [add(1, 1, "B", 10, 100), msg("X", 2, 1, cancelled_shares=3)],
    "crossed": [add(1, 1, "B", 10, 100), add(1, 2, "S", 10, 100), add(1, 3, "S", 10, 99),
                add(1, 4, "S", 10, 101)],
    "references_above_2_63": [add(1, (1 << 64) - 1, "B", 10, 100), add(1, 1 << 63, "S", 1, 200),
                              msg("E", 1, (1 << 64) - 1, executed_shares=10, match_number=1)],
    "directory_edge_cases": [directory(3, "AB"), directory(3, "ABC"), directory(4, "ABC"),
                             ("S", {"timestamp": 1, "event_code": "O"}),
                             ("H", {"stock_locate": 9, "timestamp": 2, "stock": "Z",
                                    "trading_state": "T", "reserved": " ", "reason": ""}),
                             add(3, 1, "B", 10, 100), add(4, 2, "B", 10, 100)],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_policy_cases(name: str) -> None:
    assert_same(feed(directory(1, "A"), directory(2, "B"), *CASES[name]))


def test_readers() -> None:
    data = feed(directory(1, "A"), *CASES["fifo_and_levels"])
    fast = FastBook(data)
    assert fast.depth(1, BID, 5) == [(100, 150, 2), (99, 10, 1)]
    assert fast.depth(1, ASK, 2) == [(101, 70, 1), (102, 5, 1)]
    assert fast.top(1) == (100, 150, 101, 70)
    assert fast.top(2) == (None, 0, None, 0)
    assert fast.queue(1, BID, 100) == [(1, 100), (2, 50)]
    assert fast.queue(1, BID, 12345) == []
    assert fast.live_orders(1) == 6
    assert fast.counts(1) == {"A": 6, "R": 1}
    assert fast.symbol(1) == "A"
    assert fast.symbol(2) == ""


# -- framing errors ------------------------------------------------------------------------------


def damaged() -> Iterator[tuple[str, bytes]]:
    good = feed(directory(1, "A"), add(1, 1, "B", 10, 100), add(1, 2, "S", 10, 101))
    yield "unknown_type", good[:41] + frame(b"Z" + bytes(10)) + good[41:]
    yield "bad_length", good[:41] + frame(b"D" + bytes(10)) + good[41:]
    yield "zero_length", good[:41] + b"\x00\x00" + good[41:]
    yield "zero_length", good + b"\x00\x00"  # (complete, and the last two bytes)
    yield "truncated", good + good[41:60]
    yield "truncated", good + b"\x00"


@pytest.mark.parametrize(("reason", "data"), list(damaged()))
def test_bad_frames_follow_the_parser(reason: str, data: bytes) -> None:
    with pytest.raises(ItchFormatError) as want:
        book_summary(data)
    with pytest.raises(ItchFormatError) as got:
        fast_book_summary(data)
    assert (got.value.offset, got.value.reason) == (want.value.offset, want.value.reason)
    assert got.value.reason == reason
    assert fast_book_summary(data, on_error="skip") == book_summary(data, on_error="skip")
    reader = read_messages(data, on_error="skip")
    list(reader)
    frames = [e for e in reader.errors if e.reason != "truncated"]
    fast = FastBook(data, on_error="skip")
    assert fast.skipped == len(frames)
    count, first = fast.skipped_parts()  # (as `itch book` says them)
    assert (count, str(first)) == (reader.skipped, str(reader.errors[0]))


def damaged_gzip() -> dict[str, bytes]:
    """gzip files damaged after intact frames (for both paths to read alike)."""
    good = feed(directory(1, "A"), *[add(1, ref, "B", 10, 100 + ref) for ref in range(1, 40)])
    packed = gzip.compress(good, mtime=0)
    return {
        "junk after": packed + b"JUNK",
        "no trailer": packed[:-8],
        "cut in a frame": gzip.compress(good[:-7], mtime=0)[:-8],
        "a bad frame first": gzip.compress(good[:41] + b"\x00\x00" + good[41:], mtime=0) + b"JUNK",
    }


@pytest.mark.parametrize("name", list(damaged_gzip()))
def test_a_damaged_gzip_file_follows_the_parser(name: str) -> None:
    """Same messages and the same bad_gzip error as `read_messages`: raised with "stop" after
    any bad frame before it, and recorded with "skip" (the pass read what was decompressed)."""
    data = damaged_gzip()[name]
    with pytest.raises(ItchFormatError) as want:
        book_summary(data)
    with pytest.raises(ItchFormatError) as got:
        fast_book_summary(data)
    assert (got.value.offset, got.value.reason) == (want.value.offset, want.value.reason)
    assert got.value.reason == ("zero_length" if name == "a bad frame first" else "bad_gzip")
    summary = book_summary(data, on_error="skip")
    assert summary["stocks"]["A"]["live_orders"] > 0
    assert fast_book_summary(data, on_error="skip") == summary
    reader = read_messages(data, on_error="skip")
    list(reader)
    fast = FastBook(data, on_error="skip")
    gzip_errors = [e for e in reader.errors if e.reason == "bad_gzip"]
    assert fast.gzip_error is not None
    assert [(fast.gzip_error.reason, fast.gzip_error.offset)] == [
        (e.reason, e.offset) for e in gzip_errors
    ]
    assert fast.skipped == sum(e.reason not in ("bad_gzip", "truncated") for e in reader.errors)
    count, first = fast.skipped_parts()
    assert (count, str(first)) == (reader.skipped, str(reader.errors[0]))
    with pytest.raises(ItchFormatError, match="damaged or cut short"):
        fastbook.load_buffer(data)


def test_two_locates_with_one_symbol_keep_both_records() -> None:
    """The lowest locate keeps the symbol; another one with it is keyed symbol@locate, as is a
    `#<locate>` key a symbol took first."""
    data = feed(directory(3, "AAPL"), add(3, 1, "B", 10, 100), directory(2, "#9"),
                directory(5, "AAPL"), add(5, 2, "S", 5, 200), add(5, 3, "S", 5, 201),
                add(9, 4, "B", 1, 1), directory(1, "AAPL@5"))  # fmt: skip
    summary = assert_same(data).summary()
    keys = {key: entry["locate"] for key, entry in summary["stocks"].items()}
    assert keys == {"AAPL@5": 1, "#9": 2, "AAPL": 3, "AAPL@5@5": 5, "#9@9": 9}
    assert summary["stocks"]["AAPL@5@5"]["live_orders"] == 2


def test_symbols_lose_only_their_trailing_spaces() -> None:
    """Alpha fields are left-justified: " LEAD" was keyed "LEAD". An all-space symbol (here
    after a real one: the last R message wins) is no symbol: `#<locate>`, as with no R."""
    data = feed(directory(1, "AAPL"), add(1, 1, "B", 1, 1), directory(1, " " * 8),
                directory(2, " LEAD"), add(2, 2, "B", 1, 1), add(3, 3, "B", 1, 1))  # fmt: skip
    fast = assert_same(data)
    assert [fast.symbol(locate) for locate in (1, 2, 3)] == ["", " LEAD", ""]
    keys = {key: entry["locate"] for key, entry in fast.summary()["stocks"].items()}
    assert keys == {"#1": 1, " LEAD": 2, "#3": 3}


def test_first_changes_must_not_be_negative() -> None:
    """A negative count once listed other stocks' rows (a slice of the shared change table)."""
    data = feed(add(1, 1, "B", 10, 100), add(2, 2, "B", 20, 200))
    for call in (
        lambda: fast_book_summary(data, first_changes=-1),
        lambda: FastBook(data).summary(first_changes=-1),
        lambda: book_summary(data, first_changes=-1),
    ):
        with pytest.raises(ValueError, match="first_changes must be 0 or more, got -1"):
            call()
    assert fast_book_summary(data, first_changes=0) == book_summary(data, first_changes=0)


def test_on_error_is_checked() -> None:
    with pytest.raises(ValueError, match="on_error"):
        FastBook(b"", on_error="ignore")  # type: ignore[arg-type]


# -- the hash table ------------------------------------------------------------------------------


def test_hash_table_against_a_dict() -> None:
    """Inserts and backward-shift deletes on a small table, so probe runs wrap around."""
    rng = random.Random(0)
    table = _empty_hash(16)
    mirror: dict[int, int] = {}
    for step in range(20_000):
        key = rng.randrange(-50, 50) * 7919 + (1 << 62) * rng.randrange(2)
        slot = hash_find(table, key)
        if slot >= 0:
            assert mirror.pop(key) == table[slot, 1]
            hash_remove(table, slot)
        elif len(mirror) < 16:
            table[-1 - slot] = (key, step)
            mirror[key] = step
        live = table[table[:, 1] >= 0]
        assert dict(zip(live[:, 0].tolist(), live[:, 1].tolist(), strict=True)) == mirror
    for key, row in mirror.items():
        assert table[hash_find(table, key), 1] == row
    assert np.count_nonzero(table[:, 1] >= 0) == len(mirror)


# -- deep books: the level tree ------------------------------------------------------------------


def deep_flow(seed: int, n: int) -> bytes:
    """Two stocks whose books hold thousands of levels, new ones at random prices across the
    whole range (placed by the tree, not the walk) and levels emptied anywhere in the book."""
    rng = random.Random(seed)
    out = [directory(1, "AAA"), directory(2, "BB")]
    live: list[tuple[int, int]] = []
    for ref in range(1, n + 1):
        locate = rng.choice([1, 2])
        if rng.random() < 0.7 or not live:
            price = rng.randrange(1, 6000) * 100
            out.append(add(locate, ref, rng.choice("BS"), rng.randrange(1, 500), price, ref))
            live.append((ref, locate))
            continue
        old, own = live.pop(rng.randrange(len(live)))
        letter = rng.choice("DEXU")
        if letter == "D":
            out.append(msg("D", own, old, ref))
        elif letter == "U":
            price = rng.randrange(1, 6000) * 100
            out.append(msg("U", own, old, ref, new_order_reference_number=ref, shares=7,
                           price=price))  # fmt: skip
            live.append((ref, own))
        else:
            field = "executed_shares" if letter == "E" else "cancelled_shares"
            extra = {"match_number": 1} if letter == "E" else {}
            out.append(msg(letter, own, old, ref, **{field: rng.randrange(1, 600)}, **extra))
    return feed(*out)


def check_level_trees(fast: FastBook) -> None:
    """Each book's tree holds its levels in price order (in order: the linked list, best to
    worst), its parent links agree, and no node outranks its parent."""
    from duetime.feeds.itch.fastbook_kernel import _priority
    from duetime.feeds.itch.fastbook_tables import BEST, L_WORSE, T_LEFT, T_RIGHT, T_UP

    t = fast.tables
    tree = t.level_tree
    for book in np.flatnonzero(t.ends[:, BEST] >= 0).tolist():
        listed = []
        lv = int(t.ends[book, BEST])
        while lv >= 0:
            listed.append(lv)
            lv = int(t.levels[lv, L_WORSE])
        root = listed[0]
        while tree[root, T_UP] >= 0:
            root = int(tree[root, T_UP])
        in_order: list[int] = []
        stack: list[int] = []
        node = root
        while stack or node >= 0:
            while node >= 0:
                stack.append(node)
                node = int(tree[node, T_LEFT])
            node = stack.pop()
            in_order.append(node)
            for child in (tree[node, T_LEFT], tree[node, T_RIGHT]):
                if child >= 0:
                    assert tree[child, T_UP] == node
                    assert _priority(int(child)) < _priority(node)
            node = int(tree[node, T_RIGHT])
        assert in_order == listed


@pytest.mark.parametrize("seed", range(3))
def test_deep_books_match_the_python_book(seed: int) -> None:
    data = deep_flow(seed, 12_000)
    fast = FastBook(data)
    summary = fast.summary(depth=10_000)
    assert summary == book_summary(data, depth=10_000)
    assert len(summary["stocks"]["AAA"]["book"]["bids"]) > 500
    check_level_trees(fast)
