"""`duetime itch book FILE --json OUT`: the book summary of a whole file (docs/itch_book.md).

Two ways to the same summary: the compiled pass (`fastbook`, numba), twenty-odd times faster,
which holds the whole uncompressed file and the change rows in memory, and the streaming
pure-Python books (`summary.summarize`), whose memory does not grow with the file and which
alone has `--strict`. `--engine auto` (default) takes the compiled pass whenever it can: numba
is there, no --strict, the file is big enough for the pass to pay for loading it, and small
enough for the memory available. Either way the JSON and the lines on stderr are the same,
byte for byte.

A pipe or character device (`<(zcat day.gz)`, /dev/stdin) is read once, front to back: `auto`
gives it to the streaming books (its size is not known before it is read, and a pipe cannot
be read a second time); `--engine numba` reads it whole into memory, once, as it reads a file,
up to what the memory available allows (`TooLarge` past that).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from duetime.cgroups import memory_room
from duetime.errors import ConfigError
from duetime.feeds.itch.book import ANOMALY_KINDS, BookError
from duetime.feeds.itch.keys import renamed_note, stock_keys
from duetime.feeds.itch.parser import ItchFormatError, file_problem, read_messages, skipped_note
from duetime.feeds.itch.summary import Summary, dumps, summarize, symbols
from duetime.observability.logs import console
from duetime.tools.outputs import OutputError, check_output, write_output

FAST_MIN_BYTES = 1 << 20
"""auto: a smaller file (on disk) goes the pure-Python way: importing numba and loading the
compiled pass (~0.3 s) costs more than the pass saves on fewer than ~30,000 messages."""
FAST_BYTES_PER_BYTE = 5
"""The compiled pass's peak memory per byte of uncompressed stream, with room to spare
(measured: about 3, the buffer, the change rows and their digest text, plus ~100 MB of fixed
tables and compiled code)."""
MEMORY_SHARE = 0.5
"""auto: the compiled pass may take this share of the memory available when it starts; for a
longer stream the file goes the streaming way."""


class TooLarge(Exception):
    """`--engine numba`: the uncompressed stream is more than the memory available can hold on
    the compiled pass (the message says so, in a line for stderr)."""


@dataclass(frozen=True, slots=True)
class BookRun:
    """What either way gives for one file: the summary and what stderr says about it."""

    summary: Summary
    symbols: dict[int, str]
    """Each locate's symbol ('' if none), ascending: for `keys.renamed_note`."""
    anomalies: dict[str, int]
    """The policy cases by kind, in `book.ANOMALY_KINDS` order."""
    skipped: int
    """Malformed parts of the stream stepped over (--on-error skip)..."""
    first_skipped: ItchFormatError | None
    """...and the first of them."""


def add_book_arguments(parser: argparse.ArgumentParser) -> None:
    """`duetime itch book FILE --json OUT [--depth 5] [--on-error stop|skip] [--strict]
    [--engine auto|numba|python]`."""
    parser.add_argument("file", type=Path, help="ITCH 5.0 file (raw or gzip; or a pipe)")
    parser.add_argument("--json", dest="json_out", type=Path, required=True, help="summary path")
    parser.add_argument("--depth", type=int, default=5, help="price levels per side (default 5)")
    parser.add_argument(
        "--first-changes", type=int, default=1000,
        help="book changes per stock listed in full: a row for every book change (applied "
        "A/F/E/C/X/D/U), the top moved or not (default 1000; all are digested)",
    )  # fmt: skip
    parser.add_argument(
        "--on-error", choices=["stop", "skip"], default="stop",
        help="a malformed frame stops the run (default) or is skipped",
    )  # fmt: skip
    parser.add_argument(
        "--strict", action="store_true",
        help="stop at the first message that breaks the book policy instead of counting it "
        "(pure Python)",
    )  # fmt: skip
    parser.add_argument(
        "--engine", choices=["auto", "numba", "python"], default="auto",
        help="the compiled whole-file pass (numba; holds the file in memory) or the streaming "
        "pure-Python books; both write the same summary (default auto: numba whenever it can)",
    )  # fmt: skip


def run_book(args: argparse.Namespace) -> int:
    """Write the summary; anomaly counts go to stderr. 0 on success; 1 when a malformed frame
    (with --on-error stop) or a policy case (with --strict) stopped the run, or the summary
    could not be written; 2 on bad options (an output path that cannot be written among them,
    found before the file is read)."""
    if problem := _option_problem(args):
        console(f"duetime itch book: {problem}")
        return 2
    try:
        check_output(args.json_out, "--json", reads=(args.file,))  # (before it is read)
    except ConfigError as exc:
        console(f"duetime itch book: {exc.message}")
        return 2
    try:
        run = _compiled(args) or _streamed(args)
    except BookError as exc:
        console(f"duetime itch book: {args.file}: {exc.where}; drop --strict to count such "
                "cases and apply the documented policy")  # fmt: skip
        return 1
    except ItchFormatError as exc:
        console(f"duetime itch book: {args.file}: {exc}")
        return 1
    except TooLarge as exc:  # (as the streaming books end on a stream they cannot frame)
        console(f"duetime itch book: {args.file}: {exc}")
        return 1
    except OSError as exc:  # (unreadable: no permission)
        console(f"duetime itch book: {args.file}: {exc.strerror or exc}")
        return 2
    for note in _notes(run):
        console(f"duetime itch book: {args.file}: {note}", logging.WARNING)
    try:
        write_output(args.json_out, dumps(run.summary), "--json")
    except OutputError as exc:  # (a full disk: checked before, the path itself was fine)
        console(f"duetime itch book: {exc.message}")
        return 1
    return 0


def _option_problem(args: argparse.Namespace) -> str | None:
    if args.depth < 1:
        return "--depth must be at least 1"
    if args.first_changes < 0:
        return "--first-changes must be 0 or more"
    if problem := file_problem(args.file):
        return f"{args.file}: {problem}"
    if args.engine == "numba" and args.strict:
        return "--strict needs the pure-Python books (--engine python or auto)"
    if args.engine == "numba" and not _has_numba():
        return "--engine numba needs numba (pip install 'duetime[itch]')"
    return None


def _notes(run: BookRun) -> list[str]:
    """The lines for stderr: what was skipped, locates keyed with their number, anomalies."""
    notes = []
    if run.first_skipped is not None:
        notes.append(skipped_note(run.skipped, run.first_skipped))
    if renamed := renamed_note(stock_keys(run.symbols.items()), run.symbols):
        notes.append(renamed)
    if run.anomalies:
        counts = ", ".join(f"{kind}={n}" for kind, n in run.anomalies.items())
        notes.append(f"book anomalies: {counts}")
    return notes


def _streamed(args: argparse.Namespace) -> BookRun:
    reader = read_messages(args.file, on_error=args.on_error)
    summary, books = summarize(
        reader, depth=args.depth, first_changes=args.first_changes, strict=args.strict
    )
    counts = books.anomalies.counts
    return BookRun(
        summary=summary,
        symbols=symbols(books),
        anomalies={kind: counts[kind] for kind in ANOMALY_KINDS if kind in counts},
        skipped=reader.skipped,
        first_skipped=reader.errors[0] if reader.errors else None,
    )


def _compiled(args: argparse.Namespace) -> BookRun | None:
    """The run on the compiled pass, or None where `--engine auto` leaves the file to the
    streaming books (see the module)."""
    forced = args.engine == "numba"
    if not forced and (
        args.engine == "python"
        or args.strict
        or not os.path.isfile(args.file)  # (a pipe: its size is unknown, and it reads once)
        or os.path.getsize(args.file) < FAST_MIN_BYTES
        or not _has_numba()
    ):
        return None
    # NOTE: forced, the stream was read with no bound: `--engine numba /dev/zero` (or a gzip
    # bomb) grew by ~1 GB/s until a MemoryError traceback or the OOM killer (found by a
    # tester). Forced, it may take all the memory available, not `MEMORY_SHARE` of it
    available = _memory_available()
    share = 1.0 if forced else MEMORY_SHARE
    limit = None if available is None else int(available * share / FAST_BYTES_PER_BYTE)
    if limit is not None and os.path.isfile(args.file) and os.path.getsize(args.file) > limit:
        if forced:  # (gzip only grows)
            raise TooLarge(_too_large(limit))
        return None
    from duetime.feeds.itch.fastbook import FastBook
    from duetime.feeds.itch.parser import read_stream

    try:
        loaded = read_stream(args.file, limit)
    except MemoryError:  # (a limit on the address space, which MemAvailable does not show)
        raise TooLarge(_too_large(None)) from None
    if loaded is None:
        if forced:
            assert limit is not None
            raise TooLarge(_too_large(limit))
        return None
    data, gzip_error = loaded
    buffer = np.frombuffer(data, np.uint8)  # (no copy; an array is taken as uncompressed)
    book = FastBook(buffer, on_error=args.on_error, gzip_error=gzip_error)
    skipped, first = book.skipped_parts()
    return BookRun(
        summary=book.summary(depth=args.depth, first_changes=args.first_changes),
        symbols={locate: book.symbol(locate) for locate in book.locates().tolist()},
        anomalies=book.anomalies,
        skipped=skipped,
        first_skipped=first,
    )


def _too_large(limit: int | None) -> str:
    """Why `--engine numba` gave up on a stream, in a line: over `limit` bytes (None: memory
    ran out while it was read)."""
    why = (
        "memory ran out while the stream was read" if limit is None
        else f"the stream is over {limit:,} bytes uncompressed, more than the memory available "
        "holds"
    )  # fmt: skip
    return (
        f"{why} (--engine numba holds it whole, with about {FAST_BYTES_PER_BYTE} bytes more per "
        "byte); --engine python or auto streams it"
    )


def _has_numba() -> bool:
    return importlib.util.find_spec("numba") is not None


def _memory_available() -> int | None:
    """Bytes of memory this process may still take: Linux's MemAvailable, less where a cgroup
    (a container) allows less; None where neither is known."""
    sizes = []
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    sizes.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    room = memory_room()
    if room is not None:
        sizes.append(room)
    return min(sizes) if sizes else None
