"""bench/scheduling.py's verdicts, from rows as its runs write them."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from conftest import bench_module


@pytest.fixture(scope="module")
def scheduling() -> Any:
    return bench_module("scheduling")


def run(
    policy: str, load: str, goodput: float, p99: float | None, ok: int = 100, steal: float = 0.0
) -> dict[str, Any]:
    return {"policy": policy, "load": load, "goodput/s": goodput, "p99_ms": p99,
            "p50_ms": 1.0, "ok": ok, "late": 0, "steal_cores": steal}  # fmt: skip


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
    verdicts = scheduling.verdicts(rows([1.0, 3.0, 2.0], [4.0, 6.0]), 100.0)
    assert verdicts["tuning_p99_ms_on_vs_off"] == (2.0, 5.0)
    assert verdicts["edf_goodput_200_over_100"] == pytest.approx(0.95)


def test_a_run_with_no_p99_is_left_out_of_the_median(scheduling: Any) -> None:
    """A run that answered nothing has no P99 (None): the others' median stands."""
    verdicts = scheduling.verdicts(rows([None, 3.0], [None, None]), 100.0)
    assert verdicts["tuning_p99_ms_on_vs_off"] == (3.0, None)


def test_the_cost_model_recovers_what_an_answer_and_a_refusal_cost(scheduling: Any) -> None:
    """CPU per request offered is f * answer + (1 - f) * refusal; two runs answering different
    shares give both, and the ratio at twice capacity they allow: (1 - 2 r) / (1 - r), with
    r = refusal / answer."""

    def at(answered: int, refused: int) -> dict[str, Any]:
        share = answered / (answered + refused)
        return {"ok": answered, "late": 0, "rejected": refused, "expired": 0,
                "srv_cpu_us_per_req": 100.0 * share + 25.0 * (1 - share)}  # fmt: skip

    model = scheduling.cost_model(at(9_000, 100), at(5_000, 13_000))
    assert model["answer_us"] == pytest.approx(100.0)
    assert model["refusal_us"] == pytest.approx(25.0)
    assert model["ratio_at_2x_bound"] == pytest.approx((1 - 0.5) / (1 - 0.25))
    assert scheduling.cost_model(at(9_000, 100), at(9_000, 110)) is None  # (too alike)
    unknown = {**at(5_000, 13_000), "srv_cpu_us_per_req": None}
    assert scheduling.cost_model(at(9_000, 100), unknown) is None


def test_verdicts_give_the_median_cost_model_of_the_pairs(scheduling: Any) -> None:
    def cpu(row: dict[str, Any], answered: int, refused: int, answer: float) -> dict[str, Any]:
        share = answered / (answered + refused)
        return {**row, "ok": answered, "rejected": refused, "expired": 0,
                "srv_cpu_us_per_req": answer * share + 30.0 * (1 - share)}  # fmt: skip

    base = rows([1.0], [1.0])
    runs = [
        cpu(r, 9_000, 100, 100.0) if (r["policy"], r["load"]) == ("edf", "100%")
        else cpu(r, 4_000, 14_000, 100.0) if (r["policy"], r["load"]) == ("edf", "200%")
        else r
        for r in base
    ]  # fmt: skip
    runs += [
        cpu(run("edf", "100% (pair 2)", 100, 3.0), 9_000, 100, 120.0),
        cpu(run("edf", "200% (pair 2)", 50, 4.0), 4_000, 14_000, 120.0),
        cpu(run("edf", "100% (pair 3)", 100, 3.0), 9_000, 100, 110.0),
        cpu(run("edf", "200% (pair 3)", 50, 4.0), 4_000, 14_000, 110.0),
    ]
    model = scheduling.verdicts(runs, 100.0)["edf_cost_model"]
    assert model["answer_us"] == pytest.approx(110.0)
    assert model["refusal_us"] == pytest.approx(30.0)
    assert scheduling.verdicts(rows([1.0], [1.0]), 100.0)["edf_cost_model"] is None


def test_a_run_answering_past_the_capacity_says_it_was_underestimated(scheduling: Any) -> None:
    """On a slow VM the search's goodput peaked at 2,613/s and the runs named 200% answered
    3,189-3,811: the ratio read 1.52, as if met. Past 110% of the capacity, the verdict says
    the capacity was underestimated."""
    assert scheduling.verdicts(rows([1.0], [1.0]), 100.0)["capacity_underestimated"] is False
    assert scheduling.verdicts(rows([1.0], [1.0]), 90.0)["capacity_underestimated"] is True


def test_the_most_cpu_the_hypervisor_took_during_a_run_is_in_the_verdicts(scheduling: Any) -> None:
    """resnet's runs with 0.7-1.0 cores stolen sent 20-70% of requests late: such a run is the
    machine's, and the verdicts say how much was taken, for a warning to say so."""
    calm = rows([1.0], [1.0])
    assert scheduling.verdicts(calm, 100.0)["max_steal_cores"] == 0.0
    stolen = [*calm, run("edf", "100% (pair 2)", 100, 3.0, steal=0.8)]
    stolen.append(run("edf", "200% (pair 2)", 90, 4.0, steal=0.1))
    verdicts = scheduling.verdicts(stolen, 100.0)
    assert verdicts["max_steal_cores"] == 0.8 > scheduling.STOLEN


def test_the_echo_floor_verdict_is_its_runs_share_on_time(scheduling: Any) -> None:
    """The echo floor row (over HTTP) gives the on-time share a server doing no work gets from
    the machine and generator; without one (gRPC) the verdict is None."""
    assert scheduling.verdicts(rows([1.0], [1.0]), 100.0)["echo_floor_on_time_at_200_%"] is None
    floor = {**run("echo floor", "200%", 500, 3.0, ok=998), "on_time_%": 99.8}
    verdicts = scheduling.verdicts([*rows([1.0], [1.0]), floor], 100.0)
    assert verdicts["echo_floor_on_time_at_200_%"] == 99.8
    assert verdicts["edf_on_time_at_200_%"] == 100.0  # (the floor is no EDF run)
    # (nor a measure of capacity: it answers everything at once, 5,026/s against 2,555)
    assert verdicts["capacity_underestimated"] is False


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--models", "nosuch"], "argument --models: expected demo models among resnet, mlp"),
        (["--duration", "0"], "argument --duration: expected a finite number > 0"),
        (["--pairs", "0"], "argument --pairs: expected a whole number >= 1"),
        (["--connections", "0"], "argument --connections: expected a whole number >= 1"),
        (["--wait-quiet", "-1"], "argument --wait-quiet: expected a finite number >= 0"),
    ],
)
def test_bad_flags_are_refused_in_one_line_before_anything_runs(
    scheduling: Any,
    flags: list[str],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """They ended in tracebacks (--models nosuch, --duration 0), or ran on unchecked (--pairs 0:
    servers started, still running 20 s later; found by a tester)."""
    monkeypatch.setattr(sys, "argv", ["scheduling.py", *flags])
    with pytest.raises(SystemExit) as ended:
        scheduling.main()
    assert ended.value.code == 2
    assert said in capsys.readouterr().err
