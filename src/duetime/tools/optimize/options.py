"""What a run of `duetime optimize` is asked to do: the kinds it builds, their file names, the
defaults, `OptimizeOptions`, and `OptimizeError`. Light: the CLI surface imports it."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from duetime.errors import DuetimeError

Kind = Literal["fp16", "int8-dynamic", "int8-static"]
KINDS: tuple[Kind, ...] = ("fp16", "int8-dynamic", "int8-static")
DEFAULT_SAMPLES = 256
DEFAULT_MEASURE_S = 2.0
"""Seconds spent timing each batch size, shared in rounds by the primary and its variants."""


class OptimizeError(DuetimeError):
    """The model cannot be optimized as asked (its primary cannot run on the sample inputs, or
    takes no inputs to sample)."""


@dataclass(frozen=True)
class OptimizeOptions:
    model_dir: Path
    version: int | None = None
    kinds: tuple[Kind, ...] = KINDS
    calibration: Path | None = None
    samples: int = DEFAULT_SAMPLES
    keep_slower: bool = False
    measure_s: float = DEFAULT_MEASURE_S


def file_of(kind: Kind) -> str:
    """The variant file of `kind`, beside the version's model.onnx."""
    return f"model.{kind}.onnx"


REASON_CHARS = 300
"""The most of a message's first line `reason_of` gives: all of ONNX Runtime's (its error,
the node, then the cause)."""


def reason_of(exc: BaseException) -> str:
    """One line for a table cell: the exception's type and the first line of its message, or,
    for one with no message (a bare `assert` in a converter), where it was raised."""
    text = (exc.message if isinstance(exc, DuetimeError) else str(exc)).strip().splitlines()
    first = text[0] if text else ""
    if not first:
        return f"{type(exc).__name__} at {raised_at(exc)}"
    return f"{type(exc).__name__}: {_clipped(first, REASON_CHARS)}"


def _clipped(line: str, limit: int) -> str:
    """`line`, or as many of its words as fit in `limit` characters with "..." after them.

    NOTE: cut at 200 characters as it came, ONNX Runtime's error for a Gather's index out of
    range ended "must be within the inclusive ra" (found by a tester)."""
    if len(line) <= limit:
        return line
    head = line[: limit - 2]  # (one more than fits: a space there ends a whole word)
    words = head.rsplit(" ", 1)[0] if " " in head else head[:-1]
    return words.rstrip() + "..."


def raised_at(exc: BaseException) -> str:
    """The file name and line of the frame that raised `exc` ("shape_inference.py:312"), or
    "an unknown place" when it has no traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}"
