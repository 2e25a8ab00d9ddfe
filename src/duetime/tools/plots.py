"""Reports of bench and replay runs: a self-contained HTML page (PNG plots inlined, a summary
table) or one PNG. matplotlib (Agg, no display) is imported here only, so the server never needs
it: `pip install 'duetime[report]'`.

Plots: the classic HDR percentile plot (latency against 1/(1-q), so the tail gets room) and the
CDF, every run overlaid; per run, p50 and p99 per second with the sent rate on a second axis;
goodput (on-time answers per second) and failures (rejected, expired, errors) per second.
The table marks the complete run with the lowest P99, and the incomplete runs (not ranked).
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from duetime.tools.hdr import RunReport, cdf_points

MIN_PARTIAL = 0.5
"""A run's last, partial second is plotted as a rate (its counts over its real length) when it
covers at least this share of a second of the run; a shorter one is left off the rate plots: a
few requests over a sliver of a second would plot as a spike (or a collapse)."""
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
          "#17becf")  # fmt: skip
_NINES = (0.5, 0.9, 0.99, 0.999, 0.9999, 0.99999)


def color(index: int) -> str:
    return COLORS[index % len(COLORS)]


def _plain(value: float, _: object = None) -> str:
    return f"{value:g}"


def _plain_minor(value: float, _: object = None) -> str:
    """Minor log ticks labelled at 2 and 5 only (0.2, 5, 20 ...)."""
    text = f"{value:g}"
    return text if text.lstrip("0.")[:1] in ("2", "5") else ""


def _plain_log(ax: Axes, axis: str = "y") -> None:
    """Label a log axis 0.5, 1, 2, 5 ... instead of powers of ten."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(FuncFormatter(_plain))
    target.set_minor_formatter(FuncFormatter(_plain_minor))


# -- one plot each -------------------------------------------------------------------------------


def percentile_plot(ax: Axes, reports: Sequence[RunReport]) -> None:
    """Latency (ms) against percentile on a 1/(1-q) log axis: the tail gets as much room as
    the median."""
    top = 0.99
    for index, report in enumerate(reports):
        levels, values = [], []
        for item in report.histogram.get_percentile_iterator(5):
            q = float(item.percentile_level_iterated_to) / 100
            if q >= 1:
                continue
            levels.append(1 / (1 - q))
            values.append(float(item.value_iterated_to) / 1000)
        if levels:
            ax.plot(levels, values, color=color(index), label=report.label, linewidth=1.8)
            top = max(top, 1 - 1 / max(levels))
    ax.set_xscale("log")
    ticks = [q for q in _NINES if q <= max(0.99, 1 - (1 - top) / 2)]
    ax.set_xticks([1 / (1 - q) for q in ticks], [f"{100 * q:g}%" for q in ticks])
    ax.set_xlim(left=1)
    ax.set_yscale("log")
    _plain_log(ax)
    ax.set_xlabel("percentile")
    ax.set_ylabel("latency (ms)")
    ax.set_title("Latency by percentile (lower is better)")
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, loc="upper left")


def cdf_plot(ax: Axes, reports: Sequence[RunReport]) -> None:
    """Fraction of answers within each latency (ms, log x)."""
    for index, report in enumerate(reports):
        values, fractions = cdf_points(report.histogram)
        if values.size:
            ax.step(values / 1000, fractions, where="post", color=color(index),
                    label=report.label, linewidth=1.8)  # fmt: skip
    ax.set_xscale("log")
    _plain_log(ax, "x")
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of answers within")
    ax.set_title("Latency CDF (further left is better)")
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, loc="lower right")


def _legend(ax: Axes, **options: object) -> None:
    """The legend, or "no answers" on a plot with nothing to draw (matplotlib warns of a
    legend without entries)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**options)
    else:
        ax.text(0.5, 0.5, "no answers", transform=ax.transAxes, ha="center", va="center",
                color="0.4")  # fmt: skip


def _seconds(report: RunReport) -> list[float]:
    step = report.timeline.interval_s
    return [step * (i + 0.5) for i in range(len(report.timeline))]


def bucket_spans(size: int, step_s: float, duration_s: float) -> list[float | None]:
    """How long each of a timeline's `size` buckets of `step_s` lies within a run of
    `duration_s` (s): `step_s` but for the last, partial one; None for one left off the rate
    plots (shorter than MIN_PARTIAL of a step, or past the run's end: the drain, where only
    the last answers land), unless it is the first (a run shorter than a second). A run of
    unknown duration (0): every bucket whole."""
    if duration_s <= 0:
        return [step_s] * size
    spans: list[float | None] = []
    for index in range(size):
        span = min(step_s, duration_s - index * step_s)
        shown = span >= MIN_PARTIAL * step_s or (index == 0 and span > 0)
        spans.append(span if shown else None)
    return spans


def _rates(counts: Sequence[int], spans: Sequence[float | None]) -> list[float]:
    """Per second: each bucket's count over its span (NaN where it is left off)."""
    return [math.nan if span is None else count / span for count, span in zip(counts, spans,
            strict=True)]  # fmt: skip


def _rate_seconds(spans: Sequence[float | None], step_s: float) -> list[float]:
    """Where each bucket's rate is plotted: the middle of its span."""
    return [step_s * i + (step_s if span is None else span) / 2 for i, span in enumerate(spans)]


def _ms_or_nan(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else v / 1000 for v in values]


def timeline_plot(ax: Axes, report: RunReport, index: int) -> None:
    """One run's p50 and p99 per second (ms), and the rate it sent on the right axis (the last,
    partial second by its real length: see `bucket_spans`)."""
    t, timeline = _seconds(report), report.timeline
    rate = ax.twinx()
    step = timeline.interval_s
    spans = bucket_spans(len(timeline), step, report.duration_s)
    rate.fill_between(_rate_seconds(spans, step), _rates(timeline.sent, spans), step="mid",
                      color="0.85", label="sent /s")  # fmt: skip
    rate.set_ylabel("sent per second", color="0.4")
    rate.set_ylim(bottom=0)
    ax.set_zorder(rate.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.plot(t, _ms_or_nan(timeline.p99_us), color=color(index), linewidth=1.8, label="p99",
            marker="o", markersize=3)  # fmt: skip
    ax.plot(t, _ms_or_nan(timeline.p50_us), color=color(index), linewidth=1.2, linestyle="--",
            label="p50", marker="o", markersize=2)  # fmt: skip
    ax.set_yscale("log")
    _plain_log(ax)
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"{report.label}: latency over time")
    ax.grid(True, alpha=0.3)
    lines, labels = ax.get_legend_handles_labels()
    more, more_labels = rate.get_legend_handles_labels()
    ax.legend(lines + more, labels + more_labels, loc="upper left", fontsize="small")


def goodput_plot(ax: Axes, reports: Sequence[RunReport]) -> None:
    """On-time answers per second (solid) and failures per second (dotted), every run; the last,
    partial second by its real length (see `bucket_spans`)."""
    for index, report in enumerate(reports):
        timeline = report.timeline
        step = timeline.interval_s
        spans = bucket_spans(len(timeline), step, report.duration_s)
        t = _rate_seconds(spans, step)
        ax.plot(t, _rates(timeline.ok, spans), color=color(index), linewidth=1.8,
                marker="o", markersize=3, label=f"{report.label}: on time")  # fmt: skip
        ends = zip(timeline.rejected, timeline.expired, timeline.errors, strict=True)
        failed = _rates([r + e + x for r, e, x in ends], spans)
        if any(rate > 0 for rate in failed):
            ax.plot(t, failed, color=color(index), linestyle=":", linewidth=1.5, marker="x",
                    markersize=4, label=f"{report.label}: rejected, expired, errors")  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("per second")
    ax.set_title("Goodput (on-time answers) and failures over time")
    ax.grid(True, alpha=0.3)
    _legend(ax, loc="lower left", fontsize="small")


def batch_plot(ax: Axes, reports: Sequence[RunReport]) -> None:
    """The share of executions at each batch size the server ran, one bar per run and size."""
    sizes = sorted({size for report in reports for size in report.batch_sizes})
    width = 0.8 / max(1, len(reports))
    for index, report in enumerate(reports):
        total = sum(report.batch_sizes.values()) or 1
        shares = [100 * report.batch_sizes.get(size, 0) / total for size in sizes]
        offsets = [i + (index - (len(reports) - 1) / 2) * width for i in range(len(sizes))]
        ax.bar(offsets, shares, width=width, color=color(index), label=report.label)
    ax.set_xticks(range(len(sizes)), [str(size) for size in sizes])
    ax.set_xlabel("batch size (rows per execution, as run)")
    ax.set_ylabel("% of executions")
    ax.set_title("Batch sizes the server ran (its /metrics, over the run)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")


def _with_batches(reports: Sequence[RunReport]) -> bool:
    return any(report.batch_sizes for report in reports)


# -- the table -----------------------------------------------------------------------------------

_HEADS = ("run", "kind", "sent", "ok (on time)", "late", "rejected", "expired", "errors",
          "unsent", "goodput /s", "p50 ms", "p99 ms", "p99.9 ms", "incomplete")  # fmt: skip
INCOMPLETE_COLOR = "#fde3c0"
"""The background of an incomplete run's row (see `RunReport.problems`)."""


def ranked(reports: Sequence[RunReport]) -> list[int]:
    """The indices of the runs compared by P99: those with answers, and complete (none of
    `RunReport.problems`)."""
    return [i for i, r in enumerate(reports) if r.latency_us["p99"] and not r.problems]


def winner(reports: Sequence[RunReport]) -> int | None:
    """The index of the complete run with the lowest P99 (None: fewer than two complete runs
    with answers, or two or more at that P99).

    NOTE: every run with answers was once ranked: a run whose server died after 30 answers
    (58 unsent), one interrupted, one whose answers never came, won on the P99 of the few
    answers they got (found by a tester); and of two runs at one P99, one was named lowest
    "vs" the other at the same value."""
    p99s = sorted((float(reports[i].latency_us["p99"] or 0), i) for i in ranked(reports))
    if len(p99s) < 2 or p99s[0][0] == p99s[1][0]:
        return None
    return p99s[0][1]


def table_rows(reports: Sequence[RunReport], short: bool = False) -> list[list[str]]:
    """A row per run, as `_HEADS`; `short`: the last column (what makes a run incomplete) in
    a word or two each (the PNG's table, whose verdict above it says the rest)."""
    rows = []
    for report in reports:
        latency, counts = report.latency_us, report.counts
        rows.append([
            report.label, report.kind, *(f"{counts[k]:,}" for k in
            ("sent", "ok", "late", "rejected", "expired", "errors")), f"{report.unsent:,}",
            f"{report.goodput_rps:,.1f}",
            *("-" if latency[k] is None else f"{float(latency[k] or 0) / 1000:.3f}"
              for k in ("p50", "p99", "p999")),
            ", ".join(_tags(report)) if short else "; ".join(report.problems),
        ])  # fmt: skip
    return rows


def _tags(report: RunReport) -> list[str]:
    """`report.problems` in a word or two each."""
    counted = (("unsent", report.unsent), ("unanswered", report.unanswered),
               ("skipped", report.skipped))  # fmt: skip
    tags = [f"{count:,} {name}" for name, count in counted if count]
    return [*tags, "interrupted"] if report.interrupted else tags


def verdict(reports: Sequence[RunReport]) -> str:
    """The runs compared at P99: the lowest, and by how much (or a tie); then the runs left out
    of the comparison as incomplete, and why."""
    compared = ranked(reports)
    incomplete = [r for r in reports if r.problems]
    sentences = []
    if len(compared) >= 2:
        p99 = {i: float(reports[i].latency_us["p99"] or 0) / 1000 for i in compared}
        low = min(p99.values())
        best = [reports[i].label for i in compared if p99[i] == low]
        others = [f"{reports[i].label} {p99[i]:.3f} ms" for i in compared if p99[i] != low]
        versus = f" (vs {', '.join(others)})" if others else ""
        if len(best) == 1:
            sentences.append(f"Lowest P99: {best[0]} at {low:.3f} ms{versus}.")
        else:
            sentences.append(
                f"Lowest P99: {', '.join(best[:-1])} and {best[-1]}, tied at {low:.3f} ms{versus}."
            )
    elif incomplete and len(reports) >= 2:
        only = f"only {reports[compared[0]].label} is one" if compared else "none is"
        sentences.append(
            f"No run ranked by P99: that takes two complete runs with answers, and {only}."
        )
    if incomplete:
        what = ", ".join(f"{r.label} ({'; '.join(r.problems)})" for r in incomplete)
        ranked_out = ", not ranked" if len(reports) >= 2 else ""
        sentences.append(f"Incomplete{ranked_out}: {what}.")
    return " ".join(sentences)


# -- whole reports -------------------------------------------------------------------------------


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def figures(reports: Sequence[RunReport]) -> list[tuple[str, bytes]]:
    """The report's plots as (caption, PNG bytes)."""
    out = []
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    percentile_plot(left, reports)
    cdf_plot(right, reports)
    out.append(("Latency distribution, every run (answers only)", _png(figure)))
    figure, ax = plt.subplots(figsize=(13, 4))
    goodput_plot(ax, reports)
    out.append(("Goodput and failures per second", _png(figure)))
    if _with_batches(reports):
        figure, ax = plt.subplots(figsize=(13, 3.6))
        batch_plot(ax, reports)
        out.append(("Batch sizes the server ran", _png(figure)))
    for index, report in enumerate(reports):
        figure, ax = plt.subplots(figsize=(13, 3.6))
        timeline_plot(ax, report, index)
        out.append((f"{report.label}: latency over time", _png(figure)))
    return out


def write_png(reports: Sequence[RunReport], out: Path, title: str) -> None:
    """Everything on one PNG: distributions, goodput, per-run timelines, then the table."""
    batches = _with_batches(reports)
    first = 3 if batches else 2  # the row of the first run's timeline
    rows = first + 1 + len(reports)
    heights = [1.2, 1.0, *([0.8] if batches else []), *([0.9] * len(reports)),
               0.25 + 0.12 * len(reports)]  # fmt: skip
    figure = plt.figure(figsize=(13, 4.2 * sum(heights)), layout="constrained")
    grid = figure.add_gridspec(rows, 2, height_ratios=heights)
    percentile_plot(figure.add_subplot(grid[0, 0]), reports)
    cdf_plot(figure.add_subplot(grid[0, 1]), reports)
    goodput_plot(figure.add_subplot(grid[1, :]), reports)
    if batches:
        batch_plot(figure.add_subplot(grid[2, :]), reports)
    for index, report in enumerate(reports):
        timeline_plot(figure.add_subplot(grid[first + index, :]), report, index)
    ax = figure.add_subplot(grid[rows - 1, :])
    ax.axis("off")
    narrow = 0.82 / (len(_HEADS) - 1)  # (the last column, what makes a run incomplete: 0.18)
    table = ax.table(cellText=table_rows(reports, short=True), colLabels=_HEADS, loc="center",
                     colWidths=[narrow] * (len(_HEADS) - 1) + [0.18])  # fmt: skip
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    table.scale(1, 1.6)
    best = winner(reports)
    for index, report in enumerate(reports):
        for column in range(len(_HEADS)):
            if index == best:
                table[index + 1, column].set_facecolor("#d8f5d0")
                table[index + 1, column].set_text_props(fontweight="bold")
            elif report.problems:
                table[index + 1, column].set_facecolor(INCOMPLETE_COLOR)
    ax.set_title(verdict(reports) or " ", fontsize=11, wrap=True)
    figure.suptitle(title, fontsize=14)
    figure.savefig(out, format="png", dpi=90)
    plt.close(figure)


_STYLE = """body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
table{border-collapse:collapse;margin:12px 0}th,td{padding:4px 10px;border:1px solid #ccc;
text-align:right}th{background:#f2f2f2}td:first-child,td:nth-child(2){text-align:left}
tr.best td{background:#d8f5d0;font-weight:bold}tr.incomplete td{background:#fde3c0}
td:last-child{text-align:left}.verdict{font-size:16px;margin:8px 0}
figure{margin:18px 0}figcaption{color:#555;margin-bottom:4px}img{max-width:100%}"""


def html_page(reports: Sequence[RunReport], title: str) -> str:
    best = winner(reports)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in _HEADS)
    body = []
    for index, row in enumerate(table_rows(reports)):
        cells = "".join(f"<td>{html.escape(cell)}</td>" for cell in row)
        marker = (
            ' class="best"' if index == best
            else ' class="incomplete"' if reports[index].problems else ""
        )  # fmt: skip
        body.append(f"<tr{marker}>{cells}</tr>")
    images = "".join(
        f'<figure><figcaption>{html.escape(caption)}</figcaption><img alt="{html.escape(caption)}"'
        f' src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}"></figure>'
        for caption, png in figures(reports)
    )
    described = "".join(
        f"<li><b>{html.escape(r.label)}</b>: {html.escape(r.description)}</li>"
        for r in reports
        if r.description
    )
    note = ("Latency runs from each request's scheduled send to its answer; ok counts answers "
            "within their due time. Percentiles come from each run's HDR histogram (3 "
            "significant digits). Unsent requests found no connection to the server (in no "
            "other count). An incomplete run (unsent or unanswered requests, interrupted, "
            "capture records skipped) is not ranked: its percentiles cover only the answers it "
            "got.")  # fmt: skip
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p class='verdict'>{html.escape(verdict(reports))}</p>"
        f"<table><tr>{head}</tr>{''.join(body)}</table><ul>{described}</ul>"
        f"<p>{html.escape(note)}</p>{images}"
        "</body></html>"
    )


def write_report(reports: Sequence[RunReport], out: Path, title: str = "duetime report") -> None:
    """`out` .html: a self-contained page; anything else: one PNG."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".html":
        out.write_text(html_page(reports, title), encoding="utf-8")
    else:
        write_png(reports, out, title)


__all__ = ["batch_plot", "figures", "html_page", "write_png", "write_report"]
