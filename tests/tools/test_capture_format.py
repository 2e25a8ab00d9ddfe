"""The capture format: records round-trip through CaptureWriter and CaptureReader; damaged files
give errors naming the record and offset; JSON Lines conversion and `duetime capture`."""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from duetime.cli import main
from duetime.tools.capture import (
    CapturedRequest,
    CapturedTensor,
    CaptureFormatError,
    CaptureReader,
    CaptureTruncated,
    CaptureWriter,
    read_capture,
)
from duetime.tools.capture import format as fmt
from duetime.tools.capture.jsonl import JsonlError, convert

ALL_DTYPES = {
    "BOOL": np.array([[True, False]]), "INT8": np.array([-3, 4], np.int8),
    "INT16": np.array([-300], np.int16), "INT32": np.arange(6, dtype=np.int32).reshape(2, 3),
    "INT64": np.array([-(2**40)], np.int64), "UINT8": np.array([255], np.uint8),
    "UINT16": np.array([65535], np.uint16), "UINT32": np.array([2**32 - 1], np.uint32),
    "UINT64": np.array([2**64 - 1], np.uint64), "FP16": np.array([0.5], np.float16),
    "FP32": np.linspace(0, 1, 40, dtype=np.float32).reshape(1, 40),
    "FP64": np.array([np.pi]), "BYTES": np.array([[b"ab", b""], [b"\x00\xff", b"c"]], object),
}  # fmt: skip


def make_record(**changes: object) -> CapturedRequest:
    record = CapturedRequest(
        arrival_ns=1_234_567, protocol="grpc", model="mlp", version="2", request_id="r1",
        inputs=[CapturedTensor.of("x", ALL_DTYPES["FP32"])], outputs_wanted=("y", "z"),
        parameters={"timeout": 20_000, "nested": {"a": [1, 2]}}, due_in_ns=20_000_000,
        priority=1, headers={"x-tenant": "blue", "traceparent": "00-abc"},
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736", status=504, error="too late: é",
        latency_ns=25_000_000, answered_version="2", variant="int8",
        outputs=[CapturedTensor.of("y", np.zeros((1, 3), np.float32))],
    )  # fmt: skip
    return replace(record, **changes)  # type: ignore[arg-type]


def write(path: Path, *records: CapturedRequest) -> Path:
    with CaptureWriter(path, meta={"purpose": "test"}) as writer:
        for record in records:
            writer.write(record)
    return path


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    full = make_record()
    empty = make_record(
        version=None, outputs_wanted=None, parameters={}, due_in_ns=None, headers={},
        trace_id=None, error=None, answered_version=None, variant=None, outputs=None, status=200,
        request_id="", priority=0,
    )  # fmt: skip
    path = write(tmp_path / "a.cap", full, empty)
    with CaptureReader(path) as reader:
        assert reader.header.version == fmt.FORMAT_VERSION
        assert reader.header.meta == {"purpose": "test"}
        assert reader.header.created_by.startswith("duetime")
        assert abs(reader.header.start_wall_ns / 1e9 - __import__("time").time()) < 60
        assert list(reader) == [full, empty]
        assert reader.count == 2
        assert reader.offset == path.stat().st_size


@pytest.mark.parametrize("datatype", sorted(ALL_DTYPES))
def test_every_datatype_round_trips(tmp_path: Path, datatype: str) -> None:
    array = ALL_DTYPES[datatype]
    tensor = CapturedTensor.of("t", array)
    assert tensor.datatype == datatype
    (record,) = read_capture(write(tmp_path / "d.cap", make_record(inputs=[tensor])))
    got = record.inputs[0].array()
    assert got.shape == array.shape
    np.testing.assert_array_equal(got, array)


def test_bytes_layout_is_length_prefixed() -> None:
    tensor = CapturedTensor.of("s", np.array(["hé", b"x"], dtype=object))
    assert tensor.data == b"\x03\x00\x00\x00h\xc3\xa9\x01\x00\x00\x00x"


def test_non_contiguous_and_big_endian_arrays_are_written_little_endian(tmp_path: Path) -> None:
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    big = np.arange(3, dtype=">i4")
    record = make_record(inputs=[CapturedTensor.of("a", strided), CapturedTensor.of("b", big)])
    (back,) = read_capture(write(tmp_path / "s.cap", record))
    np.testing.assert_array_equal(back.inputs[0].array(), strided)
    np.testing.assert_array_equal(back.inputs[1].array(), big)
    assert back.inputs[1].data == np.arange(3, dtype="<i4").tobytes()


def test_credentials_and_wire_headers_are_not_written(tmp_path: Path) -> None:
    headers = {"authorization": "Bearer s", "cookie": "c", "proxy-authorization": "p",
               "content-length": "9", "x-keep": "yes"}  # fmt: skip
    (back,) = read_capture(write(tmp_path / "h.cap", make_record(headers=headers)))
    assert back.headers == {"content-length": "9", "x-keep": "yes"}


def test_recorder_encoding_matches_the_writer(tmp_path: Path) -> None:
    """The server's fast path (arrays by reference) and CapturedRequest give the same bytes."""
    array = np.arange(40, dtype=np.float32).reshape(1, 40)
    strings = np.array([b"a", b"bc"], dtype=object)
    direct = fmt.encode_record(
        arrival_ns=5, protocol="http", model="m", version=None, request_id="i",
        inputs=[("x", *_typed(array)), ("s", *_typed(strings))], outputs_wanted=None,
        parameters={"p": 1}, due_in_ns=7, priority=0, headers={"a": "b"}, trace_id=None,
        status=200, error=None, latency_ns=9, answered_version="1", variant="default",
        outputs=None,
    )  # fmt: skip
    (record,) = fmt_records(direct)
    assert fmt.encode_captured(record) == direct


def _typed(array: np.ndarray) -> tuple[str, tuple[int, ...], object]:
    datatype, data = fmt.tensor_data(array)
    return datatype, array.shape, data


def fmt_records(*encoded: tuple[bytes, bytes]) -> list[CapturedRequest]:
    return [fmt.decode_record(body) for _, body in encoded]


# -- damaged files -------------------------------------------------------------------------------


def two_records(tmp_path: Path) -> tuple[Path, bytes, int]:
    """A capture of two records; its bytes and the offset of the second record."""
    path = write(tmp_path / "two.cap", make_record(request_id="a"), make_record(request_id="b"))
    data = path.read_bytes()
    with CaptureReader(path) as reader:
        iterator = iter(reader)
        next(iterator)
        second = reader.offset
    return path, data, second


def test_bad_magic(tmp_path: Path) -> None:
    path = tmp_path / "x.cap"
    path.write_bytes(b"GIF89a" + b"\x00" * 40)
    with pytest.raises(CaptureFormatError, match=r"file header at byte offset 0: not a duetime"):
        CaptureReader(path)


def test_unknown_version(tmp_path: Path) -> None:
    path, data, _ = two_records(tmp_path)
    path.write_bytes(data[:8] + struct.pack("<H", 99) + data[10:])
    with pytest.raises(CaptureFormatError, match="format version 99"):
        CaptureReader(path)


def test_truncated_header(tmp_path: Path) -> None:
    path, data, _ = two_records(tmp_path)
    path.write_bytes(data[:20])
    with pytest.raises(CaptureTruncated, match="ends inside its header"):
        CaptureReader(path)


@pytest.mark.parametrize("keep", [3, 40])
def test_truncated_last_record_is_reported(tmp_path: Path, keep: int) -> None:
    path, data, second = two_records(tmp_path)
    path.write_bytes(data[: second + keep])
    with pytest.raises(CaptureTruncated) as caught:
        list(read_capture(path))
    assert (caught.value.index, caught.value.offset) == (1, second)
    assert f"record 1 at byte offset {second}" in str(caught.value)
    with CaptureReader(path, allow_truncated=True) as reader:
        assert [r.request_id for r in reader] == ["a"]
        assert reader.truncated is not None
        assert reader.truncated.index == 1


def test_live_capture_can_be_followed(tmp_path: Path) -> None:
    """A reader sees the complete records, reports the cut one, and picks up from there."""
    path, data, second = two_records(tmp_path)
    path.write_bytes(data[: second + 40])
    reader = CaptureReader(path, allow_truncated=True)
    assert [r.request_id for r in reader] == ["a"]
    path.write_bytes(data)  # the writer finished the record
    assert [r.request_id for r in reader] == ["b"]
    assert reader.truncated is not None  # from the first pass
    reader.close()


def test_crc_mismatch_names_record_and_offset(tmp_path: Path) -> None:
    path, data, second = two_records(tmp_path)
    damaged = bytearray(data)
    damaged[second + 50] ^= 0xFF
    path.write_bytes(bytes(damaged))
    with CaptureReader(path) as reader:
        iterator = iter(reader)
        assert next(iterator).request_id == "a"
        with pytest.raises(CaptureFormatError, match=rf"record 1 at byte offset {second}: CRC32"):
            next(iterator)


def test_bad_field_with_a_valid_crc(tmp_path: Path) -> None:
    path, data, second = two_records(tmp_path)
    body = bytearray(data[second + 8 :])
    struct.pack_into("<H", body, 34, 0x8000)  # an unknown flag
    path.write_bytes(data[:second] + struct.pack("<II", len(body), zlib.crc32(body)) + body)
    with pytest.raises(CaptureFormatError, match=r"record 1 .*bad field: unknown flags 0x8000"):
        list(read_capture(path))


def test_implausible_length(tmp_path: Path) -> None:
    path, data, second = two_records(tmp_path)
    path.write_bytes(data[:second] + struct.pack("<II", 0xFFFFFFFF, 0) + b"\x00" * 64)
    with pytest.raises(CaptureFormatError, match="implausible"):
        list(read_capture(path))


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (b'"mlp"', b'"\xffl"', "meta is not valid JSON"),
        (b'"mlp"', b"12345", "meta 'model' is not a string: 12345"),
        (b'["x"]', b'["x",1]', "meta 'input_names' is not a list of names"),
        (b'["x"]', b'["x","z"]', "meta 'input_names' names 2 tensors, the record holds 1"),
    ],
)
def test_malformed_meta_is_a_bad_field(
    tmp_path: Path, old: bytes, new: bytes, message: str
) -> None:
    path, data, second = two_records(tmp_path)
    body = data[second + 8 :]
    (meta_length,) = struct.unpack_from("<I", body, fmt.RECORD_FIXED.size - 4)
    meta = body[fmt.RECORD_FIXED.size : fmt.RECORD_FIXED.size + meta_length]
    assert old in meta
    meta = meta.replace(old, new, 1)
    body = (
        body[: fmt.RECORD_FIXED.size - 4] + struct.pack("<I", len(meta)) + meta
        + body[fmt.RECORD_FIXED.size + meta_length :]
    )  # fmt: skip
    path.write_bytes(data[:second] + struct.pack("<II", len(body), zlib.crc32(body)) + body)
    with pytest.raises(CaptureFormatError, match=rf"record 1 .*bad field: {message}"):
        list(read_capture(path))


# -- JSON Lines ----------------------------------------------------------------------------------

GOOD = (
    '{"t_ms": 12.5, "model": "mlp", "inputs": {"x": {"datatype": "FP32", "shape": [1, 2], '
    '"data": [1.5, 2]}}, "timeout_us": 20000, "parameters": {"k": "v"}, "version": "1"}\n'
    "\n# a comment\n"
    '{"t_ms": 0, "model": "m", "id": "q", "priority": 2, "outputs": ["y"], "headers": '
    '{"X-Key": "k"}, "inputs": {"s": {"datatype": "BYTES", "shape": [2], "data": ["a", "b"]}, '
    '"r": {"datatype": "INT16", "shape": [2], "data_b64": "AQACAA=="}}}\n'
)


def test_jsonl_converts(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(GOOD)
    assert convert(source, tmp_path / "out.cap") == 2
    first, second = read_capture(tmp_path / "out.cap")
    assert (first.arrival_ns, first.due_in_ns, first.version) == (12_500_000, 20_000_000, "1")
    assert first.parameters == {"k": "v"}
    np.testing.assert_array_equal(first.inputs[0].array(), np.array([[1.5, 2]], np.float32))
    assert (first.status, first.protocol) == (0, "http")
    assert (second.request_id, second.priority, second.outputs_wanted) == ("q", 2, ("y",))
    assert second.headers == {"x-key": "k"}
    assert list(second.inputs[0].array()) == [b"a", b"b"]
    assert list(second.inputs[1].array()) == [1, 2]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", r"in.jsonl:2: not valid JSON"),
        ('{"model": "m", "inputs": {}}', r"in.jsonl:2: field 't_ms' is missing"),
        ('{"t_ms": "1", "model": "m"}', r"field 't_ms' must be a number"),
        ('{"t_ms": 1, "inputs": {"x": 1}}', r"field 'model' is missing"),
        ('{"t_ms": 1, "model": "m", "inputs": []}', r"field 'inputs' must be an object"),
        ('{"t_ms": 1, "model": "m", "inputs": {"x": {"datatype": "F", "shape": [1], '
         '"data": [1]}}}', r"inputs.x: 'datatype' 'F' is not a v2 datatype"),
        ('{"t_ms": 1, "model": "m", "inputs": {"x": {"datatype": "FP32", "shape": [3], '
         '"data": [1]}}}', r"inputs.x: 'data' holds 1 values but shape \[3\] needs 3"),
        ('{"t_ms": 1, "model": "m", "inputs": {"x": {"datatype": "FP32", "shape": [1]}}}',
         r"inputs.x: give one of 'data'"),
        ('{"t_ms": 1, "model": "m", "timeout_us": -5, "inputs": {}}', r"'timeout_us' must be > 0"),
        ('{"t_ms": 1, "model": "m", "colour": 1}', r"unknown field\(s\) colour"),
        ('{"t_ms": 1, "model": "m", "version": "v2", "inputs": {"x": {"datatype": "INT8", '
         '"shape": [1], "data": [1]}}}', r"field 'version' must be a version number"),
    ],
)  # fmt: skip
def test_jsonl_errors_name_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(GOOD.splitlines()[0] + "\n" + line + "\n")
    target = tmp_path / "out.cap"
    with pytest.raises(JsonlError, match=message):
        convert(source, target)
    assert not target.exists()  # no half-converted capture is left


# -- duetime capture -----------------------------------------------------------------------------


def test_cli_convert_and_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(GOOD)
    target = tmp_path / "out.cap"
    assert main(["capture", "convert", str(source), str(target)]) == 0
    assert "2 requests written" in capsys.readouterr().out
    assert main(["capture", "convert", str(source), str(target)]) == 2  # exists: not replaced
    assert main(["capture", "convert", str(source), str(target), "--force"]) == 0
    capsys.readouterr()
    assert main(["capture", "show", str(target), "--head", "1"]) == 0
    out = capsys.readouterr().out
    assert "format 1" in out
    assert "requests: 2 over 0.013 s" in out
    assert "models: mlp@1 1, m 1" in out
    assert out.count(" -> 0 ") == 1  # one record listed


def test_cli_show_reports_truncation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, data, second = two_records(tmp_path)
    path.write_bytes(data[: second + 10])
    assert main(["capture", "show", str(path)]) == 1
    out = capsys.readouterr().out
    assert "requests: 1" in out
    assert f"record 1 at byte offset {second}" in out
    path.write_bytes(b"nonsense" * 10)
    assert main(["capture", "show", str(path)]) == 1
    assert "not a duetime capture" in capsys.readouterr().err


def test_writer_refuses_to_overwrite_when_asked(tmp_path: Path) -> None:
    path = write(tmp_path / "keep.cap", make_record())
    with pytest.raises(FileExistsError):
        CaptureWriter(path, overwrite=False)
    assert len(list(read_capture(path))) == 1
    assert io.BytesIO(path.read_bytes()).read(8) == fmt.MAGIC
