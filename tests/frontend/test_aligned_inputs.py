"""Decoded inputs lie at a multiple of `codec.ALIGNMENT`, so that ONNX Runtime's answer does not
depend on where the bytes happened to arrive (frontend/codec.py ALIGNMENT).

ORT's reduction kernels add in another order over data that is not 16-byte aligned: a view over
a request body lay wherever the JSON header's length left it, and the same tensor got answers
that differed in their last bits with the length of the request's id."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conftest import RunningServer, start_server, stop_server
from onnx import TensorProto, helper
from repo_models import write_version

from duetime.config import ServerSettings
from duetime.frontend import codec, http, rest
from duetime.frontend.sharedmemory import SharedMemoryRegions, Window

pytestmark = pytest.mark.timeout(120)

X = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)


def _reduce_sum_model() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    node = helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)
    model = helper.make_model(
        helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    return model.SerializeToString()


def _ort_answer() -> bytes:
    """ORT's own answer, on an input at a multiple of 64 (as its own allocator places them)."""
    session = ort.InferenceSession(_reduce_sum_model(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": codec.aligned_copy(X)})
    return bytes(np.asarray(y, np.float32).tobytes())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """`sum`: ReduceSum over all of x, served without batching (no batch buffer copies it)."""
    repo = tmp_path_factory.mktemp("aligned")
    write_version(repo, "sum", 1, _reduce_sum_model())
    (repo / "sum" / "config.toml").write_text("max_batch_size = 0\n")
    running, thread = start_server(ServerSettings(model_repository=repo, http_port=0, grpc_port=0))
    try:
        yield running
    finally:
        stop_server(running, thread)


def _binary_infer(server: RunningServer, head: bytes) -> bytes:
    request = urllib.request.Request(
        f"http://{server.http}/v2/models/sum/infer",
        data=head + X.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(head))},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        body = answer.read()
        return bytes(body[int(answer.headers["Inference-Header-Content-Length"]) :])


def _head(request_id: str | None = None, padding: int = 0) -> bytes:
    doc: dict[str, object] = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": list(X.shape),
             "parameters": {"binary_data_size": X.nbytes}},
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }  # fmt: skip
    if request_id is not None:
        doc["id"] = request_id
    return json.dumps(doc).encode() + b" " * padding  # (JSON may end in spaces)


def test_an_http_binary_answer_is_ort_s_whatever_the_request_id_s_length(
    server: RunningServer,
) -> None:
    expected = _ort_answer()
    answers = {_binary_infer(server, _head("i" * length)) for length in range(17)}
    assert answers == {expected}


def test_a_binary_header_decoded_from_its_recipe_gives_ort_s_answer_at_any_length(
    server: RunningServer,
) -> None:
    expected = _ort_answer()
    answers = set()
    for padding in range(17):
        head = _head(padding=padding)
        answers.add(_binary_infer(server, head))
        answers.add(_binary_infer(server, head))  # (the second from the recipe of the first)
    assert answers == {expected}


@pytest.mark.parametrize("skip", range(8))
def test_raw_bytes_at_any_offset_decode_to_an_aligned_array(skip: int) -> None:
    data = memoryview(b"\0" * skip + X.tobytes())[skip:]
    array = codec.from_raw(data, "FP32", X.shape, "input 'x'")
    assert array.ctypes.data % codec.ALIGNMENT == 0
    np.testing.assert_array_equal(array, X)


def test_a_grpc_raw_entry_decodes_to_an_aligned_array() -> None:
    array = codec.from_raw(X.tobytes(), "FP32", X.shape, "input 'x'")  # (a bytes object)
    assert array.ctypes.data % codec.ALIGNMENT == 0


def test_json_data_decodes_to_an_aligned_array() -> None:
    array = codec.from_json(X.tolist(), "FP32", X.shape, "input 'x'")
    assert array.ctypes.data % codec.ALIGNMENT == 0
    np.testing.assert_array_equal(array, X)


def test_recipe_inputs_are_aligned_whatever_the_header_s_length() -> None:
    recipes: rest.Recipes = {}
    for padding in range(17):
        head = _head(padding=padding)
        for _ in range(2):  # the first decodes the header, the second uses its recipe
            body = head + X.tobytes()
            request, _ = rest.parse_infer_request(body, len(head), "sum", None, None, recipes)
            assert request.inputs["x"].ctypes.data % codec.ALIGNMENT == 0
            np.testing.assert_array_equal(request.inputs["x"], X)


def test_an_aligned_input_is_a_view_of_the_body_not_a_copy() -> None:
    head = _head()
    header = -(-len(head) // codec.ALIGNMENT) * codec.ALIGNMENT  # padded to a multiple
    buffer = codec.aligned_empty(header + X.nbytes)
    buffer[:header] = np.frombuffer(head.ljust(header), np.uint8)
    buffer[header:] = np.frombuffer(X.tobytes(), np.uint8)
    recipes: rest.Recipes = {}
    for _ in range(2):  # (the first decodes it into a recipe, the second from it)
        request, _ = rest.parse_infer_request(buffer.data, header, "sum", None, None, recipes)
        assert np.shares_memory(request.inputs["x"], buffer)


def test_the_address_of_bytes_is_where_numpy_sees_them() -> None:
    data = X.tobytes()
    assert codec.data_address(data) == np.frombuffer(data, np.uint8).ctypes.data
    view = memoryview(data)[3:]
    assert codec.data_address(view) == np.frombuffer(data, np.uint8).ctypes.data + 3


def test_shared_memory_is_read_into_an_aligned_buffer(tmp_path: Path) -> None:
    (tmp_path / "obj").write_bytes(b"\0" * 3 + X.tobytes())
    regions = SharedMemoryRegions(root=tmp_path)
    try:
        regions.register("r", "/obj", 0, 3 + X.nbytes)
        data = regions.read(Window("r", X.nbytes, 3), "input 'x'", "FP32", X.shape)
        array = codec.from_raw(data, "FP32", X.shape, "input 'x'")
    finally:
        regions.close()
    assert array.ctypes.data % codec.ALIGNMENT == 0
    assert np.shares_memory(array, np.frombuffer(data, np.uint8))  # (no second copy)
    np.testing.assert_array_equal(array, X)


BIG = np.random.default_rng(1).standard_normal((5000, 64)).astype(np.float32)  # (1.3 MB: bulk)


@pytest.mark.parametrize("at", [0, 1, 63, 64, 100, 1 << 20])
def test_a_bulk_body_is_joined_with_its_binary_data_aligned(at: int) -> None:
    """Joined on its thread so that its first tensor lies at a multiple of the alignment: the
    decoder then uses it where it lies, where it copied 64 MiB on the event loop (20-45 ms)."""
    data = bytes(range(256)) * 8192  # 2 MiB
    chunks = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    body = http._join_aligned(chunks, at)
    assert bytes(body) == data
    assert (codec.data_address(body) + at) % codec.ALIGNMENT == 0


def test_a_bulk_binary_request_decodes_to_a_view_of_its_joined_body() -> None:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": list(BIG.shape),
                    "parameters": {"binary_data_size": BIG.nbytes},
                }
            ]
        }
    ).encode()
    wire = head + BIG.tobytes()
    body = http._join_aligned([wire[i : i + 65536] for i in range(0, len(wire), 65536)], len(head))
    request, _ = rest.parse_infer_request(body, len(head), "sum", None)
    assert np.shares_memory(request.inputs["x"], np.frombuffer(body, np.uint8))
    np.testing.assert_array_equal(request.inputs["x"], BIG)


def test_a_bulk_binary_request_is_answered_as_ort_answers_it(server: RunningServer) -> None:
    head = json.dumps(
        {
            "id": "odd",
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": list(BIG.shape),
                    "parameters": {"binary_data_size": BIG.nbytes},
                }
            ],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    request = urllib.request.Request(
        f"http://{server.http}/v2/models/sum/infer", data=head + BIG.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(head))},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as answer:
        body = answer.read()
        got = bytes(body[int(answer.headers["Inference-Header-Content-Length"]) :])
    session = ort.InferenceSession(_reduce_sum_model(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": codec.aligned_copy(BIG)})
    assert got == np.asarray(y, np.float32).tobytes()


def test_small_copies_are_aligned_and_never_share_memory() -> None:
    """Small copies are carved from a slab (1.2 µs where an allocation of their own took 3.4):
    each at a multiple of the alignment, none over another."""
    data = memoryview(b"\0" + X.tobytes())[1:]
    copies = [codec.from_raw(data, "FP32", X.shape, "input 'x'") for _ in range(200)]
    assert all(copy.ctypes.data % codec.ALIGNMENT == 0 for copy in copies)
    for copy in copies:
        np.testing.assert_array_equal(copy, X)
    copies[0][...] = 0
    assert all(not np.shares_memory(copies[0], other) for other in copies[1:])
    np.testing.assert_array_equal(copies[1], X)
