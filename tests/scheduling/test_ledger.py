"""CoreLedger: schedulers on one CPU take turns and plan behind each other's work."""

from __future__ import annotations

from duetime.scheduling.ledger import NO_SLACK, CoreLedger, Queued


def test_others_until_is_the_end_of_the_other_owners_booked_work() -> None:
    ledger = CoreLedger()
    a, b, c = (1, 0), (2, 0), (3, 0)
    for owner in (a, b, c):
        ledger.join(owner)
    assert ledger.shared
    assert ledger.others_until(a, now_ns=100) == 100
    ledger.book(b, 500)
    ledger.book(c, 150)
    assert ledger.others_until(a, now_ns=100) == 500
    assert ledger.others_until(b, now_ns=100) == 150  # its own work does not count
    assert ledger.others_until(b, now_ns=200) == 200  # c's work is over by then
    ledger.book(b, 0)
    assert ledger.others_until(a, now_ns=100) == 150
    ledger.leave(c)
    assert ledger.others_until(a, now_ns=100) == 100


def test_queued_work_of_the_other_schedulers_adds_up_and_keeps_the_least_slack() -> None:
    ledger = CoreLedger()
    queued = {1: Queued(300, 40), 2: Queued(50, NO_SLACK), 3: Queued(7, 10)}
    ledger.join((1, 0), lambda now: queued[1])
    ledger.join((1, 1))  # a second instance of scheduler 1: one queue per scheduler
    ledger.join((2, 0), lambda now: queued[2])
    ledger.join((3, 0), lambda now: queued[3])
    assert ledger.others_queued(1, 0) == Queued(57, 10)
    assert ledger.others_queued(2, 0) == Queued(307, 10)
    assert ledger.others_queued(3, 0) == Queued(350, 40)
    queued[3] = Queued(0, NO_SLACK)
    assert ledger.others_queued(2, 0) == Queued(300, 40)
    ledger.leave((1, 0))
    assert ledger.others_queued(2, 0) == Queued(300, 40)  # scheduler 1's instance 1 is there
    ledger.leave((1, 1))
    assert ledger.others_queued(2, 0) == Queued(0, NO_SLACK)


def test_a_lone_owner_does_not_share() -> None:
    ledger = CoreLedger()
    ledger.join((1, 0))
    assert not ledger.shared
    ledger.join((2, 0))
    ledger.leave((2, 0))
    assert not ledger.shared


def test_a_held_scheduler_is_woken_once_by_another_s_booking() -> None:
    ledger = CoreLedger()
    woken: list[int] = []
    ledger.join((1, 0))
    ledger.join((2, 0))
    ledger.hold(1, lambda: woken.append(1))
    ledger.book((1, 0), 500)  # its own booking: still held
    assert woken == []
    ledger.book((2, 0), 700)  # the other's batch handed over
    ledger.book((2, 0), 0)
    assert woken == [1]
