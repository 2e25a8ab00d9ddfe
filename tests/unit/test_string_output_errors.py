"""A model whose string output holds bytes that are not UTF-8: ONNX strings are bytes, but
ONNX Runtime's Python API decodes them to `str` and fails. The model's fault, told as such (500 /
INTERNAL, the output named), and no way for one client to open the breaker on everyone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper
from repo_models import age, write_version

from duetime.engine import Engine
from duetime.errors import InvalidInput, ModelOutputError
from duetime.execution.executor import BatchJob, Unreturned
from duetime.repository.layout import scan_model
from duetime.repository.loader import LoadedModel, load_version
from duetime.resilience.breaker import BreakerState

pytestmark = pytest.mark.timeout(60)

NOT_UTF8 = b"\xff\xfe"


def model_bytes(nodes: list[object], inputs: list[object], outputs: list[object],
                initializers: list[object]) -> bytes:  # fmt: skip
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def constant_strings_model() -> bytes:
    """The tester's model: y = ["ok", <not UTF-8>] and good = ["ok"] whatever x, and z = x."""
    value = helper.make_tensor_value_info
    return model_bytes(
        [helper.make_node("Identity", ["bad"], ["y"]),
         helper.make_node("Identity", ["ok"], ["good"]),
         helper.make_node("Identity", ["x"], ["z"])],
        [value("x", TensorProto.FLOAT, [1])],
        [value("y", TensorProto.STRING, [2]), value("good", TensorProto.STRING, [1]),
         value("z", TensorProto.FLOAT, [1])],
        [helper.make_tensor("bad", TensorProto.STRING, [2], [b"ok", NOT_UTF8]),
         helper.make_tensor("ok", TensorProto.STRING, [1], [b"ok"])],
    )  # fmt: skip


def label_model() -> bytes:
    """y[N, 1] = the label of class x[N, 1]: class 0 is "ok", class 1 is not UTF-8 (labels in
    another encoding): which requests fail depends on their values."""
    value = helper.make_tensor_value_info
    return model_bytes(
        [helper.make_node("Gather", ["labels", "x"], ["y"])],
        [value("x", TensorProto.INT64, ["N", 1])],
        [value("y", TensorProto.STRING, ["N", 1])],
        [helper.make_tensor("labels", TensorProto.STRING, [2], [b"ok", NOT_UTF8])],
    )


@pytest.fixture
def constant(tmp_path: Path) -> Iterator[LoadedModel]:
    write_version(tmp_path, "m", 1, constant_strings_model())
    model = load_version(scan_model(tmp_path / "m"), 1, profile_budget_s=0.05)
    yield model
    model.executor.close()


def test_the_error_names_the_output_and_blames_the_model(constant: LoadedModel) -> None:
    """The run's other outputs are kept (`Unreturned`) for requests that did not ask for it:
    all failed, a client asking for another output got 500 where ONNX Runtime asked for that
    output alone answers (found by a tester)."""
    feeds = constant.validator.prepare({"x": np.zeros(1, np.float32)}, None).feeds
    result = constant.executor.run_now(0, BatchJob([feeds], [1], 0, lambda _: None))
    (outputs,) = result.outputs
    assert isinstance(outputs, Unreturned)
    assert outputs.missing == {"y"}
    assert outputs["good"].tolist() == [b"ok"]
    assert outputs["z"].tolist() == [0.0]
    assert outputs.error_for(["z", "good"]) is None
    error = outputs.error_for(["z", "y"])
    assert isinstance(error, ModelOutputError)
    assert (error.http_status, error.grpc_code) == (500, "INTERNAL")
    assert error.message.startswith(
        "the model made string output 'y' holding bytes that are not valid UTF-8 ('utf-8' codec "
        "can't decode byte 0xff in position 0: invalid start byte), which ONNX Runtime's Python "
        "API cannot return: a fault of the model, not of the request"
    )


def config(repo: Path, text: str) -> None:
    path = repo / "m" / "config.toml"
    path.write_text(text, encoding="utf-8")
    age(path)


def run(repo: Path, scenario: object) -> None:
    async def main() -> None:
        engine = await Engine.start(repo)
        try:
            await scenario(engine)  # type: ignore[operator]
        finally:
            await engine.aclose()

    asyncio.run(main())


def states(engine: Engine) -> list[BreakerState]:
    scheduler = engine.registry.snapshot.models["m"].versions["1"].primary.scheduler
    return [b.state for b in scheduler._breakers]


async def label(engine: Engine, *classes: int) -> list[list[bytes]]:
    x = np.array([[c] for c in classes], np.int64)
    return (await engine.infer_async("m", {"x": x}, timeout=10.0))["y"].tolist()  # type: ignore[no-any-return]


def test_one_client_s_bad_labels_do_not_open_the_breaker_on_everyone_else(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, label_model())
    config(tmp_path, "max_batch_size = 8\n[breaker]\nfailures = 3\nopen_s = 5.0\n")

    async def scenario(engine: Engine) -> None:
        for _ in range(3):
            assert await label(engine, 0) == [[b"ok"]]
            for _ in range(10):
                with pytest.raises(ModelOutputError, match="string output 'y' holding bytes"):
                    await label(engine, 1)
            assert states(engine) == [BreakerState.CLOSED]
        # batched together, each request fails or is answered alone
        together = await asyncio.gather(label(engine, 0), label(engine, 1), return_exceptions=True)
        assert together[0] == [[b"ok"]]
        assert isinstance(together[1], ModelOutputError)

    run(tmp_path, scenario)


def test_a_model_that_fails_every_request_so_still_opens_it(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, label_model())
    config(tmp_path, "max_batch_size = 8\n[breaker]\nfailures = 3\nopen_s = 5.0\n")

    async def scenario(engine: Engine) -> None:
        for _ in range(3):
            with pytest.raises(InvalidInput, match="not valid UTF-8"):  # (see ModelOutputError)
                await label(engine, 1)
        assert states(engine) == [BreakerState.OPEN]

    run(tmp_path, scenario)


def test_a_request_not_asking_for_the_output_is_answered(tmp_path: Path) -> None:
    """Through the engine (a ticket's failure, and the in-process lean path alike): a request
    for the other outputs is answered; one asking for the string output gets its error."""
    write_version(tmp_path, "m", 1, constant_strings_model())
    config(tmp_path, "max_batch_size = 0\n")

    async def scenario(engine: Engine) -> None:
        x = {"x": np.zeros(1, np.float32)}
        for _ in range(2):  # (the first may run within the call: `submit_now`)
            answer = await engine.infer_async("m", x, outputs=["z", "good"], timeout=10.0)
            assert answer["z"].tolist() == [0.0]
            assert answer["good"].tolist() == [b"ok"]
            with pytest.raises(ModelOutputError, match="string output 'y' holding bytes"):
                await engine.infer_async("m", x, outputs=["y"], timeout=10.0)
            with pytest.raises(ModelOutputError, match="string output 'y' holding bytes"):
                await engine.infer_async("m", x, timeout=10.0)  # (all of them)
            done = await asyncio.gather(
                *(engine.infer_async("m", x, outputs=["z"], timeout=10.0) for _ in range(4))
            )
            assert [d["z"].tolist() for d in done] == [[0.0]] * 4

    run(tmp_path, scenario)


def test_over_http_and_grpc_the_other_outputs_are_answered(tmp_path: Path) -> None:
    import http.client

    import grpc
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from conftest import serving
    from tritonclient.utils import InferenceServerException

    from duetime.config import ServerSettings

    write_version(tmp_path, "m", 1, constant_strings_model())
    config(tmp_path, "max_batch_size = 0\n")
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0)
    with serving(settings) as running:
        for module, url in ((httpclient, running.http), (grpcclient, running.grpc)):
            client = module.InferenceServerClient(url)
            x = module.InferInput("x", [1], "FP32")
            x.set_data_from_numpy(np.zeros(1, np.float32))
            answer = client.infer("m", [x], outputs=[module.InferRequestedOutput("z")])
            assert answer.as_numpy("z").tolist() == [0.0]
            with pytest.raises(InferenceServerException) as refused:
                client.infer("m", [x], outputs=[module.InferRequestedOutput("y")])
            assert "string output 'y' holding bytes" in str(refused.value)
            if module is grpcclient:
                assert refused.value.status() == str(grpc.StatusCode.INTERNAL)
            else:
                assert refused.value.status() == "500"
            client.close()
        stats = running.statistics("m")
        assert stats.succeeded >= 4
        # (a V1 predict gets every output: the string one's error, counted as v2's are)
        host, port = running.http.rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.request("POST", "/v1/models/m:predict", body='{"inputs": {"x": [0.0]}}')
        answer = connection.getresponse()
        assert answer.status == 500
        assert "string output 'y' holding bytes" in answer.read().decode()
        connection.close()
        failed = running.samples("duetime_answers_failed_total", "model", "reason")
        assert failed[("m", "unmade")] == 3  # (HTTP's, gRPC's and V1's)
