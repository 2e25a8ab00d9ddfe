"""The synthetic session: deterministic by seed, shaped like a trading day, and a valid book."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from duetime.feeds.itch.parser import read_messages
from duetime.feeds.itch.spec import LETTERS, Message
from duetime.feeds.itch.synth import (
    DEFAULT_SYMBOLS,
    FLOW_END,
    MARKET_OPEN,
    session_bytes,
    session_chunks,
    write_session,
)


@pytest.fixture(scope="module")
def session() -> list[Message]:
    return list(read_messages(session_bytes(seed=7, messages=40_000)))


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    first = session_bytes(seed=3, messages=5000)
    assert session_bytes(seed=3, messages=5000) == first
    assert session_bytes(seed=4, messages=5000) != first
    assert b"".join(session_chunks(seed=3, messages=5000)) == first


def test_exact_count_every_type_and_the_shape_of_a_day(session: list[Message]) -> None:
    assert len(session) == 40_000
    counts = Counter(m.type for m in session)
    assert set(counts) == set(LETTERS)
    assert counts["R"] == len(DEFAULT_SYMBOLS)
    events = [m.event_code for m in session if m.type == "S"]  # type: ignore[union-attr]
    assert events == ["O", "S", "Q", "M", "E", "C"]
    assert session[0].type == "S"
    assert session[-1].type == "S"
    directory = {m.stock_locate: m.stock for m in session if m.type == "R"}  # type: ignore[union-attr]
    assert directory == dict(enumerate(DEFAULT_SYMBOLS, start=1))
    assert {"A", "ZVZZTXYZ"} <= set(directory.values())
    assert all(m.stock_locate == 0 for m in session if m.type in "SVW")
    stamps = [m.timestamp for m in session]
    assert stamps == sorted(stamps)
    flow = [m for m in session if m.type in "AFECXDUP"]
    assert all(MARKET_OPEN <= m.timestamp <= FLOW_END for m in flow)


def test_sweeps_share_a_timestamp_and_references_use_all_64_bits(
    session: list[Message],
) -> None:
    stamps = Counter(m.timestamp for m in session if m.type == "E")
    assert max(stamps.values()) >= 3  # several executions at one instant: a sweep
    refs = [m.order_reference_number for m in session if m.type in "AF"]  # type: ignore[union-attr]
    assert sum(ref >= 1 << 32 for ref in refs) > 0.9 * len(refs)
    assert sum(ref >= 1 << 63 for ref in refs) > 0.3 * len(refs)
    non_printable = [m for m in session if m.type == "C" and m.printable == "N"]  # type: ignore[union-attr]
    assert non_printable


def test_the_order_flow_is_valid(session: list[Message]) -> None:
    check_book(session)


def check_book(messages: Sequence[Any]) -> None:
    """Replay with a dict of orders: every reference live when used, never more shares than
    remain, replaces keep the side, and no book ever crossed or locked."""
    orders: dict[int, list[int]] = {}  # ref -> [locate, side, price, shares]
    depth: dict[tuple[int, int], Counter[int]] = {}  # (locate, side) -> price -> shares
    for m in messages:
        if m.type in "AF":
            assert m.order_reference_number not in orders
            side = 0 if m.buy_sell_indicator == "B" else 1
            orders[m.order_reference_number] = [m.stock_locate, side, m.price, 0]
            change(orders, depth, m.order_reference_number, m.shares)
        elif m.type in "EC":
            change(orders, depth, m.order_reference_number, -m.executed_shares)
        elif m.type == "X":
            assert m.cancelled_shares < orders[m.order_reference_number][3]
            change(orders, depth, m.order_reference_number, -m.cancelled_shares)
        elif m.type == "D":
            ref = m.order_reference_number
            change(orders, depth, ref, -orders[ref][3])
        elif m.type == "U":
            old = orders[m.original_order_reference_number]
            change(orders, depth, m.original_order_reference_number, -old[3])
            assert m.new_order_reference_number not in orders
            orders[m.new_order_reference_number] = [old[0], old[1], m.price, 0]
            change(orders, depth, m.new_order_reference_number, m.shares)
        else:
            continue
        bids, asks = depth.get((m.stock_locate, 0)), depth.get((m.stock_locate, 1))
        if bids and asks:
            assert max(bids) < min(asks), f"crossed or locked book after {m}"


def change(
    orders: dict[int, list[int]], depth: dict[tuple[int, int], Counter[int]], ref: int, by: int
) -> None:
    assert ref in orders, f"dead reference {ref}"
    order = orders[ref]
    assert order[3] + by >= 0, f"more shares than remain on {ref}"
    assert by != 0
    order[3] += by
    level = depth.setdefault((order[0], order[1]), Counter())
    level[order[2]] += by
    if level[order[2]] == 0:
        del level[order[2]]
    if order[3] == 0:
        del orders[ref]


def test_write_session_to_plain_and_gzip_files(tmp_path: Path) -> None:
    plain, packed = tmp_path / "day.itch", tmp_path / "day.itch.gz"
    assert write_session(plain, seed=2, messages=3000, symbols=["A", "BB"]) == 3000
    assert write_session(packed, seed=2, messages=3000, symbols=["A", "BB"], gzip=True) == 3000
    assert plain.read_bytes() == session_bytes(seed=2, messages=3000, symbols=["A", "BB"])
    assert list(read_messages(packed)) == list(read_messages(plain))


def test_a_session_too_short_or_with_bad_symbols_is_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        session_bytes(seed=1, messages=10)
    with pytest.raises(ValueError, match="symbol"):
        session_bytes(seed=1, messages=1000, symbols=["NINECHARS"])
    with pytest.raises(ValueError, match="distinct"):
        session_bytes(seed=1, messages=1000, symbols=["A", "A"])


def test_a_small_book_is_still_valid_with_one_symbol() -> None:
    check_book(list(read_messages(session_bytes(seed=9, messages=20_000, symbols=["ONE"]))))


def test_write_session_needs_no_numba(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "from duetime.feeds.itch.synth import write_session\n"
        f"write_session({str(tmp_path / 'x.itch')!r}, seed=1, messages=500)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
