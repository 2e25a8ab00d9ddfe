"""A model's queue bounds, read back from the config endpoint's JSON (load_model(config=...)),
are the ones it served: Triton's `default_queue_policy.max_queue_size` is each priority level's
bound, and the bound it cannot say travels in `parameters['duetime']`.

A config.toml model with 2 levels and `max_queue_size = 2` (2 in all) was written
`max_queue_size: 2` and loaded back with 2 per level (4 in all); a config.pbtxt with 3 levels and
no `max_queue_size` (1024 in all) came back with 1024 per level (found by a tester)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, explicit_serving
from repo_models import scale_model, write_version

from duetime.config import SchedulingConfig
from duetime.errors import ConfigError
from duetime.frontend.metadata import model_config_json
from duetime.repository.layout import scan_model
from duetime.repository.loader import LoadedModel, load_version
from duetime.repository.tritonconfig import DUETIME, read_json_config

PBTXT_LEVELS = "dynamic_batching {{ priority_levels: {levels} default_priority_level: 1 {policy}}}"
CASES = {
    "toml levels, a bound in all": (
        "config.toml", "[scheduling]\npriority_levels = 2\ndefault_priority_level = 2\n"
        "max_queue_size = 2\n",
    ),
    "toml levels, both bounds": (
        "config.toml", "[scheduling]\npriority_levels = 2\nmax_queue_size = 10\n"
        "max_queue_size_per_level = 2\n",
    ),
    "toml levels, a level's bound over the whole's": (
        "config.toml", "[scheduling]\npriority_levels = 3\nmax_queue_size = 2\n"
        "max_queue_size_per_level = 5\n",
    ),
    "toml any level, a level's bound": (
        "config.toml", "[scheduling]\nmax_queue_size = 10\nmax_queue_size_per_level = 3\n",
    ),
    "toml one level": (
        "config.toml", "[scheduling]\nignore_priority = true\nmax_queue_size = 7\n",
    ),
    "pbtxt levels, no max_queue_size": (
        "config.pbtxt", PBTXT_LEVELS.format(levels=3, policy=""),
    ),
    "pbtxt levels, max_queue_size": (
        "config.pbtxt",
        PBTXT_LEVELS.format(levels=2, policy="default_queue_policy { max_queue_size: 3 } "),
    ),
    "pbtxt levels, a bound over the cap in all": (
        "config.pbtxt",
        PBTXT_LEVELS.format(levels=3, policy="default_queue_policy { max_queue_size: 500000 } "),
    ),
    "pbtxt one level": (
        "config.pbtxt", "dynamic_batching { default_queue_policy { max_queue_size: 5 } }",
    ),
}  # fmt: skip


def bounds(scheduling: SchedulingConfig) -> tuple[int, int, int, bool]:
    """What a model's queue takes: its levels, in all, and at most at one level."""
    total = scheduling.max_queue_size
    one_level = min(scheduling.max_queue_size_per_level or total, total)
    return scheduling.priority_levels, total, one_level, scheduling.ignore_priority


def load(root: Path, filename: str, text: str, loaded: list[LoadedModel]) -> LoadedModel:
    write_version(root, "m", 1, scale_model(2.0))
    (root / "m" / filename).write_text(text, encoding="utf-8")
    model = load_version(scan_model(root / "m"), 1)
    loaded.append(model)
    return model


@pytest.mark.parametrize("case", CASES)
def test_the_config_endpoints_queue_bounds_read_back_as_served(
    tmp_path: Path, loaded: list[LoadedModel], case: str
) -> None:
    filename, text = CASES[case]
    model = load(tmp_path, filename, text, loaded)
    shown = model_config_json(model)
    again = read_json_config(json.loads(json.dumps(shown)), source="load", model_name="m")
    assert bounds(again.scheduling) == bounds(model.config.scheduling)
    # (and it says the same again: a second round trip changes nothing)
    back = load_version(scan_model(tmp_path / "m"), 1, config=again)
    loaded.append(back)
    assert model_config_json(back) == shown


def test_a_total_bound_is_carried_beside_the_per_level_field(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    """As Triton reads it: each level's bound in the field (2), the whole queue's in duetime's
    own parameter (2, where the field read alone says 2 levels times 2)."""
    model = load(tmp_path, *CASES["toml levels, a bound in all"], loaded)
    shown = model_config_json(model)
    assert shown["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 2
    carried = json.loads(shown["parameters"][DUETIME]["string_value"])
    assert carried == {"scheduling": {"max_queue_size": 2}}


def test_a_pbtxts_own_bounds_need_no_carrying(tmp_path: Path, loaded: list[LoadedModel]) -> None:
    model = load(tmp_path, *CASES["pbtxt levels, max_queue_size"], loaded)
    shown = model_config_json(model)
    assert shown["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 3
    assert DUETIME not in shown["parameters"]


def triton_json(levels: int, max_queue_size: int, carried: dict[str, Any]) -> dict[str, Any]:
    batching: dict[str, Any] = {"default_queue_policy": {"max_queue_size": max_queue_size}}
    if levels:
        batching |= {"priority_levels": levels, "default_priority_level": 1}
    return {
        "dynamic_batching": batching,
        "parameters": {DUETIME: {"string_value": json.dumps({"scheduling": carried})}},
    }


@pytest.mark.parametrize(
    ("levels", "carried", "message"),
    [
        (2, {"max_queue_size_per_level": 3}, r"scheduling.max_queue_size_per_level: not carried "
         r"here; dynamic_batching.default_queue_policy.max_queue_size sets it \(with priority"),
        (0, {"max_queue_size": 3}, r"scheduling.max_queue_size: not carried here; "
         r"dynamic_batching.default_queue_policy.max_queue_size sets it \(without priority"),
        (2, {"max_queue_size": 0}, r"scheduling.max_queue_size: expected an integer in "
         r"\[1, 1000000\], got 0"),
        (2, {"max_queue_size": True}, r"scheduling.max_queue_size: expected an integer in "
         r".* got true"),
        (0, {"max_queue_size_per_level": "3"}, r"scheduling.max_queue_size_per_level: expected "
         r"an integer in \[0, 1000000\], got \"3\""),
    ],
)  # fmt: skip
def test_a_carried_queue_bound_the_field_sets_or_out_of_range_is_refused(
    levels: int, carried: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=r"parameters\['duetime'\]: " + message):
        read_json_config(
            triton_json(levels, 4, carried), source="load", model_name="m", warn=lambda _: None
        )


def test_a_carried_total_below_an_edited_level_bound_is_warned_of() -> None:
    warnings: list[str] = []
    config = read_json_config(
        triton_json(2, 10, {"max_queue_size": 2}),
        source="load", model_name="m", warn=warnings.append,
    )  # fmt: skip
    assert bounds(config.scheduling) == (2, 2, 2, False)
    assert [w for w in warnings if "no level queues more than 2" in w] == [
        "load: parameters['duetime']: scheduling.max_queue_size 2 (the bound over every priority "
        "level together) is below dynamic_batching.default_queue_policy.max_queue_size 10 (each "
        "level's): no level queues more than 2"
    ]


# -- through the repository API, as the tester's client did ------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("repo")
    write_version(repo, "lv", 1, scale_model(2.0))
    (repo / "lv" / "config.toml").write_text(CASES["toml levels, a bound in all"][1])
    with explicit_serving(repo, "lv") as running:
        yield running


@pytest.mark.timeout(60)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_loaded_back_from_its_config_queues_as_before(
    server: RunningServer, protocol: str
) -> None:
    def served() -> tuple[int, int, int, bool]:
        return bounds(server.server.engine.registry.resolve("lv", "1").model.config.scheduling)

    client: Any = (
        grpcclient.InferenceServerClient(server.grpc)
        if protocol == "grpc"
        else httpclient.InferenceServerClient(server.http)
    )
    try:
        before = served()
        if protocol == "grpc":  # (protobuf's JSON form: int64 as strings)
            config = dict(client.get_model_config("lv", as_json=True)["config"])
        else:
            config = dict(client.get_model_config("lv"))
        client.load_model("lv", config=json.dumps(config))
        assert served() == before == (2, 2, 2, False)
    finally:
        client.load_model("lv")
        client.close()
