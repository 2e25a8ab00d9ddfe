"""`duetime bench --record FILE`: a capture of every request a bench run sent, written after the
run (nothing on the hot path), so `duetime replay` can send the same traffic again."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from duetime.tools.capture.format import CapturedRequest, CapturedTensor
from duetime.tools.capture.writer import CaptureWriter
from duetime.tools.config import BenchConfig
from duetime.tools.drivers import Ledger
from duetime.tools.outcomes import DUE_PASSED_UNSENT, Outcome
from duetime.tools.transports import BenchError

if TYPE_CHECKING:
    from duetime.tools.report import BenchResult, Records

STATUS_OF: dict[int, int] = {
    Outcome.OK: 200, Outcome.LATE: 200, Outcome.REJECTED: 429, Outcome.EXPIRED: 504,
    Outcome.ERROR: 500, Outcome.NO_ANSWER: 499, Outcome.UNSENT: 0,
}  # fmt: skip
"""The HTTP-style status a capture records for each outcome (499: never answered; 0, no
outcome, as `capture show` says: never sent, no connection to the server could be opened; a
request EXPIRED unsent, its due time passed while it waited for a connection, is 0 too)."""
UNSENT_ERROR = "not sent: no connection to the server could be opened"
"""The error recorded with a request that was never sent."""
WRITTEN_BY = "duetime bench"
"""The header meta's `written_by` of a bench capture (`replay_plan.ids_sent` reads it)."""


class CaptureFailed(BenchError):
    """The run went to its end but its capture could not be written (`message` says why; the
    partial file was removed). `records` are the run's, and `result` (set by
    `run_bench_async`) what it measured: a capture that fails must not take them with it."""

    def __init__(self, message: str, records: Records) -> None:
        super().__init__(message)
        self.records = records
        self.result: BenchResult | None = None


def write_bench_capture(
    path: Path,
    config: BenchConfig,
    ledger: Ledger,
    pools: Sequence[Sequence[Mapping[str, np.ndarray]]],
    payloads: Sequence[Sequence[Any]] = (),
) -> int:
    """Write request i as sent by the run (the inputs of its pool entry, its scheduled instant
    from the first one, its class's timeout and the priority) with how it ended; returns the
    count. `pools[c][k]` are the inputs of payload k of due class c (`Dispatch`'s choice), and
    `payloads[c][k]` its wire form: over HTTP the capture keeps the headers that framed it
    (as `duetime serve --record` does), which tell a replay JSON from binary tensors.
    FileExistsError if `path` exists: a capture is never overwritten.

    Each record's `request_id` is empty: bench sends no request id, and a capture holds what
    was on the wire (a server capture of the same traffic records none either), so a replay
    sends none. A write that fails after the file was created removes it (a capture missing
    some of what was sent would replay as if it were the run) and raises.

    NOTE: a request never sent (UNSENT: the server died mid-run) once raised KeyError here,
    after the run, and the run printed no table; and an `http-json` run's capture, with no
    headers, replayed with binary tensors. Requests were recorded as `bench-N`, an id never
    sent, which `duetime replay` then sent (its bodies were not bench's; found by a tester)."""
    http = config.protocol not in ("grpc", "engine")
    meta = {"written_by": WRITTEN_BY, "model": config.model, "protocol": config.protocol,
            "mode": config.mode, "rate": config.rate, "seed": config.seed}  # fmt: skip
    tensors = [[[CapturedTensor.of(n, a) for n, a in inputs.items()] for inputs in pool]
               for pool in pools]  # fmt: skip
    writer = CaptureWriter(path, meta=meta, overwrite=False)  # (FileExistsError: not ours)
    try:
        for record in _records(config, ledger, tensors, payloads if http else ()):
            writer.write(record)
        writer.close()
    except BaseException:
        with contextlib.suppress(OSError):
            writer.close()
        path.unlink(missing_ok=True)
        raise
    return len(ledger.scheduled)


def _records(
    config: BenchConfig,
    ledger: Ledger,
    tensors: Sequence[Sequence[list[CapturedTensor]]],
    payloads: Sequence[Sequence[Any]],
) -> Iterator[CapturedRequest]:
    """One record per request of `ledger` (see `write_bench_capture`); `payloads`: the HTTP
    requests as sent, for the headers that framed them (none: no headers)."""
    protocol = {"grpc": "grpc", "engine": "engine"}.get(config.protocol, "http")
    first = min(ledger.scheduled, default=0)
    # NOTE: recorded as the server's 504, a replay compared them with answers it never sent
    expired_unsent = set(ledger.unsent_expired)
    classes = config.classes
    for rid, scheduled in enumerate(ledger.scheduled):
        due_class = ledger.due_class[rid]
        due = classes[due_class]
        outcome = ledger.outcome[rid]
        if rid in expired_unsent:
            status, error = 0, DUE_PASSED_UNSENT
        elif outcome == Outcome.UNSENT:
            status, error = 0, UNSENT_ERROR
        else:
            status, error = STATUS_OF[outcome], None
        answered = outcome != Outcome.NO_ANSWER and error is None
        began = min(scheduled, ledger.sent[rid])
        parameters: dict[str, Any] = {}
        if due.timeout_us is not None:
            parameters["timeout"] = due.timeout_us
        if config.priority is not None:
            parameters["priority"] = config.priority
        pool = tensors[due_class]
        k = rid % len(pool)
        headers = _framing(payloads[due_class][k]) if payloads else {}
        yield CapturedRequest(
            arrival_ns=scheduled - first, protocol=protocol, model=config.model,
            version=None, request_id="", inputs=pool[k],
            outputs_wanted=None, parameters=parameters, due_in_ns=due.timeout_ns,
            priority=config.priority or 0, headers=headers, trace_id=None,
            status=status, error=error,
            latency_ns=ledger.finished[rid] - began if answered else 0,
            answered_version=None, variant=None, outputs=None,
        )  # fmt: skip


def _framing(payload: bytes) -> dict[str, str]:
    """The headers of an HTTP request `payload` (lower-case names), but Host."""
    head = bytes(payload[: payload.find(b"\r\n\r\n")]).decode("latin-1")
    headers = {}
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.lower() != "host":
            headers[name.strip().lower()] = value.strip()
    return headers
