"""The batch sizes a server ran during a load run, and the answers it counted late by cause, from
its Prometheus `/metrics` read before and after (`duetime bench|replay --metrics URL`; bench's
"before" as its measured window starts, after the warm-up).

Reads the `duetime_batch_size` histogram (duetime's; its buckets are the batch sizes a model
runs at) and the `duetime_late_answers` counter. A server without them, or a scrape that fails,
gives none, never an error: the load run is what matters.
"""

from __future__ import annotations

import logging
import math
import urllib.error
import urllib.request
from collections import defaultdict
from typing import NamedTuple, TypeVar

from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("duetime.tools")

BATCH_FAMILY = "duetime_batch_size"
LATE_FAMILY = "duetime_late_answers"
SCRAPE_TIMEOUT_S = 5.0

BatchCounts = dict[str, dict[int, int]]
"""Model -> batch size -> executions (summed over versions and variants)."""
LateCounts = dict[str, dict[str, int]]
"""Model -> cause -> answers late by the server's clock (summed over versions and variants)."""


class Counted(NamedTuple):
    """What one scrape read (or, from `counted_between`, what grew between two)."""

    batches: BatchCounts
    late: LateCounts


def scrape(url: str) -> Counted | None:
    """The executions per batch size and the late answers by cause so far, per model; None if
    `url` cannot be read."""
    return counts_of(url, fetch(url))


def fetch(url: str) -> str | None:
    """The text at `url` (what `counts_of` reads), or None if it cannot be read: `scrape`'s
    I/O alone, cheap enough to run while a run sends (the parsing waits till after)."""
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
            return str(response.read().decode("utf-8", "replace"))
    except (OSError, urllib.error.URLError, ValueError) as exc:
        log.warning("--metrics %s: cannot read it (%s); no server counts in the result", url, exc)
        return None


def counts_of(url: str, text: str | None) -> Counted | None:
    """What the text `fetch` read from `url` counts; None if there is none, or it is not
    Prometheus text."""
    if text is None:
        return None
    try:
        return Counted(parse_batch_counts(text), parse_late_counts(text))
    except ValueError as exc:  # not Prometheus text (a web page, say): no error either
        log.warning("--metrics %s: not Prometheus metrics (%s); no server counts in the result",
                    url, exc)  # fmt: skip
        return None


def counted_between(before: Counted | None, after: Counted | None) -> Counted:
    """What grew between two scrapes (empty if either failed)."""
    if before is None or after is None:
        return Counted({}, {})
    return Counted(between(before.batches, after.batches), between(before.late, after.late))


def parse_late_counts(text: str) -> LateCounts:
    """`duetime_late_answers_total` summed per model and cause."""
    counts: LateCounts = defaultdict(lambda: defaultdict(int))
    for family in text_string_to_metric_families(text):
        if family.name != LATE_FAMILY:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                labels = sample.labels
                counts[labels.get("model", "?")][labels.get("cause", "?")] += round(sample.value)
    return {model: dict(causes) for model, causes in counts.items()}


def late_line(late: LateCounts) -> str:
    """One line for the late answers counted: per model, the total and each cause's share."""
    if not late:
        return "server: no answer late by its own clock"
    parts = []
    for model, causes in sorted(late.items()):
        ranked = sorted(causes.items(), key=lambda item: (-item[1], item[0]))
        each = ", ".join(f"{cause} {n}" for cause, n in ranked)
        parts.append(f"{model} {sum(causes.values())} ({each})")
    return "server: answers late by its own clock, by cause: " + "; ".join(parts)


def parse_batch_counts(text: str) -> BatchCounts:
    """`duetime_batch_size` buckets (cumulative, per deployment) turned into executions per
    batch size, per model."""
    cumulative: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        if family.name != BATCH_FAMILY:
            continue
        for sample in family.samples:
            if not sample.name.endswith("_bucket"):
                continue
            labels = dict(sample.labels)
            bound = float(labels.pop("le"))
            cumulative[tuple(sorted(labels.items()))].append((bound, sample.value))
    counts: BatchCounts = defaultdict(lambda: defaultdict(int))
    for key, buckets in cumulative.items():
        model = dict(key).get("model", "?")
        below = 0.0
        for bound, total in sorted(buckets):
            if not math.isinf(bound) and total > below:
                counts[model][round(bound)] += round(total - below)
            below = max(below, total)
    return {model: dict(sizes) for model, sizes in counts.items()}


K = TypeVar("K", int, str)


def between(
    before: dict[str, dict[K, int]] | None, after: dict[str, dict[K, int]] | None
) -> dict[str, dict[K, int]]:
    """Per model, the counts that grew between two scrapes, by how much (empty if either
    failed); a model or key that did not grow is left out."""
    if before is None or after is None:
        return {}
    grown: dict[str, dict[K, int]] = {}
    for model, counts in after.items():
        earlier = before.get(model, {})
        delta = {key: n - earlier.get(key, 0) for key, n in sorted(counts.items())}
        delta = {key: n for key, n in delta.items() if n > 0}
        if delta:
            grown[model] = delta
    return grown


def batch_sizes_json(ran: BatchCounts) -> dict[str, dict[str, int]]:
    """JSON form: batch sizes as string keys."""
    return {model: {str(size): n for size, n in sizes.items()} for model, sizes in ran.items()}
