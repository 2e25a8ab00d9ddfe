"""The model config as get_model_config returns it (HTTP's JSON, gRPC's ModelConfig), loaded back
by load_model(config=...), serves as before: the settings Triton's ModelConfig has no field for
(traffic, variants, execution, breaker, two scheduling margins) travel in its
`parameters['duetime']`.

A model with weights {1: 50, 2: 50}, a sticky key, shadow {3: 1.0} and a variant, loaded back
from its own config, sent 200 of 200 requests to version 3 (the former shadow), moved every
sticky key and lost the variant, without a word: the config had none of those sections."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, explicit_serving
from repo_models import inputs, scale_model, write_version
from tritonclient.utils import InferenceServerException

from duetime.repository.tritonconfig import read_model_config

pytestmark = pytest.mark.timeout(120)

CONFIG = """execution = "thread"
version_policy = { all = {} }
[scheduling]
delivery_margin_us = 700
exec_margin = 0.75
[breaker]
failures = 9
[traffic]
weights = { "1" = 50, "2" = 50 }
sticky_key = "x-routing-key"
shadow = { "3" = 1.0 }
[[variants]]
name = "small"
file = "small.onnx"
kind = "fp16"
"""
KEYS = [f"k{i}" for i in range(12)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("repo")
    for version in (1, 2, 3):
        write_version(repo, "m", version, scale_model(version))
        write_version(repo, "m", version, scale_model(version), name="small.onnx")
    (repo / "m" / "config.toml").write_text(CONFIG, encoding="utf-8")
    with explicit_serving(repo, "m") as running:
        yield running


@pytest.fixture
def client(server: RunningServer, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A client of the protocol the test is parametrized with; the model's own config file is
    loaded again afterwards (a plain load reads it)."""
    made: Any = (
        grpcclient.InferenceServerClient(server.grpc)
        if request.node.callspec.params["protocol"] == "grpc"
        else httpclient.InferenceServerClient(server.http)
    )
    try:
        yield made
    finally:
        made.load_model("m")
        made.close()


def model_config(client: Any) -> dict[str, Any]:
    """The config as each client gives it (gRPC's in protobuf's JSON form)."""
    if isinstance(client, grpcclient.InferenceServerClient):
        return dict(client.get_model_config("m", as_json=True)["config"])
    return dict(client.get_model_config("m"))


def served(server: RunningServer) -> dict[str, Any]:
    """What the server serves of the settings Triton has no field for."""
    model = server.server.engine.registry.served("m")
    config = model.versions["1"].primary.model.config
    return {
        "traffic": model.traffic,
        "variants": {v: [d.variant for d in s.variants] for v, s in model.versions.items()},
        "execution": config.execution,
        "breaker": config.breaker,
        "margins": (config.scheduling.delivery_margin_us, config.scheduling.exec_margin),
        "kinds": [variant.kind for variant in config.variants],
    }


def versions_by_key(server: RunningServer) -> list[str]:
    """The version answering each of KEYS (the sticky key's header)."""
    http = httpclient.InferenceServerClient(server.http)
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(inputs()["x"])
    try:
        return [
            http.infer("m", [tensor], headers={"x-routing-key": key}).get_response()[
                "model_version"
            ]
            for key in KEYS
        ]
    finally:
        http.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_config_loaded_back_serves_as_before(
    server: RunningServer, client: Any, protocol: str
) -> None:
    before, keyed, config = served(server), versions_by_key(server), model_config(client)
    assert set(keyed) == {"1", "2"}, keyed  # (the weights: 12 keys over 1 and 2)
    client.load_model("m", config=json.dumps(config))
    assert served(server) == before
    assert versions_by_key(server) == keyed
    assert model_config(client) == config
    assert json.loads(config["parameters"]["duetime"]["string_value"])["traffic"] == {
        "weights": {"1": 50.0, "2": 50.0}, "sticky_key": "x-routing-key", "shadow": {"3": 1.0},
    }  # fmt: skip


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_edit_of_the_carried_settings_holds(
    server: RunningServer, client: Any, protocol: str
) -> None:
    """The loaded config wins over the model's file: its edited weights, and a Triton field
    (instance_group) beside the carried settings."""
    config = model_config(client)
    carried = json.loads(config["parameters"]["duetime"]["string_value"])
    carried["traffic"]["weights"] = {"1": 1}
    config["parameters"]["duetime"]["string_value"] = json.dumps(carried)
    config["instance_group"][0]["count"] = 2
    client.load_model("m", config=json.dumps(config))
    assert versions_by_key(server) == ["1"] * len(KEYS)
    assert served(server)["execution"] == "thread"
    assert server.server.engine.registry.resolve("m", "1").model.config.instances == 2


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_config_without_them_serves_their_defaults(
    server: RunningServer, client: Any, protocol: str
) -> None:
    """The override is the whole config: one that leaves out `parameters['duetime']` on
    purpose serves those settings at their defaults, not at the model file's (as before)."""
    config = model_config(client)
    del config["parameters"]["duetime"]
    client.load_model("m", config=json.dumps(config))
    assert versions_by_key(server) == ["3"] * len(KEYS)  # (no weights: the highest)
    assert served(server)["variants"] == {"1": ["default"], "2": ["default"], "3": ["default"]}
    assert "duetime" not in model_config(client)["parameters"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_wrong_duetime_parameter_is_refused_naming_it(
    server: RunningServer, client: Any, protocol: str
) -> None:
    config = model_config(client)
    wrong = {
        "[1, 2]": r"parameters\['duetime'\]: expected a JSON object of duetime's settings",
        '{"max_batch_size": 4}': r"parameters\['duetime'\]: max_batch_size: not carried here",
        '{"scheduling": {"policy": "fifo"}}': r"scheduling.policy: not carried here",
        '{"traffic": {"weights": {"x": 1}}}': r"field 'parameters\['duetime'\].traffic.weights'",
        '{"variants": [{"name": "default", "file": "a.onnx"}]}':
            r"field 'parameters\['duetime'\].variants\[0\].name'",
        '{"execution": "inline"}': r"'inline' runs the one instance on the event loop, but "
                                   r"instance_group counts 2",
    }  # fmt: skip
    config["instance_group"][0]["count"] = 2
    for value, message in wrong.items():
        config["parameters"]["duetime"] = {"string_value": value}
        with pytest.raises(InferenceServerException, match=message) as refused:
            client.load_model("m", config=json.dumps(config))
        assert str(refused.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT")
    assert versions_by_key(server)[0] in ("1", "2")  # (a failed load changed nothing)


def test_a_triton_config_file_may_carry_them(tmp_path: Path) -> None:
    """A config.pbtxt with `parameters['duetime']` serves them too (no warning of an unknown
    parameter)."""
    for version in (1, 2):
        write_version(tmp_path, "m", version, scale_model(version))
    carried = json.dumps({"traffic": {"weights": {"1": 1}}})
    (tmp_path / "m" / "config.pbtxt").write_text(
        'version_policy { all { } }\nparameters { key: "duetime" value { string_value: '
        f"{json.dumps(carried)} }} }}\n",
        encoding="utf-8",
    )
    read = read_model_config(tmp_path / "m")
    assert read.config.traffic.weights == {"1": 1.0}
    # (but the queue bound a config without max_queue_size gets: test_triton_config_compat.py)
    assert [w for w in read.warnings if "max_queue_size: not set" not in w] == []
