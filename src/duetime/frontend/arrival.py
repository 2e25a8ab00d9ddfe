"""ReadTurn: when the requests read in the event loop's current turn reached the server.

The v2 `timeout` parameter counts from when the server receives the request, and a server only
knows when it reads one. Under load one turn of the loop reads every connection that has data:
hundreds of requests, each parsed and scheduled before the next is read. The last of them has
waited in its socket for the whole turn. Counting its timeout from the moment it is parsed lets
the server answer it "on time" by its own clock while its client sees it late; and since such
stale requests cost as much to serve as fresh ones, a backlog in the sockets, once there, stays
(measured on mlp at 150% load: a turn's oldest request 34 ms old at the 99th percentile, answers
late for seconds at a time while the server counted them on time).

So a request read in a turn counts its timeout from the turn's first read, which is when the
loop's poll returned: its bytes had arrived by then. Requests read late in a long turn are then
due early, and those that cannot make it are refused for a fraction of the cost of serving them,
which shortens the next turn: the backlog drains instead of feeding itself.

A busy loop hides a second wait: what a poll returns arrived after the poll before it, while the
loop was reading the last turn, running batches and timers. When the loop has not slept since the
last turn began (its thread made no voluntary context switch: it never blocked in a poll), a
request read now may have waited that whole stretch in its socket, and counts from when the last
turn began.

Both rules guess from the loop's side, and both guess wrong when the loop was held up by what it
cannot see: a wait for the GIL (another thread decoding a big body, a model's instance thread)
looks like a sleep, and a preemption on a shared CPU looks like a busy stretch. The kernel knows
better, coarsely: TCP_INFO's `tcpi_last_data_recv` is the age of the connection's last data in
jiffies (1-10 ms). `ReadTurn.reading` reads it as a request is handled, and the turn's guess is
kept within the window it allows (see `ReadTurn.arrival_ns`).
"""

from __future__ import annotations

import asyncio
import itertools
import resource
import socket
import struct
from collections.abc import Callable
from typing import Any

from duetime.clock import Clock
from duetime.loops import BusyPoll

IDLE_AFTER_NS = 2_000_000
"""A loop that has read nothing for this long since its last turn ended is idle."""

JIFFY_MAX_NS = 10_000_000
"""The longest kernel tick assumed (HZ=100) until a shorter one is seen (see `ReadTurn.reading`)."""

_TCP_INFO_BYTES = 56
_LAST_DATA_RECV = struct.Struct("=I")
_LAST_DATA_RECV_AT = 52
"""`struct tcp_info`: eight bytes of u8 fields, then u32s: rto, ato, snd_mss, rcv_mss, unacked,
sacked, lost, retrans, fackets, last_data_sent, last_ack_sent, last_data_recv (ms)."""


def last_data_age_ns(sock: Any) -> int | None:
    """How long ago, by the kernel, the TCP socket `sock` last received data (TCP_INFO's
    `tcpi_last_data_recv`, counted in whole jiffies: off the true age by up to a jiffy either
    way); None where the kernel does not say."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
    except (OSError, AttributeError):
        return None
    if len(info) < _TCP_INFO_BYTES:
        return None
    return int(_LAST_DATA_RECV.unpack_from(info, _LAST_DATA_RECV_AT)[0]) * 1_000_000


def bytes_waiting(sock: Any) -> bool:
    """Whether the kernel holds bytes the socket `sock` received and nobody read yet (False on
    a closed or half-closed socket, and where it cannot say)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except (OSError, AttributeError):  # (BlockingIOError: nothing waits)
        return False


class SocketView(socket.socket):
    """A socket object over a connection's file descriptor, owned by its transport: it asks the
    kernel about the socket (`getsockopt`) and never closes it. Call `detach` when the transport
    closes; one collected before that detaches itself.

    NOTE: uvloop's transports hand out a stand-in whose every `getsockopt` makes a socket object
    and detaches it: 5-6 µs a call on the 2-core VM against 1.2 µs on one kept (measured), asked
    as a connection's requests wait for a turn of a busy loop (see `tcp_view`)."""

    __slots__ = ()

    def __del__(self) -> None:
        # (overrides the socket's own finalizer, which would close the transport's descriptor,
        # maybe reused by another connection by then)
        self.detach()


def tcp_view(sock: Any) -> SocketView | None:
    """A `SocketView` of `sock` (a transport's "socket" extra info) if it is a TCP socket over
    IPv4 or IPv6; None otherwise (a Unix socket, a test's fake, none)."""
    if sock is None or getattr(sock, "family", None) not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        return SocketView(sock.family, sock.type, sock.proto, fileno=sock.fileno())
    except (OSError, ValueError):  # (closed meanwhile)
        return None


class ReadTurn:
    """The start of the loop turn in which the front end reads requests (see the module doc)."""

    __slots__ = (
        "_arrival_ns",
        "_away_ns",
        "_bounded",
        "_busy_since_ns",
        "_clock",
        "_closed_ns",
        "_earliest_ns",
        "_jiffy_ns",
        "_latest_ns",
        "_open",
        "_started_ns",
        "_switches",
        "_switches_seen",
        "busy_poll",
    )

    def __init__(self, clock: Clock, switches: Callable[[], int] | None = None) -> None:
        self._clock = clock
        self._switches = switches or _voluntary_switches
        """The loop thread's voluntary context switches so far (each a sleep: a blocking poll, or
        a wait for the GIL): call `mark` on the loop's thread."""
        self._open = False
        self._started_ns = 0
        self._switches_seen = -1
        self._arrival_ns = 0
        self._busy_since_ns = 0
        """Since when the loop has read turn after turn without sleeping between them."""
        self._closed_ns = 0
        self._away_ns = 0
        """How long the loop was away from reading before the current turn: from the end of
        the last turn to this one's first read."""
        self._bounded = False
        self._earliest_ns = 0
        self._latest_ns = 0
        """While a request is handled (`reading`): the window the kernel allows its arrival;
        `_bounded` is False outside one, or where the kernel could not say."""
        self._jiffy_ns = JIFFY_MAX_NS
        """The kernel's tick as far as seen: the shortest nonzero age TCP_INFO has given."""
        self.busy_poll: BusyPoll | None = None
        """Poked at each turn that reads (`busy_poll_us`); None: the loop sleeps when idle."""

    def mark(self, loop: asyncio.AbstractEventLoop) -> None:
        """Call as data is read, on `loop`: the turn's first read starts it.

        NOTE: the loop runs its ready callbacks after all the reads its poll returned (checked
        on uvloop and asyncio), so the callback that ends the turn runs before the next poll.

        NOTE: a loop that slept since the last turn began was woken by what it reads now, or
        by a timer shortly before: its requests count from now. One that was busy all along
        polled last as the last turn began, and each request may have waited since then.
        Measured (mlp over HTTP binary at about twice its capacity, 2/10 ms due times, on the
        2-core VM, client and server clocks joined): of the 2 ms requests answered late, the
        wait in their socket before the turn that read them was 1.3 ms on average, and every
        one was written by its due time counted from that turn; 10% of the answers were late.
        Counted from the last turn (bench/scheduling.py --models mlp, same VM): at 200% of
        capacity 99.9% of answers on time instead of 94.9%, and no less goodput (less work
        spent on answers already late).
        A loop that waits for the GIL looks asleep: its requests count from now, as before.

        NOTE: whether it slept is told by its voluntary context switches, not by its CPU use: a
        closed-loop client's next request came while the loop slept, after it had been on the
        CPU most of the time since the last turn; dated from then, 290 µs due times were due
        before they were read. A loop waiting for its turn on a CPU shared with other work is
        switched out involuntarily: it has not slept."""
        if not self._open:
            self._open = True
            now = self._clock.now_ns()
            switches = self._switches()
            busy_poll = self.busy_poll
            # (a loop kept polling by `busy_poll` polled a few µs ago, whatever else it did)
            if switches == self._switches_seen and not (busy_poll and busy_poll.spinning):
                self._arrival_ns = self._started_ns
            else:
                self._arrival_ns = self._busy_since_ns = now
            self._started_ns, self._switches_seen = now, switches
            self._away_ns = now - self._closed_ns
            loop.call_soon(self._close)
            if busy_poll is not None:
                busy_poll.poke()

    def arrival_ns(self, now_ns: int) -> int:
        """When a request being handled now reached the server, as far as the loop can tell:
        the start of the current read turn (or of the one before, see `mark`), or `now_ns`
        outside one; kept within the kernel's window while one is known (`reading`)."""
        arrival = self._arrival_ns if self._open else now_ns
        if self._bounded:
            if arrival < self._earliest_ns:
                return self._earliest_ns
            if arrival > self._latest_ns:
                return self._latest_ns
        return arrival

    def reading(self, sock: Any, whole: bool = True, first: bool = False) -> None:
        """Call before handling a request read from `sock` (a TCP socket, or None), and
        `done_reading` after: `arrival_ns` then keeps within what the kernel says of the
        connection's last data, `age`: it came between `age` - 1 tick and `age` + 1 tick ago;
        only before that (not after) unless the request was read `whole` by one read. `first`:
        the request came in its connection's first read (the kernel is always asked).

        NOTE: that data is the latest the socket received, so at most as old as the request's
        own bytes: the window's later bound is never too early for it. Its earlier bound is
        the request's own for a request that came in one read, but not for one read in pieces:
        a big body's last bytes come in as the server reads the first (the client waits for
        room in the socket's buffers), so every resnet request (600 kB) looked fresh and more
        of the backlog that the turn's rule refuses was served. Measured, resnet over HTTP at
        1,900 requests/s (~200% of capacity), 10/50 ms due times, two rounds of each build in
        turn: goodput 539 and 492 answers/s on time without the kernel's word, 570 and 542
        with both bounds for every request, 713 and 721 with the earlier bound for requests
        read whole only. A request read together with a later one (pipelined) counts as if it
        had come with the later one, as it did before this.
        Measured on the 2-core VM (a tester's, with client round trips as the oracle):
        - light mlp requests beside an 8 MB JSON body, joined and decoded on another thread
          (the loop waited for the GIL: a sleep to `mark`), were answered 100-250 ms after
          they were sent, under 50 ms timeouts, and counted on time;
        - a loop preempted for 62 ms on a shared CPU (not a sleep: `mark` dates the next
          turn's requests from before it) refused requests that had come at its end with 504s
          claiming 100-190 ms of age, and the shedder followed them with 429s for seconds.
        The age is in ms, rounded up to whole ticks (HZ 250: 4 ms), and the shortest nonzero
        one seen is the tick (never shorter than the real one).

        NOTE: a read costs 2-3 µs through uvloop's socket (it makes a socket object each time:
        a few % of the loop at resnet's saturation), and is skipped where no bound could move
        the guess: the earlier one only moves a guess over a tick old, and the later one only
        for data a tick older than the guess, which came (the loop read what its poll
        returned) while the loop was away from its poll that long: asleep, or held up.

        NOTE: except in a connection's first read: a connection waits in the listen backlog
        until a turn accepts it, and its data is read in a turn after that one, which may have
        been short, and begun right after it: a server stopped for 1 s (SIGSTOP, as a long
        preemption or a VM pause) answered 19 of 20 requests sent meanwhile on new connections
        200 after 0.6-1 s, under 50 ms timeouts, and counted them on time. One read more for
        each new connection (a few µs beside its accept)."""
        if sock is None:
            return
        now = self._clock.now_ns()
        jiffy = self._jiffy_ns
        if not first and self._open and now - self._arrival_ns < jiffy and self._away_ns < jiffy:
            return
        age = last_data_age_ns(sock)
        if age is None:
            return
        if 0 < age < jiffy:
            self._jiffy_ns = jiffy = age
        self._earliest_ns = now - age - jiffy if whole else -(1 << 62)
        self._latest_ns = now - age + jiffy
        self._bounded = True

    def done_reading(self) -> None:
        self._bounded = False

    def busy_for_ns(self, now_ns: int) -> int:
        """How long the loop has been reading turn after turn without sleeping in between (0:
        it has been idle for `IDLE_AFTER_NS` since the last turn ended).

        NOTE: the loop's CPU use alone misses a loop that waits for its turn on a CPU shared
        with other work: mlp over HTTP at 4,000 requests/s beside a process spinning the loop's
        core used 40-80% of the CPU, under the shedder's target, while requests waited 200 ms in
        their sockets and expired there (15,286 of 19,930; none answered on time)."""
        if not self._open and now_ns - self._closed_ns > IDLE_AFTER_NS:
            return 0
        return now_ns - self._busy_since_ns

    def _close(self) -> None:
        self._closed_ns = self._clock.now_ns()
        self._open = False


if hasattr(resource, "RUSAGE_THREAD"):

    def _voluntary_switches() -> int:
        """The calling thread's voluntary context switches so far."""
        return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw

else:  # (not Linux: every turn counts from its own start, as if the loop had slept)
    _voluntary_switches = itertools.count().__next__
