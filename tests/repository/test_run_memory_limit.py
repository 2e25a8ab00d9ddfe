"""A request whose values size a tensor (the shape given to a ConstantOfShape) is refused before
it runs when it asks for more than one run may allocate (`--max-run-memory-bytes`), naming the
input; models with such sizes run without ORT's CPU arena, so a big run's memory is given back;
an allocation ORT fails is the client's 400 naming the model, not a 500.

NOTE: a 16-byte request to `ConstantOfShape(shape) -> ReduceSum` for 1 GiB was answered 200 and
left the server 1 GB bigger for good; one for more than the machine has brings the OOM killer.
Every size run here is small (at most 1 MB); the refused ones are never allocated.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from conftest import RunningServer, start_server, stop_server
from onnx import TensorProto, helper, numpy_helper
from repo_models import write_version

from duetime.config import ServerSettings
from duetime.errors import InvalidInput
from duetime.execution.executor import Executor
from duetime.execution.ort import default_run_memory_bytes, out_of_memory
from duetime.repository.graphs import graph_facts
from duetime.repository.layout import scan_model
from duetime.repository.loader import load_version

pytestmark = pytest.mark.timeout(60)

LIMIT = 64 * 2**20
"""64 MiB: the limit the server of these tests has."""


def model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: Any = ()) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    made.ir_version = 8
    return made.SerializeToString()


def bomb() -> bytes:
    """The tester's model: `ConstantOfShape(shape) -> ReduceSum`, the shape from the request."""
    ones = numpy_helper.from_array(np.array([1.0], np.float32), "v")
    return model(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["big"], "big", value=ones),
            helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0),
        ],
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )


def counted() -> bytes:
    """A count `n` (int32 scalar) made a shape [n, 4] through Cast, Unsqueeze and Concat, and
    a Range(0, n, 1): the sizes exporters compute from an input."""
    return model(
        [
            helper.make_node("Cast", ["n"], ["n64"], to=TensorProto.INT64),
            helper.make_node("Unsqueeze", ["n64", "axis"], ["n1"]),
            helper.make_node("Concat", ["n1", "four"], ["shape"], axis=0),
            helper.make_node("ConstantOfShape", ["shape"], ["z"], "zeros"),
            helper.make_node("Range", ["zero", "n", "one"], ["r"], "steps"),
        ],
        [helper.make_tensor_value_info("n", TensorProto.INT32, [])],
        [
            helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("r", TensorProto.INT32, None),
        ],
        [
            numpy_helper.from_array(np.array([0], np.int64), "axis"),
            numpy_helper.from_array(np.array([4], np.int64), "four"),
            numpy_helper.from_array(np.array(0, np.int32), "zero"),
            numpy_helper.from_array(np.array(1, np.int32), "one"),
        ],
    )


def expand() -> bytes:
    """Expand(x, shape) -> its output: both the request's."""
    return model(
        [helper.make_node("Expand", ["x", "shape"], ["y"], "wide")],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )


def write(repo: Path, name: str, data: bytes) -> None:
    write_version(repo, name, 1, data)
    (repo / name / "config.toml").write_text("max_batch_size = 0\n")


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("repo")
    write(repo, "bomb", bomb())
    write(repo, "expand", expand())
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, max_run_memory_bytes=LIMIT
    )
    running, thread = start_server(settings)
    yield running
    stop_server(running, thread)


def infer(server: RunningServer, model_name: str, inputs: list[dict[str, Any]]) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.addresses.http_port, timeout=30)
    try:
        body = json.dumps({"inputs": inputs})
        connection.request("POST", f"/v2/models/{model_name}/infer", body)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


def shape(*dims: int) -> dict[str, Any]:
    return {"name": "shape", "datatype": "INT64", "shape": [len(dims)], "data": list(dims)}


def test_a_request_over_the_limit_is_refused_naming_the_input(limited: RunningServer) -> None:
    status, answer = infer(limited, "bomb", [shape(100 * 2**20 // 4)])  # 100 MiB of float32
    assert status == 400, answer
    error = answer["error"]
    assert "input 'shape'" in error, error
    assert "ConstantOfShape node 'big'" in error, error
    assert "104857600 bytes" in error, error
    assert f"{LIMIT} bytes" in error, error
    assert "--max-run-memory-bytes" in error, error


def test_a_request_under_the_limit_runs(limited: RunningServer) -> None:
    status, answer = infer(limited, "bomb", [shape(2**18)])  # 1 MiB
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [2.0**18]


def test_each_request_is_checked_with_its_own_values(limited: RunningServer) -> None:
    """Requests of one shape (one template) carry other values: each is judged by its own."""
    for _ in range(3):
        assert infer(limited, "bomb", [shape(16)])[0] == 200
        assert infer(limited, "bomb", [shape(2**30)])[0] == 400


def test_expand_counts_its_output(limited: RunningServer) -> None:
    one = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}
    status, answer = infer(limited, "expand", [one, shape(2**25)])  # 128 MiB
    assert status == 400, answer
    assert "input 'shape'" in answer["error"], answer
    status, answer = infer(limited, "expand", [one, shape(3)])
    assert status == 200, answer
    assert answer["outputs"][0]["data"] == [1.0, 1.0, 1.0], answer


def test_sizes_computed_through_casts_and_concats() -> None:
    facts = graph_facts(onnx.load_from_string(counted()))
    asked = {
        node.described: node.bytes_asked({"n": np.array(10, np.int32)})
        for node in facts.sized_nodes
    }
    assert asked == {"ConstantOfShape node 'zeros'": 10 * 4 * 4, "Range node 'steps'": 10 * 4}
    assert all(node.inputs == ("n",) for node in facts.sized_nodes)


def test_values_not_computed_are_not_refused() -> None:
    """A negative dim (ORT refuses it itself) or a shape the request does not give: unknown."""
    (node,) = graph_facts(onnx.load_from_string(bomb())).sized_nodes
    assert node.bytes_asked({"shape": np.array([-1], np.int64)}) is None
    assert node.bytes_asked({}) is None


def test_value_sized_models_run_without_the_arena(tmp_path: Path) -> None:
    write(tmp_path, "bomb", bomb())
    source = scan_model(tmp_path / "bomb")
    loaded = load_version(source, 1, max_run_memory_bytes=LIMIT)
    try:
        session = loaded.executor._sessions[0]
        assert session.get_session_options().enable_cpu_mem_arena is False
        with pytest.raises(InvalidInput, match="input 'shape'"):
            loaded.validator.prepare({"shape": np.array([2**25], np.int64)}, None)
    finally:
        loaded.executor.close()


def test_the_default_limit_is_a_share_of_memory(tmp_path: Path) -> None:
    write(tmp_path, "bomb", bomb())
    loaded = load_version(scan_model(tmp_path / "bomb"), 1)
    try:
        assert loaded.validator._max_run_bytes == default_run_memory_bytes() > 0
    finally:
        loaded.executor.close()


ARENA_FAILURE = (
    "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running "
    "ConstantOfShape node. Name:'big' Status Message: /onnxruntime_src/onnxruntime/core/"
    "framework/bfc_arena.cc:360 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, "
    "onnxruntime::Stream*) Failed to allocate memory for requested buffer of size 53687091200"
)


class _Fails:
    """A stand-in session whose every run fails as ORT's arena does when out of memory."""

    def run(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise RuntimeError(ARENA_FAILURE)


def test_an_allocation_failure_is_the_requests_400_naming_the_model() -> None:
    error = out_of_memory(RuntimeError(ARENA_FAILURE), "'bomb' version 1")
    assert isinstance(error, InvalidInput)
    assert error.http_status == 400
    assert "model 'bomb' version 1 ran out of memory" in error.message
    assert "ConstantOfShape node 'big'" in error.message
    assert out_of_memory(RuntimeError("std::bad_alloc"), "m") is not None
    assert out_of_memory(RuntimeError("index 7 is out of bounds"), "m") is None
    executor = Executor([_Fails()], output_names=["y"], string_outputs=frozenset(),
                        batched=False, label="bomb-1", inline=True,
                        named="'bomb' version 1")  # fmt: skip
    failed = executor._run_error(RuntimeError(ARENA_FAILURE), executor._runs[0], {})
    assert isinstance(failed, InvalidInput)
    # (as every other error names a model: 'bomb-1', the threads' label, is no model's name)
    assert "model 'bomb' version 1 ran out of memory" in failed.message
