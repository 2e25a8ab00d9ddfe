"""What `duetime replay` measured: counts kept during the run, then the JSON and the text table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from duetime.tools.hdr import run_fields
from duetime.tools.report import EXIT_UNSENT, unanswered_warning

if TYPE_CHECKING:
    from duetime.tools.replay import Replay
    from duetime.tools.replay_plan import ReplayConfig

MAX_MESSAGES = 5
MAX_MISMATCHES = 5


@dataclass(slots=True)
class Mismatch:
    index: int
    loop: int
    request_id: str
    output: str
    max_abs_error: float
    problem: str


@dataclass(slots=True)
class Tally:
    """What the run counted as it went (besides the latency recorder)."""

    statuses: dict[int, int] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    errors: int = 0
    compared: int = 0
    mismatched: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    undecodable: int = 0
    not_comparable: int = 0
    """Answers whose recorded outputs do not decode (a capture written wrong)."""
    unsent: int = 0
    """Requests that found no connection to the target (refused, unreachable): never sent."""
    unsent_message: str | None = None
    """Why the first of them found none."""


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay measured; `to_json` carries the fields `duetime report` reads."""

    doc: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.doc

    def format(self) -> str:
        return format_result(self.doc)


def _signed_percentiles(late: Any, early: Any, quantiles: Sequence[float]) -> list[float | None]:
    """Percentiles (µs) of values recorded as two histograms: >= 0 and the negated < 0."""
    n_late, n_early = int(late.get_total_count()), int(early.get_total_count())
    total = n_late + n_early
    values: list[float | None] = []
    for q in quantiles:
        if total == 0:
            values.append(None)
            continue
        rank = q / 100 * total
        if rank <= n_early and n_early:
            values.append(-float(early.get_value_at_percentile(100 * (1 - rank / n_early))))
        else:
            values.append(float(late.get_value_at_percentile(100 * (rank - n_early) / n_late)))
    return values


def result_of(
    replay: Replay, config: ReplayConfig, *, duration_s: float, cpu_s: float, wall_s: float,
    interrupted: bool = False, span_s: float | None = None,
) -> ReplayResult:  # fmt: skip
    """`duration_s`: from the start to the last send; `span_s`: what the rates divide by
    (`report.rate_span`: to the last answer, if later)."""
    recorded = replay.recorder.finish()
    tally = replay.tally
    recorded_sent = recorded_answers_sent(replay.plan.recorded, replay.next)
    p50, p99, p999 = _signed_percentiles(replay.late_sends, replay.early_sends, [50, 99, 99.9])
    sent = replay.next
    late_max = replay.late_sends.get_max_value() if replay.late_sends.get_total_count() else 0
    transport = replay.transport
    protocol = config.address()[0]
    label = f"replay {config.capture.name} to {config.target} at speed {config.speed:g}"
    extra = {
        "capture": str(config.capture),
        "target": config.target,
        "protocol": protocol,
        "speed": config.speed,
        "loops": config.loops,
        "requests_in_capture": len(replay.plan),
        "skipped": replay.plan.skipped,
        "first_skipped": replay.plan.first_skipped,
        "interrupted": interrupted,
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "unsent_reason": tally.unsent_message,
        "schedule_error_us": {
            "p50": p50,
            "p99": p99,
            "p999": p999,
            "max": float(late_max),
            "within_1ms": replay.on_schedule / sent if sent else None,
        },
        "replayer": {
            "timer": config.timer,
            "cpu_s": cpu_s,
            "wall_s": wall_s,
            "cpu_fraction": cpu_s / wall_s if wall_s > 0 else None,
            "connections_opened": None if transport is None else transport.opened,
            "waited_for_connection": None if transport is None else transport.waited,
            "sends_retimed": replay.retimed,
        },
        "compare": {
            "enabled": config.compare_outputs,
            "rtol": config.rtol,
            "atol": config.atol,
            "recorded": recorded_sent,
            "compared": tally.compared,
            "mismatched": tally.mismatched,
            "undecodable": tally.undecodable,
            "not_comparable": tally.not_comparable,
            "not_answered": max(
                recorded_sent - tally.compared - tally.undecodable - tally.not_comparable, 0
            ),
            "first_mismatches": [
                {
                    "index": m.index,
                    "loop": m.loop,
                    "request_id": m.request_id,
                    "output": m.output,
                    "max_abs_error": m.max_abs_error,
                    "problem": m.problem,
                }
                for m in tally.mismatches
            ],
        },
        "error_messages": tally.messages,
    }
    doc = run_fields(
        "replay", label, duration_s, recorded, extra, span_s=span_s, unsent=tally.unsent,
        unanswered=replay.outstanding,
    )  # fmt: skip
    doc["errors"] += replay.outstanding  # never answered: errors, like the bench's
    return ReplayResult(doc)


def recorded_answers_sent(recorded: Sequence[object | None], sent: int) -> int:
    """How many of the first `sent` sends (the capture over and over) have recorded outputs to
    compare with: `compared` + `undecodable` + `not_comparable` + those not answered 200 (a
    request recorded as answered and replayed overdue, refused or failed is not compared, and
    is counted here)."""
    if not recorded:
        return 0
    loops, rest = divmod(sent, len(recorded))
    with_outputs = [entry is not None for entry in recorded]
    return loops * sum(with_outputs) + sum(with_outputs[:rest])


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value / 1000:.3f}"


def format_result(doc: dict[str, Any]) -> str:
    latency, lag, me = doc["latency_us"], doc["schedule_error_us"], doc["replayer"]
    lines = [
        f"duetime replay: {doc['capture']} ({doc['requests_in_capture']} requests x "
        f"{doc['loops']}) at speed {doc['speed']:g} to {doc['target']} ({doc['protocol']})",
        f"sent {doc['sent']:,}  ok {doc['ok']:,}  late {doc['late']:,}  rejected "
        f"{doc['rejected']:,}  expired {doc['expired']:,}  errors {doc['errors']:,}  "
        + (f"unsent {doc['unsent']:,}  " if doc.get("unsent") else "")
        + f"goodput {doc['goodput_rps']:,.1f}/s",
        f"latency ms (from the scheduled send): p50 {_ms(latency['p50'])}  p90 "
        f"{_ms(latency['p90'])}  p99 {_ms(latency['p99'])}  p99.9 {_ms(latency['p999'])}  "
        f"max {_ms(latency['max'])}",
        "statuses: " + ", ".join(f"{k}: {v:,}" for k, v in doc["statuses"].items()),
    ]
    within = lag["within_1ms"]
    lines.append(
        f"schedule error µs (sent minus scheduled): p50 {_us(lag['p50'])}  p99 {_us(lag['p99'])}"
        f"  p99.9 {_us(lag['p999'])}  max {_us(lag['max'])}; within 1 ms: "
        f"{'-' if within is None else f'{within:.2%}'}"
    )
    fraction = me["cpu_fraction"]
    lines.append(
        f"replayer: {me['cpu_s']:.2f} CPU s over {me['wall_s']:.2f} s sending = "
        f"{'-' if fraction is None else f'{fraction:.1%}'} of a core ({me['timer']} timer); "
        f"connections opened {me['connections_opened']}, sends that waited for one "
        f"{me['waited_for_connection']}"
    )
    compare = doc["compare"]
    if compare["enabled"]:
        lines.append(
            f"outputs: {compare['compared']:,} compared, {compare['mismatched']:,} differ "
            f"(rtol {compare['rtol']:g}, atol {compare['atol']:g})"
            + (f", {compare['undecodable']} unreadable" if compare["undecodable"] else "")
            + (
                f", {compare['not_comparable']} not comparable (recorded outputs unreadable)"
                if compare["not_comparable"]
                else ""
            )
            + _not_compared(compare)
        )
        lines += [
            f"  request {m['index']} (id {m['request_id']!r}, loop {m['loop']}): output "
            f"{m['output']!r}: {m['problem']}"
            for m in compare["first_mismatches"]
        ]
        lines += _verdict(compare)
    lines += [f"error: {message}" for message in doc["error_messages"]]
    if doc.get("unsent"):
        reason = doc.get("unsent_reason")
        lines.append(
            f"warning: {doc['unsent']:,} requests were not sent: no connection to the target "
            f"could be opened{f' ({reason})' if reason else ''}; counted as unsent only "
            f"(replay exits {EXIT_UNSENT}); did the target stop?"
        )
    if answered_none(doc):
        lines.append(
            f"warning: the target answered none of the {doc['statuses']['0']:,} requests it "
            f"was sent (no answer in its protocol; see the errors); replay exits "
            f"{EXIT_TARGET_FAILED}"
        )
    if doc.get("skipped"):
        lines.append(
            f"warning: {doc['skipped']:,} records of the capture were skipped (they do not "
            f"decode) and not replayed; the first: {doc.get('first_skipped')} (replay exits "
            f"{EXIT_UNSENT})"
        )
    if doc.get("unanswered"):
        lines.append(
            "warning: "
            + unanswered_warning(doc["unanswered"], "replay", bool(doc.get("interrupted")))
        )
    if doc.get("interrupted"):
        lines.append(
            f"INTERRUPTED (Ctrl-C): partial results, {doc['sent']:,} of "
            f"{doc['requests_in_capture'] * doc['loops']:,} requests sent"
        )
    return "\n".join(lines)


EXIT_TARGET_FAILED = 1
"""Replay's exit status when the target failed: unreachable, or it answered nothing."""


def answered_none(doc: dict[str, Any]) -> bool:
    """Whether the target failed the replay: it was sent requests, and answered none of them
    with a status (each failed with none: an answer that is not HTTP, or not gRPC, a connection
    closed unanswered), however many more were unsent or unanswered.

    NOTE: a replay with --target http:// to a gRPC port sent the whole capture, failed every
    request ("malformed HTTP response") and exited 0, "the replay went through" (found by a
    tester)."""
    statuses = doc["statuses"]
    return statuses.get("0", 0) > 0 and not any(int(k) > 0 for k in statuses)


def served_none(doc: dict[str, Any]) -> bool:
    """Whether the target answered every request it answered 404 (gRPC NOT_FOUND): it serves
    none of the capture's models (or versions).

    NOTE: such a replay went through, its exit 0 ("the replay went through"), where `duetime
    bench` refuses that target at once (found by a tester)."""
    statuses = doc["statuses"]
    return statuses.get("404", 0) > 0 and all(k in ("0", "404") for k in statuses)


def _not_compared(compare: dict[str, Any]) -> str:
    missed = compare["not_answered"]
    return f", {missed:,} recorded answers not answered 200 this time" if missed > 0 else ""


def compare_failed(compare: dict[str, Any]) -> bool:
    """Whether `--compare-outputs` failed: an answer differs or is unreadable, or a request
    recorded as answered (200) was not answered 200 this time.

    NOTE: the last once passed: a changed model that refused every request (400: a new input
    shape; 404: gone) replayed as "0 compared, 0 differ" and exit 0."""
    return bool(
        compare["mismatched"] or compare["undecodable"] or compare["not_comparable"]
        or compare["not_answered"]
    )  # fmt: skip


def _verdict(compare: dict[str, Any]) -> list[str]:
    """The line saying the comparison failed, and why (none when it passed)."""
    if not compare_failed(compare):
        return []
    why = []
    if compare["mismatched"]:
        why.append(f"{compare['mismatched']:,} answers differ")
    if compare["undecodable"]:
        why.append(f"{compare['undecodable']:,} unreadable")
    if compare["not_comparable"]:
        why.append(f"{compare['not_comparable']:,} not comparable")
    if compare["not_answered"]:
        why.append(
            f"{compare['not_answered']:,} of {compare['recorded']:,} recorded answers not "
            "answered 200"
        )
    return [f"outputs: FAILED ({'; '.join(why)})"]


def _us(value: Any) -> str:
    return "-" if value is None else f"{value:,.0f}"
