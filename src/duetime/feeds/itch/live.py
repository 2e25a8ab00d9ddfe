"""A live ITCH feed over MoldUDP64: `UdpFeed` takes datagrams into `FeedRun.run_live`, and
`send_session` plays a file out as datagrams at its recorded pace, as an exchange's feed would.

    duetime itch listen --udp 127.0.0.1:31000 --model orderbook     # the pipeline, live
    duetime itch send day.itch --udp 127.0.0.1:31000                # the exchange, replayed

A datagram's messages arrive when the datagram is taken in: that is the arrival of their book
events, and their due time is that plus the deadline. UDP loses datagrams when a receiver
falls behind (its socket buffer fills); the sequence numbers show what was lost, which the run
reports as missed messages. Nothing is retransmitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from duetime.feeds.itch.moldudp import (
    MAX_JUMP,
    MoldUdpReceiver,
    encode_packet,
    end_of_session_packet,
    heartbeat_packet,
    message_batches,
    open_receiver,
    session_name,
)
from duetime.feeds.itch.parser import ItchFormatError, OnError, Source, read_frames
from duetime.feeds.itch.run import RecordedClock
from duetime.feeds.itch.spec import Message
from duetime.feeds.itch.tally import FIRST_GAPS, FeedStatistics
from duetime.loops import BusyPoll

RECEIVE_BUFFER = 8 << 20
"""Receive buffer asked of the kernel for a live feed's socket (Linux caps it at
net.core.rmem_max): room for bursts while the pipeline works through a sweep."""
END_REPEATS = 3
"""The end-of-session packet is sent this many times, a millisecond apart (UDP may lose one)."""
SPIN_NS = 1_500_000
"""Closer than this to a packet's time the sender spins instead of sleeping (a sleep's wake-up
is late by up to a millisecond)."""
HEARTBEAT_NS = 1_000_000_000
"""While the feed is quiet the sender sends a MoldUDP64 heartbeat (the session, the next
sequence number, a count of 0) once this long has passed since its last datagram, as a
MoldUDP64 server does about once a second: a listener's idle timeout counts heartbeats as
activity, and a datagram lost before a long quiet stretch shows as a gap without waiting for
the next message."""
_TIMESTAMP = slice(5, 11)
"""Where an ITCH message's 6-byte timestamp sits in its body."""


class UdpFeed:
    """A MoldUDP64 feed bound on a UDP socket, as `run.LiveSource`: each datagram's new messages
    in sequence order, with the time it was received. It ends at the session's end-of-session
    packet, after `idle_s` without a datagram (heartbeats count) once one came, or on `stop`."""

    def __init__(
        self,
        transport: asyncio.DatagramTransport,
        receiver: MoldUdpReceiver,
        idle_s: float | None,
        busy_poll_us: int = 0,
    ) -> None:
        self._transport = transport
        self._receiver = receiver
        self._idle_ns = None if idle_s is None else int(idle_s * 1e9)
        self._poll = (
            BusyPoll(asyncio.get_running_loop(), busy_poll_us / 1e6) if busy_poll_us else None
        )
        self._early: list[tuple[list[Message], int, int]] = []
        """Datagrams before `start`: messages, arrival, the gaps before them."""
        receiver.on_packet = self._keep  # until `start`: nothing may be lost in between

    @classmethod
    async def open(
        cls,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        idle_s: float | None = 10.0,
        busy_poll_us: int = 0,
        join_late: bool = False,
        max_jump: int = MAX_JUMP,
    ) -> UdpFeed:
        """Bind the feed's socket (port 0: any free port; see `address`). A MoldUDP64 session
        starts at sequence number 1: the messages before the first datagram seen are missed (a
        lost or reordered first datagram is a gap), unless `join_late`, where the first
        datagram with messages sets the sequence (a late joiner starts where the feed is, and
        its books lack the orders added before). `busy_poll_us`: keep the loop polling that
        long after each datagram instead of sleeping (see `loops.BusyPoll`): the next one is
        then taken without waking a halted CPU. `max_jump`: a datagram further ahead is a
        stray (see `moldudp.SequenceTracker`)."""
        transport, receiver = await open_receiver(
            host=host, port=port, next_sequence=None if join_late else 1,
            receive_buffer=RECEIVE_BUFFER, max_jump=max_jump,
        )  # fmt: skip
        return cls(transport, receiver, idle_s, busy_poll_us)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._transport.get_extra_info("sockname")[:2]
        return str(host), int(port)

    @property
    def missed(self) -> int:
        return self._receiver.tracker.missed

    @property
    def bad(self) -> int:
        return len(self._receiver.bad_packets)

    def statistics(self) -> FeedStatistics:
        tracker = self._receiver.tracker
        return FeedStatistics(
            missed=tracker.missed, dropped=tracker.discarded, gaps=tracker.gap_count,
            first_gaps=tuple(tracker.gaps[:FIRST_GAPS]), first_sequence=tracker.first_sequence,
            duplicates=tracker.duplicates, reordered=tracker.reordered, session=tracker.session,
            bad_kinds=self._receiver.bad_packets.as_dict(), ended=tracker.ended,
        )  # fmt: skip

    def start(
        self,
        on_packet: Callable[[Sequence[Any], int], bool],
        on_gap: Callable[[Any], None] | None = None,
    ) -> None:
        """Hand each datagram's messages to `on_packet` from now on (those that came since
        `open` first); `on_packet` returning False refuses one: its messages are missed.
        `on_gap(gap)` at each sequence gap, before the messages after it."""
        poll = self._poll
        if poll is not None:

            def polled(messages: Sequence[Any], received_ns: int) -> bool:
                poll.poke()
                return on_packet(messages, received_ns)

            self._receiver.on_packet = polled
        else:
            self._receiver.on_packet = on_packet
        early, self._early = self._early, []
        tracker, told = self._receiver.tracker, 0
        for messages, received, gaps in early:  # (a few at most: taken, whatever the queue holds)
            if on_gap is not None:
                for gap in tracker.gaps[told:gaps]:
                    on_gap(gap)
                told = gaps
            on_packet(messages, received)
        if on_gap is not None:
            for gap in tracker.gaps[told : tracker.gap_count]:
                on_gap(gap)
            self._receiver.on_gap = on_gap

    def stop(self) -> None:
        """Close the socket and end `ended` (also from a signal handler)."""
        self._receiver.ended.set()
        self._transport.close()

    async def ended(self) -> None:
        receiver = self._receiver
        while not receiver.ended.is_set():
            last = receiver.last_received_ns
            if self._idle_ns is not None and last:
                idle = time.monotonic_ns() - last
                if idle >= self._idle_ns:
                    return
                wait_s = (self._idle_ns - idle) / 1e9
            else:
                wait_s = 1.0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(receiver.ended.wait(), wait_s)

    def _keep(self, messages: list[Message], received_ns: int) -> None:
        self._early.append((messages, received_ns, self._receiver.tracker.gap_count))


@dataclass(slots=True)
class SendReport:
    messages: int = 0
    packets: int = 0
    wall_s: float = 0.0
    late_p99_us: float | None = None
    """How late the packets left after their recorded time (recorded pace; 99th percentile)."""
    heartbeats: int = 0
    """Heartbeats sent during quiet stretches (recorded pace; not among `packets`)."""
    skipped: int = 0
    """Malformed parts of the file stepped over (`on_error="skip"`)..."""
    first_skipped: ItchFormatError | None = None
    """...and the first of them..."""
    format_error: ItchFormatError | None = None
    """...or the malformed frame that stopped the feed (`on_error="stop"`; a file cut short
    too): what came before it was sent, and the session was left open (`ended` False)."""
    ended: bool = False
    """Whether the end-of-session packet was sent (not after a `format_error`)."""


def send_session(
    source: Source,
    address: tuple[str, int],
    *,
    pace: str = "recorded",
    speed: float = 1.0,
    max_gap_ns: int = 1_000_000_000,
    per_packet: int = 32,
    session: str = "DUETIME",
    limit: int | None = None,
    on_error: OnError = "stop",
) -> SendReport:
    """Send the messages of `source` to `address` as MoldUDP64 datagrams, then the session's
    end (blocking; returns what it sent); a feed stopped by an error leaves the session open.

    At the recorded pace (`speed` times faster; quiet stretches cut to `max_gap_ns`) the
    messages of one timestamp (a sweep) share datagrams and each datagram leaves at that time;
    at full pace (`pace="max"`) datagrams are filled up to `per_packet` messages and sent back
    to back, which a receiver slower than the sender answers with lost datagrams. A wait longer
    than `HEARTBEAT_NS` is filled with heartbeats, one every `HEARTBEAT_NS`.

    A malformed frame that stops the file (`on_error="stop"`, or a file cut short: one still
    being written) stops the feed there: the messages before it are sent, then a heartbeat
    (the next sequence number, `END_REPEATS` times) instead of the session's end, and the
    report's `format_error` says where it stopped. The session is left open: a listener ends
    on its idle timeout, and its report says no end-of-session came.

    NOTE: the error was raised out of the send loop: the datagram being filled (at full pace,
    every message of a short file: 0 of 10 sent) was lost, and nothing more went out, so a
    listener that had heard nothing waited on for good (its idle timeout starts at the first
    datagram); the heartbeat starts it. The session's end was sent for a while instead, but
    it told a listener that a feed cut short was whole (`missed_messages` 0, not
    `book_incomplete`; found by a tester).
    """
    if pace not in ("recorded", "max"):
        raise ValueError(f"pace must be 'recorded' or 'max', got {pace!r}")
    if speed <= 0:
        raise ValueError(f"speed must be positive, got {speed}")
    session_name(session)  # (before the first datagram: a bad name raises, naming it)
    report = SendReport()
    lates: list[int] = []
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    sequence = 1
    started = time.monotonic_ns()
    # NOTE: not connected: a connected UDP socket reports the "port unreachable" of an earlier
    # datagram as an error of a later send, and a feed goes on whether anyone listens or not
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        frames = read_frames(source, on_error=on_error)
        stopped: list[ItchFormatError] = []
        groups = _groups(_until_error(frames, stopped), per_packet, limit, pace == "max")
        clock = RecordedClock(speed, max_gap_ns) if pace == "recorded" else None
        sent_ns = started
        for stamp, bodies in groups:
            if clock is not None:
                target = clock.target_ns(stamp)
                if target - sent_ns > HEARTBEAT_NS + SPIN_NS:  # quiet: say the feed is alive
                    heartbeat = heartbeat_packet(session, sequence)
                    report.heartbeats += _beat_until(target, sent_ns, sock, heartbeat, address)
                lates.append(_wait_until(target))
            sock.sendto(encode_packet(session, sequence, bodies), address)
            sent_ns = time.monotonic_ns()
            sequence += len(bodies)
            report.messages += len(bodies)
            report.packets += 1
        report.ended = not stopped
        end = (end_of_session_packet if report.ended else heartbeat_packet)(session, sequence)
        for repeat in range(END_REPEATS):
            if repeat:
                time.sleep(0.001)
            sock.sendto(end, address)
    report.wall_s = (time.monotonic_ns() - started) / 1e9
    report.skipped = frames.skipped
    report.first_skipped = frames.errors[0] if frames.errors else None
    report.format_error = stopped[0] if stopped else None
    if lates:
        lates.sort()
        report.late_p99_us = lates[min(len(lates) - 1, int(0.99 * len(lates)))] / 1e3
    return report


def _until_error(frames: Iterator[bytes], stopped: list[ItchFormatError]) -> Iterator[bytes]:
    """`frames` up to a malformed frame that stops them, kept in `stopped`: the batch being
    filled is still sent."""
    try:
        yield from frames
    except ItchFormatError as error:
        stopped.append(error)


def _groups(
    bodies: Iterator[bytes], per_packet: int, limit: int | None, full: bool
) -> Iterator[tuple[int, list[bytes]]]:
    """(timestamp, message bodies) of each datagram: consecutive messages of one timestamp (or
    any, when `full`), at most `per_packet` and one datagram's worth of bytes."""
    if limit is not None:
        bodies = itertools.islice(bodies, limit)
    apart = None if full else _apart_in_time
    for batch in message_batches(bodies, per_packet=per_packet, apart=apart):
        yield int.from_bytes(batch[0][_TIMESTAMP], "big"), batch


def _apart_in_time(previous: bytes, message: bytes) -> bool:
    return previous[_TIMESTAMP] != message[_TIMESTAMP]


def _beat_until(
    target_ns: int, sent_ns: int, sock: socket.socket, heartbeat: bytes, address: tuple[str, int]
) -> int:
    """Send `heartbeat` each `HEARTBEAT_NS` after the last datagram (sent at `sent_ns`) until
    less than that is left before `target_ns`; how many were sent. A heartbeat's time needs
    no precision: it is slept to, never spun for, and none goes within `SPIN_NS` of the
    target (a sleep that woke late there would make the next packet late)."""
    beats = 0
    while target_ns - sent_ns > HEARTBEAT_NS + SPIN_NS:
        left = sent_ns + HEARTBEAT_NS - time.monotonic_ns()
        if left > 0:
            time.sleep(left / 1e9)
        sock.sendto(heartbeat, address)
        sent_ns = time.monotonic_ns()
        beats += 1
    return beats


def _wait_until(target_ns: int) -> int:
    """Block until `target_ns` (a sleep, then a spin for the last `SPIN_NS`); how late it woke."""
    left = target_ns - time.monotonic_ns()
    if left > SPIN_NS:
        time.sleep((left - SPIN_NS) / 1e9)
    while (now := time.monotonic_ns()) < target_ns:
        pass
    return now - target_ns
