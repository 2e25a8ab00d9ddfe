"""A shadow version runs its instances in the background (at the lowest CPU priority) only when
the traffic policy as served sends it no request: never the version that answers them.

Found by a tester (repro_background_default): versions 1 and 2 on disk under the default
version_policy (latest 1: only 2 served), `weights = {"1" = 1}`, `shadow = {"2" = 0.05}`;
version 2 answered every request, yet its thread ran at nice 19 (p90 86.8 ms against 37.4 ms
under contention): the set of answering versions was read from the config's weights, version 1
included, not from what the plan serves. The same when the weighted version failed to load.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from repo_models import age, factor_of, scale_model, write_version
from repo_models import run_on_engine as run

from duetime.engine import Engine

pytestmark = pytest.mark.timeout(60)


def niceness(engine: Engine, version: str) -> int:
    """The niceness of `version`'s instance thread (Linux: per thread)."""
    served = engine.registry.snapshot.models["m"].versions[version]
    [thread] = served.primary.model.executor._threads
    stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


def repository(root: Path, policy: str, *, broken_v1: bool = False) -> Path:
    write_version(root, "m", 1, b"not an onnx model" if broken_v1 else scale_model(1.0))
    write_version(root, "m", 2, scale_model(2.0))
    path = root / "m" / "config.toml"
    path.write_text(
        f'{policy}execution = "thread"\n[traffic]\nweights = {{ "1" = 1 }}\n'
        'shadow = { "2" = 1.0 }\n'
    )
    age(path)
    return root


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux's /proc")
@pytest.mark.parametrize(
    ("policy", "broken_v1", "answers", "nice"),
    [
        ("", False, 2.0, 0),  # (latest 1: only 2 served; 19 before)
        ("version_policy = { all = {} }\n", True, 2.0, 0),  # (1 fails to load; 19 before)
        ("version_policy = { all = {} }\n", False, 1.0, 19),  # (2 only ever gets copies)
    ],
    ids=["weighted-not-served", "weighted-failed", "shadow-only"],
)
def test_the_answering_version_never_runs_in_the_background(
    tmp_path: Path, policy: str, broken_v1: bool, answers: float, nice: int
) -> None:
    if os.getpriority(os.PRIO_PROCESS, 0) != 0:
        pytest.skip("the test process itself runs niced")

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == answers
        assert niceness(engine, "2") == nice

    run(repository(tmp_path, policy, broken_v1=broken_v1), scenario)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux's /proc")
def test_a_background_shadow_left_answering_loads_again_in_the_foreground(tmp_path: Path) -> None:
    """Version 1's folder removed: version 2, niced as 1's shadow and its files unchanged, now
    answers every request; it is loaded again, not kept at nice 19."""
    if os.getpriority(os.PRIO_PROCESS, 0) != 0:
        pytest.skip("the test process itself runs niced")
    repo = repository(tmp_path, "version_policy = { all = {} }\n")

    async def scenario(engine: Engine) -> None:
        assert niceness(engine, "2") == 19
        shutil.rmtree(repo / "m" / "1")
        await engine.manager.load("m")
        assert await factor_of(engine) == 2.0
        assert niceness(engine, "2") == 0

    run(repo, scenario)
