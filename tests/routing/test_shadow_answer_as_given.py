"""A shadow copy is compared with the answer as the model gave it, not as its in-process caller
left it: the caller's answer is its own, to change in place.

Found by a tester (repro_shadow): two byte-identical versions, the caller scaling each answer
in place (`y *= 0`) before the shadow's copy ran: max_abs_diff 0.25 and argmax disagreements.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from repo_models import age, inputs, scale_model, write_version
from repo_models import run_on_engine as run

from duetime.engine import Engine
from duetime.execution.executor import BatchJob, BatchResult

pytestmark = pytest.mark.timeout(60)


def test_a_caller_changing_its_answer_in_place_moves_no_shadow_statistic(tmp_path: Path) -> None:
    for version in (1, 2):
        write_version(tmp_path, "m", version, scale_model(2.0))
    path = tmp_path / "m" / "config.toml"
    path.write_text(
        'version_policy = { all = {} }\nmax_batch_size = 1\nexecution = "thread"\n'
        '[traffic]\nweights = { "1" = 1 }\nshadow = { "2" = 1.0 }\n'
    )
    age(path)

    async def scenario(engine: Engine) -> None:
        v2 = engine.registry.snapshot.models["m"].versions["2"].primary
        held: list[tuple[int, BatchJob]] = []
        v2.model.executor.submit = lambda i, job: held.append((i, job))  # type: ignore[method-assign]
        out = await engine.infer_async("m", inputs())
        out["y"][0, :] = [0.0, 0.0, 0.0, 9.0]  # (the caller's post-processing, in place)
        assert len(held) == 1
        instance, job = held.pop()
        job.on_done(BatchResult(job, instance, outputs=[{"y": 2 * inputs()["x"]}]))
        stats = engine.router.shadows[("m", "2")]
        for _ in range(500):  # (the comparison runs a loop turn or two after the copy)
            if stats.compared:
                break
            await asyncio.sleep(0.01)
        assert (stats.max_abs_diff, stats.argmax_disagreements) == (0.0, 0)

    run(tmp_path, scenario)
