"""Where `duetime replay` sends: the tools' HTTP pool (connections that never queue), or gRPC
channels. gRPC multiplexes calls on its channels, so the load generator's transport is reused as
it is, keeping each answer's bytes. Every request ends through one `Answered` callback with an
HTTP-style status.
"""

from __future__ import annotations

from typing import Any, Protocol

import grpc

from duetime.tools.http_client import NO_CONNECTION, NO_STATUS, Answered
from duetime.tools.outcomes import Outcome
from duetime.tools.replay_payloads import GrpcRequest
from duetime.tools.transports import GrpcTransport

HTTP_STATUS_OF_GRPC = {
    "OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504, "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429, "FAILED_PRECONDITION": 400, "ABORTED": 409, "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501, "INTERNAL": 500, "UNAVAILABLE": 503, "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}  # fmt: skip
"""The status duetime's HTTP front end would give for each gRPC code (as captures record)."""


class ReplayTransport(Protocol):
    opened: int
    """Connections (HTTP) or channels (gRPC) opened in all."""
    waited: int
    """Requests that had to wait for a connection (the cap was reached)."""

    async def open(self, connections: int) -> None: ...

    def send(self, rid: int, payload: Any) -> None: ...

    async def aclose(self) -> None: ...


# -- gRPC ----------------------------------------------------------------------------------------


def _unused(rid: int, outcome: Outcome, message: str | None, at_ns: int | None = None) -> None:
    """GrpcTransport's completion callback; the replay reports through `answered` instead."""


class GrpcReplayTransport(GrpcTransport):
    """The load generator's gRPC channels, calls taken in turn, answers kept as bytes."""

    def __init__(self, target: str, answered: Answered, *, keep_bodies: bool) -> None:
        super().__init__(target, _unused, flag="--target")
        self.answered = answered
        self.keep_bodies = keep_bodies
        self.opened = 0
        self.waited = 0

    async def open(self, lanes: int) -> None:
        await super().open(lanes)
        self.opened = lanes

    def send(self, rid: int, payload: GrpcRequest, lane: int | None = None) -> None:  # type: ignore[override]
        turn = self._turn
        self._turn = (turn + 1) % len(self._calls)
        self._tasks.spawn(self._replay(turn, rid, payload))

    async def _replay(self, turn: int, rid: int, payload: GrpcRequest) -> None:
        call = self._calls[turn]
        try:
            data = await call(payload.data, timeout=payload.deadline_s, metadata=payload.metadata)
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            outcome, message = self.failure(exc, turn)
            no_answer = code == "UNAVAILABLE" and outcome == Outcome.ERROR
            if outcome == Outcome.UNSENT:  # (the channel had no connection to send it on)
                status = NO_CONNECTION
            else:
                status = NO_STATUS if no_answer else HTTP_STATUS_OF_GRPC.get(code, 500)
            self.answered(rid, status, None, None, message)
            return
        except Exception as exc:  # a fault of the client library: count it, keep going
            self.answered(rid, NO_STATUS, None, None, f"{type(exc).__name__}: {exc}")
            return
        self.answered(rid, 200, data if self.keep_bodies else None, None, None)
