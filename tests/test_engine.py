"""The in-process API as a Python program uses it: `Engine.open` (its loop on a thread of its
own) from threads and from other event loops, and what it says about arguments it cannot take."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from duetime import Engine
from duetime.errors import DuetimeError, InvalidInput, ModelUnavailable
from duetime.types import InferRequest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def engine(mlp_resnet_repo: Path) -> Iterator[Engine]:
    opened = Engine.open(mlp_resnet_repo)
    yield opened
    opened.close()


def mlp_rows(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 40), dtype=np.float32)


def reference(demo_repo: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(demo_repo / "mlp" / "1" / "model.onnx"))
    return np.asarray(session.run(None, {"x": x})[0])


def test_infer_from_threads_and_from_another_loop_match_onnxruntime(
    engine: Engine, demo_repo: Path
) -> None:
    x = mlp_rows(3)
    expected = reference(demo_repo, x)
    answers: list[np.ndarray] = []

    def call() -> None:
        answers.append(engine.infer("mlp", {"x": x}, timeout=10.0)["y"])

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(answers) == 8
    for answer in answers:
        np.testing.assert_allclose(answer, expected, rtol=1e-6, atol=1e-6)

    async def elsewhere() -> list[dict[str, np.ndarray]]:  # (this loop is not the engine's)
        return list(await asyncio.gather(*(engine.infer_async("mlp", {"x": x}) for _ in range(8))))

    for outputs in asyncio.run(elsewhere()):
        np.testing.assert_allclose(outputs["y"], expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="runs on the engine's own loop"):
        engine.submit(InferRequest(model="mlp", inputs={"x": x}))


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        ({"timeout": math.nan}, "timeout: expected seconds >= 0"),
        ({"timeout": -1.0}, "timeout: expected seconds >= 0"),
        ({"timeout": "1"}, "timeout: expected seconds >= 0"),
        ({"priority": None}, "priority: expected an integer >= 0"),
        ({"priority": "1"}, "priority: expected an integer >= 0"),
        ({"priority": True}, "priority: expected an integer >= 0"),
        ({"priority": -1}, "priority: expected an integer >= 0"),
        ({"outputs": "y"}, "outputs: expected a sequence of output names"),
        ({"outputs": 5}, "outputs: expected a sequence of output names"),  # (was a TypeError)
        ({"outputs": [5]}, "outputs: expected a sequence of output names"),
        ({"version": True}, "version: expected a version number or name"),
        ({"version": 1.5}, "version: expected a version number or name"),
    ],
    ids=str,
)
def test_arguments_it_cannot_take_are_invalid_input(
    engine: Engine, arguments: dict[str, object], needle: str
) -> None:
    with pytest.raises(InvalidInput, match=needle):
        engine.infer("mlp", {"x": mlp_rows(1)}, **arguments)  # type: ignore[arg-type]


def test_an_infinite_timeout_is_no_due_time_and_inputs_must_be_a_mapping(engine: Engine) -> None:
    assert engine.infer("mlp", {"x": mlp_rows(1)}, timeout=math.inf)["y"].shape == (1, 3)
    # (1e300 s overflowed the clock's integer: a bare OverflowError)
    assert engine.infer("mlp", {"x": mlp_rows(1)}, timeout=1e300)["y"].shape == (1, 3)
    # numpy's numbers are numbers
    x = {"x": mlp_rows(1)}
    assert engine.infer("mlp", x, priority=np.int64(1), version=np.int64(1))["y"].shape == (1, 3)
    assert engine.infer("mlp", x, timeout=np.float32(5))["y"].shape == (1, 3)
    # no outputs named is all of them, as over HTTP and gRPC (an empty list answered none)
    assert list(engine.infer("mlp", x, outputs=[])) == ["y"]
    with pytest.raises(InvalidInput, match="inputs: expected a mapping"):
        engine.infer("mlp", mlp_rows(1))  # type: ignore[arg-type]


def test_classes_must_name_a_returned_output_and_count_from_one(engine: Engine) -> None:
    async def submit(classes: dict[str, object], outputs: tuple[str, ...] | None) -> None:
        request = InferRequest(
            model="mlp",
            inputs={"x": mlp_rows(2)},
            classes=classes,
            outputs=outputs,  # type: ignore[arg-type]
        )
        ticket = engine.submit(request)
        await ticket.future
        assert ticket.response().outputs["y"].shape == (2, 2)

    def on_engine_loop(classes: dict[str, object], outputs: tuple[str, ...] | None) -> None:
        loop = engine._loop
        assert loop is not None
        asyncio.run_coroutine_threadsafe(submit(classes, outputs), loop).result(30)

    on_engine_loop({"y": 2}, None)
    for classes, outputs, needle in (
        ({"zz": 2}, None, "output 'zz': asked for as classes, but it is not among the outputs"),
        ({"y": 2}, (), "output 'y': asked for as classes, but it is not among"),
        ({"y": 0}, None, "parameter 'classification' must be a positive integer"),
        ({"y": 1.5}, None, "parameter 'classification' must be a positive integer"),
        ({"y": True}, None, "parameter 'classification' must be a positive integer"),
    ):
        with pytest.raises(InvalidInput, match=needle):
            on_engine_loop(classes, outputs)


def hammer(engine: Engine, ended: list[str]) -> None:
    """Call until the engine says it is closed (the other refusals a busy engine gives pass)."""
    while True:
        try:
            engine.infer("mlp", {"x": mlp_rows(1)}, timeout=1.0)
        except ModelUnavailable:
            break
        except DuetimeError:
            continue
    ended.append("ended")


def test_close_ends_every_call_made_meanwhile_and_twice_is_nothing(mlp_repo: Path) -> None:
    """Calls racing close() were handed to a loop that closed without taking them: they waited
    forever."""
    for _ in range(3):
        engine = Engine.open(mlp_repo)
        ended: list[str] = []
        threads = [
            threading.Thread(target=hammer, args=(engine, ended), daemon=True) for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        engine.close()
        for thread in threads:
            thread.join(10)
        assert len(ended) == 8, "a call made while closing never ended"
        engine.close()  # (again: nothing)
        with pytest.raises(ModelUnavailable, match="the engine is closed"):
            engine.infer("mlp", {"x": mlp_rows(1)})


def test_an_engine_left_open_is_closed_as_the_interpreter_exits(mlp_resnet_repo: Path) -> None:
    """Its instance threads are daemons: killed in the middle of an ONNX Runtime run, they abort
    the process (exit 134) unless the engine is closed first."""
    script = f"""
import threading, numpy as np
from duetime import Engine
engine = Engine.open({str(mlp_resnet_repo)!r})
def work():
    while True:
        try:
            engine.infer("resnet", {{"image": np.ones((2, 3, 64, 64), np.float32)}})
        except Exception:
            return
for _ in range(3):
    threading.Thread(target=work, daemon=True).start()
engine.infer("mlp", {{"x": np.ones((1, 40), np.float32)}})
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=100, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # (closing at exit found the thread pools shut down already: "cannot schedule new futures
    # after interpreter shutdown", a traceback at every exit)
    assert "Traceback" not in result.stderr, result.stderr[-2000:]


def test_calls_given_up_on_another_loop_are_withdrawn_and_the_rest_answered(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """`asyncio.wait_for(engine.infer_async(...), t)` on a loop of the caller's: the cancel
    never reached the request, which ran anyway, and its answer, set on the cancelled future,
    raised in the scheduler's settling of its batch (InvalidStateError): the batch's other
    requests were never answered and the model stopped taking work."""
    images = {"image": np.ones((1, 3, 64, 64), np.float32)}

    async def impatient() -> int:
        async def call() -> bool:
            try:
                await asyncio.wait_for(engine.infer_async("resnet", images), 0.0005)
            except TimeoutError:
                return False
            return True

        return sum(await asyncio.gather(*(call() for _ in range(300))))

    with caplog.at_level("ERROR"):
        asyncio.run(impatient())
        answers: list[np.ndarray] = []
        threads = [
            threading.Thread(
                target=lambda: answers.append(engine.infer("resnet", images)["logits"])
            )
            for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert len(answers) == 4, "calls made after the cancelled ones were never answered"
    assert "InvalidStateError" not in caplog.text


def test_an_engine_opened_before_a_fork_refuses_calls_in_the_child(mlp_repo: Path) -> None:
    """Its loop thread does not come along into the child: a call there waited forever."""
    script = f"""
import os, numpy as np
from duetime import Engine
engine = Engine.open({str(mlp_repo)!r})
pid = os.fork()
if pid == 0:
    try:
        engine.infer("mlp", {{"x": np.ones((1, 40), np.float32)}}, timeout=1.0)
    except RuntimeError as exc:
        print("child:", exc, flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("parent:", engine.infer("mlp", {{"x": np.ones((1, 40), np.float32)}})["y"].shape)
engine.close()
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=100, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "child: this engine was opened in another process" in result.stdout
    assert "parent: (1, 3)" in result.stdout


def test_a_model_that_is_no_name_is_invalid_input(engine: Engine) -> None:
    """None was looked up: "unknown model 'None'"."""
    with pytest.raises(InvalidInput, match="model: expected a model name"):
        engine.infer(None, {"x": mlp_rows(1)})  # type: ignore[arg-type]


def test_async_with_closes_an_engine_at_its_end(mlp_repo: Path) -> None:
    """`async with` was a TypeError: Engine had no __aenter__."""

    async def main() -> None:
        async with await Engine.start(mlp_repo) as engine:
            assert (await engine.infer_async("mlp", {"x": mlp_rows(1)}))["y"].shape == (1, 3)
        with pytest.raises(ModelUnavailable):
            await engine.infer_async("mlp", {"x": mlp_rows(1)})

    asyncio.run(main())
    with Engine.open(mlp_repo) as opened:  # (and an open() engine, from a loop of the caller's)

        async def elsewhere() -> None:
            async with opened:
                await opened.infer_async("mlp", {"x": mlp_rows(1)})

        asyncio.run(elsewhere())
        with pytest.raises(ModelUnavailable):
            opened.infer("mlp", {"x": mlp_rows(1)})


def test_an_engine_started_on_a_loop_refuses_calls_from_another(mlp_repo: Path) -> None:
    async def main() -> None:
        engine = await Engine.start(mlp_repo)
        try:

            async def elsewhere() -> None:
                await engine.infer_async("mlp", {"x": mlp_rows(1)})

            with pytest.raises(RuntimeError, match="runs on the loop that started it"):
                await asyncio.to_thread(asyncio.run, elsewhere())
            assert (await engine.infer_async("mlp", {"x": mlp_rows(1)}))["y"].shape == (1, 3)
        finally:
            await engine.aclose()

    asyncio.run(main())


def test_a_request_padded_up_to_its_bucket_runs_no_row_the_model_refuses(tmp_path: Path) -> None:
    """5 rows run as 6: the padding row once was zeros, and y = 100 / x failed the request with
    ONNX Runtime's integer division by zero (a 400 blaming the client's valid inputs)."""
    from onnx import TensorProto, helper
    from repo_models import write_version

    graph = helper.make_graph(
        [helper.make_node("Div", ["hundred", "x"], ["y"])], "intdiv",
        [helper.make_tensor_value_info("x", TensorProto.INT32, ["n", 2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["n", 2])],
        [helper.make_tensor("hundred", TensorProto.INT32, [], [100])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    write_version(tmp_path, "intdiv", 1, model.SerializeToString())
    (tmp_path / "intdiv" / "config.toml").write_text("max_batch_size = 8\n")
    x = np.arange(1, 11, dtype=np.int32).reshape(5, 2)
    with Engine.open(tmp_path) as engine:
        np.testing.assert_array_equal(engine.infer("intdiv", {"x": x})["y"], 100 // x)


def test_a_request_its_variant_refuses_at_admission_goes_to_a_cheaper_one(tmp_path: Path) -> None:
    """The router picks a variant by `fits`; admission a moment later can still refuse it (the
    clock moved, the request's size): a cheaper variant that fits takes it, not a 429."""
    from repo_models import scale_model, write_version

    from duetime.errors import Overloaded

    write_version(tmp_path, "m", 1, scale_model(2.0))
    write_version(tmp_path, "m", 1, scale_model(2.0), name="small.onnx")
    (tmp_path / "m" / "config.toml").write_text(
        'max_batch_size = 4\n[[variants]]\nname = "small"\nfile = "small.onnx"\n'
    )

    async def main() -> None:
        engine = await Engine.start(tmp_path)
        try:
            primary = engine.registry.snapshot.models["m"].versions["1"].primary

            def refuse(*args: object, **kwargs: object) -> object:
                raise Overloaded("predicted to finish too late")

            primary.scheduler.submit_nowait = refuse  # type: ignore[method-assign]
            x = np.ones((1, 4), np.float32)
            ticket = engine.submit(engine._request("m", {"x": x}, None, 1.0, 0, None))
            await ticket.future
            assert ticket.variant == "small"
            np.testing.assert_array_equal(ticket.response().outputs["y"], 2 * x)
            with pytest.raises(Overloaded):  # no due time: no variant choice either
                engine.submit(engine._request("m", {"x": x}, None, None, 0, None))
        finally:
            await engine.aclose()

    asyncio.run(main())


def test_a_config_or_options_of_the_wrong_type_is_refused_naming_it() -> None:
    """A dict (or a JSON string, what Triton's load API takes) failed deep inside with
    "'dict' object has no attribute 'version_policy'" (or 'startup_models')."""
    with pytest.raises(TypeError, match=r"^options: expected a .*RepositoryOptions.* got dict"):
        Engine(options={"control_mode": "explicit"})  # type: ignore[arg-type]
    for config in ({"max_batch_size": 4}, '{"max_batch_size": 4}'):
        with pytest.raises(TypeError, match=r"^config: expected a duetime\.config\.ModelConfig"):
            asyncio.run(Engine().load_model("mlp", config=config))  # type: ignore[arg-type]


def test_dir_lists_the_api_loaded_on_first_use() -> None:
    import duetime

    assert set(duetime.__all__) <= set(dir(duetime))
