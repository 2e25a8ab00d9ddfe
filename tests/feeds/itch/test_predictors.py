"""Where the feed's requests go: a remote v2 server over gRPC that stalls or goes away must
never hold the run or pass for an answer; the run's wait for the last answers is bounded."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from duetime.cli import main
from duetime.feeds.itch import run as run_module
from duetime.feeds.itch.parser import read_messages
from duetime.feeds.itch.predictors import Answer, GrpcPredictor
from duetime.feeds.itch.run import FeedRun, RunOptions
from duetime.feeds.itch.synth import session_bytes
from duetime.feeds.itch.tally import PredictionLog, RunStats
from tests.feeds.itch.fake_server import (
    fake_server,
    fake_server_in_thread,
    never_answer,
    unavailable,
)

pytestmark = pytest.mark.timeout(60)

MESSAGES = list(read_messages(session_bytes(seed=3, messages=400)))


def _rows(out: io.StringIO) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(out.getvalue())))


def test_a_server_that_stops_answering_cannot_hold_the_run() -> None:
    """Each call's gRPC deadline is its due time plus a grace: a stalled server's requests end
    as unanswered (counted late, never used) instead of being waited for forever."""
    out = io.StringIO()

    async def scenario() -> RunStats:
        async with fake_server(never_answer) as server:
            predictor = await GrpcPredictor.connect(server.target, "orderbook")
            try:
                options = RunOptions(deadline_ns=20_000_000, pace="max", keep_warm=False)
                run = FeedRun(predictor, options, PredictionLog(out, 3))
                return await asyncio.wait_for(run.run(MESSAGES), 10)
            finally:
                await predictor.aclose()

    stats = asyncio.run(scenario())
    assert stats.triggers > 0
    assert stats.on_time == stats.errors == 0
    assert stats.unanswered == stats.late > 0
    # the events held back behind the stalled calls were due before they could be asked for
    assert stats.refused == stats.refused_unasked
    assert stats.unanswered + stats.refused_unasked == stats.triggers
    rows = _rows(out)
    assert len(rows) == stats.unanswered
    assert all(row["on_time"] == "0" and row["signal"] == "" for row in rows)


class Silent:
    """A predictor that takes requests and never answers them."""

    def __init__(self) -> None:
        self.input = type("Spec", (), {"name": "features", "shape": (21,)})()
        self.max_batch = 8
        self.answered_elsewhere = False
        self.max_in_flight = 0
        self.answers: list[Answer] = []

    def submit(self, array: np.ndarray, due_ns: int, answer: Answer) -> None:
        self.answers.append(answer)

    async def aclose(self) -> None:
        return None


def test_the_wait_for_the_last_answers_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the predictor, the run stops waiting a while after the last due time; what is
    still owed is unanswered, and an answer that comes after that is not used."""
    monkeypatch.setattr(run_module, "DRAIN_AFTER_DUE_NS", 50_000_000)
    predictor = Silent()

    async def scenario() -> tuple[RunStats, dict[str, Any]]:
        # (a deadline no event's books and features take: one due before it is asked for is
        # refused unasked, never sent)
        options = RunOptions(deadline_ns=20_000_000, pace="max", keep_warm=False)
        run = FeedRun(predictor, options, PredictionLog(None, 3))
        stats = await asyncio.wait_for(run.run(MESSAGES), 10)
        before = stats.report()
        for answer in predictor.answers:  # too late: dropped, not counted
            answer(np.zeros((8, 3), np.float32), None)
        return stats, before

    stats, before = asyncio.run(scenario())
    assert stats.triggers > 0
    assert stats.unanswered == stats.late == stats.triggers
    assert stats.on_time == 0
    assert stats.report()["on_time"] == before["on_time"] == 0


async def _remote_run(infer: Any, **server: Any) -> RunStats:
    async with fake_server(infer, **server) as fake:
        predictor = await GrpcPredictor.connect(fake.target, "orderbook")
        try:
            options = RunOptions(deadline_ns=500_000_000, pace="max", keep_warm=False)
            run = FeedRun(predictor, options, PredictionLog(None, 3))
            return await asyncio.wait_for(run.run(MESSAGES), 20)
        finally:
            await predictor.aclose()


def test_a_server_that_goes_away_is_an_error_not_a_refusal() -> None:
    """Its requests fail UNAVAILABLE with no connection behind them: errors, the first one
    reported (they were counted as refused, as if the server had turned them away)."""
    from tests.feeds.itch.fake_server import answer_at_once

    stats = asyncio.run(_remote_run(answer_at_once, stop_after=5))
    assert stats.on_time >= 1
    assert stats.errors > 0
    assert stats.refused == 0
    assert stats.first_error is not None
    assert "went away" in stats.first_error


def test_a_server_that_turns_requests_away_refuses_them() -> None:
    """UNAVAILABLE from a server that is there (a model loading) stays a refusal."""
    stats = asyncio.run(_remote_run(unavailable))
    assert stats.refused == stats.triggers > 0
    assert stats.errors == 0


def test_run_fails_when_its_target_goes_away(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = tmp_path / "session.itch"
    session.write_bytes(session_bytes(seed=3, messages=400))
    report = tmp_path / "report.json"
    with fake_server_in_thread(stop_after=3) as fake:
        code = main(["itch", "run", str(session), "--model", "orderbook", "--target",
                     fake.target, "--pace", "max", "--deadline-us", "500000", "--json",
                     str(report)])  # fmt: skip
    assert code == 1
    result = json.loads(report.read_text(encoding="utf-8"))
    assert result["errors"] > 0
    assert result["refused"] == 0
    assert "went away" in result["first_error"]
    assert f"(the server at {fake.target} went away)" in capsys.readouterr().out
