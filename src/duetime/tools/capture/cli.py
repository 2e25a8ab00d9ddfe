"""`duetime capture convert IN.jsonl OUT.cap` and `duetime capture show FILE [--head N]`."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from duetime.observability.logs import console
from duetime.tools.argtypes import whole
from duetime.tools.capture.format import BadField, CapturedRequest, CaptureFormatError
from duetime.tools.capture.jsonl import JsonlError, convert
from duetime.tools.capture.reader import CaptureReader, not_a_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="capture_command", required=True)
    convert_ = actions.add_parser(
        "convert", help="write the requests of a JSON Lines file to a new capture file",
        description="Each line: {\"t_ms\": 12.5, \"model\": \"mlp\", \"inputs\": {\"x\": "
        "{\"datatype\": \"FP32\", \"shape\": [1, 40], \"data\": [...]}}, \"timeout_us\": "
        "20000}; see duetime/tools/capture/jsonl.py for every field.",
    )  # fmt: skip
    convert_.add_argument("source", type=Path, help="the JSON Lines file")
    convert_.add_argument("target", type=Path, help="the capture file to create")
    convert_.add_argument("--force", action="store_true", help="replace TARGET if it exists")
    show = actions.add_parser("show", help="a capture's header and a summary of its records")
    show.add_argument("file", type=Path)
    show.add_argument(
        "--head", type=whole(at_least=0), default=0, metavar="N", help="also list N records"
    )


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        if args.capture_command == "convert":
            # (as `bench --record` and `serve --record` do: the target's folders are made)
            args.target.parent.mkdir(parents=True, exist_ok=True)
            count = convert(args.source, args.target, overwrite=args.force)
            print(f"{count} requests written to {args.target}", file=out)
            return 0
        return show(args.file, args.head, out)
    except (JsonlError, CaptureFormatError) as exc:
        console(f"duetime capture: {exc}")
        return 1
    except BadField as exc:  # a value parse_request let through that the format cannot hold
        console(f"duetime capture: {args.source}: {exc}")
        return 1
    except BrokenPipeError:  # (`show` piped into `head`: the command's handler says nothing)
        raise
    except OSError as exc:
        console(f"duetime capture: {_problem(exc, args)}")
        return 2


def _problem(exc: OSError, args: argparse.Namespace) -> str:
    """The file the command could not open, and why, as `duetime replay` says it (not
    Python's "[Errno 21] Is a directory: 'x'")."""
    if exc.filename is None:
        return exc.strerror or str(exc)
    path = Path(exc.filename)
    if args.capture_command == "convert" and path != args.source:
        # NOTE: a target in a folder that could not be made read "no such capture file", as if
        # the input were missing (found by a tester)
        return f"{path}: the capture cannot be written: {exc.strerror or exc}"
    if isinstance(exc, IsADirectoryError | FileNotFoundError) and not path.is_file():
        source = args.capture_command == "convert" and path == args.source
        return f"{path}: {not_a_file(path, 'JSON Lines file' if source else 'capture file')}"
    return f"{path}: {exc.strerror or exc}"


def show(path: Path, head: int, out: TextIO) -> int:
    """Print the header, the first `head` records and a summary; 1 if the file ends inside a
    record (it is reported, after what could be read)."""
    with CaptureReader(path, allow_truncated=True) as reader:
        header = reader.header
        started = datetime.fromtimestamp(header.start_wall_ns / 1e9, tz=UTC)
        print(f"capture {path}: format {header.version}, {header.created_by}", file=out)
        print(f"  started {started.isoformat(timespec='milliseconds')}", file=out)
        if header.meta:
            meta = ", ".join(f"{k}={v}" for k, v in header.meta.items())
            print(f"  meta: {meta}", file=out)
        summary = _Summary()
        for record in reader:
            if reader.count <= head:
                print("  " + _line(record), file=out)
            summary.add(record)
        for line in summary.lines():
            print(line, file=out)
        if reader.skipped:
            print(
                f"warning: {reader.skipped} records skipped (they do not decode); the first: "
                f"{reader.first_skipped}",
                file=out,
            )
        if reader.truncated is not None:
            print(f"warning: {reader.truncated}", file=out)
            return 1
    return 0


def _line(r: CapturedRequest) -> str:
    due = "-" if r.due_in_ns is None else f"{r.due_in_ns / 1e6:.3f}ms"
    shapes = " ".join(f"{t.name}:{t.datatype}{list(t.shape)}" for t in r.inputs)
    answered = f"v{r.answered_version or '?'}/{r.variant or '?'}"
    version = f"@{r.version}" if r.version is not None else ""
    error = f" ({r.error})" if r.error else ""
    return (
        f"{r.arrival_ns / 1e6:10.3f}ms {r.protocol:<11} {r.model}{version} id={r.request_id!r} "
        f"{shapes} due={due} -> {r.status}{error} {r.latency_ns / 1e6:.3f}ms {answered}"
    )


class _Summary:
    def __init__(self) -> None:
        self.count = 0
        self.first = self.last = 0
        self.models: Counter[str] = Counter()
        self.protocols: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.with_due = 0

    def add(self, r: CapturedRequest) -> None:
        if self.count == 0:
            self.first = self.last = r.arrival_ns
        self.first, self.last = min(self.first, r.arrival_ns), max(self.last, r.arrival_ns)
        self.count += 1
        self.models[r.model if r.version is None else f"{r.model}@{r.version}"] += 1
        self.protocols[r.protocol] += 1
        self.statuses[r.status] += 1
        self.with_due += r.due_in_ns is not None

    def lines(self) -> list[str]:
        span_s = (self.last - self.first) / 1e9
        rate = f"{self.count / span_s:.1f}/s" if span_s > 0 else "-"
        return [
            f"requests: {self.count} over {span_s:.3f} s (rate {rate}), "
            f"{self.with_due} with a due time",
            f"models: {_counts(self.models)}",
            f"protocols: {_counts(self.protocols)}",
            f"status: {_statuses(self.statuses)}",
        ]


def _statuses(counter: Counter[int]) -> str:
    """The outcomes counted, status 0 (no outcome recorded: a capture made from JSON lines)
    said so: "status: 0 5" read as five requests answered with status 0."""
    return (
        ", ".join(
            f"{'no outcome' if status == 0 else status} {count}"
            for status, count in counter.most_common()
        )
        or "-"
    )


def _counts(counter: Counter[str] | Counter[int]) -> str:
    return ", ".join(f"{key} {count}" for key, count in counter.most_common()) or "-"
