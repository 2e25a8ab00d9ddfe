"""ScrapeGate: renders of /metrics one at a time, each begun after the scrapes it answers
arrived, shared by those asking the same at once, and spaced to a share of the time."""

from __future__ import annotations

import itertools
import threading
import time
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
