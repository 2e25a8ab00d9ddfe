"""A grpc.aio call context to hand a servicer's handler directly, with no gRPC server."""

from __future__ import annotations

from typing import Any


class CallContext:
    """A call's context: its client gone (`cancelled`, or no time `remaining`) or not; no done
    callback ever runs (as for a call whose status is never sent)."""

    def __init__(self, *, cancelled: bool = False, remaining: float | None = 30.0) -> None:
        self._cancelled = cancelled
        self._remaining = remaining
        self.code: Any = None

    def cancelled(self) -> bool:
        return self._cancelled

    def time_remaining(self) -> float | None:
        return self._remaining

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def add_done_callback(self, callback: Any) -> None: ...

    def set_trailing_metadata(self, metadata: Any) -> None: ...

    def set_code(self, code: Any) -> None:
        self.code = code

    def set_details(self, details: str) -> None: ...

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted with grpc.aio's abort: {code} {details}")
