"""Request parameters both protocols share: `timeout` (µs, as tritonclient sends it) and
`priority` (read in `duetime.requestparams`, which the Engine shares without importing the front
end; re-exported here), those Triton reserves (`sequence_*`, keys starting with `triton_`),
refused as Triton does, an output's, which must not differ where the output is requested again,
and how many there may be."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeAlias

from duetime.errors import InvalidInput
from duetime.requestparams import (
    MAX_DUE_US,
    MAX_PARAMETERS,
    MAX_PRIORITY,
    MAX_TIMEOUT_US,
    RESERVED_PREFIX,
    check_http_parameters,
    check_parameter_count,
    check_scalar_parameters,
    due_from_timeout_us,
    priority_of,
)
from duetime.requestparams import as_json as _json

if TYPE_CHECKING:  # (without the shared-memory module and the codec under it: ~20 ms)
    from duetime.frontend.sharedmemory import Window

__all__ = [
    "GRPC_TRITON_PARAMETERS",
    "MAX_DUE_US",
    "MAX_PARAMETERS",
    "MAX_PRIORITY",
    "MAX_TIMEOUT_US",
    "RESERVED_PREFIX",
    "OutputSetting",
    "check_grpc_parameters",
    "check_http_parameters",
    "check_output_again",
    "check_parameter_count",
    "check_scalar_parameters",
    "due_from_timeout_us",
    "priority_of",
]

GRPC_TRITON_PARAMETERS = ("triton_enable_empty_final_response",)
"""The parameters starting with RESERVED_PREFIX that Triton's gRPC front end takes (its
`TRITON_RESERVED_REQUEST_PARAMS`); its HTTP front end takes none."""
_GRPC_KINDS = {
    "sequence_id": ("int64_param", "string_param"),
    "sequence_start": ("bool_param",),
    "sequence_end": ("bool_param",),
    "triton_enable_empty_final_response": ("bool_param",),
}
"""Reserved gRPC request parameters -> the `InferParameter` fields Triton takes them in."""


def check_grpc_parameters(kinds: Mapping[str, str | None]) -> None:
    """InvalidInput, in Triton's words (grpc/infer_handler.cc `SetInferenceRequestMetadata`),
    for a request parameter Triton's gRPC front end refuses; `kinds`: each parameter's
    `InferParameter` field (`int64_param`, ...; None: none set).

    NOTE: duetime serves no sequences, and answers every stream request with one final
    response; these parameters change nothing here, but a request Triton would refuse is
    refused, so that a client's mistake shows before it meets a Triton server."""
    for key, kind in kinds.items():
        allowed = _GRPC_KINDS.get(key)
        if allowed is not None:
            if kind not in allowed:
                raise InvalidInput(
                    f"invalid value type for '{key}' parameter, expected {' or '.join(allowed)}."
                )
        elif key.startswith(RESERVED_PREFIX):
            raise InvalidInput(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
                f"following keys starting with 'triton_' are allowed: "
                f"{' '.join(GRPC_TRITON_PARAMETERS)} (got '{key}')"
            )


OutputSetting: TypeAlias = "bool | int | Window | None"
"""One parameter of a requested output as a front end read it: `binary_data` (HTTP), a class
count (`classification`), a shared-memory window; None where the request sets none."""


def check_output_again(
    name: str, again: Mapping[str, OutputSetting], first: Mapping[str, OutputSetting]
) -> None:
    """InvalidInput unless output `name`, requested again with the settings `again` (by
    parameter, in the order the message names them), is requested as it was the first time
    (`first`, the same parameters).

    NOTE: an output asked for again is answered once (as Triton's core, which keeps the
    requested outputs in a set), so two asks that differ cannot both be honoured. gRPC
    honoured one of them without a word (the class count, or the shared-memory copy, leaving
    the inline ask empty) where HTTP refused the same request; both front ends now refuse it
    here, in the same words."""
    differ = [
        f"{field} {_shown(now)} (first {_shown(first[field])})"
        for field, now in again.items()
        if now != first[field]
    ]
    if differ:
        raise InvalidInput(
            f"output '{name}' is requested more than once with different parameters: "
            f"{', '.join(differ)}; request it once, or the same way each time"
        )


def _shown(setting: OutputSetting) -> str:
    from duetime.frontend.sharedmemory import Window  # (loaded by then: see the imports)

    if setting is None:
        return "none"
    if isinstance(setting, Window):
        return f"region '{setting.region}' at {setting.offset} ({setting.byte_size} bytes)"
    return _json(setting)
