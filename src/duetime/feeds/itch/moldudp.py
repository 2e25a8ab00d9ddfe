"""MoldUDP64, the UDP framing ITCH is multicast in: packets, sequence numbers and gaps.

A downstream packet is a 20-byte header (session: 10 bytes alpha; sequence number of its first
message: uint64; message count: uint16) and then that many message blocks, each a 2-byte
big-endian length and one ITCH message. A count of 0 is a heartbeat, 0xFFFF the end of the
session; both carry the next sequence number expected. UDP loses, repeats and reorders
datagrams, so `SequenceTracker` hands out each sequence number at most once, in order, and
records the ranges it never saw (`Gap`) for a retransmission request.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from duetime.feeds.itch.parser import ItchFormatError, decode_message
from duetime.feeds.itch.spec import Message

HEADER = struct.Struct(">10sQH")
HEARTBEAT = 0
END_OF_SESSION = 0xFFFF
MAX_DATAGRAM = 1400
"""Default budget for one encoded packet: fits a 1500-byte Ethernet MTU with IP/UDP headers."""
KEEP_GAPS = 100
"""Gaps a `SequenceTracker` keeps (the first ones; all are counted)."""
KEEP_OPEN_GAPS = 1024
"""Gaps a `SequenceTracker` still expects late messages of (the last ones)."""
MAX_JUMP = 1_000_000
"""Sequence numbers further ahead than this are implausible (see `SequenceTracker`): far more
messages than a receiver plausibly loses in one gap (an 8 MB socket buffer holds ~200,000)."""
KEEP_EXAMPLES = 3
"""Reasons `BadPackets` keeps per kind (the first ones; all are counted)."""


OnPacket = Callable[[list[Message], int], bool | None]
"""A datagram's new messages and when it was received; False: refused (see `MoldUdpReceiver`)."""


class MoldFormatError(ValueError):
    """A datagram that is not a well-formed MoldUDP64 downstream packet, or that does not belong
    to the stream; `kind` names the case in a word (`BadPackets` counts by it)."""

    def __init__(self, message: str, kind: str = "malformed") -> None:
        super().__init__(message)
        self.kind = kind


class BadPackets:
    """Datagrams (or messages in them) that could not be used: a count per kind and the first
    `KEEP_EXAMPLES` reasons of each, so memory stays bounded whatever a feed sends.

    Kinds: `short` (less than a header), `cut_off` (fewer or shorter blocks than the count
    says), `trailing_bytes`, `control_with_messages` (a heartbeat or end of session with
    blocks), `other_session` (a datagram of another session than the stream's),
    `bad_message` (a block that is no ITCH message), `zero_sequence` (sequence number 0: a
    session's start at 1), `implausible_sequence` (far ahead of the stream, see
    `SequenceTracker`).
    """

    __slots__ = ("counts", "examples", "total")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.examples: dict[str, list[str]] = {}
        self.total = 0

    def add(self, kind: str, reason: str) -> None:
        self.total += 1
        count = self.counts.get(kind, 0)
        self.counts[kind] = count + 1
        if count < KEEP_EXAMPLES:
            self.examples.setdefault(kind, []).append(reason)

    def __len__(self) -> int:
        return self.total

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """JSON-ready: kind -> {"count": n, "examples": [the first reasons]}, the most first."""
        ordered = sorted(self.counts.items(), key=lambda item: -item[1])
        return {kind: {"count": n, "examples": list(self.examples[kind])} for kind, n in ordered}

    def note(self) -> str:
        """One line (for stderr): how many of each kind, and the first reason of each."""
        return bad_packets_note(self.as_dict())


def bad_packets_note(kinds: dict[str, dict[str, Any]]) -> str:
    """One line on `BadPackets.as_dict()` (a report's `bad_packet_kinds`): how many of each
    kind, and the first reason of each."""
    total = sum(entry["count"] for entry in kinds.values())
    parts = [f"{kind} {entry['count']} (the first: {entry['examples'][0]})"
             for kind, entry in kinds.items()]  # fmt: skip
    return f"{total} bad packet(s): " + "; ".join(parts)


class MoldPacket(NamedTuple):
    """One decoded downstream packet; `messages` are the ITCH message bytes, in order."""

    session: str
    sequence_number: int
    message_count: int
    messages: tuple[bytes, ...]

    @property
    def is_heartbeat(self) -> bool:
        return self.message_count == HEARTBEAT

    @property
    def is_end_of_session(self) -> bool:
        return self.message_count == END_OF_SESSION


class Gap(NamedTuple):
    """Sequence numbers `first` up to `last` (inclusive) were never received."""

    first: int
    last: int


def decode_packet(datagram: bytes) -> MoldPacket:
    """Parse one datagram; raises MoldFormatError when its blocks do not fill it exactly."""
    if len(datagram) < HEADER.size:
        raise MoldFormatError(
            f"a packet has a {HEADER.size}-byte header, got {len(datagram)} bytes", "short"
        )
    raw_session, sequence, count = HEADER.unpack_from(datagram)
    session = raw_session.decode("latin-1").rstrip(" ")
    if count in (HEARTBEAT, END_OF_SESSION):
        if len(datagram) != HEADER.size:
            raise MoldFormatError(
                f"a packet of count {count} has no messages, got {len(datagram) - HEADER.size} "
                "bytes after the header",
                "control_with_messages",
            )
        return MoldPacket(session, sequence, count, ())
    messages: list[bytes] = []
    pos = HEADER.size
    for _ in range(count):
        if pos + 2 > len(datagram):
            raise MoldFormatError(
                f"packet {sequence}: {len(messages)} of {count} messages", "cut_off"
            )
        size = (datagram[pos] << 8) | datagram[pos + 1]
        if pos + 2 + size > len(datagram):
            raise MoldFormatError(f"packet {sequence}: block {len(messages)} is cut off", "cut_off")
        messages.append(bytes(datagram[pos + 2 : pos + 2 + size]))
        pos += 2 + size
    if pos != len(datagram):
        raise MoldFormatError(
            f"packet {sequence}: {len(datagram) - pos} bytes after the blocks", "trailing_bytes"
        )
    return MoldPacket(session, sequence, count, tuple(messages))


def encode_packet(session: str, sequence_number: int, messages: Iterable[bytes] = ()) -> bytes:
    """One packet carrying `messages` (ITCH message bytes), the first with `sequence_number`."""
    blocks = [len(m).to_bytes(2, "big") + m for m in messages]
    return _header(session, sequence_number, len(blocks)) + b"".join(blocks)


def heartbeat_packet(session: str, next_sequence: int) -> bytes:
    return _header(session, next_sequence, HEARTBEAT)


def end_of_session_packet(session: str, next_sequence: int) -> bytes:
    return _header(session, next_sequence, END_OF_SESSION)


def session_name(session: str) -> bytes:
    """`session` as a header's 10 bytes (space-padded); ValueError, naming it, when it is not
    ASCII or longer than 10 characters."""
    if not session.isascii() or len(session) > 10:
        raise ValueError(
            f"a MoldUDP64 session name has at most 10 characters, all ASCII, got {session!r}"
        )
    return session.encode("ascii").ljust(10)


def _header(session: str, sequence: int, count: int) -> bytes:
    return HEADER.pack(session_name(session), sequence, count)


def mold_packets(
    messages: Iterable[bytes],
    session: str,
    *,
    per_packet: int = 32,
    first_sequence: int = 1,
    max_size: int = MAX_DATAGRAM,
) -> Iterator[bytes]:
    """Pack consecutive ITCH messages into packets of at most `per_packet` messages and
    `max_size` bytes, numbering them from `first_sequence` (no end-of-session packet)."""
    sequence = first_sequence
    for batch in message_batches(messages, per_packet=per_packet, max_size=max_size):
        yield encode_packet(session, sequence, batch)
        sequence += len(batch)


def message_batches(
    messages: Iterable[bytes],
    *,
    per_packet: int = 32,
    max_size: int = MAX_DATAGRAM,
    apart: Callable[[bytes, bytes], bool] | None = None,
) -> Iterator[list[bytes]]:
    """Consecutive messages in batches that fit one packet each: at most `per_packet` messages
    and `max_size` bytes with the header; `apart(previous, message)` true also starts a new
    batch (the sender's: a new timestamp)."""
    if not 0 < per_packet < END_OF_SESSION:
        raise ValueError(f"per_packet must be in 1..{END_OF_SESSION - 1}, got {per_packet}")
    batch: list[bytes] = []
    size = HEADER.size
    for message in messages:
        if batch and (
            len(batch) == per_packet
            or size + 2 + len(message) > max_size
            or (apart is not None and apart(batch[-1], message))
        ):
            yield batch
            batch, size = [], HEADER.size
        batch.append(message)
        size += 2 + len(message)
    if batch:
        yield batch


class SequenceTracker:
    """Turns packets, as they arrive, into each sequence number's message once and in order.

    A packet that starts after `next_sequence` records a `Gap` and moves on (a recovering
    client would ask for the gap meanwhile). Messages before `next_sequence` are dropped: those
    inside a gap came late (a reordered datagram: `reordered`, no longer `missed`, though never
    handed out), the others had been handed out already (`duplicates`). `next_sequence=None`
    syncs to the first packet seen, as a late joiner does. Memory stays bounded: `gaps` keeps the
    first `KEEP_GAPS` gaps, `gap_count` and `missed` count them all, and late messages are looked
    for in the last `KEEP_OPEN_GAPS` gaps only.

    A packet more than `max_jump` messages ahead of `next_sequence` is no gap but an
    implausible sequence number (a corrupt or stray header, raised as `implausible_sequence`),
    unless the next such packet continues it: then the feed did jump, and the jump is a gap.
    One stray number near 2**63 once ended a feed: every later message was a "duplicate".
    A continuation must move the numbering on: it or the stray before it carries messages. A
    heartbeat (or end of session) sent again, as servers do and UDP may, "continued" itself.

    A late joiner (`next_sequence=None`) syncs to the first packet that carries messages, or
    to an end of session; a heartbeat before it is taken in and otherwise ignored.
    """

    def __init__(self, next_sequence: int | None = 1, max_jump: int = MAX_JUMP) -> None:
        self.next_sequence = next_sequence
        self.max_jump = max_jump
        self.session: str | None = None
        self.first_sequence: int | None = None
        """The sequence number of the first packet of the stream."""
        self.gaps: list[Gap] = []
        """The first `KEEP_GAPS` gaps."""
        self.gap_count = 0
        self.last_gap: Gap | None = None
        self.missed = 0
        """Messages in all the gaps, less those that came late (`reordered`)."""
        self.discarded = 0
        """Of `missed`: messages received but discarded by their consumer (`discard`)."""
        self.reordered = 0
        """Messages of a gap that came after it (dropped: the stream had moved on)."""
        self.duplicates = 0
        self.ended = False
        self._open: list[tuple[int, int]] = []
        """The last `KEEP_OPEN_GAPS` gaps' numbers not come yet, (first, last) in order."""
        self._jump_to: int | None = None
        """Where the last implausible packet would have left `next_sequence`..."""
        self._jump_moved = False
        """...and whether it carried messages (moved the numbering on)."""

    def accept(self, packet: MoldPacket) -> list[tuple[int, bytes]]:
        """The new (sequence number, message) pairs of `packet`, in order."""
        if packet.sequence_number == 0:  # (it would pass as a duplicate, or start the stream)
            raise MoldFormatError(
                f"sequence number 0 in a datagram of session {packet.session!r}: a MoldUDP64 "
                "session numbers its messages from 1; ignored",
                "zero_sequence",
            )
        if self.session is not None and packet.session != self.session:
            raise MoldFormatError(
                f"a datagram of session {packet.session!r} (sequence {packet.sequence_number}) "
                f"in the stream of session {self.session!r}: ignored (a new session needs a "
                "new listener)",
                "other_session",
            )
        sequence = packet.sequence_number
        if self.next_sequence is None and packet.is_heartbeat:
            # NOTE: a late joiner synced to the first datagram, a heartbeat too: one stray
            # heartbeat numbered 2**63 first made every later message a duplicate (found by a
            # tester). A heartbeat only says where the feed stands; its next message says so too
            return []
        expected = sequence if self.next_sequence is None else self.next_sequence
        if sequence - expected > self.max_jump:
            self._implausible(packet, expected)
        if self.session is None:
            self.session = packet.session
            self.first_sequence = sequence
        if sequence > expected:
            self._gap(expected, sequence - 1)
            expected = sequence
        skip = expected - sequence  # already passed
        fresh = packet.messages[skip:]
        if skip > 0 and packet.messages:
            late = min(skip, len(packet.messages))
            reordered = self._fill(sequence, sequence + late - 1) if self._open else 0
            self.reordered += reordered
            self.missed -= reordered
            self.duplicates += late - reordered
        self.next_sequence = max(expected, sequence + len(packet.messages))
        if packet.is_end_of_session:
            self.ended = True
        return [(expected + i, message) for i, message in enumerate(fresh)]

    def _implausible(self, packet: MoldPacket, expected: int) -> None:
        """Raise for a packet too far ahead, unless it continues the last such one."""
        sequence = packet.sequence_number
        # NOTE: a packet without messages continues the jump only after one with them: a
        # heartbeat leaves the number where it was, so the same stray heartbeat twice (a
        # repeated datagram) was taken as a real jump and the rest of the feed was dropped as
        # reordered (found by a tester)
        if sequence == self._jump_to and (packet.messages or self._jump_moved):
            self._jump_to = None
            return
        self._jump_to = sequence + len(packet.messages)
        self._jump_moved = bool(packet.messages)
        hint = (
            " (a session under way? --join-late joins where it stands)"
            if self.first_sequence is None else ""
        )  # fmt: skip
        raise MoldFormatError(
            f"sequence number {sequence} is {sequence - expected} past the next expected, "
            f"{expected}: more than the {self.max_jump} messages a gap may plausibly hold; "
            f"ignored as a stray{hint}",
            "implausible_sequence",
        )

    def discard(self, first: int, last: int, count: int) -> Gap:
        """Messages `first`..`last` (`count` of them) were handed out but their consumer could
        not take them (its queue was full): they are a gap like a lost datagram's."""
        gap = self._gap(first, last, count)
        self.discarded += count
        return gap

    def undecodable(self, sequence: int) -> Gap:
        """Message `sequence` came but could not be decoded: a gap of one (not expected
        again)."""
        return self._gap(sequence, sequence, 1)

    def _gap(self, first: int, last: int, count: int | None = None) -> Gap:
        gap = self.last_gap = Gap(first, last)
        self.gap_count += 1
        if count is None:  # (a discarded datagram's messages are not expected again)
            count = last - first + 1
            self._open.append((first, last))
            if len(self._open) > KEEP_OPEN_GAPS:
                del self._open[0]
        self.missed += count
        if len(self.gaps) < KEEP_GAPS:
            self.gaps.append(gap)
        return gap

    def _fill(self, first: int, last: int) -> int:
        """Messages `first`..`last` came after the stream passed them: take the ones inside
        open gaps out of those gaps, and return how many they were."""
        filled = 0
        open_gaps = self._open
        index = len(open_gaps) - 1
        while index >= 0:  # from the latest: a reordered datagram is usually a recent one
            gap_first, gap_last = open_gaps[index]
            if gap_last < first:
                break
            if gap_first <= last:
                low, high = max(first, gap_first), min(last, gap_last)
                filled += high - low + 1
                rest = [(gap_first, low - 1)] if gap_first < low else []
                if high < gap_last:
                    rest.append((high + 1, gap_last))
                open_gaps[index : index + 1] = rest
            index -= 1
        return filled


class MoldUdpReceiver(asyncio.DatagramProtocol):
    """Receives MoldUDP64 datagrams and calls `on_message(sequence, message)` for each new
    ITCH message in order, and `on_packet(messages, received_ns)` once per datagram with its
    new messages (if any) and the monotonic time it was taken in; `on_gap(gap)` for each gap.
    `on_packet` returning False refuses the datagram (its consumer's queue is full): its
    messages become a gap (`SequenceTracker.discard`), as if the datagram had been lost.
    Datagrams that do not parse are counted in `bad_packets` (by kind, with the first few
    reasons), never raised into the event loop.
    `ended` is set by the session's end-of-session packet (or by its owner, to stop);
    `last_received_ns` is when the last datagram (heartbeats too) came in.
    """

    def __init__(
        self,
        on_message: Callable[[int, Message], None] | None = None,
        *,
        on_packet: OnPacket | None = None,
        on_gap: Callable[[Gap], None] | None = None,
        next_sequence: int | None = 1,
        max_jump: int = MAX_JUMP,
    ) -> None:
        self.tracker = SequenceTracker(next_sequence, max_jump)
        self.on_message = on_message
        self.on_packet = on_packet
        self.on_gap = on_gap
        self.bad_packets = BadPackets()
        self.ended = asyncio.Event()
        self.last_received_ns = 0

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.last_received_ns = received = time.monotonic_ns()
        tracker = self.tracker
        gaps = tracker.gap_count
        try:
            fresh = tracker.accept(decode_packet(data))
        except MoldFormatError as error:
            self.bad_packets.add(error.kind, str(error))
            return
        if tracker.gap_count != gaps and self.on_gap is not None:
            assert tracker.last_gap is not None
            self.on_gap(tracker.last_gap)
        decoded: list[Message] = []
        for sequence, body in fresh:
            try:
                message = decode_message(body)
            except ItchFormatError as error:
                # NOTE: a message received but not decoded is lost to the books as a lost
                # datagram's are: it was only counted, and rows after it said `book_gaps` 0
                self.bad_packets.add("bad_message", f"message {sequence}: {error}")
                gap = tracker.undecodable(sequence)
                if self.on_gap is not None:
                    self.on_gap(gap)
                continue
            if self.on_message is not None:
                self.on_message(sequence, message)
            decoded.append(message)
        on_packet = self.on_packet
        if decoded and on_packet is not None and on_packet(decoded, received) is False:
            gap = tracker.discard(fresh[0][0], fresh[-1][0], len(decoded))
            if self.on_gap is not None:
                self.on_gap(gap)
        if tracker.ended:
            self.ended.set()


async def open_receiver(
    on_message: Callable[[int, Message], None] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    on_packet: OnPacket | None = None,
    on_gap: Callable[[Gap], None] | None = None,
    next_sequence: int | None = 1,
    receive_buffer: int | None = None,
    max_jump: int = MAX_JUMP,
) -> tuple[asyncio.DatagramTransport, MoldUdpReceiver]:
    """Bind a receiver (port 0: any free port, read it from the transport's sockname);
    `receive_buffer`: the socket's receive buffer in bytes (the kernel may cap it)."""
    loop = asyncio.get_running_loop()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if receive_buffer is not None:
            with contextlib.suppress(OSError):  # a cap below it is the kernel's business
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.bind((host, port))
        sock.setblocking(False)
        transport, protocol = await loop.create_datagram_endpoint(
            lambda: MoldUdpReceiver(
                on_message,
                on_packet=on_packet,
                on_gap=on_gap,
                next_sequence=next_sequence,
                max_jump=max_jump,
            ),
            sock=sock,
        )
    except BaseException:
        sock.close()
        raise
    return transport, protocol
