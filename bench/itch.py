"""ITCH 5.0 throughput: parse, parse + book, parse + book + features, on one synthetic session,
beside the C++ libraries itch-book and itchcpp on the same file.

    python bench/itch.py [--messages 1000000] [--seed 1] [--repeat 3] [--out PATH]
                         [--tick-only | --no-tick]

Every row runs from the file on disk (plain, then gzip; both in the page cache) to its result,
so reading and decompressing count. Compiled rows run once untimed (JIT, caches), then keep the
best of `--repeat` runs; the pure-Python rows run once. Results go to bench/results/itch.json.

The session is `synth.write_session`'s with its order references renumbered 1, 2, 3, ... in
order of first use, as Nasdaq numbers them: itch-book rejects references above about 2**36
(synth spreads them over 64 bits on purpose), and would otherwise build no book at all. The
renumbering changes no book (the fast and pure-Python summaries are checked equal on it).

What each row measures is in its `measures` column; the tables after it are the numba JIT cost
and the tick-to-prediction of `duetime itch run` with the demo `orderbook` MLP through the
in-process Engine, at the recorded pace of a 2,000 messages/s session (also on the pure-Python
books and features, `--engine python`, and without keeping the per-event path warm while
waiting, `--no-keep-warm`) and at full pace, and of
`duetime itch listen` fed that session over MoldUDP64 on loopback by `duetime itch send` (the
live row; where /dev/cpu_dma_latency is writable, again with `--cpu-dma-latency-us 0`).
A deep-book table times 80,000 adds at distinct prices on one side, in price order and in
random order, compiled and pure Python (each new level placed among the others).
`--tick-only` runs the tick-to-prediction table alone (about four minutes), `--no-tick` all
but it. The `command` rows run `duetime itch book` as a user does, a process each, imports included.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import platform
import random
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import print_table

from duetime.demo import write_demo_repository
from duetime.execution.affinity import CPU_DMA_LATENCY
from duetime.feeds.itch.book import Books
from duetime.feeds.itch.fastbook import FastBook, fast_book_summary, load_buffer
from duetime.feeds.itch.fastfeed import FastFeed
from duetime.feeds.itch.features import Features
from duetime.feeds.itch.parser import decode_columns, frame_index, read_messages
from duetime.feeds.itch.summary import book_summary
from duetime.feeds.itch.synth import write_session

Row = dict[str, Any]
REF_FIELDS = (("AFECXDU", 11), ("U", 19))
"""(types, offset in the message) of every order reference field."""


def renumber_references(data: np.ndarray) -> np.ndarray:
    """A copy of the stream with each order reference replaced by its rank of first use."""
    out = data.copy()
    index = frame_index(out)
    starts = []
    for letters, offset in REF_FIELDS:
        kinds = np.frombuffer(letters.encode(), np.uint8)
        starts.append(index.offsets[np.isin(index.types, kinds)] + 2 + offset)
    at = np.sort(np.concatenate(starts))[:, None] + np.arange(8)
    refs = out[at].view(">u8").ravel()
    unique, first, inverse = np.unique(refs, return_index=True, return_inverse=True)
    rank = np.empty(len(unique), np.uint64)
    rank[np.argsort(first)] = np.arange(1, len(unique) + 1, dtype=np.uint64)
    out[at] = rank[inverse].astype(">u8").view(np.uint8).reshape(-1, 8)
    return out


def best_of(repeat: int, run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


# -- what each row runs: a path in, its result out --------------------------------------------


def streaming_parse(path: Path) -> int:
    return sum(1 for _ in read_messages(path))


def column_parse(path: Path) -> int:
    data = load_buffer(path)
    columns = decode_columns(data, frame_index(data))
    return sum(len(c) for c in columns.values())


def python_book(path: Path) -> int:
    books = Books()
    apply = books.apply
    for message in read_messages(path):
        apply(message)
    return books.live_orders


def python_features(path: Path) -> int:
    books = Books()
    features = Features()
    events = 0
    for message in read_messages(path):
        event = books.apply(message)
        if event is not None:
            features.update(event, books.book(event.locate))
            events += 1
    return events


def fast_features(path: Path) -> int:
    """The compiled per-event path of `itch run` (FastFeed) over the whole file in steps of
    16,384 event rows: books, the feature vector of every book event and its stock's key."""
    rows = 1 << 14
    feed = FastFeed(load_buffer(path), rows=rows)
    while feed.messages < len(feed):
        feed.step(len(feed), rows)
    return feed.book_events


def itch_book_session(path: Path, tables: list[str], depth: int) -> int:
    """itch-book's C++ Session on the whole (decompressed) buffer, tables as asked."""
    from itch_book._core import Session  # type: ignore[import-untyped]

    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    session = Session(tables=tables, depth=depth, symbols=[])
    session.reserve(len(data) // 20)
    session.feed(data)
    return int(session.stats()["live_orders"])


def itch_book_feed(path: Path) -> int:
    """itch-book's documented entry point: Feed.batches, which reads (and gunzips) the file on
    a thread and returns BBO columns as numpy arrays."""
    from itch_book import Feed  # type: ignore[import-untyped]

    with Feed(str(path), date=dt.date(2024, 1, 2)) as feed:
        return sum(len(batch.bbo["ts_event"]) for batch in feed.batches(("bbo",)))


def itchcpp_parse(path: Path) -> int:
    from itchcpp.parser import MessageParser  # type: ignore[import-untyped]

    with gzip.open(path) if path.suffix == ".gz" else path.open("rb") as file:
        return sum(1 for _ in MessageParser().parse_file(file))


def itchcpp_book(path: Path) -> int:
    from itchcpp.book import BookManager  # type: ignore[import-untyped]

    data = path.read_bytes()
    manager = BookManager()
    manager.process_stream(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return int(manager.book_count())


def book_command(path: Path, engine: str) -> int:
    """`duetime itch book FILE --json OUT --engine ENGINE` in a process of its own: from the
    command line to the summary written, imports and (numba) loading the compiled code
    included."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "book.json"
        subprocess.run(
            [sys.executable, "-m", "duetime", "itch", "book", str(path), "--json", str(out),
             "--engine", engine],
            check=True,
        )  # fmt: skip
        return out.stat().st_size


# (section, tool, entry point, what it measures, runner, fast)
ROWS: list[tuple[str, str, str, str, Callable[[Path], object], bool]] = [
    ("parse", "duetime", "parser.read_messages", "stream of message tuples", streaming_parse,
     False),
    ("parse", "duetime", "frame_index + decode_columns", "numba frame scan, numpy columns",
     column_parse, True),
    ("parse", "itchcpp", "MessageParser.parse_file", "C++ decode, one Python object a message",
     itchcpp_parse, False),
    ("parse + book", "duetime", "book.Books (pure Python)", "every stock's L3 book",
     python_book, False),
    ("parse + book", "duetime", "summary.book_summary", "L3 books + the summary JSON dict",
     lambda p: book_summary(p), False),
    ("parse + book", "duetime", "FastBook(record_changes=False)", "numba: L3 books, no change "
     "rows", lambda p: FastBook(p, record_changes=False), True),
    ("parse + book", "duetime", "fastbook.FastBook", "numba: L3 books + top after every change",
     lambda p: FastBook(p), True),
    ("parse + book", "duetime", "fastbook.fast_book_summary", "the same + the summary JSON dict",
     lambda p: fast_book_summary(p), True),
    ("parse + book", "itch-book", "Session(tables=[]).feed", "C++: L3 books, no output tables",
     lambda p: itch_book_session(p, [], 0), True),
    ("parse + book", "itch-book", "Session(tables=['bbo']).feed", "C++: L3 books + BBO changes",
     lambda p: itch_book_session(p, ["bbo"], 0), True),
    ("parse + book", "itch-book", "Session(['bbo'], depth=5).feed", "the same + top-5 changes",
     lambda p: itch_book_session(p, ["bbo"], 5), True),
    ("parse + book", "itch-book", "Feed.batches(('bbo',))", "its Python API: file -> BBO columns",
     itch_book_feed, True),
    ("parse + book", "itchcpp", "BookManager.process_stream", "C++: L3 books, one pass",
     itchcpp_book, True),
    ("parse + book + features", "duetime", "fastfeed.FastFeed.step", "numba: 21 features per "
     "event", fast_features, True),
    ("parse + book + features", "duetime", "Books + Features.update", "21 features per event",
     python_features, False),
    ("command", "duetime", "itch book (--engine auto)", "a process: file -> summary JSON "
     "(numba)", lambda p: book_command(p, "auto"), True),
    ("command", "duetime", "itch book --engine python", "the same on the streaming books",
     lambda p: book_command(p, "python"), False),
]  # fmt: skip

PACE_MESSAGES = 60_000
PACE_RATE = 2_000.0
"""The tick-to-prediction session: 60k messages at ~2,000 a second (30 s at the recorded pace),
every book event asking the demo MLP."""
RUNS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("recorded", 1000, 1, ()), ("recorded", 1000, 1, ("--engine", "python")),
    ("recorded", 1000, 1, ("--no-keep-warm",)), ("recorded", 200, 1, ()),
    ("recorded", 1000, 10, ()), ("max", 1000, 1, ()), ("max", 1000, 1, ("--engine", "python")),
)  # fmt: skip
"""(pace, deadline µs, every N-th event, other arguments) of each `duetime itch run`: the
compiled per-event path (`--engine auto` on this file), beside it the pure-Python one and the
first row without keeping the per-event path warm while waiting."""
LIVE_DEADLINE_US = 1000
"""The live row: `duetime itch listen` fed the same session over MoldUDP64 by `itch send`."""


def tick_to_prediction(directory: Path, seed: int, repository: Path) -> list[Row]:
    """`duetime itch run` with the demo `orderbook` MLP through the in-process Engine, each in a
    fresh process: tick-to-prediction (recorded arrival to answer), on time, late, refused."""
    session = directory / "paced.itch"
    write_session(session, seed=seed, messages=PACE_MESSAGES, rate=PACE_RATE)
    rows = []
    for pace, deadline_us, every, extra in RUNS:
        report = directory / "run.json"
        subprocess.run(
            [sys.executable, "-m", "duetime", "itch", "run", str(session), "--model",
             "orderbook", "--repository", str(repository), "--pace", pace, "--deadline-us",
             str(deadline_us), "--every", str(every), "--max-gap-ms", "10", "--json",
             str(report), "-q", *extra],
            check=True,
        )  # fmt: skip
        label = " ".join((pace, *extra))
        rows.append(_tick_row(label, deadline_us, every, json.loads(report.read_text())))
    rows.append(_tick_row("live", LIVE_DEADLINE_US, 1, live_run(session, repository, directory)))
    if os.access(CPU_DMA_LATENCY, os.W_OK):  # idle CPUs poll instead of halting (needs root)
        polling = live_run(session, repository, directory, "--cpu-dma-latency-us", "0")
        rows.append(_tick_row("live, --cpu-dma-latency-us 0", LIVE_DEADLINE_US, 1, polling))
    return rows


def live_run(session: Path, repository: Path, directory: Path, *extra: str) -> dict[str, Any]:
    """`duetime itch listen` on 127.0.0.1 (with `extra` arguments), fed the session by `duetime
    itch send` at its recorded pace (each its own process, the sender on the CPU the listener's
    loop does not use)."""
    report = directory / "live.json"
    listen = [sys.executable, "-m", "duetime", "itch", "listen", "--udp", "127.0.0.1:0",
              "--model", "orderbook", "--repository", str(repository), "--deadline-us",
              str(LIVE_DEADLINE_US), "--idle-s", "5", "--json", str(report), "-q",
              *extra]  # fmt: skip
    cpus = sorted(os.sched_getaffinity(0))
    with subprocess.Popen(listen, stdout=subprocess.PIPE, text=True) as listener:
        assert listener.stdout is not None
        port = listener.stdout.readline().strip().rsplit(":", 1)[1]
        subprocess.run(
            [sys.executable, "-m", "duetime", "itch", "send", str(session), "--udp",
             f"127.0.0.1:{port}", "--max-gap-ms", "10"],
            check=True, preexec_fn=lambda: os.sched_setaffinity(0, {cpus[-1]}),
        )  # fmt: skip
        listener.wait(timeout=120)
    run: dict[str, Any] = json.loads(report.read_text())
    run["pace_lag_us"] = {"p99": None}
    return run


def _tick_row(pace: str, deadline_us: int, every: int, run: dict[str, Any]) -> Row:
    latency = run["tick_to_prediction_us"]
    print(
        f"  {pace:8s} deadline {deadline_us:5d} µs every {every:2d}: p99 "
        f"{latency['p99']} µs, on time {run['on_time']}/{run['triggers']}",
        flush=True,
    )
    return {
        "pace": pace, "deadline_us": deadline_us, "every": every,
        "requests": run["triggers"], "on_time": run["on_time"],
        "late_dropped": run["late_dropped"], "refused": run["refused"],
        "p50_us": latency["p50"], "p99_us": latency["p99"], "p999_us": latency["p999"],
        "max_us": latency["max"], "pace_lag_p99_us": run["pace_lag_us"]["p99"],
        "missed": run.get("missed_messages", 0), "messages_per_s": run["messages_per_s"],
    }  # fmt: skip


def measure(files: dict[str, Path], messages: int, repeat: int) -> list[Row]:
    rows = []
    for section, tool, entry, measures, run, fast in ROWS:
        row: Row = {"section": section, "tool": tool, "entry": entry, "measures": measures}
        for kind, path in files.items():
            if fast:
                run(path)  # warm-up: numba compiles or loads its cache on the first call
            seconds = best_of(repeat if fast else 1, lambda run=run, path=path: run(path))
            row[f"{kind}_s"] = round(seconds, 4)
            row[f"{kind}_Mmsg_per_s"] = round(messages / seconds / 1e6, 2)
        rows.append(row)
        print(f"  {section:24s} {tool:9s} {entry:32s} {row['plain_Mmsg_per_s']:8.2f} M msg/s",
              flush=True)  # fmt: skip
    return rows


def fastbook_stages(path: Path, repeat: int, messages: int) -> list[Row]:
    """The fast path split: buffer load, compiled pass, summary (depth, rows, digests)."""
    buffer = load_buffer(path)
    book = FastBook(buffer)
    stages = [
        ("load (read + gunzip)", lambda: load_buffer(path)),
        ("compiled pass", lambda: FastBook(buffer)),
        ("summary from the pass", lambda: book.summary()),
    ]
    return [
        {"stage": name, "ms": round(1000 * (s := best_of(repeat, run)), 2),
         "Mmsg_per_s": round(messages / s / 1e6, 2)}
        for name, run in stages
    ]  # fmt: skip


DEEP_LEVELS = 80_000
"""The deep-book table: one stock's bid side, this many adds at distinct prices."""


def deep_book_adds(prices: list[int]) -> np.ndarray:
    """A plain ITCH buffer of one bid add (stock locate 1, 100 shares) at each of `prices`."""
    parts = []
    for ref, price in enumerate(prices, 1):
        body = (b"A" + struct.pack(">HH6sQcI8sI", 1, 0, bytes(6), ref, b"B", 100,
                                   b"X       ", price))  # fmt: skip
        parts.append(struct.pack(">H", len(body)) + body)
    return np.frombuffer(b"".join(parts), np.uint8)


def deep_book(repeat: int) -> list[Row]:
    """A new price level deep in a book: `DEEP_LEVELS` adds in price order and in random order,
    compiled pass and pure-Python books (the compiled pass placed each new level by walking the
    side's levels: 80,000 random-order adds took 37 s against 1.3 s in Python)."""
    prices = list(range(1000, 1000 + DEEP_LEVELS))
    in_order = deep_book_adds(prices)
    random.Random(1).shuffle(prices)
    orders = {"price order": in_order, "random order": deep_book_adds(prices)}
    FastBook(in_order[:380])  # (the JIT, or its disk cache)
    rows = []
    for label, data in orders.items():
        compiled = best_of(repeat, lambda data=data: FastBook(data))
        python = best_of(1, lambda data=data: python_book_buffer(data))
        rows.append({"adds": f"{DEEP_LEVELS:,} in {label}", "compiled_s": round(compiled, 3),
                     "python_books_s": round(python, 3)})  # fmt: skip
    return rows


def python_book_buffer(data: np.ndarray) -> int:
    """The pure-Python books over an in-memory buffer."""
    books = Books()
    for message in read_messages(data.tobytes()):
        books.apply(message)
    return books.live_orders


JIT_PROBE = """
import time, numpy as np
started = time.perf_counter()
from duetime.feeds.itch.fastbook import fast_book_summary
from duetime.feeds.itch.synth import session_bytes
imported = time.perf_counter()
fast_book_summary(session_bytes(seed=1, messages=2000))
print(imported - started, time.perf_counter() - imported)
"""


def jit_cost() -> list[Row]:
    """First call in a fresh process with an empty numba cache, then with the cache warm."""
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        for label in ("empty cache (compiles)", "warm disk cache"):
            out = subprocess.run(
                [sys.executable, "-c", JIT_PROBE], env=env, capture_output=True, text=True,
                check=True,
            ).stdout.split()  # fmt: skip
            rows.append({"first call": label, "import_s": round(float(out[0]), 2),
                         "first_summary_s": round(float(out[1]), 2)})  # fmt: skip
    return rows


def make_files(directory: Path, messages: int, seed: int) -> dict[str, Path]:
    raw = directory / "synth.itch"
    write_session(raw, seed=seed, messages=messages)
    data = renumber_references(load_buffer(raw)).tobytes()
    raw.write_bytes(data)
    packed = directory / "synth.itch.gz"
    packed.write_bytes(gzip.compress(data, compresslevel=6, mtime=0))
    return {"plain": raw, "gzip": packed}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each fast row (best kept)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "itch.json")
    parser.add_argument(
        "--tick-only", action="store_true", help="only the tick-to-prediction table (and JSON)"
    )
    parser.add_argument(
        "--no-tick", action="store_true", help="leave out the tick-to-prediction table"
    )
    args = parser.parse_args()
    if args.tick_only:
        with tempfile.TemporaryDirectory() as tmp:
            repository = write_demo_repository(Path(tmp) / "m")
            ticks = tick_to_prediction(Path(tmp), args.seed, repository)
        print_table("tick-to-prediction (µs)", ticks, list(ticks[0]))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"tick_to_prediction": ticks}, indent=2) + "\n")
        print(f"\nwrote {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        print(f"writing a {args.messages:,}-message session (seed {args.seed}) ...", flush=True)
        files = make_files(Path(tmp), args.messages, args.seed)
        sizes = {kind: path.stat().st_size for kind, path in files.items()}
        same = fast_book_summary(files["plain"]) == book_summary(files["plain"])
        print(f"fast summary == pure-Python summary: {same}", flush=True)
        rows = measure(files, args.messages, args.repeat)
        stages = fastbook_stages(files["plain"], args.repeat, args.messages)
        ticks = []
        if not args.no_tick:
            print("tick-to-prediction, demo orderbook MLP, in-process Engine ...", flush=True)
            repository = write_demo_repository(Path(tmp) / "m")
            ticks = tick_to_prediction(Path(tmp), args.seed, repository)
    jit = jit_cost()
    deep = deep_book(args.repeat)
    columns = ["section", "tool", "entry", "measures", "plain_Mmsg_per_s", "gzip_Mmsg_per_s"]
    shown = [{**row, **{c: f"{row[c]:.2f}" for c in columns[-2:]}} for row in rows]
    print_table(f"{args.messages:,} messages, M messages/s (best of {args.repeat} for "
                "compiled rows, 1 run for pure Python)", shown, columns)  # fmt: skip
    print_table("fastbook stages, plain file", stages, ["stage", "ms", "Mmsg_per_s"])
    print_table("numba JIT", jit, ["first call", "import_s", "first_summary_s"])
    print_table("deep book: one side, one new level per add", deep, list(deep[0]))
    if ticks:
        print_table(
            f"tick-to-prediction (µs, from each message's recorded arrival), {PACE_MESSAGES:,} "
            f"messages at ~{PACE_RATE:,.0f}/s", ticks, list(ticks[0]),
        )  # fmt: skip
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "session": {"messages": args.messages, "seed": args.seed, "bytes": sizes,
                    "references": "renumbered by first use (see the module docstring)"},
        "fast_summary_equals_python": same,
        "throughput": rows,
        "fastbook_stages": stages,
        "jit": jit,
        "deep_book": deep,
        "tick_to_prediction": ticks,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
