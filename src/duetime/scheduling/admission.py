"""Admission: can a new request still finish by its due time, given the work ahead of it? Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request was refused at arrival; `late` when its due time had already passed."""

    predicted_finish_ns: int
    due_ns: int
    late: bool


def predict_finish(
    *,
    now_ns: int,
    rows: int,
    rows_ahead: int,
    busy_until_ns: Sequence[int],
    per_row_ns: float,
    exec_ns: int,
) -> int:
    """When a request of `rows` would finish: the first instance frees up, the rows ahead of it
    run at the saturated per-row cost spread over the instances, then its own batch runs."""
    instances = len(busy_until_ns)
    first_free = max(now_ns, min(busy_until_ns))
    backlog_ns = int(rows_ahead * per_row_ns / instances)
    return first_free + backlog_ns + exec_ns


def admit(*, now_ns: int, due_ns: int | None, predicted_finish_ns: int) -> Rejection | None:
    """None to admit; a Rejection when the due time has passed or cannot be met."""
    if due_ns is None:
        return None
    if due_ns <= now_ns:
        return Rejection(predicted_finish_ns, due_ns, late=True)
    if predicted_finish_ns > due_ns:
        return Rejection(predicted_finish_ns, due_ns, late=False)
    return None
