"""LoadShedder: keeps the event loop below saturation by refusing a share of new requests early.

The loop parses, validates, schedules and answers every request itself. When more arrive than it
can handle, every request waits in the kernel's socket buffers first, and all of them miss their
due times together. Refusing a request before its body is decoded costs a fraction of serving it,
so refusing *some* keeps the loop able to serve the rest on time. The shedder measures the loop
thread's demand over short periods (the CPU it used and the time it waited for a CPU: see
`LoadShedder.demand`) and adjusts the refused share: additive increase while the loop is busier
than the target *and* more than a share of requests (`MISSED_SHARE`) are failing their due
times (refused at admission or dropped as hopeless), a slow multiplicative decrease otherwise
(see `DECAY`). The second condition matters: a busy loop whose clients send no due times, or
meet them, is working, not overloaded, and clients that retry a refusal at once (a closed
loop) would only add load.

The share is of the loop's load, not of every model's requests: the shedder weighs what each
model's requests cost the loop (`Load`) and refuses the costliest models' first (see
`spread`), and priority-1 requests last. Pure apart from its clocks.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable

from duetime.errors import Shed

DECAY = 0.95
"""Each sample that does not call for more shedding keeps this much of the refused share: it
halves in about 140 ms, and is gone about 0.8 s after an overload ends. NOTE: at 0.8 (halved in
30 ms) a saturated loop swung between refusing too much and letting a flood in that left the
next requests to expire in the socket buffers: mlp at twice its capacity on the 2-core VM
(2/10 ms due times, 15,000 requests/s) answered 1,104-4,267 a second on time in 6 runs, and
2,206-5,896 (twice as many in 5 of 6 pairs, interleaved) at 0.95; 0.9 and 0.98 in between."""

MISSED_SHARE = 0.2
"""The share of the requests taken in since the last reading that may fail their due times
(refused at admission, dropped as hopeless) before a busy loop refuses more of its load.

NOTE: it was 0.05. Near its capacity a model's admission refuses some requests in every burst of
arrivals, a tight due time's more, and a busy loop's samples of 10 ms hold a few dozen requests
each: 5% was crossed by chance in many samples, each of which raised the share by a step that
then took 140 ms to decay. So a server with idle capacity between bursts shed a steady share of
its load. Measured on the 2-core VM, mlp over HTTP binary with 2/10 ms due times (half each),
two or three servers at once, their runs interleaved, in 39 pairs of 4 s runs at 3,000-9,000
requests/s (capacity drifted between about 2,500 and 4,500 a second meanwhile): at 0.2 more
answers on time in 27 of the 39 pairs. Averaged per rate and series, the ratio was 0.94 to
1.65 at 3,000-6,000/s (at 4,500/s, about 1.5x capacity then: 3,126 a second against 2,202,
6 of 6 pairs) and 1.09 at 9,000/s.
Higher shares took more of the decoding-then-refusing onto the loop at 2-3x capacity: at
9,000/s, 0.3 answered 9% fewer on time and 0.45 19% fewer than 0.05. resnet (10/50 ms due
times, 1,000 and 1,900 requests/s, 4 pairs each): within 3%, either way.
A loop that falls behind its sockets still sheds: its requests then expire, nearly all of
them (with the shedder off, mlp at 9,000/s expired 36,000 of 36,000)."""

MIN_SEEN = 10
"""Requests taken in, since the last reading that judged them, below which the share stays as
it is: a few failing is no overload. NOTE: reading one big body (a resnet batch as JSON) kept
the loop busy for tens of ms and its request, refused on its due time, was all it had seen: the
next requests of a lightly loaded server were shed with 429."""
MAX_PERIODS = 5.0
"""A sample counts as at most this many periods (one long stall moves the share by 5 steps)."""

FIXED_COST_BYTES = 4096
"""What a request costs apart from its body, in body bytes: its weight is this plus its body's
size. A proxy: the bytes stand for the decoding a body brings to the loop and the run it asks
of the CPUs the loop shares; the fixed part keeps a flood of tiny requests from weighing
nothing. NOTE: at 16 KB the demo orderbook (300/s, 0.5 KB bodies) weighed 5% beside resnet at
1,500/s (48 KB bodies), and a refused share near the cap (0.95) cut it to one level with the
flood (water-filling), refusing half its requests; at 4 KB it weighs 1.7%, under that level."""
COST_KEEP = 0.9
"""Each period keeps this much of a class's weighed cost (an EWMA over ~100 ms): a flood's
weight builds within a few periods and a burst's is forgotten in about a second."""
WATCH_DEMAND = 0.5
"""The loop's demand above which requests are weighed (see `LoadShedder.watching`): their
costs are known before the share rises, and an idle loop spends nothing on them."""
MAX_CLASSES = 256
"""Classes (model, priority 1 or not) weighed at most, besides the two of no model, with which
requests of further models are weighed. Callers name only models their router serves."""
FORGOTTEN = 1.0
"""A class whose weighed cost (bytes a period) falls below this, with nothing new, is dropped."""

Key = tuple[str | None, bool]
"""A class of requests: their model (None: not known, as gRPC's refused unread) and whether
they have priority 1 (the highest: refused last)."""


class Load:
    """What one class of requests costs the loop, and the share of them refused now."""

    __slots__ = ("arrived", "cost", "credit", "share")

    def __init__(self) -> None:
        self.arrived = 0.0
        """Bytes (body and `FIXED_COST_BYTES` each) come since the last sample."""
        self.cost = 0.0
        """Bytes a period, weighed over the recent periods (EWMA, see `COST_KEEP`)."""
        self.credit = 0.0
        self.share: float | None = None
        """The share of its requests refused (None: the shedder's own share: see `refuse`)."""


class LoadShedder:
    """Decides, per new request, whether to refuse it to keep the loop's CPU use near `target`."""

    def __init__(
        self,
        *,
        target: float = 0.85,
        step: float = 0.05,
        max_share: float = 0.95,
        missed_share: float = MISSED_SHARE,
        decay: float = DECAY,
        cpu_clock: Callable[[], float] = time.thread_time,
        wall_clock: Callable[[], float] = time.monotonic,
        wait_clock: Callable[[], float] | None = None,
        period: float = 0.01,
        idle: Callable[[str, str | None], bool] | None = None,
    ) -> None:
        self.target = target
        self._idle = idle
        """Whether a model (a version of it; None: its default) has capacity idle now
        (`Engine.has_idle_capacity`): its requests are not refused then (see `refuse`)."""
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
        self.refused = 0
        self.refused_by_model: dict[str, int] = {}
        """Requests refused, by model ("": not known); only models callers name."""
        self.watching = False
        """Whether callers should weigh each request (`refuse`): the loop is busy (see
        `WATCH_DEMAND`) or shedding."""
        self._loads: dict[Key, Load] = {}
        self._spread_on = False
        """Whether the classes' shares were spread since the share last rose from 0: a class
        new since the last sample is then refused nothing until the next (see `refuse`)."""
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
        if self._loads:
            self._weigh(periods)
        self._control(totals, queued, periods)
        self.watching = self.share > 0.0 or self.demand > WATCH_DEMAND
        if not self.share:
            self._spread_on = False
        elif self._loads:
            self._spread()

    def _control(
        self, totals: Callable[[], tuple[int, int]] | None, queued: bool, periods: float
    ) -> None:
        """Move the refused share (see `sample`)."""
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

    def _weigh(self, periods: float) -> None:
        """Fold each class's arrivals since the last sample into its weighed cost; forget the
        classes nothing came for a while."""
        keep = COST_KEEP**periods
        forgotten = []
        for key, load in self._loads.items():
            load.cost = load.cost * keep + load.arrived / periods * (1.0 - keep)
            if load.cost < FORGOTTEN and not load.arrived:
                forgotten.append(key)
            load.arrived = 0.0
        for key in forgotten:
            del self._loads[key]

    def _spread(self) -> None:
        """Set each class's refused share so that the refused cost is about `share` of the
        loop's load (see `spread`)."""
        shares = spread(self.costs(), self.share, self._max_share)
        for key, load in self._loads.items():
            load.share = shares[key]
        self._spread_on = True

    def costs(self) -> dict[Key, float]:
        """Each class's weighed cost now (bytes a period; see `Load.cost`): a copy."""
        return {key: load.cost for key, load in self._loads.items()}

    def refuse(
        self,
        model: str | None = None,
        size: int = 0,
        top: bool = False,
        version: str | None = None,
    ) -> bool:
        """Whether to refuse this request, of `model` (None: not known; name only models the
        router serves: see `MAX_CLASSES`), with a body of `size` bytes and priority 1 or not
        (`top`): true for its class's refused share of its requests (spread evenly, no
        randomness; see `spread`). A class new since the last sample is refused nothing till
        the next, or the shedder's own share before any spread (one set by hand). It weighs
        the request too: call it for every request while `watching`.
        Counted in `refused` and `refused_by_model`.

        A request of a model (`version`: the one it asks for, None its default) with capacity
        idle now (the shedder's `idle`, asked only of a request about to be refused) is never
        refused: it would wait for nothing. The refusal passes to the next request of its class
        (one refusal is carried at most, so a run of them does not refuse as many in a row
        later). Its model takes it at once, so the next finds it busy: a flood lets through
        about one request per idle spell of each instance, however long the loop's turns.

        NOTE: without it, a closed-loop flood (16 connections resending each 429 at once) of
        a model with 256 KB bodies (9-15 ms a run) held the share at its cap, its model idle
        83% of the time: a refusal costs the loop about what taking the request in would (the
        body is read either way), its client resends at once (the loop stays saturated), and
        the few requests let through, one in 20, missed their due times in the busy loop, which
        kept the share up. 101 answers/s on time with one connection, 5/s with 16."""
        loads = self._loads
        key = (model, top)
        load = loads.get(key)
        if load is None:
            if len(loads) >= MAX_CLASSES:
                key = (None, top)
                load = loads.get(key)
            if load is None:
                load = loads[key] = Load()
                if self._spread_on:
                    # NOTE: at the share, a light model's class, forgotten while its requests
                    # waited in their sockets behind a flood, came back refused at 95%
                    load.share = 0.0
        load.arrived += FIXED_COST_BYTES + size
        if self.share <= 0.0:
            return False
        share = self.share if load.share is None else load.share
        if share <= 0.0:
            return False
        load.credit += share
        if load.credit < 1.0:
            return False
        idle = self._idle
        if idle is not None and model is not None and idle(model, version):
            load.credit = min(load.credit, 1.0)
            return False
        load.credit -= 1.0
        self._count(model)
        return True

    @property
    def saturated(self) -> bool:
        """Whether the loop is past its target (its demand, see `demand`) or requests are being
        refused: a request due before the loop could take it is refused then (see
        `refuse_due`)."""
        return self.share > 0.0 or self.demand > self.target

    def refuse_due(self, model: str | None = None) -> None:
        """Count a request of `model` (as `refuse` names it) refused for its due time while the
        loop is saturated (its timeout no longer than the loop's lag: see the HTTP front
        end's `_due`), weighed already (`refuse` let it through), in `refused` and
        `refused_by_model`. It is no miss: its refusal keeps the loop's time for requests that
        can still be answered."""
        self._count(model)

    def _count(self, model: str | None) -> None:
        """Count a refusal of a request of `model` in `refused` and `refused_by_model`."""
        self.refused += 1
        name = model or ""
        counts = self.refused_by_model
        if name not in counts and len(counts) >= MAX_CLASSES:
            name = ""
        counts[name] = counts.get(name, 0) + 1

    def refusing(self, model: str | None) -> bool:
        """Whether a request of `model` (as `refuse` takes it) may be refused now: its class's
        refused share, or its priority-1 class's, is above 0 (a class not weighed yet: as
        `refuse` would treat it). Only then does its priority matter (see `refuse`'s `top`)."""
        if self.share <= 0.0:
            return False
        loads = self._loads
        for top in (False, True):
            load = loads.get((model, top))
            if load is None and len(loads) >= MAX_CLASSES:
                load = loads.get((None, top))
            if load is None:
                share = 0.0 if self._spread_on else self.share
            else:
                share = self.share if load.share is None else load.share
            if share > 0.0:
                return True
        return False

    def check(self) -> None:
        """Raise Overloaded for the current share of calls of no known model (see `refuse`)."""
        if self.refuse():
            raise self.refusal()

    def refusal(self) -> Shed:
        """The error a refused call gets."""
        return Shed(
            f"the server is saturated (its event loop is {self.demand:.0%} busy or waiting for a "
            f"CPU, refusing {self.share:.0%} of its load, the costliest models' requests "
            "first); retry later or on another replica",
            retry_after_s=0.01,
        )


def spread(costs: dict[Key, float], share: float, max_share: float) -> dict[Key, float]:
    """The refused share of each class's requests, for a refused `share` of the total cost:
    taken from the costliest classes first, none above `max_share`; priority-1 classes only
    for what the others' whole cost cannot cover.

    The classes are cut down to one level (water-filling): each class costing more than the
    level is refused what it costs above it, and the level is where that sums to the refused
    cost. A class costing less than the level loses nothing: refusing a light model's requests
    frees little of the loop. The cap then lowers a class's share without moving the level,
    so the refused cost falls short of `share` rather than take the rest from lighter classes.

    NOTE: one share for every request refused orderbook (a 20 µs model at 300/s, 20 ms due
    times) 44-88% beside a resnet flood at 2.5x its capacity (the flood's own misses kept the
    share up), and its on-time share fell from 99% to 0.5-21%; a flood without due times
    had the victim's own misses shed the victim. With the cap's shortfall taken from lighter
    classes, orderbook (0.5% of the cost) would be refused 94% once the share reached 0.95."""
    total = sum(costs.values())
    refused_cost = share * total
    top = [c for (_, is_top), c in costs.items() if is_top]
    rest = [c for (_, is_top), c in costs.items() if not is_top]
    rest_cost = sum(rest)
    rest_level = _level(rest, min(refused_cost, rest_cost))
    top_level = _level(top, max(0.0, refused_cost - rest_cost))
    shares = {}
    for key, cost in costs.items():
        level = top_level if key[1] else rest_level
        cut = 0.0 if cost <= level else min(max_share, 1.0 - level / cost)
        shares[key] = round(cut, 6)  # (a whole share stays whole: see `LoadShedder.refuse`)
    return shares


def _level(costs: Iterable[float], refused: float) -> float:
    """The level above which `costs` sum to `refused` (no more than their sum)."""
    ordered = sorted(costs, reverse=True)
    if refused <= 0.0 or not ordered:
        return ordered[0] if ordered else 0.0
    above = 0.0
    for count, cost in enumerate(ordered, 1):
        above += cost
        level = (above - refused) / count
        following = ordered[count] if count < len(ordered) else 0.0
        if level >= following:
            return max(0.0, level)
    return 0.0


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
