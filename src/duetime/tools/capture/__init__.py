"""Traffic capture: a compact binary log of requests and their outcomes (`duetime serve
--record`), read back for replay and analysis. Layout: docs/capture-format.md.

    from duetime.tools.capture import CaptureWriter, read_capture
    for record in read_capture("traffic.cap"):
        record.model, record.arrival_ns, [t.array() for t in record.inputs]

Its parts: `format` (the record type, encoding, decoding), `writer`, `reader`, `recorder` (the
server's sampler and background writer), `jsonl` (hand-written JSON Lines to a capture) and
`cli` (`duetime capture convert | show`).
"""

from duetime.tools.capture.format import (
    CapturedRequest,
    CapturedTensor,
    CaptureFormatError,
    CaptureTruncated,
)
from duetime.tools.capture.reader import CaptureHeader, CaptureReader, read_capture
from duetime.tools.capture.writer import CaptureWriter

__all__ = [
    "CaptureFormatError",
    "CaptureHeader",
    "CaptureReader",
    "CaptureTruncated",
    "CaptureWriter",
    "CapturedRequest",
    "CapturedTensor",
    "read_capture",
]
