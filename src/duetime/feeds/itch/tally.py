"""What a run counts and writes: `RunStats` (its report), `FeedStatistics` (what a live feed made
of its sequence numbers) and `PredictionLog` (the predictions, as CSV)."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from duetime.tools.hdr import new_histogram, percentiles_us, record_us
from duetime.tools.outputs import failed_write, make_parents

if TYPE_CHECKING:
    from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

    from duetime.feeds.itch.parser import ItchFormatError

SETTLE_AT = 100_000
"""Values noted before they are recorded even without a gap (bounds the memory)."""
FLUSH_ROWS = 4096
FIRST_GAPS = 10
"""Live: gaps listed in the report (all are counted)."""


@dataclass(frozen=True, slots=True)
class FeedStatistics:
    """What a live feed made of its sequence numbers so far."""

    missed: int = 0
    """Messages never delivered: sequence gaps (lost datagrams, and `dropped`)."""
    dropped: int = 0
    """Of `missed`: received, but refused because the run's queue was full."""
    gaps: int = 0
    first_gaps: tuple[tuple[int, int], ...] = ()
    """The first `FIRST_GAPS` gaps, (first, last) sequence numbers."""
    first_sequence: int | None = None
    """The sequence number of the first datagram (None: none came)."""
    duplicates: int = 0
    """Messages dropped because their sequence number had been handed on already."""
    reordered: int = 0
    """Messages that came after the feed had passed their gap (dropped; not in `missed`)."""
    session: str | None = None
    """The MoldUDP64 session of the stream (its first datagram's)."""
    bad_kinds: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Bad packets by kind: {"count": n, "examples": [the first reasons]} (`BadPackets`)."""
    ended: bool = False
    """Whether the session's end-of-session packet came (not: the feed ended on the idle
    timeout, the limit or a signal; a sender that gave up part-way leaves the session open)."""


@dataclass(slots=True)
class RunStats:
    """What a run did; latencies are kept per answered request (tick to prediction)."""

    messages: int = 0
    book_events: int = 0
    triggers: int = 0
    on_time: int = 0
    late: int = 0
    """Answers that came after their due time, and requests never answered (`unanswered`):
    counted, never used."""
    unanswered: int = 0
    """Of `late`: requests with no answer at all by their due time and a grace (a stalled
    server), given up on."""
    refused: int = 0
    """Requests the scheduler refused or dropped because they could not finish in time, and
    `refused_unasked`."""
    refused_unasked: int = 0
    """Of `refused`: events whose due time passed before the feed could ask for them (behind
    the books and features of a long burst), never sent."""
    errors: int = 0
    first_error: str | None = None
    missed_messages: int = 0
    """Live: messages the feed never delivered (MoldUDP64 sequence gaps)."""
    feed: FeedStatistics | None = None
    """Live: the feed's own account of its sequence numbers, at the end."""
    bad_packets: int = 0
    """Live: datagrams (or messages in them) that did not parse, skipped."""
    skipped_frames: int = 0
    """A file's malformed frames (or damaged gzip tail) stepped over (`--on-error skip`)..."""
    first_skipped: dict[str, Any] | None = None
    """...the first of them (`frame_report`)..."""
    format_error: dict[str, Any] | None = None
    """...or the malformed frame that stopped the run (`--on-error stop`)."""
    unknown_symbols: list[str] = field(default_factory=list)
    """`--symbols` the feed never keyed (`FeedRun.unknown_symbols`): a typo asks for nothing."""
    book_anomalies: dict[str, int] = field(default_factory=dict)
    """The books' policy cases by kind (`Books.anomalies`), at the end: a gap in a live feed
    shows here as the orders it lost (unknown references)."""
    latency: HdrHistogram = field(default_factory=new_histogram)
    """Tick-to-prediction of each answer, late ones too (µs; constant memory for any file)."""
    pace_lag: HdrHistogram = field(default_factory=new_histogram)
    """How late each message was taken up at the recorded pace (µs, at least 1)."""
    new_latency_us: list[int] = field(default_factory=list)
    new_lag_us: list[int] = field(default_factory=list)
    """Values not in the histograms yet: appending is ~20x cheaper than recording, so the feed
    records them in the gaps between messages (`settle`), not while an event waits."""
    max_latency_us: int | None = None
    """The largest tick-to-prediction, exact (the histogram's is its bucket's bound).

    NOTE: the report's max was the bucket's: 1000447 µs in a run whose deadline was 1 s and
    none of whose answers was late (found by a tester)."""

    def note(self, values: list[int], value: int) -> None:
        values.append(value)
        if len(values) >= SETTLE_AT:
            self.settle()

    def settle(self) -> None:
        """Move the values noted so far into the histograms."""
        if self.new_latency_us:
            most = max(self.new_latency_us)
            if self.max_latency_us is None or most > self.max_latency_us:
                self.max_latency_us = most
        for histogram, values in ((self.latency, self.new_latency_us),
                                  (self.pace_lag, self.new_lag_us)):  # fmt: skip
            for value in values:
                record_us(histogram, value)
            values.clear()

    wall_ns: int = 0

    def report(self) -> dict[str, Any]:
        wall_s = max(self.wall_ns, 1) / 1e9
        answered = self.on_time + self.late
        return {
            "messages": self.messages,
            "book_events": self.book_events,
            "triggers": self.triggers,
            "on_time": self.on_time,
            "late_dropped": self.late,
            "unanswered": self.unanswered,
            "refused": self.refused,
            "refused_unasked": self.refused_unasked,
            "errors": self.errors,
            "first_error": self.first_error,
            "missed_messages": self.missed_messages,
            "bad_packets": self.bad_packets,
            "book_anomalies": self.book_anomalies,
            "unknown_symbols": self.unknown_symbols,
            **self._feed_report(),
            "misses": self.late + self.refused,
            "miss_rate": (self.late + self.refused) / self.triggers if self.triggers else 0.0,
            "tick_to_prediction_us": percentiles_us(self.latency, self.max_latency_us),
            "pace_lag_us": percentiles_us(self.pace_lag),
            "wall_s": round(wall_s, 3),
            "messages_per_s": round(self.messages / wall_s, 1),
            "predictions_per_s": round(answered / wall_s, 1),
        }

    def _feed_report(self) -> dict[str, Any]:
        feed = self.feed
        if feed is None:  # a file's (a live feed's bad datagrams are counted apart)
            return {
                "skipped_frames": self.skipped_frames,
                "first_skipped": self.first_skipped,
                "format_error": self.format_error,
            }
        return {
            "book_incomplete": feed.gaps > 0 or (feed.first_sequence or 1) > 1,
            "reordered_messages": feed.reordered,
            "queue_dropped_messages": feed.dropped,
            "gaps": feed.gaps,
            "first_gaps": [list(gap) for gap in feed.first_gaps],
            "first_sequence": feed.first_sequence,
            "duplicate_messages": feed.duplicates,
            "session": feed.session,
            "bad_packet_kinds": feed.bad_kinds,
            "end_of_session": feed.ended,
        }


def frame_report(error: ItchFormatError) -> dict[str, Any]:
    """A malformed frame as the report gives it: where, why, and the message said on stderr."""
    return {"offset": error.offset, "reason": error.reason, "message": str(error)}


class PredictionLog:
    """Predictions as CSV: timestamp, stock, latency, on-time flag, the feed's gaps before the
    event (`book_gaps`: 0, the book has every message; more, it may lack orders), signal and the
    outputs.

    A late answer, or a request never answered, gets a row with `on_time` 0 and no outputs: it
    was not used.

    A write that fails (a full disk) does not stop the run: the rows from then on are dropped
    and `error` keeps the failure, for the caller to report.
    """

    def __init__(self, out: TextIO | None, classes: int) -> None:
        self._out = out
        self.error: OSError | None = None
        self._rows: list[tuple[Any, ...]] = []
        self._writer = csv.writer(out) if out is not None else None
        self._unused = ("",) * (1 + classes)
        """A row's signal and outputs when the answer was not used: empty, in every column."""
        if self._writer is not None:
            outputs = [f"out{i}" for i in range(classes)]
            self._writer.writerow(
                ["timestamp", "stock", "latency_us", "on_time", "book_gaps", "signal", *outputs]
            )

    def add(
        self, ts: int, stock: str, latency_ns: int, outputs: np.ndarray | None, gaps: int
    ) -> None:
        if self._writer is None:
            return
        if outputs is None:
            self._rows.append((ts, stock, latency_ns // 1000, 0, gaps, *self._unused))
        else:
            flat = outputs.reshape(-1)
            # NOTE: the demo models' classes are (down, unchanged, up): the signal is -1, 0, +1
            signal = int(flat.argmax()) - 1 if flat.size == 3 else int(flat.argmax())
            self._rows.append((ts, stock, latency_ns // 1000, 1, gaps, signal, *flat.tolist()))
        if len(self._rows) >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self._writer is not None and self._rows:
            try:
                self._writer.writerows(self._rows)
            except OSError as exc:
                self._failed(exc)
            self._rows.clear()

    def close(self) -> None:
        """Write the rows kept and close the file (`error` says if that failed)."""
        self.flush()
        if self._out is not None:
            try:
                self._out.close()  # (the last buffered rows reach the disk here)
            except OSError as exc:
                self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        self.error = self.error or exc
        self._writer = None


def open_log(path: Path | None, classes: int, flag: str) -> PredictionLog:
    """The log writing to `path` (None: no file); `OutputError` naming `flag` if it cannot be
    opened (missing folders are created)."""
    if path is None:
        return PredictionLog(None, classes)
    make_parents(path, flag)
    try:
        out = path.open("w", newline="", encoding="utf-8")
    except OSError as exc:
        raise failed_write(path, flag, exc) from None
    return PredictionLog(out, classes)
