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
