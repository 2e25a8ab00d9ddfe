"""CoreLedger: the schedulers whose instances run on one CPU take turns on it, and each plans
with the work the others have booked there.

Instances pinned to the same CPU (a version's primary and its cheaper variant on a small machine,
say) would otherwise each plan as if they had the CPU to themselves: the kernel time-slices their
batches, every batch takes several times its profile, and both run late. Instead their instance
threads take turns (`turns`: batches run one at a time, in the order the loop handed them over),
so every batch runs at the speed its profile measured, and each scheduler books its instance's
predicted busy-until instant and its queued work here. A scheduler then starts a batch no
earlier than the others' booked batches end, and admits a request only if it fits behind them,
and behind the work the others have queued too where that work cannot wait for its batch
(their queue's slack). A batch that would use up the others' slack, where its own requests
could wait longer, is held back (`hold`) until the others hand theirs over: the turns go in
hand-over order. Bookkeeping on the event loop; only `turns` is touched by the instance
threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from duetime.execution.turns import Turns

Owner = tuple[int, int]
"""(id of the scheduler, instance index)."""
NO_SLACK = 1 << 62
"""The slack of a queue holding no request with a due time."""


class Queued(NamedTuple):
    """Work a scheduler has queued and not started."""

    backlog_ns: int
    """Its run time, at the saturated per-row cost."""
    slack_ns: int
    """How much later than planned its work could start and every queued request still finish
    by its due time (NO_SLACK: none has one)."""


class CoreLedger:
    """Booked busy-until instants (ns) per owner, and queued work per scheduler, on one CPU."""

    def __init__(self) -> None:
        self.turns = Turns()
        """The order the batches handed to instance threads on this CPU run in."""
        self._until: dict[Owner, int] = {}
        self._owners: set[Owner] = set()
        self._queued: dict[int, Callable[[int], Queued]] = {}
        self._held: dict[int, Callable[[], None]] = {}

    def join(self, owner: Owner, queued: Callable[[int], Queued] | None = None) -> None:
        """`queued(now)`: what the owner's scheduler has queued and not started yet."""
        self._owners.add(owner)
        if queued is not None:
            self._queued[owner[0]] = queued

    def leave(self, owner: Owner) -> None:
        self._owners.discard(owner)
        self._until.pop(owner, None)
        if not any(o[0] == owner[0] for o in self._owners):
            self._queued.pop(owner[0], None)
            self._held.pop(owner[0], None)

    @property
    def shared(self) -> bool:
        """More than one owner runs on this CPU (else the ledger changes nothing)."""
        return len(self._owners) > 1

    def book(self, owner: Owner, until_ns: int) -> None:
        """`owner`'s instance is busy until `until_ns` (0: idle)."""
        if until_ns:
            self._until[owner] = until_ns
        else:
            self._until.pop(owner, None)
        if self._held:
            for scheduler in [s for s in self._held if s != owner[0]]:
                self._held.pop(scheduler)()

    def hold(self, scheduler: int, wake: Callable[[], None], now_ns: int | None = None) -> bool:
        """`scheduler` holds a batch back for the more urgent work another has queued: `wake` is
        called once, at the next booking by another scheduler (its batch handed over or
        ended). False, holding nothing, where another scheduler with work queued (at `now_ns`;
        None: any other) holds already: it holds for this one's work, which goes on.

        NOTE: two schedulers each held for the other's work, neither booked anything to wake
        the other, and the CPU stood idle while both queues expired."""
        for other in [s for s in self._held if s != scheduler]:
            queued = self._queued.get(other)
            if now_ns is None or queued is None or queued(now_ns).backlog_ns > 0:
                return False
            del self._held[other]  # (its queue emptied: nothing left to hold)
        self._held[scheduler] = wake
        return True

    def unhold(self, scheduler: int) -> None:
        """`scheduler` holds nothing back any more (it hands a batch over, or its queue is
        empty)."""
        self._held.pop(scheduler, None)

    def settled(self, scheduler: int) -> None:
        """`scheduler`'s queued work shrank without a booking (its queue emptied, or requests
        expired in it): it holds nothing, and the others held for its work look again."""
        self._held.pop(scheduler, None)
        if self._held:
            for other in list(self._held):
                self._held.pop(other)()

    def others_until(self, owner: Owner, now_ns: int) -> int:
        """When the batches the other owners have booked end (`now_ns` if none runs)."""
        until = now_ns
        for other, booked in self._until.items():
            if other != owner and booked > until:
                until = booked
        return until

    def others_queued(self, scheduler: int, now_ns: int) -> Queued:
        """The work the other schedulers on this CPU have queued and not started (summed), and
        the least slack of any request in it."""
        backlog, slack = 0, NO_SLACK
        for owner, queued in self._queued.items():
            if owner != scheduler:
                theirs = queued(now_ns)
                backlog += theirs.backlog_ns
                slack = min(slack, theirs.slack_ns)
        return Queued(backlog, slack)
