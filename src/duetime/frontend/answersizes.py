"""LargestAnswers: the largest answer each model made, by which the front ends bound the answers
they hold unsent (HTTP's `Intake`, gRPC's `AnswerBudget`)."""

from __future__ import annotations

MAX_MODELS = 1024
"""Models whose largest answer is kept; all are forgotten when full (a client naming models
that do not exist cannot grow it)."""


class LargestAnswers:
    """Model name -> the largest answer it made (bytes, as each front end counts them)."""

    __slots__ = ("_sizes",)

    def __init__(self) -> None:
        self._sizes: dict[str, int] = {}

    def get(self, model: str) -> int | None:
        """The largest answer `model` made (None: none yet, or forgotten)."""
        return self._sizes.get(model)

    def learned(self, model: str, size: int) -> None:
        """`model` made an answer of `size` bytes."""
        sizes = self._sizes
        if size > sizes.get(model, -1):
            if len(sizes) >= MAX_MODELS:
                sizes.clear()
            sizes[model] = size
