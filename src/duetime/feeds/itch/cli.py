"""`duetime itch ...`: run a model on an ITCH file's book events, summarise books, make files.

duetime itch synth FILE [--messages N] [--seed S] [--gzip]
duetime itch run FILE --model NAME [--deadline-us D] [--pace recorded|max] [--every N |
    --on top-change] [--repository DIR | --target HOST:PORT] [--predictions OUT.csv]
    [--json OUT.json]
duetime itch book FILE --json OUT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from duetime.demo import ORDERBOOK_CLASSES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="itch_command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run", help="replay a file through the books and ask a model on book events"
    )
    _add_run_arguments(run)
    book = commands.add_parser("book", help="write each stock's book summary as JSON")
    from duetime.feeds.itch.summary import add_book_arguments

    add_book_arguments(book)
    synth = commands.add_parser("synth", help="write a realistic synthetic ITCH 5.0 session")
    synth.add_argument("file", type=Path)
    synth.add_argument("--messages", type=int, default=200_000)
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--gzip", action="store_true", help="gzip the file")
    synth.add_argument(
        "--rate", type=float, help="messages a second from the open (default: spread over the day)"
    )


def _add_run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("file", type=Path, help="an ITCH 5.0 file (plain or gzip)")
    run.add_argument("--model", required=True, help="e.g. orderbook or deeplob (demo models)")
    run.add_argument("--version", help="the model version (default: the model's default)")
    run.add_argument(
        "--deadline-us", type=float, default=1000.0,
        help="due time of each request after its event's arrival (default 1000 µs)",
    )  # fmt: skip
    run.add_argument("--pace", choices=("recorded", "max"), default="recorded")
    run.add_argument(
        "--speed", type=float, default=1.0, help="with --pace recorded: replay this many times "
        "faster than recorded (default 1)",
    )  # fmt: skip
    trigger = run.add_mutually_exclusive_group()
    trigger.add_argument("--every", type=int, default=1, help="ask on every N-th book event")
    trigger.add_argument(
        "--on", choices=("top-change",), help="ask when the best bid or ask changes"
    )
    run.add_argument(
        "--max-gap-ms", type=float, default=1000.0, help="with --pace recorded: cut longer "
        "quiet stretches between two messages to this (default 1000 ms)",
    )  # fmt: skip
    run.add_argument("--symbols", help="comma-separated stocks to predict for (default: all)")
    run.add_argument("--limit", type=int, help="stop after this many messages")
    where = run.add_mutually_exclusive_group()
    where.add_argument(
        "--repository", type=Path, help="model repository for the in-process Engine "
        "(default: the demo repository)",
    )  # fmt: skip
    where.add_argument("--target", help="a remote duetime (or v2 server) gRPC HOST:PORT")
    run.add_argument(
        "--delivery-margin-us", type=int, default=20, help="in process: the time kept for "
        "handing an answer back, in place of the model's delivery_margin_us (default 20)",
    )  # fmt: skip
    run.add_argument(
        "--execution", choices=("inline", "thread"), default="inline", help="in process: run "
        "the model on the feed's loop (default; no thread hop, for models of tens of µs) or on "
        "an instance thread (heavier models: the feed reads on while the model runs)",
    )  # fmt: skip
    run.add_argument("--predictions", type=Path, help="write the predictions as CSV")
    run.add_argument("--json", type=Path, help="write the run's report as JSON")
    run.add_argument("--on-error", choices=("stop", "skip"), default="stop")
    run.add_argument("-q", "--quiet", action="store_true", help="print no report table")


def run(args: argparse.Namespace) -> int:
    if args.itch_command == "synth":
        from duetime.feeds.itch.synth import write_session

        write_session(
            args.file, seed=args.seed, messages=args.messages, gzip=args.gzip, rate=args.rate
        )
        print(f"wrote {args.messages} messages to {args.file}")
        return 0
    if args.itch_command == "book":
        from duetime.feeds.itch.summary import run_book

        return run_book(args)
    return _run_feed(args)


def _run_feed(args: argparse.Namespace) -> int:
    from duetime.feeds.itch.run import RunOptions, Trigger
    from duetime.loops import new_event_loop

    if not args.file.is_file():
        print(f"duetime itch run: {args.file}: no such file", file=sys.stderr)
        return 2
    if args.deadline_us <= 0 or args.speed <= 0:
        print("duetime itch run: --deadline-us and --speed must be positive", file=sys.stderr)
        return 2
    try:
        trigger = Trigger(every=args.every, top_change=args.on == "top-change")
    except ValueError as exc:
        print(f"duetime itch run: {exc}", file=sys.stderr)
        return 2
    options = RunOptions(
        deadline_ns=int(args.deadline_us * 1000), pace=args.pace, speed=args.speed,
        trigger=trigger, limit=args.limit, max_gap_ns=int(args.max_gap_ms * 1e6),
        symbols=frozenset(args.symbols.split(",")) if args.symbols else None,
    )  # fmt: skip
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        report = loop.run_until_complete(_feed(args, options))
    finally:
        loop.close()
    if report is None:
        return 1
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if not args.quiet:
        _print_report(report)
    return 0 if report["errors"] == 0 else 1


async def _feed(args: argparse.Namespace, options: Any) -> dict[str, Any] | None:
    from duetime.engine import Engine
    from duetime.execution.affinity import CpuPlan, parse_cpus, pin_current_thread
    from duetime.feeds.itch.parser import ItchFormatError, read_messages
    from duetime.feeds.itch.predictors import EnginePredictor, GrpcPredictor, PredictorError
    from duetime.feeds.itch.run import FeedRun, open_log
    from duetime.repository.manager import RepositoryOptions

    engine: Engine | None = None
    predictor: Any = None
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
        log, out = open_log(args.predictions, ORDERBOOK_CLASSES)
        try:
            feed = FeedRun(predictor, options, log)
            messages = read_messages(args.file, on_error=args.on_error)
            stats = await feed.run(messages)
        finally:
            if out is not None:
                out.close()
    except PredictorError as exc:
        print(f"duetime itch run: {exc}", file=sys.stderr)
        return None
    except ItchFormatError as exc:
        print(f"duetime itch run: {args.file}: {exc} (--on-error skip steps over bad frames)",
              file=sys.stderr)  # fmt: skip
        return None
    finally:
        if predictor is not None:
            await predictor.aclose()
        if engine is not None:
            await engine.aclose()
        pin_current_thread(pinned)  # as it was: the caller's thread goes on after the run
    report = stats.report()
    report.update(
        model=args.model, deadline_us=args.deadline_us, pace=args.pace, file=str(args.file)
    )
    return report


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
    lines = [
        f"model {report['model']}, deadline {report['deadline_us']:g} µs, pace {report['pace']}",
        f"  messages {report['messages']}  book events {report['book_events']}  "
        f"requests {report['triggers']}  ({report['messages_per_s']:,.0f} msg/s over "
        f"{report['wall_s']} s)",
        f"  on time {report['on_time']}  late (dropped) {report['late_dropped']}  "
        f"refused {report['refused']}  errors {report['errors']}",
        f"  tick-to-prediction µs: p50 {latency['p50']}  p99 {latency['p99']}  "
        f"p99.9 {latency['p999']}  max {latency['max']}",
    ]
    if lag["p50"] is not None:
        lines.append(f"  pace lag µs: p50 {lag['p50']}  p99 {lag['p99']}")
    if report["first_error"]:
        lines.append(f"  first error: {report['first_error']}")
    print("\n".join(lines))
