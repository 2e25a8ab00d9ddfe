"""Ctrl-C during `duetime bench` and `duetime replay`, the way wrk and hey take it: stop sending,
wait briefly for the answers owed, print the report of what was measured so far (marked as
interrupted), write --json, and exit 130 without a traceback.

A run owns its event loop (`Interrupt.run`); SIGINT then goes to `Interrupt.fire` on that loop
instead of raising KeyboardInterrupt wherever the main thread happens to be (which left tasks
and gRPC channels behind and the loop closed under them). Before sending starts there is
nothing to report: the run is cancelled (its cleanup runs) and KeyboardInterrupt comes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Awaitable, Coroutine, Iterator
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

INTERRUPTED_DRAIN_S = 1.0
"""After Ctrl-C, the longest wait for answers still owed (--drain, if shorter, wins); a second
Ctrl-C ends the wait at once."""
EXIT_CODE = 130
"""The exit status of a run stopped by Ctrl-C (128 + SIGINT), as shells report it."""


class Interrupt:
    """SIGINT for one run: `stopped` is set by the first, `again` by the next ones.

    While `sending` is False (setup) a SIGINT cancels the task `run` drives instead; the code
    that sends sets `sending` and watches `stopped`.
    """

    def __init__(self) -> None:
        self.count = 0
        self.sending = False
        self.stopped = asyncio.Event()
        self.again = asyncio.Event()
        self._task: asyncio.Task[Any] | None = None

    @property
    def fired(self) -> bool:
        return self.count > 0

    def fire(self) -> None:
        """One Ctrl-C (on the loop's thread)."""
        self.count += 1
        if self.count > 1:
            self.again.set()
        self.stopped.set()
        if not self.sending and self._task is not None:
            self._task.cancel()

    def run(self, loop: asyncio.AbstractEventLoop, main: Coroutine[Any, Any, T]) -> T:
        """Run `main` to its end on `loop` (not running) with SIGINT handled as above; raises
        KeyboardInterrupt when Ctrl-C cancelled it before sending started."""
        task: asyncio.Task[T] = loop.create_task(main)
        self._task = task
        try:
            with self._handling(loop):
                return loop.run_until_complete(task)
        except asyncio.CancelledError:
            if self.fired:
                raise KeyboardInterrupt from None
            raise
        finally:
            self._task = None

    @contextlib.contextmanager
    def _handling(self, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        # NOTE: signal.signal rather than loop.add_signal_handler: removing the latter puts back
        # Python's default handler, not whatever was installed before (a test runner's, say).
        # The handler runs on the main thread between bytecodes, possibly inside a loop
        # callback: it only schedules `fire`.
        if threading.current_thread() is not threading.main_thread():
            yield  # signals only reach the main thread: nothing to catch here
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            loop.call_soon_threadsafe(self.fire)

        previous = signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    async def first(self, sending: Awaitable[None]) -> bool:
        """Await `sending`, or stop at the first Ctrl-C (`sending` is then cancelled); True if
        Ctrl-C came first."""
        await _until_either(sending, self.stopped)
        return self.stopped.is_set()

    async def drain(self, drained: Awaitable[None]) -> None:
        """Await `drained` unless Ctrl-C comes (again) meanwhile: the first Ctrl-C of a run that
        had sent everything ends its wait for answers at once."""
        await _until_either(drained, self.again if self.fired else self.stopped)

    def drain_s(self, drain_s: float) -> float:
        """How long to wait for the answers owed: --drain, or less once interrupted."""
        return min(drain_s, INTERRUPTED_DRAIN_S) if self.fired else drain_s


async def _until_either(work: Awaitable[None], event: asyncio.Event) -> None:
    """Await `work` until it ends or `event` is set; `work` is cancelled if it has not ended."""
    task = asyncio.ensure_future(work)
    waiting = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
