"""`duetime itch ...`: run a model on an ITCH file's (or a live feed's) book events, summarise
books, make files, play a file out as a feed.

duetime itch synth FILE [--messages N] [--seed S] [--gzip]
duetime itch run FILE --model NAME [--deadline-us D] [--pace recorded|max] [--every N |
    --on top-change] [--repository DIR | --target HOST:PORT] [--predictions OUT.csv]
    [--json OUT.json]
duetime itch book FILE --json OUT
duetime itch listen --udp HOST:PORT --model NAME [the options of run, less the file's pacing]
duetime itch send FILE --udp HOST:PORT [--pace recorded|max] [--speed X] [--per-packet N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from duetime.demo import ORDERBOOK_CLASSES
from duetime.observability.logs import console
from duetime.tools.argtypes import real, whole

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from duetime.feeds.itch.parser import ItchFormatError
    from duetime.feeds.itch.run import FeedRun
    from duetime.feeds.itch.tally import RunStats


MIN_SPEED = 0.001
"""`--speed` at least: a thousand times slower than recorded (a session's 2**48 ns of
timestamps then still fit the int64 replay times of the compiled path)."""
MAX_GAP_MS = 86_400_000
"""`--max-gap-ms` at most: a day (an ITCH timestamp counts nanoseconds from midnight, so no
quiet stretch of a day's session is longer: this cap cuts none of them).

NOTE: both were open-ended: `--max-gap-ms 1e308` ended in an OverflowError traceback from
`int()`, and `--speed 1e-300` overflowed the compiled path's replay times (every event refused
unasked, with a RuntimeWarning) while the Python path waited for ever (found by a tester)."""
MAX_EVERY = 2**63 - 1
"""`--every` at most: the compiled path keeps it in an int64 (2**63 ended in an OverflowError
traceback there, and passed on the Python path; found by a tester)."""

_NO_SKIP = ("bad_gzip", "truncated")
"""Format errors that end a stream under --on-error skip too (a gzip stream that cannot be read
on, a last frame cut short): no hint to skip them."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="itch_command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run", help="replay a file through the books and ask a model on book events"
    )
    _add_run_arguments(run)
    listen = commands.add_parser(
        "listen", help="take a live MoldUDP64 feed through the books and ask a model on book "
        "events (see `send`)",
    )  # fmt: skip
    _add_run_arguments(listen, live=True)
    send = commands.add_parser(
        "send", help="play a file out as MoldUDP64 datagrams at its recorded pace (a feed)"
    )
    send.add_argument("file", type=Path, help="an ITCH 5.0 file (plain or gzip)")
    send.add_argument("--udp", required=True, help="where to send: HOST:PORT")
    send.add_argument("--pace", choices=("recorded", "max"), default="recorded")
    send.add_argument(
        "--speed", type=real(at_least=MIN_SPEED), default=1.0,
        help="replay this many times faster (at least 0.001)",
    )  # fmt: skip
    send.add_argument("--max-gap-ms", type=real(at_least=0, at_most=MAX_GAP_MS), default=1000.0,
                      help="cut longer quiet stretches between two messages to this (default "
                      "1000 ms, at most a day)")  # fmt: skip
    send.add_argument(
        "--per-packet", type=whole(at_least=1, at_most=0xFFFE), default=32,
        help="messages a datagram at most (1 to 65534; default 32)",
    )  # fmt: skip
    send.add_argument("--session", default="DUETIME", help="MoldUDP64 session name (10 chars)")
    send.add_argument("--limit", type=int, help="stop after this many messages")
    send.add_argument("--on-error", choices=("stop", "skip"), default="stop")
    book = commands.add_parser("book", help="write each stock's book summary as JSON")
    from duetime.feeds.itch.book_command import add_book_arguments

    add_book_arguments(book)
    synth = commands.add_parser("synth", help="write a realistic synthetic ITCH 5.0 session")
    synth.add_argument("file", type=Path)
    synth.add_argument("--messages", type=int, default=200_000)
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--gzip", action="store_true", help="gzip the file")
    synth.add_argument(
        "--rate", type=float, help="messages a second from the open (default: spread over the day)"
    )


def _add_run_arguments(run: argparse.ArgumentParser, *, live: bool = False) -> None:
    if live:
        run.add_argument(
            "--udp", required=True, help="HOST:PORT to take MoldUDP64 datagrams on (port 0: "
            "any free port; the address taken is printed)",
        )  # fmt: skip
        run.add_argument(
            "--idle-s", type=real(above=0), default=10.0, help="end after this long without a "
            "datagram once the feed has started (heartbeats count; default 10 s); the feed's "
            "end-of-session packet, --limit or Ctrl-C end it too",
        )  # fmt: skip
        run.add_argument(
            "--busy-poll-us", type=whole(at_least=0, at_most=1_000_000), default=0,
            help="keep polling the socket this long after each datagram instead of sleeping (a "
            "core stays busy; default 0)",
        )  # fmt: skip
        run.add_argument(
            "--join-late", action="store_true", help="join the session where it stands: the "
            "first datagram with messages sets the sequence (default: a session starts at "
            "sequence 1, and messages before the first datagram seen are missed)",
        )  # fmt: skip
        run.add_argument(
            "--max-sequence-jump", type=int, help="a datagram more than this many messages "
            "ahead of the next expected is a stray (a bad packet), not a gap, unless the next "
            "one continues it (default 1000000)",
        )  # fmt: skip
        run.add_argument(
            "--max-queued-messages", type=int, help="messages "
            "received and not applied yet, at most (default 100000, about 25 MB): a datagram "
            "that comes while the queue is full is dropped and its messages reported missed",
        )  # fmt: skip
        run.add_argument(
            "--cpu-dma-latency-us", type=whole(at_least=0, at_most=2**31 - 1),
            help="while listening, keep idle CPUs able to wake within this many µs (Linux PM "
            "QoS, whole machine, needs root; 0: they poll)",
        )  # fmt: skip
    else:
        run.add_argument("file", type=Path, help="an ITCH 5.0 file (plain or gzip)")
    run.add_argument("--model", required=True, help="e.g. orderbook or deeplob (demo models)")
    run.add_argument("--version", help="the model version (default: the model's default)")
    run.add_argument(
        "--deadline-us", type=real(at_least=0.001), default=1000.0,
        help="due time of each request after its event's arrival (default 1000 µs)",
    )  # fmt: skip
    if not live:
        run.add_argument("--pace", choices=("recorded", "max"), default="recorded")
        run.add_argument(
            "--speed", type=real(at_least=MIN_SPEED), default=1.0, help="with --pace "
            "recorded: replay this many times faster than recorded (default 1, at least 0.001)",
        )  # fmt: skip
        run.add_argument(
            "--max-gap-ms", type=real(at_least=0, at_most=MAX_GAP_MS), default=1000.0,
            help="with --pace recorded: cut longer quiet stretches between two messages to "
            "this (default 1000 ms, at most a day)",
        )  # fmt: skip
        run.add_argument("--on-error", choices=("stop", "skip"), default="stop")
        run.add_argument(
            "--engine", choices=("auto", "numba", "python"), default="auto",
            help="the books and features per event: compiled (numba; holds the file in "
            "memory, a few µs a step of messages) or pure Python (streaming, ~25 µs an event); "
            "the same events and features (default auto: numba for a model of the feature "
            "vector, a file that frames cleanly and fits, see fastfeed.FAST_MAX_BYTES)",
        )  # fmt: skip
    run.add_argument(
        "--no-keep-warm", dest="keep_warm", action="store_false", help="do not run the per-event "
        "path on a book of its own while waiting for a message (with --pace recorded, or live "
        "with --busy-poll-us: it keeps the code path's caches warm, faster answers after gaps)",
    )  # fmt: skip
    trigger = run.add_mutually_exclusive_group()
    trigger.add_argument(
        "--every", type=whole(at_least=1, at_most=MAX_EVERY), default=1,
        help="ask on every N-th book event",
    )  # fmt: skip
    trigger.add_argument(
        "--on", choices=("top-change",), help="ask when the best bid or ask changes"
    )
    run.add_argument(
        "--symbols", help="comma-separated stocks to predict for, keyed as `itch book` keys "
        "them: AAPL, #17 (a locate with no symbol), AAPL@2 (default: all)",
    )  # fmt: skip
    run.add_argument("--limit", type=int, help="stop after this many messages")
    where = run.add_mutually_exclusive_group()
    where.add_argument(
        "--repository", type=Path, help="model repository for the in-process Engine "
        "(default: the demo repository)",
    )  # fmt: skip
    where.add_argument("--target", help="a remote duetime (or v2 server) gRPC HOST:PORT")
    run.add_argument(
        "--delivery-margin-us", type=whole(at_least=0, at_most=10_000_000), default=20,
        help="in process: the time kept for handing an answer back, in place of the model's "
        "delivery_margin_us (default 20)",
    )  # fmt: skip
    run.add_argument(
        "--execution", choices=("inline", "thread"), default="inline", help="in process: run "
        "the model on the feed's loop (default; no thread hop, for models of tens of µs) or on "
        "an instance thread (heavier models: the feed reads on while the model runs)",
    )  # fmt: skip
    run.add_argument("--predictions", type=Path, help="write the predictions as CSV")
    run.add_argument("--json", type=Path, help="write the run's report as JSON")
    run.add_argument("-q", "--quiet", action="store_true", help="print no report table")


def run(args: argparse.Namespace) -> int:
    if args.itch_command == "synth":
        return _synth(args)
    if args.itch_command == "book":
        from duetime.feeds.itch.book_command import run_book

        return run_book(args)
    if args.itch_command == "send":
        return _send(args)
    return _run_feed(args)


def _synth(args: argparse.Namespace) -> int:
    from duetime.errors import ConfigError
    from duetime.feeds.itch.synth import write_session
    from duetime.tools.outputs import OutputError, check_output, failed_write, make_parents

    try:
        check_output(args.file, "FILE")
        make_parents(args.file, "FILE")
        write_session(
            args.file, seed=args.seed, messages=args.messages, gzip=args.gzip, rate=args.rate
        )
    except ConfigError as exc:
        console(f"duetime itch synth: {exc.message}")
        return 2
    except ValueError as exc:  # (too few --messages, a --rate that is not positive)
        console(f"duetime itch synth: {exc}")
        return 2
    except OutputError as exc:
        console(f"duetime itch synth: {exc.message}")
        return 1
    except OSError as exc:  # (a full disk)
        console(f"duetime itch synth: {failed_write(args.file, 'FILE', exc).message}")
        return 1
    print(f"wrote {args.messages} messages to {args.file}")
    return 0


def _send(args: argparse.Namespace) -> int:
    from duetime.feeds.itch.live import send_session
    from duetime.feeds.itch.moldudp import session_name
    from duetime.feeds.itch.parser import file_problem, skipped_note

    if problem := file_problem(args.file):
        console(f"duetime itch send: {args.file}: {problem}")
        return 2
    if args.limit is not None and args.limit < 0:
        console(f"duetime itch send: --limit must be 0 or more, got {args.limit}")
        return 2
    try:
        address = parse_address(args.udp, "--udp")
    except ValueError as exc:
        console(f"duetime itch send: {exc}")
        return 2
    try:
        session_name(args.session)
    except ValueError as exc:
        console(f"duetime itch send: --session: {exc}")
        return 2
    try:
        report = send_session(
            args.file, address, pace=args.pace, speed=args.speed,
            max_gap_ns=int(args.max_gap_ms * 1e6), per_packet=args.per_packet,
            session=args.session, limit=args.limit, on_error=args.on_error,
        )  # fmt: skip
    except (ValueError, OSError) as exc:
        console(f"duetime itch send: {exc}")
        return 2
    late = "" if report.late_p99_us is None else f", p99 {report.late_p99_us:.0f} µs late"
    print(f"sent {report.messages} messages in {report.packets} datagrams to "
          f"{address[0]}:{address[1]} over {report.wall_s:.3f} s{late}")  # fmt: skip
    if report.first_skipped is not None:  # (as `itch book` and `itch run` say what they skipped)
        console(f"duetime itch send: {args.file}: "
                f"{skipped_note(report.skipped, report.first_skipped)}")  # fmt: skip
    if report.format_error is not None:  # (sent up to it, the session left open: exit 1)
        error = report.format_error
        hint = "" if error.reason in _NO_SKIP else " (--on-error skip steps over bad frames)"
        console(f"duetime itch send: {args.file}: {error}{hint}; the session was left open "
                "(no end-of-session sent: a listener ends on its --idle-s)")  # fmt: skip
        return 1
    return 0


def parse_address(text: str, option: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets: [::1]:31000) as (host, port)."""
    host, colon, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not colon or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"{option}: expected HOST:PORT (e.g. 127.0.0.1:31000), got {text!r}")
    return host, int(port)


def _run_feed(args: argparse.Namespace) -> int:
    from duetime.errors import ConfigError
    from duetime.feeds.itch.parser import file_problem
    from duetime.feeds.itch.run import RunOptions, Trigger
    from duetime.loops import new_event_loop
    from duetime.tools.outputs import OutputError, check_apart, check_output, write_output

    command = f"duetime itch {args.itch_command}"
    live = args.itch_command == "listen"
    if not live and (problem := file_problem(args.file)):
        console(f"{command}: {args.file}: {problem}")
        return 2
    speed = 1.0 if live else args.speed  # (both checked as they are read: see argtypes)
    if args.target is not None and not args.target.strip():  # (grpc waited for good on '')
        console(f"{command}: --target: expected HOST:PORT, got an empty one")
        return 2
    symbols = args.symbols.split(",") if args.symbols else None
    if symbols is not None and not all(name.strip() for name in symbols):
        console(f"{command}: --symbols: expected comma-separated stock names, got {args.symbols!r}")
        return 2
    if args.limit is not None and args.limit < 0:
        console(f"{command}: --limit must be 0 or more, got {args.limit}")
        return 2
    try:  # (before the model loads and the file is read, not after)
        reads = () if live else (args.file,)
        check_output(args.json, "--json", reads=reads)
        check_output(args.predictions, "--predictions", reads=reads)
        check_apart(args.predictions, "--predictions", args.json, "--json")
    except ConfigError as exc:
        console(f"{command}: {exc.message}")
        return 2
    if live:
        for option in ("max_queued_messages", "max_sequence_jump"):
            value = getattr(args, option)
            if value is not None and value < 1:
                flag = "--" + option.replace("_", "-")
                console(f"{command}: {flag} must be at least 1, got {value}")
                return 2
    try:
        trigger = Trigger(every=args.every, top_change=args.on == "top-change")
        args.address = parse_address(args.udp, "--udp") if live else None
    except ValueError as exc:
        console(f"{command}: {exc}")
        return 2
    options = RunOptions(
        deadline_ns=int(args.deadline_us * 1000), pace="max" if live else args.pace,
        speed=speed, trigger=trigger, limit=args.limit,
        symbols=frozenset(name.strip() for name in symbols) if symbols else None,
    )  # fmt: skip
    options.keep_warm = args.keep_warm
    if not live:
        options.max_gap_ns = int(args.max_gap_ms * 1e6)
    else:
        options.busy_poll_ns = max(0, args.busy_poll_us) * 1000
        if args.max_queued_messages is not None:  # (default: run.MAX_QUEUED_MESSAGES)
            options.max_queued = args.max_queued_messages
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        outcome = loop.run_until_complete(_feed(args, options))
    finally:
        loop.close()
    if outcome is None:
        return 1
    report, written = outcome
    if not args.quiet:
        _print_report(report)
    if args.json is not None:
        try:
            write_output(args.json, json.dumps(report, indent=2) + "\n", "--json")
        except OutputError as exc:
            console(f"{command}: {exc.message}")
            written = False
    return 0 if report["errors"] == 0 and report.get("format_error") is None and written else 1


async def _feed(args: argparse.Namespace, options: Any) -> tuple[dict[str, Any], bool] | None:
    """The run's report, and whether its predictions were written (all of them, if asked for);
    None when it could not run (said on stderr)."""
    from duetime.engine import Engine
    from duetime.errors import ConfigError
    from duetime.execution.affinity import CpuPlan, parse_cpus, pin_current_thread
    from duetime.feeds.itch.parser import read_messages, skipped_note
    from duetime.feeds.itch.predictors import EnginePredictor, GrpcPredictor, PredictorError
    from duetime.feeds.itch.run import FeedRun
    from duetime.feeds.itch.tally import frame_report, open_log
    from duetime.repository.manager import RepositoryOptions
    from duetime.tools.outputs import OutputError, failed_write

    engine: Engine | None = None
    predictor: Any = None
    engine_used = "python"
    """The books and features the run took: "numba" (`fastfeed`) or "python"."""
    pinned: frozenset[int] | None = None
    try:
        if args.target is not None:
            predictor = await GrpcPredictor.connect(args.target, args.model)
        else:
            repository = args.repository or _demo_repository()
            plan = CpuPlan(parse_cpus("auto"))
            if plan.loop_cpu is not None:
                pinned = frozenset(os.sched_getaffinity(0))
                pin_current_thread(frozenset({plan.loop_cpu}))
            engine = Engine(cpus=plan, options=RepositoryOptions(control_mode="explicit"))
            await engine.load_repository(Path(repository))
            await _load(engine, Path(repository), args)
            options.nap = args.execution == "thread"
            predictor = EnginePredictor(engine, args.model, args.version)
        log = open_log(args.predictions, ORDERBOOK_CLASSES, "--predictions")
        try:
            feed = FeedRun(predictor, options, log)
            source = str(args.file) if args.address is None else f"udp://{args.udp}"
            if args.address is not None:
                stats, source = await _listen(feed, args.address, args)
            elif (fast := _fast_feed(args, feed, predictor)) is not None:
                engine_used = "numba"
                stats = await feed.run_fast(fast)
            else:
                messages = read_messages(args.file, on_error=args.on_error)
                stopped: list[ItchFormatError] = []
                stats = await feed.run(_until_error(messages, stopped))
                if messages.errors:
                    stats.skipped_frames = messages.skipped
                    stats.first_skipped = frame_report(messages.errors[0])
                    note = skipped_note(messages.skipped, messages.errors[0])
                    console(f"duetime itch run: {args.file}: {note}", logging.WARNING)
                if stopped:  # (the run and its report go up to it; exit 1)
                    error = stopped[0]
                    stats.format_error = frame_report(error)
                    hint = " (--on-error skip steps over bad frames)"
                    hint = "" if error.reason in _NO_SKIP else hint
                    console(f"duetime itch run: {args.file}: {error}{hint}")
        finally:
            log.close()
    except OutputError as exc:  # (--predictions: checked before; its folder went away)
        console(f"duetime itch {args.itch_command}: {exc.message}")
        return None
    except PredictorError as exc:
        console(f"duetime itch {args.itch_command}: {exc}")
        return None
    except ConfigError as exc:  # --cpu-dma-latency-us could not be held
        console(f"duetime itch {args.itch_command}: {exc.message}")
        return None
    except OSError as exc:  # the UDP address could not be bound, the file could not be read
        where = f"--udp {args.udp}" if args.address is not None else str(args.file)
        console(f"duetime itch {args.itch_command}: {where}: {exc}")
        return None
    finally:
        if predictor is not None:
            await predictor.aclose()
        if engine is not None:
            await engine.aclose()
        pin_current_thread(pinned)  # as it was: the caller's thread goes on after the run
    report = stats.report()
    live = args.address is not None
    report.update(
        model=args.model, deadline_us=args.deadline_us, pace="live" if live else args.pace,
        file=source, engine=engine_used,
    )  # fmt: skip
    if stats.book_anomalies:  # (as `itch book` says them; a live feed's gap shows here)
        counts = ", ".join(f"{kind}={n}" for kind, n in stats.book_anomalies.items())
        console(f"duetime itch {args.itch_command}: {report['file']}: book anomalies: {counts}",
                logging.WARNING)  # fmt: skip
    if stats.unknown_symbols:  # (a typo would otherwise make the run a silent no-op)
        note = symbols_note(stats.unknown_symbols, feed.stock_names())
        console(f"duetime itch {args.itch_command}: {report['file']}: {note}", logging.WARNING)
    if log.error is not None:  # (a full disk: the run went on; its predictions are cut short)
        failure = failed_write(args.predictions, "--predictions", log.error)
        console(f"duetime itch {args.itch_command}: {failure.message}")
    return report, log.error is None


def symbols_note(unknown: Iterable[str], names: Iterable[str]) -> str:
    """One line (for stderr) on `--symbols` the feed never keyed, each with the feed's closest
    key in brackets where one is close (a typo: "APPL (AAPL?)")."""
    import difflib

    names = sorted(names)
    said = []
    for symbol in unknown:
        close = difflib.get_close_matches(symbol, names, n=1)
        said.append(f"{symbol} ({close[0]}?)" if close else symbol)
    return (
        f"--symbols never seen in the feed: {', '.join(said)}: nothing was asked for them "
        "(stocks are keyed as `itch book` keys them: AAPL, #17, AAPL@2)"
    )


def _until_error(messages: Iterable[Any], stopped: list[ItchFormatError]) -> Iterator[Any]:
    """`messages` up to a malformed frame that stops them (`--on-error stop`), kept in
    `stopped`: the run ends there with what it did before, and reports it."""
    from duetime.feeds.itch.parser import ItchFormatError

    try:
        yield from messages
    except ItchFormatError as exc:  # (a ValueError; a damaged gzip stream is no OSError here)
        stopped.append(exc)


async def _listen(
    feed: FeedRun, address: tuple[str, int], args: argparse.Namespace
) -> tuple[RunStats, str]:
    """Bind the feed's socket, say where, and run the pipeline on it until it ends (holding
    idle CPUs to `--cpu-dma-latency-us` throughout, when given); the stats, and the address
    bound as a udp:// URL (port 0 asks for any free port: this is the one taken)."""
    import contextlib
    import signal

    from duetime.execution.affinity import CpuLatencyLimit
    from duetime.feeds.itch.live import UdpFeed
    from duetime.feeds.itch.moldudp import MAX_JUMP, bad_packets_note

    limit = args.cpu_dma_latency_us
    with contextlib.nullcontext() if limit is None else CpuLatencyLimit(limit):
        udp = await UdpFeed.open(
            *address, idle_s=args.idle_s, busy_poll_us=args.busy_poll_us,
            join_late=args.join_late, max_jump=args.max_sequence_jump or MAX_JUMP,
        )  # fmt: skip
        bound_host, bound_port = udp.address
        host = f"[{bound_host}]" if ":" in bound_host else bound_host
        where = f"udp://{host}:{bound_port}"
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, udp.stop)
        try:
            # (said once the pipeline is primed and takes datagrams: said at the bind, ~28 ms
            # before, a sender started on it had its first datagrams read as one backlog, most
            # of them refused unasked; a tester)
            stats = await feed.run_live(udp, lambda: print(f"listening on {where}", flush=True))
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
    if stats.feed is not None and stats.feed.bad_kinds:  # (as `itch run` says what it skipped)
        note = bad_packets_note(stats.feed.bad_kinds)
        console(f"duetime itch listen: {where}: {note}", logging.WARNING)
    return stats, where


def _fast_feed(args: argparse.Namespace, feed: Any, predictor: Any) -> Any:
    """The compiled per-event path for this run (`fastfeed.FastFeed`), or None for the Python
    path: `--engine python`, or with `auto` where the compiled one cannot take the run (no
    numba, a model of the DeepLOB window, a file too big to hold or that does not frame
    cleanly: the streaming path applies `--on-error` to it). `--engine numba` raises a
    `PredictorError` saying why not instead."""
    from duetime.feeds.itch.parser import ItchFormatError
    from duetime.feeds.itch.predictors import PredictorError

    forced = args.engine == "numba"
    if args.engine == "python":
        return None
    if not feed.takes_vector:
        if forced:
            raise PredictorError(
                f"--engine numba: --model {args.model} takes the DeepLOB window; the compiled "
                "path gives the feature vector (--engine python or auto)"
            )
        return None
    try:
        from duetime.feeds.itch.fastfeed import FastFeed, compile_step, load_whole
    except ImportError:
        if forced:
            raise PredictorError(
                "--engine numba needs numba (pip install 'duetime[itch]')"
            ) from None
        return None
    try:
        buffer = load_whole(args.file, whole=forced)
        if buffer is None:
            if forced:
                raise PredictorError(f"--engine numba: {args.file}: not a regular file")
            return None
        fast = FastFeed(
            buffer, every=args.every, top_change=args.on == "top-change",
            rows=max(1, predictor.max_batch),
        )  # fmt: skip
    except ItchFormatError as exc:
        if forced:
            raise PredictorError(
                f"--engine numba: {args.file}: {exc} (the Python path, --engine python or "
                "auto, applies --on-error)"
            ) from None
        return None
    compile_step()
    return fast


async def _load(engine: Any, repository: Path, args: argparse.Namespace) -> None:
    """Load the model as a feed in this process wants it: run on the loop (`--execution
    inline`, the default) and with the delivery margin of an answer that stays in process.

    A model's `delivery_margin_us` (300 µs by default) keeps time for the network and the
    client; here the answer is a callback on the same loop (~15 µs), and a deadline of a few
    hundred µs would otherwise be refused outright. Inline, a request goes from the feed to
    ONNX Runtime and back without a thread hop (tens of µs each way on a VM).
    """
    from duetime.config import ModelConfig
    from duetime.errors import DuetimeError
    from duetime.feeds.itch.predictors import PredictorError
    from duetime.repository.tritonconfig import load_model_config

    model = args.model
    try:
        config = load_model_config(repository / model).model_dump()
        config["scheduling"]["delivery_margin_us"] = args.delivery_margin_us
        config["execution"] = args.execution
        if args.execution == "inline":
            config["instances"] = 1
        await engine.load_model(model, ModelConfig.model_validate(config))
    except DuetimeError as exc:
        raise PredictorError(f"--model {model}: {exc.message}") from None


def _demo_repository() -> Path:
    from duetime.cli import demo_cache_dir
    from duetime.demo import write_demo_repository

    return write_demo_repository(demo_cache_dir())


def _print_report(report: dict[str, Any]) -> None:
    latency = report["tick_to_prediction_us"]
    lag = report["pace_lag_us"]
    due = report["refused_unasked"]
    unasked = f" (due before they were asked: {due})" if due else ""
    lines = [
        f"model {report['model']}, deadline {report['deadline_us']:g} µs, pace {report['pace']}, "
        f"books and features: {report['engine']}",
        f"  messages {report['messages']}  book events {report['book_events']}  "
        f"requests {report['triggers']}  ({report['messages_per_s']:,.0f} msg/s over "
        f"{report['wall_s']} s)",
        f"  on time {report['on_time']}  late (dropped) {report['late_dropped']}  "
        f"refused {report['refused']}{unasked}  errors {report['errors']}",
        f"  tick-to-prediction µs: p50 {latency['p50']}  p99 {latency['p99']}  "
        f"p99.9 {latency['p999']}  max {latency['max']}"
        if latency["p50"] is not None
        else "  tick-to-prediction µs: no answers",  # (not "p50 None p99 None")
    ]
    if report["unanswered"]:
        lines.append(f"  unanswered (given up after their due time; counted late) "
                     f"{report['unanswered']}")  # fmt: skip
    if lag["p50"] is not None:
        lines.append(f"  pace lag µs: p50 {lag['p50']}  p99 {lag['p99']}")
    if report["pace"] == "live":
        dropped = report.get("queue_dropped_messages")
        full = f" (dropped for a full queue: {dropped})" if dropped else ""
        lines.append(f"  missed messages (sequence gaps) {report['missed_messages']}{full}  "
                     f"reordered {report.get('reordered_messages', 0)}  "
                     f"duplicates {report.get('duplicate_messages', 0)}  "
                     f"bad packets {report['bad_packets']}")  # fmt: skip
        if not report.get("end_of_session", True):  # (a sender that gave up leaves it open)
            lines.append("  no end-of-session packet came (ended on --idle-s, --limit or a "
                         "signal)")  # fmt: skip
        if report.get("book_incomplete"):
            lines.append(f"  the books may lack orders ({report['gaps']} sequence gap(s), "
                         f"first sequence {report['first_sequence']}): predictions after a gap "
                         "have book_gaps > 0")  # fmt: skip
    if report["first_error"]:
        lines.append(f"  first error: {report['first_error']}")
    print("\n".join(lines))
