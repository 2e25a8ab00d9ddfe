"""LoadShedder: which requests it refuses, by what their models cost the loop (fake clocks).

A tester found one refused share applied to every model: orderbook (small, cheap requests at
300/s) lost 44-88% of its requests to 429s beside a resnet flood, and a flood without due times
had orderbook's own misses shed orderbook.
"""

from __future__ import annotations

import pytest
from memory_fakes import ShedderClocks

from duetime.overload import FIXED_COST_BYTES, MAX_CLASSES, LoadShedder, spread

HEAVY_BYTES = 602_112
"""A resnet request's body (1x3x224x224 FP32)."""
LIGHT_BYTES = 200


def make() -> tuple[LoadShedder, ShedderClocks]:
    clocks = ShedderClocks()
    shedder = LoadShedder(
        cpu_clock=lambda: clocks.cpu, wall_clock=lambda: clocks.wall, wait_clock=lambda: 0.0
    )
    return shedder, clocks


def flood(shedder: LoadShedder, rounds: int, top_light: bool = False) -> dict[str, int]:
    """`rounds` of 5 heavy requests (model "resnet") and 1 light one ("orderbook"); how many
    of each were refused."""
    refused = {"resnet": 0, "orderbook": 0}
    for _ in range(rounds):
        for _ in range(5):
            refused["resnet"] += shedder.refuse("resnet", HEAVY_BYTES)
        refused["orderbook"] += shedder.refuse("orderbook", LIGHT_BYTES, top=top_light)
    return refused


def overloaded(shedder: LoadShedder, clocks: ShedderClocks, samples: int) -> None:
    """`samples` periods of a saturated loop whose requests miss their due times, a flood
    coming meanwhile (weighed as it comes)."""
    for _ in range(samples):
        flood(shedder, 2)
        clocks.run(busy=1.0)
        shedder.sample(clocks.failing)


def test_a_busy_loop_weighs_requests_before_it_sheds() -> None:
    shedder, clocks = make()
    clocks.run(busy=0.3)
    shedder.sample(clocks.failing)
    assert not shedder.watching, "an idle loop spends nothing on weighing requests"
    clocks.run(busy=0.7)
    shedder.sample(clocks.failing)
    assert shedder.watching
    assert shedder.share == 0.0


def test_the_light_model_is_not_refused_while_the_heavy_flood_is() -> None:
    shedder, clocks = make()
    overloaded(shedder, clocks, 10)
    assert shedder.share == pytest.approx(0.5)
    before = dict(shedder.refused_by_model)
    costs = shedder.costs()
    assert costs[("resnet", False)] > 100 * costs[("orderbook", False)]
    refused = flood(shedder, 100)
    assert refused["orderbook"] == 0
    # (the refused cost is half the load: a little over half the flood's requests)
    assert 250 <= refused["resnet"] <= 270
    assert "orderbook" not in shedder.refused_by_model
    assert shedder.refused_by_model["resnet"] - before["resnet"] == refused["resnet"]


def test_at_the_cap_the_light_model_still_is_not_refused() -> None:
    """The flood refused all it may be (95%): the shortfall is not taken from the light model,
    whose requests would free almost nothing of the loop."""
    shedder, clocks = make()
    overloaded(shedder, clocks, 40)
    assert shedder.share == pytest.approx(0.95)
    refused = flood(shedder, 100)
    assert refused["orderbook"] == 0
    assert 470 <= refused["resnet"] <= 475


def test_a_request_of_no_known_model_is_refused_at_the_share() -> None:
    """gRPC refuses calls before decoding them (`check()`, no model): one class of its own."""
    shedder, clocks = make()
    for _ in range(4):
        clocks.run(busy=1.0)
        shedder.sample(clocks.failing)
    assert shedder.share == pytest.approx(0.2)
    assert sum(shedder.refuse() for _ in range(100)) == 20
    clocks.run(busy=1.0)
    shedder.sample(clocks.failing)  # (spread: the one class it has weighed)
    assert sum(shedder.refuse() for _ in range(100)) == 25
    assert shedder.refused_by_model == {"": 45}


def test_equal_models_are_cut_to_one_level() -> None:
    shares = spread({("a", False): 60.0, ("b", False): 40.0, ("c", False): 5.0}, 0.3, 0.95)
    # refused 31.5 of 105: the level is 34.25, above c's cost
    assert shares[("a", False)] == pytest.approx(1 - 34.25 / 60, abs=1e-6)
    assert shares[("b", False)] == pytest.approx(1 - 34.25 / 40, abs=1e-6)
    assert shares[("c", False)] == 0.0


def test_priority_one_requests_are_refused_last() -> None:
    costs = {("resnet", True): 60.0, ("mlp", False): 40.0}
    shares = spread(costs, 0.3, 0.95)
    assert shares[("resnet", True)] == 0.0, "the costlier model, but at priority 1"
    assert shares[("mlp", False)] == pytest.approx(0.75)
    shares = spread(costs, 0.5, 0.95)
    assert shares[("mlp", False)] == pytest.approx(0.95)
    assert shares[("resnet", True)] == pytest.approx(0.1 / 0.6, abs=1e-6)


def test_a_heavy_flood_at_priority_one_is_refused_only_past_the_others() -> None:
    shedder, clocks = make()
    for _ in range(10):
        for _ in range(10):
            shedder.refuse("resnet", HEAVY_BYTES, top=True)
        for _ in range(40):
            shedder.refuse("mlp", LIGHT_BYTES)
        clocks.run(busy=1.0)
        shedder.sample(clocks.failing)
    assert shedder.share == pytest.approx(0.5)
    # mlp is ~10% of the cost: refused to the cap, then a share of the priority-1 flood
    refused_mlp = sum(shedder.refuse("mlp", LIGHT_BYTES) for _ in range(100))
    refused_resnet = sum(shedder.refuse("resnet", HEAVY_BYTES, top=True) for _ in range(100))
    assert refused_mlp == 95
    assert 40 <= refused_resnet <= 50


def test_invented_model_names_do_not_grow_its_state() -> None:
    shedder, clocks = make()
    overloaded(shedder, clocks, 10)
    for number in range(5 * MAX_CLASSES):
        shedder.refuse(f"no-such-model-{number}", LIGHT_BYTES)
    clocks.run(busy=1.0)
    shedder.sample(clocks.failing)
    assert len(shedder.costs()) <= MAX_CLASSES + 2  # (and the two classes of no model)
    assert len(shedder.refused_by_model) <= MAX_CLASSES + 1


def test_classes_nothing_comes_for_are_forgotten() -> None:
    shedder, clocks = make()
    overloaded(shedder, clocks, 5)
    assert shedder.costs()
    for _ in range(400):
        clocks.run(busy=0.1)
        shedder.sample(clocks.failing)
    assert shedder.share == 0.0
    assert shedder.costs() == {}


def test_a_request_costs_its_fixed_part_and_its_body() -> None:
    shedder, clocks = make()
    shedder.refuse("m", 1000)
    clocks.run(busy=0.1)
    shedder.sample(clocks.failing)
    weighed = shedder.costs()[("m", False)]
    assert weighed == pytest.approx((FIXED_COST_BYTES + 1000) * (1 - 0.9))


def test_a_class_new_while_shedding_is_not_refused_until_it_is_weighed() -> None:
    """orderbook's class, forgotten while its requests waited in their sockets behind a flood,
    came back at the shedder's own share (95%) until the next sample."""
    shedder, clocks = make()
    overloaded(shedder, clocks, 19)
    assert shedder.share == pytest.approx(0.95)
    assert sum(shedder.refuse("orderbook-2", LIGHT_BYTES) for _ in range(20)) == 0
    clocks.run(busy=1.0)
    shedder.sample(clocks.failing)
    assert shedder.costs()[("orderbook-2", False)] > 0
    assert sum(shedder.refuse("orderbook-2", LIGHT_BYTES) for _ in range(20)) == 0
