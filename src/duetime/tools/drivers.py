"""The two ways the load generator sends: an open loop on a schedule, and closed-loop clients.

Both record every request in a `Ledger` (plain lists, appended on the hot path) and hand it to
a `Transport`, which reports each end through `Ledger.finish`. Nothing here encodes anything:
payloads are built before the run and only picked from a pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

from duetime.tools.outcomes import DUE_PASSED_UNSENT, Outcome
from duetime.tools.payloads import restamp
from duetime.tools.progress import Snapshot
from duetime.tools.report import MAX_MESSAGES, Records
from duetime.tools.transports import BenchError, Transport

Clock = Callable[[], int]
"""Monotonic time in ns (`time.perf_counter_ns`)."""

GROUP_NS = 20_000
"""The timer thread wakes the loop once for sends this close together: each wake also sends
what is due this soon."""
SWITCH_INTERVAL_S = 0.0002
"""The GIL hand-over interval while a timer thread paces sends (see `paced_switching`)."""
MAX_WAIT_S = 3600.0
"""The longest single wait of the timer thread (a longer delay waits in steps)."""
FIRST_BACKOFF_S = 0.001
MAX_BACKOFF_S = 0.1
"""A closed-loop client whose request found no connection to the server waits FIRST_BACKOFF_S
before the next, doubling after each further one up to MAX_BACKOFF_S."""


class Ledger:
    """Every request of one run, by request id: its schedule, class, send and end times, outcome.

    `on_finish`, when set, runs after each request ends (closed-loop clients resend from it).
    `timeouts_ns` (by due class) lets the progress line count late answers as they come; the
    report settles them again from the arrays (`report.apply_due`).
    """

    def __init__(
        self, clock: Clock = time.perf_counter_ns, timeouts_ns: Sequence[int | None] = ()
    ) -> None:
        self.clock = clock
        self.timeouts_ns = tuple(timeouts_ns)
        self.scheduled: list[int] = []
        self.sent: list[int] = []
        self.due_class: list[int] = []
        self.finished: list[int] = []
        self.outcome: list[int] = []
        self.messages: list[str] = []
        self.cut_short: list[int] = []
        """Requests the client stopped waiting for (late, with a message saying why)."""
        self.unsent_expired: list[int] = []
        """Requests ended EXPIRED without being sent: their due time passed while they waited
        for a free connection (`DUE_PASSED_UNSENT`)."""
        self.outstanding = 0
        self.ends = [0] * len(Outcome)
        """Requests ended, by outcome (indexed by `Outcome`; NO_ANSWER unused)."""
        self.on_finish: Callable[[int], None] | None = None
        self._idle: asyncio.Future[None] | None = None

    def add(self, scheduled_ns: int | None, due_class: int) -> int:
        """Record a request going out now; returns its id. `scheduled_ns` None: sent on demand."""
        now = self.clock()
        rid = len(self.sent)
        self.scheduled.append(now if scheduled_ns is None else scheduled_ns)
        self.sent.append(now)
        self.due_class.append(due_class)
        self.finished.append(0)
        self.outcome.append(Outcome.NO_ANSWER)
        self.outstanding += 1
        return rid

    def finish(
        self, rid: int, outcome: Outcome, message: str | None, at_ns: int | None = None
    ) -> None:
        """Record the end of request `rid`, now or at `at_ns` (when its answer came, if the
        transport knows it came before it was read); a second report for it is ignored."""
        if self.outcome[rid] != Outcome.NO_ANSWER:
            return
        now = self.finished[rid] = self.clock() if at_ns is None else at_ns
        self.outcome[rid] = outcome
        self.outstanding -= 1
        self.ends[self._settled(rid, outcome, now)] += 1
        failed = outcome == Outcome.ERROR or outcome == Outcome.UNSENT
        if failed and message and len(self.messages) < MAX_MESSAGES:
            self.messages.append(message)
        if outcome == Outcome.LATE and message:
            self.cut_short.append(rid)
        elif outcome == Outcome.EXPIRED and message == DUE_PASSED_UNSENT:
            self.unsent_expired.append(rid)
        if self.on_finish is not None:
            self.on_finish(rid)
        if self.outstanding == 0 and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    def time_left_us(self, rid: int) -> int | None:
        """What is left now of request `rid`'s due time (its class's timeout from when it was
        scheduled or sent, the earlier), in µs: 0 once it has passed; None if its class has
        none."""
        if not self.timeouts_ns:
            return None
        timeout_ns = self.timeouts_ns[self.due_class[rid]]
        if timeout_ns is None:
            return None
        began = min(self.scheduled[rid], self.sent[rid])
        return max(0, (began + timeout_ns - self.clock()) // 1000)

    async def drained(self, timeout_s: float) -> None:
        """Wait until no request is owed an answer, or `timeout_s` passes."""
        if self.outstanding == 0:
            return
        self._idle = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle, timeout_s)

    def _settled(self, rid: int, outcome: Outcome, now: int) -> Outcome:
        """LATE for an OK answer after its class's timeout, as the report will settle it."""
        if outcome != Outcome.OK or not self.timeouts_ns:
            return outcome
        timeout_ns = self.timeouts_ns[self.due_class[rid]]
        began = min(self.scheduled[rid], self.sent[rid])
        return Outcome.LATE if timeout_ns is not None and now - began > timeout_ns else outcome

    def snapshot(self, recent: int = 2000) -> Snapshot:
        """Sent so far, the ends that were no answer in time (by the report's names), and the
        P99 of the last `recent` sends answered (progress)."""
        ends = self.ends
        sent = len(self.sent)
        tail = slice(max(0, sent - recent), sent)
        finished = np.asarray(self.finished[tail], dtype=np.int64)
        began = np.minimum(self.scheduled[tail], self.sent[tail])
        answered = (finished > 0) & (np.asarray(self.outcome[tail]) == Outcome.OK)
        p99_us = None
        if answered.any():
            p99_us = float(np.percentile(finished[answered] - began[answered], 99)) / 1000
        return Snapshot(
            sent - ends[Outcome.UNSENT], p99_us, late=ends[Outcome.LATE],
            rejected=ends[Outcome.REJECTED], expired=ends[Outcome.EXPIRED],
            errors=ends[Outcome.ERROR] + ends[Outcome.UNSENT],
        )  # fmt: skip

    def records(
        self, window: tuple[int, int], cpu_s: float, waited: int, *, interrupted: bool = False,
        read_late: int = 0,
    ) -> Records:  # fmt: skip
        """The requests scheduled inside `window` (ns, start inclusive), as arrays; those that
        were never sent (UNSENT) only counted. `waited` and `read_late`: the transport's counts
        over the window."""
        scheduled = np.asarray(self.scheduled, dtype=np.int64)
        sent = np.asarray(self.sent, dtype=np.int64)
        finished = np.asarray(self.finished, dtype=np.int64)
        outcome = np.asarray(self.outcome, dtype=np.int8)
        inside = (scheduled >= window[0]) & (scheduled < window[1])
        unsent = inside & (outcome == Outcome.UNSENT)
        keep = inside & ~unsent
        cut = scheduled[np.asarray(self.cut_short, dtype=np.int64)]
        answered = outcome[keep] != Outcome.NO_ANSWER
        latency = finished[keep] - np.minimum(scheduled[keep], sent[keep])
        succeeded = (outcome[keep] == Outcome.OK) | (outcome[keep] == Outcome.LATE)
        last_answer = finished[keep][succeeded].max(initial=window[0]) - window[0]
        return Records(
            due_class=np.asarray(self.due_class, dtype=np.int64)[keep],
            outcome=outcome[keep],
            latency_ns=np.where(answered, latency, 0),
            send_lag_ns=sent[keep] - scheduled[keep],
            duration_s=(window[1] - window[0]) / 1e9,
            cpu_s=cpu_s,
            waited=waited,
            read_late=read_late,
            error_messages=tuple(self.messages),
            scheduled_ns=scheduled[keep] - window[0],
            interrupted=interrupted,
            cut_short=int(np.count_nonzero((cut >= window[0]) & (cut < window[1]))),
            unsent=int(np.count_nonzero(unsent)),
            unsent_class=np.asarray(self.due_class, dtype=np.int64)[unsent],
            last_answer_s=max(0, int(last_answer)) / 1e9,
        )


class Dispatch:
    """Sends one request: records it in the ledger and hands its class's next payload over.

    A request sent after its scheduled instant carries only the time left of its due time (the
    schedule's instant + the class's timeout), as a client with a deadline does: the generator's
    own lateness shortens the server's budget instead of being counted against its answer.
    """

    def __init__(
        self, ledger: Ledger, transport: Transport, payloads: Sequence[Sequence[Any]]
    ) -> None:
        self.ledger = ledger
        self.transport = transport
        self.payloads = payloads
        self.restamped = 0
        """Requests sent late enough to carry less than their class's timeout (the ledger's)."""

    def send(self, scheduled_ns: int | None, due_class: int, lane: int | None) -> int:
        ledger = self.ledger
        rid = ledger.add(scheduled_ns, due_class)
        pool = self.payloads[due_class]
        payload = pool[rid % len(pool)]
        if scheduled_ns is not None and ledger.sent[rid] - scheduled_ns >= 1000:  # 1 µs late
            left = ledger.time_left_us(rid)
            if left is not None:
                self.restamped += 1
                payload = restamp(payload, max(1, left))  # (sent anyway: see `Dispatch`)
        self.transport.send(rid, payload, lane)
        return rid


class Sender(Protocol):
    """Sends a run's requests between two instants of the ledger's clock."""

    async def run(self, start_ns: int, stop_ns: int) -> None:
        """Send from `start_ns`; return once nothing more is to be sent (at about `stop_ns`)."""

    def stop(self) -> None:
        """Send nothing more."""


class OpenLoop:
    """Sends request i at `start + offsets[i]`, whatever the answers do (no coordinated omission).

    A timer thread wakes the loop at each send instant (uvloop's own timers only resolve
    milliseconds); each wake sends every request due by then (or within GROUP_NS). The schedule
    itself says when sending ends.

    Each answer also sends what has fallen due (`_catch_up`): under load one turn of the loop
    reads hundreds of answers, and a wake from the timer thread waits for that turn to end, so
    sends went out late by a turn's length (p99 1.8 ms at 15,000 requests/s on a 2-core VM) and
    their requests were counted late for the generator's own delay.
    """

    def __init__(self, dispatch: Dispatch, offsets_ns: np.ndarray, classes: np.ndarray) -> None:
        self._dispatch = dispatch
        self._clock = dispatch.ledger.clock
        self._start = 0
        self._offsets: list[int] = offsets_ns.tolist()
        self._classes: list[int] = classes.tolist()
        self._next = 0
        self._loop = asyncio.get_running_loop()
        self._done: asyncio.Future[None] = self._loop.create_future()
        self._waker: Waker | None = None

    async def run(self, start_ns: int, stop_ns: int) -> None:
        self._start = start_ns
        if not self._offsets:
            return
        self._dispatch.ledger.on_finish = self._catch_up
        instants = (start_ns + o for o in self._offsets)
        self._waker = Waker(self._loop, instants, self._tick, failed=self._timer_failed)
        self._waker.start()
        try:
            await self._done
        finally:
            self._waker.stop()

    def stop(self) -> None:
        self._next = len(self._offsets)
        if self._waker is not None:
            self._waker.stop(join=False)
        if not self._done.done():
            self._done.set_result(None)

    def _timer_failed(self, exc: BaseException) -> None:
        if not self._done.done():
            self._done.set_exception(timer_failure(exc))

    def _catch_up(self, rid: int) -> None:
        i = self._next
        if i < len(self._offsets) and self._start + self._offsets[i] <= self._clock():
            self._tick()

    def _tick(self) -> None:
        offsets, classes, send = self._offsets, self._classes, self._dispatch.send
        start, count, i = self._start, len(offsets), self._next
        horizon = self._clock() + GROUP_NS - start
        while i < count and offsets[i] <= horizon:
            send(start + offsets[i], classes[i], None)
            i += 1
        self._next = i
        if i >= count:
            self.stop()


class Waker(threading.Thread):
    """Calls `tick` on `loop` at each of `instants` (perf_counter ns, ascending; instants within
    GROUP_NS of the last wake share it): precise sleeps on a thread of their own."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        instants: Iterable[int],
        tick: Callable[[], None],
        failed: Callable[[BaseException], None] | None = None,
    ) -> None:
        super().__init__(name="duetime-send-timer", daemon=True)
        self._loop = loop
        self._instants = instants
        self._tick = tick
        self._failed = failed
        """Called on `loop` with what the thread raised, if it dies: the run it paces must end
        (it waits for the last send, which would never come)."""
        self._stopped = threading.Event()

    def stop(self, join: bool = True) -> None:
        self._stopped.set()
        if join and self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)

    def run(self) -> None:
        try:
            self._wake_each()
        except BaseException as exc:
            if self._failed is None:
                raise
            with contextlib.suppress(RuntimeError):  # (the loop closed: the run is over)
                self._loop.call_soon_threadsafe(self._failed, exc)

    def _wake_each(self) -> None:
        clock, stopped, wake = time.perf_counter_ns, self._stopped, self._loop.call_soon_threadsafe
        last = -GROUP_NS
        for at in self._instants:
            if at - last < GROUP_NS:
                continue
            last = at
            # NOTE: in steps: one wait past threading.TIMEOUT_MAX raises OverflowError
            while (delay := at - clock()) > 0:
                if stopped.wait(min(delay / 1e9, MAX_WAIT_S)):
                    return
            if stopped.is_set():
                return
            try:
                wake(self._tick)
            except RuntimeError:  # the loop closed under us: the run is over
                return


def timer_failure(exc: BaseException) -> BenchError:
    """What a run paced by a `Waker` raises when its thread died of `exc`."""
    return BenchError(f"the send timer thread failed: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def paced_switching() -> Iterator[None]:
    """While a timer thread paces sends: it needs the GIL to wake the loop, and Python's default
    hand-over interval (5 ms) would add that much to a send whenever the loop is busy."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))
    try:
        yield
    finally:
        sys.setswitchinterval(switch)


class ClosedLoop:
    """Clients, each on its own lane, sending the next request when the previous one ends.

    Classes are taken in turn from `classes` (a pre-drawn, seeded sequence). A client whose
    request found no connection (UNSENT: the server is not there) backs off before the next
    (FIRST_BACKOFF_S, doubling up to MAX_BACKOFF_S) instead of spinning on refused connections.
    """

    def __init__(self, dispatch: Dispatch, clients: int, classes: np.ndarray) -> None:
        self._dispatch = dispatch
        self._clients = clients
        self._classes: list[int] = classes.tolist()
        self._stop = 0
        self._lane_of: list[int] = []
        self._backoff_s = [0.0] * clients
        self._waits: list[asyncio.TimerHandle | None] = [None] * clients
        """Each lane's pending resend after a backoff."""
        dispatch.ledger.on_finish = self._next

    async def run(self, start_ns: int, stop_ns: int) -> None:
        clock = self._dispatch.ledger.clock
        await asyncio.sleep(max(0, start_ns - clock()) / 1e9)
        self._stop = stop_ns
        for lane in range(self._clients):
            self._send(lane)
        await asyncio.sleep(max(0, stop_ns - clock()) / 1e9)

    def stop(self) -> None:
        self._stop = 0
        for wait in self._waits:
            if wait is not None:
                wait.cancel()

    def _send(self, lane: int) -> None:
        rid = len(self._lane_of)
        self._lane_of.append(lane)
        self._dispatch.send(None, self._classes[rid % len(self._classes)], lane)

    def _next(self, rid: int) -> None:
        ledger, lane = self._dispatch.ledger, self._lane_of[rid]
        if ledger.clock() >= self._stop:
            return
        if ledger.outcome[rid] != Outcome.UNSENT:
            self._backoff_s[lane] = 0.0
            self._send(lane)
            return
        backoff = min(MAX_BACKOFF_S, max(FIRST_BACKOFF_S, 2 * self._backoff_s[lane]))
        self._backoff_s[lane] = backoff
        self._waits[lane] = asyncio.get_running_loop().call_later(backoff, self._resend, lane)

    def _resend(self, lane: int) -> None:
        self._waits[lane] = None
        if self._dispatch.ledger.clock() < self._stop:
            self._send(lane)


def cpu_seconds() -> float:
    """CPU time (user + system) this process has used so far, all threads included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def cpu_over(
    window: tuple[int, int], clock: Clock, stop: asyncio.Event | None = None
) -> float:
    """The process's CPU seconds between the two instants of `window` (waits for its end)."""
    return await growth_over(window, clock, cpu_seconds, stop)


_Counter = TypeVar("_Counter", int, float)


async def growth_over(
    window: tuple[int, int], clock: Clock, read: Callable[[], _Counter],
    stop: asyncio.Event | None = None,
) -> _Counter:  # fmt: skip
    """How much the counter `read` grew between the two instants of `window` (waits for its end);
    `stop` set (Ctrl-C) ends the window then (before it began: no growth)."""
    await _sleep_until(window[0], clock, stop)
    before = read()
    await _sleep_until(window[1], clock, stop)
    return read() - before


async def call_at(
    instant: int, clock: Clock, act: Callable[[], object], stop: asyncio.Event | None = None
) -> None:
    """Call `act` in a thread of its own at `instant` (the loop goes on sending meanwhile); not
    at all if `stop` is set (Ctrl-C) before."""
    await _sleep_until(instant, clock, stop)
    if stop is None or not stop.is_set():
        await asyncio.to_thread(act)


async def _sleep_until(instant: int, clock: Clock, stop: asyncio.Event | None) -> None:
    delay = max(0.0, (instant - clock()) / 1e9)
    if stop is None:
        await asyncio.sleep(delay)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), delay)
