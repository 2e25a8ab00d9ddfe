"""Router._compare: how a shadow version's answer is compared with the answering version's."""

from __future__ import annotations

import asyncio
import json
import math

import numpy as np

from duetime.execution.executor import Feeds
from duetime.routing.router import ShadowStatistics, _compare


def compared(answer: Feeds, copy: Feeds) -> ShadowStatistics:
    """The statistics after comparing one shadow `copy` with the `answer`."""

    async def body() -> ShadowStatistics:
        loop = asyncio.get_running_loop()
        first: asyncio.Future[Feeds] = loop.create_future()
        second: asyncio.Future[Feeds] = loop.create_future()
        first.set_result(answer)
        second.set_result(copy)
        stats = ShadowStatistics()
        _compare(first, second, stats)
        return stats

    return asyncio.run(body())


ANSWER = {"y": np.array([[101.0, 102.0, 103.0, 104.0]], np.float32)}


def test_numbers_that_differ_give_their_largest_difference() -> None:
    stats = compared(ANSWER, {"y": np.array([[106.0, 107.0, 108.0, 104.5]], np.float32)})
    assert (stats.compared, stats.max_abs_diff, stats.argmax_disagreements) == (1, 5.0, 1)


def test_a_nan_in_the_shadow_is_an_infinite_difference_and_a_disagreement() -> None:
    """Probe repro_shadow_nan: a shadow answering [106, 107, 108, NaN] for [101, ..., 104]
    showed max_abs_diff 0.0 and no disagreement: max(0.0, nan) is 0.0, and np.argmax takes
    the NaN for the largest, as the answer's largest is there too."""
    nan = {"y": np.array([[106.0, 107.0, 108.0, np.nan]], np.float32)}
    stats = compared(ANSWER, nan)
    assert (stats.compared, stats.max_abs_diff, stats.argmax_disagreements) == (1, math.inf, 1)
    shown = json.loads(json.dumps(stats.as_json()))
    assert (shown["max_abs_diff"], shown["mean_max_abs_diff"]) == ("inf", "inf")


def test_an_infinity_on_both_sides_differs_too() -> None:
    inf = {"y": np.array([[1.0, np.inf]], np.float32)}
    stats = compared(inf, inf)
    assert (stats.max_abs_diff, stats.argmax_disagreements) == (math.inf, 1)


def test_equal_answers_agree() -> None:
    stats = compared(ANSWER, ANSWER)
    assert (stats.compared, stats.max_abs_diff, stats.argmax_disagreements) == (1, 0.0, 0)
    assert stats.as_json()["max_abs_diff"] == 0.0
