"""A failed execution's time inside ONNX Runtime is recorded (duetime_compute_duration_seconds),
as a successful one's: it counted with 0 s (found by a tester)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from repo_models import age, faulty_model, inputs, write_version

from duetime.engine import Engine
from duetime.errors import InvalidInput
from duetime.repository.manager import RepositoryOptions


@pytest.mark.parametrize("execution", ["thread", "inline"])
@pytest.mark.parametrize("rows", [1, 3])
def test_failed_executions_count_their_compute_time(
    tmp_path: Path, execution: str, rows: int
) -> None:
    write_version(tmp_path, "m", 1, faulty_model())
    config = tmp_path / "m" / "config.toml"
    config.write_text(f'max_batch_size = 8\nexecution = "{execution}"\n')
    age(config)

    async def main() -> None:
        engine = await Engine.start(tmp_path, options=RepositoryOptions())
        try:
            feeds = {
                "x": np.repeat(inputs()["x"], rows, axis=0),
                "k": np.ones((rows, 1), np.int64),  # (k = 1: ONNX Runtime fails)
            }
            for _ in range(3):
                with pytest.raises(InvalidInput):
                    await engine.infer_async("m", feeds)
            scheduler = engine.registry.snapshot.models["m"].versions["1"].primary.scheduler
            compute = scheduler.statistics().compute_time
            assert compute.total >= 3
            assert compute.sum_ns > 0
        finally:
            await engine.aclose()

    asyncio.run(main())
