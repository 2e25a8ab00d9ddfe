"""ITCH 5.0 spec, writer and readers: every message type round trip, and every malformed case."""

from __future__ import annotations

import gzip
import io
import random
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from duetime.feeds.itch import parser
from duetime.feeds.itch.fastbook import load_buffer
from duetime.feeds.itch.parser import (
    ItchFormatError,
    decode_columns,
    decode_message,
    frame_index,
    read_messages,
)
from duetime.feeds.itch.spec import LETTERS, MAX_TIMESTAMP, PUBLISHED_LENGTHS, SPECS, Message
from duetime.feeds.itch.synth import session_bytes
from duetime.feeds.itch.writer import ItchWriter, encode, frame

U64 = (1 << 64) - 1
U32 = (1 << 32) - 1
HEADER = {"stock_locate": 65535, "tracking_number": 65535, "timestamp": MAX_TIMESTAMP}

# One message of each type with boundary values: max integers, 1- and 8-character alpha.
SAMPLES: dict[str, dict[str, int | str]] = {
    "S": {"event_code": "O"},
    "R": {"stock": "ZVZZTXYZ", "market_category": "Q", "financial_status_indicator": " ",
          "round_lot_size": U32, "round_lots_only": "N", "issue_classification": "C",
          "issue_sub_type": "ZZ", "authenticity": "P", "short_sale_threshold_indicator": "N",
          "ipo_flag": " ", "luld_reference_price_tier": "1", "etp_flag": "N",
          "etp_leverage_factor": U32, "inverse_indicator": "N"},
    "H": {"stock": "A", "trading_state": "T", "reserved": " ", "reason": "MWC1"},
    "Y": {"stock": "AAPL", "reg_sho_action": "2"},
    "L": {"mpid": "GSCO", "stock": "A", "primary_market_maker": "Y", "market_maker_mode": "N",
          "market_participant_state": "A"},
    "V": {"level1": U64, "level2": 0, "level3": 4_200 * 10**8},
    "W": {"breached_level": "3"},
    "K": {"stock": "ZVZZTXYZ", "ipo_quotation_release_time": U32,
          "ipo_quotation_release_qualifier": "A", "ipo_price": U32},
    "J": {"stock": "A", "auction_collar_reference_price": U32, "upper_auction_collar_price": 1,
          "lower_auction_collar_price": 0, "auction_collar_extension": U32},
    "h": {"stock": "A", "market_code": "Q", "operational_halt_action": "H"},
    "A": {"order_reference_number": U64, "buy_sell_indicator": "B", "shares": U32,
          "stock": "ZVZZTXYZ", "price": U32},
    "F": {"order_reference_number": 1, "buy_sell_indicator": "S", "shares": 1, "stock": "A",
          "price": 1, "attribution": "VIRT"},
    "E": {"order_reference_number": U64, "executed_shares": U32, "match_number": U64},
    "C": {"order_reference_number": 1 << 63, "executed_shares": 1, "match_number": 0,
          "printable": "N", "execution_price": U32},
    "X": {"order_reference_number": U64, "cancelled_shares": U32},
    "D": {"order_reference_number": U64},
    "U": {"original_order_reference_number": U64, "new_order_reference_number": (1 << 32) + 1,
          "shares": U32, "price": U32},
    "P": {"order_reference_number": 0, "buy_sell_indicator": "B", "shares": U32, "stock": "A",
          "price": U32, "match_number": U64},
    "Q": {"shares": U64, "stock": "ZVZZTXYZ", "cross_price": U32, "match_number": U64,
          "cross_type": "O"},
    "B": {"match_number": U64},
    "I": {"paired_shares": U64, "imbalance_shares": U64, "imbalance_direction": "B",
          "stock": "A", "far_price": U32, "near_price": 0, "current_reference_price": 1,
          "cross_type": "C", "price_variation_indicator": " "},
    "N": {"stock": "ZVZZTXYZ", "interest_flag": "A"},
    "O": {"stock": "A", "open_eligibility_status": "Y", "minimum_allowable_price": 0,
          "maximum_allowable_price": U32, "near_execution_price": 1, "near_execution_time": U64,
          "lower_price_range_collar": 1, "upper_price_range_collar": U32},
}  # fmt: skip


def expected(letter: str) -> Message:
    return SPECS[letter].cls(letter, **HEADER, **SAMPLES[letter])  # type: ignore[arg-type]


def sample_stream() -> bytes:
    return b"".join(frame(encode(letter, **HEADER, **SAMPLES[letter])) for letter in LETTERS)


def test_spec_has_the_23_published_types_and_lengths() -> None:
    assert LETTERS == "SRHYLVWKJhAFECXDUPQBINO"
    assert {letter: spec.length for letter, spec in SPECS.items()} == PUBLISHED_LENGTHS
    for letter, spec in SPECS.items():
        assert spec.cls._fields == ("type", *(f.name for f in spec.fields))
        assert [f.name for f in spec.fields[:3]] == ["stock_locate", "tracking_number", "timestamp"]
        ends = [f.offset + f.width for f in spec.fields]
        assert [f.offset for f in spec.fields[1:]] == ends[:-1], letter


@pytest.mark.parametrize("letter", list(LETTERS))
def test_every_type_round_trips_with_boundary_values(letter: str) -> None:
    body = encode(letter, **HEADER, **SAMPLES[letter])
    assert len(body) == PUBLISHED_LENGTHS[letter]
    assert body[0:1] == letter.encode()
    assert decode_message(body) == expected(letter)
    assert list(read_messages(frame(body))) == [expected(letter)]


def test_alpha_fields_are_space_padded_on_the_wire_and_stripped_when_read() -> None:
    body = encode("A", order_reference_number=1, buy_sell_indicator="B", shares=1, stock="A",
                  price=1)  # fmt: skip
    assert body[24:32] == b"A       "
    message = decode_message(body)
    assert message.stock == "A"  # type: ignore[union-attr]
    assert decode_message(encode("S", event_code=" ")).event_code == " "  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("letter", "fields", "words"),
    [
        ("Z", {}, "unknown ITCH message type 'Z'"),
        ("D", {"order_ref": 1}, "unknown field(s) ['order_ref']"),
        ("D", {}, "missing field(s) ['order_reference_number']"),
        ("D", {"order_reference_number": 1 << 64}, "'order_reference_number' must be in"),
        ("D", {"order_reference_number": -1}, "must be in [0, 18446744073709551615]"),
        ("D", {"order_reference_number": 1, "timestamp": 1 << 48}, "'timestamp' must be in"),
        ("D", {"order_reference_number": "1"}, "must be an int"),
        ("Y", {"stock": "TOOLONGSYM", "reg_sho_action": "0"}, "at most 8 characters"),
        ("Y", {"stock": "ÄPPL", "reg_sho_action": "0"}, "printable ASCII"),
        ("Y", {"stock": "A", "reg_sho_action": "01"}, "exactly one character"),
        ("Y", {"stock": 7, "reg_sho_action": "0"}, "must be a str"),
    ],
)
def test_encode_names_the_field_and_the_rule(
    letter: str, fields: dict[str, int | str], words: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        encode(letter, **fields)


def test_frame_rejects_empty_and_oversized_bodies() -> None:
    with pytest.raises(ValueError, match=r"1\.\.65535"):
        frame(b"")
    with pytest.raises(ValueError, match=r"1\.\.65535"):
        frame(b"x" * 65536)


def test_offsets_are_those_of_the_length_prefixes() -> None:
    data = sample_stream()
    pairs = list(read_messages(data, offsets=True))
    starts = [offset for offset, _ in pairs]
    assert starts == list(frame_index(data).offsets)
    for offset, message in pairs:
        assert data[offset + 2] == ord(message.type)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_chunk_boundaries_give_the_same_messages(seed: int) -> None:
    data = session_bytes(seed=seed, messages=3000)
    whole = list(read_messages(data))
    assert list(read_messages(ShortReads(data, random.Random(seed)))) == whole


class ShortReads(io.RawIOBase):
    """A file that returns 1 to 97 bytes per read, whatever was asked."""

    def __init__(self, data: bytes, rng: random.Random) -> None:
        self.data, self.pos, self.rng = data, 0, rng

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        take = self.rng.randint(1, 97)
        chunk = self.data[self.pos : self.pos + take]
        self.pos += len(chunk)
        return chunk


def test_gzip_is_detected_in_paths_bytes_and_file_objects(tmp_path: Path) -> None:
    data = session_bytes(seed=5, messages=2000)
    plain = list(read_messages(data))
    path = tmp_path / "session.itch"  # no .gz suffix: the magic bytes decide
    with ItchWriter(path, gzip=True) as writer:
        writer.write_framed(data, len(plain))
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    assert list(read_messages(path)) == plain
    assert list(read_messages(str(path))) == plain
    assert list(read_messages(gzip.compress(data))) == plain
    with path.open("rb") as file:
        assert list(read_messages(file)) == plain
    assert list(read_messages(ShortReads(gzip.compress(data), random.Random(1)))) == plain


@pytest.mark.parametrize("damage", ["cut short", "bad checksum", "bad deflate data"])
def test_a_damaged_gzip_stream_is_an_error_with_its_offset_never_a_crash(damage: str) -> None:
    """Cut short or failing its checksum, the stream ends with a bad_gzip error where it could
    be read no further (then the frame it cut, if any, is truncated); deflate data damaged in
    the middle may first decode to garbage, which the framing reports."""
    data = session_bytes(seed=5, messages=60_000)  # (over a MiB: a chunk is read before)
    plain = list(read_messages(data))
    packed = bytearray(gzip.compress(data))
    if damage == "cut short":
        packed = packed[: len(packed) * 3 // 4]
    elif damage == "bad checksum":
        packed[-6] ^= 0xFF  # (the CRC-32 in the trailer)
    else:
        packed[len(packed) // 2 : len(packed) // 2 + 64] = bytes(64)
    with pytest.raises(ItchFormatError) as raised:
        list(read_messages(bytes(packed)))
    reader = read_messages(bytes(packed), on_error="skip")
    read = list(reader)
    reasons = [e.reason for e in reader.errors]
    if damage != "bad deflate data":
        error = raised.value
        assert error.reason == "bad_gzip"
        assert 0 <= error.offset <= len(data)
        assert str(error).startswith(f"ITCH stream at byte offset {error.offset}: the gzip data")
        assert read == plain[: len(read)]  # what came before the damage, then the end
        assert reasons[0] == "bad_gzip"
        assert set(reasons[1:]) <= {"truncated"}
    assert "bad_gzip" in reasons
    with pytest.raises(ItchFormatError, match="the gzip data is damaged or cut short"):
        load_buffer(bytes(packed))


def adds(n: int) -> bytes:
    """`n` framed 36-byte A messages, packed by hand (not by the writer): 38 bytes each."""
    return b"".join(
        struct.pack(">HcHH6sQcI8sI", 36, b"A", 1, 0, i.to_bytes(6, "big"), i + 1, b"B", 10,
                    b"X       ", 100 + i % 50)
        for i in range(n)
    )  # fmt: skip


def inflatable(packed: bytes) -> int:
    """How many bytes zlib itself decompresses of a (damaged) one-member gzip file."""
    return len(zlib.decompressobj(wbits=31).decompress(packed))


@pytest.mark.parametrize("n", [100, 40_000])  # under and over the 1 MiB read chunk
@pytest.mark.parametrize("damage", ["junk after", "no trailer", "cut short", "bad checksum"])
def test_a_damaged_gzip_file_gives_every_message_before_the_damage(damage: str, n: int) -> None:
    """Every message zlib can decompress before the damage comes through (skip reads them, stop
    raises after them), and bad_gzip's offset is how far the uncompressed stream goes: not the
    start of the failing read, with the messages decompressed in it lost."""
    data = adds(n)
    packed = gzip.compress(data, mtime=0)
    damaged = {
        "junk after": packed + b"JUNK",
        "no trailer": packed[:-8],
        "cut short": packed[: len(packed) * 3 // 4],
        "bad checksum": packed[:-8] + bytes([packed[-8] ^ 0xFF]) + packed[-7:],
    }[damage]
    reach = len(data) if damage != "cut short" else inflatable(damaged)
    assert 0 < reach <= len(data)
    whole = list(read_messages(data, offsets=True))
    before = [message for offset, message in whole if offset + 38 <= reach]
    reader = read_messages(damaged, on_error="skip")
    assert list(reader) == before
    reasons = [(e.reason, e.offset) for e in reader.errors]
    cut = [] if reach % 38 == 0 else [("truncated", reach - reach % 38)]
    assert reasons == [("bad_gzip", reach), *cut]
    stopped = read_messages(damaged)
    got = []
    with pytest.raises(ItchFormatError) as raised:
        got.extend(stopped)
    assert got == before
    assert (raised.value.reason, raised.value.offset) == ("bad_gzip", reach)


def test_gzip_members_and_zero_padding_are_read_and_other_trailing_bytes_are_damage() -> None:
    data = adds(3000)
    # (a frame split across the two members)
    one, two = gzip.compress(data[:1001], mtime=0), gzip.compress(data[1001:], mtime=0)
    whole = list(read_messages(data))
    for packed in (one + two, one + bytes(100) + two + bytes(7), one + two + b"\x00"):
        assert list(read_messages(packed)) == whole
        assert list(read_messages(ShortReads(packed, random.Random(2)))) == whole
    for tail, reach in ((b"\x00\x00x", len(data)), (b"\x1f", len(data)), (b"PK" + two, 1001)):
        packed = one + two + tail if reach == len(data) else one + tail
        reader = read_messages(packed, on_error="skip")
        assert len(list(reader)) == reach // 38
        assert reader.errors[0].reason == "bad_gzip"
        assert reader.errors[0].offset == reach


def test_a_gzip_file_is_read_in_bounded_chunks() -> None:
    """A file that inflates 1000-fold still comes out a chunk at a time (never whole)."""
    packed = gzip.compress(adds(1) * 100_000, mtime=0)  # 3.8 MB from ~15 KB
    chunks = list(parser._file_chunks(io.BytesIO(packed)))
    assert b"".join(chunks) == adds(1) * 100_000
    assert max(len(chunk) for chunk in chunks) <= parser.CHUNK_SIZE


def test_writer_round_trips_through_a_file_and_leaves_file_objects_open(tmp_path: Path) -> None:
    path = tmp_path / "all.itch"
    with ItchWriter(path) as writer:
        for letter in LETTERS:
            writer.write(letter, **HEADER, **SAMPLES[letter])
    assert writer.messages == 23
    assert list(read_messages(path)) == [expected(letter) for letter in LETTERS]
    buffer = io.BytesIO()
    with ItchWriter(buffer) as writer:
        writer.write("W", breached_level="1")
    assert not buffer.closed
    assert buffer.getvalue() == frame(encode("W", breached_level="1"))


# --- malformed input -----------------------------------------------------------------------

GOOD = frame(encode("D", order_reference_number=7))  # 21 bytes framed


@pytest.mark.parametrize(
    ("bad", "reason", "expected_len", "got"),
    [
        (b"\x00\x05Zabcd", "unknown_type", None, 5),
        (b"\x00\x12" + encode("B", match_number=1)[:18], "bad_length", 19, 18),
        (b"\x00\x14" + encode("D", order_reference_number=1) + b"!", "bad_length", 19, 20),
        (b"\x00\x00", "zero_length", None, 0),
    ],
)
def test_a_bad_frame_stops_with_its_offset_or_is_skipped(
    bad: bytes, reason: str, expected_len: int | None, got: int
) -> None:
    data = GOOD + GOOD + bad + GOOD
    with pytest.raises(ItchFormatError) as caught:
        list(read_messages(data))
    error = caught.value
    assert (error.offset, error.reason, error.expected, error.got) == (
        42,
        reason,
        expected_len,
        got,
    )
    assert "byte offset 42" in str(error)
    assert isinstance(error, ValueError)

    reader = read_messages(data, on_error="skip")
    assert [m.order_reference_number for m in reader] == [7, 7, 7]  # type: ignore[union-attr]
    assert [(e.offset, e.reason) for e in reader.errors] == [(42, reason)]
    assert reader.messages == 3

    with pytest.raises(ItchFormatError) as fast:
        frame_index(data)
    assert (fast.value.offset, fast.value.reason) == (42, reason)
    with pytest.raises(ItchFormatError) as slow:
        frame_index(data, engine="python")
    assert (slow.value.offset, slow.value.reason) == (42, reason)


@pytest.mark.parametrize("cut", [1, 2, 3, 20])
def test_a_truncated_tail_stops_or_ends_the_stream(cut: int) -> None:
    data = GOOD + GOOD + GOOD[:cut]
    with pytest.raises(ItchFormatError) as caught:
        list(read_messages(data))
    assert (caught.value.offset, caught.value.reason) == (42, "truncated")
    reader = read_messages(ShortReads(data, random.Random(cut)), on_error="skip")
    assert len(list(reader)) == 2
    assert [(e.offset, e.reason) for e in reader.errors] == [(42, "truncated")]
    # a stream cut inside a length prefix declares nothing: the prefix itself is cut
    said = "ends 1 byte into the frame's 2-byte length prefix" if cut == 1 else "declares"
    assert said in str(caught.value)
    for engine in ("numba", "python"):
        with pytest.raises(ItchFormatError, match=said) as fast:
            frame_index(data, engine=engine)  # type: ignore[arg-type]
        assert fast.value.offset == 42


def test_skipping_recovers_from_several_bad_frames_in_a_row() -> None:
    data = b"\x00\x00" + b"\x00\x03zzz" + GOOD + b"\x00\x02D\x00" + GOOD + b"\x00\x09DD"
    reader = read_messages(data, on_error="skip")
    assert len(list(reader)) == 2
    assert [(e.offset, e.reason) for e in reader.errors] == [
        (0, "zero_length"),
        (2, "unknown_type"),
        (28, "bad_length"),
        (53, "truncated"),
    ]


def test_skipping_keeps_a_count_and_only_the_first_errors() -> None:
    """A run of zero bytes is a bad frame every 2 bytes: the reader counts them all but keeps
    the errors of the first `KEPT_ERRORS` only (one each took 4.9 GB for 20 MiB of zeros)."""
    bad = 3 * parser.KEPT_ERRORS
    reader = read_messages(GOOD + bytes(2 * bad) + GOOD, on_error="skip")
    assert len(list(reader)) == 2
    assert reader.skipped == bad
    assert len(reader.errors) == parser.KEPT_ERRORS
    assert (reader.errors[0].offset, reader.errors[0].reason) == (len(GOOD), "zero_length")


def test_decode_message_checks_type_and_length() -> None:
    with pytest.raises(ItchFormatError, match="unknown message type"):
        decode_message(b"Zxx")
    with pytest.raises(ItchFormatError, match="must be 19 bytes"):
        decode_message(encode("D", order_reference_number=1)[:-1])
    with pytest.raises(ItchFormatError, match="zero length"):
        decode_message(b"")


def test_on_error_must_be_stop_or_skip() -> None:
    with pytest.raises(ValueError, match="on_error"):
        read_messages(b"", on_error="ignore")  # type: ignore[call-overload]


# --- the whole-file fast path ---------------------------------------------------------------


@pytest.mark.parametrize("engine", ["numba", "python"])
def test_fast_path_columns_equal_the_streamed_messages(engine: parser.Engine) -> None:
    data = session_bytes(seed=11, messages=20_000) + sample_stream()
    index = frame_index(np.frombuffer(data, dtype=np.uint8), engine=engine)
    streamed = list(read_messages(data, offsets=True))
    assert list(index.offsets) == [offset for offset, _ in streamed]
    assert bytes(index.types) == "".join(m.type for _, m in streamed).encode("latin-1")
    columns = decode_columns(data, index, LETTERS, engine=engine)
    by_type: dict[str, list[tuple[int, Message]]] = {}
    for offset, message in streamed:
        by_type.setdefault(message.type, []).append((offset, message))
    for letter, rows in columns.items():
        assert len(rows) == len(by_type[letter]), letter
        for row, (offset, message) in zip(rows, by_type[letter], strict=True):
            assert row["offset"] == offset
            assert row_values(row, letter) == tuple(message)[1:], letter


def row_values(row: np.void, letter: str) -> tuple[int | str, ...]:
    values: list[int | str] = []
    for field in SPECS[letter].fields:
        value = row[field.name]
        if field.kind == "alpha":
            text = bytes(value).ljust(field.width).decode("latin-1")
            values.append(text if field.width == 1 else text.rstrip(" "))
        else:
            values.append(int(value))
    return tuple(values)


def test_fast_path_rejects_a_buffer_that_is_not_bytes() -> None:
    with pytest.raises(ValueError, match="1-d uint8"):
        frame_index(np.zeros(4, dtype=np.int32))
    with pytest.raises(ValueError, match="engine"):
        frame_index(b"", engine="cuda")  # type: ignore[arg-type]
    empty = frame_index(b"")
    assert len(empty.offsets) == 0
    assert decode_columns(b"", empty)["A"].shape == (0,)
