"""The compiled per-event path of `itch run` (numba): a whole file's messages applied to the
compiled books (fastbook_kernel) with each book event's features (fastfeatures), a step of
messages at a time: those that have arrived when the feed takes them up.

The pure-Python path (`Books.apply`, then `Features.update`) takes ~25 µs a book event on the
2-core VM, ~60 µs at a recorded pace that leaves the code path to go cold between messages;
the events of a burst (a sweep's, stamped with one nanosecond) each wait for those before it,
so a burst of six was ~400 µs late before the model was even asked. A step here costs a
few µs whatever its size (the call), plus well under a µs a message.

Its events and vectors are the Python path's (tests/feeds/test_fastfeed.py compares them event
by event); it needs the `duetime[itch]` extra (numba) and the file in memory, framed without a
fault (`parser.frame_index`): `itch run` takes the Python path otherwise (see
`fast_feed_for`).
"""

from __future__ import annotations

import stat
import time
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from duetime.feeds.itch import fastbook_kernel as kernel
from duetime.feeds.itch.book import ANOMALY_KINDS
from duetime.feeds.itch.fastbook_tables import (
    S_ANOMALIES,
    S_POS,
    ST_MESSAGES,
    Tables,
    grow_levels,
    grow_orders,
    new_tables,
)
from duetime.feeds.itch.fastfeatures import (
    K_BOOK_EVENTS,
    K_MESSAGES,
    K_NODE_FREE,
    K_NODE_HIGH,
    K_ROOM,
    K_ROWS,
    K_SLOTS,
    M_LOCATE,
    M_MESSAGE,
    FeatureTables,
    grow_nodes,
    grow_slots,
    new_feature_tables,
)
from duetime.feeds.itch.keys import StockKeys
from duetime.feeds.itch.parser import _GZIP_MAGIC, frame_index, read_stream
from duetime.feeds.itch.predictors import event_rows
from duetime.feeds.itch.writer import encode, frame

FAST_MAX_BYTES = 1 << 30
"""`itch run --engine auto` takes the compiled path for a stream of at most this many bytes
(uncompressed): it holds the whole stream in memory, with 24 bytes a message of index."""

_R_BYTES = 39
"""A stock directory message's length (its locate follows the type byte)."""
_TS_AT = 2 + 5
"""A frame's 6-byte timestamp: after its 2-byte length, type, locate and tracking number."""


class FastFeed:
    """A whole uncompressed ITCH stream, framed, and the compiled books and features that
    `step` advances through it (see the module)."""

    def __init__(
        self,
        buffer: np.ndarray,
        *,
        every: int = 1,
        top_change: bool = False,
        rows: int = 64,
        window_events: int = 100,
        window_ns: int = 1_000_000_000,
    ) -> None:
        self.buffer = buffer
        index = frame_index(buffer)  # (raises the parser's error at a bad frame)
        self.offsets: np.ndarray = index.offsets
        at = self.offsets + _TS_AT
        stamps = np.zeros(len(at), np.int64)
        for k in range(6):
            stamps = (stamps << 8) | buffer[at + k].astype(np.int64)
        self.timestamps = stamps
        """Each message's recorded timestamp (ns since midnight)."""
        self.tables: Tables = new_tables(1 << 12, 1 << 10, 1)
        self.features: FeatureTables = new_feature_tables(
            window_events=window_events, window_ns=window_ns, every=every,
            top_change=top_change, rows=rows,
        )  # fmt: skip
        self._arrays = (*self.tables, *self.features)
        """The tables' arrays as `run_features` takes them (unpacked again when one grows)."""
        self.keys = StockKeys()
        """Each locate's key (`itch book`'s), as the messages so far name it."""
        self._named: set[int] = set()
        self.rows = 0
        """Event rows the last `step` wrote (`vectors`, `locates`, `messages_of`, `stocks`)."""
        self.stocks: list[str] = []
        """The last step's rows' stock keys, as they stood at each row's event."""

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def messages(self) -> int:
        """Messages applied so far (the index of the next one)."""
        return int(self.features.control[K_MESSAGES])

    @property
    def book_events(self) -> int:
        return int(self.features.control[K_BOOK_EVENTS])

    @property
    def vectors(self) -> np.ndarray:
        """The last step's event rows (a view, overwritten by the next step)."""
        return self.features.rows[: self.rows]

    @property
    def locates(self) -> np.ndarray:
        return self.features.meta[: self.rows, M_LOCATE]

    @property
    def messages_of(self) -> np.ndarray:
        """The index of each row's message."""
        return self.features.meta[: self.rows, M_MESSAGE]

    def targets(self, speed: float, max_gap_ns: int) -> np.ndarray:
        """Each message's replay time, ns after the first's: `run.RecordedClock`'s (each step
        between two timestamps taken as 0 to `max_gap_ns`, `speed` times faster)."""
        steps = np.diff(self.timestamps, prepend=self.timestamps[:1])
        elapsed = np.cumsum(np.clip(steps, 0, max_gap_ns))
        return (elapsed / speed).astype(np.int64)

    def step(self, stop: int, room: int) -> int:
        """Apply the messages before message `stop` (all that came: at most up to the event that
        fills `room` rows, a partial step then); returns the event rows written."""
        if room < 1:
            raise ValueError(f"a step needs room for at least one row, got {room}")
        offsets = self.offsets
        end = int(offsets[stop]) if stop < len(offsets) else len(self.buffer)
        control = self.features.control
        control[K_ROWS] = 0
        control[K_ROOM] = min(room, len(self.features.rows))
        self.stocks.clear()
        run, buffer = kernel.run_features, self.buffer
        while True:
            status = run(buffer, end, self._arrays)
            if status == kernel.DONE or status == kernel.ROWS_FULL:
                break
            if status == kernel.NAMED:  # (the rows before it are keyed by the names before it)
                self._key_rows(int(control[K_ROWS]))
                self._name_last()
                continue
            if status == kernel.GROW_ORDERS:
                self.tables = grow_orders(self.tables)
            elif status == kernel.GROW_LEVELS:
                self.tables = grow_levels(self.tables)
            elif status == kernel.GROW_SLOTS:
                self.features = grow_slots(self.features)
            elif status == kernel.GROW_NODES:
                self.features = grow_nodes(self.features)
            else:  # (BAD_FRAME: the index found none)
                raise AssertionError(f"run_features: status {status} on a framed buffer")
            self._arrays = (*self.tables, *self.features)
        self.rows = int(control[K_ROWS])
        self._key_rows(self.rows)
        return self.rows

    def _key_rows(self, rows: int) -> None:
        """Key the step's rows from `len(self.stocks)` up to `rows`."""
        if len(self.stocks) >= rows:
            if not rows:
                self.stocks.clear()
            return
        locates = self.features.meta[len(self.stocks) : rows, M_LOCATE].tolist()
        key = self.keys.key
        if self._named.issuperset(locates):  # (the names stand for the whole step)
            # NOTE: a key call a row took 0.5-1 µs, more than the books and features did
            keys = {locate: key(locate) for locate in set(locates)}
            self.stocks.extend(map(keys.__getitem__, locates))
            return
        for locate in locates:
            if locate not in self._named:  # (no R message yet: each one names its locate at once)
                self._named.add(locate)
                self.keys.name(locate, "")
            self.stocks.append(key(locate))

    def name(self, locate: int) -> None:
        """Key `locate` by its symbol so far (no R message yet: '#<locate>')."""
        self._named.add(locate)
        symbol = bytes(self.tables.symbols[locate]).decode("latin-1").rstrip(" ")
        stocks = self.tables.stocks
        self.keys.name(locate, symbol if stocks[locate, ord("R") & 63] else "")

    def _name_last(self) -> None:
        """The message just applied was a stock directory: the locate's key follows it."""
        m = int(self.tables.state[S_POS]) - _R_BYTES
        self.name(int(self.buffer[m + 1]) << 8 | int(self.buffer[m + 2]))

    def seen(self) -> set[str]:
        """The key of every locate any message so far carried (`run.stock_names`)."""
        stocks = self.tables.stocks
        for locate in np.flatnonzero(stocks[1:, ST_MESSAGES] > 0).tolist():
            if locate + 1 not in self._named:
                self.name(locate + 1)
        return {self.keys.key(locate) for locate in self._named}

    def rewind(self) -> None:
        """Take the buffer again from its start, with the features of no event (the books as
        they stand): `FastWarmer`'s, on a buffer of its own."""
        control = self.features.control
        self.tables.state[S_POS] = 0
        control[K_MESSAGES] = 0
        control[K_SLOTS] = 0
        control[K_NODE_FREE] = -1
        control[K_NODE_HIGH] = 0
        self.features.slot_of[:] = -1

    @property
    def anomalies(self) -> dict[str, int]:
        """Policy cases by kind, as `Books.anomalies.counts` (kinds that happened only)."""
        counts = self.tables.state[S_ANOMALIES:].tolist()
        return {kind: n for kind, n in zip(ANOMALY_KINDS, counts, strict=True) if n}

    def due_by(self, targets: np.ndarray, elapsed_ns: int, start: int, limit: int) -> int:
        """The first message from `start` (exclusive of it: at least `start + 1`) whose replay
        time is after `elapsed_ns`, at most `limit` (`targets` ascending)."""
        after = start + 1
        if after >= limit or targets.item(after) > elapsed_ns:  # (the usual case: one came)
            return min(after, limit)
        return min(int(np.searchsorted(targets, elapsed_ns, "right")), limit)


def load_whole(path: str | PathLike[str], *, whole: bool = False) -> np.ndarray | None:
    """The uncompressed stream of `path` for the compiled path (read-only), or None where it
    should not take it: not a regular file, a stream of over `FAST_MAX_BYTES` (unless `whole`;
    a gzip file is decompressed no further), a damaged gzip file (raised with `whole`: the
    parser's bad_gzip `ItchFormatError`)."""
    path = Path(path)
    status = path.stat()
    if not stat.S_ISREG(status.st_mode):  # (a pipe: read once, by the streaming reader)
        return None
    limit = None if whole else FAST_MAX_BYTES
    with open(path, "rb") as file:
        gzipped = file.read(2) == _GZIP_MAGIC
    if limit is not None and not gzipped and status.st_size > limit:
        return None
    loaded = read_stream(path, limit)
    if loaded is None:
        return None
    data, error = loaded
    if error is not None:
        if whole:
            raise error
        return None
    buffer = np.frombuffer(data, np.uint8)
    buffer.flags.writeable = False  # (one compiled type for every buffer: `compile_step`'s)
    return buffer


def compile_step() -> None:
    """Compile (or load from numba's cache) the step before a run starts: its first call
    otherwise lands in the run, 17-25 ms with the cache warm (19 s without), and the first
    messages' events went past their due time."""
    feed = FastFeed(np.frombuffer(_warm_stream(), np.uint8))
    feed.step(len(feed), len(feed))


def _warm_stream() -> bytes:
    """An order added and deleted on stock locate 1 (`FastWarmer`'s, `compile_step`'s)."""
    common = {"stock_locate": 1, "timestamp": 0, "order_reference_number": 1}
    add = encode("A", **common, buy_sell_indicator="B", shares=100, stock="WARM", price=1_000_000)
    return frame(add) + frame(encode("D", **common))


class FastWarmer:
    """`run.Warmer` for the compiled path: while the feed waits for a message, an order added
    and deleted on a `FastFeed` of its own (the same compiled step, the features of its event),
    and the model run on that event's vector; nothing counted or logged."""

    __slots__ = ("_feed", "_model", "_row", "cost_ns")

    def __init__(self, predictor: Any) -> None:
        self._feed = FastFeed(np.frombuffer(_warm_stream(), np.uint8))
        self._model = getattr(predictor, "warm", None)  # (a predictor may have no model here)
        self._row = event_rows(predictor.input, 1)
        self.cost_ns = 0
        """How long one warming took last (it is not started closer than that to a message)."""

    def warm(self) -> None:
        started = time.monotonic_ns()
        feed = self._feed
        feed.rewind()
        feed.step(len(feed), len(feed))
        if self._model is not None:
            self._row[0, : feed.vectors.shape[1]] = feed.vectors[0]
            self._model(self._row)
        self.cost_ns = time.monotonic_ns() - started
