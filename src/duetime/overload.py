"""LoadShedder: keeps the event loop below saturation by refusing a share of new requests early.

The loop parses, validates, schedules and answers every request itself. When more arrive than it
can handle, every request waits in the kernel's socket buffers first, and all of them miss their
due times together. Refusing a request before its body is decoded costs a fraction of serving it,
so refusing *some* keeps the loop able to serve the rest on time. The shedder measures the loop
thread's demand over short periods (the CPU it used and the time it waited for a CPU: see
`LoadShedder.demand`) and adjusts the refused share: additive increase while the loop is busier
than the target *and* requests are failing their due times (refused at admission
or dropped as hopeless), a slow multiplicative decrease otherwise (see `DECAY`). The second
condition matters: a busy loop whose clients send no due times, or meet them, is working, not
overloaded, and clients that retry a refusal at once (a closed loop) would only add load. Pure
apart from its clocks.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

from duetime.errors import Overloaded

DECAY = 0.95
"""Each sample that does not call for more shedding keeps this much of the refused share: it
halves in about 140 ms, and is gone about 0.8 s after an overload ends. NOTE: at 0.8 (halved in
30 ms) a saturated loop swung between refusing too much and letting a flood in that left the
next requests to expire in the socket buffers: mlp at twice its capacity on the 2-core VM
(2/10 ms due times, 15,000 requests/s) answered 1,104-4,267 a second on time in 6 runs, and
2,206-5,896 (twice as many in 5 of 6 pairs, interleaved) at 0.95; 0.9 and 0.98 in between."""


MIN_SEEN = 10
"""Requests taken in, since the last reading that judged them, below which the share stays as
it is: a few failing is no overload. NOTE: reading one big body (a resnet batch as JSON) kept
the loop busy for tens of ms and its request, refused on its due time, was all it had seen: the
next requests of a lightly loaded server were shed with 429."""
MAX_PERIODS = 5.0
"""A sample counts as at most this many periods (one long stall moves the share by 5 steps)."""


class LoadShedder:
    """Decides, per new request, whether to refuse it to keep the loop's CPU use near `target`."""

    def __init__(
        self,
        *,
        target: float = 0.85,
        step: float = 0.05,
        max_share: float = 0.95,
        missed_share: float = 0.05,
        decay: float = DECAY,
        cpu_clock: Callable[[], float] = time.thread_time,
        wall_clock: Callable[[], float] = time.monotonic,
        wait_clock: Callable[[], float] | None = None,
        period: float = 0.01,
    ) -> None:
        self.target = target
        self.share = 0.0
        """The share of new requests refused now (0: none)."""
        self.utilization = 0.0
        """The loop thread's CPU use over the last period (1.0: always busy)."""
        self._step = step
        self._decay = decay
        self._missed_share = missed_share
        self._missed = 0
        self._seen = 0
        self._max_share = max_share
        self._cpu_clock = cpu_clock
        self._wall_clock = wall_clock
        self._wait_clock = wait_clock or RunQueueWait()
        self._waited: float | None = None if wait_clock is None else wait_clock()
        """(None: not read yet; the thread's own clock is read first by its first sample)"""
        self.demand = 0.0
        """The loop thread's CPU use and its wait for a CPU over the last period: what it would
        have used of a CPU of its own (1.0: saturated); it is what the target is for.

        NOTE: its CPU use alone misses a loop whose core is shared (a client, another process
        on it): resnet at twice its capacity on the 2-core VM, the load generator on the loop's
        core, the loop used 60% of the core, never the target, while it lagged behind its
        sockets, and 5% of the answers were late (1,017 of 19,199 over 6 runs of 5 s) and a
        quarter of the requests expired; counting the wait too (A/B alternating in one
        sitting, 6 runs each): 107 of 22,169 late (99.5% on time), goodput 735 against 606
        a second (capacity 690-720), P50 10 ms against 42."""
        self._cpu = cpu_clock()
        self._wall = wall_clock()
        self._credit = 0.0
        self.refused = 0
        self._period = period
        """How often `sample` is meant to be called (s): the share moves by the periods passed.

        NOTE: not a busy signal when late: a loop descheduled by other processes (a test suite's
        run beside it) came late to its samples with one refused request in sight, and shed the
        next ones with 429; a loop behind its sockets tells itself (see `sample`'s `queued`)."""

    def sample(
        self, totals: Callable[[], tuple[int, int]] | None = None, queued: bool = False
    ) -> None:
        """Measure the loop's CPU use since the last call and adjust the refused share.

        `totals` gives `(missed, seen)`, running totals over all models: requests that failed
        their due time (refused at admission, dropped as hopeless) and all requests the
        schedulers took in. It is read only while the loop is busier than the target, or
        `queued` says requests wait that the loop has not taken (None: do not adjust, only start
        measuring). Call it on the loop thread (its CPU time is what is measured) every few ms.

        NOTE: `queued` is gRPC's: at 1,200 calls/s (mlp, 5 ms timeouts) the loop thread was
        67-80% busy, below the target, while 200-400 calls waited in gRPC's core (its poller
        thread and the GIL took the rest), and none was shed.

        NOTE: reading every scheduler's totals every 10 ms took 40-90 µs on an idle server
        (cold caches), in the way of any request that came meanwhile; below the target a
        sample is two clock reads. Totals are then read over a longer span, from the last
        reading, which only dilutes the first reading of an overload.
        """
        cpu, wall = self._cpu_clock(), self._wall_clock()
        elapsed = wall - self._wall
        if elapsed <= 0:
            return
        self.utilization = min(1.0, (cpu - self._cpu) / elapsed)
        self._cpu, self._wall = cpu, wall
        waited, before = self._wait_clock(), self._waited
        self._waited = waited
        if before is not None:
            self.demand = min(1.0, self.utilization + (waited - before) / elapsed)
        # (the share moves by wall time: a busy loop samples less often)
        periods = max(1.0, min(MAX_PERIODS, elapsed / self._period))
        if (queued or self.demand > self.target) and totals is not None:
            missed, seen = totals()
            new_missed, new_seen = missed - self._missed, seen - self._seen
            if new_seen < MIN_SEEN:  # (too few to tell: counted with the next reading's)
                return
            self._missed, self._seen = missed, seen
            if new_missed > self._missed_share * new_seen:  # failing
                self.share = min(self._max_share, self.share + self._step * periods)
                return
        if self.share:
            self.share *= self._decay**periods
            if self.share < 0.01:
                self.share = 0.0

    def refuse(self) -> bool:
        """Whether to refuse this call: true for the current share of calls (spread evenly, no
        randomness); counted in `refused`."""
        if self.share <= 0.0:
            return False
        self._credit += self.share
        if self._credit < 1.0:
            return False
        self._credit -= 1.0
        self.refused += 1
        return True

    def check(self) -> None:
        """Raise Overloaded for the current share of calls (see `refuse`)."""
        if self.refuse():
            raise self.refusal()

    def refusal(self) -> Overloaded:
        """The error a refused call gets."""
        return Overloaded(
            f"the server is saturated (its event loop is {self.demand:.0%} busy or waiting for a "
            f"CPU, refusing "
            f"{self.share:.0%} of new requests); retry later or on another replica",
            retry_after_s=0.01,
        )


class RunQueueWait:
    """The calling thread's time spent runnable but waiting for a CPU so far, in seconds
    (Linux's /proc/thread-self/schedstat, ~4 µs a reading; 0.0 where it cannot be read). The
    file is opened at the first reading, by the thread that reads: call it on the thread
    measured. Its descriptor is closed with it."""

    __slots__ = ("_fd",)

    def __init__(self) -> None:
        self._fd: int | None = None
        """(None: not opened yet; -1: cannot be)"""

    def __call__(self) -> float:
        fd = self._fd
        if fd is None:
            try:
                fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                fd = -1
            self._fd = fd
        if fd < 0:
            return 0.0
        try:
            return int(os.pread(fd, 64, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0

    def __del__(self) -> None:
        fd = self._fd
        if fd is not None and fd >= 0:
            self._fd = -1
            with contextlib.suppress(OSError):
                os.close(fd)
