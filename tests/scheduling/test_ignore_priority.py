"""`scheduling.ignore_priority`: one level for every request, as a Triton config.pbtxt without
`priority_levels` means (its requests' priorities are all the default level)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from factories import SHAPE, FakeExecutor, make_profile

from duetime.clock import FakeClock
from duetime.config import ModelConfig
from duetime.errors import ConfigError
from duetime.repository.tritonconfig import translate, validated
from duetime.scheduling.scheduler import ModelScheduler


async def _order(config: ModelConfig) -> list[str]:
    """The order a model of `config` starts a running request and then five that arrive with
    priorities 2, 1, 2, 1, 0, one at a time (on a running loop: the scheduler binds to it)."""
    executor = FakeExecutor(1)
    scheduler = ModelScheduler(
        executor=executor,  # type: ignore[arg-type]
        config=config.scheduling,
        max_batch_size=0,
        profile=make_profile(),
        default_timeout_ns=None,
        clock=FakeClock(1_000_000_000),
        label="'m' version 1",
    )
    arrivals = [("running", 0), ("a-p2", 2), ("b-p1", 1), ("c-p2", 2), ("d-p1", 1), ("e-p0", 0)]
    for name, priority in arrivals:
        feeds = {"name": np.array([name])}
        scheduler.submit_nowait(feeds, rows=1, shape_key=SHAPE, due_ns=None, priority=priority)
    for index in range(len(arrivals)):
        executor.complete(index)
    return [str(job.feeds[0]["name"][0]) for _, job in executor.jobs]


def _pbtxt(batching: str) -> ModelConfig:
    return validated(translate(batching, source="c", model_name="m"), source="c")


# (no dynamic_batching at all; a config.pbtxt that sets nothing is served as no config, any
# level: see tests/repository/test_triton_config_compat.py)
@pytest.mark.parametrize("batching", ["instance_group [{ count: 1 }]", "dynamic_batching { }"])
def test_a_pbtxt_without_priority_levels_serves_in_arrival_order(batching: str) -> None:
    """As Triton: every priority above priority_levels (0) is the default level. Requests that
    asked for priority 1 ran ahead of those before them (the pbtxt tester's prio_order.py)."""
    config = _pbtxt(batching)
    assert config.scheduling.ignore_priority
    order = asyncio.run(_order(config))
    assert order == ["running", "a-p2", "b-p1", "c-p2", "d-p1", "e-p0"]


def test_a_pbtxt_with_priority_levels_serves_by_level() -> None:
    config = _pbtxt("dynamic_batching { priority_levels: 2 default_priority_level: 2 }")
    order = asyncio.run(_order(config))
    assert order == ["running", "b-p1", "d-p1", "a-p2", "c-p2", "e-p0"]


def test_a_duetime_config_keeps_any_level_unless_it_ignores_priority() -> None:
    assert not ModelConfig().scheduling.ignore_priority
    assert asyncio.run(_order(ModelConfig()))[1:3] == ["b-p1", "d-p1"]
    with pytest.raises(ValueError, match="ignore_priority puts every request at one level"):
        ModelConfig.model_validate({"scheduling": {"ignore_priority": True, "priority_levels": 3}})
    both = {"ignore_priority": True, "default_priority_level": 2}
    with pytest.raises(ConfigError, match="leave priority_levels and default_priority_level out"):
        validated({"scheduling": both}, source="c")
