"""ScrapeGate: renders of /metrics one at a time, each begun after the scrapes it answers
arrived, shared by those asking the same at once, and spaced to a share of the time."""

from __future__ import annotations

import gc
import itertools
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import pytest

from duetime.observability.scrapegate import ScrapeGate


def test_a_scrape_gets_a_render_begun_after_it_came() -> None:
    gate: ScrapeGate[int] = ScrapeGate(share=1.0)
    counter = itertools.count(1)
    assert gate.fetch("k", lambda: next(counter)) == 1
    assert gate.fetch("k", lambda: next(counter)) == 2  # (never the last one again)


def test_scrapes_waiting_during_a_render_share_the_next_and_no_two_run_at_once() -> None:
    """Four scrapers asking back to back (as a tester's: they cut a client's inference rate
    by 10x): renders never overlap, and far fewer run than are asked for."""
    gate: ScrapeGate[int] = ScrapeGate(share=0.1)
    running, most, renders = 0, 0, 0
    lock = threading.Lock()

    def render() -> int:
        nonlocal running, most, renders
        with lock:
            running += 1
            renders += 1
            most = max(most, running)
        time.sleep(0.01)
        with lock:
            running -= 1
        return renders

    def scraper() -> int:
        asked, until = 0, time.monotonic() + 0.6
        while time.monotonic() < until:
            gate.fetch("k", render)
            asked += 1
        return asked

    with ThreadPoolExecutor(4) as pool:
        asked = sum(pool.map(lambda _: scraper(), range(4)))
    assert most == 1
    # a 10 ms render then waits 100 ms (share 0.1): about 6 in 0.6 s, however many ask
    assert renders <= 12 < asked


def test_a_render_began_after_the_scrape_came_even_when_one_of_its_key_is_running() -> None:
    """A scrape arriving while a render of its key runs does not take that render's answer
    (it may lack counts the scrape could have seen): it waits for the next."""
    gate: ScrapeGate[str] = ScrapeGate(share=1.0)
    first_running, release = threading.Event(), threading.Event()

    def slow() -> str:
        first_running.set()
        release.wait(10)
        return "first"

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(gate.fetch, "k", slow)
        assert first_running.wait(10)
        second = pool.submit(gate.fetch, "k", lambda: "second")
        time.sleep(0.05)
        release.set()
        assert first.result(10) == "first"
        assert second.result(10) == "second"


def test_each_key_gets_its_own_render_and_a_failed_render_raises_in_its_thread() -> None:
    gate: ScrapeGate[str] = ScrapeGate(share=1.0)

    def broken() -> str:
        raise RuntimeError("collector failed")

    with pytest.raises(RuntimeError, match="collector failed"):
        gate.fetch("a", broken)
    assert gate.fetch("a", lambda: "a again") == "a again"
    assert gate.fetch("b", lambda: "b") == "b"


def test_share_must_be_a_fraction() -> None:
    for share in (0.0, -1.0, 1.5):
        with pytest.raises(ValueError, match="share"):
            ScrapeGate(share=share)


def queued(gate: ScrapeGate[object], count: int) -> None:
    """Wait until `count` scrapes wait at `gate`."""
    deadline = time.monotonic() + 10
    while len(gate._waiting) < count:
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_scrapes_take_their_turns_in_the_order_they_came() -> None:
    """Every waiting scrape was woken at once and whichever ran first rendered: with 30
    scrapers asking different things a scrape waited 11 s (found by a tester). A render
    answers the scrapes of its key that waited for it; the others go in the order they came."""
    gate: ScrapeGate[object] = ScrapeGate(share=1.0)
    release, order = threading.Event(), []

    def render(key: str) -> object:
        if key == "first":
            release.wait(10)
        order.append(key)
        return key

    keys = ["first", "b", "c", "b", "d", "c"]
    with ThreadPoolExecutor(len(keys)) as pool:
        futures = []
        for count, key in enumerate(keys):
            futures.append(pool.submit(gate.fetch, key, lambda key=key: render(key)))
            if count == 0:
                while not gate._busy:
                    time.sleep(0.001)
            else:
                queued(gate, count)
        release.set()
        assert [future.result(10) for future in futures] == keys
    assert order == ["first", "b", "c", "d"]  # (the second b and c rode on the first's)


def test_nothing_is_kept_once_its_scrapes_have_it() -> None:
    """Each key's last render was kept for good: 400 scrapes of distinct query strings took
    11 MB of the server (found by a tester)."""
    gate: ScrapeGate[object] = ScrapeGate(share=1.0)

    class Body:
        pass

    kept = []
    for number in range(50):
        body = gate.fetch(("GET", f"nonce={number}"), Body)
        kept.append(weakref.ref(body))
        del body
    gc.collect()
    assert all(ref() is None for ref in kept)
    assert not gate._waiting


def test_scrapes_that_would_have_shared_a_failed_render_render_in_their_turn() -> None:
    gate: ScrapeGate[object] = ScrapeGate(share=1.0)
    release = threading.Event()

    def broken() -> object:
        release.wait(10)
        raise RuntimeError("collector failed")

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(gate.fetch, "k", broken)
        while not gate._busy:
            time.sleep(0.001)
        second = pool.submit(gate.fetch, "k", lambda: "second")
        queued(gate, 1)
        release.set()
        with pytest.raises(RuntimeError, match="collector failed"):
            first.result(10)
        assert second.result(10) == "second"
