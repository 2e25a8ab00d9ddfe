"""argparse types for numbers with bounds: a value out of them (or NaN, or an infinity) is refused
as argparse refuses a bad choice, naming the flag and what it takes, with exit status 2.

NOTE: `type=float` takes 'nan' and 'inf', which a check like `speed <= 0` lets through: `itch run
--speed nan` refused every request and exited 0, `--deadline-us inf` and `--idle-s nan` ended
in a traceback from `int()` (found by a tester).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def real(
    *, above: float | None = None, at_least: float | None = None, at_most: float | None = None
) -> Callable[[str], float]:
    """A finite number within the bounds given."""
    wanted = _wanted("a finite number", above, at_least, at_most)

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not _within(value, above, at_least, at_most):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    return parse


def whole(*, at_least: int | None = None, at_most: int | None = None) -> Callable[[str], int]:
    """A whole number within the bounds given."""
    wanted = _wanted("a whole number", None, at_least, at_most)

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if not _within(value, None, at_least, at_most):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    return parse


def _within(
    value: float, above: float | None, at_least: float | None, at_most: float | None
) -> bool:
    return (
        (above is None or value > above)
        and (at_least is None or value >= at_least)
        and (at_most is None or value <= at_most)
    )


def _wanted(kind: str, above: float | None, at_least: float | None, at_most: float | None) -> str:
    bounds = [f"> {_shown(above)}"] if above is not None else []
    if at_least is not None:
        bounds.append(f">= {_shown(at_least)}")
    if at_most is not None:
        bounds.append(f"<= {_shown(at_most)}")
    return f"{kind} {' and '.join(bounds)}" if bounds else kind


def _shown(bound: float) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"
