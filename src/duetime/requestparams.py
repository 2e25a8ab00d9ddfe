"""The request parameters that set a request's due time and priority, `timeout` (µs, as
tritonclient sends it) and `priority`, read and checked alike by the in-process Engine, HTTP and
gRPC, and those Triton reserves, checked as its HTTP front end checks them
(`duetime.frontend.parameters` re-exports them for the front ends).

Pure: imports no event loop, no transport and no front end, so that the core reads them without
importing the front-end package (tests/unit/test_layering.py checks it)."""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping
from typing import Any

from duetime.errors import InvalidInput

MAX_TIMEOUT_US = 2**64 - 1
"""The largest `timeout` taken: Triton's is a uint64 (tritonclient sends it as given)."""
MAX_DUE_US = 10**12
"""The longest `timeout` that sets a due time (11.6 days); a longer one sets none, as 0 does.

NOTE: a longer one was refused (400, INVALID_ARGUMENT), where Triton takes any uint64: a client
that sends 2**63 - 1 to mean "no timeout" (gRPC's int64_param at its largest) failed here. None
past this bound also keeps the due times in nanoseconds (`now_ns + timeout * 1000`) within an
int64 whatever the value."""
MAX_PRIORITY = 2**64 - 1
"""Triton's priority is a uint64."""


def due_from_timeout_us(parameters: Mapping[str, Any], now_ns: int) -> int | None:
    """The due time set by the `timeout` parameter (µs from `now_ns`), or None when the request
    has none: no `timeout`, 0 (Triton's "no timeout"), or one over MAX_DUE_US.

    NOTE: a None (a gRPC parameter with no value set; a JSON null, which HTTP refuses before
    this, as any parameter's: a v2 parameter is a string, a number or a boolean) was taken as
    no `timeout`, where one for `priority` was refused ("got null"). Both are refused now,
    naming the parameter; the in-process Engine leaves out a None (not given) first."""
    if "timeout" not in parameters:
        return None
    value = _uint64(
        parameters, "timeout", f"an integer count of microseconds between 0 and "
        f"{MAX_TIMEOUT_US} (a uint64; 0, or over {MAX_DUE_US}: no due time)",
    )  # fmt: skip
    return now_ns + value * 1000 if 0 < value <= MAX_DUE_US else None


def priority_of(parameters: Mapping[str, Any]) -> int:
    """The `priority` parameter (1 is highest; 0 or absent: the model's default level)."""
    if "priority" not in parameters:
        return 0
    return _uint64(parameters, "priority", f"an integer between 0 and {MAX_PRIORITY} (a uint64)")


def _uint64(parameters: Mapping[str, Any], name: str, expected: str) -> int:
    """Request parameter `name` (present) as an int, or InvalidInput saying it must be
    `expected` (None, a bool, a float, a string or out of range: refused alike)."""
    value = parameters[name]
    if type(value) is not int:  # (nearly every value is: no call)
        value = _integer(value)
    if not is_uint64(value):
        raise InvalidInput(f"request parameter '{name}' must be {expected}, got {as_json(value)}")
    return int(value)


def _integer(value: Any) -> Any:
    """`value` as an int where it is an integer of another type (numpy's, from an in-process
    caller's `parameters`); as it is otherwise (a bool too), for the caller to refuse."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return value
    return int(value)


def as_json(value: Any) -> str:
    """A parameter's value as the JSON it came in (`true`, not `True`), for a message."""
    return json.dumps(value, default=repr)[:100]


def is_uint64(value: Any) -> bool:
    """Whether `value` is an int (not a bool) a uint64 holds."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64


RESERVED_PREFIX = "triton_"


def check_http_parameters(parameters: Mapping[str, Any]) -> None:
    """InvalidInput, in Triton's words (http_server.cc `ParseJsonTritonParams`), for a request
    parameter Triton's HTTP front end refuses: a `sequence_id` that is no unsigned integer or
    string, a `sequence_start` or `sequence_end` that is no boolean, any key starting with
    `triton_` (see check_grpc_parameters)."""
    for key, value in parameters.items():
        if key == "sequence_id":
            if isinstance(value, bool) or not (isinstance(value, str) or is_uint64(value)):
                raise InvalidInput(
                    "Unable to parse 'sequence_id': request parameter 'sequence_id' must be an "
                    f"unsigned integer or a string, got {as_json(value)}"
                )
        elif key in ("sequence_start", "sequence_end"):
            if not isinstance(value, bool):
                raise InvalidInput(
                    f"Unable to parse '{key}': request parameter '{key}' must be true or false, "
                    f"got {as_json(value)}"
                )
        elif key.startswith(RESERVED_PREFIX):
            raise InvalidInput(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should "
                f"not be specified (got '{key}')"
            )


MAX_PARAMETERS = 256
"""Parameters one inference request may carry, and each of its inputs and outputs (see
`check_parameter_count`)."""


def check_scalar_parameters(parameters: Mapping[Any, Any], where: str) -> None:
    """InvalidInput for a parameter of `where` (`request`, `input 'x'`, ...) that is not a string,
    a number or true/false, or whose name is not a string: what the v2 protocol's parameters
    hold (JSON scalars; gRPC's InferParameter is one of them)."""
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise InvalidInput(
                f"{where} parameter names must be strings, got {key!r} ({type(key).__name__})"
            )
        if value is None or not isinstance(value, str | numbers.Real):
            kind = (
                "null" if value is None
                else "an object" if isinstance(value, Mapping)
                else "a list" if isinstance(value, list | tuple)
                else f"a {type(value).__name__}"
            )  # fmt: skip
            raise InvalidInput(
                f"{where} parameter '{key}' has invalid type: it is {kind}; a parameter must be "
                "a string, a number or true/false"
            )


def check_parameter_count(count: int, where: str) -> None:
    """InvalidInput where `where` (`request`, `input 'x'`, ...) carries more than MAX_PARAMETERS
    parameters; `count`: how many (a map's len, which costs nothing), checked before any is read.

    NOTE: each parameter cost the event loop microseconds of Python (read, type checks, read
    again): one gRPC ModelInfer with 1,000,000 request parameters (17 MB, within the message
    limit) stalled every other client 7-13 s, one over HTTP with 440,000 (8 MB of JSON, within
    --max-json-bytes) 1.6 s. What remains is the decoding of the message itself (protobuf, JSON),
    bounded by the size limits: about 1 s for that gRPC message, 0.7 s for that JSON. Clients
    send a handful (Triton's own, `timeout`, shared-memory and class-count ones)."""
    if count > MAX_PARAMETERS:
        raise InvalidInput(
            f"{where} 'parameters' has {count} entries, over the limit of {MAX_PARAMETERS} "
            "parameters a request, input or output may carry"
        )
