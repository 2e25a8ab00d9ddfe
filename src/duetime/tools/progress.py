"""A live progress line on stderr for runs of more than a couple of seconds.

Redrawn in place (`\\r`) about twice a second when stderr is a terminal, printed as a plain line
every few seconds otherwise (a log or CI keeps it readable); nothing for short runs.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

REDRAW_S = 0.5
"""Between redraws on a terminal."""
LINE_S = 5.0
"""Between plain lines when stderr is not a terminal."""
MIN_RUN_S = 2.0
"""Runs expected to be shorter than this show nothing."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a run has done so far: the requests sent, the P99 of recent answers, and the ends
    that were no answer in time, by the final table's names (`sent` = ok + late + rejected +
    expired + errors, once all have ended)."""

    sent: int
    p99_us: float | None
    late: int = 0
    rejected: int = 0
    expired: int = 0
    errors: int = 0


class Progress:
    """Draws `snapshot()` on `stream` while started (on the running loop; `stop` clears it)."""

    def __init__(
        self, name: str, snapshot: Callable[[], Snapshot], stream: TextIO | None = None
    ) -> None:
        self.name = name
        self._snapshot = snapshot
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty()
        self._started = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._width = 0

    def start(self, expected_s: float) -> None:
        if expected_s < MIN_RUN_S:
            return
        self._started = time.monotonic()
        self._schedule()

    def _schedule(self) -> None:
        every = REDRAW_S if self._tty else LINE_S
        self._timer = asyncio.get_running_loop().call_later(every, self._draw)

    def _draw(self) -> None:
        line = self.line(time.monotonic() - self._started, self._snapshot())
        if self._tty:
            self._stream.write("\r" + line.ljust(self._width))
            self._width = len(line)
        else:
            self._stream.write(line + "\n")
        self._stream.flush()
        self._schedule()

    def line(self, elapsed_s: float, snap: Snapshot) -> str:
        rate = snap.sent / elapsed_s if elapsed_s > 0 else 0.0
        p99 = "-" if snap.p99_us is None else f"{snap.p99_us / 1000:.2f} ms"
        return (
            f"{self.name}: {elapsed_s:5.1f} s, sent {snap.sent:,} ({rate:,.0f}/s), "
            f"p99 {p99}, late {snap.late:,}, rejected {snap.rejected:,}, "
            f"expired {snap.expired:,}, errors {snap.errors:,}"
        )

    def stop(self) -> None:
        if self._timer is None:
            return
        self._timer.cancel()
        self._timer = None
        if self._tty and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
