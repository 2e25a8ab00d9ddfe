"""`duetime itch run`: replay an ITCH file through the book and ask a model on book events.

Each message is read, applied to its stock's level-3 book and turned into features the moment it
"arrives" (at the file's recorded pace, or as fast as the pipeline goes); a triggering event
sends one request whose due time is its arrival plus the deadline. The answer comes back through
a callback: on time, it is used (written as a prediction); late, it is counted and dropped.
Tick-to-prediction runs from the event's arrival to its answer.

A live feed (`run_live`, `duetime itch listen`) is the same pipeline with the feed's own pace:
each datagram's messages arrive when it is received.

Everything runs on one event loop — the engine's, for the in-process Engine — so a request goes
from the feed to the scheduler without a thread hop, and answers are taken whenever the feed
yields: while it waits for the next message's time, and every few messages at full pace. A
predictor whose answers come from elsewhere (a remote server) keeps the loop turning while the
feed waits, and holds at most `max_in_flight` requests out: the events meanwhile go together.

Events that arrive together (a sweep's, a datagram's) go together too, one request of a row
each, bound by the due time of its first event: a burst is asked for when it fills a batch,
when the feed would wait for the next message, or as soon as waiting for one more event would
leave the first one too little time for its answer (`FeedRun._must_ask`). An event whose due
time passed before the feed could ask for it is refused unasked, never sent with those that
can still be answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import numpy as np

from duetime.feeds.itch.book import ANOMALY_KINDS, BookEvent, Books
from duetime.feeds.itch.features import FEATURE_NAMES, Features
from duetime.feeds.itch.predictors import Failure, Predictor, PredictorError, event_rows
from duetime.feeds.itch.spec import AddOrder, OrderDelete
from duetime.feeds.itch.tally import FeedStatistics, PredictionLog, RunStats

if TYPE_CHECKING:  # (fastfeed needs numba, the `duetime[itch]` extra)
    from duetime.feeds.itch.fastfeed import FastFeed, FastWarmer

Pace = Literal["recorded", "max"]

WINDOW_EVENTS = 100
WINDOW_LEVELS = 10
DEEPLOB_SHAPE = (WINDOW_EVENTS, 4 * WINDOW_LEVELS)
"""The DeepLOB window a model may take instead of the feature vector: events x (price, size) x
levels x sides."""

TIMER_SLACK_NS = 1_500_000
"""Closer than this to a message's time, the feed stops sleeping on the loop's timers, which
are too coarse (a millisecond under uvloop) to wake it on time."""
NAP_NS = 50_000
"""...and spins, or naps this long at a time (releasing the GIL, so that a model's instance
thread can start and hand back a batch), taking any answers between naps."""
SWITCH_INTERVAL_S = 0.0001
"""While the feed runs, how long an instance thread back from ONNX Runtime may wait for the GIL
(Python's default, 5 ms, would be most of a deadline)."""
WARM_EVERY_NS = 100_000
"""While it spins before a message (`RunOptions.keep_warm`), how often the feed runs its
per-event path on a book of its own."""
YOUNG_OBJECTS = 700
"""Objects allocated since the last collection above which a gap is used to collect (Python's
own gen-0 threshold)."""
FULL_COLLECT_GAP_NS = 100_000_000
"""A gap this long (a quiet stretch, a halt) takes a full collection."""
LEAD_SHARE = 0.25
"""A burst's fit is tested as of its request's admission at most this share of the deadline
ahead (see `FeedRun._made_ns`): an event just applied is never taken for due by then."""
YIELD_EVERY = 16
"""At full pace, messages between two turns of the loop (so answers are taken promptly)."""
HOLD_SHARE = 0.5
"""A burst waits for more events at most this share of the deadline: from when its first event
was taken up where the predictor predicts (`Predictor.fits`; the rest is a margin for what the
predictions miss: a batch size asked for the first time is validated whole, a loaded host takes
longer for everything), from its arrival where it does not (a remote one: the rest is for the
round trip)."""
LIVE_COLLECT_S = 0.01
"""Live feed: how often it looks for a quiet moment to record the noted latencies and collect
the young generations..."""
LIVE_QUIET_NS = 2_000_000
"""...one this long without a datagram (a collection takes ~0.2 ms on the VM: not in a burst)..."""
LIVE_COLLECT_MAX_S = 1.0
"""...or, in a feed that is never quiet that long, after this long anyway (bounded memory)."""
MAX_QUEUED_MESSAGES = 100_000
"""Live: messages received and not applied yet, at most (`itch listen --max-queued-messages`;
about 25 MB of decoded messages). A datagram that comes while the queue is full is dropped,
and its messages are reported missed (a sequence gap), as the kernel's drop of a datagram
would be."""
DRAIN_AFTER_DUE_NS = 1_000_000_000
"""At the end, answers are waited for until this long after the last request's due time; those
still owed then are counted unanswered (late) and dropped if they come (a predictor that never
answers cannot hold the run; a remote one gives up on its own before, `GIVE_UP_AFTER_DUE_NS`)."""


class LiveSource(Protocol):
    """A live feed (`live.UdpFeed`): hands each datagram's messages, decoded and in sequence
    order, to a callback with the time it was received; a datagram the callback refuses
    (returns False: the run's queue is full) is missed, a gap like a lost one."""

    @property
    def missed(self) -> int:
        """Messages lost so far (sequence gaps)."""

    @property
    def bad(self) -> int:
        """Datagrams or messages that did not parse so far."""

    def statistics(self) -> FeedStatistics: ...
    def start(
        self,
        on_packet: Callable[[Sequence[Any], int], bool],
        on_gap: Callable[[Any], None] | None = None,
    ) -> None:
        """Hand on each datagram's messages from now on, and call `on_gap` at each sequence gap
        (before the messages after it)."""

    def stop(self) -> None: ...
    async def ended(self) -> None:
        """Returns when the feed has ended (its end-of-session packet, a silence, `stop`)."""


@dataclass(frozen=True, slots=True)
class Trigger:
    """Which book events ask the model: every `every`-th of a stock's events, or (with
    `top_change`) each one that changes its best bid or ask."""

    every: int = 1
    top_change: bool = False

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"--every: expected a positive number of events, got {self.every}")


@dataclass(slots=True)
class RunOptions:
    deadline_ns: int = 1_000_000
    pace: Pace = "recorded"
    speed: float = 1.0
    trigger: Trigger = field(default_factory=Trigger)
    symbols: frozenset[str] | None = None
    """Stocks to predict for, by the key `itch book` gives them (`keys`: "AAPL", "#17",
    "AAPL@2"; None: all); the books of all stocks are kept either way."""
    limit: int | None = None
    """Stop after this many messages."""
    nap: bool = False
    """At the recorded pace, sleep in short slices instead of spinning before each message's
    time: for a model on an instance thread, which needs the CPU and the GIL meanwhile."""
    max_gap_ns: int = 1_000_000_000
    """At the recorded pace, a longer gap between two messages is cut to this (recorded time):
    a file's hours before the open and after the close are replayed in a second."""
    keep_warm: bool = True
    """At the recorded pace, while spinning before a message, and live while the feed
    busy-polls (`busy_poll_ns`): run the per-event path (a book, its features, the model) on a
    book of its own every `WARM_EVERY_NS` (see `Warmer`)."""
    busy_poll_ns: int = 0
    """Live: how long the feed keeps polling after a datagram (`itch listen --busy-poll-us`)."""
    max_queued: int = MAX_QUEUED_MESSAGES
    """Live: messages received and not applied yet, at most (see `MAX_QUEUED_MESSAGES`)."""


class _Asked(NamedTuple):
    """A triggering event whose row is in a request: when and where, for its prediction.

    NOTE: a NamedTuple, not a frozen dataclass: made for every event, and a frozen dataclass's
    `__init__` (an `object.__setattr__` a field) cost ~1 µs of an event's ~60 on the VM."""

    ts: int
    stock: str
    """The stock's key when the event came (`Books.keys`)."""
    arrival_ns: int
    book_gaps: int
    """The live feed's sequence gaps before the event (its book may lack their orders)."""


class FeedRun:
    """One replay: the books, the features, the predictor and the tallies."""

    def __init__(self, predictor: Predictor, options: RunOptions, log: PredictionLog) -> None:
        self.options = options
        self.stats = RunStats()
        self._predictor = predictor
        self._log = log
        self.books = Books()
        self._wants_window = _wants_window(predictor)
        # NOTE: the window costs ~3.5 µs an event; a model of the vector does not need it
        self.features = Features(deeplob_length=WINDOW_EVENTS if self._wants_window else 0)
        self._counts: dict[int, int] = {}
        self._unseen = set(options.symbols or ())
        """Of `options.symbols`: those no book event had so far (see `unknown_symbols`)."""
        self._burst: list[_Asked] = []
        """Triggering events since the feed last asked (they arrived together)."""
        self._rows: list[np.ndarray] = []
        self._max_batch = max(1, predictor.max_batch)
        self._fits = getattr(predictor, "fits", None)  # (a predictor may not predict)
        self._step_ns = 0
        """What applying a message takes (`_slow_side`): how much later the burst would be
        asked for if it waited for one more event (see `_must_ask`)..."""
        self._ask_ns = 0
        """...and what asking takes, until the request is in the predictor's hands (a request
        of a batch size not seen before is validated whole: tens of µs more)."""
        self._held_ns = 0
        """When the burst's first event was taken up (0: not known yet, see `_must_ask`)."""
        self._own_lead_ns = getattr(predictor, "lead_ns", 0)
        self._made_ns = 0
        """From a batch's fit test (`_fitting`) to its request's admission: the feed's part
        (the rest of the test, the batch made: its usual time, an average by eighths) and the
        predictor's (`lead_ns`), at most `LEAD_SHARE` of the deadline. Tested as of then
        (see `_flush`).

        NOTE: learnt as what a step may take (`_slow_side`: a longer value at once), one stall
        of a few ms made every event due "by then", even one just applied: nothing was asked
        again, so nothing taught it otherwise, and a live run refused every event from there
        on (a tester; 4,352-4,738 of 4,827)."""
        self._lead_cap_ns = int(options.deadline_ns * LEAD_SHARE)
        self._max_in_flight = predictor.max_in_flight
        self._nap = options.nap or predictor.answered_elsewhere
        """Whether the feed naps before a message instead of spinning: its answers come from
        outside its own turns of the loop, which it must keep turning to take them."""
        self._outstanding = 0
        """Requests not answered yet..."""
        self._answered = asyncio.Event()
        """...(set at each answer: a burst held back goes then, see `_flush_if_room`)..."""
        self._owed_events = 0
        """...the events they carry..."""
        self._last_due_ns = 0
        """...and the latest due time among the requests (`_drain` waits a grace past it)."""
        self._abandoned = False
        """Set when `_drain` stopped waiting: answers that come later are dropped uncounted."""
        self._done = asyncio.Event()
        self._live_done = asyncio.Event()
        """Live: set when `options.limit` messages were taken."""
        self._packets: deque[tuple[Sequence[Any], int, int]] = deque()
        """Live: datagrams received and not applied yet, with their arrival and the feed's gaps
        before them..."""
        self._queued = 0
        """...and their messages (at most about `options.max_queued`)."""
        self._gaps = 0
        """Live: the sequence gaps the feed reported so far..."""
        self._book_gaps = 0
        """...and before the datagram being applied (0: the books have every message)."""
        self._arrivals = asyncio.Event()
        self._last_arrival_ns = 0
        self._first_arrival_ns = 0
        self._answered_ns = 0
        self._applied_ns = 0
        """Live: when its first datagram came, and when the last answer came and the last
        messages were applied (see `_tuned`)."""
        window = WINDOW_EVENTS if self._wants_window else 0
        warm = options.keep_warm and (options.pace == "recorded" or options.busy_poll_ns > 0)
        self._warmer: Warmer | FastWarmer | None = Warmer(window, predictor) if warm else None
        self._woken = asyncio.Event()
        """Live: set at each datagram (the warmer's cue that the feed is busy again)."""
        self._fast: FastFeed | None = None
        """The compiled per-event path, when the run takes it (`run_fast`)."""
        self._flushing = False
        """Set while `_flush` asks for a burst batch by batch."""

    @property
    def takes_vector(self) -> bool:
        """Whether the model takes the feature vector (the compiled path's), not the window."""
        return not self._wants_window

    async def run(self, messages: Iterable[Any]) -> RunStats:
        """Replay `messages` (a file's, at `options.pace`) and wait for every answer."""
        async with self._tuned():
            await self._feed(iter(messages))
            await self._drain()
        return self.stats

    async def run_fast(self, feed: FastFeed) -> RunStats:
        """`run` on the compiled per-event path (see fastfeed): `feed` holds the whole file and
        the books and features, applied a step at a time (the messages that have come), each
        step's events asked for together. The model must take the feature vector."""
        assert not self._wants_window, "the compiled path gives the feature vector"
        from duetime.feeds.itch.fastfeed import FastWarmer

        self._fast = feed
        if self._warmer is not None:
            self._warmer = FastWarmer(self._predictor)
        async with self._tuned():
            await self._feed_fast(feed)
            await self._drain()
        return self.stats

    async def run_live(
        self, source: LiveSource, started: Callable[[], object] | None = None
    ) -> RunStats:
        """Take the messages of a live feed as they come (each datagram's at the time it was
        received: its arrival), until the feed ends, `options.limit` messages, or cancellation;
        then wait for every answer. The pace is the feed's own. `started` is called once the
        path is ready (`_ready`) and the feed taken (a listener says where it listens then)."""
        self._live_done.clear()
        async with self._tuned():
            waits = [
                asyncio.ensure_future(self._consume()),
                asyncio.ensure_future(self._collect_live()),
                asyncio.ensure_future(self._live_done.wait()),
                asyncio.ensure_future(source.ended()),
            ]
            if self._warmer is not None and self.options.busy_poll_ns:
                waits.append(asyncio.ensure_future(self._warm_live(self._warmer)))
            try:
                source.start(self._received, self._gapped)
                if started is not None:
                    started()
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # (a failure of the feed's own tasks is the run's)
            finally:
                source.stop()
                for waiting in waits:
                    waiting.cancel()
                self.stats.missed_messages = source.missed
                self.stats.bad_packets = source.bad
                self.stats.feed = source.statistics()
            while self._packets:  # what came in before the end
                self._take_received()
                self._flush()
            await self._drain()
        return self.stats

    def _received(self, messages: Sequence[Any], arrival_ns: int) -> bool:
        """A live feed's datagram: its messages arrived together, at `arrival_ns`. False: it
        is refused, the queue is full (`options.max_queued`; the feed reports it missed).

        NOTE: queued, not applied here: the loop reads up to a few dozen datagrams in one go,
        and applying them all before the model's turn made the first ones miss their due times
        (a third of them on the 2-core VM). `_consume` applies what is queued, asks, and lets
        the model run before it takes more."""
        self._last_arrival_ns = arrival_ns
        if not self._first_arrival_ns:
            self._first_arrival_ns = arrival_ns
        self._woken.set()
        if self._queued >= self.options.max_queued:
            return False
        self._packets.append((messages, arrival_ns, self._gaps))
        self._queued += len(messages)
        if len(self._packets) == 1:
            self._arrivals.set()
        return True

    def _gapped(self, gap: Any) -> None:
        """A live feed's sequence gap: the events after it are on books that may lack orders."""
        self._gaps += 1

    async def _consume(self) -> None:
        arrivals = self._arrivals
        while True:
            if not self._packets:
                arrivals.clear()
                await arrivals.wait()
            self._take_received()
            self._flush_if_room()
            await asyncio.sleep(0)  # the model's turn (inline: it runs there)

    def _take_received(self) -> None:
        """Apply the queued datagrams' messages, until the triggering events must be asked for
        (a full batch, or the first one's due time near: see `_must_ask`)."""
        packets, stats, limit = self._packets, self.stats, self.options.limit
        taken = 0  # (when the message before was taken: none yet)
        while packets:
            messages, arrival_ns, gaps = packets.popleft()
            self._book_gaps = gaps
            self._queued -= len(messages)
            for index, message in enumerate(messages):
                if limit is not None and stats.messages >= limit:
                    packets.clear()
                    self._queued = 0
                    self._live_done.set()
                    if taken:
                        self._applied_ns = taken
                    return
                now = time.monotonic_ns()
                if self._burst and self._must_ask(now, now - taken if taken else 0):
                    rest = messages[index:]  # (waits for the next batch)
                    packets.appendleft((rest, arrival_ns, gaps))
                    self._queued += len(rest)
                    return
                taken = now
                stats.messages += 1
                self._arrived(message, arrival_ns)
        if taken:  # (when the last message was taken: no clock read more a datagram)
            self._applied_ns = taken

    async def _warm_live(self, warmer: Warmer | FastWarmer) -> None:
        """Live, while the feed busy-polls after a datagram: between loop turns with nothing
        to do, run `warmer` every `WARM_EVERY_NS`; once the polling window is over, wait for the
        next datagram (the loop may sleep again).

        NOTE: a datagram that comes during a warming waits for it (tens of µs); in exchange the
        next event does not run on a path the host has let go cold (see `Warmer`)."""
        window_ns = self.options.busy_poll_ns
        warmed_ns = 0
        while True:
            now = time.monotonic_ns()
            if now - self._last_arrival_ns > window_ns:
                self._woken.clear()
                await self._woken.wait()
                continue
            await asyncio.sleep(0)  # a turn of the loop: what came is read and taken first
            now = time.monotonic_ns()
            if not self._packets and not self._outstanding and now - warmed_ns >= WARM_EVERY_NS:
                warmer.warm()
                warmed_ns = now

    async def _collect_live(self) -> None:
        """Live, the gaps between messages are not known ahead: every `LIVE_COLLECT_S`, if the
        feed has been quiet for `LIVE_QUIET_NS` (or nothing was done for `LIVE_COLLECT_MAX_S`),
        record the noted latencies and collect the young generations."""
        done_ns = time.monotonic_ns()
        while True:
            await asyncio.sleep(LIVE_COLLECT_S)
            now = time.monotonic_ns()
            quiet = now - self._last_arrival_ns >= LIVE_QUIET_NS
            if quiet or now - done_ns >= LIVE_COLLECT_MAX_S * 1e9:
                _work_in_gap(0, self.stats)
                done_ns = now

    @contextlib.asynccontextmanager
    async def _tuned(self) -> AsyncIterator[None]:
        """The run's runtime settings (collector, GIL switch interval), the path made ready
        (`_ready`), and its wall time: a live feed's from its first datagram to its last
        datagram, answer or message applied, whichever came last.

        NOTE: a live feed's counted the wait for its first datagram and the idle timeout after
        its last: a 10 ms feed sent 6 s after the listener started read "0 msg/s over 6.0 s"
        (found by a tester)."""
        gc.collect()
        gc.freeze()
        # NOTE: the collector would run every few hundred allocations, ~200 µs each on this VM:
        # in the middle of one event in fifty. It runs in the gaps between messages instead.
        collecting = gc.isenabled()
        gc.disable()
        switch = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        await self._ready()
        started = time.monotonic_ns()
        try:
            yield
        finally:
            first = self._first_arrival_ns
            span = max(self._last_arrival_ns, self._answered_ns, self._applied_ns) - first
            # (a single datagram that asked nothing: its span is its messages' applying)
            self.stats.wall_ns = max(span, 1) if first else time.monotonic_ns() - started
            fast = self._fast
            anomalies = self.books.anomalies.counts if fast is None else fast.anomalies
            # (in ANOMALY_KINDS order, as `itch book` says them: the python engine's counts are
            # in the order first seen, and its line differed from numba's; found by a tester)
            self.stats.book_anomalies = {k: anomalies[k] for k in ANOMALY_KINDS if k in anomalies}
            self.stats.unknown_symbols = self.unknown_symbols()
            self.stats.settle()
            self._log.flush()
            sys.setswitchinterval(switch)
            gc.unfreeze()
            if collecting:
                gc.enable()

    async def _ready(self) -> None:
        """Before the clock starts (and after the collector's full pass, which leaves the caches
        cold): the predictor primed (`EnginePredictor.prime`: a request of each batch size
        through the Engine) and the per-event path run once (the warmer's).

        NOTE: a run's first event took 580-1,600 µs against ~100 for the next ones (its first
        request 500 µs, 81 calls, each cold), often late at the default 1 ms deadline."""
        prime = getattr(self._predictor, "prime", None)
        if prime is not None:
            await prime(self.options.deadline_ns)
        if self._warmer is not None:
            self._warmer.warm()

    async def _feed(self, messages: Iterator[Any]) -> None:
        options = self.options
        recorded = options.pace == "recorded"
        limit = options.limit
        stats = self.stats
        clock = RecordedClock(options.speed, options.max_gap_ns)
        taken = 0
        """When the message before was taken up (recorded pace)."""
        for message in messages:
            if limit is not None and stats.messages >= limit:
                break
            if recorded:
                target = clock.target_ns(message.timestamp)
                now = time.monotonic_ns()
                if target > now:
                    # NOTE: the burst so far is all there is until then: ask for it now (or,
                    # with `max_in_flight` requests out, at the first answer), and take its
                    # answer while waiting (inline, it is back on the next turn)
                    self._flush_if_room()
                    now = await _until(target, self._nap, stats, self._warmer)
                elif self._burst and self._must_ask(now, now - taken) and self._flush():
                    await asyncio.sleep(0)  # (the model's turn: its answer is taken first)
                    now = time.monotonic_ns()
                taken = now
                stats.note(stats.new_lag_us, (now - target) // 1000)
                arrival = target  # a message waiting for the feed to be free is already here
            else:
                if stats.messages % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                arrival = time.monotonic_ns()
            stats.messages += 1
            self._arrived(message, arrival)
            # NOTE: at full pace every message has arrived already: each event asks at once,
            # unless `max_in_flight` requests are out (a remote server): then the events wait
            # for the next answer and go together, and a full batch holds the feed until then.
            # Behind the recorded pace, a burst asks before the next message that has come
            # already if it fills a batch or its first event's due time draws near
            # (`_must_ask`). Either way the next turn of the loop takes the answer (and lets the
            # scheduler finish the run) before the feed reads on.
            if self._burst and not recorded:
                if self._has_room():
                    self._flush()
                elif len(self._burst) >= self._max_batch:
                    await self._burst_asked()
                await asyncio.sleep(0)
        if self._has_room():
            self._flush()
        await self._burst_asked()

    async def _feed_fast(self, feed: FastFeed) -> None:
        """`_feed` on the compiled path: each step applies every message that has come (at the
        recorded pace: whose time is past; at full pace: up to the next event that fires, which
        arrives as it is taken up), and its events go in one request.

        NOTE: no `_must_ask` here: a step is the messages already there, a few µs for the call
        and well under one a message, so holding a burst back for more is never worth it."""
        options, stats = self.options, self.stats
        recorded = options.pace == "recorded"
        total = len(feed) if options.limit is None else min(len(feed), options.limit)
        targets = feed.targets(options.speed, options.max_gap_ns)
        start = time.monotonic_ns()
        lags = stats.new_lag_us
        lone = options.symbols is None  # (`_ask_alone` keeps no stock filter)
        steps = 0
        while (first := feed.messages) < total:
            if recorded:
                now = time.monotonic_ns()
                target = start + targets.item(first)
                if target > now:
                    self._flush_if_room()
                    now = await _until(target, self._nap, stats, self._warmer)
                stop = feed.due_by(targets, now - start, first, total)
                room = self._max_batch - len(self._burst)
            else:
                now = time.monotonic_ns()
                stop, room = total, 1
            if room <= 0:  # (`max_in_flight` requests out and a full batch waiting)
                await self._burst_asked()
                continue
            if not feed.step(stop, room):
                asked = bool(self._burst)
            elif feed.rows == 1 and lone and not self._burst and self._has_room():
                asked = self._ask_alone(feed, targets, start if recorded else None, now)
            else:
                self._take_rows(feed, targets, start if recorded else None, now)
                asked = bool(self._burst)
            if asked and self._burst and self._has_room():
                self._flush()
            # (the books after the ask: on the VM everything between a wait and the ask took
            # several times its time back to back, the lag notes a histogram's at times)
            taken = feed.messages
            stats.messages += taken - first
            stats.book_events = feed.book_events
            if recorded:
                behind = now - start
                if taken - first == 1:  # (the usual step: no arrays for one message's lag)
                    stats.note(lags, (behind - targets.item(first)) // 1000)
                else:
                    for lag in ((behind - targets[first:taken]) // 1000).tolist():
                        stats.note(lags, lag)
            steps += 1
            if asked:
                if self._burst and len(self._burst) >= self._max_batch:
                    await self._burst_asked()
                await asyncio.sleep(0)  # (the model's turn: its answer is taken first)
            elif not recorded and steps % YIELD_EVERY == 0:
                await asyncio.sleep(0)
        if self._has_room():
            self._flush()
        await self._burst_asked()

    def _ask_alone(self, feed: FastFeed, targets: np.ndarray, start: int | None, now: int) -> bool:
        """`_take_rows` and `_flush` for a step of one event with no burst waiting (nearly
        every step at the recorded pace): its row is the request, asked at once (refused
        unasked where it is due already). False where nothing was asked.

        NOTE: the two took ~8 µs of Python between the step and the ask for this one row on
        the VM (the burst's lists, a view of the row, a search that one row never needs)."""
        message = feed.messages_of.item(0)
        arrival = now if start is None else start + targets.item(message)
        # (due by its admission: refused unasked, as `_fitting` refuses a burst's; no batch
        # to make, so the predictor's part of the lead alone)
        if arrival + self.options.deadline_ns <= time.monotonic_ns() + self._own_lead_ns:
            self._refuse_unasked(1)
            return False
        event = _Asked(feed.timestamps.item(message), feed.stocks[0], arrival, 0)
        self._ask(feed.vectors.copy(), (event,))
        return True

    def _take_rows(self, feed: FastFeed, targets: np.ndarray, start: int | None, now: int) -> None:
        """The last step's event rows into the burst: each arrived at its message's recorded
        time (`start` + its target) or, at full pace (`start` None), `now`."""
        symbols, unseen = self.options.symbols, self._unseen
        block = feed.vectors.copy()  # (one copy for the step: its rows are views of it)
        stamps, rows, burst = feed.timestamps, self._rows, self._burst
        for row, (stock, message) in enumerate(
            zip(feed.stocks, feed.messages_of.tolist(), strict=True)
        ):
            if symbols is not None:
                if stock not in symbols:
                    continue
                if unseen:
                    unseen.discard(stock)
            arrival = now if start is None else start + targets.item(message)
            rows.append(block[row])
            burst.append(_Asked(stamps.item(message), stock, arrival, 0))

    def stock_names(self) -> set[str]:
        """The key of every locate the feed has seen so far (see `stock_names`)."""
        return stock_names(self.books) if self._fast is None else self._fast.seen()

    def _flush_if_room(self) -> None:
        """Ask for the burst now if a request may go out or it fills a batch; otherwise it
        waits for the first answer (which asks for it), gathering the events that come."""
        if len(self._burst) >= self._max_batch or self._has_room():
            self._flush()

    def _has_room(self) -> bool:
        """Whether a request may go out now (fewer than the predictor's `max_in_flight`)."""
        return not self._max_in_flight or self._outstanding < self._max_in_flight

    async def _burst_asked(self) -> None:
        """Wait until a burst held back has gone (an answer sends it, see `_ask`)."""
        while self._burst:
            self._answered.clear()
            await self._answered.wait()

    def _arrived(self, message: Any, arrival_ns: int) -> None:
        """Apply one message; add its book event to the burst if it triggers."""
        event = self.books.apply(message)
        if event is None:
            return
        self.stats.book_events += 1
        book = self.books.book(event.locate)
        vector = self.features.update(event, book)
        key = self.books.keys.key
        symbols = self.options.symbols
        if symbols is not None:
            stock = key(event.locate)
            if stock not in symbols:
                return
            if self._unseen:
                self._unseen.discard(stock)
        if not self._fires(event):
            return
        if self._wants_window:
            window = self.features.state(event.locate).deeplob
            assert window is not None  # kept for every stock when the model takes it
            self._rows.append(window.tensor())
        else:  # the vector is the state's own buffer, rewritten by the next event: copy it
            self._rows.append(vector.copy())
        self._burst.append(_Asked(event.ts, key(event.locate), arrival_ns, self._book_gaps))

    def unknown_symbols(self) -> list[str]:
        """Of `options.symbols`, those the feed never keyed (sorted): no book event had them and
        no locate has them (by its stock directory entry, or as `#<locate>`): most likely a
        typo, which asks for nothing at all.

        NOTE: such a symbol made a run a silent no-op (`--symbols APPL` on a file of AAPL: 0
        requests, exit 0, nothing said); the report names them now, and the CLI says so."""
        if not self._unseen:
            return []
        return sorted(self._unseen - self.stock_names())

    def _must_ask(self, now: int, step_ns: int) -> bool:
        """Whether the burst must be asked for now, before the next message (which has come
        already; the one before took `step_ns`, 0: not known): it fills a batch, or after one
        more message it would have been held `HOLD_SHARE` of the deadline, or its first event
        have too little time left for the answer (the predictor's `fits`). Only asked while
        messages are waiting: a lone event goes as soon as it is applied.

        NOTE: it was asked for only once full or at the next timestamp. Behind one timestamp's
        200 events (a sweep), the first 64 went together after ~1.5 ms of books and features:
        past the first one's due time at 1 ms, so every one of them was refused, though an
        event asked for alone is answered in ~100 µs (0 of 200 on time at 300 µs)."""
        burst = self._burst
        if len(burst) >= self._max_batch:
            return True
        if not self._has_room():
            return False  # (`max_in_flight` requests out: the first answer asks for it)
        deadline, first = self.options.deadline_ns, burst[0].arrival_ns
        if now >= first + deadline:
            return True  # (refused unasked at once)
        if step_ns > 0:
            self._step_ns = _slow_side(self._step_ns, step_ns)
        if not self._held_ns:  # (asked before each message since: its first came with the last)
            self._held_ns = now - step_ns
        then = now + self._step_ns + self._ask_ns  # (were it to wait for one more)
        fits = self._fits
        # NOTE: held from its take-up, not its arrival: behind a backlog every event is old,
        # and a cut by age sent each alone, a model run each, falling further behind
        held = then - (first if fits is None else self._held_ns)
        if held >= deadline * HOLD_SHARE:
            return True
        return fits is not None and fits(then, first + deadline, len(burst) + 1) is False

    def _fires(self, event: BookEvent) -> bool:
        trigger = self.options.trigger
        if trigger.top_change:
            return bool(event.top_changed)
        count = self._counts.get(event.locate, 0) + 1
        self._counts[event.locate] = count
        return count % trigger.every == 0

    def _flush(self) -> bool:
        """Ask for the events of the burst in one request (one row each): the model runs once
        for a sweep's several events instead of once after another. Those already due are
        refused unasked; False when no request went out.

        NOTE: a request is bound by its first row's due time: rows already due would have had
        the scheduler refuse those behind them that could still be answered in time. So would
        a batch the predictor predicts cannot be answered by then (`fits`): behind a backlog,
        the compiled path's steps of up to 64 events were refused whole (26k of 58k events on a
        loaded VM). The burst goes as the largest batches that fit, one after another, and an
        event that does not fit even alone is refused unasked."""
        burst = self._burst
        if not burst:
            return False
        self._held_ns = 0
        now = time.monotonic_ns()
        asked = False
        self._flushing = True  # (an answer within the ask must not flush the rest itself)
        try:
            while burst:
                # NOTE: tested as of when the request will be admitted, not now: 64-row
                # batches of 200-event sweeps (300 µs deadline) found to fit with ~100 µs left
                # were refused whole 10-30 µs later (a tester: 30-38 of ~60 per run), and
                # events due in between were sent, expired unrun, not refused unasked
                lead = self._own_lead_ns + self._made_ns
                rows = self._fitting(
                    now + (lead if lead < self._lead_cap_ns else self._lead_cap_ns)
                )
                if rows:
                    self._ask_first(rows, now)
                    asked = True
                    self._ask_ns = _slow_side(self._ask_ns, time.monotonic_ns() - now)
                    now = time.monotonic_ns()
                    if not self._has_room():  # (the rest goes at the next answer)
                        break
        finally:
            self._flushing = False
        return asked

    def _fitting(self, now: int) -> int:
        """Refuse (unasked) the burst's first events due by `now` (when a request asked for
        them would be admitted); how many of the rest go in the next request (0: none left):
        all, or the most rows the predictor says can be answered by the first one's due time.

        NOTE: events the predictor says cannot be answered in time even alone are not refused
        here but asked for together, for the scheduler to refuse (or admit: a probe that
        re-measures the model, a FIFO model, which admits by its queue, not by time): a feed
        that stopped asking for what its predictions rule out would never see them corrected."""
        burst, deadline, fits = self._burst, self.options.deadline_ns, self._fits
        due = 0
        while due < len(burst) and burst[due].arrival_ns + deadline <= now:
            due += 1  # (a burst's arrivals never go back: its due events come first)
        if due:
            self._refuse_unasked(due)
        count = len(burst)
        # (a lone event asked for within HOLD_SHARE of the deadline is not checked: ~7 µs a
        # call on the VM, a sixth of the ask, for the one case that nearly always fits)
        if fits is None or count <= 1:
            return count
        first_due = burst[0].arrival_ns + deadline
        if fits(now, first_due, count) is not False:  # (None: it cannot tell)
            return count
        if fits(now, first_due, 1) is False:  # the events up to the first that fits alone
            return _first_true(1, count, lambda i: fits(now, burst[i].arrival_ns + deadline,
                                                        1) is not False)  # fmt: skip
        return _first_true(1, count, lambda rows: fits(now, first_due, rows) is False) - 1

    def _refuse_unasked(self, count: int) -> None:
        """The burst's first `count` events are refused without asking for them (`_ask_alone`:
        one with the burst empty)."""
        stats = self.stats
        stats.triggers += count
        stats.refused += count
        stats.refused_unasked += count
        del self._burst[:count], self._rows[:count]

    def _ask_first(self, count: int, tested_ns: int) -> None:
        """Ask for the burst's first `count` events in one request (their fit tested from
        `tested_ns`: see `_made_ns`)."""
        rows = self._rows
        # (`np.array` of the rows, not `np.stack`: the same array, ~1 µs against ~5 on the VM)
        batch = np.array(rows[:count]) if count > 1 else rows[0][np.newaxis]
        asked = tuple(self._burst[:count])
        del self._burst[:count], rows[:count]
        self._made_ns += (time.monotonic_ns() - tested_ns - self._made_ns) // 8
        self._ask(batch, asked)

    def _ask(self, batch: np.ndarray, asked: tuple[_Asked, ...]) -> None:
        stats = self.stats
        stats.triggers += len(asked)
        self._outstanding += 1
        self._owed_events += len(asked)
        deadline = self.options.deadline_ns
        due_ns = asked[0].arrival_ns + deadline  # the burst's first event binds it
        if due_ns > self._last_due_ns:
            self._last_due_ns = due_ns

        def answer(outputs: np.ndarray | None, failure: Failure | None) -> None:
            if self._abandoned:  # (counted unanswered when the run stopped waiting)
                return
            now = self._answered_ns = time.monotonic_ns()
            self._outstanding -= 1
            self._owed_events -= len(asked)
            self._answered.set()
            # (a burst held back, see `_flush_if_room`; not one `_flush` is asking for now)
            if self._burst and not self._flushing and self._has_room():
                self._flush()
            if outputs is None:
                if failure is not None and failure.unanswered:  # no answer by its due time
                    stats.late += len(asked)
                    stats.unanswered += len(asked)
                    for event in asked:
                        latency = now - event.arrival_ns
                        self._log.add(event.ts, event.stock, latency, None, event.book_gaps)
                elif failure is not None and failure.refused:
                    stats.refused += len(asked)
                else:
                    stats.errors += len(asked)
                    stats.first_error = stats.first_error or (failure and failure.message)
            else:
                log, noted = self._log, stats.new_latency_us
                for row, event in enumerate(asked):
                    latency = now - event.arrival_ns
                    stats.note(noted, latency // 1000)
                    if latency <= deadline:
                        stats.on_time += 1
                        log.add(event.ts, event.stock, latency, outputs[row], event.book_gaps)
                    else:  # late: never used
                        stats.late += 1
                        log.add(event.ts, event.stock, latency, None, event.book_gaps)
            if self._outstanding == 0:
                self._done.set()

        self._done.clear()
        self._predictor.submit(batch, due_ns, answer)

    async def _drain(self) -> None:
        """Wait for the answers still owed, until `DRAIN_AFTER_DUE_NS` past the last due time;
        what is owed then is counted unanswered (late), and never used if it comes."""
        if not self._outstanding:
            return
        left_s = (self._last_due_ns + DRAIN_AFTER_DUE_NS - time.monotonic_ns()) / 1e9
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._done.wait(), max(0.0, left_s))
        if self._outstanding:
            self._abandoned = True
            self.stats.late += self._owed_events
            self.stats.unanswered += self._owed_events


class RecordedClock:
    """A session's recorded timestamps replayed on the monotonic clock: the first one is now,
    the others `speed` times faster than recorded, with quiet stretches (the night, a halt) cut
    to `max_gap_ns`.

    A timestamp behind the one before it (a file out of order, or spliced) is due when that one
    was: at once, neither waited for nor late, and the timestamps after it are paced from it.
    Each step between two timestamps is taken as 0 to `max_gap_ns`, so a target never goes
    back (`itch run` and `itch send` share this clock).
    """

    __slots__ = ("_first", "_last", "_max_gap_ns", "_speed", "_start_ns")

    def __init__(self, speed: float, max_gap_ns: int) -> None:
        self._speed = speed
        self._max_gap_ns = max_gap_ns
        self._first: int | None = None
        self._last = 0
        self._start_ns = 0

    def target_ns(self, ts: int) -> int:
        """When recorded timestamp `ts` comes (monotonic ns); timestamps in file order."""
        if self._first is None:
            self._first, self._last, self._start_ns = ts, ts, time.monotonic_ns()
        gap = ts - self._last
        if gap > self._max_gap_ns:
            self._first += gap - self._max_gap_ns
        elif gap < 0:  # NOTE: its target is the last one's (see the class)
            self._first += gap
        self._last = ts
        return self._start_ns + int((ts - self._first) / self._speed)


def stock_names(books: Books) -> set[str]:
    """The key (`Books.keys`) of every locate the books have seen, as they stand now."""
    key = books.keys.key
    return {key(locate) for locate in books.books}


def _wants_window(predictor: Predictor) -> bool:
    """Whether the model takes the DeepLOB window rather than the feature vector."""
    shape = tuple(predictor.input.shape)
    if shape == DEEPLOB_SHAPE:
        return True
    if shape in ((len(FEATURE_NAMES),), (-1,)):
        return False
    raise PredictorError(
        f"the model's input '{predictor.input.name}' has shape {list(shape)}; the feed gives the "
        f"feature vector [{len(FEATURE_NAMES)}] or the DeepLOB window {list(DEEPLOB_SHAPE)}"
    )


def _first_true(low: int, high: int, test: Callable[[int], bool]) -> int:
    """The least i in [low, high) for which `test` holds, `high` if none (`test` False below
    some i and True from there on: a binary search)."""
    while low < high:
        middle = (low + high) // 2
        if test(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _slow_side(estimate: int, value: int) -> int:
    """`estimate` updated with a new `value`: a longer one taken at once, a shorter one by an
    eighth (what a step may take, rather than what it takes on average)."""
    return value if value > estimate else estimate + (value - estimate) // 8


def _work_in_gap(left_ns: int, stats: RunStats) -> None:
    """While nothing is due for `left_ns`: record the latencies noted, and collect garbage (the
    young generations in a gap of a couple of milliseconds, everything in a long one)."""
    stats.settle()
    if left_ns > FULL_COLLECT_GAP_NS:
        gc.collect()
    elif gc.get_count()[0] >= YOUNG_OBJECTS:
        gc.collect(1)


async def _until(
    target_ns: int, nap: bool, stats: RunStats, warmer: Warmer | FastWarmer | None = None
) -> int:
    """Wait until `target_ns`, taking answers meanwhile; returns the time it woke.

    The last stretch spins on the clock (the answers of an inline model are back by then),
    running `warmer` every `WARM_EVERY_NS` that leave time for it, or with `nap` sleeps in slices
    that let go of the CPU and the GIL for a model's instance thread, turning the loop between
    slices to take answers (a remote server's too: each needs a few turns to be read and handed
    back, and a spin without a turn held them all until the next message).
    """
    await asyncio.sleep(0)  # the answers already back (inline: all of them)
    while True:
        now = time.monotonic_ns()
        left = target_ns - now
        if left <= 0:
            return now
        if left > TIMER_SLACK_NS:
            _work_in_gap(left, stats)
            left = target_ns - time.monotonic_ns()
            if left <= TIMER_SLACK_NS:
                continue
            await asyncio.sleep((left - TIMER_SLACK_NS) / 1e9)
        elif nap:
            await asyncio.sleep(0)
            time.sleep(min(left, NAP_NS) / 1e9)  # noqa: ASYNC251 - a nap shorter than a timer
        else:
            # NOTE: a spin on the clock alone (no system call: the vDSO reads it). Turning the
            # loop instead costs a system call a turn, and on a VM thousands of them between
            # two messages left the caches cold enough to make the next event 40% slower.
            if warmer is not None:
                warm_at = time.monotonic_ns()
                while (now := time.monotonic_ns()) < target_ns:
                    if now >= warm_at and target_ns - now > warmer.cost_ns:
                        warmer.warm()
                        warm_at = now + WARM_EVERY_NS
                continue
            while time.monotonic_ns() < target_ns:
                pass


class Warmer:
    """The per-event path run on a book of its own while the feed waits for a message: an order
    added and deleted, their features, the model on the last vector; nothing counted or logged.

    NOTE: the same 120 events of a 10 messages/s session took 5x longer at its recorded pace
    than back to back (tick-to-prediction P50 650 µs against 130 on the 2-core VM), each step
    alike (the book and features 34 -> 190 µs, the model 62 -> 300 µs), and spinning up to 90 ms
    before each message changed nothing: the host had let the caches and predictors of the code
    path go cold, not the vCPU. Running that same code on a book of its own in the last 1.5 ms
    brought a book-and-features step back from 230 to 55-60 µs after a 20 ms gap."""

    __slots__ = ("_add", "_books", "_features", "_model", "_ref", "_row", "cost_ns")

    def __init__(self, deeplob_length: int, predictor: Predictor) -> None:
        self._books = Books()
        self._features = Features(deeplob_length=deeplob_length)
        self._model = getattr(predictor, "warm", None)  # (a predictor may have no model here)
        self._add = AddOrder("A", 1, 0, 0, 0, "B", 100, "WARM", 1_000_000)
        self._ref = 0
        self._row = event_rows(predictor.input, 1)
        self.cost_ns = 0
        """How long one warming took last (it is not started closer than that to a message)."""

    def warm(self) -> None:
        started = time.monotonic_ns()
        self._ref += 1
        books, features, add = self._books, self._features, self._add
        for message in (
            add._replace(order_reference_number=self._ref),
            OrderDelete("D", 1, 0, 0, self._ref),
        ):
            event = books.apply(message)
            if event is not None:
                features.update(event, books.book(event.locate))
        if self._model is not None:
            self._model(self._row)
        self.cost_ns = time.monotonic_ns() - started
