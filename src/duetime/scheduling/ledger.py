"""CoreLedger: which schedulers have a batch running on one CPU, so each plans with its share.

Instances pinned to the same CPU (a version's primary and its cheaper variant on a small
machine, say) would otherwise each plan as if they had the CPU to themselves, while the kernel
time-slices their batches and both run late. Each scheduler books its instance's predicted
busy-until instant here; a batch started while k other owners are busy on the CPU is predicted
to take (k + 1) times as long. Pure bookkeeping, on the event loop.
"""

from __future__ import annotations

Owner = tuple[int, int]
"""(id of the scheduler, instance index)."""


class CoreLedger:
    """Booked busy-until instants (ns) per owner on one CPU."""

    def __init__(self) -> None:
        self._until: dict[Owner, int] = {}
        self._owners: set[Owner] = set()

    def join(self, owner: Owner) -> None:
        self._owners.add(owner)

    def leave(self, owner: Owner) -> None:
        self._owners.discard(owner)
        self._until.pop(owner, None)

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

    def sharing(self, owner: Owner, now_ns: int) -> int:
        """How many ways the CPU is split for a batch `owner` starts now: 1 + the other owners
        with work booked past `now_ns`."""
        busy = 1
        for other, until in self._until.items():
            if other != owner and until > now_ns:
                busy += 1
        return busy
