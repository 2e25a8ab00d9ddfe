"""Admission: the predicted finish of a new request, and late vs unmeetable vs admitted."""

from __future__ import annotations

import pytest

from duetime.scheduling.admission import Rejection, admit, predict_finish


@pytest.mark.parametrize(
    ("busy_until", "rows_ahead", "expected"),
    [
        ([0], 0, 1000 + 300),  # idle instance, empty queue: now + its own run
        ([0, 0], 0, 1000 + 300),
        ([5000], 0, 5000 + 300),  # waits for the instance to free up
        ([5000, 2000], 0, 2000 + 300),  # the first instance to free up
        ([500], 0, 1000 + 300),  # an instance already past its estimate counts as free now
        ([0], 4, 1000 + 4 * 100 + 300),  # the rows ahead at the per-row cost
        ([0, 0], 4, 1000 + 4 * 100 // 2 + 300),  # ... spread over the instances
        ([3000, 4000, 9000], 6, 3000 + 6 * 100 // 3 + 300),
    ],
)
def test_predict_finish(busy_until: list[int], rows_ahead: int, expected: int) -> None:
    finish = predict_finish(
        now_ns=1000,
        rows=2,
        rows_ahead=rows_ahead,
        busy_until_ns=busy_until,
        per_row_ns=100.0,
        exec_ns=300,
    )
    assert finish == expected


def test_predict_finish_grows_with_the_backlog() -> None:
    finishes = [
        predict_finish(
            now_ns=0, rows=1, rows_ahead=ahead, busy_until_ns=[0, 0], per_row_ns=33.3, exec_ns=50
        )
        for ahead in range(50)
    ]
    assert finishes == sorted(finishes)


@pytest.mark.parametrize(
    ("due", "finish", "expected"),
    [
        (None, 10**12, None),  # no due time: always admitted
        (1000, 1000, Rejection(1000, 1000, late=True)),  # due now: already late
        (999, 1200, Rejection(1200, 999, late=True)),
        (1500, 1501, Rejection(1501, 1500, late=False)),  # cannot be met
        (1500, 1500, None),  # just in time
        (1500, 1100, None),
    ],
)
def test_admit(due: int | None, finish: int, expected: Rejection | None) -> None:
    assert admit(now_ns=1000, due_ns=due, predicted_finish_ns=finish) == expected
