"""Latency recording for runs of any length: an HDR histogram of the whole run (constant memory,
1 µs to 60 s at 3 significant digits) and one row of counts and percentiles per second.

`LatencyRecorder` is fed each send and each end as they happen (the replay) or afterwards from
arrays (the bench); `Recorded` is what it kept, and `run_fields` the JSON both commands write so
that `duetime report` reads either. The histogram travels base64-encoded (`HdrHistogram.encode`),
so several runs' histograms merge exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from duetime.tools.outcomes import Outcome

if TYPE_CHECKING:
    from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

LOWEST_US = 1
HIGHEST_US = 60_000_000
"""Latencies above this (60 s) are recorded as 60 s."""
DIGITS = 3
INTERVAL_NS = 1_000_000_000
"""The timeline's bucket: one second."""
REPORT_FORMAT = 1
"""Version of the shared JSON fields (`run_fields`); `duetime report` checks it."""


class MissingHdr(ImportError):
    """The `hdrhistogram` package is not installed."""


def _histogram_class() -> Any:
    # NOTE: imported on first use: the server and `duetime serve` never need it.
    try:
        from hdrh.histogram import HdrHistogram
    except ImportError as exc:
        raise MissingHdr(
            f"latency histograms need the hdrhistogram package ({exc}), a dependency of "
            "duetime: pip install 'hdrhistogram>=0.10'"
        ) from None
    return HdrHistogram


def new_histogram() -> HdrHistogram:
    histogram: HdrHistogram = _histogram_class()(LOWEST_US, HIGHEST_US, DIGITS)
    return histogram


def encode(histogram: HdrHistogram) -> str:
    text: bytes = histogram.encode()
    return text.decode("ascii")


def decode(text: str) -> HdrHistogram:
    """A histogram from `encode`'s text; ValueError if the text is not one."""
    cls = _histogram_class()
    try:
        histogram: HdrHistogram = cls.decode(text.encode("ascii"))
        return histogram
    except Exception as exc:  # hdrh raises assorted errors on bad input
        raise ValueError(f"not an encoded HDR histogram: {exc}") from None


def merge(encoded: Iterable[str]) -> HdrHistogram:
    """One histogram holding every value of the encoded ones."""
    total = new_histogram()
    for text in encoded:
        total.add(decode(text))
    return total


def record_us(histogram: HdrHistogram, latency_us: int) -> None:
    histogram.record_value(min(max(latency_us, LOWEST_US), HIGHEST_US))


def histogram_of(latency_us: np.ndarray) -> HdrHistogram:
    """A histogram of `latency_us` (µs, clipped to the histogram's range), recorded per
    distinct value."""
    histogram = new_histogram()
    clipped = np.clip(latency_us, LOWEST_US, HIGHEST_US)
    for value, count in zip(*np.unique(clipped, return_counts=True), strict=True):
        histogram.record_value(int(value), int(count))
    return histogram


PERCENTILES = {"p50": 500, "p90": 900, "p99": 990, "p999": 999}
"""The percentiles every result shows, in tenths of a percent (integers: exact ranks)."""


def nearest_ranks(count: int) -> dict[str, int]:
    """The 1-based rank of each of PERCENTILES among `count` sorted values, by nearest rank
    (ceil(p x count), at least 1): at least p of the values are at or below the value there."""
    return {name: max(1, -(-tenths * count // 1000)) for name, tenths in PERCENTILES.items()}


def percentiles_us(
    histogram: HdrHistogram, max_us: float | None = None
) -> dict[str, float | int | None]:
    """count, p50, p90, p99, p999, max and mean in µs (None without values); the percentiles
    by nearest rank, each its bucket's highest value (3 significant digits: never under the
    value at that rank, at most 0.1% over); `max_us`, where the caller kept the exact largest
    value, is the max (and bounds the percentiles), else its bucket's highest value.

    NOTE: hdrh's own percentiles round the rank to the nearest (count x p + 0.5): with fewer
    values than 1/(1 - p) they reported a value that more than 1 - p of them exceed (880
    answers: P99.9 was the second largest, and only 98.98% were at or below P99). Read from
    the histogram, not from exact latencies where a bench has them: the bench's table, its
    JSON and `duetime report` (which has only the histogram) then show the same figures."""
    count = int(histogram.get_total_count())
    if count == 0:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "p999": None, "max": None,
                "mean": None}  # fmt: skip
    ranked = _ranked(histogram, nearest_ranks(count))
    top = float(histogram.get_max_value())
    if max_us is not None:
        top = float(max_us)
        ranked = {name: min(value, top) for name, value in ranked.items()}
    return {
        "count": count, **ranked, "max": top,
        "mean": float(histogram.get_mean_value()),
    }  # fmt: skip


def _ranked(histogram: HdrHistogram, ranks: dict[str, int]) -> dict[str, float]:
    """The histogram's value at each rank (1-based, of its values in order)."""
    found: dict[str, float] = {}
    wanted = sorted(ranks.items(), key=lambda item: item[1])
    seen = 0
    for item in histogram.get_recorded_iterator():
        seen += int(item.count_at_value_iterated_to)
        while wanted and wanted[0][1] <= seen:
            found[wanted.pop(0)[0]] = float(item.value_iterated_to)
        if not wanted:
            break
    return found


def cdf_points(histogram: HdrHistogram) -> tuple[np.ndarray, np.ndarray]:
    """(latency µs, fraction of values at or below it) at every recorded value: an exact CDF."""
    values: list[float] = []
    counts: list[int] = []
    for item in histogram.get_recorded_iterator():
        values.append(float(item.value_iterated_to))
        counts.append(int(item.count_at_value_iterated_to))
    total = max(1, sum(counts))
    return np.asarray(values), np.cumsum(np.asarray(counts, dtype=np.float64)) / total


# -- the timeline --------------------------------------------------------------------------------

_ENDS = ("ok", "late", "rejected", "expired", "errors")
_END_OF: dict[int, int] = {
    Outcome.OK: 0, Outcome.LATE: 1, Outcome.REJECTED: 2, Outcome.EXPIRED: 3, Outcome.ERROR: 4,
    Outcome.NO_ANSWER: 4,
}  # fmt: skip


@dataclass(slots=True)
class Timeline:
    """Per second of the run: requests sent, how the requests that ended in it ended, and the
    latency percentiles of its successful answers (µs; None in a second without any)."""

    interval_s: float = INTERVAL_NS / 1e9
    sent: list[int] = field(default_factory=list)
    ok: list[int] = field(default_factory=list)
    late: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    expired: list[int] = field(default_factory=list)
    errors: list[int] = field(default_factory=list)
    p50_us: list[float | None] = field(default_factory=list)
    p99_us: list[float | None] = field(default_factory=list)
    max_us: list[float | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.sent)

    def grow(self, size: int) -> None:
        """Make room for `size` seconds."""
        while len(self.sent) < size:
            for counts in (self.sent, self.ok, self.late, self.rejected, self.expired,
                           self.errors):  # fmt: skip
                counts.append(0)
            for times in (self.p50_us, self.p99_us, self.max_us):
                times.append(None)

    def to_json(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s, "sent": self.sent, "ok": self.ok, "late": self.late,
            "rejected": self.rejected, "expired": self.expired, "errors": self.errors,
            "p50_us": self.p50_us, "p99_us": self.p99_us, "max_us": self.max_us,
        }  # fmt: skip

    @classmethod
    def from_json(cls, doc: Any) -> Timeline:
        """ValueError naming the field when `doc` is not a timeline.

        NOTE: a result edited by hand (`"timeline": null`, a column of strings) ended
        `duetime report` in an AttributeError or a TypeError deep in matplotlib; every field is
        checked here, as `duetime bench --json` writes it."""
        if not isinstance(doc, Mapping):
            raise ValueError(f"timeline: expected an object, got {_kind(doc)}")
        interval = _number(doc.get("interval_s", 1.0), "timeline.interval_s")
        if interval <= 0:
            raise ValueError(f"timeline.interval_s: expected a number above 0, got {interval}")
        timeline = cls(interval_s=interval)
        sent = doc.get("sent")
        size = len(sent) if isinstance(sent, list) else 0
        for name in ("sent", *_ENDS, "p50_us", "p99_us", "max_us"):
            column = doc.get(name)
            if not isinstance(column, list) or len(column) != size:
                raise ValueError(f"timeline.{name}: expected a list of {size} values")
            if name.endswith("_us"):
                values: list[Any] = [
                    None if v is None else _number(v, f"timeline.{name}[{i}]")
                    for i, v in enumerate(column)
                ]
            else:
                values = [_count(v, f"timeline.{name}[{i}]") for i, v in enumerate(column)]
            setattr(timeline, name, values)
        return timeline


def _kind(value: Any) -> str:
    return (
        "null" if value is None else repr(value) if isinstance(value, str) else type(value).__name__
    )


def _number(value: Any, where: str) -> float:
    """`value` as a finite number at least 0; ValueError naming `where`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: expected a number, got {_kind(value)}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: expected a finite number, 0 or more, got {value}")
    return float(value)


def _count(value: Any, where: str) -> int:
    """`value` as a whole number at least 0; ValueError naming `where`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        shown = (
            value
            if isinstance(value, int | float) and not isinstance(value, bool)
            else _kind(value)
        )
        raise ValueError(f"{where}: expected a whole number, 0 or more, got {shown}")
    return value


# -- recording -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Recorded:
    """What a LatencyRecorder kept of one run."""

    histogram: HdrHistogram
    """Latency of successful answers (ok and late), µs."""
    timeline: Timeline


class LatencyRecorder:
    """Records sends and ends of one run, instants in ns of one clock, from `start_ns` on.

    Ends come in time order (each is filed in the second it happened); the latencies of the
    current second are kept until the next begins, the rest is a fixed-size histogram and a
    few numbers per second.
    """

    def __init__(self, start_ns: int, interval_ns: int = INTERVAL_NS) -> None:
        self.start_ns = start_ns
        self.interval_ns = interval_ns
        self.histogram = new_histogram()
        self.timeline = Timeline(interval_s=interval_ns / 1e9)
        self._second = 0
        self._latencies_us: list[int] = []

    def sent(self, at_ns: int) -> None:
        index = max(0, (at_ns - self.start_ns) // self.interval_ns)
        timeline = self.timeline
        if index >= len(timeline.sent):
            timeline.grow(index + 1)
        timeline.sent[index] += 1

    def ended(self, at_ns: int, latency_ns: int, outcome: int) -> None:
        """One request's end; `latency_ns` counts only for OK and LATE answers."""
        index = max(0, (at_ns - self.start_ns) // self.interval_ns)
        if index != self._second:
            self._close_second()
            self._second = index
        timeline = self.timeline
        if index >= len(timeline.sent):
            timeline.grow(index + 1)
        end = _END_OF[outcome]
        if end == 0:
            timeline.ok[index] += 1
        elif end == 1:
            timeline.late[index] += 1
        else:
            (timeline.rejected, timeline.expired, timeline.errors)[end - 2][index] += 1
        if end <= 1:
            latency_us = latency_ns // 1000
            self._latencies_us.append(latency_us)
            record_us(self.histogram, latency_us)

    def p99_us(self) -> float | None:
        """The P99 so far (a scan of the histogram: for a progress line, not per request)."""
        if self.histogram.get_total_count() == 0:
            return None
        return float(self.histogram.get_value_at_percentile(99))

    def finish(self) -> Recorded:
        self._close_second()
        return Recorded(self.histogram, self.timeline)

    def _close_second(self) -> None:
        latencies = self._latencies_us
        if not latencies:
            return
        self._latencies_us = []
        p50, p99 = np.percentile(np.asarray(latencies, dtype=np.float64), [50, 99])
        timeline, index = self.timeline, self._second
        timeline.grow(index + 1)
        timeline.p50_us[index] = float(p50)
        timeline.p99_us[index] = float(p99)
        timeline.max_us[index] = float(max(latencies))


def record_arrays(
    sent_ns: np.ndarray, latency_ns: np.ndarray, outcome: np.ndarray, start_ns: int = 0
) -> Recorded:
    """What a LatencyRecorder fed in time order would keep, computed from whole-run arrays
    (vectorised): each request's send instant, latency and settled outcome; answered requests
    end at send + latency, the others at their send."""
    answered = (outcome == Outcome.OK) | (outcome == Outcome.LATE)
    ends = np.where(answered, sent_ns + latency_ns, sent_ns)
    sent_at = np.maximum(0, (sent_ns - start_ns) // INTERVAL_NS)
    end_at = np.maximum(0, (ends - start_ns) // INTERVAL_NS)
    size = int(max(sent_at.max(initial=-1), end_at.max(initial=-1))) + 1
    timeline = Timeline()
    timeline.grow(size)
    timeline.sent = np.bincount(sent_at, minlength=size).tolist()
    # the end codes are the Outcome values, with NO_ANSWER (-1) an error (4)
    kinds = np.where(outcome < 0, _END_OF[Outcome.NO_ANSWER], outcome)
    for code, name in enumerate(_ENDS):
        counts = np.bincount(end_at[kinds == code], minlength=size)
        setattr(timeline, name, counts.tolist())
    latency_us = latency_ns[answered] // 1000
    seconds = end_at[answered]
    order = np.argsort(seconds, kind="stable")
    seconds, latency_us = seconds[order], latency_us[order]
    bounds = np.flatnonzero(np.diff(seconds)) + 1
    for group in np.split(np.arange(seconds.size), bounds):
        if group.size == 0:
            continue
        values = latency_us[group].astype(np.float64)
        p50, p99 = np.percentile(values, [50, 99])
        index = int(seconds[group[0]])
        timeline.p50_us[index], timeline.p99_us[index] = float(p50), float(p99)
        timeline.max_us[index] = float(values.max())
    return Recorded(histogram_of(latency_us), timeline)


# -- the JSON every run writes -------------------------------------------------------------------


def run_fields(
    kind: str,
    label: str,
    duration_s: float,
    recorded: Recorded,
    extra: Mapping[str, Any] | None = None,
    *,
    span_s: float | None = None,
    unsent: int,
    unanswered: int,
) -> dict[str, Any]:
    """The fields `duetime report` reads, the same for a bench and a replay result.
    `span_s`: the seconds the rates divide by (`report.rate_span`; default `duration_s`);
    `unsent` and `unanswered`: the run's own counts (bench's `overall`, replay's tally)."""
    timeline = recorded.timeline
    counts = {name: int(sum(getattr(timeline, name))) for name in ("sent", *_ENDS)}
    span_s = duration_s if span_s is None else span_s
    span = span_s if span_s > 0 else math.inf
    return {
        "report_format": REPORT_FORMAT,
        "kind": kind,
        "label": label,
        "duration_s": duration_s,
        "rate_span_s": span_s,
        **counts,
        "throughput_rps": (counts["ok"] + counts["late"]) / span,
        "goodput_rps": counts["ok"] / span,
        "latency_us": percentiles_us(recorded.histogram),
        "histogram": {
            "unit": "us",
            "lowest": LOWEST_US,
            "highest": HIGHEST_US,
            "digits": DIGITS,
            "encoded": encode(recorded.histogram),
        },
        "timeline": timeline.to_json(),
        "unsent": unsent,
        "unanswered": unanswered,
        **(extra or {}),
    }


@dataclass(frozen=True, slots=True)
class RunReport:
    """One run as `duetime report` sees it (read back from `run_fields`' JSON): `label` names
    it in plots (the file's name unless given), `description` is what the run said of itself."""

    label: str
    description: str
    kind: str
    duration_s: float
    counts: dict[str, int]
    goodput_rps: float
    histogram: HdrHistogram
    timeline: Timeline
    batch_sizes: dict[int, int] = field(default_factory=dict)
    """Executions per batch size the server ran during the run (`--metrics`), all models."""
    unsent: int = 0
    """Requests that found no connection to the server, never sent (in no count above)."""
    unanswered: int = 0
    """Requests sent that had no answer by the end of the run's --drain (counted in
    `errors`)."""
    interrupted: bool = False
    """Ctrl-C ended the run early: `duration_s` is the part of it measured."""
    skipped: int = 0
    """Records of a replay's capture that did not decode, so were not replayed."""

    @property
    def latency_us(self) -> dict[str, float | int | None]:
        return percentiles_us(self.histogram)

    @property
    def problems(self) -> tuple[str, ...]:
        """What makes the run incomplete, short, each a phrase (none: it ran whole): its
        percentiles cover the few answers it got, so it is not a run to rank by them."""
        found = []
        if self.unsent:
            found.append(f"{_many(self.unsent, 'request')} unsent, finding no connection to "
                         "the server")  # fmt: skip
        if self.unanswered:
            end = "the run" if self.interrupted else "--drain"  # (Ctrl-C cuts the drain short)
            found.append(f"{_many(self.unanswered, 'request')} unanswered by the end of {end}")
        if self.interrupted:
            found.append(f"interrupted by Ctrl-C after {self.duration_s:.2f} s measured")
        if self.skipped:
            found.append(f"{_many(self.skipped, 'capture record')} skipped, not decoding")
        return tuple(found)

    @classmethod
    def from_json(cls, doc: Any, where: str) -> RunReport:
        """ValueError saying what is missing when `doc` is no bench or replay result: naming
        the field that is missing or of the wrong kind.

        The counts, `goodput_rps` and `duration_s` must be there (every result since
        `report_format` 1 has them). What marks a run incomplete (`problems`) is read where
        there: `unsent` and `unanswered` (a bench result's in `overall`), `interrupted`,
        `skipped`; a result written before one of them was has none.

        NOTE: a missing count was once read as 0: a result without its `sent` showed
        "sent 0" beside "ok 100" (found by a tester); and the marks were not read at all, so
        a run whose server died (58 unsent) was ranked best by the P99 of its 36 answers."""
        if not isinstance(doc, dict) or "histogram" not in doc or "timeline" not in doc:
            raise ValueError(
                f"{where}: not a result of `duetime bench --json` or `duetime replay --json` "
                "(no 'histogram' and 'timeline' fields; results from before they were added "
                "cannot be plotted)"
            )
        version = doc.get("report_format", REPORT_FORMAT)
        if version != REPORT_FORMAT:
            raise ValueError(
                f"{where}: report_format {version!r}: this duetime reads format {REPORT_FORMAT}"
            )
        try:
            encoded = doc["histogram"]
            if not isinstance(encoded, Mapping) or not isinstance(encoded.get("encoded"), str):
                raise ValueError(
                    f"histogram: expected an object with an 'encoded' text, got {_kind(encoded)}"
                )
            histogram = decode(encoded["encoded"])
            timeline = Timeline.from_json(doc["timeline"])
            counts = {name: _count(_required(doc, name), name) for name in ("sent", *_ENDS)}
            overall = doc.get("overall", {})  # (a bench result's; a replay's has none)
            if not isinstance(overall, Mapping):
                raise ValueError(f"overall: expected an object, got {_kind(overall)}")
            interrupted = doc.get("interrupted", False)
            if not isinstance(interrupted, bool):
                raise ValueError(f"interrupted: expected true or false, got {_kind(interrupted)}")
            return cls(
                label=where, description=str(doc.get("label", "")),
                kind=str(doc.get("kind", "?")),
                duration_s=_number(_required(doc, "duration_s"), "duration_s"), counts=counts,
                goodput_rps=_number(_required(doc, "goodput_rps"), "goodput_rps"),
                histogram=histogram, timeline=timeline,
                batch_sizes=_batch_sizes(doc.get("batch_sizes") or {}),
                unsent=_mark(doc, overall, "unsent"),
                unanswered=_mark(doc, overall, "unanswered"), interrupted=interrupted,
                skipped=_count(doc.get("skipped", 0), "skipped"),
            )  # fmt: skip
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


def _many(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _required(doc: Mapping[str, Any], name: str) -> Any:
    """`doc`'s field `name`; ValueError naming it when it is missing."""
    if name not in doc:
        raise ValueError(
            f"{name}: missing (every result of `duetime bench --json` or `duetime replay "
            "--json` has it: a damaged or edited file?)"
        )
    return doc[name]


def _mark(doc: Mapping[str, Any], overall: Mapping[str, Any], name: str) -> int:
    """The count `name` of a result: at the top (both write it there), or in `overall` (a
    bench's result before it did); ValueError naming it where neither has it.

    NOTE: 0 where neither had it: a bench result without its `overall`, 111 requests
    unanswered, was ranked the run of the lowest P99 (found by a tester)."""
    if name in doc:
        return _count(doc[name], name)
    if name in overall:
        return _count(overall[name], f"overall.{name}")
    return _count(_required(doc, name), name)


def _batch_sizes(by_model: Any) -> dict[int, int]:
    """A result's `batch_sizes` (model -> size -> executions) summed over its models;
    ValueError naming the field that is not so."""
    if not isinstance(by_model, Mapping):
        raise ValueError(f"batch_sizes: expected an object, got {_kind(by_model)}")
    total: dict[int, int] = {}
    for model, sizes in by_model.items():
        if not isinstance(sizes, Mapping):
            raise ValueError(f"batch_sizes.{model}: expected an object, got {_kind(sizes)}")
        for size, count in sizes.items():
            where = f"batch_sizes.{model}.{size}"
            if not (isinstance(size, str) and size.isascii() and size.isdigit() and int(size) > 0):
                raise ValueError(f"{where}: expected a batch size (a whole number above 0)")
            total[int(size)] = total.get(int(size), 0) + _count(count, where)
    return dict(sorted(total.items()))
