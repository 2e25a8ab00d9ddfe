"""duetime: a deadline-aware inference server for ONNX models (KServe v2 over HTTP and gRPC)."""

from duetime.engine import Engine
from duetime.errors import (
    ConfigError,
    DeadlineExceeded,
    DuetimeError,
    InvalidInput,
    ModelNotFound,
    ModelUnavailable,
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
    "Overloaded",
]
__version__ = "0.1.0"
