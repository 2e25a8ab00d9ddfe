"""`duetime report`: several bench or replay results side by side, as one HTML page or PNG.

    duetime report a.json b.json --label before --label after --out cmp.html

Reads the fields every result carries (`hdr.run_fields`), merges nothing: each run keeps its
own exact latency histogram. matplotlib is needed (the `report` extra); the server never is.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from duetime.errors import ConfigError
from duetime.observability.logs import console
from duetime.tools.hdr import RunReport
from duetime.tools.outputs import OutputError, check_output, failed_write, make_parents


def load_reports(paths: list[Path], labels: list[str]) -> list[RunReport]:
    """The runs in `paths`, relabelled by `labels` in order (none: see `default_labels`);
    ValueError naming a bad file."""
    if labels and len(labels) != len(paths):
        raise ValueError(f"{len(labels)} --label for {len(paths)} results; give one per result")
    labels = labels or default_labels(paths)
    reports = []
    for index, path in enumerate(paths):
        try:
            doc = json.loads(path.read_text())
        except OSError as exc:
            raise ValueError(f"{path}: cannot read it: {exc.strerror}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # (a capture, say)
            raise ValueError(f"{path}: not JSON: {exc}") from None
        report = RunReport.from_json(doc, str(path))
        report = replace(report, label=labels[index])
        reports.append(report)
    return reports


def default_labels(paths: list[Path]) -> list[str]:
    """Each result's name on the page: its file's name without the suffix; where two share
    that, its path as given; where two share that too (one file twice), the name numbered
    (`a`, `a (2)`).

    NOTE: two results named alike (`a/run.json`, `b/run.json`, or one file twice) were both
    `run`, told apart by nothing in the table or the plots' legends (found by a tester)."""
    stems = [path.stem for path in paths]
    given = [str(path) for path in paths]
    labels = []
    for index, (stem, path) in enumerate(zip(stems, given, strict=True)):
        if stems.count(stem) == 1:
            labels.append(stem)
        elif given.count(path) == 1:
            labels.append(path)
        else:
            seen = given[:index].count(path)
            labels.append(f"{stem} ({seen + 1})" if seen else stem)
    return labels


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `duetime report` flags."""
    parser.description = (
        "Plot the results of `duetime bench --json` or `duetime replay --json` side by side: "
        "latency CDFs overlaid, latency and goodput over time per run, and a table with the "
        "complete run of the lowest P99 highlighted (a run with unsent or unanswered "
        "requests, interrupted, or whose capture had records skipped is marked incomplete and "
        "not ranked)."
    )
    parser.add_argument("results", type=Path, nargs="+", metavar="RESULT.json")
    parser.add_argument(
        "--label", action="append", default=[], help="a run's name in the plots (one per result)"
    )
    parser.add_argument(
        "--out", type=Path, required=True, metavar="OUT", help="report.html or report.png"
    )
    parser.add_argument("--title", default="duetime report", help="the page's title")


def run(args: argparse.Namespace) -> int:
    """2 for a bad file or flag; 1 when matplotlib is missing."""
    if args.out.suffix.lower() not in (".html", ".png"):
        console(f"duetime report: --out {args.out}: expected a .html or .png file")
        return 2
    try:
        check_output(args.out, "--out", reads=args.results)
        reports = load_reports(args.results, args.label)
        from duetime.tools.plots import write_report
    except ConfigError as exc:
        console(f"duetime report: {exc.message}")
        return 2
    except ValueError as exc:
        console(f"duetime report: {exc}")
        return 2
    except ImportError as exc:
        console(f"duetime report: {exc} (the report extra: pip install 'duetime[report]')")
        return 1
    try:
        make_parents(args.out, "--out")
        try:
            write_report(reports, args.out, title=args.title)
        except OSError as exc:
            raise failed_write(args.out, "--out", exc) from None
    except OutputError as exc:
        console(f"duetime report: {exc.message}")
        return 1
    print(f"wrote {args.out}")
    return 0
