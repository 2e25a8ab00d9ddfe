"""bench/scheduling.py's verdicts, from rows as its runs write them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def scheduling() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        import scheduling as module  # (bench/scheduling.py: not a package)
    finally:
        sys.path.remove(str(BENCH))
    return module


def run(policy: str, load: str, goodput: float, p99: float | None, ok: int = 100) -> dict[str, Any]:
    return {"policy": policy, "load": load, "goodput/s": goodput, "p99_ms": p99,
            "p50_ms": 1.0, "ok": ok, "late": 0}  # fmt: skip


def rows(tuning_on: list[float | None], tuning_off: list[float | None]) -> list[dict[str, Any]]:
    return [
        run("edf", "50%", 50, 2.0), run("unbatched", "50%", 50, 2.0),
        run("edf", "100%", 100, 3.0), run("edf", "200%", 95, 4.0),
        run("fifo", "100%", 100, 3.0), run("fifo", "200%", 10, 9.0),
        *(run("edf, tuning on", f"100% (round {i})", 100, p99) for i, p99 in enumerate(tuning_on)),
        *(run("edf, tuning off", f"100% (round {i})", 100, p99)
          for i, p99 in enumerate(tuning_off)),
    ]  # fmt: skip


def test_tuning_p99_is_the_median_of_the_runs(scheduling: Any) -> None:
    verdicts = scheduling.verdicts(rows([1.0, 3.0, 2.0], [4.0, 6.0]))
    assert verdicts["tuning_p99_ms_on_vs_off"] == (2.0, 5.0)
    assert verdicts["edf_goodput_200_over_100"] == pytest.approx(0.95)


def test_a_run_with_no_p99_is_left_out_of_the_median(scheduling: Any) -> None:
    """A run that answered nothing has no P99 (None): the others' median stands."""
    verdicts = scheduling.verdicts(rows([None, 3.0], [None, None]))
    assert verdicts["tuning_p99_ms_on_vs_off"] == (3.0, None)
