"""The capture format: records round-trip through CaptureWriter and CaptureReader; damaged files
give errors naming the record and offset; JSON Lines conversion and `duetime capture`."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest

from duetime.cli import main
from duetime.datatypes import NUMPY_OF
from duetime.frontend.codec import encode_tensor
from duetime.frontend.rest import parse_infer_request
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
from duetime.tools.capture.recorder import CANCELLED_STATUS

DATA = Path(__file__).parent / "data"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"

ALL_DTYPES = {
    "BOOL": np.array([[True, False]]), "INT8": np.array([-3, 4], np.int8),
    "INT16": np.array([-300], np.int16), "INT32": np.arange(6, dtype=np.int32).reshape(2, 3),
    "INT64": np.array([-(2**40)], np.int64), "UINT8": np.array([255], np.uint8),
    "UINT16": np.array([65535], np.uint16), "UINT32": np.array([2**32 - 1], np.uint32),
    "UINT64": np.array([2**64 - 1], np.uint64), "FP16": np.array([0.5], np.float16),
    "FP32": np.linspace(0, 1, 40, dtype=np.float32).reshape(1, 40),
    "FP64": np.array([np.pi]), "BYTES": np.array([[b"ab", b""], [b"\x00\xff", b"c"]], object),
    "BF16": np.array([[1.5, -0.0078125], [3e38, 0]], ml_dtypes.bfloat16),
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


def test_every_v2_datatype_has_a_code_and_the_old_codes_keep_theirs() -> None:
    """BF16 had none: a BF16 model's traffic could not be recorded. A datatype's code is its
    place in the tuple, so codes are only ever appended."""
    assert set(fmt.DATATYPES) == set(NUMPY_OF)
    assert fmt.DATATYPES[:13] == (
        "BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
        "FP16", "FP32", "FP64", "BYTES",
    )  # fmt: skip
    assert fmt.DATATYPES.index("BF16") == 13


def test_a_reader_without_a_datatypes_code_skips_its_records_and_reads_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Why BF16's code came without a new format version: a reader that predates it (here,
    one whose DATATYPES stop at BYTES) skips a BF16 record as an unknown datatype code, never
    misreads it, and reads the rest of the file as before."""
    bf16 = make_record(request_id="b", inputs=[CapturedTensor.of("x", ALL_DTYPES["BF16"])])
    path = write(tmp_path / "mixed.cap", make_record(request_id="a"), bf16,
                 make_record(request_id="c"))  # fmt: skip
    monkeypatch.setattr(fmt, "DATATYPES", fmt.DATATYPES[:13])
    with CaptureReader(path) as reader:
        assert reader.header.version == fmt.FORMAT_VERSION == 2
        assert [r.request_id for r in reader] == ["a", "c"]
        assert reader.skipped == 1
        assert "unknown datatype code 13" in str(reader.first_skipped)


def test_a_datatype_without_a_code_is_a_bad_field() -> None:
    """It was a KeyError, which ended `bench --record` in a traceback after its run."""
    tensor = ("t", "FP8", (1,), b"\x00")
    message = "datatype 'FP8' has no code in the capture format"
    with pytest.raises(fmt.BadField, match=message):  # an input
        fmt.encode_record(0, "grpc", "m", None, "", [tensor], None, {}, None, 0, {}, None, 200,
                          None, 0, None, None, None)  # fmt: skip
    with pytest.raises(fmt.BadField, match=message):  # an output of a raw HTTP record
        fmt.encode_http_record(0, "m", None, b"{}", None, None, 0, {}, None, 200, None, 0, None,
                               None, [tensor])  # fmt: skip


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


CREDENTIALS = {
    "x-auth-token": "SECRET-A", "api-key": "SECRET-B", "x-goog-api-key": "SECRET-C",
    "ocp-apim-subscription-key": "SECRET-D", "x-amz-security-token": "SECRET-E",
    "x-session-id": "SECRET-F", "x-client-secret": "SECRET-G", "x-password": "SECRET-H",
    "X-Signature": "SECRET-I",
}  # fmt: skip
KEPT = {"content-type": "application/json", "x-tenant": "blue", "traceparent": "00-abc",
        "inference-header-content-length": "12", "keep-alive": "5"}  # fmt: skip


@pytest.mark.parametrize("binary", [False, True], ids=["fields", "raw-http"])
def test_headers_that_look_like_credentials_are_not_written(tmp_path: Path, binary: bool) -> None:
    """Not only the five names listed once: x-auth-token, api-key, ... were written in clear
    and re-sent by `duetime replay` (a tester's report)."""
    headers = {**CREDENTIALS, **KEPT}
    path = tmp_path / "h.cap"
    if binary:
        body, header = http_body({"x": SENT["x"]}, binary=True)
        write_encoded(path, http_record(body, header, headers=headers))
    else:
        write(path, make_record(headers=headers))
    assert not any(secret.encode() in path.read_bytes() for secret in CREDENTIALS.values())
    (back,) = read_capture(path, strict=True)
    assert back.headers == KEPT


def test_credentials_in_an_older_capture_are_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture written before the rule holds them: a reader leaves them out, so a replay
    does not send them on."""
    monkeypatch.setattr(fmt, "without_credentials", lambda headers: headers)  # the old writer
    path = write(tmp_path / "old.cap", make_record(headers={**CREDENTIALS, **KEPT}))
    assert b"SECRET-A" in path.read_bytes()
    monkeypatch.undo()
    (back,) = read_capture(path, strict=True)
    assert back.headers == KEPT


def test_parameters_json_cannot_hold_are_written_as_text(tmp_path: Path) -> None:
    record = make_record(parameters={"n": np.int64(3), "ok": 1})
    (back,) = read_capture(write(tmp_path / "p.cap", record))
    assert back.parameters == {"n": "3", "ok": 1}


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


# -- raw HTTP records ----------------------------------------------------------------------------

SENT = {
    "x": ALL_DTYPES["FP32"], "s": np.array([[b"ab", b""], ["\u00e9".encode(), b"c"]], object),
    "b": ALL_DTYPES["BOOL"], "i": ALL_DTYPES["INT64"], "h": ALL_DTYPES["FP16"],
    "u": np.arange(6, dtype=np.uint8).reshape(3, 2),
}  # fmt: skip
"""Inputs of a v2 REST request (BYTES elements UTF-8, so JSON can carry them too)."""


def http_body(
    inputs: dict[str, np.ndarray], *, binary: bool, **doc: Any
) -> tuple[bytes, int | None]:
    """A v2 REST body as a client sends it, and its JSON header length (None: all JSON)."""
    entries, blobs = [], []
    for name, array in inputs.items():
        entry, raw = encode_tensor(name, array, binary=binary)
        entries.append(entry)
        blobs.append(raw)
    head = orjson.dumps({**doc, "inputs": entries}, option=orjson.OPT_SERIALIZE_NUMPY)
    return head + b"".join(blobs), len(head) if binary else None


def http_record(body: bytes, header_length: int | None, **changes: Any) -> list[bytes]:
    fields: dict[str, Any] = {
        "arrival_ns": 11, "model": "mlp", "version": "2", "body": body,
        "header_length": header_length, "due_in_ns": 20_000_000, "priority": 2,
        "headers": {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01", "cookie": "c",
                    "x-tenant": "blue"},
        "trace_id": TRACE_ID, "status": 200, "error": None, "latency_ns": 3_000,
        "answered_version": "2", "variant": "int8",
        "outputs": [("y", "FP32", (1, 3), np.ones(3, np.float32).tobytes())],
    }  # fmt: skip
    return fmt.encode_http_record(**{**fields, **changes})


def write_encoded(path: Path, *records: list[bytes]) -> Path:
    with CaptureWriter(path) as writer:
        for parts in records:
            writer.write_encoded(parts, 1)
    return path


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_http_record_reads_back_as_the_request_sent(tmp_path: Path, binary: bool) -> None:
    doc: dict[str, Any] = {
        "id": "r-7", "parameters": {"timeout": 20_000, "priority": 2, "tenant": {"k": [1]}},
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}],
    }  # fmt: skip
    body, header = http_body(SENT, binary=binary, **doc)
    (back,) = read_capture(write_encoded(tmp_path / "h.cap", http_record(body, header)))
    assert back == CapturedRequest(
        arrival_ns=11, protocol="http", model="mlp", version="2", request_id="r-7",
        inputs=[CapturedTensor.of(name, array) for name, array in SENT.items()],
        outputs_wanted=("y", "z"), parameters=doc["parameters"], due_in_ns=20_000_000,
        priority=2, headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01",
                             "x-tenant": "blue"},
        trace_id=TRACE_ID, status=200, error=None, latency_ns=3_000, answered_version="2",
        variant="int8", outputs=[CapturedTensor.of("y", np.ones((1, 3), np.float32))],
    )  # fmt: skip
    for tensor in back.inputs:
        np.testing.assert_array_equal(tensor.array(), SENT[tensor.name])


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_http_record_decodes_like_the_field_by_field_record(tmp_path: Path, binary: bool) -> None:
    """What the server parsed, written field by field (format 1's way), and the raw body read
    back give the same record."""
    body, header = http_body(SENT, binary=binary, parameters={"p": 1})
    request, _ = parse_infer_request(body, header, "mlp", None)
    fields: dict[str, Any] = {
        "arrival_ns": 5, "model": "mlp", "version": None, "due_in_ns": None, "priority": 0,
        "headers": {}, "trace_id": None, "status": 404, "error": "no model 'mlp'",
        "latency_ns": 9, "answered_version": None, "variant": None, "outputs": None,
    }  # fmt: skip
    by_field = fmt.encode_record(
        protocol="http", request_id=request.id, inputs=fmt.tensors_of(request.inputs),
        outputs_wanted=request.outputs, parameters=request.parameters, **fields,
    )  # fmt: skip
    raw = http_record(body, header, **fields)
    path = write_encoded(tmp_path / "same.cap", list(by_field), raw)
    first, second = read_capture(path)
    assert first == second


def test_http_record_without_outputs_or_due_time(tmp_path: Path) -> None:
    body, header = http_body({"x": SENT["x"]}, binary=True)
    parts = http_record(body, header, due_in_ns=None, outputs=None, headers={}, trace_id=None)
    (back,) = read_capture(write_encoded(tmp_path / "plain.cap", parts))
    assert (back.due_in_ns, back.outputs, back.outputs_wanted, back.request_id) == (
        None, None, None, ""
    )  # fmt: skip
    assert back.parameters == {}


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [
        (b'{"inputs": [', None, "the HTTP body does not decode: request body is not valid JSON"),
        (b'{"inputs": {}}', None, "the HTTP body does not decode: request 'inputs' must be"),
        (b'{"inputs": []}', 99, "meta 'header_length' 99 is not a length within the 14-byte"),
    ],
)
def test_corrupt_http_body_names_the_record(
    tmp_path: Path, body: bytes, header_length: int | None, message: str
) -> None:
    good_body, header = http_body({"x": SENT["x"]}, binary=True)
    path = write_encoded(
        tmp_path / "bad.cap", http_record(good_body, header), http_record(body, header_length)
    )
    with CaptureReader(path, strict=True) as reader:
        second = reader.header.size + len(b"".join(http_record(good_body, header)))
        records = iter(reader)
        assert next(records).model == "mlp"
        with pytest.raises(
            CaptureFormatError, match=rf"record 1 at byte offset {second}: bad field: {message}"
        ):
            next(records)


def test_version_1_files_still_read() -> None:
    """`data/capture-v1.cap`: these records, written by `CaptureWriter.write` of format 1 (the
    code before raw HTTP records)."""
    with CaptureReader(DATA / "capture-v1.cap") as reader:
        assert reader.header.version == 1
        records = list(reader)
    assert records == [
        CapturedRequest(
            arrival_ns=1_000, protocol="http", model="mlp", version=None, request_id="a",
            inputs=[CapturedTensor.of("x", np.arange(8, dtype=np.float32).reshape(2, 4))],
            outputs_wanted=None, parameters={"timeout": 20000, "binary_data_output": True},
            due_in_ns=20_000_000, priority=2, headers={"x-tenant": "blue"}, trace_id=TRACE_ID,
            status=200, error=None, latency_ns=250_000, answered_version="1",
            variant="default", outputs=None,
        ),
        CapturedRequest(
            arrival_ns=2_000, protocol="grpc", model="mlp", version="2", request_id="",
            inputs=[CapturedTensor.of("s", np.array([b"ab", b""], dtype=object)),
                    CapturedTensor.of("i", np.array([[-1, 2]], dtype=np.int64))],
            outputs_wanted=("y",), parameters={}, due_in_ns=None, priority=0, headers={},
            trace_id=None, status=200, error=None, latency_ns=1_000_000,
            answered_version="2", variant="int8",
            outputs=[CapturedTensor.of("y", np.ones((1, 3), np.float32))],
        ),
        CapturedRequest(
            arrival_ns=3_000, protocol="engine", model="nosuch", version=None, request_id="c",
            inputs=[CapturedTensor.of("x", np.zeros((1,), np.float64))], outputs_wanted=None,
            parameters={}, due_in_ns=None, priority=0, headers={}, trace_id=None, status=404,
            error="no model 'nosuch'", latency_ns=5_000, answered_version=None, variant=None,
            outputs=None,
        ),
        CapturedRequest(
            arrival_ns=4_000, protocol="http", model="mlp", version=None, request_id="d",
            inputs=[CapturedTensor.of("x", np.zeros((1, 4), np.float32))], outputs_wanted=None,
            parameters={}, due_in_ns=None, priority=0, headers={}, trace_id=None,
            status=CANCELLED_STATUS, error="cancelled by the client before its answer",
            latency_ns=7_000, answered_version="1", variant="default", outputs=None,
        ),
    ]  # fmt: skip


def test_raw_http_flag_in_a_version_1_file_is_a_bad_field(tmp_path: Path) -> None:
    body, header = http_body({"x": SENT["x"]}, binary=True)
    path = write_encoded(tmp_path / "v1.cap", http_record(body, header))
    data = path.read_bytes()
    path.write_bytes(data[:8] + struct.pack("<H", 1) + data[10:])  # claims format 1
    with pytest.raises(CaptureFormatError, match=r"record 0 .*bad field: unknown flags 0x7"):
        list(read_capture(path, strict=True))


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
    if keep > 8:  # into the record's body: what is there is counted, not what is missing
        assert f"the file ends {keep - 8} bytes into a " in str(caught.value)
    else:  # (it said "inside the record's 3-byte prefix": the prefix is 8; found by a tester)
        assert f"the file ends {keep} bytes into the record's 8-byte prefix" in str(caught.value)
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
        list(read_capture(path, strict=True))


def test_a_record_that_does_not_decode_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record whose CRC32 matches but which does not decode (here an HTTP body the parser
    refuses, between two good records) is skipped, named in a warning and counted: the others
    still read, and `duetime capture show` summarises them (exit 0). A tester's capture with one
    request from shared memory was refused whole by every reader."""
    good_body, header = http_body({"x": SENT["x"]}, binary=True)
    good = http_record(good_body, header)
    path = write_encoded(tmp_path / "bad.cap", good, http_record(b'{"inputs": [', None), good)
    second = (
        len(path.read_bytes())
        - len(b"".join(good))
        - len(b"".join(http_record(b'{"inputs": [', None)))
    )
    with caplog.at_level("WARNING", logger="duetime.capture"), CaptureReader(path) as reader:
        assert [r.model for r in reader] == ["mlp", "mlp"]
        assert (reader.skipped, reader.count) == (1, 3)
        assert reader.first_skipped is not None
        assert (reader.first_skipped.index, reader.first_skipped.offset) == (1, second)
    assert f"record 1 at byte offset {second}: bad field: the HTTP body does not decode" in (
        caplog.text
    )
    assert len(list(read_capture(path))) == 2
    assert main(["capture", "show", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "requests: 2 over" in shown
    assert "warning: 1 records skipped (they do not decode); the first: " in shown


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
        list(read_capture(path, strict=True))


# -- JSON Lines ----------------------------------------------------------------------------------

GOOD = (
    '{"t_ms": 12.5, "model": "mlp", "inputs": {"x": {"datatype": "FP32", "shape": [1, 2], '
    '"data": [1.5, 2]}}, "timeout_us": 20000, "parameters": {"k": "v"}, "version": "1"}\n'
    "\n# a comment\n"
    '{"t_ms": 0, "model": "m", "id": "q", "priority": 2, "outputs": ["y"], "headers": '
    '{"X-Tenant": "k"}, "inputs": {"s": {"datatype": "BYTES", "shape": [2], "data": ["a", "b"]}, '
    '"r": {"datatype": "INT16", "shape": [2], "data_b64": "AQACAA=="}}}\n'
)


def test_the_documented_jsonl_example_converts_as_pasted(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "capture-format.md").read_text()
    section = doc.split("## Hand-written traffic: JSON Lines", 1)[1]
    example = section.split("```json\n", 1)[1].split("```", 1)[0]
    source = tmp_path / "in.jsonl"
    source.write_text(example)
    assert convert(source, tmp_path / "out.cap") == len(example.splitlines())
    (record,) = read_capture(tmp_path / "out.cap")
    assert (record.model, record.inputs[0].shape) == ("mlp", (1, 40))


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
    assert second.headers == {"x-tenant": "k"}
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
        ('{"t_ms": 1, "model": "m", "protocol": "gprc", "inputs": {"x": {"datatype": "INT8", '
         '"shape": [1], "data": [1]}}}', r"in.jsonl:2: field 'protocol' must be one of http, "
         r"grpc, grpc-stream, engine, got 'gprc'"),
        ('{"t_ms": 1, "model": "m", "protocol": "ftp", "inputs": {"x": {"datatype": "INT8", '
         '"shape": [1], "data": [1]}}}', r"in.jsonl:2: field 'protocol' must be one of"),
    ],
)  # fmt: skip
def test_jsonl_errors_name_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(GOOD.splitlines()[0] + "\n" + line + "\n")
    target = tmp_path / "out.cap"
    with pytest.raises(JsonlError, match=message):
        convert(source, target)
    assert not target.exists()  # no half-converted capture is left


@pytest.mark.parametrize("protocol", fmt.PROTOCOLS)
def test_jsonl_takes_each_protocol_the_format_has(tmp_path: Path, protocol: str) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(GOOD.splitlines()[0].replace('"t_ms"', f'"protocol": "{protocol}", "t_ms"'))
    assert convert(source, tmp_path / "out.cap") == 1
    assert [r.protocol for r in read_capture(tmp_path / "out.cap")] == [protocol]


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
    assert f"format {fmt.FORMAT_VERSION}" in out
    assert "requests: 2 over 0.013 s" in out
    assert "models: mlp@1 1, m 1" in out
    assert out.count(" -> 0 ") == 1  # one record listed


def test_cli_convert_makes_the_targets_folders_and_words_a_target_it_cannot_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`convert in.jsonl no_such_folder/out.cap` said "out.cap: no such capture file", as if
    the input were missing (found by a tester); the folders are made, as `--record` makes
    them, and a target that cannot be written says so."""
    source = tmp_path / "in.jsonl"
    source.write_text(GOOD)
    target = tmp_path / "new" / "folders" / "out.cap"
    assert main(["capture", "convert", str(source), str(target)]) == 0
    assert target.is_file()
    capsys.readouterr()
    (tmp_path / "a_file").write_text("")
    blocked = tmp_path / "a_file" / "out.cap"
    assert main(["capture", "convert", str(source), str(blocked)]) == 2
    err = capsys.readouterr().err
    assert "the capture cannot be written" in err
    assert "no such capture file" not in err


def test_cli_show_refuses_a_negative_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--head -1` listed nothing and said nothing (found by a tester)."""
    source = tmp_path / "in.jsonl"
    source.write_text(GOOD)
    assert main(["capture", "convert", str(source), str(tmp_path / "out.cap")]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["capture", "show", str(tmp_path / "out.cap"), "--head", "-1"])
    assert exit_.value.code == 2
    assert "argument --head: expected a whole number >= 0, got '-1'" in capsys.readouterr().err


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


def test_cli_show_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    """The reader went away after what it wanted: no 'Broken pipe' error line."""
    path = write(tmp_path / "many.cap", *[make_record() for _ in range(3000)])
    command = [sys.executable, "-m", "duetime", "capture", "show", str(path), "--head", "3000"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as shown:
        assert shown.stdout is not None
        assert shown.stderr is not None
        assert shown.stdout.readline().startswith(b"capture ")
        shown.stdout.close()  # (as `head -1` does: the rest is more than a pipe holds)
        stderr = shown.stderr.read()
        assert shown.wait(timeout=30) == 141
    assert stderr == b""


def test_writer_refuses_to_overwrite_when_asked(tmp_path: Path) -> None:
    path = write(tmp_path / "keep.cap", make_record())
    with pytest.raises(FileExistsError):
        CaptureWriter(path, overwrite=False)
    assert len(list(read_capture(path))) == 1
    assert io.BytesIO(path.read_bytes()).read(8) == fmt.MAGIC


# -- output parameters ---------------------------------------------------------------------------


def meta_of(path: Path) -> list[Any]:
    """The meta array of the only record in the capture at `path`."""
    with CaptureReader(path) as reader:
        body = path.read_bytes()[reader.header.size + fmt.RECORD_PREFIX.size :]
    (meta_length,) = struct.unpack_from("<I", body, fmt.RECORD_FIXED.size - 4)
    values = orjson.loads(body[fmt.RECORD_FIXED.size : fmt.RECORD_FIXED.size + meta_length])
    assert isinstance(values, list)
    return values


def test_output_parameters_round_trip_and_are_left_out_when_none(tmp_path: Path) -> None:
    """The classification a request asked of an output (gRPC kept only the output's name, so a
    replay asked for other work: a tester's report) is a 14th meta value, written only when
    there is one: a record without reads as before with a version-2 reader."""
    asked = {"y": {"classification": 2}}
    path = write(tmp_path / "c.cap", make_record(output_parameters=asked))
    assert len(meta_of(path)) == 14
    (back,) = read_capture(path, strict=True)
    assert back == make_record(output_parameters=asked)
    plain = write(tmp_path / "p.cap", make_record())
    assert len(meta_of(plain)) == len(fmt.META_FIELDS) == 13
    (back,) = read_capture(plain, strict=True)
    assert back.output_parameters is None


def test_http_record_gives_the_output_parameters_of_its_body(tmp_path: Path) -> None:
    body, header = http_body(
        {"x": SENT["x"]}, binary=True,
        outputs=[{"name": "y", "parameters": {"classification": 3, "binary_data": True}}],
    )  # fmt: skip
    path = write_encoded(tmp_path / "h.cap", http_record(body, header))
    (back,) = read_capture(path, strict=True)
    assert back.output_parameters == {"y": {"classification": 3}}


@pytest.mark.parametrize("value", [[1], {"y": 2}, "y"])
def test_malformed_output_parameters_are_a_bad_field(tmp_path: Path, value: Any) -> None:
    path = write(tmp_path / "c.cap", make_record(output_parameters={"y": {"classification": 2}}))
    with CaptureReader(path) as reader:
        size = reader.header.size
    data = path.read_bytes()
    meta = orjson.dumps([*meta_of(path)[:13], value])
    body = data[size + fmt.RECORD_PREFIX.size :]
    (meta_length,) = struct.unpack_from("<I", body, fmt.RECORD_FIXED.size - 4)
    body = (
        body[: fmt.RECORD_FIXED.size - 4] + struct.pack("<I", len(meta)) + meta
        + body[fmt.RECORD_FIXED.size + meta_length :]
    )  # fmt: skip
    path.write_bytes(data[:size] + struct.pack("<II", len(body), zlib.crc32(body)) + body)
    with pytest.raises(CaptureFormatError, match="meta 'output_parameters' is not an object"):
        list(read_capture(path, strict=True))


def test_a_record_arriving_before_the_capture_s_start_is_skipped(tmp_path: Path) -> None:
    """Found by a tester: a record of arrival -1,000 s (its CRC right) was read, shown at
    -1000000 ms, and a replay waited 1,000 s after it."""
    early = make_record(request_id="b", arrival_ns=-(10**12))
    path = write(tmp_path / "early.cap", make_record(request_id="a"), early,
                 make_record(request_id="c"))  # fmt: skip
    with CaptureReader(path) as reader:
        assert [r.request_id for r in reader] == ["a", "c"]
        assert reader.skipped == 1
        assert "arrival_ns -1000000000000 is negative" in str(reader.first_skipped)
