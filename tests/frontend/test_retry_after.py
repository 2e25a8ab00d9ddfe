"""`Retry-After` in whole seconds (RFC 9110 delay-seconds), rounded up from the wait it names."""

from __future__ import annotations

import pytest

from duetime.errors import ModelUnavailable, Overloaded
from duetime.frontend.rest import error_reply


@pytest.mark.parametrize(
    ("wait_s", "header"), [(0.001, b"1"), (1.0, b"1"), (1.4, b"2"), (1.6, b"2"), (30.0, b"30")]
)
def test_retry_after_is_the_wait_rounded_up(wait_s: float, header: bytes) -> None:
    """Probe repro_retry_after_rounding: a breaker open 1.4 s more said "Retry-After: 1" (its
    message said 1.4 s), and a client that waited so was refused again."""
    for error in (
        ModelUnavailable("open", retry_after_s=wait_s),
        Overloaded("full", retry_after_s=wait_s),
    ):
        reply = error_reply(error, "0" * 32)
        assert (b"Retry-After", header) in reply.headers


def test_no_wait_no_retry_after() -> None:
    reply = error_reply(ModelUnavailable("gone"), "0" * 32)
    assert all(name != b"Retry-After" for name, _ in reply.headers)
