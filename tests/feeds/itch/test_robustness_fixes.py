"""Defects a black-box tester found (t70), each pinned: a stray heartbeat repeated ended a live
feed, `itch book --engine numba` read endless input without bound, `--depth` of 2**64 failed
in numba's typing, option values that passed validation overflowed later. (`itch send
--on-error stop` leaving the session open is in test_live.py, with the sender's tests.)"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from duetime.cli import main
from duetime.feeds.itch import book_command, parser
from duetime.feeds.itch.moldudp import (
    MoldFormatError,
    MoldUdpReceiver,
    SequenceTracker,
    decode_packet,
    encode_packet,
    end_of_session_packet,
    heartbeat_packet,
)
from duetime.feeds.itch.writer import encode, frame

STRAY = 2**63
MESSAGES = [encode("D", order_reference_number=n) for n in range(1, 9)]


def _adds(count: int) -> bytes:
    """`count` framed Add Orders of one stock on 50 price levels of its bid side."""
    return b"".join(
        frame(encode("A", stock_locate=1, timestamp=ref, order_reference_number=ref,
                     buy_sell_indicator="B", shares=100, stock="AAPL",
                     price=1_000_000 + (ref % 50) * 100))
        for ref in range(1, count + 1)
    )  # fmt: skip


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


# 1. `itch listen`: a stray heartbeat repeated is no jump of the feed


def test_the_same_stray_heartbeat_twice_does_not_end_the_feed() -> None:
    """The tester's datagrams: 1-3, a heartbeat numbered 2**63 twice, 4-5, 6-8, the end. The
    second heartbeat was taken as the feed continuing the first one's jump (a heartbeat leaves
    the number where it was): a gap of ~2**63 was recorded, and every later message was
    dropped as reordered (3 of 8 applied). Now both are strays and all 8 come."""
    taken: list[int] = []
    receiver = MoldUdpReceiver(lambda sequence, _message: taken.append(sequence))
    stray = heartbeat_packet("DUETIME", STRAY)
    datagrams = [
        encode_packet("DUETIME", 1, MESSAGES[0:3]), stray, stray,
        encode_packet("DUETIME", 4, MESSAGES[3:5]), encode_packet("DUETIME", 6, MESSAGES[5:8]),
        end_of_session_packet("DUETIME", 9),
    ]  # fmt: skip
    for datagram in datagrams:
        receiver.datagram_received(datagram, ("127.0.0.1", 9))
    tracker = receiver.tracker
    assert taken == list(range(1, 9))
    assert (tracker.missed, tracker.gap_count, tracker.reordered) == (0, 0, 0)
    assert tracker.duplicates == 0
    assert receiver.bad_packets.counts == {"implausible_sequence": 2}
    assert tracker.ended


@pytest.mark.parametrize("first", ["heartbeat", "messages"])
def test_a_jump_is_still_confirmed_once_the_numbering_moves_on(first: str) -> None:
    """A feed that really jumped still goes on: a heartbeat at the new number and then its
    messages, or messages and then a heartbeat at the number after them, confirm the jump."""
    tracker = SequenceTracker(max_jump=10)
    assert tracker.accept(decode_packet(encode_packet("S", 1, MESSAGES[:2])))
    if first == "heartbeat":
        stray, then = heartbeat_packet("S", 5000), encode_packet("S", 5000, MESSAGES[2:4])
        fresh = [5000, 5001]
    else:
        stray, then = encode_packet("S", 5000, MESSAGES[2:4]), heartbeat_packet("S", 5002)
        fresh = []
    with pytest.raises(MoldFormatError, match="as a stray"):
        tracker.accept(decode_packet(stray))
    assert [n for n, _ in tracker.accept(decode_packet(then))] == fresh
    missed_to = 4999 if first == "heartbeat" else 5001
    assert tracker.gaps[0] == (3, missed_to)
    assert tracker.next_sequence == 5002


def test_a_late_joiner_does_not_sync_to_a_heartbeat() -> None:
    """--join-late synced to the first datagram, a stray heartbeat numbered 2**63 too: every
    real message after it was a duplicate. A heartbeat now sets nothing; the first datagram
    with messages sets the sequence."""
    tracker = SequenceTracker(next_sequence=None)
    assert tracker.accept(decode_packet(heartbeat_packet("S", STRAY))) == []
    assert (tracker.session, tracker.first_sequence) == (None, None)
    fresh = tracker.accept(decode_packet(encode_packet("S", 1, MESSAGES[:3])))
    assert [n for n, _ in fresh] == [1, 2, 3]
    assert (tracker.session, tracker.first_sequence, tracker.duplicates) == ("S", 1, 0)


# 2. `itch book --engine numba`: the stream read whole is bounded by the memory available


@pytest.mark.parametrize("packed", ["plain", "gzip"])
def test_book_numba_refuses_a_stream_longer_than_memory_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    packed: str,
) -> None:  # fmt: skip
    """`itch book /dev/zero --engine numba` (or a gzip bomb) read the stream into memory with
    no bound: ~1 GB/s until a MemoryError traceback or the OOM killer. Here the memory
    available is made 50,000 bytes (room for a 10,000-byte stream): a plain file over it is
    refused before it is read, a gzip file (small on disk) once its stream passes it."""
    pytest.importorskip("numba")
    data = _adds(1000)  # 38,000 bytes
    path = tmp_path / "long.itch"
    path.write_bytes(gzip.compress(data) if packed == "gzip" else data)
    monkeypatch.setattr(book_command, "_memory_available", lambda: 50_000)
    out = tmp_path / "out.json"
    assert main(["itch", "book", str(path), "--json", str(out), "--engine", "numba"]) == 1
    err = _one_line(capsys)
    assert f"duetime itch book: {path}: the stream is over 10,000 bytes uncompressed" in err
    assert "--engine python or auto streams it" in err
    assert not out.exists()
    assert main(["itch", "book", str(path), "--json", str(out)]) == 0  # (auto: streamed)


def test_book_numba_says_when_memory_runs_out_while_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A limit on the address space (which MemAvailable does not show) ended in a MemoryError
    traceback from `read_stream`: now one line, exit 1."""
    pytest.importorskip("numba")
    path = tmp_path / "f.itch"
    path.write_bytes(_adds(10))

    def out_of_memory(*_args: object) -> None:
        raise MemoryError

    monkeypatch.setattr(parser, "read_stream", out_of_memory)
    out = tmp_path / "out.json"
    assert main(["itch", "book", str(path), "--json", str(out), "--engine", "numba"]) == 1
    assert "memory ran out while the stream was read" in _one_line(capsys)


# 3. `itch book --depth` of 2**64 or more: the same summary both ways


@pytest.mark.parametrize("depth", [2**63 - 1, 2**63, 2**64, 10**30])
def test_book_depth_past_int64_lists_every_level_on_both_engines(
    tmp_path: Path, depth: int
) -> None:
    """`--depth 18446744073709551616` failed on the compiled pass (numba: "Int value is too
    large"), and listed every level on the Python books: both now write the same JSON."""
    pytest.importorskip("numba")
    path = tmp_path / "f.itch"
    path.write_bytes(_adds(200))
    summaries = []
    for engine in ("numba", "python"):
        out = tmp_path / f"{engine}.json"
        code = main(["itch", "book", str(path), "--json", str(out), "--engine", engine,
                     "--depth", str(depth)])  # fmt: skip
        assert code == 0
        summaries.append(out.read_text(encoding="utf-8"))
    assert summaries[0] == summaries[1]
    stock = json.loads(summaries[0])["stocks"]["#1"]
    assert (len(stock["book"]["bids"]), stock["book_depth"]) == (50, depth)


# 4. option values that passed validation and overflowed later: cases of
# test_commands.py's test_numbers_out_of_range_nan_or_infinite_are_refused_naming_the_option
