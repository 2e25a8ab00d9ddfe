"""GcPauses: how long Python's cyclic garbage collector stops the process, per generation.

Timed with `gc.callbacks` (a "start" and a "stop" call around each collection), counted into the
same fixed buckets as the request latencies. The callback runs on whichever thread triggered the
collection, holding the GIL; it is not on the request path unless a collection is.
"""

from __future__ import annotations

import gc
from typing import Any

from duetime.clock import Clock, MonotonicClock
from duetime.scheduling.scheduler import HistogramSnapshot, LatencyHistogram

GENERATIONS = 3


class GcPauses:
    """Records collection pauses while installed; `statistics()` may be read from any thread."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or MonotonicClock()
        self._histograms = [LatencyHistogram() for _ in range(GENERATIONS)]
        self._started_ns: int | None = None
        self._callback = self.on_gc  # one bound method, so `uninstall` removes what was added

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """The `gc.callbacks` entry: `phase` is "start" or "stop"; `info` names the generation."""
        if phase == "start":
            self._started_ns = self._clock.now_ns()
            return
        started, self._started_ns = self._started_ns, None
        generation = info.get("generation")
        if started is not None and isinstance(generation, int) and 0 <= generation < GENERATIONS:
            self._histograms[generation].observe(self._clock.now_ns() - started)

    def statistics(self) -> list[HistogramSnapshot]:
        """Pause durations per generation (index 0: the youngest)."""
        return [histogram.snapshot() for histogram in self._histograms]
