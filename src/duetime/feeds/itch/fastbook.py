"""The fast path: every stock's level-3 book from a whole ITCH 5.0 file in one compiled pass
(numba), and the same summary as `summary.book_summary`, dict for dict.

The pure-Python `Books` spends about 2.5 µs per message; this one decodes the frames in place
and keeps orders and levels in preallocated int64 tables with open-addressing hashes (see
fastbook_tables and fastbook_kernel), at tens of millions of messages per second. It follows
book.py's policy for invalid flows exactly (docs/itch_book.md) and counts its anomalies, without
the samples and without strict mode. Needs the `duetime[itch]` extra (numba); the compiled code
is cached on disk, so only the first call in a fresh environment pays the JIT (a few seconds).
"""

from __future__ import annotations

import hashlib
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from duetime.feeds.itch import fastbook_kernel as kernel
from duetime.feeds.itch.book import ANOMALY_KINDS, ASK, BID, Level, Top
from duetime.feeds.itch.fastbook_changes import (
    book_depth,
    digest_text,
    group_by_locate,
    live_orders,
    unpack_changes,
)
from duetime.feeds.itch.fastbook_tables import (
    H_ROW,
    L_HEAD,
    O_NEXT,
    O_REF,
    O_SHARES,
    S_ANOMALIES,
    S_BAD_FRAMES,
    S_CHANGES,
    S_FIRST_BAD,
    S_POS,
    ST_MESSAGES,
    Tables,
    grow_changes,
    grow_levels,
    grow_orders,
    hash_find,
    new_tables,
)
from duetime.feeds.itch.keys import stock_keys
from duetime.feeds.itch.parser import ItchFormatError, OnError, frame_error, gunzip_readable
from duetime.feeds.itch.summary import check_first_changes

Summary = dict[str, Any]
Source = str | PathLike[str] | bytes | bytearray | memoryview | np.ndarray

_GZIP_MAGIC = b"\x1f\x8b"
_SIDE_INDEX = {BID: 0, ASK: 1}
_R_COLUMN = ord("R") & 63
_LETTER_BASE = 64
"""Counts column c holds type letter chr(c + 64): 'A'..'Z' are 1..26, 'a'..'z' 33..58, so
column order is the summary's key order."""
_INT64_MAX = 2**63 - 1


def load_buffer(source: Source) -> np.ndarray:
    """The uncompressed bytes of a file path or a buffer, as a uint8 array (gzip is detected by
    its magic number and decompressed in memory: the pass needs the whole buffer). A numpy
    array is taken as it is: uncompressed bytes. A damaged gzip file raises its bad_gzip
    `ItchFormatError`."""
    buffer, error = _load(source)
    if error is not None:
        raise error
    return buffer


def _load(source: Source) -> tuple[np.ndarray, ItchFormatError | None]:
    """`load_buffer`, but a damaged gzip file gives the bytes read before the damage and its
    bad_gzip error, for the pass to apply the error policy to (as the streaming reader does)."""
    if isinstance(source, np.ndarray):
        return source.view(np.uint8).reshape(-1), None
    data = bytes(source) if isinstance(source, bytearray | memoryview) else source
    if not isinstance(data, bytes):
        data = Path(data).read_bytes()
    error = None
    if data[:2] == _GZIP_MAGIC:
        data, error = gunzip_readable(data)
    return np.frombuffer(data, np.uint8), error


class FastBook:
    """Every stock's book after one compiled pass over an ITCH buffer.

    `FastBook(source)` runs the pass; the readers mirror `book.OrderBook`'s (side +1 bids, -1
    asks; prices raw Price(4) integers). `changes` holds one row per change: ts, bid_px, bid_sz,
    ask_px, ask_sz, locate (price -1 for an empty side). With `record_changes=False` the pass
    builds the books alone (10-20% faster): the readers work, `changes` and `summary` raise.
    """

    def __init__(
        self,
        source: Source,
        *,
        on_error: OnError = "stop",
        gzip_error: ItchFormatError | None = None,
        record_changes: bool = True,
    ) -> None:
        if on_error not in ("stop", "skip"):
            raise ValueError(f"on_error must be 'stop' or 'skip', got {on_error!r}")
        self.buffer, self.gzip_error = _load(source)
        """The uncompressed stream (of a damaged gzip file: as far as it could be read), and
        the bad_gzip `ItchFormatError` that ended it (None if intact; with on_error="stop" it
        is raised, after any bad frame before it, as `read_messages` does). `gzip_error`: the
        one that ended a `source` already decompressed (`parser.read_stream`)."""
        self.gzip_error = self.gzip_error or gzip_error
        self.record_changes = record_changes
        orders, levels, changes = _initial_sizes(len(self.buffer))
        tables = new_tables(orders, levels, changes if record_changes else 0)
        self.tables = _run(self.buffer, tables, on_error, self.gzip_error, record_changes)
        self.skipped = int(self.tables.state[S_BAD_FRAMES])
        """Malformed frames stepped over (on_error="skip"; a cut-off last frame not included)."""
        self._live_cache: np.ndarray | None = None

    def skipped_parts(self) -> tuple[int, ItchFormatError | None]:
        """With on_error="skip": the malformed parts of the stream stepped over, counted as
        `read_messages` lists them in `errors` (each bad frame, the damage of a gzip file, a
        frame cut off at the end), and the first of them (None if none)."""
        end = int(self.tables.state[S_POS])
        cut = end != len(self.buffer)  # (the pass stops short of a frame cut off)
        count = self.skipped + (self.gzip_error is not None) + cut
        if self.skipped:
            return count, _frame_error(self.buffer, int(self.tables.state[S_FIRST_BAD]))
        if self.gzip_error is not None:  # (before the frame it cut, as the reader meets them)
            return count, self.gzip_error
        return count, _frame_error(self.buffer, end) if cut else None

    @property
    def changes(self) -> np.ndarray:
        """One row per change: ts, bid_px, bid_sz, ask_px, ask_sz, locate (price -1: empty)."""
        return unpack_changes(self._packed_changes)

    @property
    def _packed_changes(self) -> np.ndarray:
        if not self.record_changes:
            raise ValueError("this pass kept no change rows: FastBook(..., record_changes=True)")
        packed: np.ndarray = self.tables.changes[: self.tables.state[S_CHANGES]]
        return packed

    @property
    def anomalies(self) -> dict[str, int]:
        """Policy cases by kind, as `Books.anomalies.counts` (kinds that happened only)."""
        counts = self.tables.state[S_ANOMALIES:].tolist()
        return {kind: n for kind, n in zip(ANOMALY_KINDS, counts, strict=True) if n}

    def locates(self) -> np.ndarray:
        """Every non-zero locate seen in any message, ascending."""
        seen = np.flatnonzero(self.tables.stocks[:, ST_MESSAGES])
        stocks: np.ndarray = seen[seen != 0]
        return stocks

    def symbol(self, locate: int) -> str:
        """The symbol of the locate's last R message, trailing spaces removed ('' if none)."""
        if not self.tables.stocks[locate, _R_COLUMN]:
            return ""
        return bytes(self.tables.symbols[locate]).decode("latin-1").rstrip(" ")

    def counts(self, locate: int) -> dict[str, int]:
        """Messages carrying `locate` by type letter, sorted (locate 0: market-wide)."""
        row = self.tables.stocks[locate]
        columns = np.flatnonzero(row[1:]) + 1  # column 0 is the total
        return {chr(c + _LETTER_BASE): int(row[c]) for c in columns.tolist()}

    def live_orders(self, locate: int) -> int:
        return int(self._live()[locate])

    def depth(self, locate: int, side: int, k: int) -> list[Level]:
        t = self.tables
        rows, starts = book_depth(t.levels, t.ends, np.array([locate], np.int64), _levels(k))
        s = _SIDE_INDEX[side]
        return [(int(p), int(q), int(n)) for p, q, n in rows[starts[s] : starts[s + 1]]]

    def top(self, locate: int) -> Top:
        bid, ask = self.depth(locate, BID, 1), self.depth(locate, ASK, 1)
        return (
            bid[0][0] if bid else None,
            bid[0][1] if bid else 0,
            ask[0][0] if ask else None,
            ask[0][1] if ask else 0,
        )

    def queue(self, locate: int, side: int, price: int) -> list[tuple[int, int]]:
        """(ref, shares) of the orders at one price level, oldest first ([] if no level)."""
        t = self.tables
        key = ((2 * locate + _SIDE_INDEX[side]) << 32) | price
        slot = hash_find(t.level_hash, key)
        if slot < 0:
            return []
        out = []
        o = int(t.levels[t.level_hash[slot, H_ROW], L_HEAD])
        while o >= 0:
            out.append((int(np.uint64(t.orders[o, O_REF])), int(t.orders[o, O_SHARES])))
            o = int(t.orders[o, O_NEXT])
        return out

    def summary(self, *, depth: int = 5, first_changes: int = 1000) -> Summary:
        """The `summary.book_summary` dict of this pass."""
        return _summary(self, depth, first_changes)

    def _live(self) -> np.ndarray:
        if self._live_cache is None:
            self._live_cache = live_orders(self.tables.orders, self.tables.order_hash)
        return self._live_cache


def fast_book_summary(
    source: Source, *, depth: int = 5, first_changes: int = 1000, on_error: OnError = "stop"
) -> Summary:
    """`summary.book_summary(source, ...)` (lenient policy) from the compiled pass.

    Raises the parser's `ItchFormatError` where `book_summary` would: at the first malformed
    frame with on_error="stop" (including a frame cut off at the end).
    """
    check_first_changes(first_changes)  # (before the pass, not after)
    return FastBook(source, on_error=on_error).summary(depth=depth, first_changes=first_changes)


def _initial_sizes(nbytes: int) -> tuple[int, int, int]:
    """(orders, levels, change rows) to start with. The order and level tables start small and
    double when full, so a small book stays in cache; the change table is sized for a whole
    file of `nbytes` (about 30 bytes a message, nearly all of them changes), since copying it
    on a grow costs more than the pages it leaves untouched."""
    return 1 << 12, 1 << 10, max(nbytes // 30, 1 << 12)


def _run(
    buf: np.ndarray,
    tables: Tables,
    on_error: OnError,
    gzip_error: ItchFormatError | None,
    record: bool,
) -> Tables:
    """The compiled pass to the end of `buf`, doubling whichever table fills up; raises the
    parser's error for a malformed frame as `read_messages(buf, on_error=...)` would, and for
    `buf` read from a damaged gzip file (`gzip_error`), as `read_messages` reads that file."""
    growers = {
        kernel.GROW_ORDERS: grow_orders,
        kernel.GROW_LEVELS: grow_levels,
        kernel.GROW_CHANGES: grow_changes,
    }
    skip = on_error == "skip"
    while (status := kernel.run(buf, tables, skip, record)) in growers:
        tables = growers[status](tables)
    pos = int(tables.state[S_POS])
    if skip:
        return tables
    if status == kernel.BAD_FRAME:
        raise _frame_error(buf, pos)
    # NOTE: the damage comes before a frame it cut (the reader meets it first) in the stream
    if gzip_error is not None:
        raise gzip_error
    if pos != len(buf):
        raise _frame_error(buf, pos)
    return tables


def _frame_error(buf: np.ndarray, pos: int) -> ItchFormatError:
    """The error of the bad frame at `pos`, worded as `parser.frame_index` words it."""
    size = (int(buf[pos]) << 8) | int(buf[pos + 1]) if pos + 1 < len(buf) else 2
    kind = int(buf[pos + 2]) if pos + 2 < len(buf) and size else None
    return frame_error(pos, size, kind, len(buf) - pos)


def _summary(book: FastBook, depth: int, first_changes: int) -> Summary:
    check_first_changes(first_changes)
    changes = book._packed_changes
    rows, starts = group_by_locate(changes)
    text, text_starts = digest_text(changes)
    locates = book.locates()
    levels, level_starts = book_depth(book.tables.levels, book.tables.ends, locates, _levels(depth))
    stocks: dict[str, Any] = {}
    keys = stock_keys((locate, book.symbol(locate)) for locate in locates.tolist())
    for i, locate in enumerate(locates.tolist()):
        first, last = int(starts[locate]), int(starts[locate + 1])
        lines = text[text_starts[locate] : text_starts[locate + 1]]
        stocks[keys[locate]] = {
            "locate": locate,
            "counts": book.counts(locate),
            "book": {
                "bids": levels[level_starts[2 * i] : level_starts[2 * i + 1]].tolist(),
                "asks": levels[level_starts[2 * i + 1] : level_starts[2 * i + 2]].tolist(),
            },
            "book_depth": depth,
            "live_orders": book.live_orders(locate),
            "changes_total": last - first,
            "changes": _rows(changes[rows[first : min(last, first + first_changes)]]),
            "changes_digest": hashlib.sha256(lines.data).hexdigest(),
        }
    return {"market": {"counts": book.counts(0)}, "stocks": stocks}


def _levels(depth: int) -> int:
    """`depth` as the compiled `book_depth` takes it: an int64, the same levels listed.

    NOTE: `itch book --depth 18446744073709551616` (2**64) failed in numba's typing ("Int value
    is too large") on the compiled pass and listed every level on the Python books (found by a
    tester). No book side holds 2**63 levels (a price is 32 bits), so any depth from there on
    lists them all, as it does in Python; the summary's `book_depth` keeps the depth asked."""
    return max(0, min(depth, _INT64_MAX))


def _rows(packed: np.ndarray) -> list[list[int | None]]:
    """Packed change rows as summary rows: [ts, bid_px, bid_sz, ask_px, ask_sz], None for an
    empty side's price."""
    changes = unpack_changes(packed)
    cells = changes[:, :5].astype(object)
    for column in (1, 3):
        empty = changes[:, column] < 0
        cells[empty, column] = None
    rows: list[list[int | None]] = cells.tolist()
    return rows
