"""A feed asking a remote server (`itch run --target`) takes each answer as it comes, while it
waits for the next message, and never has more requests out than the server is given to hold.

Both were missing: before each message the feed spun on the clock without turning the loop, so
a gRPC answer (which needs a few turns to be read and handed back) waited for the next message,
and at the full pace every event was a call of its own, thousands a second, more than a server
could take; they went unanswered. These tests look at order and counts, never at durations.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from duetime.feeds.itch import run as run_module
from duetime.feeds.itch.parser import read_messages
from duetime.feeds.itch.predictors import REMOTE_MAX_IN_FLIGHT, Answer, Failure, GrpcPredictor
from duetime.feeds.itch.run import FeedRun, RunOptions
from duetime.feeds.itch.spec import AddOrder
from duetime.feeds.itch.synth import session_bytes
from duetime.feeds.itch.tally import PredictionLog, RunStats
from tests.feeds.itch.fake_server import answer_at_once, fake_server

pytestmark = pytest.mark.timeout(60)

GAP_NS = 20_000_000
"""Recorded time between two messages: far more than a local answer takes, even on a loaded
machine (the assertions allow some to miss it anyway)."""


def _orders(count: int) -> list[AddOrder]:
    """`count` buy orders at rising prices, `GAP_NS` apart: each changes the book (an event,
    a request of its own, asked before the feed waits for the next)."""
    return [
        AddOrder("A", 1, 0, 34_200_000_000_000 + i * GAP_NS, i + 1, "B", 100, "TEST", 1_000_000 + i)
        for i in range(count)
    ]


class Watched:
    """Wraps a predictor: notes, for each request, how many messages the feed had applied
    when it asked and when the answer was taken."""

    def __init__(self, predictor: Any) -> None:
        self._predictor = predictor
        self.input = predictor.input
        self.max_batch = predictor.max_batch
        self.answered_elsewhere = predictor.answered_elsewhere
        self.max_in_flight = predictor.max_in_flight
        self.stats: RunStats | None = None
        self.taken: list[tuple[int, int]] = []

    def submit(self, array: np.ndarray, due_ns: int, answer: Answer) -> None:
        assert self.stats is not None
        stats, asked_at = self.stats, self.stats.messages

        def noted(outputs: np.ndarray | None, failure: Failure | None) -> None:
            self.taken.append((asked_at, stats.messages))
            answer(outputs, failure)

        self._predictor.submit(array, due_ns, noted)

    def warm(self, array: np.ndarray) -> None:
        self._predictor.warm(array)

    async def aclose(self) -> None:
        await self._predictor.aclose()


def test_a_remote_answer_is_taken_while_the_feed_waits_for_the_next_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At the recorded pace, the feed keeps turning the loop in the last stretch before a
    message (here the whole gap), so each answer is in before that message is applied; it
    spun there without a turn, and every answer came a message late."""
    monkeypatch.setattr(run_module, "TIMER_SLACK_NS", 10 * GAP_NS)  # (no timer sleep at all)
    orders = _orders(12)

    async def scenario() -> tuple[RunStats, Watched]:
        async with fake_server(answer_at_once) as server:
            watched = Watched(await GrpcPredictor.connect(server.target, "orderbook"))
            try:
                options = RunOptions(deadline_ns=10 * GAP_NS, pace="recorded")
                run = FeedRun(watched, options, PredictionLog(None, 3))
                watched.stats = run.stats
                return await asyncio.wait_for(run.run(orders), 30), watched
            finally:
                await watched.aclose()

    stats, watched = asyncio.run(scenario())
    assert stats.triggers == len(orders)
    assert stats.on_time == stats.triggers
    asked_before_last = [(asked, taken) for asked, taken in watched.taken if asked < len(orders)]
    assert len(asked_before_last) == len(orders) - 1
    in_the_gap = sum(taken == asked for asked, taken in asked_before_last)
    assert in_the_gap >= 3 * len(asked_before_last) // 4


def test_at_full_pace_a_remote_server_never_holds_more_than_a_few_requests() -> None:
    """Events that trigger while `REMOTE_MAX_IN_FLIGHT` requests are out wait and go together
    in the next request; every event is still asked and answered. Each event was a call of its
    own, hundreds open at once."""
    messages = list(read_messages(session_bytes(seed=3, messages=400)))
    open_calls = peak = 0

    async def held(request: Any, context: Any) -> Any:
        nonlocal open_calls, peak
        open_calls += 1
        peak = max(peak, open_calls)
        try:
            await asyncio.sleep(0.002)  # (so that calls overlap if the feed lets them)
            return await answer_at_once(request, context)
        finally:
            open_calls -= 1

    async def scenario() -> tuple[RunStats, int]:
        async with fake_server(held) as server:
            predictor = await GrpcPredictor.connect(server.target, "orderbook")
            try:
                options = RunOptions(deadline_ns=5_000_000_000, pace="max", keep_warm=False)
                run = FeedRun(predictor, options, PredictionLog(None, 3))
                stats = await asyncio.wait_for(run.run(messages), 30)
                return stats, server.calls
            finally:
                await predictor.aclose()

    stats, calls = asyncio.run(scenario())
    assert stats.triggers > 100
    assert stats.on_time == stats.triggers
    assert 1 <= peak <= REMOTE_MAX_IN_FLIGHT
    assert calls < stats.triggers  # events went together
