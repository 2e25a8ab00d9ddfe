"""CircuitBreaker: opening on failures or slowness, the half-open probe, closing, backoff; pure."""

from __future__ import annotations

from duetime.config import BreakerConfig
from duetime.resilience.breaker import BreakerState, CircuitBreaker

S = 1_000_000_000


def breaker(**settings: object) -> CircuitBreaker:
    return CircuitBreaker(BreakerConfig(**settings))  # type: ignore[arg-type]


def test_consecutive_failures_open_it() -> None:
    b = breaker(failures=3)
    assert not b.record(0, failed=True, slow=False)
    assert not b.record(1, failed=True, slow=False)
    assert b.record(2, failed=True, slow=False)
    assert b.state is BreakerState.OPEN
    assert not b.allows(3)
    assert b.retry_after_ns(2) == 5 * S


def test_a_success_resets_the_count() -> None:
    b = breaker(failures=2)
    b.record(0, failed=True, slow=False)
    b.record(1, failed=False, slow=False)
    assert not b.record(2, failed=True, slow=False)
    assert b.state is BreakerState.CLOSED


def test_slow_executions_open_it() -> None:
    b = breaker(slow_executions=2)
    assert not b.record(0, failed=False, slow=True)
    assert b.record(1, failed=False, slow=True)
    assert b.state is BreakerState.OPEN


def test_half_open_lets_one_probe_through_and_closes_after_it() -> None:
    b = breaker(failures=1, open_s=1.0)
    b.record(0, failed=True, slow=False)
    assert not b.allows(S - 1)
    assert b.allows(S)
    assert b.state is BreakerState.HALF_OPEN
    b.started()
    assert not b.allows(S)  # one probe at a time
    b.record(S + 5, failed=False, slow=False)
    assert b.state is BreakerState.CLOSED
    assert b.allows(S + 6)


def test_a_failed_probe_reopens_for_twice_as_long() -> None:
    b = breaker(failures=1, open_s=1.0, max_open_s=3.0)
    b.record(0, failed=True, slow=False)
    assert b.allows(S)
    b.started()
    assert b.record(S, failed=True, slow=False)
    assert b.open_until_ns == 3 * S
    assert b.allows(3 * S)
    b.started()
    b.record(3 * S, failed=False, slow=True)  # slow probes count as bad too
    assert b.open_until_ns == 6 * S  # capped at max_open_s
    assert b.opened == 3


def test_several_probes_needed_to_close() -> None:
    b = breaker(failures=1, open_s=1.0, probes=2)
    b.record(0, failed=True, slow=False)
    assert b.allows(S)
    b.started()
    b.record(S, failed=False, slow=False)
    assert b.state is BreakerState.HALF_OPEN
    assert b.allows(S)
    b.started()
    b.record(S, failed=False, slow=False)
    assert b.state is BreakerState.CLOSED
    # closed again: the open period is back to its start
    b.record(2 * S, failed=True, slow=False)
    assert b.open_until_ns == 3 * S
