"""CoreLedger: schedulers sharing a CPU plan with their share of it."""

from __future__ import annotations

from duetime.scheduling.ledger import CoreLedger


def test_sharing_counts_the_other_owners_busy_now() -> None:
    ledger = CoreLedger()
    a, b, c = (1, 0), (2, 0), (3, 0)
    for owner in (a, b, c):
        ledger.join(owner)
    assert ledger.shared
    assert ledger.sharing(a, now_ns=100) == 1
    ledger.book(b, 500)
    ledger.book(c, 150)
    assert ledger.sharing(a, now_ns=100) == 3
    assert ledger.sharing(a, now_ns=200) == 2  # c's work is over by then
    assert ledger.sharing(b, now_ns=100) == 2  # its own work does not count
    ledger.book(b, 0)
    assert ledger.sharing(a, now_ns=100) == 2
    ledger.leave(c)
    assert ledger.sharing(a, now_ns=100) == 1


def test_a_lone_owner_does_not_share() -> None:
    ledger = CoreLedger()
    ledger.join((1, 0))
    assert not ledger.shared
    ledger.join((2, 0))
    ledger.leave((2, 0))
    assert not ledger.shared
