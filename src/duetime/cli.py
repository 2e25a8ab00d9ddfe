"""The `duetime` command: every subcommand's flags, and the only place that sets exit codes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Container, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from duetime.config import ServerSettings, named_sources, server_settings, setting_sources
from duetime.errors import ConfigError
from duetime.loops import new_event_loop
from duetime.observability.logs import configure_logging, console

if TYPE_CHECKING:
    from duetime.server import Server


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser(tools={_command_in(argv)})
    args = parser.parse_args(argv)
    for variable, value, choices in (
        ("DUETIME_LOG_LEVEL", args.log_level, LOG_LEVELS),
        ("DUETIME_LOG_FORMAT", args.log_format, LOG_FORMATS),
    ):
        if value not in choices:  # (argparse checks a flag's value, not a default from here)
            console(f"duetime: {variable}: expected one of {', '.join(choices)}, got {value!r}")
            return 2
    configure_logging(args.log_level, args.log_format)
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "bench":
            from duetime.tools.loadgen import run as bench

            return bench(args)
        if args.command == "replay":
            from duetime.tools.replay import run as replay

            return replay(args)
        if args.command == "report":
            from duetime.tools.compare import run as report

            return report(args)
        if args.command == "optimize":
            from duetime.tools.optimize import run as optimize

            return optimize(args)
        if args.command == "capture":
            from duetime.tools.capture.cli import run as capture

            return capture(args)
        if args.command == "itch":
            from duetime.feeds.itch.cli import run as itch

            return itch(args)
        return _serve(args, parser)
    except ConfigError as exc:
        console(f"duetime: {exc.message}")
        return 2
    except KeyboardInterrupt:  # (Ctrl-C before a command took it over: importing, loading)
        console("duetime: interrupted", logging.WARNING)
        return 130
    except BrokenPipeError:  # (the report piped into `head`, say: it read what it wanted)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no second error)
        return 141


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


def _env_default(variable: str, default: str) -> str:
    """A log flag's default: its `DUETIME_*` variable, as every server setting has one (it was
    warned of as naming no setting, and ignored); `main` checks its value."""
    return os.environ.get(variable, "").strip().lower() or default


def _command_in(argv: Sequence[str]) -> str | None:
    """The command `argv` names (its first word that is no flag nor a log flag's value)."""
    words = iter(argv)
    for word in words:
        if word in ("--log-level", "--log-format"):
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


TOOLS: dict[str, str] = {
    "bench": "duetime.tools.loadgen",
    "replay": "duetime.tools.replay",
    "report": "duetime.tools.compare",
    "optimize": "duetime.tools.optimize",
    "capture": "duetime.tools.capture.cli",
    "itch": "duetime.feeds.itch.cli",
}
"""The commands whose flags their own module adds (`add_arguments`), and that module."""


def _parser(tools: Container[str | None] | None = None) -> argparse.ArgumentParser:
    """The command line; `tools`: the tool commands (`TOOLS`) whose flags are added (None: all).

    NOTE: each tool's module imports much of the server: with every one, building the parser
    took 1.0 s of the 1.4 s a `duetime serve` with a bad flag took to say so (and `duetime
    --help` as long). A tool's flags are needed only where the command line names it."""
    parser = argparse.ArgumentParser(
        prog="duetime",
        description="duetime: an inference server for ONNX models whose requests carry due "
        "times (KServe v2 / Triton protocol over HTTP and gRPC), and the tools that measure it.",
    )
    _add_log_flags(parser, top=True)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="write the demo model repository to PATH")
    demo.add_argument("path", help="the folder to write the models to (created if missing)")
    demo.add_argument(
        "--force", action="store_true",
        help="overwrite files of PATH that differ from the demo's (a model of the same name: "
        "mlp, resnet, orderbook, deeplob); without it they are refused and nothing is written",
    )  # fmt: skip
    serve = commands.add_parser("serve", help="serve a model repository over HTTP and gRPC")
    serve.add_argument("repository", nargs="?", type=_path, help="the model repository folder")
    serve.add_argument(
        "--model-repository", "--model-store", "--repository", dest="model_repository",
        type=_path, metavar="PATH", action="append",
        help="the model repository folder, by Triton's flag name (or as `itch run` and `bench` "
        "take it)",
    )  # fmt: skip
    serve.add_argument(
        "--demo", action="store_true",
        help="serve the built-in demo models (written to $XDG_CACHE_HOME/duetime/demo, by "
        "default ~/.cache/duetime/demo)",
    )  # fmt: skip
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--http-port", type=int, help="HTTP port (default 8000; 0 picks one)")
    serve.add_argument("--grpc-port", type=int, help="gRPC port (default 8001; 0 picks one)")
    serve.add_argument(
        "--metrics-port", type=int, help="Prometheus /metrics port (default 8002; 0 picks one)"
    )
    serve.add_argument(
        "--no-metrics", dest="metrics", action="store_false", default=None,
        help="serve no Prometheus metrics",
    )  # fmt: skip
    serve.add_argument(
        "--max-body-bytes", type=int, help="largest request body accepted (64 MiB; more get 413)"
    )
    serve.add_argument(
        "--max-header-bytes", type=int, help="largest HTTP request head (65536; more get 431)"
    )
    serve.add_argument(
        "--max-json-bytes", type=int,
        help="largest JSON part of an HTTP inference request (8 MiB; more get 413: send big "
        "tensors as binary data)",
    )  # fmt: skip
    serve.add_argument(
        "--max-json-answer-bytes", type=int,
        help="largest HTTP inference answer written as JSON (256 MiB; a bigger one gets 400: "
        "ask for big outputs as binary data)",
    )  # fmt: skip
    serve.add_argument(
        "--max-run-memory-bytes", type=int,
        help="the most one request's values may ask a model's node to allocate (a shape "
        "given to ConstantOfShape, Expand, ...; default a quarter of memory; more get 400)",
    )  # fmt: skip
    serve.add_argument(
        "--max-grpc-message-bytes", type=int,
        help="largest gRPC message, request or answer (64 MiB; at most 2 GiB - 1)",
    )  # fmt: skip
    _add_grpc_transport_flags(serve)
    serve.add_argument(
        "--idle-timeout-s", type=float,
        help="close keep-alive connections idle this long, and drop those whose client reads "
        "none of its answers this long (60)",
    )  # fmt: skip
    serve.add_argument(
        "--max-connections", type=int,
        help="open HTTP connections accepted (4096); at the limit a new one closes one too slow "
        "at its request, else the longest idle one with no request in flight, else refuses "
        "503 the request waiting longest for room for its body; with none, it gets 503",
    )  # fmt: skip
    serve.add_argument(
        "--max-grpc-connections", type=int,
        help="open gRPC connections accepted (4096); past it gRPC closes a new one at once",
    )  # fmt: skip
    serve.add_argument(
        "--grpc-max-concurrent-streams", type=int,
        help="calls one gRPC connection may have open at once (0, the default: no bound); past "
        "it some clients hold calls back, others fail them UNAVAILABLE (see the README)",
    )  # fmt: skip
    serve.add_argument(
        "--request-read-timeout-s", type=float,
        help="an HTTP request head must arrive within this of its first byte, then its body "
        "at --min-body-rate-bytes-s over each such period (10; slower clients get 408); a "
        "connection that sends nothing within this of its accept is closed, and a unary gRPC "
        "call whose request message has not all come within this of its start is ended (a "
        "stream waiting for its first, once half of --max-grpc-connections streams do)",
    )  # fmt: skip
    serve.add_argument(
        "--min-body-rate-bytes-s", type=int, help="slowest accepted body upload rate (65536)"
    )
    serve.add_argument(
        "--max-inflight-bytes", type=int,
        help="HTTP request body bytes held at once, all connections (1 GiB; more wait)",
    )  # fmt: skip
    serve.add_argument(
        "--max-connection-inflight-bytes", type=int,
        help="body bytes of unanswered requests, and answer bytes not yet read, per connection "
        "before it starts no more requests (64 MiB)",
    )  # fmt: skip
    serve.add_argument(
        "--max-unsent-answer-bytes", type=int,
        help="big answer bytes not yet read by clients, all connections (1 GiB each for HTTP "
        "and gRPC; requests that may make more wait)",
    )  # fmt: skip
    serve.add_argument("--cpus", help="auto (default), none, or a CPU list such as 0,2-3")
    serve.add_argument(
        "--busy-poll-us", type=int,
        help="after each read, poll instead of sleeping this long (0: off; lower latency for a "
        "busy core)",
    )  # fmt: skip
    serve.add_argument(
        "--cpu-dma-latency-us", type=int,
        help="while serving, keep idle CPUs able to wake within this many µs (Linux PM QoS, "
        "whole machine, needs root; 0: idle CPUs poll, the lowest latency)",
    )  # fmt: skip
    serve.add_argument(
        "--overload-utilization", type=float,
        help="refuse a share of requests early above this event-loop busy share (0.85; 0: off)",
    )  # fmt: skip
    serve.add_argument(
        "--model-control-mode", choices=["none", "explicit", "poll"], type=str.lower,
        help="none (default): load all at start; explicit: the repository API loads and "
        "unloads; poll: rescan the repository and apply changes",
    )  # fmt: skip
    serve.add_argument(
        "--repository-poll-secs", type=float, help="poll mode: seconds between rescans (5)"
    )
    serve.add_argument(
        "--repository-stable-secs", type=float,
        help="load a changed version once its files are unchanged this long (1)",
    )  # fmt: skip
    serve.add_argument(
        "--load-model", action="append", metavar="MODEL",
        help="explicit mode: load MODEL at start (repeatable; '*' for all)",
    )  # fmt: skip
    serve.add_argument(
        "--control-token",
        help="require 'Authorization: Bearer TOKEN' (gRPC metadata 'authorization') on calls "
        "that change the server: repository load/unload, trace and log settings, shared memory "
        "(16+ characters; DUETIME_CONTROL_TOKEN keeps it out of the process list)",
    )
    serve.add_argument(
        "--access-log-sample", type=float,
        help="share of successful requests logged (at info level; default 0: none)",
    )  # fmt: skip
    serve.add_argument("--max-loaded-models", type=int, help="unload idle models beyond this")
    serve.add_argument(
        "--max-loaded-bytes", type=int, help="budget of loaded model bytes (per instance)"
    )
    serve.add_argument(
        "--lazy-load", action="store_true", default=None,
        help="load each model on its first request",
    )  # fmt: skip
    serve.add_argument(
        "--strict-readiness", type=_boolean, metavar="true|false",
        help="server ready only while no model failed to load with nothing serving it "
        "(default true, as Triton)",
    )  # fmt: skip
    serve.add_argument(
        "--no-tune-runtime",
        dest="tune_runtime",
        action="store_false",
        default=None,
        help="leave the garbage collector, the GIL switch interval and the event loop thread's "
        "time slice at their defaults",
    )
    serve.add_argument(
        "--gc-threshold", type=int,
        help="gen-0 garbage collection threshold while the runtime is tuned (50000)",
    )  # fmt: skip
    serve.add_argument(
        "--switch-interval-us", type=int,
        help="GIL switch interval while the runtime is tuned (50; Python's is 5000)",
    )  # fmt: skip
    serve.add_argument(
        "--loop-slice-us", type=int,
        help="the event loop thread's time slice on Linux 6.12+ while the runtime is tuned "
        "(100; 0: the kernel's default)",
    )  # fmt: skip
    serve.add_argument(
        "--shutdown-grace-s", type=float,
        help="on SIGINT/SIGTERM, how long queued requests get to finish (5)",
    )  # fmt: skip
    serve.add_argument(
        "--unload-drain-secs", "--unload-drain-s", dest="unload_drain_secs", type=float,
        help="how long a replaced or unloaded version may take to finish its queued requests (30)",
    )  # fmt: skip
    serve.add_argument(
        "--record", metavar="FILE", type=_path, dest="record_path",
        help="capture requests and their outcomes to FILE, a new file (docs/capture-format.md)",
    )  # fmt: skip
    serve.add_argument(
        "--record-sample", type=float, metavar="SHARE",
        help="share of requests captured, 0 to 1 (default 1: all)",
    )  # fmt: skip
    serve.add_argument(
        "--record-outputs", action="store_true", default=None,
        help="capture each answer's output tensors too",
    )  # fmt: skip
    serve.add_argument(
        "--record-buffer", type=int, metavar="N",
        help="captured requests held for the writer (8192); beyond, samples are dropped",
    )  # fmt: skip
    helps = {
        "bench": "load a server (or an in-process engine) and report",
        "replay": "send a capture's requests again, on schedule",
        "report": "plot bench/replay results side by side",
        "optimize": "build fp16 and int8 variants of a model and list the faster ones",
        "capture": "traffic captures: convert JSON Lines to a capture, show a capture",
        "itch": "Nasdaq ITCH 5.0: order books, features and a model on every book event",
    }
    for name, module in TOOLS.items():
        tool = commands.add_parser(name, help=helps[name])
        if tools is None or name in tools:
            importlib.import_module(module).add_arguments(tool)
    seen: set[int] = set()
    for sub in _subcommand_parsers(parser):
        if id(sub) not in seen:  # (an alias names the same parser again)
            seen.add(id(sub))
            _add_log_flags(sub, top=False)
    return parser


def _add_grpc_transport_flags(serve: argparse.ArgumentParser) -> None:
    """Triton's gRPC keepalive and compression flags, with its names, units (ms) and defaults."""
    serve.add_argument(
        "--grpc-keepalive-time", dest="grpc_keepalive_time_ms", type=int, metavar="MS",
        help="ping a gRPC client after this long without activity (7200000: 2 hours)",
    )  # fmt: skip
    serve.add_argument(
        "--grpc-keepalive-timeout", dest="grpc_keepalive_timeout_ms", type=int, metavar="MS",
        help="close a gRPC connection whose client does not answer a ping within this (20000)",
    )  # fmt: skip
    serve.add_argument(
        "--grpc-keepalive-permit-without-calls", type=_boolean, metavar="true|false",
        help="take clients' keepalive pings on gRPC connections with no call open (false)",
    )  # fmt: skip
    serve.add_argument(
        "--grpc-http2-max-pings-without-data", type=int, metavar="N",
        help="pings the server sends while it sends no data (2; 0: no limit)",
    )  # fmt: skip
    serve.add_argument(
        "--grpc-http2-min-recv-ping-interval-without-data", type=int, metavar="MS",
        dest="grpc_http2_min_recv_ping_interval_without_data_ms",
        help="while the server sends no data, a client ping sooner than this after the last "
        "is a strike (300000: 5 minutes)",
    )  # fmt: skip
    serve.add_argument(
        "--grpc-http2-max-ping-strikes", type=int, metavar="N",
        help="strikes before a gRPC connection is closed with GOAWAY too_many_pings (2; 0: any "
        "number)",
    )  # fmt: skip
    serve.add_argument(
        "--grpc-infer-response-compression-level", choices=["none", "low", "medium", "high"],
        help="gRPC compression of answers (none)",
    )  # fmt: skip


def _path(text: str) -> Path:
    """A path given on the command line; an empty one is refused (`Path('')` is the current
    folder: `serve ''` served it, and `--record ''` said the capture file '.' exists)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty one")
    return Path(text)


def _boolean(text: str) -> bool:
    """A flag's `true` or `false` (Triton's `--strict-readiness=false`; also 1/0, yes/no)."""
    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    try:
        return value[text.strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}") from None


def _add_log_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The flags every command takes, before its name or after (`duetime serve --log-format
    json`). A subcommand's copy has no default, so it never hides a value given before it."""
    parser.add_argument(
        "--log-level", choices=LOG_LEVELS,
        default=_env_default("DUETIME_LOG_LEVEL", "warning") if top else argparse.SUPPRESS,
        help="warning (default) logs failed requests of the server's making (5xx); info adds "
        "every failed request and the sampled access log",
    )  # fmt: skip
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS,
        default=_env_default("DUETIME_LOG_FORMAT", "text") if top else argparse.SUPPRESS,
        help="text (default) or one JSON object per line, messages to stderr included",
    )  # fmt: skip


def _subcommand_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield sub
                yield from _subcommand_parsers(sub)


def _demo(args: argparse.Namespace) -> int:
    from duetime.demo import DemoFilesChanged, write_demo_repository

    if not args.path.strip():
        raise ConfigError("demo: PATH is empty; give the folder to write the repository into")
    folder = Path(args.path)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"demo: PATH {folder} is a file, not a folder")
    try:
        path = write_demo_repository(folder, on_change="overwrite" if args.force else "refuse")
    except DemoFilesChanged as exc:
        raise ConfigError(
            f"demo: {exc.message}: give --force to overwrite, or another PATH"
        ) from None
    except OSError as exc:
        console(f"duetime: demo: cannot write {folder}: {exc.strerror or exc}")
        return 1
    print(f"demo model repository written to {path}")
    return 0


def demo_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "duetime" / "demo"


def _serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    given = [*([args.repository] if args.repository is not None else []),
             *(args.model_repository or ())]  # fmt: skip
    if len(given) > 1:  # (argparse kept the last: the others' models went unserved, unsaid)
        raise ConfigError(
            "give the model repository once: as the argument or --model-repository (duetime "
            "serves one repository; Triton's several --model-repository folders would be served "
            "as their union: put the models in one folder)"
        )
    demo = args.demo or (not given and _demo_from_env())
    repository = given[0] if given else _repository_from_env(demo)
    if demo == (repository is not None):
        raise ConfigError("give a model repository folder or --demo (one of the two)")
    if demo:
        repository = _write_demo_cache()
    flags, names = _setting_flags(args, repository), _flag_names(parser)
    settings = server_settings(flags, flags=names)
    from duetime.server import Server  # (after the checks: a bad flag is told 1 s sooner)

    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        code = loop.run_until_complete(_run(Server(settings)))
    except ConfigError as exc:  # (a check at start: named by the flag or variable it came from)
        raise ConfigError(named_sources(exc.message, setting_sources(flags, flags=names))) from None
    finally:
        loop.close()
    if code == _STOPPED_LOADING:
        # NOTE: a model load under way in the loader thread cannot be interrupted (ONNX Runtime
        # builds the session in one call), and the interpreter waits for that thread at exit:
        # the stop asked for before the server was ready would wait out the load.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return code


def _write_demo_cache() -> Path:
    """The demo repository of `serve --demo`, written where missing: a file that differs from
    the demo's (a config `duetime optimize` gave variants, say) is kept, and said so once."""
    from duetime.demo import write_demo_files

    root = demo_cache_dir()
    try:
        kept = write_demo_files(root, on_change="keep")
    except OSError as exc:
        # NOTE: came through as a traceback (a HOME that is no folder, a read-only cache: a
        # user like `nobody`, a container; found by a tester)
        raise ConfigError(
            f"--demo: cannot write the demo repository to {root}: {exc.strerror or exc}; set "
            "XDG_CACHE_HOME to a folder the server may write, or write it with `duetime demo "
            "PATH` and serve PATH"
        ) from None
    if kept:
        names = ", ".join(str(file.relative_to(root)) for file in kept)
        console(
            f"duetime: demo repository {root}: kept {names} as changed there (not the demo's); "
            f"`duetime demo {root} --force` writes the demo's again",
            logging.WARNING,
        )
    return root


def _flag_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each server setting -> the `serve` flag of `parser` (`_parser`'s) that sets it, for error
    messages."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    names: dict[str, str] = {}
    for action in commands["serve"]._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest in ServerSettings.model_fields:
            names.setdefault(action.dest, longs[0])
    return names


def _repository_from_env(demo: bool) -> Path | None:
    """`DUETIME_MODEL_REPOSITORY`, as every setting has its variable (unless --demo is given)."""
    value = os.environ.get("DUETIME_MODEL_REPOSITORY")
    return None if demo or not value else Path(value)


def _demo_from_env() -> bool:
    """`DUETIME_DEMO`, `--demo`'s variable (a repository given as an argument wins over it)."""
    value = os.environ.get("DUETIME_DEMO", "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"DUETIME_DEMO: expected true or false (1 or 0), got {value!r}")


_STOPPED_LOADING = -1
"""What `_run` returns when a stop came before the server was ready (exit code 0)."""


def _unready_note(server: Server) -> str:
    """What the ready line adds when the server is not ready (`/v2/health/ready` says false):
    scripts wait for the line, so it still comes, saying why.

    NOTE: "duetime ready: ..." alone was printed while a model had failed to load and strict
    readiness held the server unready."""
    engine = server.engine
    if engine.ready:
        return ""
    failed = sorted(engine.registry.snapshot.failures)
    if failed:
        models = "model" if len(failed) == 1 else "models"
        return (
            f" (not ready: {len(failed)} {models} failed to load: {', '.join(failed)}; see the "
            "warnings above or the repository index)"
        )
    return " (not ready: no model is served)"


class _StopSignals:
    """Stops at SIGINT/SIGTERM (sets `stop`), saying so at once: the drain that follows takes
    up to the grace.

    NOTE: the server drained in silence (up to `shutdown_grace_s` and more), its only line at
    the end, none at the default log level; a second signal said nothing either (found by a
    tester)."""

    def __init__(self, stop: asyncio.Event, grace_s: float, clock: Callable[[], float]) -> None:
        self._stop, self._grace_s, self._clock = stop, grace_s, clock
        self._since = 0.0

    def received(self, sig: signal.Signals) -> None:
        if not self._stop.is_set():
            self._since = self._clock()
            console(
                f"duetime: {sig.name}: stopping; no new requests are taken, and those queued or "
                f"running get up to {self._grace_s:g} s to finish (--shutdown-grace-s)",
                logging.WARNING,
            )
            self._stop.set()
            return
        left = max(0.0, self._grace_s - (self._clock() - self._since))
        console(
            f"duetime: {sig.name}: already stopping; the requests left get at most {left:.1f} s "
            "more",
            logging.WARNING,
        )


def _setting_flags(args: argparse.Namespace, repository: Path | None) -> dict[str, Any]:
    """The server settings given as `serve` flags: each flag's dest is its setting's name."""
    flags = {name: getattr(args, name, None) for name in ServerSettings.model_fields}
    flags["model_repository"] = repository
    if args.load_model:
        flags["load_model"] = tuple(args.load_model)
    return flags


async def _run(server: Server) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = _StopSignals(stop, server.settings.shutdown_grace_s, loop.time)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signals.received, sig)
    starting = asyncio.ensure_future(server.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # (a stop while the models load: they took 20 s to finish first)
        starting.cancel()  # (the server stops what it started)
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        console("duetime: stopped before it was ready", logging.WARNING)
        return _STOPPED_LOADING
    stopping.cancel()
    addresses = starting.result()
    failures = server.engine.registry.snapshot.failures
    for name, reason in failures.items():
        console(f"duetime: model '{name}' not loaded: {reason}", logging.WARNING)
    repository = server.settings.model_repository
    if repository is not None:
        from duetime.repository.layout import no_models_warning, scan_repository

        with contextlib.suppress(ConfigError, OSError):  # (the server started: it was read)
            empty = no_models_warning(repository, scan_repository(repository))
            if empty is not None:
                console(f"duetime: {empty}", logging.WARNING)
    print(addresses.describe() + _unready_note(server), flush=True)
    await stop.wait()
    await server.stop()
    return 0
