"""The book summary of docs/itch_book.md, built by independent open-source ITCH implementations.

- `itch-book` (C++23 core, `itch_book._core.Session`) gives the stock directory, every order
  message with the resting state after it (`messages`: type, side, locate of the resting order,
  remaining shares, ...), every change of the best bid/offer (`bbo`) and every change of the top
  N levels (`depth`), each tagged with the message's ordinal `seq`. From them:
  - changes: the `messages` rows the book applied (itch-book marks an unknown reference with
    side N and a rejected add with remaining 0; it applies an E/C/X of 0 shares as a no-op,
    which duetime rejects, so those rows are dropped too), each joined to the latest `bbo` row
    of its stock at or before its `seq`;
  - the final book: the last `depth` row of each stock;
  - live orders per stock: each order reference's state after its last row (a U's original
    reference ends there). itch-book reports live orders only feed-wide (`stats`), which is
    checked against the sum.
  itch-book rejects adds whose reference is 2**36 or more (its `kMaxRef` cap on the paged
  reference index), while ITCH references are any 8-byte unsigned value and the generated
  sessions use all 64 bits. So the stream it is fed has every order reference renumbered
  densely in first-seen order (`dense_references`): a one-to-one renaming that changes no book.
- itch-book does not count messages per stock and type: `itchcpp` (a separate C++ parser)
  does, from its own decoding of every frame.
- `meatpy` (pure Python, its own L3 book per instrument) gives a second, independent final
  book and live-order count per stock: `meatpy_books`. meatpy 0.5.0 decodes the 'O' (DLCR)
  message with a layout that is not the specification's (51 bytes with quantity fields instead
  of the addendum's 48), so it fails on the generated sessions' 'O' messages; they touch no
  book and are removed from the copy meatpy reads.
"""

from __future__ import annotations

import gzip
import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np


def read_bytes(path: str | Path) -> bytes:
    data = Path(path).read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def itch_book_summary(
    path: str | Path, *, depth: int = 5, first_changes: int = 1000
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The summary dict from itch-book + itchcpp, and itch-book's feed-wide `stats`."""
    from itch_book._core import Session  # type: ignore[import-untyped]

    data = dense_references(read_bytes(path))
    session = Session(tables=["bbo", "messages"], depth=depth, symbols=[])
    session.reserve(len(data) // 20)
    session.feed(data)
    stats = session.stats()
    if stats["pending_bytes"] or stats["unknown"] or stats["malformed"]:
        raise ValueError(f"itch-book could not read all of {path}: {stats}")
    symbols = {row[0]: row[1] for row in session.take_symbols()}
    messages = session.take_messages()
    bbo = session.take_bbo()
    final = _final_depth(session.take_depth(), depth)
    live = _live_orders(messages)
    counts, market = itchcpp_counts(data)

    applied = _applied(messages)
    stocks: dict[str, Any] = {}
    for locate in sorted(counts):
        rows = np.flatnonzero(applied & (messages["locate"] == locate))
        changes = _changes(messages["ts"][rows], messages["seq"][rows], bbo, locate)
        digest = hashlib.sha256(
            "".join(
                f"{ts},{'-' if bp is None else bp},{bs},{'-' if ap is None else ap},{az}\n"
                for ts, bp, bs, ap, az in changes
            ).encode()
        )
        bids, asks = final.get(locate, ([], []))
        stocks[symbols.get(locate) or f"#{locate}"] = {
            "locate": locate,
            "counts": dict(sorted(counts[locate].items())),
            "book": {"bids": bids, "asks": asks},
            "book_depth": depth,
            "live_orders": live.get(locate, 0),
            "changes_total": len(changes),
            "changes": changes[:first_changes],
            "changes_digest": digest.hexdigest(),
        }
    return {"market": {"counts": dict(sorted(market.items()))}, "stocks": stocks}, stats


_REF_FIELDS = {ord(k): (11,) for k in "AFECXD"} | {ord("U"): (11, 19)}
"""Body offsets of the order reference numbers (after type, locate, tracking, timestamp)."""


def dense_references(data: bytes) -> bytes:
    """`data` with every order reference of A/F/E/C/X/D/U renumbered 1, 2, ... as first seen."""
    out = bytearray(data)
    dense: dict[int, int] = {}
    pos, end = 0, len(out)
    while pos + 2 < end:
        size = int.from_bytes(out[pos : pos + 2], "big")
        body = pos + 2
        for offset in _REF_FIELDS.get(out[body], ()):
            at = body + offset
            ref = int.from_bytes(out[at : at + 8], "big")
            new = dense.setdefault(ref, len(dense) + 1)
            out[at : at + 8] = new.to_bytes(8, "big")
        pos = body + size
    return bytes(out)


def _applied(m: dict[str, np.ndarray]) -> np.ndarray:
    kind = m["type"]
    known = m["side"] != ord("N")
    rejected_add = np.isin(kind, [ord("A"), ord("F")]) & (m["remaining"] == 0)
    zero_removal = np.isin(kind, [ord("E"), ord("C"), ord("X")]) & (m["size"] == 0)
    return np.asarray(known & ~rejected_add & ~zero_removal)


def _changes(
    ts: np.ndarray, seq: np.ndarray, bbo: dict[str, np.ndarray], locate: int
) -> list[list[int | None]]:
    """The top of book after each change: the stock's latest bbo row at or before its seq."""
    mine = bbo["locate"] == locate
    bbo_seq = bbo["seq"][mine]
    at = np.searchsorted(bbo_seq, seq, side="right") - 1
    cols = [bbo[c][mine].tolist() for c in ("bid_px", "bid_sz", "ask_px", "ask_sz")]
    out: list[list[int | None]] = []
    for t, i in zip(ts.tolist(), at.tolist(), strict=True):
        if i < 0:
            out.append([t, None, 0, None, 0])
            continue
        bp, bs, ap, az = (c[i] for c in cols)
        out.append([t, bp or None, bs if bp else 0, ap or None, az if ap else 0])
    return out


def _final_depth(d: dict[str, np.ndarray], depth: int) -> dict[int, tuple[list[Any], list[Any]]]:
    last: dict[int, int] = {}
    for i, locate in enumerate(d["locate"].tolist()):
        last[locate] = i
    out = {}
    for locate, i in last.items():
        sides = []
        for name in ("bid", "ask"):
            levels = []
            for k in range(depth):
                px = int(d[f"{name}_px_{k:02d}"][i])
                if px:
                    sz, ct = int(d[f"{name}_sz_{k:02d}"][i]), int(d[f"{name}_ct_{k:02d}"][i])
                    levels.append([px, sz, ct])
            sides.append(levels)
        out[locate] = (sides[0], sides[1])
    return out


def _live_orders(m: dict[str, np.ndarray]) -> dict[int, int]:
    """Orders live at the end per stock, from each reference's state after its last row."""
    state: dict[int, tuple[int, int]] = {}
    rows = zip(
        m["side"].tolist(),
        m["type"].tolist(),
        m["order_id"].tolist(),
        m["old_order_id"].tolist(),
        m["locate"].tolist(),
        m["remaining"].tolist(),
        strict=True,
    )
    u = ord("U")
    for side, kind, ref, old, locate, remaining in rows:
        if side == ord("N"):
            continue
        if kind == u:
            state.pop(old, None)
        if remaining or kind not in (ord("A"), ord("F")):  # a rejected add leaves no trace
            state[ref] = (locate, remaining)
    live: Counter[int] = Counter(loc for loc, rem in state.values() if rem)
    return dict(live)


def itchcpp_counts(data: bytes) -> tuple[dict[int, Counter[str]], Counter[str]]:
    """Messages by stock locate and type letter (locate 0 apart), from itchcpp's parser."""
    from itchcpp.parser import MessageParser  # type: ignore[import-untyped]

    counts: Counter[tuple[int, bytes]] = Counter(
        (m.stock_locate, m.message_type) for m in MessageParser().parse_stream(data)
    )
    per_stock: dict[int, Counter[str]] = {}
    market: Counter[str] = Counter()
    for (locate, kind), n in counts.items():
        target = market if locate == 0 else per_stock.setdefault(locate, Counter())
        target[kind.decode()] += n
    return per_stock, market


def meatpy_books(path: str | Path, *, depth: int = 5) -> dict[str, dict[str, Any]]:
    """Final book (`book`) and `live_orders` per symbol from meatpy's own L3 books.

    meatpy keeps one processor per instrument and checks price-time priority of E messages
    against its queue; the generated feeds execute any resting order, so that check is off.
    Messages are routed to the processor of their stock locate (meatpy would otherwise show
    every message to every instrument).
    """
    import datetime
    import tempfile

    from meatpy.itch50.itch50_message_reader import (  # type: ignore[import-untyped]
        ITCH50MessageReader,
    )

    processors: dict[int, Any] = {}
    refs: dict[int, int] = {}  # order reference -> locate, to route by reference like ITCH does
    day = datetime.datetime(2024, 1, 2)
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "no-dlcr.itch"
        copy.write_bytes(without_types(read_bytes(path), b"O"))
        for msg in ITCH50MessageReader().read_file(copy):
            _route(msg, processors, refs, day)
    out = {}
    for proc in processors.values():
        lob = proc.current_lob
        bids = lob.get_bid_levels(depth) if lob else []
        asks = lob.get_ask_levels(depth) if lob else []
        live = sum(len(lvl.queue) for lvl in (lob.bid_levels + lob.ask_levels)) if lob else 0
        out[proc.instrument.decode().rstrip(" ")] = {
            "book": {
                "bids": [[lvl.price, lvl.volume, len(lvl.queue)] for lvl in bids],
                "asks": [[lvl.price, lvl.volume, len(lvl.queue)] for lvl in asks],
            },
            "live_orders": live,
        }
    return out


def _route(msg: Any, processors: dict[int, Any], refs: dict[int, int], day: Any) -> None:
    from meatpy.itch50 import ITCH50MarketProcessor  # type: ignore[import-untyped]

    kind = msg.type
    if kind == b"R":
        processors[msg.stock_locate] = ITCH50MarketProcessor(msg.stock, day)
        return
    if kind in (b"A", b"F"):
        refs[msg.order_ref] = msg.stock_locate
        locate = msg.stock_locate
    elif kind in (b"E", b"C", b"X", b"D"):
        locate = refs.get(msg.order_ref, msg.stock_locate)
    elif kind == b"U":
        locate = refs.pop(msg.original_ref, msg.stock_locate)
        refs[msg.new_ref] = locate
    else:
        return
    proc = processors.get(locate)
    if proc is None:
        return
    proc.process_message(msg)
    lob = proc.current_lob
    if lob is not None and lob.skip_exception is not _skip:
        lob.skip_exception = _skip


def _skip(exc: Exception) -> bool:
    return True


def without_types(data: bytes, letters: bytes) -> bytes:
    """`data` without the frames whose type letter is in `letters`."""
    out = bytearray()
    pos, end = 0, len(data)
    while pos + 2 < end:
        size = int.from_bytes(data[pos : pos + 2], "big")
        if data[pos + 2] not in letters:
            out += data[pos : pos + 2 + size]
        pos += 2 + size
    return bytes(out)
