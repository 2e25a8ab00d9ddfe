"""Weights over versions that take other inputs: the load says so (log and repository index),
and a request the chosen version refuses is told which version the weights chose.

Found by a tester (repro_1): versions 1 (x [-1,4]) and 2 (x [-1,6]) under `weights = {"1" = 1,
"2" = 1}` loaded without a word; metadata said x [-1,6], and half the requests shaped so were
refused "Expected [-1,4], got [1,6]", naming no version.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import serving
from onnx import TensorProto, helper
from repo_models import age, write_version
from repo_models import run_on_engine as run
from tritonclient.utils import InferenceServerException

from duetime.config import ServerSettings
from duetime.engine import Engine
from duetime.errors import InvalidInput
from duetime.routing.traffic import rendezvous

pytestmark = pytest.mark.timeout(60)

SPLIT = 'weights = { "1" = 1, "2" = 1 }\nsticky_key = "user"\n'


def identity(width: int, name: str = "x") -> bytes:
    """y = the input `name`, FP32 [batch, `width`]."""
    given = helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])
    graph = helper.make_graph([helper.make_node("Identity", [name], ["y"])], "g", [given], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def write_model(repo: Path, versions: dict[int, bytes], traffic: str) -> None:
    for version, model in versions.items():
        write_version(repo, "m", version, model)
    set_traffic(repo, traffic)


def set_traffic(repo: Path, traffic: str) -> None:
    path = repo / "m" / "config.toml"
    path.write_text("version_policy = { all = {} }\n[traffic]\n" + traffic)
    age(path)


def key_for(version: str) -> str:
    """A sticky key that SPLIT's weights send to `version`."""
    return next(k for k in map(str, range(100)) if rendezvous(k, ["1", "2"], [1, 1]) == version)


def reasons_and_warnings(
    repo: Path, caplog: pytest.LogCaptureFixture
) -> tuple[dict[str, str], list[str]]:
    """The repository index's reason for each version of `m`, and the load's warnings about
    its weights."""
    reasons: dict[str, str] = {}

    async def scenario(engine: Engine) -> None:
        assert engine.manager is not None
        reasons.update({e["version"]: e["reason"] for e in engine.manager.index()})

    with caplog.at_level(logging.WARNING, logger="duetime.manager"):
        run(repo, scenario)
    return reasons, [r.getMessage() for r in caplog.records if "weights" in r.getMessage()]


@pytest.mark.parametrize(
    ("other", "named"),
    [(identity(6), "x FP32[-1, 6]"), (identity(4, "q"), "q FP32[-1, 4]")],
    ids=["other-shape", "other-name"],
)
def test_weights_over_versions_that_take_other_inputs_are_named_at_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, other: bytes, named: str
) -> None:
    write_model(tmp_path, {1: identity(4), 2: other}, SPLIT)
    reasons, warnings = reasons_and_warnings(tmp_path, caplog)
    [warning] = warnings
    assert warning.startswith("model m: [traffic] weights send requests that name no version ")
    assert "to versions 1 and 2, which do not take and give the same tensors" in warning
    assert f"version 2 takes {named}" in warning
    assert "version 1 takes x FP32[-1, 4]" in warning
    assert reasons == dict.fromkeys(("1", "2"), warning.removeprefix("model m: "))


def test_weights_over_versions_alike_are_not_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_model(tmp_path, {1: identity(4), 2: identity(4)}, SPLIT)
    assert reasons_and_warnings(tmp_path, caplog) == ({"1": "", "2": ""}, [])


def test_a_version_without_weight_is_not_compared(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only versions the weights send requests to must be alike: version 2, weighted 0, is
    reached only by naming it."""
    write_model(tmp_path, {1: identity(4), 2: identity(6)}, 'weights = { "1" = 1, "2" = 0 }\n')
    assert reasons_and_warnings(tmp_path, caplog) == ({"1": "", "2": ""}, [])


def test_a_reload_that_splits_the_weights_names_them_and_one_that_ends_the_split_does_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_model(tmp_path, {1: identity(4), 2: identity(6)}, 'weights = { "1" = 1 }\n')
    seen: list[dict[str, str]] = []

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        for traffic in (SPLIT, 'weights = { "2" = 1 }\n'):
            set_traffic(tmp_path, traffic)
            await manager.poll()
            seen.append({e["version"]: e["reason"] for e in manager.index()})

    with caplog.at_level(logging.WARNING, logger="duetime.manager"):
        run(tmp_path, scenario, control_mode="poll", poll_s=3600)
    [warning] = [r.getMessage() for r in caplog.records if "which do not take" in r.getMessage()]
    assert seen[0] == {"1": warning.removeprefix("model m: "), "2": seen[0]["1"]}
    assert seen[1] == {"1": "", "2": ""}


def test_a_refusal_by_the_version_the_weights_chose_names_it_engine(tmp_path: Path) -> None:
    write_model(tmp_path, {1: identity(4), 2: identity(6)}, SPLIT)
    wide = {"x": np.zeros((1, 6), np.float32)}

    async def scenario(engine: Engine) -> None:
        with pytest.raises(InvalidInput) as refused:
            await engine.infer_async("m", wide, parameters={"user": key_for("1")})
        assert str(refused.value).startswith("unexpected shape for input 'x' for model 'm'")
        assert refused.value.message.endswith(
            "; refused by model 'm' version 1 (chosen by its [traffic] weights: the request "
            "named no version)"
        )
        with pytest.raises(InvalidInput) as named:  # (the version the request chose: as it was)
            await engine.infer_async("m", wide, version="1")
        assert "chosen by" not in named.value.message
        assert named.value.message.endswith("got [1,6] (-1 marks a free dim)")

    run(tmp_path, scenario)


def test_a_refusal_by_the_one_weighted_version_metadata_does_not_describe_names_it(
    tmp_path: Path,
) -> None:
    """Metadata describes the highest version (2); the weights send every request to 1."""
    write_model(tmp_path, {1: identity(4), 2: identity(6)}, 'weights = { "1" = 1 }\n')

    async def scenario(engine: Engine) -> None:
        with pytest.raises(InvalidInput, match=r"version 1 \(chosen by its \[traffic\] weights"):
            await engine.infer_async("m", {"x": np.zeros((1, 6), np.float32)})

    run(tmp_path, scenario)


def test_a_refusal_by_the_version_the_weights_chose_names_it_over_each_protocol(
    tmp_path: Path,
) -> None:
    write_model(tmp_path, {1: identity(4), 2: identity(6)}, SPLIT)
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0)
    said = "refused by model 'm' version 1 (chosen by its [traffic] weights"
    headers = {"Content-Type": "application/json", "user": key_for("1")}
    v2 = {"inputs": [{"name": "x", "shape": [1, 6], "datatype": "FP32", "data": [0.0] * 6}]}
    with serving(settings) as running:
        for path, doc in (
            ("/v2/models/m/infer", v2),
            ("/v1/models/m:predict", {"instances": [[0.0] * 6]}),
        ):
            request = urllib.request.Request(
                f"http://{running.http}{path}", json.dumps(doc).encode(), headers
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code == 400
            assert said in json.loads(refused.value.read())["error"]
        client = grpcclient.InferenceServerClient(running.grpc)
        x = grpcclient.InferInput("x", [1, 6], "FP32")
        x.set_data_from_numpy(np.zeros((1, 6), np.float32))
        with pytest.raises(InferenceServerException) as failed:
            client.infer("m", [x], headers={"user": key_for("1")})
        assert failed.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert said in str(failed.value.message())
        client.close()
