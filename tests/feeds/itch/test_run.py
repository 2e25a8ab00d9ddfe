"""`duetime itch run`: every triggering book event asks the model; late answers are never used."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from directory import R_FIELDS

from duetime.cli import main
from duetime.demo import ORDERBOOK_FEATURES
from duetime.engine import Engine
from duetime.errors import InvalidInput
from duetime.feeds.itch.book import Books
from duetime.feeds.itch.features import FEATURE_NAMES
from duetime.feeds.itch.parser import read_messages
from duetime.feeds.itch.predictors import Answer, EnginePredictor
from duetime.feeds.itch.run import FeedRun, RecordedClock, RunOptions
from duetime.feeds.itch.spec import AddOrder
from duetime.feeds.itch.synth import write_session
from duetime.feeds.itch.tally import FeedStatistics, PredictionLog
from duetime.feeds.itch.writer import ItchWriter
from duetime.repository.manager import RepositoryOptions
from duetime.types import TensorSpec
from tests.conftest import RunningServer, demo_models

MESSAGES = 3000


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("itch") / "session.itch"
    write_session(path, seed=7, messages=MESSAGES)
    return path


@pytest.fixture(scope="module")
def book_events(session: Path) -> tuple[int, int]:
    """(book events, of which top-of-book changes) in the session, counted independently."""
    books = Books()
    events = [e for e in map(books.apply, read_messages(session)) if e is not None]
    return len(events), sum(e.top_changed for e in events)


@pytest.fixture(params=["numba", "python"])
def engine(request: pytest.FixtureRequest) -> str:
    """`itch run --engine`: the compiled per-event path or the Python one."""
    return str(request.param)


def _run(
    tmp_path: Path, session: Path, *options: str
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    report, predictions = tmp_path / "report.json", tmp_path / "predictions.csv"
    code = main(["itch", "run", str(session), "--json", str(report), "--predictions",
                 str(predictions), "-q", *options])  # fmt: skip
    assert code == 0
    with predictions.open(newline="", encoding="utf-8") as rows:
        return json.loads(report.read_text(encoding="utf-8")), list(csv.DictReader(rows))


def test_the_demo_model_takes_the_feature_vector() -> None:
    assert len(FEATURE_NAMES) == ORDERBOOK_FEATURES


def test_every_book_event_asks_and_every_answer_is_accounted_for(
    tmp_path: Path, session: Path, demo_repo: Path, book_events: tuple[int, int], engine: str
) -> None:
    report, rows = _run(tmp_path, session, "--model", "orderbook", "--engine", engine,
                        "--repository", str(demo_repo), "--pace", "max", "--deadline-us",
                        "200000")  # fmt: skip
    assert report["messages"] == MESSAGES
    assert report["book_events"] == report["triggers"] == book_events[0]
    outcomes = report["on_time"] + report["late_dropped"] + report["refused"] + report["errors"]
    assert outcomes == report["triggers"]
    assert report["errors"] == 0
    assert report["on_time"] > 0
    assert report["tick_to_prediction_us"]["p50"] > 0
    assert len(rows) == report["on_time"] + report["late_dropped"]
    used = [row for row in rows if row["on_time"] == "1"]
    assert len(used) == report["on_time"]
    assert all(row["signal"] in {"-1", "0", "1"} and row["out2"] for row in used)


def test_late_answers_are_never_used(
    tmp_path: Path, session: Path, demo_repo: Path, engine: str
) -> None:
    # 1 µs: no answer can be on time, so none may be written as used
    report, rows = _run(tmp_path, session, "--model", "orderbook", "--engine", engine,
                        "--repository", str(demo_repo), "--pace", "max", "--deadline-us",
                        "1")  # fmt: skip
    assert report["on_time"] == 0
    assert report["misses"] == report["triggers"] > 0
    assert all(row["on_time"] == "0" and row["signal"] == "" for row in rows)


def test_a_prediction_not_used_has_every_column_empty() -> None:
    """A late or unanswered request's row had 6 fields against the header's 9: a CSV reader
    gave None for the outputs. It has all of them now, empty."""
    out = io.StringIO()
    log = PredictionLog(out, 3)
    log.add(5, "AAPL", 2_000_000, None, 0)
    log.add(6, "AAPL", 1_000, np.array([0.1, 0.7, 0.2], np.float32), 1)
    log.flush()
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    unused = {"on_time": "0", "book_gaps": "0", "signal": "", "out0": "", "out1": "", "out2": ""}
    assert rows[0] == {"timestamp": "5", "stock": "AAPL", "latency_us": "2000", **unused}
    assert rows[1]["signal"] == "0"
    assert None not in rows[1].values()


def test_triggers_every_nth_event_and_on_top_changes(
    tmp_path: Path, session: Path, demo_repo: Path, book_events: tuple[int, int], engine: str
) -> None:
    common = ["--model", "orderbook", "--engine", engine, "--repository", str(demo_repo),
              "--pace", "max"]  # fmt: skip
    report, _ = _run(tmp_path, session, *common, "--on", "top-change")
    assert report["triggers"] == book_events[1]
    report, _ = _run(tmp_path, session, *common, "--every", "10")
    assert 0 < report["triggers"] <= book_events[0] // 10


def test_deeplob_model_takes_the_window(tmp_path: Path, session: Path, demo_repo: Path) -> None:
    report, rows = _run(tmp_path, session, "--model", "deeplob", "--repository", str(demo_repo),
                        "--pace", "max", "--every", "25", "--deadline-us", "500000")  # fmt: skip
    assert report["errors"] == 0
    assert report["on_time"] > 0
    assert len(rows) == report["on_time"] + report["late_dropped"]


def test_recorded_pace_follows_the_file(tmp_path: Path, demo_repo: Path, engine: str) -> None:
    path = tmp_path / "short.itch"
    write_session(path, seed=3, messages=600, rate=1000)
    flow = [m.timestamp for m in read_messages(path) if m.type in "AFECXDU"]
    assert 0.3 < (flow[-1] - flow[0]) / 1e9 < 1.0  # ~600 messages at 1,000 a second
    # the hours before the open and after the close are cut to 50 ms each
    report, _ = _run(tmp_path, path, "--model", "orderbook", "--engine", engine, "--repository",
                     str(demo_repo), "--every", "5", "--max-gap-ms", "50")  # fmt: skip
    assert report["messages"] == 600
    assert 0.3 <= report["wall_s"] < 5
    assert report["pace_lag_us"]["p50"] is not None


def test_keeping_warm_changes_no_prediction(tmp_path: Path, demo_repo: Path, engine: str) -> None:
    """The warmer runs the per-event path on a book of its own: the run's books, features,
    counts and answers are the same with it as without."""
    path = tmp_path / "sparse.itch"
    write_session(path, seed=5, messages=300, rate=2000)
    common = ["--model", "orderbook", "--engine", engine, "--repository", str(demo_repo),
              "--deadline-us", "1000000", "--max-gap-ms", "20"]  # fmt: skip
    runs = []
    for name, extra in (("warm", []), ("cold", ["--no-keep-warm"])):
        (tmp_path / name).mkdir()
        runs.append(_run(tmp_path / name, path, *common, *extra))
    (warm, warm_rows), (cold, cold_rows) = runs
    for key in ("messages", "book_events", "triggers", "on_time", "errors"):
        assert warm[key] == cold[key], key
    assert warm["on_time"] > 0

    def answers(rows: list[dict[str, str]]) -> list[list[str]]:
        return [[v for k, v in row.items() if k not in ("latency_us", "on_time")] for row in rows]

    assert answers(warm_rows) == answers(cold_rows)


def test_remote_target_over_grpc(tmp_path: Path, session: Path, server: RunningServer) -> None:
    report, rows = _run(tmp_path, session, "--model", "orderbook", "--target", server.grpc,
                        "--pace", "max", "--every", "20", "--deadline-us", "500000")  # fmt: skip
    assert report["errors"] == 0
    assert report["on_time"] > 0
    assert len(rows) == report["on_time"] + report["late_dropped"]


def test_predictions_name_stocks_as_the_book_summary_does(
    tmp_path: Path, demo_repo: Path, engine: str
) -> None:
    """A locate with an all-space symbol or none got an empty `stock`, a leading space was
    dropped, and two locates with one symbol were told apart nowhere: the keys of `itch book`
    now, and `--symbols` selects by them."""
    path = tmp_path / "keys.itch"
    with ItchWriter(path) as writer:
        for locate, symbol in ((1, " " * 8), (2, " LEAD"), (4, "DUP"), (5, "DUP")):
            writer.write("R", stock_locate=locate, timestamp=1, stock=symbol, **R_FIELDS)
        for locate in (1, 2, 3, 4, 5):
            writer.write("A", stock_locate=locate, timestamp=2, order_reference_number=locate,
                         buy_sell_indicator="B", shares=1, stock="X", price=1)  # fmt: skip
    common = ["--model", "orderbook", "--engine", engine, "--repository", str(demo_repo),
              "--pace", "max", "--deadline-us", "1000000"]  # fmt: skip
    _, rows = _run(tmp_path, path, *common)
    assert [row["stock"] for row in rows] == ["#1", " LEAD", "#3", "DUP", "DUP@5"]
    _, rows = _run(tmp_path, path, *common, "--symbols", "#3,DUP@5")
    assert [row["stock"] for row in rows] == ["#3", "DUP@5"]


def test_a_model_the_feed_cannot_feed_is_refused_clearly(
    tmp_path: Path, session: Path, demo_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["itch", "run", str(session), "--model", "resnet", "--repository", str(demo_repo)])
    assert code == 1
    err = capsys.readouterr().err
    assert "image" in err
    assert "feature vector" in err


def test_a_missing_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["itch", "run", str(tmp_path / "nope.itch"), "--model", "orderbook"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_malformed_file_is_a_clear_error_with_its_offset(
    tmp_path: Path, session: Path, demo_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.itch"
    data = session.read_bytes()
    cut = 0
    for _ in range(100):  # past the 100th frame: each is a 2-byte length, then the message
        cut += 2 + int.from_bytes(data[cut : cut + 2], "big")
    broken.write_bytes(data[:cut] + b"\x00\x05Zabcd" + data[cut:])
    argv = ["itch", "run", str(broken), "--model", "orderbook", "--repository", str(demo_repo),
            "--pace", "max", "-q"]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "unknown message type 'Z'" in err
    assert f"offset {cut}" in err
    assert main([*argv, "--on-error", "skip"]) == 0


@pytest.mark.parametrize("speed", [1.0, 4.0])
def test_recorded_clock_never_goes_back(speed: float) -> None:
    """A timestamp behind the last one is due when the last one was (at once), and the next
    ones are paced from it; a long gap is cut to max_gap. Shifting the start only on a forward
    gap once put a backward timestamp ~2**48 ns in the past: days of lateness."""
    clock = RecordedClock(speed, max_gap_ns=1000)
    stamps = [10, 2**48 - 1, 20, 30, 25, 25, 100, 2**48]
    targets = [clock.target_ns(ts) for ts in stamps]
    targets = [target - targets[0] for target in targets]
    assert targets == [int(recorded / speed) for recorded in (0, 1000, 1000, 1010, 1010, 1010,
                                                              1085, 2085)]  # fmt: skip


def _burst(count: int, first_ref: int = 1) -> list[AddOrder]:
    """`count` buy orders of one timestamp at rising prices (a sweep): each changes the book."""
    return [
        AddOrder("A", 1, 0, 34_200_000_000_000, ref, "B", 100, "TEST", 1_000_000 + ref)
        for ref in range(first_ref, first_ref + count)
    ]


class Asked:
    """A predictor that answers each request at once and keeps its rows and due time; `fits`,
    when given, is its prediction of whether a request would be answered in time."""

    def __init__(self, fits: Callable[[int, int, int], bool | None] | None = None) -> None:
        self.input = TensorSpec("features", "FP32", (len(FEATURE_NAMES),))
        self.max_batch = 64
        self.answered_elsewhere = False
        self.max_in_flight = 0
        self.asked: list[tuple[int, int]] = []
        if fits is not None:
            self.fits = fits

    def submit(self, array: np.ndarray, due_ns: int, answer: Answer) -> None:
        self.asked.append((len(array), due_ns))
        answer(np.zeros((len(array), 3), np.float32), None)

    async def aclose(self) -> None:
        return None


def test_a_burst_is_asked_for_while_its_first_event_can_still_be_answered() -> None:
    """At the recorded pace, the events of one timestamp were asked for together only once a
    batch was full (64) or the next timestamp came, bound by the first one's due time: behind a
    sweep's books and features even the first was past it, and every one was refused. The
    burst now goes as soon as one more event would leave the first too little time (here the
    predictor says 3 rows at most fit; the deadline is a minute, so none is ever due)."""
    predictor = Asked(fits=lambda now_ns, due_ns, rows: rows <= 3)
    options = RunOptions(deadline_ns=60 * 10**9, pace="recorded", keep_warm=False)
    run = FeedRun(predictor, options, PredictionLog(None, 3))
    stats = asyncio.run(run.run(_burst(20)))
    assert [rows for rows, _ in predictor.asked] == [3, 3, 3, 3, 3, 3, 2]
    assert stats.on_time == stats.triggers == 20
    assert stats.refused == stats.refused_unasked == 0


class Scripted:
    """A live feed that hands on the datagrams it was given at once, each with its own arrival
    time, then ends."""

    def __init__(self, packets: Sequence[tuple[Sequence[Any], int]]) -> None:
        self._packets = packets
        self._ended = asyncio.Event()
        self.missed = self.bad = 0

    def statistics(self) -> FeedStatistics:
        return FeedStatistics()

    def start(self, on_packet: Callable[[Sequence[Any], int], bool], on_gap: Any = None) -> None:
        for messages, arrival_ns in self._packets:
            assert on_packet(messages, arrival_ns)
        self._ended.set()

    def stop(self) -> None:
        self._ended.set()

    async def ended(self) -> None:
        await self._ended.wait()


def test_a_live_run_says_it_started_once_its_path_is_ready() -> None:
    """`run_live`'s `started` (where `itch listen` says "listening on"): after the path is
    primed and the feed taken, never before (said at the bind, ~28 ms earlier, a sender
    started on it had its first datagrams read as one backlog, most refused unasked)."""
    order: list[str] = []

    class Primed(Asked):
        async def prime(self, deadline_ns: int) -> None:
            order.append("primed")

    class Source(Scripted):
        def start(self, on_packet: Any, on_gap: Any = None) -> None:
            order.append("taken")
            super().start(on_packet, on_gap)

    run = FeedRun(Primed(), RunOptions(deadline_ns=10**9), PredictionLog(None, 3))
    source = Source([(_burst(2), time.monotonic_ns())])
    stats = asyncio.run(run.run_live(source, lambda: order.append("started")))
    assert order == ["primed", "taken", "started"]
    assert stats.on_time == 2


def test_events_due_before_they_are_asked_for_are_refused_unasked() -> None:
    """A burst whose first events were due already (here a datagram received 5 s before the
    run took it, at a deadline of 1 s) went whole, bound by their due time: the scheduler
    refused the events behind them that could still be answered. They are refused unasked now,
    and the others go by their own due time.

    (A deadline of 20 s, not 1: the burst goes whole unless it was held half the deadline, and
    a loaded CI machine once stalled the run long enough to send its events one by one.)"""
    predictor = Asked()  # (no `fits`: a burst waits at most half the deadline)
    deadline = 20 * 10**9

    async def scenario() -> Any:
        now = time.monotonic_ns()
        source = Scripted([(_burst(2), now - 5 * deadline), (_burst(3, first_ref=3), now)])
        run = FeedRun(predictor, RunOptions(deadline_ns=deadline), PredictionLog(None, 3))
        return now, await asyncio.wait_for(run.run_live(source), 30)

    now, stats = asyncio.run(scenario())
    assert predictor.asked == [(3, now + deadline)]
    assert stats.triggers == 5
    assert stats.refused == stats.refused_unasked == 2
    assert stats.on_time == 3
    assert stats.report()["refused_unasked"] == 2


def test_the_engine_predicts_whether_a_request_fits(demo_repo: Path, tmp_path: Path) -> None:
    """`EnginePredictor.fits` is the scheduler's admission test, which the feed asks while it
    gathers a burst; it follows what is served (the scheduler it asks, kept between calls, is
    resolved again once the model is unloaded: it cannot tell then, and the submit says why)."""
    repository = demo_models(demo_repo, tmp_path, "orderbook")  # (the whole demo: ~5 s more)

    async def scenario() -> tuple[bool | None, ...]:
        async with Engine(options=RepositoryOptions(control_mode="explicit")) as engine:
            await engine.load_repository(repository)
            await engine.load_model("orderbook")
            predictor = EnginePredictor(engine, "orderbook")
            now = time.monotonic_ns()
            fits = predictor.fits(now, now + 10**9, 8), predictor.fits(now, now - 1, 1)
            await engine.unload_model("orderbook")
            return (*fits, predictor.fits(now, now + 10**9, 8))

    assert asyncio.run(scenario()) == (True, False, None)


def test_an_answer_that_raises_is_not_taken_for_a_refusal(demo_repo: Path, tmp_path: Path) -> None:
    """The answer of a request the Engine ran within the call comes before the scheduler's
    books (`Engine.submit_now`'s `deliver`): an error the answer callback raises, even one of
    duetime's own, comes out of `submit` and the callback is not called again with a failure
    for a request it was answered (it was, twice, taken for a refusal)."""
    repository = demo_models(demo_repo, tmp_path, "orderbook")

    async def scenario() -> list[str]:
        calls: list[str] = []
        async with Engine(options=RepositoryOptions(control_mode="explicit")) as engine:
            await engine.load_repository(repository)
            await engine.load_model("orderbook")
            predictor = EnginePredictor(engine, "orderbook")
            row = np.zeros((1, len(FEATURE_NAMES)), np.float32)
            await asyncio.sleep(0)

            def answer(outputs: np.ndarray | None, failure: object) -> None:
                calls.append("answered" if outputs is not None else f"failed: {failure}")
                if outputs is not None:
                    raise InvalidInput("the caller's own error")

            with pytest.raises(InvalidInput, match="the caller's own error"):
                predictor.submit(row, time.monotonic_ns() + 10**9, answer)
        return calls

    assert asyncio.run(scenario()) == ["answered"]


def test_a_malformed_frame_is_in_the_report_skipped_or_stopping_the_run(
    tmp_path: Path, session: Path, demo_repo: Path
) -> None:
    """`--on-error skip` stepped over a bad frame with a line on stderr and nothing in the
    report (`bad_packets` 0, as for a clean file); `--on-error stop` wrote no report at all,
    though the messages before the frame were run and their predictions written."""
    broken = tmp_path / "broken.itch"
    data = session.read_bytes()
    cut = 0
    for _ in range(100):
        cut += 2 + int.from_bytes(data[cut : cut + 2], "big")
    broken.write_bytes(data[:cut] + b"\x00\x05Zabcd" + data[cut:])
    report, predictions = tmp_path / "report.json", tmp_path / "predictions.csv"
    argv = ["itch", "run", str(broken), "--model", "orderbook", "--repository", str(demo_repo),
            "--pace", "max", "--deadline-us", "1000000", "-q", "--json", str(report),
            "--predictions", str(predictions)]  # fmt: skip
    assert main(argv) == 1
    stopped = json.loads(report.read_text(encoding="utf-8"))
    assert stopped["messages"] == 100
    error = stopped["format_error"]
    assert (error["offset"], error["reason"]) == (cut, "unknown_type")
    assert f"byte offset {cut}" in error["message"]
    assert stopped["skipped_frames"] == 0
    with predictions.open(newline="", encoding="utf-8") as rows:
        assert len(list(csv.DictReader(rows))) == stopped["on_time"] + stopped["late_dropped"] > 0

    assert main([*argv, "--on-error", "skip"]) == 0
    skipped = json.loads(report.read_text(encoding="utf-8"))
    assert skipped["messages"] == MESSAGES
    assert skipped["skipped_frames"] == 1
    first = skipped["first_skipped"]
    assert (first["offset"], first["reason"]) == (cut, "unknown_type")
    assert "unknown message type 'Z'" in first["message"]
    assert skipped["format_error"] is None


def test_symbols_never_seen_in_the_feed_are_named_at_the_end(
    tmp_path: Path, demo_repo: Path, capsys: pytest.CaptureFixture[str], engine: str
) -> None:
    """A `--symbols` typo (APPL for AAPL) made the run a silent no-op: 0 requests, exit 0,
    nothing on stderr. A symbol the feed never keyed (no stock directory entry, no message) is
    now named on stderr and in the report; one in the directory without events is not."""
    path = tmp_path / "aapl.itch"
    with ItchWriter(path) as writer:
        writer.write("R", stock_locate=1, timestamp=1, stock="AAPL", **R_FIELDS)
        writer.write("R", stock_locate=2, timestamp=1, stock="QUIET", **R_FIELDS)
        for ref in range(1, 6):
            writer.write("A", stock_locate=1, timestamp=1 + ref, order_reference_number=ref,
                         buy_sell_indicator="B", shares=1, stock="AAPL", price=ref)  # fmt: skip
    common = ["--model", "orderbook", "--engine", engine, "--repository", str(demo_repo),
              "--pace", "max", "--deadline-us", "1000000"]  # fmt: skip
    report, rows = _run(tmp_path, path, *common, "--symbols", "APPL")
    assert (report["triggers"], rows) == (0, [])
    assert report["unknown_symbols"] == ["APPL"]
    err = capsys.readouterr().err
    assert "--symbols never seen in the feed: APPL (AAPL?)" in err, err
    report, rows = _run(tmp_path, path, *common, "--symbols", "AAPL,QUIET,ZZZ,APPL")
    assert (report["triggers"], len(rows)) == (5, 5)
    assert report["unknown_symbols"] == ["APPL", "ZZZ"]
    assert "--symbols never seen in the feed: APPL (AAPL?), ZZZ" in capsys.readouterr().err
    report, _ = _run(tmp_path, path, *common, "--symbols", "AAPL,QUIET")
    assert report["unknown_symbols"] == []
    assert "--symbols" not in capsys.readouterr().err


def test_both_engines_ask_for_the_same_events_with_the_same_answers(
    tmp_path: Path, session: Path, demo_repo: Path
) -> None:
    """The compiled per-event path (the default for this file) against the Python one: the
    same events asked for, the same predictions, in the same order."""
    runs = []
    for engine in ("numba", "python"):
        (tmp_path / engine).mkdir()
        runs.append(_run(tmp_path / engine, session, "--model", "orderbook", "--repository",
                         str(demo_repo), "--pace", "max", "--deadline-us", "1000000",
                         "--engine", engine))  # fmt: skip
    (fast, fast_rows), (slow, slow_rows) = runs
    for key in ("messages", "book_events", "triggers", "on_time", "errors", "book_anomalies"):
        assert fast[key] == slow[key], key

    def answers(rows: list[dict[str, str]]) -> list[list[str]]:
        return [[v for k, v in row.items() if k != "latency_us"] for row in rows]

    assert answers(fast_rows) == answers(slow_rows)


@pytest.mark.parametrize("engine", ["python", "numba"])
def test_the_anomalies_line_lists_kinds_as_itch_book_does(
    tmp_path: Path, demo_repo: Path, capsys: pytest.CaptureFixture[str], engine: str
) -> None:
    """The python engine listed them in the order first seen (zero_price before unknown_ref
    here), numba and `itch book` in `ANOMALY_KINDS` order (found by a tester)."""
    path = tmp_path / "anomalies.itch"
    with ItchWriter(path) as writer:
        writer.write("R", stock_locate=1, timestamp=1, stock="AAA", **R_FIELDS)
        writer.write("A", stock_locate=1, timestamp=2, order_reference_number=1,
                     buy_sell_indicator="B", shares=100, stock="AAA", price=0)  # fmt: skip
        writer.write("D", stock_locate=1, timestamp=3, order_reference_number=99)
    report, _ = _run(tmp_path, path, "--model", "orderbook", "--engine", engine,
                     "--repository", str(demo_repo), "--pace", "max")  # fmt: skip
    assert list(report["book_anomalies"]) == ["unknown_ref", "zero_price"]
    assert "book anomalies: unknown_ref=1, zero_price=1" in capsys.readouterr().err


def test_engine_numba_says_why_it_cannot_take_a_run(
    tmp_path: Path, session: Path, demo_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--engine numba` where the compiled path cannot go: a clear error, not the Python path
    taken silently (auto takes it: the malformed-file tests above run on it)."""
    common = ["--repository", str(demo_repo), "--pace", "max", "-q", "--engine", "numba"]
    assert main(["itch", "run", str(session), "--model", "deeplob", *common]) == 1
    assert "takes the DeepLOB window" in capsys.readouterr().err
    broken = tmp_path / "broken.itch"
    broken.write_bytes(session.read_bytes() + b"\x00\x05Zabcd")
    assert main(["itch", "run", str(broken), "--model", "orderbook", *common]) == 1
    err = capsys.readouterr().err
    assert "--engine numba" in err, err
    assert "unknown message type 'Z'" in err, err


def _sweep_bytes(count: int) -> np.ndarray:
    """`_burst(count)` as a stream (one timestamp: the compiled path takes it in one step)."""
    out = io.BytesIO()
    with ItchWriter(out) as writer:
        for order in _burst(count):
            writer.write("A", stock_locate=1, timestamp=order.timestamp, stock="TEST",
                         order_reference_number=order.order_reference_number,
                         buy_sell_indicator="B", shares=100, price=order.price)  # fmt: skip
    return np.frombuffer(out.getvalue(), np.uint8)


def test_a_step_goes_as_the_largest_batches_that_fit() -> None:
    """The compiled path asks for a step's events at once; where the predictor says the whole
    batch cannot be answered in time (here: more than 3 rows), it went whole and the scheduler
    refused all of it. The step goes as the largest batches that fit now, one after another."""
    from duetime.feeds.itch.fastfeed import FastFeed

    predictor = Asked(fits=lambda now_ns, due_ns, rows: rows <= 3)
    options = RunOptions(deadline_ns=60 * 10**9, pace="recorded", keep_warm=False)
    run = FeedRun(predictor, options, PredictionLog(None, 3))
    stats = asyncio.run(run.run_fast(FastFeed(_sweep_bytes(20))))
    assert [rows for rows, _ in predictor.asked] == [3, 3, 3, 3, 3, 3, 2]
    assert stats.on_time == stats.triggers == 20
    assert stats.refused == 0


def test_events_predicted_hopeless_are_still_asked_for_together() -> None:
    """Events the predictor says cannot be answered in time even alone go together in one
    request, for the scheduler to refuse (or to admit: a probe, a FIFO model): refused unasked,
    they would never let the scheduler correct a prediction."""
    from duetime.feeds.itch.fastfeed import FastFeed

    predictor = Asked(fits=lambda now_ns, due_ns, rows: False)
    options = RunOptions(deadline_ns=60 * 10**9, pace="recorded", keep_warm=False)
    run = FeedRun(predictor, options, PredictionLog(None, 3))
    stats = asyncio.run(run.run_fast(FastFeed(_sweep_bytes(5))))
    assert [rows for rows, _ in predictor.asked] == [5]
    assert stats.triggers == stats.on_time == 5
    assert stats.refused_unasked == 0


def test_a_burst_split_in_many_batches_answered_at_once_does_not_recurse() -> None:
    """Each batch of a split burst answered within its ask flushed the rest from the answer
    callback, one nested call a batch: a RecursionError past ~200 batches."""
    from duetime.feeds.itch.fastfeed import FastFeed

    predictor = Asked(fits=lambda now_ns, due_ns, rows: rows <= 1)
    predictor.max_batch = 1000
    options = RunOptions(deadline_ns=60 * 10**9, pace="recorded", keep_warm=False)
    run = FeedRun(predictor, options, PredictionLog(None, 3))
    stats = asyncio.run(run.run_fast(FastFeed(_sweep_bytes(1000), rows=1000)))
    assert [rows for rows, _ in predictor.asked] == [1] * 1000
    assert stats.on_time == 1000


def test_a_burst_s_fit_is_tested_as_of_its_admission() -> None:
    """The fit of a burst's batch is tested as of when its request will be admitted (the
    predictor's `lead_ns` and the feed's own time to make the batch), not when the test
    starts: tested at once, 64-row batches found to fit with ~100 µs left were refused whole
    10-30 µs later, and events due in between were sent (expired unrun) instead of refused
    unasked."""
    from duetime.feeds.itch.fastfeed import FastFeed

    tested: list[int] = []

    def fits(now_ns: int, due_ns: int, rows: int) -> bool:
        tested.append(now_ns - time.monotonic_ns())
        return True

    predictor = Asked(fits=fits)
    predictor.lead_ns = 5 * 10**9  # type: ignore[attr-defined]
    options = RunOptions(deadline_ns=60 * 10**9, pace="recorded", keep_warm=False)
    run = FeedRun(predictor, options, PredictionLog(None, 3))
    stats = asyncio.run(run.run_fast(FastFeed(_sweep_bytes(20))))
    assert tested
    assert all(ahead > 4 * 10**9 for ahead in tested)
    assert stats.on_time == stats.triggers == 20
    # never further ahead than a quarter of the deadline: an event just applied is never due
    tested.clear()
    predictor = Asked(fits=fits)
    predictor.lead_ns = 120 * 10**9  # type: ignore[attr-defined]
    run = FeedRun(predictor, options, PredictionLog(None, 3))
    stats = asyncio.run(run.run_fast(FastFeed(_sweep_bytes(20))))
    assert tested
    assert all(14 * 10**9 < ahead <= 15 * 10**9 for ahead in tested)
    assert stats.on_time == stats.triggers == 20


def test_one_stall_between_a_fit_test_and_its_ask_does_not_refuse_what_follows() -> None:
    """The feed's part of the lead (fit test to ask) is its usual time, not its longest: one
    stall there (a slow fit test, the CPU taken away) made it longer than the deadline, every
    burst after it was taken for due by its admission and refused unasked, and nothing asked
    ever taught it otherwise (a live run refused 4,352-4,738 of 4,827 events)."""
    from duetime.feeds.itch.fastfeed import FastFeed, compile_step

    compile_step()  # (as `itch run` does before a run: the first step is not the JIT's)
    stalled: list[bool] = []

    def fits(now_ns: int, due_ns: int, rows: int) -> bool:
        if not stalled:
            stalled.append(True)
            time.sleep(0.1)  # (five deadlines)
        return True

    out = io.BytesIO()
    with ItchWriter(out) as writer:  # a sweep of 5, then 5 pairs 150 ms on (after the stall)
        stamps = [0] * 5 + [150_000_000 + k * 10_000_000 for k in range(5) for _ in range(2)]
        for ref, stamp in enumerate(stamps, 1):
            writer.write("A", stock_locate=1, timestamp=34_200_000_000_000 + stamp,
                         stock="TEST", order_reference_number=ref, buy_sell_indicator="B",
                         shares=100, price=1_000_000 + ref)  # fmt: skip
    predictor = Asked(fits=fits)
    options = RunOptions(deadline_ns=20_000_000, pace="recorded", keep_warm=False)
    run = FeedRun(predictor, options, PredictionLog(None, 3))
    stats = asyncio.run(run.run_fast(FastFeed(np.frombuffer(out.getvalue(), np.uint8))))
    assert stalled
    assert stats.triggers == 15
    asked = [rows for rows, _ in predictor.asked]
    # (every event asked: pairs 10 ms apart may go as one batch where the machine is slow: CI's
    # read [5, 2, 4, 2, 2] once)
    assert asked[0] == 5
    assert sum(asked) == 15
    assert stats.refused_unasked == 0


def test_a_lone_event_due_already_is_refused_unasked_on_the_compiled_path() -> None:
    """A step of one event (`_ask_alone`, nearly every step) whose due time passed before it
    could be asked for is refused unasked and counted so, as a burst's are; the rest go on."""
    from duetime.feeds.itch.fastfeed import FastFeed

    predictor = Asked()
    options = RunOptions(deadline_ns=1, pace="max", keep_warm=False)
    run = FeedRun(predictor, options, PredictionLog(None, 3))
    stats = asyncio.run(run.run_fast(FastFeed(_sweep_bytes(4))))
    assert predictor.asked == []
    assert stats.triggers == stats.refused == stats.refused_unasked == 4
    assert stats.on_time == stats.errors == 0


def test_the_predictor_is_primed_before_the_clock_starts() -> None:
    """A run's first event took its request path cold (580-1,600 µs against ~100 next): the
    predictor is now primed (`prime`, the run's deadline) before the first message is taken."""
    from duetime.feeds.itch.fastfeed import FastFeed

    calls: list[object] = []

    class Primed(Asked):
        async def prime(self, deadline_ns: int) -> None:
            calls.append(deadline_ns)

        def submit(self, array: np.ndarray, due_ns: int, answer: Answer) -> None:
            calls.append(len(array))
            super().submit(array, due_ns, answer)

    options = RunOptions(deadline_ns=777_000, pace="max", keep_warm=False)
    run = FeedRun(Primed(), options, PredictionLog(None, 3))
    asyncio.run(run.run_fast(FastFeed(_sweep_bytes(2))))
    assert calls == [777_000, 1, 1]


def test_the_report_says_which_books_ran_and_refuses_a_negative_gap(
    tmp_path: Path, session: Path, demo_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--model", "orderbook", "--repository", str(demo_repo), "--pace", "max",
              "--limit", "200", "--deadline-us", "1000000"]  # fmt: skip
    for engine in ("numba", "python"):
        report, _ = _run(tmp_path, session, *common, "--engine", engine)
        assert report["engine"] == engine
    with pytest.raises(SystemExit) as exited:
        main(["itch", "run", str(session), *common, "--max-gap-ms", "-1"])
    assert exited.value.code == 2
    assert "--max-gap-ms: expected a finite number >= 0" in capsys.readouterr().err
