"""Turns: batches of instance threads sharing a CPU run one at a time, in hand-off order."""

from __future__ import annotations

import threading
import time

from duetime.execution import turns as turns_module
from duetime.execution.turns import Turns


def test_batches_run_in_ticket_order_whatever_order_threads_arrive_in() -> None:
    turns = Turns()
    tickets = [turns.take() for _ in range(4)]
    ran: list[int] = []
    running = threading.Semaphore(1)  # fails the test if two run at once

    def batch(ticket: int) -> None:
        turns.wait(ticket)
        assert running.acquire(blocking=False), "two batches ran at once"
        ran.append(ticket)
        time.sleep(0.005)
        running.release()
        turns.done(ticket)

    threads = [threading.Thread(target=batch, args=(t,)) for t in reversed(tickets)]
    for thread in threads:
        thread.start()
        time.sleep(0.01)  # the later tickets are waiting before the first arrives
    for thread in threads:
        thread.join(5)
    assert ran == tickets


def test_a_turn_never_passed_on_is_skipped_after_a_while(monkeypatch: object) -> None:
    monkeypatch.setattr(turns_module, "STUCK_S", 0.05)  # type: ignore[attr-defined]
    turns = Turns()
    lost, waiting = turns.take(), turns.take()  # `lost`'s batch never runs
    started = time.perf_counter()
    turns.wait(waiting)
    assert 0.04 < time.perf_counter() - started < 2
    turns.done(waiting)
    assert lost == 0
    turns.wait(turns.take())  # the turns go on from there at once


def test_a_run_past_what_it_was_given_has_the_next_batch_run_beside_it() -> None:
    """NOTE: a run held its CPU's turn for as long as it took (up to `STUCK_S`): a value-driven
    Loop held it a second, and the requests of the models beside it expired unrun (found by a
    tester). Past its hold, the next batch goes on beside it; the one after waits its turn."""
    turns = Turns()
    long, next_, after = turns.take(hold_s=0.05), turns.take(hold_s=10.0), turns.take()
    turns.wait(long)  # (it runs on, never done in time)
    started = time.perf_counter()
    turns.wait(next_)
    assert 0.04 < time.perf_counter() - started < 0.5
    passed = threading.Event()

    def third() -> None:
        turns.wait(after)
        passed.set()

    thread = threading.Thread(target=third)
    thread.start()
    assert not passed.wait(0.2), "the batch after went on too, within its predecessor's hold"
    turns.done(long)  # (the long run ends: its turn was long gone, nothing moves)
    assert not passed.wait(0.1)
    turns.done(next_)
    assert passed.wait(5)
    thread.join(5)


def test_a_run_within_what_it_was_given_keeps_its_turn() -> None:
    turns = Turns()
    first, second = turns.take(hold_s=5.0), turns.take()
    turns.wait(first)
    went = threading.Event()
    thread = threading.Thread(target=lambda: (turns.wait(second), went.set()))
    thread.start()
    assert not went.wait(0.2)
    turns.done(first)
    assert went.wait(5)
    thread.join(5)


def test_each_turn_in_a_row_that_overruns_is_passed_on_in_its_own_hold() -> None:
    """A batch waiting behind two overrunning runs goes on after their holds (not `STUCK_S`),
    the second's hold counted from when its turn began."""
    turns = Turns()
    first, second, third = turns.take(hold_s=0.05), turns.take(hold_s=0.05), turns.take()
    turns.wait(first)
    waiting = threading.Event()

    def second_batch() -> None:
        turns.wait(second)
        waiting.set()  # (it runs on, never done)

    thread = threading.Thread(target=second_batch)
    started = time.perf_counter()
    thread.start()
    turns.wait(third)
    assert waiting.is_set()
    assert time.perf_counter() - started < 0.6  # (about 0.1 s; STUCK_S is 1)
    thread.join(5)
