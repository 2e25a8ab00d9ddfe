"""The one error taxonomy: each error knows its HTTP status and gRPC code, and says what to do."""

from __future__ import annotations

import reprlib
from typing import Any


class DuetimeError(Exception):
    """Base of every error duetime reports to a client.

    `http_status` and `grpc_code` (the name of a `grpc.StatusCode` member) map the error onto both
    protocols, so the core never imports a transport. `retry_after_s`, when set, becomes the HTTP
    `Retry-After` header.
    """

    http_status: int = 500
    grpc_code: str = "INTERNAL"
    retry_after_s: float | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()
    """Headers its HTTP answer carries besides those every error's does."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class InvalidInput(DuetimeError):
    """The request does not match the protocol or the model's signature."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"
    counted = False
    """Counted already among its model's invalid requests (see `count_in`)."""

    def count_in(self, counts: dict[tuple[str, str], int], key: tuple[str, str]) -> None:
        """Count this refusal in `counts` (the router's `invalid`) under `key` (model, version),
        once: the header checks, the router and the front ends each count what the stage
        before did not."""
        if not self.counted:
            counts[key] = counts.get(key, 0) + 1
            self.counted = True


class ModelOutputError(InvalidInput):
    """The model ran but made an output duetime cannot return (a string that is not UTF-8):
    the model's fault, not the request's, so HTTP 500 / INTERNAL, as Triton answers a model
    that failed.

    NOTE: an InvalidInput only for the circuit breaker, which does not count these while the
    model answered other requests lately (see `ModelScheduler._judge`): which requests make such
    an output may depend on their values, and one client sending those must not open the breaker
    on everyone else. A model that makes it for every request still opens it. Catch this class
    before InvalidInput to tell the two apart.
    """

    http_status = 500
    grpc_code = "INTERNAL"


class PayloadTooLarge(DuetimeError):
    """The request body or one of its headers is over a configured limit."""

    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class ModelNotFound(DuetimeError):
    """No such model, or no such version of it."""

    http_status = 404
    grpc_code = "NOT_FOUND"


class ModelUnavailable(DuetimeError):
    """The model exists but cannot serve now (still loading, failed to load, or shutting down)."""

    http_status = 503
    grpc_code = "UNAVAILABLE"


QUEUE_FULL = "Exceeds maximum queue size"
"""Triton's words for a request its model's queue had no room for (`Overloaded`): a message
starts with them, as Triton's clients and QA tests (qa/L0_model_queue) match on them."""

TIMEOUT_EXPIRED = "Request timeout expired"
"""Triton's words for a request whose timeout passed before it ran (`DeadlineExceeded`), which
qa/L0_model_queue matches on too; a message starts with them."""


class Overloaded(DuetimeError):
    """Admission refused the request: the queue is full or its due time cannot be met."""

    http_status = 429
    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, *, retry_after_s: float | None = 1.0) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


class Shed(Overloaded):
    """The load shedder refused the request before it was decoded: the server is saturated."""


class DeadlineExceeded(DuetimeError):
    """The request's due time passed before an answer could be produced."""

    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"


class Unauthorized(DuetimeError):
    """A control request without the server's control token."""

    http_status = 401
    grpc_code = "UNAUTHENTICATED"
    headers = ((b"WWW-Authenticate", b'Bearer realm="duetime"'),)
    """RFC 9110 15.5.2: a 401 says how to authenticate (it did not: found by a tester)."""


class NotAllowed(DuetimeError):
    """The request is valid but this server is not set up to do it (e.g. model control off)."""

    http_status = 400
    grpc_code = "FAILED_PRECONDITION"


class Unsupported(DuetimeError):
    """A request for something the protocol has and this server does not do: as Triton's
    UNSUPPORTED, 400 / UNIMPLEMENTED (a repository call naming a repository)."""

    http_status = 400
    grpc_code = "UNIMPLEMENTED"


MODEL_CONTROL_OFF = "explicit model load / unload is not allowed if polling is enabled"
"""Triton's words for a load or unload outside explicit mode (`ModelControlOff`; Triton says
them in mode none too)."""


class ModelControlOff(NotAllowed):
    """A model load or unload where the repository is not in explicit mode: as Triton, 503 /
    UNAVAILABLE, the message beginning with its words (`MODEL_CONTROL_OFF`).

    NOTE: answered 400 / FAILED_PRECONDITION, where a Triton client (and Triton's QA) expects
    UNAVAILABLE (found by a tester)."""

    http_status = 503
    grpc_code = "UNAVAILABLE"


class InternalError(DuetimeError):
    """A fault inside duetime or ONNX Runtime; never the client's input."""


class ConfigError(DuetimeError):
    """A model repository or server setting is invalid; the message names the file and field."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict = 3, 6, 6
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 80, 80, 40


def shown(value: Any) -> str:
    """`value` as an error message quotes a client's value: its repr, cut short (nested 3 levels,
    6 items, 80 characters a string).

    NOTE: the whole repr was quoted: a 20 MB list as a trace setting came back as a 30 MB
    error (and log line), and 1,000 nested lists raised RecursionError: a 500 (found by a
    tester)."""
    return _SHOWN.repr(value)


CUT = "... (cut)"
"""The end of a text cut to fit a message (see `fitted`)."""


def fitted(text: str, most: int) -> str:
    """`text` where its UTF-8 is at most `most` bytes, else cut to fit with `CUT` at its end."""
    data = text.encode(errors="surrogatepass")
    if len(data) <= most:
        return text
    return data[: max(0, most - len(CUT))].decode(errors="ignore") + CUT
