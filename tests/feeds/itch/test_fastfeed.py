"""The compiled per-event path (`fastfeed.FastFeed`) against the Python one (`Books.apply`, then
`Features.update`): the same events, in the same order, with bit-for-bit the same vectors, the
same stock keys and the same anomaly counts, however the stream is cut into steps."""

from __future__ import annotations

import gzip
import random
from typing import Any

import numpy as np
import pytest
from test_fastbook import CASES, deep_flow, directory, feed, random_flow

from duetime.feeds.itch import fastfeed
from duetime.feeds.itch.book import Books
from duetime.feeds.itch.fastfeatures import new_feature_tables
from duetime.feeds.itch.fastfeed import FastFeed, load_whole
from duetime.feeds.itch.features import Features
from duetime.feeds.itch.parser import read_messages
from duetime.feeds.itch.run import stock_names
from duetime.feeds.itch.synth import session_bytes, write_session

Event = tuple[int, int, str, bytes]
"""(locate, message index, stock key, vector bytes)."""


def python_events(
    data: bytes, *, every: int = 1, top_change: bool = False, **windows: int
) -> tuple[list[Event], Books]:
    """The events that fire on the Python path, as `FeedRun` takes them."""
    books = Books()
    features = Features(deeplob_length=0, **windows)
    counts: dict[int, int] = {}
    events = []
    for index, message in enumerate(read_messages(data)):
        event = books.apply(message)
        if event is None:
            continue
        vector = features.update(event, books.book(event.locate))
        if top_change:
            fires = event.top_changed
        else:
            counts[event.locate] = counts.get(event.locate, 0) + 1
            fires = counts[event.locate] % every == 0
        if fires:
            key = books.keys.key(event.locate)
            events.append((event.locate, index, key, vector.tobytes()))
    return events, books


def fast_events(data: bytes, seed: int, **options: Any) -> tuple[list[Event], FastFeed]:
    """The same through `FastFeed`, in steps of random length and room."""
    rng = random.Random(seed)
    fast = FastFeed(np.frombuffer(data, np.uint8), **options)
    events = []
    while fast.messages < len(fast):
        stop = min(len(fast), fast.messages + rng.choice([1, 2, 7, 100, len(fast)]))
        rows = fast.step(stop, rng.choice([1, 3, 64]))
        assert fast.messages <= stop
        for locate, index, key, vector in zip(
            fast.locates.tolist(), fast.messages_of.tolist(), fast.stocks, fast.vectors,
            strict=True,
        ):  # fmt: skip
            events.append((locate, index, key, vector.tobytes()))
        assert rows == len(fast.vectors)
    return events, fast


def assert_same(data: bytes, seed: int = 0, **options: Any) -> list[Event]:
    windows = {k: options[k] for k in ("window_events", "window_ns") if k in options}
    trigger = {k: options[k] for k in ("every", "top_change") if k in options}
    want, books = python_events(data, **trigger, **windows)
    got, fast = fast_events(data, seed, **options)
    assert len(got) == len(want)
    for ours, theirs in zip(got, want, strict=True):
        assert ours == theirs, (ours[:3], theirs[:3])
    assert fast.anomalies == dict(books.anomalies.counts)
    assert fast.book_events == sum(1 for _ in _all_events(data))
    assert fast.seen() == stock_names(books)
    return got


def _all_events(data: bytes) -> Any:
    books = Books()
    return (e for e in map(books.apply, read_messages(data)) if e is not None)


@pytest.mark.parametrize("seed", range(3))
def test_synthetic_sessions(seed: int) -> None:
    assert len(assert_same(session_bytes(seed=seed, messages=20_000), seed)) > 15_000


@pytest.mark.parametrize("seed", range(3))
def test_damaged_flows_with_every_policy_case(seed: int) -> None:
    """Unknown and reused references, oversize and zero executions, zero prices, bad sides,
    market and mismatched locates, crossing adds, P trades: the anomalies are counted as the
    Python books count them, and the events of the orders' own stocks come out the same."""
    assert_same(random_flow(seed, 6000), seed)


@pytest.mark.parametrize("name", sorted(CASES))
def test_policy_cases(name: str) -> None:
    assert_same(feed(directory(1, "A"), directory(2, "B"), *CASES[name]))


def test_deep_books_and_short_windows() -> None:
    """Thousands of levels (depth read from anywhere), a 3-event window that wraps, and a 5 µs
    time window whose events expire and whose nodes are reused."""
    assert_same(deep_flow(1, 6000), 1, window_events=3, window_ns=5_000)


@pytest.mark.parametrize("trigger", [{"every": 3}, {"top_change": True}])
def test_triggers(trigger: dict[str, Any]) -> None:
    data = session_bytes(seed=5, messages=10_000)
    events = assert_same(data, 5, **trigger)
    assert 0 < len(events) < sum(1 for _ in _all_events(data))


def test_tables_grow_mid_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny starting tables: the book's and the features' grow many times within steps."""
    monkeypatch.setattr(
        fastfeed, "new_feature_tables",
        lambda **kw: new_feature_tables(**{**kw, "slots": 1, "nodes": 1}),
    )  # fmt: skip
    tables = fastfeed.new_tables
    monkeypatch.setattr(fastfeed, "new_tables", lambda *_: tables(2, 2, 1))
    assert_same(random_flow(7, 3000), 7)


def test_directory_names_follow_the_stream() -> None:
    """A locate keyed '#3' until its R message names it; two locates with one symbol."""
    data = feed(
        *CASES["fifo_and_levels"][:2], directory(1, "AAA"), directory(2, "AAA"),
        *[(letter, {**fields, "stock_locate": 2}) for letter, fields in CASES["crossed"]],
    )  # fmt: skip
    keys = [key for _, _, key, _ in assert_same(data)]
    assert keys[:2] == ["#1", "#1"]
    assert set(keys[2:]) == {"AAA@2"}


def test_recorded_targets_follow_the_clock(tmp_path: Any) -> None:
    """`targets` is `run.RecordedClock` over the whole file: gaps cut, steps back taken as 0."""
    from duetime.feeds.itch.run import RecordedClock

    path = tmp_path / "s.itch"
    write_session(path, seed=2, messages=3000, rate=500.0)
    data = load_whole(path)
    assert data is not None
    fast = FastFeed(data)
    clock = RecordedClock(2.0, 5_000_000)
    want = [clock.target_ns(m.timestamp) for m in read_messages(path)]
    got = fast.targets(2.0, 5_000_000)
    assert (got == np.array(want) - want[0]).all()


def test_load_whole_bounds_the_stream_not_the_file(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gzip file is held to the size of its stream (it was held to its own, a quarter of the
    limit, and then decompressed whole); the buffer is read-only (one compiled type)."""
    data = session_bytes(seed=1, messages=2000)
    path = tmp_path / "s.itch.gz"
    path.write_bytes(gzip.compress(data))
    loaded = load_whole(path)
    assert loaded is not None
    assert loaded.tobytes() == data
    assert not loaded.flags.writeable
    monkeypatch.setattr(fastfeed, "FAST_MAX_BYTES", len(data) - 1)
    assert load_whole(path) is None
    assert load_whole(path, whole=True) is not None
