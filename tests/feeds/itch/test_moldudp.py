"""MoldUDP64: packets, sequence tracking and gaps, and a receiver on a loopback socket."""

from __future__ import annotations

import asyncio

import pytest

from duetime.feeds.itch.moldudp import (
    KEEP_EXAMPLES,
    BadPackets,
    Gap,
    MoldFormatError,
    MoldPacket,
    MoldUdpReceiver,
    SequenceTracker,
    decode_packet,
    encode_packet,
    end_of_session_packet,
    heartbeat_packet,
    mold_packets,
    open_receiver,
)
from duetime.feeds.itch.parser import frame_index, read_messages
from duetime.feeds.itch.spec import Message
from duetime.feeds.itch.synth import session_bytes
from duetime.feeds.itch.writer import encode


def bodies(data: bytes) -> list[bytes]:
    """The ITCH messages of a framed stream, without their length prefixes."""
    index = frame_index(data)
    return [data[o + 2 : o + 2 + ((data[o] << 8) | data[o + 1])] for o in index.offsets]


MESSAGES = [encode("D", order_reference_number=n) for n in range(1, 8)]


def test_a_packet_round_trips() -> None:
    datagram = encode_packet("SESSION01", 42, MESSAGES[:3])
    assert datagram[:10] == b"SESSION01 "
    assert len(datagram) == 20 + 3 * (2 + 19)
    assert decode_packet(datagram) == MoldPacket("SESSION01", 42, 3, tuple(MESSAGES[:3]))


def test_heartbeat_and_end_of_session() -> None:
    beat = decode_packet(heartbeat_packet("S", 9))
    assert (beat.sequence_number, beat.is_heartbeat, beat.is_end_of_session) == (9, True, False)
    end = decode_packet(end_of_session_packet("S", 9))
    assert (end.sequence_number, end.is_heartbeat, end.is_end_of_session) == (9, False, True)
    assert end.messages == ()


@pytest.mark.parametrize(
    ("datagram", "words"),
    [
        (b"short", "20-byte header"),
        (encode_packet("S", 1, MESSAGES[:2])[:-1], "cut off"),
        (encode_packet("S", 1, MESSAGES[:2]) + b"\x00", "after the blocks"),
        (encode_packet("S", 1, MESSAGES[:2])[:41], "1 of 2 messages"),
        (heartbeat_packet("S", 1) + b"\x00\x01x", "has no messages"),
    ],
)
def test_malformed_packets_are_refused(datagram: bytes, words: str) -> None:
    with pytest.raises(MoldFormatError, match=words):
        decode_packet(datagram)


def test_session_names_longer_than_ten_are_refused() -> None:
    with pytest.raises(ValueError, match="at most 10"):
        encode_packet("ELEVENCHARS", 1)


def test_mold_packets_numbers_and_bounds_packets() -> None:
    packets = [decode_packet(p) for p in mold_packets(MESSAGES, "S", per_packet=3)]
    assert [(p.sequence_number, p.message_count) for p in packets] == [(1, 3), (4, 3), (7, 1)]
    small = list(mold_packets(MESSAGES, "S", per_packet=100, max_size=20 + 2 * 21))
    assert [decode_packet(p).message_count for p in small] == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="per_packet"):
        list(mold_packets(MESSAGES, "S", per_packet=0))


def test_the_tracker_reports_gaps_and_drops_duplicates() -> None:
    tracker = SequenceTracker()
    packets = [decode_packet(p) for p in mold_packets(MESSAGES, "S", per_packet=2)]
    # Sequence 1-2, 3-4, 5-6, 7: lose 3-4, repeat 1-2, then an overlapping resend of 5-7.
    assert tracker.accept(packets[0]) == [(1, MESSAGES[0]), (2, MESSAGES[1])]
    assert tracker.accept(packets[0]) == []
    assert tracker.accept(packets[2]) == [(5, MESSAGES[4]), (6, MESSAGES[5])]
    assert tracker.gaps == [Gap(3, 4)]
    resend = decode_packet(encode_packet("S", 5, MESSAGES[4:7]))
    assert tracker.accept(resend) == [(7, MESSAGES[6])]
    assert tracker.duplicates == 4
    assert tracker.next_sequence == 8
    assert not tracker.ended
    assert tracker.accept(decode_packet(heartbeat_packet("S", 10))) == []
    assert tracker.gaps == [Gap(3, 4), Gap(8, 9)]
    tracker.accept(decode_packet(end_of_session_packet("S", 10)))
    assert tracker.ended
    with pytest.raises(MoldFormatError, match="session"):
        tracker.accept(decode_packet(heartbeat_packet("OTHER", 10)))


@pytest.mark.parametrize("next_sequence", [1, None])
def test_sequence_zero_is_a_bad_packet_of_its_own(next_sequence: int | None) -> None:
    """Sessions number messages from 1: a datagram numbered 0 was counted as duplicates (or,
    first, made `first_sequence` 0 and claimed the session); now it is ignored, as bad."""
    receiver = MoldUdpReceiver(next_sequence=next_sequence)
    receiver.datagram_received(encode_packet("BAD", 0, MESSAGES[:2]), ("127.0.0.1", 9))
    receiver.datagram_received(heartbeat_packet("BAD", 0), ("127.0.0.1", 9))
    tracker = receiver.tracker
    assert (tracker.session, tracker.first_sequence, tracker.duplicates) == (None, None, 0)
    assert receiver.bad_packets.counts == {"zero_sequence": 2}
    assert "sequence number 0" in receiver.bad_packets.examples["zero_sequence"][0]
    assert tracker.accept(decode_packet(encode_packet("S", 1, MESSAGES[:1]))) == [(1, MESSAGES[0])]
    assert (tracker.session, tracker.first_sequence) == ("S", 1)


def test_a_late_joiner_syncs_to_the_first_packet() -> None:
    tracker = SequenceTracker(next_sequence=None)
    assert tracker.accept(decode_packet(encode_packet("S", 500, MESSAGES[:1]))) == [
        (500, MESSAGES[0])
    ]
    assert tracker.gaps == []


def test_the_loopback_receiver_decodes_every_message_and_reports_the_gap() -> None:
    data = session_bytes(seed=4, messages=3000)
    messages = bodies(data)
    packets = list(mold_packets(messages, "DUETIME", per_packet=20))
    lost = 5  # packet 5 never arrives: sequence numbers 101..120
    sent = [p for i, p in enumerate(packets) if i != lost]
    sent.append(end_of_session_packet("DUETIME", len(messages) + 1))
    received, gaps = asyncio.run(receive_over_loopback(sent))
    assert gaps == [Gap(101, 120)]
    streamed = list(read_messages(data))
    expected = [(i + 1, m) for i, m in enumerate(streamed) if not 101 <= i + 1 <= 120]
    assert received == expected


async def receive_over_loopback(
    datagrams: list[bytes],
) -> tuple[list[tuple[int, Message]], list[Gap]]:
    received: list[tuple[int, Message]] = []
    gaps: list[Gap] = []
    transport, receiver = await open_receiver(
        lambda sequence, message: received.append((sequence, message)), on_gap=gaps.append
    )
    loop = asyncio.get_running_loop()
    sender, _ = await loop.create_datagram_endpoint(
        asyncio.DatagramProtocol, remote_addr=transport.get_extra_info("sockname")
    )
    try:
        for datagram in datagrams:
            sender.sendto(datagram)
            await asyncio.sleep(0)  # let the receiver drain its socket as a live feed would
        await asyncio.wait_for(receiver.ended.wait(), timeout=10)
    finally:
        sender.close()
        transport.close()
    assert len(receiver.bad_packets) == 0
    return received, gaps


def test_the_receiver_counts_bad_datagrams_instead_of_raising() -> None:
    async def run() -> BadPackets:
        transport, receiver = await open_receiver(lambda s, m: None)
        receiver.datagram_received(b"junk", ("127.0.0.1", 1))
        receiver.datagram_received(encode_packet("S", 1, [b"Zbad"]), ("127.0.0.1", 1))
        transport.close()
        return receiver.bad_packets

    bad = asyncio.run(run())
    assert len(bad) == 2
    assert bad.counts == {"short": 1, "bad_message": 1}
    assert "20-byte header" in bad.examples["short"][0]
    assert "unknown message type" in bad.examples["bad_message"][0]


def test_a_message_that_cannot_be_decoded_is_a_gap_for_the_books() -> None:
    """It was only counted as a bad packet: rows after it said `book_gaps` 0 while the book
    missed that message."""
    gaps: list[Gap] = []
    receiver = MoldUdpReceiver(lambda s, m: None, on_gap=gaps.append)
    receiver.datagram_received(encode_packet("S", 1, MESSAGES[:1]), ("127.0.0.1", 1))
    receiver.datagram_received(encode_packet("S", 2, [MESSAGES[1][:-3]]), ("127.0.0.1", 1))
    assert gaps == [Gap(2, 2)]
    assert receiver.tracker.missed == 1
    assert receiver.bad_packets.counts == {"bad_message": 1}


def test_bad_datagrams_are_counted_by_kind_in_bounded_memory() -> None:
    """A flood of datagrams the feed cannot use (another session's, garbage) is counted per
    kind with the first few reasons: each one's reason string was once kept forever."""
    receiver = MoldUdpReceiver(lambda s, m: None)
    receiver.datagram_received(encode_packet("MINE", 1, MESSAGES[:1]), ("127.0.0.1", 1))
    other, junk = heartbeat_packet("OTHER", 1), b"x" * 7
    for n in range(20_000):
        receiver.datagram_received(other if n % 4 else junk, ("127.0.0.1", 1))
    bad = receiver.bad_packets
    assert len(bad) == 20_000
    assert bad.counts == {"other_session": 15_000, "short": 5_000}
    assert all(len(examples) <= KEEP_EXAMPLES for examples in bad.examples.values())
    assert list(bad.as_dict()) == ["other_session", "short"]  # the most first
    assert "session 'OTHER'" in bad.examples["other_session"][0]
    assert bad.note().startswith("20000 bad packet(s): other_session 15000 (the first: ")


def test_a_refused_datagram_is_a_gap() -> None:
    """A consumer that refuses a datagram (its queue is full) loses its messages: a gap of their
    sequence numbers, counted as missed and as discarded."""
    gaps: list[Gap] = []
    taken: list[int] = []

    def on_packet(messages: list[Message], _received: int) -> bool:
        taken.append(len(messages))
        return len(taken) != 2  # the second datagram is refused

    receiver = MoldUdpReceiver(on_packet=on_packet, on_gap=gaps.append)
    for packet in mold_packets(MESSAGES, "S", per_packet=3):
        receiver.datagram_received(packet, ("127.0.0.1", 9))
    assert taken == [3, 3, 1]
    assert gaps == [Gap(4, 6)]
    assert (receiver.tracker.missed, receiver.tracker.discarded) == (3, 3)
    assert receiver.tracker.next_sequence == 8


def test_a_stray_sequence_number_far_ahead_is_a_bad_packet_not_a_gap() -> None:
    """One datagram numbered near 2**63 once made every later message a 'duplicate' and
    reported ~9.2e18 missed messages: further ahead than `max_jump` it is ignored as a stray."""
    tracker = SequenceTracker(max_jump=1000)
    packets = [decode_packet(p) for p in mold_packets(MESSAGES, "S", per_packet=2)]
    assert len(tracker.accept(packets[0])) == 2
    stray = decode_packet(encode_packet("S", 2**63, MESSAGES[:1]))
    with pytest.raises(MoldFormatError, match="past the next expected, 3") as raised:
        tracker.accept(stray)
    assert raised.value.kind == "implausible_sequence"
    assert [n for n, _ in tracker.accept(packets[1])] == [3, 4]
    assert (tracker.missed, tracker.gap_count, tracker.duplicates) == (0, 0, 0)
    assert tracker.accept(decode_packet(encode_packet("S", 1003, MESSAGES[:1])))  # plausible
    assert tracker.gaps == [Gap(5, 1002)]


def test_a_jump_the_next_packet_continues_is_a_gap() -> None:
    """A feed that really jumped (a receiver cut off for long) goes on: the second packet past
    the bound that continues the first confirms the jump, and the lost messages are a gap."""
    tracker = SequenceTracker(max_jump=10)
    assert tracker.accept(decode_packet(encode_packet("S", 1, MESSAGES[:2])))
    with pytest.raises(MoldFormatError, match="as a stray"):
        tracker.accept(decode_packet(encode_packet("S", 5000, MESSAGES[:2])))
    fresh = tracker.accept(decode_packet(encode_packet("S", 5002, MESSAGES[2:4])))
    assert [n for n, _ in fresh] == [5002, 5003]
    assert tracker.gaps == [Gap(3, 5001)]
    assert tracker.missed == 4999


def test_a_first_datagram_far_ahead_names_join_late() -> None:
    tracker = SequenceTracker(next_sequence=1, max_jump=10)
    with pytest.raises(MoldFormatError, match="--join-late"):
        tracker.accept(decode_packet(encode_packet("S", 500, MESSAGES[:1])))
    assert tracker.first_sequence is None


def test_a_datagram_that_comes_after_its_gap_is_reordered_not_missed() -> None:
    """Datagrams overtaken on the way were reported missed though they came: the messages of a
    gap that come later are counted reordered (still not handed out: the stream moved on),
    and only what never comes stays missed; a repeat after that is a duplicate."""
    tracker = SequenceTracker()
    packets = [decode_packet(p) for p in mold_packets(MESSAGES, "S", per_packet=2)]  # 1-2 ...
    tracker.accept(packets[0])
    tracker.accept(packets[2])  # 5-6: a gap 3-4
    tracker.accept(decode_packet(encode_packet("S", 8, MESSAGES[:1])))  # a gap at 7
    assert (tracker.missed, tracker.gaps) == (3, [Gap(3, 4), Gap(7, 7)])
    assert tracker.accept(packets[1]) == []  # 3-4, late
    assert (tracker.missed, tracker.reordered, tracker.duplicates) == (1, 2, 0)
    assert tracker.accept(decode_packet(encode_packet("S", 4, MESSAGES[:4]))) == []  # 4-7
    assert (tracker.missed, tracker.reordered, tracker.duplicates) == (0, 3, 3)
    assert tracker.gaps == [Gap(3, 4), Gap(7, 7)]  # the gaps as they were seen
