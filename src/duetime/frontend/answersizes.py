"""LargestAnswers: the largest answer each model made, by which the front ends bound the answers
they hold unsent (HTTP's `Intake`, gRPC's `AnswerBudget`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (not at run time: that module imports onnx)
    from duetime.repository.outputsizes import OutputSize, OutputSizes

log = logging.getLogger("duetime.answers")

WINDOW = 64
"""Answers after which a model's largest is forgotten (see `LargestAnswers`)."""

MAX_MODELS = 1024
"""Models whose largest answer is kept; all are forgotten when full (a client naming models
that do not exist cannot grow it)."""


class LargestAnswers:
    """Model name -> the largest answer it made lately (bytes, as each front end counts them):
    over its last `WINDOW` to 2 * `WINDOW` answers.

    NOTE: the largest ever made, one client's batch of 1,000 rows (4 MB) had every later batch-1
    request of the model count 4 MB, for the server's life: under an 8 MiB bound two or three
    ran at once, 200 requests a second against 3,100 (a tester's). A model whose big answers
    keep coming keeps its size."""

    __slots__ = ("_sizes",)

    def __init__(self) -> None:
        self._sizes: dict[str, list[int]] = {}
        """Model -> [the largest of the window before, the largest of this one, its answers]."""

    def get(self, model: str) -> int | None:
        """The largest answer `model` made lately (None: none yet, or forgotten)."""
        window = self._sizes.get(model)
        return None if window is None else max(window[0], window[1])

    def expected(self, model: str, guess: Callable[[str], int | None] | None, unknown: int) -> int:
        """What `model`'s next answer is expected to weigh: the largest it made lately; before
        any, `guess(model)` (what its samples made at load: `Engine.answer_guess`); `unknown`
        where that guess is None (its outputs' sizes follow its inputs' values, or it is not
        known). With no `guess` at all: what it made, else `unknown`.

        NOTE: what it made stood for a model whose outputs follow its values too: after one
        small answer (a Tile by 1), 40 new connections asking at once for 8 MB answers all ran
        under an 8 MiB bound (a tester's)."""
        learned = self.get(model)
        if guess is not None:
            guessed = guess(model)
            if guessed is None:
                return unknown
            if learned is None or guessed == 0:
                # (0: the model is not served, its requests are refused: what it made before
                # an unload does not count; a tester's calls waited for room for it, then
                # were told it was not found)
                return guessed
        return unknown if learned is None else learned

    def learned(self, model: str, size: int) -> None:
        """`model` made an answer of `size` bytes."""
        sizes = self._sizes
        window = sizes.get(model)
        if window is None:
            if len(sizes) >= MAX_MODELS:
                sizes.clear()
            sizes[model] = [0, size, 1]
            return
        if size > window[1]:
            window[1] = size
        window[2] += 1
        if window[2] >= WINDOW:
            window[0], window[1], window[2] = window[1], 0, 0


def shaped_bytes(
    sizes: tuple[OutputSizes, ...],
    shapes: Mapping[str, Sequence[int]],
    wanted: Collection[str] = (),
    weigh: Callable[[OutputSize, int], int] | None = None,
) -> int | None:
    """The most bytes any of `sizes` (a model's versions' and variants': a request may go to
    any) gives for an answer to inputs of `shapes` with the `wanted` outputs (empty: all; see
    `OutputSizes.bytes_for`); None where one gives none or is no longer trusted."""
    most = 0
    for each in sizes:
        made = each.bytes_for(shapes, wanted, weigh) if each.trusted else None
        if made is None:
            return None
        most = max(most, made)
    return most


def distrust(sizes: tuple[OutputSizes, ...], model: str, made: int, said: int) -> None:
    """`model` made an answer of `made` bytes where its graph's shapes (`sizes`) said `said`:
    a shape inference ONNX Runtime does not share, so no request's shapes are believed from now
    on (its answers count as the most one may weigh until it is reloaded)."""
    if made <= said or not any(each.trusted for each in sizes):
        return
    for each in sizes:
        each.trusted = False
    log.warning(
        "model '%s' made an answer of %d bytes where its graph's shapes said %d: its answers "
        "now count as the largest one may weigh until it is reloaded", model, made, said,
    )  # fmt: skip
