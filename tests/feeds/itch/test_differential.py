"""duetime's book summary against independent ITCH book builders on generated sessions.

itch-book (C++) and itchcpp give the whole summary (oracle.py says which field comes from
where); meatpy's pure-Python L3 book checks the final depth and live orders a second time.
Sessions come from synth.write_session: several seeds, 64-bit references, 1- and 8-character
symbols, plain and gzip. A damaged copy of a session (lost, repeated and altered messages)
checks that the documented policy matches itch-book's on every invalid flow it shares.

`DUETIME_ITCH_MESSAGES=1000000` runs the same tests on bigger sessions (default 150k).
"""

from __future__ import annotations

import importlib.util
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("itch_book")
pytest.importorskip("itchcpp")

import oracle
from directory import R_FIELDS

from duetime.feeds.itch.parser import read_messages
from duetime.feeds.itch.summary import summarize
from duetime.feeds.itch.synth import write_session
from duetime.feeds.itch.writer import ItchWriter, encode

MESSAGES = int(os.environ.get("DUETIME_ITCH_MESSAGES", "150000"))
SESSIONS = [(1, False), (2, True), (3, False)]  # (seed, gzip)


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    folder = tmp_path_factory.mktemp("itch")
    paths = {}
    for seed, gz in SESSIONS:
        path = folder / f"seed{seed}.itch{'.gz' if gz else ''}"
        write_session(path, seed=seed, messages=MESSAGES, gzip=gz)
        paths[seed] = path
    return paths


def fast_summary(path: Path, otherwise: dict[str, Any]) -> dict[str, Any]:
    """The compiled pass's summary (`otherwise` where numba is not installed)."""
    if importlib.util.find_spec("numba") is None:
        return otherwise
    from duetime.feeds.itch.fastbook import fast_book_summary

    return fast_book_summary(path)


def diff(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """Readable differences, field by field, for the assertion message."""
    out = []
    if mine["market"] != theirs["market"]:
        out.append(f"market: {mine['market']} != {theirs['market']}")
    for name in sorted(set(mine["stocks"]) | set(theirs["stocks"])):
        a, b = mine["stocks"].get(name), theirs["stocks"].get(name)
        if a is None or b is None:
            out.append(f"{name}: only in {'theirs' if a is None else 'mine'}")
            continue
        for field in a:
            if a[field] != b[field]:
                first = _first_difference(a[field], b[field])
                out.append(f"{name}.{field}: {first}")
    return out


def _first_difference(a: Any, b: Any) -> str:
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return f"[{i}] {x} != {y}"
        return f"lengths {len(a)} != {len(b)}"
    return f"{str(a)[:200]} != {str(b)[:200]}"


@pytest.mark.parametrize(("seed", "gz"), SESSIONS)
def test_summary_matches_itch_book(sessions: dict[int, Path], seed: int, gz: bool) -> None:
    path = sessions[seed]
    mine, books = summarize(read_messages(path))
    theirs, stats = oracle.itch_book_summary(path)
    assert diff(mine, theirs) == []
    assert mine == theirs
    assert fast_summary(path, theirs) == theirs  # (what `duetime itch book` runs on)
    # a valid session: neither side saw anything to forgive
    assert not books.anomalies
    assert (stats["missing_ref"], stats["dup_ref"], stats["rejected"], stats["clamped"]) == (
        0,
        0,
        0,
        0,
    )
    assert stats["live_orders"] == books.live_orders
    stocks = mine["stocks"]
    assert sum(s["changes_total"] for s in stocks.values()) > MESSAGES // 2
    assert {len(name) for name in stocks} >= {1, 8}


def test_final_books_match_meatpy(sessions: dict[int, Path]) -> None:
    pytest.importorskip("meatpy")
    path = sessions[1]
    mine, _ = summarize(read_messages(path))
    theirs = oracle.meatpy_books(path)
    assert set(theirs) == set(mine["stocks"])
    for name, stock in theirs.items():
        assert stock["book"] == mine["stocks"][name]["book"], name
        assert stock["live_orders"] == mine["stocks"][name]["live_orders"], name


def test_symbols_match_itch_book(tmp_path: Path) -> None:
    """Only trailing spaces pad a symbol (itch-book keeps a leading one too), and an all-space
    symbol is none: `#<locate>`, as the oracle keys a locate without a symbol."""
    path = tmp_path / "symbols.itch"
    add = {"timestamp": 2, "buy_sell_indicator": "B", "shares": 1, "stock": "X", "price": 1}
    with ItchWriter(path) as writer:
        for locate, symbol in ((1, " " * 8), (2, " LEAD"), (3, "AB CD")):
            writer.write("R", stock_locate=locate, timestamp=1, stock=symbol, **R_FIELDS)
        for locate in (1, 2, 3, 4):
            writer.write("A", stock_locate=locate, order_reference_number=locate, **add)
    mine, _ = summarize(read_messages(path))
    theirs, _ = oracle.itch_book_summary(path)
    assert list(mine["stocks"]) == ["#1", " LEAD", "AB CD", "#4"]
    assert mine == theirs
    assert fast_summary(path, theirs) == theirs


def damaged(messages: Iterator[Any], seed: int) -> Iterator[bytes]:
    """A session after a bad day: lost adds and deletes (unknown references, stale orders that
    lock and cross books), repeated references, over-sized and zero-share executions and
    cancels, zero-share or zero-price adds and replaces, and wrong stock locates."""
    rng = random.Random(seed)
    live: list[int] = []
    for msg in messages:
        fields = msg._asdict()
        kind = fields.pop("type")
        roll = rng.random()
        if kind in "AF":
            if roll < 0.01:
                continue  # lost add
            if roll < 0.02 and live:
                fields["order_reference_number"] = rng.choice(live)  # repeated reference
            elif roll < 0.025:
                fields["shares" if roll < 0.0225 else "price"] = 0
            live.append(fields["order_reference_number"])
            del live[:-500]
        elif kind == "D" and roll < 0.02:
            continue  # lost delete
        elif kind in "ECX":
            name = "cancelled_shares" if kind == "X" else "executed_shares"
            if roll < 0.02:
                fields[name] += rng.randint(1, 1000)
            elif roll < 0.025:
                fields[name] = 0
            elif roll < 0.03:
                fields["stock_locate"] = (fields["stock_locate"] % 3) + 1
        elif kind == "U":
            if roll < 0.02 and live:
                fields["new_order_reference_number"] = rng.choice(live)
            elif roll < 0.03:
                fields["shares" if roll < 0.025 else "price"] = 0
            live.append(fields["new_order_reference_number"])
        yield encode(kind, **fields)


def test_policy_matches_itch_book_on_a_damaged_session(
    sessions: dict[int, Path], tmp_path: Path
) -> None:
    path = tmp_path / "damaged.itch"
    with ItchWriter(path) as writer:
        for body in damaged(read_messages(sessions[1]), seed=7):
            writer.write_body(body)
    mine, books = summarize(read_messages(path))
    theirs, stats = oracle.itch_book_summary(path)
    assert diff(mine, theirs) == []
    assert fast_summary(path, theirs) == theirs
    counts = books.anomalies.counts
    for kind in ("unknown_ref", "duplicate_ref", "oversize", "zero_shares", "zero_price"):
        assert counts.get(kind, 0) > 0, kind
    assert counts["locate_mismatch"] > 0
    assert counts["crossed"] > 0
    assert stats["dup_ref"] == counts["duplicate_ref"]
    assert stats["clamped"] == counts["oversize"]
    assert stats["live_orders"] == books.live_orders
