"""A model whose load-time samples fail (a scikit-learn OneHotEncoder with handle_unknown='error'
refuses made-up strings) gets a guessed profile of 1 ms a row: marked as a guess, let through as
a probe whatever it predicts, and replaced by the first real run, so that clients with budgets
under the guess are not refused for good."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from duetime.clock import FakeClock
from duetime.config import SchedulingConfig
from duetime.errors import Overloaded
from duetime.execution.executor import Feeds
from duetime.repository.layout import MODEL_FILENAME, scan_model
from duetime.repository.loader import LoadedModel, load_version
from duetime.scheduling.profile import profile_from_samples
from duetime.scheduling.scheduler import PROBE_NS, ModelScheduler
from tests.scheduling.factories import FakeExecutor

pytestmark = pytest.mark.timeout(120)

US = 1000
MS = 1_000_000


def one_hot_model() -> bytes:
    """country (N, 1) strings -> one-hot (N, 1, 2) over 'US' and 'FR'; any other string is an
    error (zeros=0), as skl2onnx exports OneHotEncoder(handle_unknown='error')."""
    graph = helper.make_graph(
        [helper.make_node("OneHotEncoder", ["country"], ["y"], domain="ai.onnx.ml",
                          cats_strings=["US", "FR"], zeros=0)], "onehot",
        [helper.make_tensor_value_info("country", TensorProto.STRING, ["N", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 2])],
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)]
    )
    model.ir_version = 8
    return bytes(model.SerializeToString())


def test_a_profile_the_samples_could_not_measure_is_a_guess_the_first_run_replaces(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    (tmp_path / "strict" / "1").mkdir(parents=True)
    (tmp_path / "strict" / "1" / MODEL_FILENAME).write_bytes(one_hot_model())
    model = load_version(scan_model(tmp_path / "strict"), 1, profile_budget_s=0.02)
    loaded.append(model)
    profile = model.profile
    assert profile.guessed
    assert profile.predict(1) == 1 * MS
    country = np.array([["FR"], ["US"]], dtype=object)
    (y,) = model.executor.run_sync(model.validator.prepare({"country": country}, None).feeds)
    assert y.tolist() == [[[0.0, 1.0]], [[1.0, 0.0]]]
    profile.observe(1, 30 * US)  # a real run: 30 µs, not 1 ms
    assert not profile.guessed
    assert profile.predict(1) == 30 * US
    assert profile.predict(profile.max_rows) == 30 * US * profile.max_rows


def test_a_guessed_profile_lets_a_probe_through_and_learns_from_it() -> None:
    async def body() -> None:
        clock = FakeClock(1_000 * MS)
        executor = FakeExecutor(1)
        profile = profile_from_samples({1: [1 * MS], 2: [2 * MS]})
        profile.guessed = True
        scheduler = ModelScheduler(
            executor=executor,  # type: ignore[arg-type]
            config=SchedulingConfig(delivery_margin_us=0, exec_margin=0.0),
            max_batch_size=2,
            profile=profile,
            default_timeout_ns=None,
            clock=clock,
            label="'strict' version 1",
        )

        def submit() -> asyncio.Future[Feeds]:
            feeds = {"country": np.array([["FR"]], dtype=object)}
            due = clock.now_ns() + 100 * US  # a budget of a tenth of the guess
            return scheduler.submit_nowait(feeds, rows=1, shape_key=(), due_ns=due, priority=0)

        with pytest.raises(Overloaded):  # (no probe yet: the model ran this recently)
            submit()
        clock.advance(PROBE_NS)
        probe = submit()  # over 2x what it has by the guess, but the guess is no measure
        assert scheduler.statistics().probes == 1
        clock.advance(30 * US)
        executor.complete(0, compute_ns=30 * US)
        await asyncio.sleep(0)
        assert probe.done()
        assert not profile.guessed
        answered = submit()  # the real 30 µs now admits it at once, no probe
        assert len(executor.jobs) == 2
        assert scheduler.statistics().probes == 1
        clock.advance(30 * US)
        executor.complete(1, compute_ns=30 * US)
        await asyncio.sleep(0)
        assert answered.done()

    asyncio.run(body())
