"""A shadow copy that misses its due time is the shadow's business: counted in its comparison
statistics only, never as an expired or late request of the version it runs on, nor as a missed
due time for the load shedder (`ModelScheduler.outcomes`).

Found by a tester (repro_shadow_expired): v1 answered every request, v2 (0.4 s a run) got a
copy of each; v2's statistics showed 98 copies expired (stopped runs) and up to 129 late, the
shadow's statistics counted the same copies dropped, and the shedder, reading the expiries as
missed due times, refused 9 of 1,305 real requests to v1 with 429 "the server is saturated".
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from repo_models import age, inputs, scale_model, write_version
from repo_models import run_on_engine as run

from duetime.engine import Engine
from duetime.execution.executor import BatchJob, BatchResult
from duetime.routing.router import ShadowStatistics

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 0.2


def repository(root: Path) -> Path:
    """Model `m`: v1 (2x) answers the requests that name no version; v2 (3x) gets a copy of
    each, run on a thread (whose runs the test holds)."""
    write_version(root, "m", 1, scale_model(2.0))
    write_version(root, "m", 2, scale_model(3.0))
    path = root / "m" / "config.toml"
    path.write_text(
        'version_policy = { all = {} }\nmax_batch_size = 1\nexecution = "thread"\n'
        '[traffic]\nweights = { "1" = 1 }\nshadow = { "2" = 1.0 }\n'
    )
    age(path)
    return root


def test_copies_late_stopped_or_dropped_count_only_in_the_shadow_statistics(
    tmp_path: Path,
) -> None:
    """Copy A runs past its due time and is answered late; copy B, queued behind it, becomes
    hopeless and is dropped; copy C's run is stopped (as `_watch` stops a run past its due
    time). v2 counts A as its request answered, and nothing else."""

    async def scenario(engine: Engine) -> None:
        v2 = engine.registry.snapshot.models["m"].versions["2"].primary
        held: list[tuple[int, BatchJob]] = []
        v2.model.executor.submit = lambda i, job: held.append((i, job))  # type: ignore[method-assign]
        for _ in range(2):  # (A runs, held; B waits for the instance)
            out = await engine.infer_async("m", inputs(), timeout=TIMEOUT_S)
            assert float(out["y"][0, 0]) == 2.0
        assert len(held) == 1
        await asyncio.sleep(TIMEOUT_S * 2)  # (A is past its due time, B dropped as hopeless)
        instance, job = held.pop()
        job.on_done(BatchResult(job, instance, outputs=[{"y": 3 * inputs()["x"]}]))
        await engine.infer_async("m", inputs(), timeout=TIMEOUT_S)  # (C runs, held)
        instance, job = held.pop()
        job.on_done(BatchResult(job, instance, terminated=True))
        await asyncio.sleep(0.01)
        shadow: ShadowStatistics = engine.router.shadows[("m", "2")]
        assert (shadow.mirrored, shadow.compared, shadow.skipped) == (3, 1, 2)
        assert shadow.dropped == 2  # (B and C)
        stats = v2.scheduler.statistics()
        counted = (stats.succeeded, stats.on_time, stats.late, stats.expired, stats.rejected)
        assert counted == (1, 1, 0, 0, 0)  # (late 1 and expired 1 before)
        assert v2.scheduler.outcomes() == (0, 1)  # (1 missed due time before)

    run(repository(tmp_path), scenario)
