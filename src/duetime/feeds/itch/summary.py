"""A JSON summary of every stock's book over a whole ITCH file, for diffing against other tools.

Two books built from one file by different programs agree if and only if their summaries are
equal: the message counts, the final depth and live orders, and the top of book after *every*
book change (the first `first_changes` in full, all of them through a SHA-256 digest). The layout
is fixed (docs/itch_book.md, "Book summary JSON"); `tests/feeds/itch/oracle.py` builds the same
dict from independent libraries, and the numba kernel `fastbook.py` must produce it exactly.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from os import PathLike
from pathlib import Path
from typing import Any

from duetime.feeds.itch.book import ASK, BID, Books, Top
from duetime.feeds.itch.keys import stock_keys
from duetime.feeds.itch.parser import OnError, Source, read_messages

Summary = dict[str, Any]

_FLUSH_LINES = 4096


class _Changes:
    """The top-of-book rows of one stock: the first few kept, all of them hashed.

    The top is read from the book only when the event says it moved (or after an eviction,
    which can move another stock's top): most changes happen behind the best level.
    """

    __slots__ = ("digest", "first", "limit", "pending", "suffix", "top", "total")

    def __init__(self, limit: int) -> None:
        self.total = 0
        self.limit = limit
        self.first: list[list[int | None]] = []
        self.digest = hashlib.sha256()
        self.pending: list[str] = []
        self.top: Top = (None, 0, None, 0)
        self.suffix: str | None = None
        """The digest line after the timestamp for `top`; None: read the top again."""

    def set_top(self, top: Top) -> None:
        bid_px, bid_sz, ask_px, ask_sz = self.top = top
        self.suffix = (
            f"{'-' if bid_px is None else bid_px},{bid_sz},{'-' if ask_px is None else ask_px},"
            f"{ask_sz}\n"
        )

    def add(self, ts: int) -> None:
        self.total += 1
        if self.total <= self.limit:
            self.first.append([ts, *self.top])
        pending = self.pending
        pending.append(f"{ts},{self.suffix}")
        if len(pending) >= _FLUSH_LINES:
            self.flush()

    def flush(self) -> None:
        self.digest.update("".join(self.pending).encode())
        self.pending.clear()

    def hexdigest(self) -> str:
        self.flush()
        return self.digest.hexdigest()


def summarize(
    messages: Iterable[Any], *, depth: int = 5, first_changes: int = 1000, strict: bool = False
) -> tuple[Summary, Books]:
    """Apply an iterable of parsed messages; the summary and the `Books` (for its anomalies)."""
    check_first_changes(first_changes)
    books = Books(strict=strict)
    apply = books.apply
    stocks = books.books
    logs: dict[int, _Changes] = {}
    evictions = 0
    for msg in messages:
        event = apply(msg)
        if event is None or event.kind == "P":
            continue
        if books.evictions != evictions:
            evictions = books.evictions
            for stale in logs.values():
                stale.suffix = None
        locate = event.locate
        log = logs.get(locate)
        if log is None:
            log = logs[locate] = _Changes(first_changes)
        if event.top_changed or log.suffix is None:
            log.set_top(stocks[locate].top())
        log.add(event.ts)
    return _layout(books, logs, depth, first_changes), books


def book_summary(
    source: Source,
    *,
    depth: int = 5,
    first_changes: int = 1000,
    on_error: OnError = "stop",
    strict: bool = False,
) -> Summary:
    """The summary dict of the ITCH file (or bytes) `source`; layout in docs/itch_book.md.

    Raises `ItchFormatError` on a malformed frame with `on_error="stop"` and `BookError` on a
    policy case with `strict=True`."""
    summary, _ = summarize(
        read_messages(source, on_error=on_error),
        depth=depth,
        first_changes=first_changes,
        strict=strict,
    )
    return summary


def write_summary(source: Source, out_path: str | PathLike[str], **options: Any) -> Summary:
    """Write `book_summary(source, **options)` to `out_path` as JSON; returns the dict."""
    summary = book_summary(source, **options)
    Path(out_path).write_text(dumps(summary))
    return summary


def dumps(summary: Summary) -> str:
    """The file form: compact JSON, keys in layout order, one trailing newline."""
    return json.dumps(summary, separators=(",", ":")) + "\n"


def check_first_changes(first_changes: int) -> None:
    """`ValueError` unless `first_changes` is 0 or more (a negative one would slice from the end:
    other stocks' rows in the fast path's shared table)."""
    if first_changes < 0:
        raise ValueError(f"first_changes must be 0 or more, got {first_changes}")


def symbols(books: Books) -> dict[int, str]:
    """Each locate's symbol ('' if none), in ascending locate order."""
    return {locate: books.books[locate].symbol for locate in sorted(books.books)}


def _layout(books: Books, logs: dict[int, _Changes], depth: int, first_changes: int) -> Summary:
    stocks: dict[str, Any] = {}
    keys = stock_keys(symbols(books).items())
    for locate in sorted(books.books):
        book = books.books[locate]
        log = logs.get(locate) or _Changes(first_changes)
        stocks[keys[locate]] = {
            "locate": locate,
            "counts": dict(sorted(book.counts.items())),
            "book": {
                "bids": [list(level) for level in book.depth(BID, depth)],
                "asks": [list(level) for level in book.depth(ASK, depth)],
            },
            "book_depth": depth,
            "live_orders": book.live_orders,
            "changes_total": log.total,
            "changes": log.first,
            "changes_digest": log.hexdigest(),
        }
    return {"market": {"counts": dict(sorted(books.market_counts.items()))}, "stocks": stocks}
