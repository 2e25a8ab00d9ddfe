"""System shared memory within the server's bounds and Triton's rules for its parameters: what
an input copies out of a region is held against `--max-inflight-bytes` and
`--max-connection-inflight-bytes` until its request ends (over HTTP and gRPC), an output
written into a region cannot also ask for its classes or for binary data, and a byte size or
offset without a region is refused.

NOTE: all three were found by a tester: 20 requests of 300-byte bodies, each naming a 60 MiB
input, grew the server by 1 GiB under a 64 MiB limit; classes were written into the region
(and `binary_data` dropped) with a 200; a misspelt region key had the output answered inline
with a 200 while its client read stale bytes from its region."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from conftest import RunningServer, read_answers, start_server, stop_server
from repo_models import faulty_model, faulty_rounds, scale_model, write_version
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from duetime.config import ServerSettings
from duetime.errors import InvalidInput
from duetime.frontend.sharedmemory import (
    HeldReads,
    NoRoomToRead,
    SharedMemoryRegions,
    Window,
    output_window_of,
    window_of,
)

pytestmark = [
    pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm"),
    pytest.mark.timeout(120),
]

MiB = 1 << 20


# -- parameters, read as both front ends read them -------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "binary_data", "words"),
    [
        ({"classification": 2}, False, "and 'classification'"),
        ({"classification": 2}, True, "and 'classification'"),
        ({"binary_data": True}, True, "and 'binary_data'"),
    ],
)
def test_an_output_in_shared_memory_cannot_also_ask_for_classes_or_binary_data(
    parameters: dict[str, Any], binary_data: bool, words: str
) -> None:
    given = {"shared_memory_region": "r", "shared_memory_byte_size": 64, **parameters}
    with pytest.raises(InvalidInput, match=re.escape(
        f"Output can't set both 'shared_memory_region' {words} (output 'y': "
    )):  # fmt: skip
        output_window_of(given, "y", binary_data)


def test_an_output_in_shared_memory_may_say_it_is_not_binary_data() -> None:
    """As Triton, `binary_data: false` is no conflict; and over gRPC (no `binary_data`
    parameter there) the parameter is not read at all."""
    given = {"shared_memory_region": "r", "shared_memory_byte_size": 64}
    assert output_window_of({**given, "binary_data": False}, "y", True) is not None
    assert output_window_of({**given, "binary_data": True}, "y") is not None
    assert output_window_of({"binary_data": True, "classification": 2}, "y", True) is None


@pytest.mark.parametrize("key", ["shared_memory_byte_size", "shared_memory_offset"])
def test_a_byte_size_or_offset_without_a_region_is_refused(key: str) -> None:
    for given in ({key: 32}, {key: 32, "shared_memory_regoin": "r"}):
        with pytest.raises(InvalidInput, match=re.escape(
            f"'{key}' can not be specified without 'shared_memory_region' parameter for "
            "input 'x' (its parameters name no region: is 'shared_memory_region' misspelt?)"
        )):  # fmt: skip
            window_of(given, "input 'x'")
    assert window_of({"binary_data_size": 32}, "input 'x'") is None


# -- reads held against the in-flight limits -------------------------------------------------


@dataclass
class Room:
    """An Intake's look (`sharedmemory.Room`), its releases recorded."""

    max_bytes: int
    max_connection_bytes: int
    reserved: int = 0
    released: list[int] = field(default_factory=list)

    def release(self, size: int) -> None:
        self.reserved -= size
        self.released.append(size)


def test_reads_are_held_within_both_limits_until_released() -> None:
    room = Room(max_bytes=1000, max_connection_bytes=600)
    peers: dict[str, int] = {}
    first = HeldReads(room, peers, "a")
    first.take(500, "input 'x'")
    first.take(300, "input 'z'")  # (alone, a request fits whatever its size)
    assert (room.reserved, peers, first.size) == (800, {"a": 800}, 800)
    other = HeldReads(room, peers, "b")
    with pytest.raises(NoRoomToRead, match=re.escape(
        "input 'x': its 300 bytes in shared memory do not fit beside the 800 bytes other "
        "requests of all connections hold, within the 1000 bytes the server holds at once "
        "(server setting max_inflight_bytes, --max-inflight-bytes); retry once they are "
        "answered, or send smaller tensors"
    )) as refused:  # fmt: skip
        other.take(300, "input 'x'")
    assert (refused.value.http_status, refused.value.grpc_code) == (429, "RESOURCE_EXHAUSTED")
    assert refused.value.retry_after_s == 1.0
    other.take(200, "input 'x'")
    assert (room.reserved, peers) == (1000, {"a": 800, "b": 200})
    first.release()
    first.release()  # (once only)
    assert (room.reserved, peers, room.released) == (200, {"b": 200}, [800])
    same = HeldReads(room, peers, "b")
    with pytest.raises(NoRoomToRead, match=re.escape(
        "input 'x': its 500 bytes in shared memory do not fit beside the 200 bytes other "
        "requests of its connection hold, within the 600 bytes the server holds at once "
        "(server setting max_connection_inflight_bytes, --max-connection-inflight-bytes)"
    )):  # fmt: skip
        same.take(500, "input 'x'")
    other.release()
    same.release()  # (took nothing: gives nothing back)
    assert (room.reserved, peers, room.released) == (0, {}, [800, 200])


def test_an_input_is_charged_before_it_is_read_and_only_where_it_would_be_read(
    tmp_path: Path,
) -> None:
    """The charge comes after the checks that read nothing (a window of the wrong size) and
    before the copy: a charge refused reads nothing. Outside `charged`, nothing is charged."""
    (tmp_path / "obj").write_bytes(bytes(range(64)))
    regions = SharedMemoryRegions(root=tmp_path)
    charges: list[tuple[int, str]] = []

    def charge(size: int, where: str) -> None:
        charges.append((size, where))
        if size > 16:
            raise NoRoomToRead("no room")

    try:
        with regions.charged(charge):
            pass  # (no region registered: nothing can be read, nothing set)
        regions.register("r", "/obj", 0, 64)
        with regions.charged(charge):
            assert bytes(regions.read(Window("r", 8, 4), "input 'x'", "FP32", (2,))) == bytes(
                range(4, 12)
            )
            with pytest.raises(InvalidInput, match="input byte size mismatch"):
                regions.read(Window("r", 8, 0), "input 'x'", "FP32", (3,))
            with pytest.raises(NoRoomToRead):
                regions.read(Window("r", 32, 0), "input 'z'", "FP32", (8,))
        regions.read(Window("r", 32, 0), "input 'z'", "FP32", (8,))
        assert charges == [(8, "input 'x'"), (32, "input 'z'")]
    finally:
        regions.close()


# -- over the wire -----------------------------------------------------------------------------


BIG_ROWS = 98_304  # (x: 1.5 MiB of FP32 [rows, 4], two of which do not fit in 2 MiB)
SMALL_ROWS = 40_000  # (640 KB: two do not fit one connection's 1 MiB)


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """'slow' (y = x, FP32 [rows, 4], running as long as its input `k` asks: `faulty_model`,
    unbatched) and 'double' (y = 2x), served with 2 MiB held at once, 1 MiB a connection."""
    repo = tmp_path_factory.mktemp("bounded")
    write_version(repo, "slow", 1, faulty_model())
    (repo / "slow" / "config.toml").write_text("max_batch_size = 0\n")
    write_version(repo, "double", 1, scale_model(2.0))
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, metrics=False,
        max_inflight_bytes=2 * MiB, max_connection_inflight_bytes=MiB,
    )  # fmt: skip
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


@pytest.fixture(scope="module")
def region() -> Iterator[str]:
    """A 4 MiB object of ones, registered as region 'in' by each test that needs it."""
    key = f"/dt-bounds-{os.getpid()}"
    handle = shm.create_shared_memory_region("in", key, 4 * MiB)
    shm.set_shared_memory_region(handle, [np.ones((MiB,), np.float32)])
    yield key
    shm.destroy_shared_memory_region(handle)


def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def infer(module: Any, client: Any, rows: int, k: int) -> Any:
    """'slow' with its input x (`rows` rows) read from region 'in', running `k` rounds."""
    x, rounds = module.InferInput("x", [rows, 4], "FP32"), module.InferInput("k", [1, 1], "INT64")
    x.set_shared_memory("in", rows * 16)
    rounds.set_data_from_numpy(np.array([[k]], np.int64))
    return client.infer("slow", [x, rounds])


@pytest.mark.parametrize(
    ("protocol", "limit"), [("http", "server"), ("grpc", "server"), ("grpc", "connection")]
)
def test_inputs_read_from_shared_memory_are_held_within_the_inflight_limits(
    bounded: RunningServer, region: str, protocol: str, limit: str
) -> None:
    """While a request holds its input read from shared memory, another whose input does not
    fit beside it is refused 429 / RESOURCE_EXHAUSTED naming the limit: of the server (another
    connection) or of its connection (another call on the same gRPC channel; HTTP's: see the
    pipelined test below); once the first is answered, its bytes are given back and the second
    goes through."""
    module: Any = httpclient if protocol == "http" else grpcclient
    address = bounded.http if protocol == "http" else bounded.grpc
    rows = BIG_ROWS if limit == "server" else SMALL_ROWS
    intake = bounded.server._intake
    control = module.InferenceServerClient(address)
    first = module.InferenceServerClient(address)
    second = module.InferenceServerClient(address) if limit == "server" else first
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        control.register_system_shared_memory("in", region, 4 * MiB)
        running = pool.submit(infer, module, first, rows, faulty_rounds(3.0))
        until(lambda: intake.reserved >= rows * 16, "the first request's input was never held")
        with pytest.raises(InferenceServerException) as refused:
            infer(module, second, rows, 2)
        assert not running.done(), "the first request ended before the second came: test void"
        setting = "max_inflight_bytes" if limit == "server" else "max_connection_inflight_bytes"
        assert refused.value.status() == ("429" if protocol == "http" else
                                          "StatusCode.RESOURCE_EXHAUSTED")  # fmt: skip
        message = refused.value.message()
        assert f"input 'x': its {rows * 16} bytes in shared memory do not fit" in message
        assert f"(server setting {setting}, --{setting.replace('_', '-')})" in message
        assert running.result(timeout=60).as_numpy("y").shape == (rows, 4)
        until(lambda: intake.reserved == 0, "the first request's input was never given back")
        assert infer(module, second, rows, 2).as_numpy("y").shape == (rows, 4)
        until(lambda: intake.reserved == 0, "the second request's input was never given back")
        assert bounded.server._grpc_service._read_by_peer == {}
    finally:
        pool.shutdown()
        control.unregister_system_shared_memory()
        for client in {control, first, second}:
            client.close()


def test_pipelined_http_requests_reading_shared_memory_are_held_within_their_connection(
    bounded: RunningServer, region: str
) -> None:
    """Two requests pipelined on one HTTP connection, each reading 640 KB: the second does not
    fit beside the first within the connection's 1 MiB, and is refused 429 in its turn."""
    client = httpclient.InferenceServerClient(bounded.http)
    client.register_system_shared_memory("in", region, 4 * MiB)

    def request(k: int) -> bytes:
        window = {"shared_memory_region": "in", "shared_memory_byte_size": SMALL_ROWS * 16}
        body = json.dumps({
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [SMALL_ROWS, 4], "parameters": window},
                {"name": "k", "datatype": "INT64", "shape": [1, 1], "data": [k]},
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }).encode()  # fmt: skip
        head = b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
        return head % len(body) + body

    host, port = bounded.http.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(request(faulty_rounds(2.0)) + request(2))
            (status, _), (refused, message) = read_answers(sock.makefile("rb"), 2)
        assert (status, refused) == (200, 429), message
        assert b"(server setting max_connection_inflight_bytes" in message
        until(lambda: bounded.server._intake.reserved == 0, "the input was never given back")
    finally:
        client.unregister_system_shared_memory()
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_parameters_tritons_refuses_are_refused_over_the_wire(
    bounded: RunningServer, protocol: str
) -> None:
    """Raw requests (tritonclient refuses these itself): an output in shared memory asked for
    as classes (or, over HTTP, as binary data), and a byte size or offset on an input or an
    output without a region, each get 400 / INVALID_ARGUMENT naming the tensor."""
    key = f"/dt-bounds-o-{protocol}-{os.getpid()}"
    handle = shm.create_shared_memory_region("o", key, 64)
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(bounded.http if protocol == "http" else bounded.grpc)
    x = np.ones((1, 4), np.float32)
    region = {"shared_memory_region": "o", "shared_memory_byte_size": 64}
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("output", {**region, "classification": 2},
         "Output can't set both 'shared_memory_region' and 'classification' (output 'y'"),
        ("output", {"shared_memory_regoin": "o", "shared_memory_byte_size": 16},
         "'shared_memory_byte_size' can not be specified without 'shared_memory_region' "
         "parameter for output 'y'"),
        ("output", {"shared_memory_offset": 0},
         "'shared_memory_offset' can not be specified without 'shared_memory_region' "
         "parameter for output 'y'"),
        ("input", {"shared_memory_byte_size": 16},
         "'shared_memory_byte_size' can not be specified without 'shared_memory_region' "
         "parameter for input 'x'"),
    ]  # fmt: skip
    if protocol == "http":
        binary = "Output can't set both 'shared_memory_region' and 'binary_data'"
        cases.append(("output", {**region, "binary_data": True}, binary))
    try:
        client.register_system_shared_memory("o", key, 64)
        for where, parameters, words in cases:
            status, message = (http_refusal if protocol == "http" else grpc_refusal)(
                bounded, x, where, parameters
            )
            assert status == ("400" if protocol == "http" else "INVALID_ARGUMENT"), message
            assert words in message, message
        assert shm.get_contents_as_numpy(handle, np.float32, [16]).tolist() == [0.0] * 16
    finally:
        client.unregister_system_shared_memory()
        client.close()
        shm.destroy_shared_memory_region(handle)


def http_refusal(
    server: RunningServer, x: np.ndarray, where: str, parameters: dict[str, Any]
) -> tuple[str, str]:
    source: dict[str, Any] = {"name": "x", "datatype": "FP32", "shape": [1, 4],
                              "data": x.ravel().tolist()}  # fmt: skip
    target: dict[str, Any] = {"name": "y"}
    (source if where == "input" else target)["parameters"] = parameters
    body = json.dumps({"inputs": [source], "outputs": [target]}).encode()
    url = f"http://{server.http}/v2/models/double/infer"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body), timeout=30) as answer:
            return str(answer.status), answer.read().decode()
    except urllib.error.HTTPError as error:
        return str(error.code), json.loads(error.read())["error"]


def grpc_refusal(
    server: RunningServer, x: np.ndarray, where: str, parameters: dict[str, Any]
) -> tuple[str, str]:
    request = service_pb2.ModelInferRequest(model_name="double")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(x.tobytes())
    tensor = request.inputs[0] if where == "input" else request.outputs.add(name="y")
    for key, value in parameters.items():
        if isinstance(value, str):
            tensor.parameters[key].string_param = value
        else:
            tensor.parameters[key].int64_param = value
    with grpc.insecure_channel(server.grpc) as channel:
        try:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
        except grpc.RpcError as error:
            return error.code().name, error.details()
    return "OK", ""
