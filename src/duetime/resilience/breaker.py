"""CircuitBreaker: stops sending work to a model instance that keeps failing or has become far
slower than its latency profile; pure (the caller passes `now`).

closed ──(N failed or slow executions in a row)──► open ──(open_s passes)──► half-open
  ▲                                                 ▲                              │
  └──────────(`probes` good executions)─────────────┼──── a probe fails or is slow ┘

While open, the instance takes no batch. Half-open lets one batch through at a time (a probe);
each time a probe fails, the next open period doubles, up to `max_open_s`.

Only the model's faults count. A batch that failed on its clients' data (answered 400) says
nothing of the model, healthy or not: the caller `release`s it instead of recording it, and
while half-open the next batch probes. A model that fails on every input, its own sample inputs
included, is `trip`ped by the caller once it has checked so (see `ModelScheduler._suspect`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from duetime.config import BreakerConfig


class BreakerState(IntEnum):
    """Numbered as the `duetime_breaker_state` gauge reports them."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


@dataclass(slots=True)
class BreakerStatistics:
    state: BreakerState
    opened: int
    """Times the breaker opened."""
    failures_in_a_row: int
    slow_in_a_row: int


class CircuitBreaker:
    """The breaker of one instance."""

    def __init__(self, config: BreakerConfig) -> None:
        self._config = config
        self.state = BreakerState.CLOSED
        self._failures = 0
        self._slow = 0
        self._good_probes = 0
        self._probing = False
        self._open_ns = int(config.open_s * 1e9)
        self.open_until_ns = 0
        self.opened = 0

    def allows(self, now_ns: int) -> bool:
        """Whether the instance may take a batch now (an open breaker turns half-open here once
        its open period is over)."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            if now_ns < self.open_until_ns:
                return False
            self.state = BreakerState.HALF_OPEN
            self._good_probes = 0
        return not self._probing

    def started(self) -> None:
        """A batch was handed to the instance (while half-open: the probe)."""
        if self.state is BreakerState.HALF_OPEN:
            self._probing = True

    def release(self) -> None:
        """The batch handed over told nothing of the model (it failed on its clients' data, or
        was not run): neither good nor bad; while half-open, the next batch probes."""
        self._probing = False

    def trip(self, now_ns: int) -> bool:
        """Open now, whatever the count: the model failed on inputs known to be good (the
        samples it answered at load). While half-open this is a failed probe (the open period
        doubles); True if this opened the breaker (False if it was open already)."""
        if self.state is BreakerState.OPEN:
            return False
        self._probing = False
        if self.state is BreakerState.HALF_OPEN:
            self._open_ns = min(2 * self._open_ns, int(self._config.max_open_s * 1e9))
        return self._open(now_ns)

    def clear(self) -> None:
        """A good execution while closed: the same as `record(failed=False, slow=False)`."""
        self._failures = self._slow = 0

    def record(self, now_ns: int, *, failed: bool, slow: bool) -> bool:
        """Count one finished execution; True if this opened the breaker."""
        config = self._config
        self._probing = False
        self._failures = self._failures + 1 if failed else 0
        self._slow = self._slow + 1 if slow and not failed else 0
        bad = failed or slow
        if self.state is BreakerState.HALF_OPEN:
            if bad:
                self._open_ns = min(2 * self._open_ns, int(config.max_open_s * 1e9))
                return self._open(now_ns)
            self._good_probes += 1
            if self._good_probes >= config.probes:
                self.state = BreakerState.CLOSED
                self._open_ns = int(config.open_s * 1e9)
            return False
        if self.state is BreakerState.CLOSED and (
            self._failures >= config.failures or self._slow >= config.slow_executions
        ):
            return self._open(now_ns)
        return False

    def _open(self, now_ns: int) -> bool:
        self.state = BreakerState.OPEN
        self.open_until_ns = now_ns + self._open_ns
        self.opened += 1
        self._failures = self._slow = 0
        return True

    def retry_after_ns(self, now_ns: int) -> int:
        return max(0, self.open_until_ns - now_ns)

    def statistics(self) -> BreakerStatistics:
        return BreakerStatistics(self.state, self.opened, self._failures, self._slow)
