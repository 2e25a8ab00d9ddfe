"""`duetime bench --record FILE`: a capture of every request a bench run sent, written after the
run (nothing on the hot path), so `duetime replay` can send the same traffic again."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from duetime.tools.capture.format import CapturedRequest, CapturedTensor
from duetime.tools.capture.writer import CaptureWriter
from duetime.tools.config import BenchConfig
from duetime.tools.drivers import Ledger
from duetime.tools.outcomes import Outcome

STATUS_OF: dict[int, int] = {
    Outcome.OK: 200, Outcome.LATE: 200, Outcome.REJECTED: 429, Outcome.EXPIRED: 504,
    Outcome.ERROR: 500, Outcome.NO_ANSWER: 499,
}  # fmt: skip
"""The HTTP-style status a capture records for each outcome (499: never answered)."""


def write_bench_capture(
    path: Path,
    config: BenchConfig,
    ledger: Ledger,
    pools: Sequence[Sequence[Mapping[str, np.ndarray]]],
) -> int:
    """Write request i as sent by the run (the inputs of its pool entry, its scheduled instant
    from the first one, its class's timeout and the priority) with how it ended; returns the
    count. `pools[c][k]` are the inputs of payload k of due class c (`Dispatch`'s choice).
    FileExistsError if `path` exists: a capture is never overwritten."""
    protocol = {"grpc": "grpc", "engine": "engine"}.get(config.protocol, "http")
    meta = {"written_by": "duetime bench", "model": config.model, "protocol": config.protocol,
            "mode": config.mode, "rate": config.rate, "seed": config.seed}  # fmt: skip
    first = min(ledger.scheduled, default=0)
    classes = config.classes
    tensors = [[[CapturedTensor.of(n, a) for n, a in inputs.items()] for inputs in pool]
               for pool in pools]  # fmt: skip
    with CaptureWriter(path, meta=meta, overwrite=False) as writer:
        for rid, scheduled in enumerate(ledger.scheduled):
            due_class = ledger.due_class[rid]
            due = classes[due_class]
            outcome = ledger.outcome[rid]
            answered = outcome != Outcome.NO_ANSWER
            began = min(scheduled, ledger.sent[rid])
            parameters: dict[str, Any] = {}
            if due.timeout_us is not None:
                parameters["timeout"] = due.timeout_us
            if config.priority is not None:
                parameters["priority"] = config.priority
            pool = tensors[due_class]
            writer.write(CapturedRequest(
                arrival_ns=scheduled - first, protocol=protocol, model=config.model,
                version=None, request_id=f"bench-{rid}", inputs=pool[rid % len(pool)],
                outputs_wanted=None, parameters=parameters, due_in_ns=due.timeout_ns,
                priority=config.priority or 0, headers={}, trace_id=None,
                status=STATUS_OF[outcome], error=None,
                latency_ns=ledger.finished[rid] - began if answered else 0,
                answered_version=None, variant=None, outputs=None,
            ))  # fmt: skip
    return len(ledger.scheduled)
