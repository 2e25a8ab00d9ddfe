"""duetime: a deadline-aware inference server for ONNX models (KServe v2 over HTTP and gRPC)."""

from typing import TYPE_CHECKING, Any

from duetime.errors import (
    ConfigError,
    DeadlineExceeded,
    DuetimeError,
    InvalidInput,
    ModelNotFound,
    ModelUnavailable,
    Overloaded,
)

if TYPE_CHECKING:
    from duetime.engine import Engine

__all__ = [
    "ConfigError",
    "DeadlineExceeded",
    "DuetimeError",
    "Engine",
    "InvalidInput",
    "ModelNotFound",
    "ModelUnavailable",
    "Overloaded",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Engine brings ONNX Runtime and numpy (a third of a second): imported on first use, so that
    # `duetime --help`, and a Ctrl-C while the command starts, do not wait for it.
    if name == "Engine":
        from duetime.engine import Engine

        return Engine
    raise AttributeError(f"module 'duetime' has no attribute {name!r}")
