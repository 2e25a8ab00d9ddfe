"""The live path: `duetime itch send` plays a file out as MoldUDP64 datagrams, and `duetime itch
listen` (`UdpFeed` into `FeedRun.run_live`) takes them through the same books, features and
model as a file replay, on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duetime.cli import main
from duetime.execution import affinity
from duetime.feeds.itch.book import Books
from duetime.feeds.itch.cli import _print_report, parse_address
from duetime.feeds.itch.features import Features
from duetime.feeds.itch.live import UdpFeed, _groups, send_session
from duetime.feeds.itch.moldudp import (
    HEADER,
    MAX_DATAGRAM,
    MoldUdpReceiver,
    decode_packet,
    encode_packet,
    end_of_session_packet,
    heartbeat_packet,
    mold_packets,
)
from duetime.feeds.itch.parser import decode_message, read_frames, read_messages
from duetime.feeds.itch.predictors import Answer
from duetime.feeds.itch.run import FeedRun, RunOptions, Trigger
from duetime.feeds.itch.synth import write_session
from duetime.feeds.itch.tally import PredictionLog
from duetime.feeds.itch.writer import encode

pytestmark = pytest.mark.timeout(120)

MESSAGES = 2500
_REAL_FRAMES = [
    encode("D", stock_locate=1, timestamp=ts, order_reference_number=ts) for ts in range(1, 41)
]
_REAL_PACKETS = list(mold_packets(_REAL_FRAMES, "FUZZ", per_packet=4))


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("live") / "session.itch"
    write_session(path, seed=11, messages=MESSAGES)
    return path


class Recorder:
    """A predictor that answers at once with a constant row per event (the model is not what
    these tests look at) and keeps what it was asked."""

    def __init__(self) -> None:
        self.input = type("Spec", (), {"name": "features", "shape": (21,)})()
        self.max_batch = 8
        self.answered_elsewhere = False
        self.max_in_flight = 0
        self.batches: list[np.ndarray] = []

    def submit(self, array: np.ndarray, due_ns: int, answer: Answer) -> None:
        self.batches.append(array.copy())
        answer(np.zeros((len(array), 3), np.float32), None)

    async def aclose(self) -> None:
        return None


def _file_vectors(path: Path) -> np.ndarray:
    books, features, rows = Books(), Features(deeplob_length=0), []
    for message in read_messages(path):
        event = books.apply(message)
        if event is not None:
            rows.append(features.update(event, books.book(event.locate)).copy())
    return np.stack(rows)


async def _send_in_thread(path: Path, address: tuple[str, int], **options: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(
        None, lambda: send_session(path, address, **options)
    )


def test_datagrams_group_one_timestamp_at_most_per_packet_and_a_datagram_of_bytes() -> None:
    def body(ts: int, ref: int) -> bytes:
        return encode("D", stock_locate=1, timestamp=ts, order_reference_number=ref)

    bodies = [body(5, 1), body(5, 2), body(5, 3), body(6, 4), body(7, 5), body(7, 6)]
    recorded = list(_groups(iter(bodies), per_packet=2, limit=None, full=False))
    assert [(ts, len(batch)) for ts, batch in recorded] == [(5, 2), (5, 1), (6, 1), (7, 2)]
    full = list(_groups(iter(bodies), per_packet=4, limit=5, full=True))
    assert [len(batch) for _, batch in full] == [4, 1]  # any timestamps; the limit stops it
    big = [body(9, ref) for ref in range(200)]  # 19-byte bodies: 65 fit in 1,400 bytes
    sizes = [HEADER.size + sum(2 + len(b) for b in batch) for _, batch in
             _groups(iter(big), per_packet=1000, limit=None, full=False)]  # fmt: skip
    assert max(sizes) <= MAX_DATAGRAM
    assert sum(len(batch) for _, batch in _groups(iter(big), 1000, None, False)) == 200


def test_a_sent_session_arrives_whole_and_in_order(session: Path) -> None:
    async def scenario() -> tuple[list[Any], int, int]:
        feed = await UdpFeed.open(idle_s=None)
        got: list[Any] = []
        feed.start(lambda messages, _arrival: got.extend(messages))
        report = await _send_in_thread(session, feed.address, pace="max", per_packet=16)
        await asyncio.wait_for(feed.ended(), 10)
        feed.stop()
        return got, report.messages, feed.missed

    got, sent, missed = asyncio.run(scenario())
    assert sent == MESSAGES
    assert missed == 0
    assert got == list(read_messages(session))


def test_send_is_not_late_on_a_timestamp_that_steps_back() -> None:
    """A timestamp behind the one before it, after a gap cut to max_gap, once made the sender
    report ~2**48 ns (days) of lateness: it is due at once."""
    stamps = [10, 2**48 - 1, 20, 30]
    data = b"".join(
        struct.pack(">H", 19) + encode("D", stock_locate=1, timestamp=ts, order_reference_number=1)
        for ts in stamps
    )
    report = send_session(data, ("127.0.0.1", 9), max_gap_ns=20_000_000)
    assert report.messages == 4
    assert report.late_p99_us is not None
    assert report.late_p99_us < 20_000  # (was ~2.8e11 µs)
    assert report.wall_s < 5


def test_send_says_what_it_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`itch book` and `itch run` said what `--on-error skip` stepped over; `itch send` said
    nothing, and a feed short of its malformed parts looked whole."""
    good = struct.pack(">H", 19) + encode(
        "D", stock_locate=1, timestamp=1, order_reference_number=1
    )
    path = tmp_path / "bad.itch"
    path.write_bytes(good + struct.pack(">H", 3) + b"?ab" + good)  # (an unknown type between)
    report = send_session(path, ("127.0.0.1", 9), pace="max", on_error="skip")
    assert (report.messages, report.skipped) == (2, 1)
    assert report.first_skipped is not None
    assert main(["itch", "send", str(path), "--udp", "127.0.0.1:9", "--pace", "max",
                 "--on-error", "skip"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "duetime itch send: " in err
    assert "skipped 1 malformed part(s)" in err, err


def test_a_quiet_stretch_is_filled_with_heartbeats_of_the_next_sequence_number() -> None:
    """A MoldUDP64 server sends a heartbeat (count 0, the next sequence number) about once a
    second while idle; `itch send` sent nothing in a quiet stretch, and a listener whose idle
    time was shorter than the stretch ended mid-feed. Here: 2.5 s between the 2nd and 3rd
    messages (under --max-gap), so at least one heartbeat, saying 3, comes between them."""
    stamps = [1_000, 2_000, 2_500_002_000]
    data = b"".join(
        struct.pack(">H", 19) + encode("D", stock_locate=1, timestamp=ts, order_reference_number=1)
        for ts in stamps
    )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver:
        receiver.bind(("127.0.0.1", 0))
        address = receiver.getsockname()
        report = send_session(data, address, max_gap_ns=5_000_000_000, session="QUIET")
        receiver.settimeout(5)  # (all were sent before send_session returned: queued here)
        packets = []
        while not packets or not packets[-1].is_end_of_session:
            packets.append(decode_packet(receiver.recv(2048)))
    kinds = [(p.sequence_number, p.message_count) for p in packets if not p.is_end_of_session]
    beats = kinds[2:-1]
    assert kinds[:2] == [(1, 1), (2, 1)], kinds
    assert kinds[-1] == (3, 1), kinds
    assert len(beats) >= 1, kinds
    assert beats == [(3, 0)] * len(beats)  # each a heartbeat of the next sequence number
    assert all(p.session == "QUIET" for p in packets)
    assert (report.messages, report.packets, report.heartbeats) == (3, 3, len(beats))


def test_the_raw_frames_are_the_file_s_messages(session: Path) -> None:
    frames = list(read_frames(session))
    assert len(frames) == MESSAGES
    assert frames[0][0:1] == b"S"  # the session starts with its system event
    decoded = [decode_packet(p).messages for p in mold_packets(frames, "X", per_packet=7)]
    assert [m for packet in decoded for m in packet] == frames


@pytest.mark.parametrize("busy_poll_us", [0, 20_000], ids=["sleeping", "busy-polling-warm"])
def test_a_live_run_sees_the_books_and_features_a_file_replay_sees(
    session: Path, busy_poll_us: int
) -> None:
    """Busy-polling, the feed also keeps its path warm on a book of its own between datagrams:
    the run's own books, features and requests are the same."""

    async def scenario() -> tuple[Any, Recorder]:
        predictor = Recorder()
        options = RunOptions(deadline_ns=10**9, pace="max", busy_poll_ns=busy_poll_us * 1000)
        run = FeedRun(predictor, options, PredictionLog(None, 3))
        assert (run._warmer is not None) == bool(busy_poll_us)
        feed = await UdpFeed.open(idle_s=None, busy_poll_us=busy_poll_us)
        sending = asyncio.ensure_future(
            _send_in_thread(session, feed.address, pace="recorded", speed=1e6)
        )
        stats = await asyncio.wait_for(run.run_live(feed), 30)
        await sending
        return stats, predictor

    stats, predictor = asyncio.run(scenario())
    expected = _file_vectors(session)
    assert stats.messages == MESSAGES
    assert stats.missed_messages == 0
    assert stats.book_events == stats.triggers == len(expected)
    assert stats.on_time == stats.triggers
    assert stats.late == stats.refused == 0
    assert all(len(batch) <= predictor.max_batch for batch in predictor.batches)
    np.testing.assert_array_equal(np.concatenate(predictor.batches), expected)


def test_a_limit_ends_a_live_run(session: Path) -> None:
    async def scenario() -> Any:
        run = FeedRun(Recorder(), RunOptions(limit=700), PredictionLog(None, 3))
        feed = await UdpFeed.open(idle_s=None)
        sending = asyncio.ensure_future(_send_in_thread(session, feed.address, pace="max"))
        stats = await asyncio.wait_for(run.run_live(feed), 30)
        await sending
        return stats

    stats = asyncio.run(scenario())
    assert stats.messages == 700


def test_lost_datagrams_are_counted_and_the_rest_still_applied(session: Path) -> None:
    frames = list(read_frames(session))[:400]
    packets = list(mold_packets(frames, "GAPPY", per_packet=10))
    lost = packets[5]  # messages 51..60

    async def scenario() -> tuple[Any, list[Sequence[Any]]]:
        feed = await UdpFeed.open(idle_s=None)
        got: list[Sequence[Any]] = []
        feed.start(lambda messages, _arrival: got.append(messages))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for packet in packets:
                if packet is not lost:
                    sock.sendto(packet, feed.address)
            sock.sendto(b"garbage", feed.address)
            sock.sendto(end_of_session_packet("GAPPY", len(frames) + 1), feed.address)
        await asyncio.wait_for(feed.ended(), 10)
        feed.stop()
        return feed, got

    feed, got = asyncio.run(scenario())
    assert feed.missed == 10
    assert feed.bad == 1
    assert sum(len(messages) for messages in got) == 390


def test_an_idle_feed_ends_after_its_idle_time() -> None:
    async def scenario() -> None:
        feed = await UdpFeed.open(idle_s=0.2)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(encode_packet("IDLE", 1, []), feed.address)  # a heartbeat starts it
        await asyncio.wait_for(feed.ended(), 5)
        feed.stop()

    asyncio.run(scenario())


def test_addresses_are_checked() -> None:
    assert parse_address("127.0.0.1:31000", "--udp") == ("127.0.0.1", 31000)
    assert parse_address("[::1]:9", "--udp") == ("::1", 9)
    for bad in ("127.0.0.1", ":80", "host:port", "127.0.0.1:70000"):
        with pytest.raises(ValueError, match="--udp: expected HOST:PORT"):
            parse_address(bad, "--udp")


def test_listen_and_send_from_the_command_line(
    tmp_path: Path, session: Path, demo_repo: Path
) -> None:
    """The two commands as a user runs them: the listener prints where it listens, the sender
    plays the file there, and the listener's report accounts for every message and event."""
    report = tmp_path / "live.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable, "-m", "duetime", "itch", "listen", "--udp", "127.0.0.1:0", "--model",
        "orderbook", "--repository", str(demo_repo), "--deadline-us", "200000", "--json",
        str(report), "-q",
    ]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env) as listener:  # fmt: skip
        try:
            assert listener.stdout is not None
            line = listener.stdout.readline()
            assert line.startswith("listening on udp://127.0.0.1:"), line
            port = line.strip().rsplit(":", 1)[1]
            sent = subprocess.run(
                [sys.executable, "-m", "duetime", "itch", "send", str(session), "--udp",
                 f"127.0.0.1:{port}", "--speed", "1000000"],
                capture_output=True, text=True, env=env, timeout=60, check=True,
            )  # fmt: skip
            assert f"sent {MESSAGES} messages" in sent.stdout
            _, errors = listener.communicate(timeout=60)
            assert listener.returncode == 0, errors
        finally:
            if listener.poll() is None:
                listener.kill()
    result = json.loads(report.read_text(encoding="utf-8"))
    books = Books()
    events = sum(books.apply(m) is not None for m in read_messages(session))
    assert result["messages"] == MESSAGES
    assert result["missed_messages"] == 0
    assert result["book_events"] == result["triggers"] == events
    outcomes = result["on_time"] + result["late_dropped"] + result["refused"]
    assert outcomes == events
    assert result["errors"] == 0
    assert result["on_time"] > 0


def test_send_refuses_a_bad_address_clearly(
    session: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from duetime.cli import main

    assert main(["itch", "send", str(session), "--udp", "nowhere"]) == 2
    assert "--udp: expected HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["é", "ELEVENCHARS"])
def test_send_refuses_a_bad_session_name_naming_the_flag(
    session: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """A name that is not ASCII once failed with a bare codec error."""
    assert main(["itch", "send", str(session), "--udp", "127.0.0.1:9", "--session", name]) == 2
    err = capsys.readouterr().err
    assert "duetime itch send: --session: a MoldUDP64 session name has at most 10 " in err
    assert repr(name) in err


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=64),  # noise
            st.builds(  # a header with any sequence and count, then noise
                lambda seq, count, tail: HEADER.pack(b"FUZZ".ljust(10), seq, count) + tail,
                st.integers(0, 2**64 - 1),
                st.integers(0, 0xFFFF),
                st.binary(max_size=48),
            ),
            st.sampled_from(_REAL_PACKETS),  # real packets, in any order and repeated
            st.sampled_from(_REAL_PACKETS).map(lambda p: p[: len(p) // 2]),  # cut short
        ),
        max_size=40,
    )
)
def test_no_datagram_breaks_the_feed(datagrams: list[bytes]) -> None:
    """Whatever arrives, the receiver raises nothing into the loop and hands on decoded
    messages only, each sequence number once and in increasing order (a datagram's messages
    once more, together, to `on_packet`); what it cannot use it counts."""
    numbered: list[tuple[int, Any]] = []
    packets: list[Any] = []
    receiver = MoldUdpReceiver(
        lambda sequence, message: numbered.append((sequence, message)),
        on_packet=lambda messages, _arrival: packets.extend(messages),
        next_sequence=None,
    )
    for datagram in datagrams:
        receiver.datagram_received(datagram, ("127.0.0.1", 9))
    sequences = [sequence for sequence, _ in numbered]
    assert sequences == sorted(set(sequences))
    assert packets == [message for _, message in numbered]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(_REAL_PACKETS), max_size=30))
def test_real_packets_in_any_order_give_their_own_messages(datagrams: list[bytes]) -> None:
    """Reordered, repeated and missing packets of one session: each message handed on is the
    one sent under its sequence number, once; the numbers never seen are gaps."""
    numbered: list[tuple[int, Any]] = []
    receiver = MoldUdpReceiver(
        lambda sequence, message: numbered.append((sequence, message)), next_sequence=1
    )
    for datagram in datagrams:
        receiver.datagram_received(datagram, ("127.0.0.1", 9))
    sequences = [sequence for sequence, _ in numbered]
    assert sequences == sorted(set(sequences))
    for sequence, message in numbered:
        assert message == decode_message(_REAL_FRAMES[sequence - 1])
    lost = sum(gap.last - gap.first + 1 for gap in receiver.tracker.gaps)
    assert len(numbered) + lost == (sequences[-1] if sequences else 0)
    # each number of a gap either never came (missed) or came after it (reordered)
    assert receiver.tracker.missed + receiver.tracker.reordered == lost


def test_listen_that_cannot_hold_its_cpu_latency_limit_says_so_and_binds_nothing(
    tmp_path: Path,
    demo_repo: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    missing = tmp_path / "cpu_dma_latency"
    limit = affinity.CpuLatencyLimit
    monkeypatch.setattr(affinity, "CpuLatencyLimit", lambda limit_us: limit(limit_us, missing))
    code = main([
        "itch", "listen", "--udp", "127.0.0.1:0", "--model", "orderbook", "--repository",
        str(demo_repo), "--cpu-dma-latency-us", "0",
    ])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 1
    assert "listening on" not in out
    assert "duetime itch listen: setting 'cpu_dma_latency_us' (--cpu-dma-latency-us)" in err
    assert str(missing) in err


class _Transport:
    """Stands in for a datagram transport when a test hands the receiver datagrams itself."""

    def close(self) -> None:
        return None

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 9)


def test_a_full_queue_drops_datagrams_and_reports_them_missed() -> None:
    """Datagrams read faster than the run applies them wait in a bounded queue: one that comes
    while it is full is dropped, and its sequence numbers are a gap in the report (the queue
    once grew without bound, hiding the loss a full socket buffer would have shown)."""
    frames = [encode("D", stock_locate=1, timestamp=n, order_reference_number=n) for n in
              range(1, 301)]  # fmt: skip
    packets = list(mold_packets(frames, "FULL", per_packet=10))  # 30 datagrams of 10 messages

    async def scenario() -> FeedRun:
        receiver = MoldUdpReceiver(next_sequence=1)
        feed = UdpFeed(_Transport(), receiver, idle_s=None)  # type: ignore[arg-type]
        options = RunOptions(deadline_ns=10**9, pace="max", max_queued=40, keep_warm=False)
        run = FeedRun(Recorder(), options, PredictionLog(None, 3))
        running = asyncio.ensure_future(run.run_live(feed))
        await asyncio.sleep(0)  # started: it takes datagrams
        for packet in packets:  # one burst, in one turn of the loop: nothing applied meanwhile
            receiver.datagram_received(packet, ("127.0.0.1", 9))
            assert run._queued <= 40
        receiver.datagram_received(end_of_session_packet("FULL", 301), ("127.0.0.1", 9))
        await asyncio.wait_for(running, 10)
        return run

    run = asyncio.run(scenario())
    report = run.stats.report()
    assert report["messages"] == 40
    assert report["missed_messages"] == report["queue_dropped_messages"] == 260
    assert report["gaps"] == 26
    assert report["first_gaps"][:2] == [[41, 50], [51, 60]]
    assert run._queued == 0


@pytest.mark.parametrize("join_late", [False, True], ids=["from-1", "join-late"])
def test_a_first_datagram_lost_or_reordered_is_missed_unless_joining_late(
    join_late: bool,
) -> None:
    """A MoldUDP64 session starts at sequence 1: a feed whose first datagram seen is the second
    one (the first came after it, or never) has missed the first one's messages. Joining late
    (`--join-late`) starts where the first datagram seen is, as the feed once always did, and
    silently dropped the session's start."""
    frames = [encode("D", stock_locate=1, timestamp=n, order_reference_number=n) for n in
              range(1, 41)]  # fmt: skip
    packets = list(mold_packets(frames, "START", per_packet=8))

    async def scenario() -> tuple[Any, list[Any]]:
        feed = await UdpFeed.open(idle_s=None, join_late=join_late)
        got: list[Any] = []
        feed.start(lambda messages, _arrival: got.extend(messages) or True)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for packet in [packets[1], packets[0], *packets[2:]]:  # the first two swapped
                sock.sendto(packet, feed.address)
            sock.sendto(end_of_session_packet("START", 41), feed.address)
        await asyncio.wait_for(feed.ended(), 10)
        feed.stop()
        return feed.statistics(), got

    statistics, got = asyncio.run(scenario())
    assert len(got) == 32  # the first datagram's 8 came too late to be applied
    assert statistics.first_sequence == 9
    if join_late:
        assert (statistics.missed, statistics.gaps, statistics.duplicates) == (0, 0, 8)
    else:  # a gap from 1, whose messages came after all: reordered, not applied
        assert statistics.first_gaps == ((1, 8),)
        assert (statistics.missed, statistics.reordered) == (0, 8)


def test_a_stray_datagram_far_ahead_does_not_end_the_feed() -> None:
    """A datagram of the session numbered 2**63 among valid ones is a bad packet: every later
    message is still applied (they were all dropped as duplicates), nothing is missed, and
    the datagram the feed repeats is counted as duplicates."""
    frames = [encode("D", stock_locate=1, timestamp=n, order_reference_number=n) for n in
              range(1, 41)]  # fmt: skip
    packets = list(mold_packets(frames, "ROGUE", per_packet=8))
    stray = encode_packet("ROGUE", 2**63, frames[:1])

    async def scenario() -> FeedRun:
        receiver = MoldUdpReceiver(next_sequence=1)
        feed = UdpFeed(_Transport(), receiver, idle_s=None)  # type: ignore[arg-type]
        options = RunOptions(deadline_ns=10**9, pace="max", keep_warm=False)
        run = FeedRun(Recorder(), options, PredictionLog(None, 3))
        running = asyncio.ensure_future(run.run_live(feed))
        await asyncio.sleep(0)
        datagrams = [*packets[:2], stray, packets[1], *packets[2:]]
        for datagram in [*datagrams, end_of_session_packet("ROGUE", 41)]:
            receiver.datagram_received(datagram, ("127.0.0.1", 9))
        await asyncio.wait_for(running, 10)
        return run

    report = asyncio.run(scenario()).stats.report()
    assert report["messages"] == 40
    assert report["missed_messages"] == report["gaps"] == 0
    assert report["bad_packets"] == 1
    assert report["duplicate_messages"] == 8


def _listen(demo_repo: Path, report: Path, *options: str) -> tuple[subprocess.Popen[str], int]:
    """`duetime itch listen` in a process of its own, and the port it took."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable, "-m", "duetime", "itch", "listen", "--udp", "127.0.0.1:0", "--model",
        "orderbook", "--repository", str(demo_repo), "--deadline-us", "200000", "--json",
        str(report), "--idle-s", "10", *options,
    ]  # fmt: skip
    listener = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert listener.stdout is not None
    line = listener.stdout.readline()
    assert line.startswith("listening on udp://127.0.0.1:"), line
    return listener, int(line.strip().rsplit(":", 1)[1])


def _fed(listener: subprocess.Popen[str], port: int, datagrams: list[bytes]) -> tuple[str, str]:
    """`datagrams` sent to a listener on `port`, then its stdout and stderr once it ended
    (killed if it did not: the test fails on its exit code)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for datagram in datagrams:
                sock.sendto(datagram, ("127.0.0.1", port))
        return listener.communicate(timeout=60)
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()


def test_listen_says_why_packets_were_bad_and_a_session_change(
    tmp_path: Path, session: Path, demo_repo: Path
) -> None:
    """Bad packets were only counted: the listener now prints each kind's count and first
    reason on stderr (as `itch run` does for skipped frames) and puts them in the report; a
    feed that switches session mid-stream says so."""
    frames = list(read_frames(session))[:400]
    old = list(mold_packets(frames[:200], "OLD", per_packet=10))
    new = list(mold_packets(frames[200:], "NEW", per_packet=10, first_sequence=201))
    report = tmp_path / "report.json"
    listener, port = _listen(demo_repo, report, "-q")
    _, errors = _fed(listener, port, [*old, b"junk", *new, end_of_session_packet("OLD", 201)])
    assert listener.returncode == 0, errors
    result = json.loads(report.read_text(encoding="utf-8"))
    assert result["session"] == "OLD"
    assert result["messages"] == 200
    kinds = result["bad_packet_kinds"]
    assert {kind: entry["count"] for kind, entry in kinds.items()} == {
        "other_session": 20, "short": 1
    }  # fmt: skip
    assert result["bad_packets"] == 21
    first = kinds["other_session"]["examples"][0]
    assert "session 'NEW' (sequence 201) in the stream of session 'OLD'" in first
    assert "21 bad packet(s): other_session 20 (the first: a datagram of session 'NEW'" in errors
    assert "short 1 (the first: a packet has a 20-byte header, got 4 bytes)" in errors


def _adds_then_deletes(count: int) -> list[bytes]:
    adds = [encode("A", stock_locate=1, timestamp=n, order_reference_number=n,
                   buy_sell_indicator="B", shares=100, stock="GAP", price=10_000 + n)
            for n in range(1, count + 1)]  # fmt: skip
    deletes = [encode("D", stock_locate=1, timestamp=100 + n, order_reference_number=n)
               for n in range(1, count + 1)]  # fmt: skip
    return adds + deletes


def test_after_a_gap_the_books_and_predictions_say_they_may_be_incomplete() -> None:
    """A lost datagram's adds leave the books without those orders: the run reports the book
    anomalies it causes and that the books may be incomplete, and each prediction row says
    how many gaps came before its event (they went on as if nothing had happened)."""
    packets = list(mold_packets(_adds_then_deletes(20), "GAP", per_packet=5))  # 8 datagrams
    out = io.StringIO()

    async def scenario() -> FeedRun:
        receiver = MoldUdpReceiver(next_sequence=1)
        feed = UdpFeed(_Transport(), receiver, idle_s=None)  # type: ignore[arg-type]
        options = RunOptions(deadline_ns=10**9, pace="max", keep_warm=False)
        run = FeedRun(Recorder(), options, PredictionLog(out, 3))
        running = asyncio.ensure_future(run.run_live(feed))
        await asyncio.sleep(0)
        for datagram in [packets[0], *packets[2:], end_of_session_packet("GAP", 41)]:
            receiver.datagram_received(datagram, ("127.0.0.1", 9))  # adds 6-10 lost
            await asyncio.sleep(0)
        await asyncio.wait_for(running, 10)
        return run

    run = asyncio.run(scenario())
    report = run.stats.report()
    assert report["missed_messages"] == 5
    assert report["book_incomplete"] is True
    assert report["end_of_session"] is True
    assert report["book_anomalies"] == {"unknown_ref": 5}  # the lost orders' deletes
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert len(rows) == report["on_time"] == 30  # 5 adds, the gap, 10 adds, 15 deletes
    assert [row["book_gaps"] for row in rows] == ["0"] * 5 + ["1"] * 25


def test_a_feed_that_ends_without_its_end_of_session_says_so() -> None:
    """A sender that stopped at a bad frame leaves the session open (`itch send --on-error
    stop`): the listener ends on its idle timeout, and its report says that no end of session
    came, where it had looked like a whole session (found by a tester)."""
    packets = list(mold_packets(_adds_then_deletes(5), "OPEN", per_packet=5))

    async def scenario() -> FeedRun:
        receiver = MoldUdpReceiver(next_sequence=1)
        feed = UdpFeed(_Transport(), receiver, idle_s=0.05)  # type: ignore[arg-type]
        options = RunOptions(deadline_ns=10**9, pace="max", keep_warm=False)
        run = FeedRun(Recorder(), options, PredictionLog(io.StringIO(), 3))
        running = asyncio.ensure_future(run.run_live(feed))
        await asyncio.sleep(0)
        for datagram in [*packets, heartbeat_packet("OPEN", 11)]:
            receiver.datagram_received(datagram, ("127.0.0.1", 9))
            await asyncio.sleep(0)
        await asyncio.wait_for(running, 10)
        return run

    report = asyncio.run(scenario()).stats.report()
    assert (report["messages"], report["missed_messages"]) == (10, 0)
    assert report["end_of_session"] is False
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _print_report({**report, "model": "m", "deadline_us": 1, "pace": "live",
                       "engine": "python"})  # fmt: skip
    assert "no end-of-session packet came" in out.getvalue()


def test_listen_says_what_a_gap_did_to_the_books(tmp_path: Path, demo_repo: Path) -> None:
    """The listener prints the book anomalies on stderr as `itch book` does, and its report and
    prediction rows say the books may be incomplete after the gap."""
    packets = list(mold_packets(_adds_then_deletes(20), "GAP", per_packet=5))
    report, predictions = tmp_path / "report.json", tmp_path / "predictions.csv"
    listener, port = _listen(demo_repo, report, "--predictions", str(predictions))
    out, errors = _fed(listener, port, [packets[0], *packets[2:], end_of_session_packet("GAP", 41)])
    assert listener.returncode == 0, errors
    # (the address bound, not the one asked for: port 0)
    assert f"udp://127.0.0.1:{port}: book anomalies: unknown_ref=5" in errors
    assert "the books may lack orders (1 sequence gap(s), first sequence 1)" in out
    result = json.loads(report.read_text(encoding="utf-8"))
    assert result["file"] == f"udp://127.0.0.1:{port}"
    assert (result["missed_messages"], result["book_incomplete"]) == (5, True)
    assert result["book_anomalies"] == {"unknown_ref": 5}
    with predictions.open(newline="", encoding="utf-8") as rows:
        gaps = [row["book_gaps"] for row in csv.DictReader(rows)]
    assert gaps == ["0"] * 5 + ["1"] * 25


def _adds(count: int) -> bytes:
    """`count` framed Add Orders of one stock, a microsecond apart."""
    fields = {"stock_locate": 1, "buy_sell_indicator": "B", "shares": 100, "stock": "TEST"}
    return b"".join(
        struct.pack(">H", 36)
        + encode("A", **fields, timestamp=34_200_000_000_000 + ref * 1000,
                 order_reference_number=ref, price=1_000_000)
        for ref in range(1, count + 1)
    )  # fmt: skip


def _heard(sock: socket.socket) -> tuple[int, list[tuple[int, int]]]:
    """The messages a listening socket took, and the (sequence number, count) of each packet
    without messages after them, until none came for half a second (a heartbeat's count is 0,
    an end of session's 0xFFFF)."""
    messages, control = 0, []
    sock.settimeout(0.5)
    with contextlib.suppress(TimeoutError):
        while True:
            packet = decode_packet(sock.recv(65536))
            if packet.messages:
                messages += len(packet.messages)
            else:
                control.append((packet.sequence_number, packet.message_count))
    return messages, control


@pytest.mark.parametrize("pace", ["max", "recorded"])
@pytest.mark.parametrize("bad", ["unknown_type", "truncated"])
def test_send_stopped_by_a_bad_frame_sends_what_came_before_and_leaves_the_session_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pace: str, bad: str
) -> None:
    """`--on-error stop` on 10 messages then a bad frame (an unknown type, or a file cut short
    as one still being written is): at full pace 0 of the 10 went out, at the recorded pace 9
    (the datagram being filled was lost), and nothing after them. Then the 10 went, and the
    session's end, which told a listener that a feed cut short was whole (found by a tester).
    Now the 10 go, then a heartbeat (3 times, for a listener's --idle-s), never the end, and
    the error (with its offset) is reported: exit 1."""
    good = _adds(10)
    tail = struct.pack(">H", 11) + b"Z" + bytes(10) if bad == "unknown_type" else good[:20]
    path = tmp_path / "bad.itch"
    path.write_bytes(good + tail)
    with _udp_socket() as sock:
        report = send_session(path, sock.getsockname(), pace=pace, on_error="stop")
        assert _heard(sock) == (10, [(11, 0)] * 3)
    assert report.messages == 10
    assert report.format_error is not None
    assert (report.format_error.offset, report.format_error.reason) == (len(good), bad)
    assert report.ended is False
    with _udp_socket() as sock:
        code = main(["itch", "send", str(path), "--udp", f"127.0.0.1:{sock.getsockname()[1]}",
                     "--pace", pace, "--on-error", "stop"])  # fmt: skip
        assert _heard(sock) == (10, [(11, 0)] * 3)
    assert code == 1
    out, err = capsys.readouterr()
    assert "sent 10 messages" in out
    assert f"at byte offset {len(good)}" in err, err
    assert "the session was left open (no end-of-session sent" in err
    assert err.count("\n") == 1, err


def test_send_of_a_whole_file_ends_the_session() -> None:
    """The session's end goes out (3 times) after the last message of an intact file."""
    with _udp_socket() as sock:
        report = send_session(_adds(10), sock.getsockname(), pace="max")
        assert _heard(sock) == (10, [(11, 0xFFFF)] * 3)
    assert report.ended is True


def _udp_socket() -> socket.socket:
    """A UDP socket bound on 127.0.0.1 (any free port), reads timing out after 5 s."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    return sock


def test_listen_names_symbols_never_seen_in_the_feed(tmp_path: Path, demo_repo: Path) -> None:
    """A `--symbols` typo made a listener a silent no-op: now it names the symbol at the end
    (the feed's locate 1 has no directory entry: its key is #1)."""
    packets = list(mold_packets(_adds_then_deletes(5), "SYM", per_packet=5))
    report = tmp_path / "report.json"
    listener, port = _listen(demo_repo, report, "--symbols", "#1,#2")
    _, errors = _fed(listener, port, [*packets, end_of_session_packet("SYM", 11)])
    assert listener.returncode == 0, errors
    assert "--symbols never seen in the feed: #2" in errors, errors
    result = json.loads(report.read_text(encoding="utf-8"))
    assert (result["unknown_symbols"], result["triggers"]) == (["#2"], 10)


def test_a_live_run_counts_its_wall_time_from_its_first_datagram() -> None:
    """Found by a tester: a 10 ms feed sent 6 s after the listener started read "0 msg/s over
    6.0 s" (the wait for the first datagram counted, and the idle timeout after the last), and
    the report's max tick-to-prediction was a histogram bucket's bound, not the largest."""
    packets = list(mold_packets(_adds_then_deletes(5), "WALL", per_packet=5))
    out = io.StringIO()

    async def scenario() -> FeedRun:
        receiver = MoldUdpReceiver(next_sequence=1)
        feed = UdpFeed(_Transport(), receiver, idle_s=0.3)  # type: ignore[arg-type]
        options = RunOptions(deadline_ns=10**9, pace="max", keep_warm=False)
        run = FeedRun(Recorder(), options, PredictionLog(out, 3))
        running = asyncio.ensure_future(run.run_live(feed))
        await asyncio.sleep(0.5)  # (the listener waits for its feed)
        for datagram in packets:
            receiver.datagram_received(datagram, ("127.0.0.1", 9))
            await asyncio.sleep(0)
        await asyncio.wait_for(running, 10)  # (then it ends on its idle timeout)
        return run

    report = asyncio.run(scenario()).stats.report()
    assert report["messages"] == 10
    assert report["wall_s"] < 0.25, report["wall_s"]
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    largest = max(int(row["latency_us"]) for row in rows)
    assert report["tick_to_prediction_us"]["max"] == largest


def test_a_live_run_of_one_datagram_that_asks_nothing_counts_no_wait() -> None:
    """Found by a tester: one datagram that triggered no request had a span of 0, and the wall
    time fell back to the listener's whole life (the 5 s before it came included)."""
    packet = next(iter(mold_packets(_adds_then_deletes(5)[:5], "ONE", per_packet=5)))

    async def scenario() -> FeedRun:
        receiver = MoldUdpReceiver(next_sequence=1)
        feed = UdpFeed(_Transport(), receiver, idle_s=0.2)  # type: ignore[arg-type]
        options = RunOptions(
            deadline_ns=10**9, pace="max", keep_warm=False, trigger=Trigger(every=10**6)
        )
        run = FeedRun(Recorder(), options, PredictionLog(io.StringIO(), 3))
        running = asyncio.ensure_future(run.run_live(feed))
        await asyncio.sleep(0.5)
        receiver.datagram_received(packet, ("127.0.0.1", 9))
        await asyncio.wait_for(running, 10)
        return run

    report = asyncio.run(scenario()).stats.report()
    assert (report["messages"], report["triggers"]) == (5, 0)
    assert report["wall_s"] < 0.25, report["wall_s"]
