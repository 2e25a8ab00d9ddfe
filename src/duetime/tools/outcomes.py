"""How one load-generator request ended, from an HTTP status, a gRPC code or a duetime error.

`late` is decided later by the client's own clock (`report.apply_due`): here a successful answer
is simply OK.
"""

from __future__ import annotations

from enum import IntEnum


class Outcome(IntEnum):
    """The end of one request. NO_ANSWER marks one still owed (or never answered); UNSENT one
    that never left the generator: no connection to the server could be opened."""

    NO_ANSWER = -1
    OK = 0
    LATE = 1
    REJECTED = 2
    EXPIRED = 3
    ERROR = 4
    UNSENT = 5


DUE_PASSED_UNSENT = (
    "not sent: its due time passed while it waited for a free connection (every one was waiting "
    "for an answer)"
)
"""The message of a request the generator did not send, its due time having passed while it
waited for a connection: it ends EXPIRED (as a client with a deadline does not send it), and a
capture records it as never sent (`bench_record`), not as the server's 504."""

_REJECTED_HTTP = frozenset({429, 503})
_REJECTED_GRPC = frozenset({"RESOURCE_EXHAUSTED", "UNAVAILABLE"})


def outcome_of_http_status(status: int) -> Outcome:
    """2xx: OK; 429 or 503: REJECTED; 504: EXPIRED; anything else: ERROR."""
    if 200 <= status < 300:
        return Outcome.OK
    if status in _REJECTED_HTTP:
        return Outcome.REJECTED
    if status == 504:
        return Outcome.EXPIRED
    return Outcome.ERROR


def outcome_of_grpc_code(code: str) -> Outcome:
    """`code` is a `grpc.StatusCode` member name, e.g. "DEADLINE_EXCEEDED"."""
    if code == "OK":
        return Outcome.OK
    if code in _REJECTED_GRPC:
        return Outcome.REJECTED
    if code == "DEADLINE_EXCEEDED":
        return Outcome.EXPIRED
    return Outcome.ERROR
