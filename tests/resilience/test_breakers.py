"""Circuit breakers with a real model that fails or slows on demand (`faulty_model`: a control
input k = 1 makes ONNX Runtime fail, k = n > 1 runs n extra matrix products), and one that fails
on every input, its own sample inputs included (`broken_model`).

Failures on a client's values (answered 400) do not open the breaker while the model answered
others (or was loaded) within open_s; past that they count (answered 500); a model that fails on
its own samples opens it, requests then fail fast with 503 + Retry-After (or go to a healthy version
when the traffic policy has one). The probe cycle is in tests/scheduling/test_scheduler.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
from repo_models import age, faulty_model, heavy_model, inputs, write_version

from duetime.engine import Engine, Ticket
from duetime.errors import InvalidInput, ModelUnavailable
from duetime.repository.manager import RepositoryOptions
from duetime.resilience.breaker import BreakerState
from duetime.scheduling.profile import profile_from_samples

Scenario = Callable[[Engine], Awaitable[None]]


def run(repo: Path, scenario: Scenario) -> None:
    async def main() -> None:
        engine = await Engine.start(repo, options=RepositoryOptions())
        try:
            await scenario(engine)
        finally:
            await engine.aclose()

    asyncio.run(main())


def config(repo: Path, model: str, text: str) -> None:
    path = repo / model / "config.toml"
    path.write_text(text)
    age(path)


async def call(engine: Engine, k: int, model: str = "m", **kwargs: object) -> np.ndarray:
    feeds = {"x": inputs()["x"], "k": np.full((1, 1), k, dtype=np.int64)}
    return (await engine.infer_async(model, feeds, **kwargs))["y"]  # type: ignore[arg-type]


async def unversioned(engine: Engine) -> Ticket:
    """A good request that names no version; its ticket says who answered."""
    feeds = {"x": inputs()["x"], "k": np.zeros((1, 1), np.int64)}
    ticket = engine.submit(engine._request("m", feeds, None, None, 0, None))
    await ticket.future
    return ticket


def states(engine: Engine, version: str = "1") -> list[BreakerState]:
    scheduler = engine.registry.snapshot.models["m"].versions[version].primary.scheduler
    return [b.state for b in scheduler._breakers]


BREAKER = "[breaker]\nfailures = 3\nopen_s = 0.3\nslow_executions = 2\nslow_factor = 5.0\n"


def broken_model() -> bytes:
    """y = x[:, [10, 10, 10, 10]] for x FP32 [-1, 4], with an unused control input k INT64
    [-1, 1] (the signature of `faulty_model`): index 10 is out of range for every input, so ONNX
    Runtime fails on each (answered 400, as a value it refuses), its sample inputs too: the
    model is at fault, not its clients."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "ten"], ["y"], axis=1)],
        "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("k", TensorProto.INT64, ["n", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(np.full(4, 10, dtype=np.int64), "ten")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_client_s_bad_values_never_open_it_even_on_a_model_nobody_used_yet(
    tmp_path: Path,
) -> None:
    """Probe t2: 5 requests with an out-of-range index to a fresh model (no answer within
    open_s to clear it) opened its breaker, and the next valid request got 503. Answered 400,
    they say nothing of the model; its own samples show it healthy."""
    write_version(tmp_path, "m", 1, faulty_model())
    config(tmp_path, "m", "max_batch_size = 8\n" + BREAKER.replace("0.3", "5.0"))

    async def scenario(engine: Engine) -> None:
        for _ in range(10):
            with pytest.raises(InvalidInput, match="ONNX Runtime could not run"):
                await call(engine, 1)
        assert states(engine) == [BreakerState.CLOSED]
        np.testing.assert_array_equal(await call(engine, 0), inputs()["x"])

    run(tmp_path, scenario)


def divider_model() -> bytes:
    """y = a / b for INT64 a, b [-1, 1]: ONNX Runtime fails where b holds a zero, its zero
    samples too (its load runs distinct samples instead)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Div", ["a", "b"], ["y"])],
        "divider",
        [helper.make_tensor_value_info("a", TensorProto.INT64, ["n", 1]),
         helper.make_tensor_value_info("b", TensorProto.INT64, ["n", 1])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["n", 1])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_model_checked_on_the_samples_its_load_ran_stays_closed(tmp_path: Path) -> None:
    """NOTE: its check ran zero samples whatever its load had found: a divider, loaded on
    distinct samples as zeros failed, failed its check after a client's divisions by zero in a
    row, and its breaker opened on every client (found by a tester)."""
    write_version(tmp_path, "m", 1, divider_model())
    config(tmp_path, "m", "max_batch_size = 8\n" + BREAKER.replace("0.3", "5.0"))

    def feeds(b: int) -> dict[str, np.ndarray]:
        return {"a": np.full((1, 1), 7, np.int64), "b": np.full((1, 1), b, np.int64)}

    async def scenario(engine: Engine) -> None:
        for _ in range(10):
            with pytest.raises(InvalidInput, match="ONNX Runtime could not run"):
                await engine.infer_async("m", feeds(0))
        for _ in range(20):  # (a check's run ends on its thread)
            await asyncio.sleep(0.01)
        assert states(engine) == [BreakerState.CLOSED]
        answer = await engine.infer_async("m", feeds(2))
        np.testing.assert_array_equal(answer["y"], [[3]])

    run(tmp_path, scenario)


def test_a_model_that_fails_on_its_own_samples_opens_it(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, broken_model())
    config(tmp_path, "m", "max_batch_size = 8\n" + BREAKER)

    async def scenario(engine: Engine) -> None:
        for _ in range(3):  # the third in a row has its samples run: they fail too
            with pytest.raises(InvalidInput, match="ONNX Runtime could not run"):
                await call(engine, 0)
        for _ in range(100):  # (the samples' run ends on its thread)
            if states(engine) == [BreakerState.OPEN]:
                break
            await asyncio.sleep(0.01)
        assert states(engine) == [BreakerState.OPEN]
        with pytest.raises(ModelUnavailable, match="circuit breaker open") as caught:
            await call(engine, 0)  # fails fast
        assert caught.value.http_status == 503
        assert caught.value.retry_after_s is not None
        assert 0 < caught.value.retry_after_s <= 0.3

    run(tmp_path, scenario)


async def opened(engine: Engine, version: str = "1") -> None:
    """Three failing requests to a `broken_model` version, then until its samples' run has
    opened its breaker."""
    for _ in range(3):
        with pytest.raises(InvalidInput):
            await call(engine, 0, version=int(version))
    for _ in range(100):
        if states(engine, version) == [BreakerState.OPEN]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"breaker of version {version} not open: {states(engine, version)}")


def test_a_broken_model_probed_again_reopens_for_longer(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, broken_model())
    config(tmp_path, "m", "max_batch_size = 8\n" + BREAKER)

    async def scenario(engine: Engine) -> None:
        await opened(engine)
        await asyncio.sleep(0.35)
        # half-open: one probe failing on its values (400) has the samples run at once: they
        # fail too, and that reopens it (not `failures` requests let through each period)
        with pytest.raises(InvalidInput, match="not counted"):
            await call(engine, 0)
        for _ in range(100):  # (the samples' run ends on its thread)
            if states(engine) == [BreakerState.OPEN]:
                break
            await asyncio.sleep(0.01)
        assert states(engine) == [BreakerState.OPEN]
        with pytest.raises(ModelUnavailable) as caught:
            await call(engine, 0)
        assert caught.value.retry_after_s is not None
        assert caught.value.retry_after_s > 0.35  # doubled

    run(tmp_path, scenario)


def test_a_good_request_between_failures_keeps_it_closed(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, faulty_model())
    config(tmp_path, "m", "max_batch_size = 8\n" + BREAKER)

    async def scenario(engine: Engine) -> None:
        for _ in range(5):
            for _ in range(2):
                with pytest.raises(InvalidInput):
                    await call(engine, 1)
            await call(engine, 0)
        assert states(engine) == [BreakerState.CLOSED]

    run(tmp_path, scenario)


def test_slow_executions_open_it(tmp_path: Path) -> None:
    """A model whose cost is fixed (products of fixed-size matrices) that runs far slower than
    its profile says (simulated: its profile is swapped for one 1,000 times faster) is shed."""
    # (about 1 ms a run: well over the 100 µs floor below which no run is slow, on any machine)
    write_version(tmp_path, "m", 1, heavy_model(1.0, width=512, depth=16))
    config(
        tmp_path, "m",
        "max_batch_size = 8\n" + BREAKER + "slow_min_us = 100\n",
    )  # fmt: skip

    async def scenario(engine: Engine) -> None:
        scheduler = engine.registry.snapshot.models["m"].versions["1"].primary.scheduler
        measured = scheduler.profile
        scheduler.profile = profile_from_samples(
            {b: [max(1, measured.predict(b) // 1000)] * 5 for b in measured.buckets}
        )
        await engine.infer_async("m", inputs())
        assert states(engine) == [BreakerState.CLOSED]
        await engine.infer_async("m", inputs())
        assert states(engine) == [BreakerState.OPEN]
        with pytest.raises(ModelUnavailable, match="circuit breaker open"):
            await engine.infer_async("m", inputs())

    run(tmp_path, scenario)


def test_a_model_whose_cost_follows_its_input_values_is_never_slow(tmp_path: Path) -> None:
    """Probe t3: valid requests whose Loop runs for a count read from an input (here k) took
    60-120 ms against a profile of well under a millisecond, and opened the breaker for
    everyone. The loader marks such a model (`cost_depends_on_values`); its runs are never
    judged slow."""
    write_version(tmp_path, "m", 1, faulty_model())
    config(
        tmp_path, "m",
        "max_batch_size = 8\n" + BREAKER + "slow_min_us = 1000\n",
    )  # fmt: skip

    async def scenario(engine: Engine) -> None:
        for _ in range(4):
            await call(engine, 4000)  # ~10 ms against a profile of well under a millisecond
        assert states(engine) == [BreakerState.CLOSED]

    run(tmp_path, scenario)


def test_big_inputs_to_a_model_of_free_size_are_not_slow_executions(tmp_path: Path) -> None:
    """A model that does not batch takes inputs of any size: its profile was measured on a
    sample of one element, and valid inputs a million times bigger opened the breaker."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)], "sum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 8
    write_version(tmp_path, "m", 1, model.SerializeToString())
    config(tmp_path, "m", BREAKER + "slow_min_us = 100\n")

    async def scenario(engine: Engine) -> None:
        big = np.ones(2_000_000, dtype=np.float32)
        for _ in range(4):
            out = await engine.infer_async("m", {"x": big})
            assert float(out["y"]) == 2_000_000.0
        assert states(engine) == [BreakerState.CLOSED]

    run(tmp_path, scenario)


def test_big_outputs_asked_for_by_input_values_are_not_slow_executions(tmp_path: Path) -> None:
    """A model whose output size follows an input's value (Expand to `n` copies): its samples
    (n = 0) made nothing, and 4 answers of 2 M floats opened the breaker."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "n"], ["y"])], "expand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["count"])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    write_version(tmp_path, "m", 1, model.SerializeToString())
    config(tmp_path, "m", BREAKER + "slow_min_us = 100\n")

    async def scenario(engine: Engine) -> None:
        feeds = {"x": np.ones(1, np.float32), "n": np.array([2_000_000], np.int64)}
        for _ in range(4):
            out = await engine.infer_async("m", feeds)
            assert out["y"].shape == (2_000_000,)
        assert states(engine) == [BreakerState.CLOSED]

    run(tmp_path, scenario)


def test_requests_move_to_a_healthy_version_while_one_is_open(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, broken_model())
    write_version(tmp_path, "m", 2, faulty_model())
    config(
        tmp_path, "m",
        "max_batch_size = 8\n[version_policy]\nall = {}\n"
        '[traffic]\nweights = { "1" = 100, "2" = 1 }\nsticky_key = "user"\n' + BREAKER,
    )  # fmt: skip

    async def scenario(engine: Engine) -> None:
        await opened(engine, "1")  # by name
        assert states(engine, "2") == [BreakerState.CLOSED]
        for _ in range(20):  # unversioned requests go to version 2 meanwhile
            ticket = await unversioned(engine)
            assert ticket.version == "2"
        with pytest.raises(ModelUnavailable):
            await call(engine, 0, version=1)  # a request for version 1 by name fails fast

    run(tmp_path, scenario)


def test_an_open_version_s_requests_are_spread_by_the_others_weights(tmp_path: Path) -> None:
    """Found by a tester: the first working version in version order took all of them (with
    a canary first, nearly all traffic went to the canary)."""
    write_version(tmp_path, "m", 1, faulty_model())
    write_version(tmp_path, "m", 2, faulty_model())
    write_version(tmp_path, "m", 3, broken_model())
    config(
        tmp_path, "m",
        "max_batch_size = 8\n[version_policy]\nall = {}\n"
        '[traffic]\nweights = { "1" = 1, "2" = 4, "3" = 95 }\n' + BREAKER,
    )  # fmt: skip

    async def scenario(engine: Engine) -> None:
        await opened(engine, "3")
        served = Counter([(await unversioned(engine)).version for _ in range(300)])
        assert set(served) == {"1", "2"}
        assert served["2"] > 2 * served["1"]  # (4:1; the first took all 300)

    run(tmp_path, scenario)


def test_a_broken_primary_hands_over_to_its_variant(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, broken_model())
    write_version(tmp_path, "m", 1, faulty_model(work=16), name="model.small.onnx")
    config(
        tmp_path, "m",
        'max_batch_size = 8\n[[variants]]\nname = "small"\nfile = "model.small.onnx"\n' + BREAKER,
    )  # fmt: skip

    async def scenario(engine: Engine) -> None:
        await opened(engine, "1")
        version = engine.registry.snapshot.models["m"].versions["1"]
        assert [b.state for b in version.primary.scheduler._breakers] == [BreakerState.OPEN]
        ticket = await unversioned(engine)
        assert ticket.variant == "small"

    run(tmp_path, scenario)


def test_breaker_settings_are_validated() -> None:
    from duetime.config import parse_model_config
    from duetime.errors import ConfigError

    with pytest.raises(ConfigError, match=r"breaker\.failures"):
        parse_model_config({"breaker": {"failures": 0}}, source="config.toml")
    with pytest.raises(ConfigError, match=r"breaker\.slow_factor"):
        parse_model_config({"breaker": {"slow_factor": 1.0}}, source="config.toml")


def test_failures_on_a_client_s_values_never_open_it_once_the_model_is_idle(
    tmp_path: Path,
) -> None:
    """Probe repro_breaker_dos: a healthy model (it answers its samples and every valid input)
    that answered nobody within open_s took 5 requests with an out-of-range index as its own
    failures (500), opened its breaker, and another client's valid request got 503; one bad
    request per half-open period kept it open. A failure counts against the model only where
    it also fails on its own sample inputs: these are the client's (400)."""
    write_version(tmp_path, "m", 1, faulty_model())
    config(tmp_path, "m", "max_batch_size = 8\n" + BREAKER)

    async def scenario(engine: Engine) -> None:
        await asyncio.sleep(0.35)  # (past open_s after its load: it answered nobody)
        for _ in range(10):
            with pytest.raises(InvalidInput, match="not counted"):
                await call(engine, 1)
            await asyncio.sleep(0.01)  # (a sample check runs on its thread)
        assert states(engine) == [BreakerState.CLOSED]
        np.testing.assert_array_equal(await call(engine, 0), inputs()["x"])

    run(tmp_path, scenario)


def test_an_idle_inline_model_is_checked_on_its_samples_not_opened_by_bad_values(
    tmp_path: Path,
) -> None:
    """The same for a model run inline (on the loop): its sample check runs there too."""
    write_version(tmp_path, "m", 1, faulty_model())
    config(tmp_path, "m", 'max_batch_size = 8\nexecution = "inline"\n' + BREAKER)

    async def scenario(engine: Engine) -> None:
        scheduler = engine.registry.snapshot.models["m"].versions["1"].primary.scheduler
        assert scheduler._inline
        await asyncio.sleep(0.35)
        for _ in range(10):
            with pytest.raises(InvalidInput, match="not counted"):
                await call(engine, 1)
            await asyncio.sleep(0)
        assert states(engine) == [BreakerState.CLOSED]
        np.testing.assert_array_equal(await call(engine, 0), inputs()["x"])

    run(tmp_path, scenario)


def test_an_inline_model_that_fails_on_its_own_samples_opens_it(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, broken_model())
    config(tmp_path, "m", 'max_batch_size = 8\nexecution = "inline"\n' + BREAKER)

    async def scenario(engine: Engine) -> None:
        for _ in range(3):
            with pytest.raises(InvalidInput):
                await call(engine, 0)
        for _ in range(100):
            if states(engine) == [BreakerState.OPEN]:
                break
            await asyncio.sleep(0.01)
        assert states(engine) == [BreakerState.OPEN]
        with pytest.raises(ModelUnavailable, match="circuit breaker open"):
            await call(engine, 0)

    run(tmp_path, scenario)
