"""duetime: a deadline-aware inference server for ONNX models (KServe v2 over HTTP and gRPC)."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from duetime.engine import Engine
    from duetime.errors import (
        ConfigError,
        DeadlineExceeded,
        DuetimeError,
        InvalidInput,
        ModelNotFound,
        ModelUnavailable,
        NotAllowed,
        Overloaded,
    )

__all__ = [
    "ConfigError",
    "DeadlineExceeded",
    "DuetimeError",
    "Engine",
    "InvalidInput",
    "ModelNotFound",
    "ModelUnavailable",
    "NotAllowed",
    "Overloaded",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # NOTE: imported on first use: Engine brings ONNX Runtime and numpy (a third of a second),
    # and `duetime --help`, or a Ctrl-C while the command starts, should not wait for them.
    if name == "Engine":
        from duetime.engine import Engine

        return Engine
    if name in __all__:
        from duetime import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'duetime' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names, those loaded on first use (`__getattr__`) included: without it,
    `dir(duetime)`, completion and `help` showed none of the API."""
    return sorted({*globals(), *__all__})
