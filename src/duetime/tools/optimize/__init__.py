"""`duetime optimize`: build fp16 and int8 copies of a model version, measure their quality and
speed against the primary, and list the worthwhile ones as variants in the model's config.

    duetime optimize models/resnet --kinds int8-static --calibration images.npz --json out.json

Python API: `optimize(OptimizeOptions(...))` returns an `OptimizeReport`.

This module is the light surface that `duetime` builds its parser from on every start; the
heavy parts (onnx, ONNX Runtime's quantization, tomlkit) load only when a run starts. Its parts:
`options` (kinds, defaults, the options of a run), `samples` (the inputs), `build` (the variant
files), `measure` (quality, speed, verdict), `records` (the model's config), `report` (the
table and JSON), and `pipeline` (one run, start to end).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

from duetime.errors import ConfigError, DuetimeError
from duetime.observability.logs import console
from duetime.tools.optimize.measure import MAX_TIMING_ROUNDS, MIN_TIMING_ROUNDS
from duetime.tools.optimize.options import (
    DEFAULT_MEASURE_S,
    DEFAULT_SAMPLES,
    KINDS,
    Kind,
    OptimizeError,
    OptimizeOptions,
)
from duetime.tools.optimize.report import OptimizeReport, VariantResult
from duetime.tools.outputs import OutputError, check_output, strict_json, write_output


def _silent(message: str) -> None:
    pass


def optimize(options: OptimizeOptions, say: Callable[[str], None] = _silent) -> OptimizeReport:
    """Build, check and time each kind, then record the worthwhile ones in the model's config.

    Raises ConfigError for a bad path, config or calibration file, and OptimizeError when the
    primary model cannot run on the sample inputs. A kind that cannot be built is reported as
    failed in the result; its config entry (if any) is left as it was.
    """
    from duetime.tools.optimize.pipeline import optimize as run_pipeline

    return run_pipeline(options, say)


def _kinds(text: str) -> tuple[Kind, ...]:
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [k for k in chosen if k not in KINDS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"expected a comma list of {', '.join(KINDS)}; got {text!r}"
        )
    return tuple(k for k in KINDS if k in chosen)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _seconds(text: str) -> float:
    """A finite number of seconds > 0: 0, nan or inf would time nothing (or forever) and still
    rewrite config.toml on the verdicts."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `duetime optimize` flags."""
    parser.description = (
        "Build fp16 and int8 copies of a model version (model.<kind>.onnx beside model.onnx), "
        "compare their answers and speed with the primary's, and list those that are faster as "
        "variants in the model's config (best first)."
    )
    parser.add_argument("model_dir", type=Path, metavar="REPO/MODEL", help="the model folder")
    parser.add_argument(
        "--version", type=int, help="the version folder to optimize (default: the highest)"
    )
    parser.add_argument(
        "--kinds", type=_kinds, default=KINDS, help=f"comma list (default {','.join(KINDS)})"
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE.npz",
        help="one array per input, samples first: int8-static calibration and the quality "
        "sample set (default: random inputs)",
    )
    parser.add_argument(
        "--samples",
        type=_positive,
        default=DEFAULT_SAMPLES,
        help=f"samples to compare answers on (default {DEFAULT_SAMPLES})",
    )
    parser.add_argument(
        "--keep-slower",
        action="store_true",
        help="list variants that are not faster than the primary too",
    )
    parser.add_argument(
        "--measure-s",
        type=_seconds,
        default=DEFAULT_MEASURE_S,
        help=f"timing per batch size: rounds of one timed run of the model and each variant "
        f"(in random order, each after an untimed one) until "
        f"this many seconds have passed, but at least {MIN_TIMING_ROUNDS} and at most "
        f"{MAX_TIMING_ROUNDS} rounds (default {DEFAULT_MEASURE_S:g})",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the result table")


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the run as Ctrl-C does: the files half written are removed on the way out.

    NOTE: killed by SIGTERM (what `timeout`, systemd and Kubernetes send), a run left its hidden
    `.model.<kind>.onnx.*.tmp` files in the version folder and its scratch folder in /tmp (a
    copy of the model), where Ctrl-C left nothing (found by a tester)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # (not the main thread: a caller's own; it keeps its handling)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    """`duetime optimize`: 0 when done, 1 when no kind could be built or the model cannot run,
    2 for a bad path, flag, config or calibration file."""
    options = OptimizeOptions(
        model_dir=args.model_dir, version=args.version, kinds=args.kinds,
        calibration=args.calibration, samples=args.samples, keep_slower=args.keep_slower,
        measure_s=args.measure_s,
    )  # fmt: skip

    def say(message: str) -> None:
        if not args.quiet:
            console(f"duetime optimize: {message}", logging.INFO)

    try:
        check_output(args.json, "--json")  # before config.toml is rewritten
        with _terminate_as_interrupt():
            report = optimize(options, say)
    except ConfigError as exc:
        console(f"duetime optimize: {exc.message}")
        return 2
    except DuetimeError as exc:
        console(f"duetime optimize: {exc.message}")
        return 1
    print(report.format())
    if args.json is not None:
        try:
            write_output(args.json, strict_json(report.to_json()), "--json")
        except OutputError as exc:
            console(f"duetime optimize: {exc.message}")
            return 1
        say(f"wrote {args.json}")
    return 1 if all(r.status == "failed" for r in report.results) else 0


__all__ = ["KINDS", "OptimizeError", "OptimizeOptions", "OptimizeReport", "VariantResult",
           "add_arguments", "optimize", "run"]  # fmt: skip
