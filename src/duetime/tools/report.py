"""What a load-generator run measured: raw per-request records in, per-class summaries out.

`Records` holds one entry per measured request (numpy arrays, cheap to pickle and merge across
generator processes); `summarize` turns them into counts, rates, latency percentiles and the
generator's own cost; `BenchResult` is that with the run's settings, printable and JSON-able.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from duetime.tools.arrivals import DueClass
from duetime.tools.config import MAX_HTTP_CONNECTIONS, BenchConfig
from duetime.tools.hdr import histogram_of, percentiles_us, record_arrays, run_fields
from duetime.tools.interrupt import INTERRUPTED_DRAIN_S
from duetime.tools.outcomes import Outcome
from duetime.tools.payloads import GRPC_DEADLINE_MARGIN_S

LATE_SEND_NS = 1_000_000
"""A send this long after its scheduled time counts as late (the generator fell behind)."""
LATE_SEND_WARNING = 0.01
"""Fraction of late sends above which the report warns that the generator was the bottleneck."""
LATE_READ_WARNING = 0.01
"""Fraction of answers read late (`Records.read_late`) above which the report warns so too."""
WAITED_WARNING = 0.01
"""Fraction of requests that waited for a free HTTP connection (all the generator may open were
busy) above which the report warns: their wait counts in their latency."""
MAX_MESSAGES = 5
"""Error messages kept per run (the first ones seen)."""
EXIT_UNSENT = 3
"""`duetime bench`'s exit status when some requests could not be sent (no connection to the
server: it died or stopped listening mid-run), so that a CI script sees the run was broken."""


@dataclass(slots=True)
class Records:
    """The measured requests of one run, or of several generator processes merged.

    `latency_ns` runs from the scheduled send time (or the actual one, if that was earlier) to
    the answer; it is 0 for requests never answered. `send_lag_ns` is actual minus scheduled
    send time (always 0 in closed mode).
    """

    due_class: np.ndarray
    outcome: np.ndarray
    latency_ns: np.ndarray
    send_lag_ns: np.ndarray
    duration_s: float
    cpu_s: float
    waited: int = 0
    read_late: int = 0
    """Answers the generator read late, its loop busy (see `HttpPool.begin_turn`)."""
    error_messages: tuple[str, ...] = ()
    processes: int = 1
    scheduled_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Scheduled send instants from the window's start (the timeline of the JSON report);
    empty when not kept."""
    interrupted: bool = False
    """Ctrl-C ended the run early: `duration_s` is the part of the window it measured."""
    cut_short: int = 0
    """Late requests the client stopped waiting for (a gRPC call's own deadline fired): their
    latency runs to that instant, a lower bound."""
    unsent: int = 0
    """Requests that found no connection to the server (refused, unreachable): never sent, so
    in none of the arrays above."""
    unsent_class: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """The due class of each of the `unsent` (empty where not kept: counted in no class)."""
    last_answer_s: float = 0.0
    """From the window's start to the last successful answer (ok or late) of the requests
    above, which may come after the window, during --drain (0: none)."""

    @property
    def rate_span_s(self) -> float:
        """What throughput and goodput divide by: see `rate_span`."""
        return rate_span(self.duration_s, self.last_answer_s)


def rate_span(duration_s: float, last_answer_s: float) -> float:
    """The seconds answers are counted over: from the start of the measured window to the last
    answer counted, or to the window's end if that is later (vegeta's "duration + wait").

    NOTE: answers that came during --drain were once divided by the window alone: an
    overloaded server that answers 20 requests/s, sent 40/s for 2 s, read 40/s (its 80
    answers took 4 s)."""
    return max(duration_s, last_answer_s)


def merge_records(parts: Sequence[Records]) -> Records:
    """One Records of runs that happened side by side (same window): counts and CPU add up."""
    messages = [m for part in parts for m in part.error_messages][:MAX_MESSAGES]
    return Records(
        due_class=np.concatenate([p.due_class for p in parts]),
        outcome=np.concatenate([p.outcome for p in parts]),
        latency_ns=np.concatenate([p.latency_ns for p in parts]),
        send_lag_ns=np.concatenate([p.send_lag_ns for p in parts]),
        duration_s=max(p.duration_s for p in parts),
        cpu_s=sum(p.cpu_s for p in parts),
        waited=sum(p.waited for p in parts),
        read_late=sum(p.read_late for p in parts),
        error_messages=tuple(messages),
        processes=sum(p.processes for p in parts),
        scheduled_ns=np.concatenate([p.scheduled_ns for p in parts]),
        interrupted=any(p.interrupted for p in parts),
        cut_short=sum(p.cut_short for p in parts),
        unsent=sum(p.unsent for p in parts),
        unsent_class=np.concatenate([p.unsent_class for p in parts]),
        last_answer_s=max(p.last_answer_s for p in parts),
    )


def apply_due(
    outcome: np.ndarray, latency_ns: np.ndarray, due_class: np.ndarray, classes: Sequence[DueClass]
) -> np.ndarray:
    """`outcome` with each OK answer that came after its class's timeout turned into LATE."""
    settled = outcome.copy()
    for index, due in enumerate(classes):
        timeout_ns = due.timeout_ns
        if timeout_ns is None:
            continue
        late = (due_class == index) & (outcome == Outcome.OK) & (latency_ns > timeout_ns)
        settled[late] = Outcome.LATE
    return settled


# -- summaries -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Latency of successful answers (ok and late) in ms; None where there were none."""

    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    max_ms: float | None
    mean_ms: float | None


def latency_summary(latency_ns: np.ndarray) -> LatencySummary:
    """The latencies' percentiles (nearest rank), max and mean, read from an HDR histogram of
    them (µs, 3 significant digits: `hdr.percentiles_us`).

    NOTE: the estimator of the JSON's `latency_us` and of `duetime report`, so that the table's
    "all" row and they show the same figures; numpy's interpolated percentiles differed from
    them in the tail (P99 4.707 ms here, 4.663 there, for the same run)."""
    if latency_ns.size == 0:
        return LatencySummary(None, None, None, None, None, None)
    at = percentiles_us(histogram_of(latency_ns // 1000))
    p50, p90, p99, p999, top, mean = (
        float(at[name] or 0) / 1000 for name in ("p50", "p90", "p99", "p999", "max", "mean")
    )
    return LatencySummary(p50, p90, p99, p999, top, mean)


@dataclass(frozen=True, slots=True)
class ClassReport:
    """Counts, rates and latency of one due class (or of all requests: label "all").

    `sent` = ok + late + rejected + expired + errors. `throughput_rps` counts every successful
    answer (to a request sent in the measured window) per second from the window's start to
    the last of them (or to the window's end, if later: `rate_span`), `goodput_rps` only those
    within their due time, over the same seconds (so never more than `throughput_rps`).
    `unsent`: requests of the class scheduled in the window that found no connection to the
    server, so were never sent (in no other count).
    """

    label: str
    timeout_ms: float | None
    sent: int
    ok: int
    late: int
    rejected: int
    expired: int
    errors: int
    unanswered: int
    throughput_rps: float
    goodput_rps: float
    latency: LatencySummary
    unsent: int = 0


def class_report(
    label: str, timeout_ms: float | None, outcome: np.ndarray, latency_ns: np.ndarray,
    duration_s: float, unsent: int = 0,
) -> ClassReport:  # fmt: skip
    """Summary of the requests whose settled outcomes (see `apply_due`) are `outcome`, and of
    `unsent` more that were never sent."""
    counts = {kind: int(np.count_nonzero(outcome == kind)) for kind in Outcome}
    ok, late = counts[Outcome.OK], counts[Outcome.LATE]
    answered = (outcome == Outcome.OK) | (outcome == Outcome.LATE)
    return ClassReport(
        label=label,
        timeout_ms=timeout_ms,
        sent=int(outcome.size),
        ok=ok,
        late=late,
        rejected=counts[Outcome.REJECTED],
        expired=counts[Outcome.EXPIRED],
        errors=counts[Outcome.ERROR] + counts[Outcome.NO_ANSWER],
        unanswered=counts[Outcome.NO_ANSWER],
        throughput_rps=(ok + late) / duration_s if duration_s > 0 else 0.0,
        goodput_rps=ok / duration_s if duration_s > 0 else 0.0,
        latency=latency_summary(latency_ns[answered]),
        unsent=unsent,
    )


@dataclass(frozen=True, slots=True)
class GeneratorReport:
    """The load generator's own cost and timeliness over the measured window.

    `cpu_per_1k_rps` is the fraction of one core the generator used per 1,000 requests/s it
    attempted, sent or not (numerically: CPU seconds per 1,000 attempts). `late_send_fraction`
    is the share of sends more than 1 ms after their scheduled time; None in closed mode, which
    has no schedule. `unsent` counts requests that found no connection to the server: not sent,
    so in no other count or rate than `cpu_per_1k_rps`'s.
    """

    processes: int
    cpu_s: float
    cpu_cores: float
    offered_rps: float
    cpu_per_1k_rps: float | None
    late_send_fraction: float | None
    send_lag_p99_ms: float | None
    send_lag_max_ms: float | None
    waited_fraction: float
    unsent: int = 0
    late_read_fraction: float = 0.0
    """The share of sends whose answer the generator read more than 1 ms after its loop's turn
    began (HTTP): its own delay, counted in their latency."""
    with_engine: bool = False
    """In-process (`--repository`): the engine and its models' runs share the generator's
    process, and its CPU counts theirs too.

    NOTE: the line called it "the generator's", 2.1% of a core with an Identity model and
    36.8% with a 3.3 ms one at the same rate, and told it to "add --processes", which
    --repository refuses (found by a tester)."""


def generator_report(
    records: Records, open_loop: bool, with_engine: bool = False
) -> GeneratorReport:
    sent = int(records.outcome.size)
    # NOTE: per attempt, not per request sent: the window's CPU also went on the attempts that
    # found no connection (the server died mid-run), and dividing it by the sent alone made
    # the generator look twice as costly as it is
    attempted = sent + records.unsent
    duration = records.duration_s
    lag = records.send_lag_ns
    timely = open_loop and lag.size > 0
    return GeneratorReport(
        processes=records.processes,
        cpu_s=records.cpu_s,
        cpu_cores=records.cpu_s / duration if duration > 0 else 0.0,
        offered_rps=sent / duration if duration > 0 else 0.0,
        cpu_per_1k_rps=1000 * records.cpu_s / attempted if attempted else None,
        late_send_fraction=float(np.mean(lag > LATE_SEND_NS)) if timely else None,
        send_lag_p99_ms=float(np.percentile(lag, 99)) / 1e6 if timely else None,
        send_lag_max_ms=float(lag.max()) / 1e6 if timely else None,
        waited_fraction=records.waited / sent if sent else 0.0,
        unsent=records.unsent,
        late_read_fraction=records.read_late / sent if sent else 0.0,
        with_engine=with_engine,
    )


@dataclass(frozen=True, slots=True)
class Summary:
    """Everything a report shows: per class, overall, the generator, and what to watch out for."""

    classes: tuple[ClassReport, ...]
    overall: ClassReport
    generator: GeneratorReport
    error_messages: tuple[str, ...]
    warnings: tuple[str, ...]


def summarize(
    records: Records,
    classes: Sequence[DueClass],
    *,
    open_loop: bool,
    with_engine: bool = False,
) -> Summary:
    """Settle late answers by each class's timeout, then count and time everything."""
    outcome = apply_due(records.outcome, records.latency_ns, records.due_class, classes)
    duration = records.rate_span_s
    per_class = tuple(
        class_report(
            due.label,
            due.timeout_ms,
            outcome[records.due_class == index],
            records.latency_ns[records.due_class == index],
            duration,
            int(np.count_nonzero(records.unsent_class == index)),
        )
        for index, due in enumerate(classes)
    )
    overall = class_report("all", None, outcome, records.latency_ns, duration, records.unsent)
    generator = generator_report(records, open_loop, with_engine)
    warnings = _warnings(overall, generator, records.cut_short, open_loop=open_loop,
                         interrupted=records.interrupted)  # fmt: skip
    return Summary(per_class, overall, generator, records.error_messages, warnings)


def unanswered_warning(count: int, run: str, interrupted: bool, share: str = "") -> str:
    """The warning for `count` requests with no answer at the end of a `run` ("run",
    "replay"), cut short by Ctrl-C or not (`interrupted`; then not told to "raise --drain",
    which it never used up: found by a tester); `share`: how many of those sent they are."""
    ended = (
        f"when the {run} ended (after Ctrl-C it waits at most {INTERRUPTED_DRAIN_S:g} s for "
        "them, whatever --drain says)" if interrupted else "by the end of --drain"
    )  # fmt: skip
    return (
        f"{count:,} requests had no answer {ended}; they count as errors and are not in the "
        "latency percentiles, which cover answers only (so understate the slowest"
        + (f": {share})" if share else ")")
        + ("" if interrupted else "; raise --drain to time them")
    )


def _warnings(
    overall: ClassReport, generator: GeneratorReport, cut_short: int = 0, *,
    open_loop: bool = True, interrupted: bool = False,
) -> tuple[str, ...]:  # fmt: skip
    """What to watch out for in the run, each with what to change.

    NOTE: a closed loop's advice was to "lower --rate", which it does not take (its load is
    --concurrency); and a run Ctrl-C cut short in its drain was told to "raise --drain", which
    it never used up (found by a tester)."""
    load = "lower --rate" if open_loop else "lower --concurrency"
    found = []
    late = generator.late_send_fraction
    if late is not None and late > LATE_SEND_WARNING:
        found.append(
            f"{late:.1%} of sends went out more than 1 ms after their scheduled time: the "
            + (
                "generator and the engine, in one process, were a bottleneck; lower --rate"
                if generator.with_engine
                else "generator (or the CPU it shares) was a bottleneck; lower --rate or add "
                "--processes"
            )
        )
    if generator.waited_fraction > WAITED_WARNING:
        found.append(
            f"{generator.waited_fraction:.1%} of requests waited for a free HTTP connection (all "
            f"{MAX_HTTP_CONNECTIONS} the generator may open were busy), which adds to their "
            f"latency; {load} or add --processes"
        )
    if generator.late_read_fraction > LATE_READ_WARNING:
        found.append(
            f"{generator.late_read_fraction:.1%} of answers waited more than 1 ms in the "
            "generator's sockets before it read them (its loop was busy), which adds to their "
            f"latency: the generator (or the CPU it shares) was a bottleneck; {load} or give "
            "it more CPU"
        )
    if generator.unsent:
        found.append(
            f"{generator.unsent} requests were not sent: no connection to the server could be "
            f"opened (counted as unsent only; bench exits {EXIT_UNSENT}); is it running?"
        )
    if cut_short:
        found.append(
            f"{cut_short} late requests had no answer when their gRPC call's own deadline (the "
            f"timeout + {GRPC_DEADLINE_MARGIN_S:g} s) fired; their latency counts up to then"
        )
    if overall.unanswered:
        share = f"{100 * overall.unanswered / max(1, overall.sent):.1f}% of those sent"
        found.append(unanswered_warning(overall.unanswered, "run", interrupted, share))
    if overall.sent == 0:
        more = "--duration or --rate" if open_loop else "--duration"
        found.append(f"no request was sent in the measured window; raise {more}")
    return tuple(found)


# -- printing ------------------------------------------------------------------------------------

_COLUMNS = ("class", "sent", "ok", "late", "rejected", "expired", "errors", "thru/s", "good/s",
            "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms")  # fmt: skip


def format_report(summary: Summary, title: str) -> str:
    """The summary as a text table, one row per class then "all", with the generator's cost;
    an `unsent` column after `errors` when some requests could not be sent."""
    unsent = summary.overall.unsent > 0
    columns = _columns(unsent)
    rows = [_row(report, unsent) for report in (*summary.classes, summary.overall)]
    if len(summary.classes) == 1:
        rows = rows[-1:]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    lines = [title, "  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    lines.append(_generator_line(summary.generator))
    lines += [f"error: {message}" for message in summary.error_messages]
    lines += [f"WARNING: {warning}" for warning in summary.warnings]
    return "\n".join(lines)


def _columns(unsent: bool) -> tuple[str, ...]:
    if not unsent:
        return _COLUMNS
    at = _COLUMNS.index("errors") + 1
    return (*_COLUMNS[:at], "unsent", *_COLUMNS[at:])


def _row(report: ClassReport, unsent: bool = False) -> list[str]:
    latency = report.latency
    times = (latency.p50_ms, latency.p90_ms, latency.p99_ms, latency.p999_ms, latency.max_ms)
    counts: tuple[int, ...] = (
        report.sent, report.ok, report.late, report.rejected, report.expired, report.errors,
    )  # fmt: skip
    if unsent:
        counts += (report.unsent,)
    return [
        report.label,
        *(str(c) for c in counts),
        f"{report.throughput_rps:,.1f}",
        f"{report.goodput_rps:,.1f}",
        *("-" if t is None else f"{t:.3f}" for t in times),
    ]


WAITED_SHARE_NOTED = 0.05
"""The share of requests that waited for a connection from which the generator line says that
its cost per 1k requests/s counts requests scheduled, not sent."""


def _generator_line(generator: GeneratorReport) -> str:
    per_1k = generator.cpu_per_1k_rps
    who = (
        "generator and engine (in-process: the models' runs count too)"
        if generator.with_engine
        else "generator"
    )
    line = (
        f"{who}: {generator.processes} process(es), {generator.cpu_s:.2f} CPU s "
        f"({generator.cpu_cores:.1%} of a core) at {generator.offered_rps:,.0f} req/s sent = "
        f"{'-' if per_1k is None else f'{per_1k:.3f}'} cores per 1k req/s"
    )
    if generator.unsent:
        line += " attempted (sent, or found no connection)"
    if generator.late_send_fraction is not None:
        line += (
            f"; sends >1 ms late: {generator.late_send_fraction:.2%} "
            f"(lag p99 {generator.send_lag_p99_ms:.2f} ms, max {generator.send_lag_max_ms:.2f} ms)"
        )
    if generator.waited_fraction:
        line += f"; waited for a free connection: {generator.waited_fraction:.1%}"
        if generator.waited_fraction >= WAITED_SHARE_NOTED:
            # NOTE: at 50,000 requests/s on one process, 87-98% of them waited in the
            # generator, and its 0.012-0.020 cores per 1k were per request scheduled: per
            # request the server got, 0.042 (found by a tester)
            line += " (so the cost per 1k is per request scheduled: per request sent it is more)"
    if generator.late_read_fraction:
        line += f"; answers read >1 ms late: {generator.late_read_fraction:.2%}"
    if generator.unsent:
        line += f"; not sent (no connection): {generator.unsent}"
    return line


# -- the result of a run -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BenchResult:
    """What one run measured: per due class, overall, and the generator's own cost."""

    config: BenchConfig
    classes: tuple[ClassReport, ...]
    overall: ClassReport
    generator: GeneratorReport
    error_messages: tuple[str, ...]
    warnings: tuple[str, ...]
    report_fields: dict[str, Any] | None = None
    """The fields `duetime report` reads (`hdr.run_fields`): None without hdrhistogram."""
    interrupted: bool = False
    """Ctrl-C stopped the run: the counts and rates cover the `measured_s` it ran."""
    measured_s: float | None = None
    """Seconds of the measured window the run covered (--duration, unless interrupted)."""

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["config"]["repository"] = (
            None if self.config.repository is None else str(self.config.repository)
        )
        doc.update(doc.pop("report_fields") or {})
        return doc

    def format(self) -> str:
        summary = Summary(self.classes, self.overall, self.generator, self.error_messages,
                          self.warnings)  # fmt: skip
        text = format_report(summary, describe(self.config))
        if self.interrupted:
            measured = self.config.duration_s if self.measured_s is None else self.measured_s
            text += (
                f"\nINTERRUPTED (Ctrl-C): partial results, {measured:.2f} s of the "
                f"{self.config.duration_s:g} s measured"
            )
        return text


def describe(config: BenchConfig) -> str:
    """One line saying what a run does."""
    if config.mode == "open":
        load = f"open loop, {config.arrival} {config.rate:g} req/s"
    else:
        load = f"closed loop, {config.concurrency} clients"
    target = config.repository if config.protocol == "engine" else config.address
    return (
        f"duetime bench: {load}, {config.protocol} {target or ''}, model {config.model} "
        f"batch {config.batch}, {config.duration_s:g} s after {config.warmup_s:g} s warm-up"
    )


def result_of(config: BenchConfig, records: Records) -> BenchResult:
    summary = summarize(
        records, config.classes, open_loop=config.mode == "open",
        with_engine=config.protocol == "engine",
    )  # fmt: skip
    return BenchResult(
        config, summary.classes, summary.overall, summary.generator, summary.error_messages,
        summary.warnings, report_fields(config, records, summary.overall), records.interrupted,
        records.duration_s,
    )  # fmt: skip


def report_fields(
    config: BenchConfig, records: Records, overall: ClassReport
) -> dict[str, Any] | None:
    """The run as `duetime report` reads it: HDR histogram, per-second timeline, counts (the
    unsent and unanswered ones `overall`'s, at the top as a replay's result has them: a script
    reading one layout read no `unanswered` from a bench's, found by a tester)."""
    if records.scheduled_ns.size != records.outcome.size:
        return None
    outcome = apply_due(records.outcome, records.latency_ns, records.due_class, config.classes)
    recorded = record_arrays(records.scheduled_ns, records.latency_ns, outcome)
    return run_fields(
        "bench", describe(config), records.duration_s, recorded, span_s=records.rate_span_s,
        unsent=overall.unsent, unanswered=overall.unanswered,
    )  # fmt: skip
