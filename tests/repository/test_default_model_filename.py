"""A config's `default_model_filename` (Triton's field) names the model file of every version:
a Triton repository whose versions hold `1/net.onnx` serves as it is.

It was refused ("duetime reads <version>/model.onnx; rename the file"), though Triton's
onnxruntime backend loads `<version>/<default_model_filename>`, and `<that>/model.onnx` where
the name is a folder (a model beside its external data).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, explicit_serving
from repo_models import factor_of, inputs, run_on_engine, scale_model
from tritonclient.utils import InferenceServerException

from duetime.config import ModelConfig, parse_model_config
from duetime.engine import Engine
from duetime.errors import ConfigError
from duetime.repository.layout import scan_model

PBTXT = 'platform: "onnxruntime_onnx"\ndefault_model_filename: "{}"\n'


def put(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_a_pbtxt_naming_another_file_serves_it(tmp_path: Path) -> None:
    """Version 1 holds net.onnx (served); version 2 holds only model.onnx, which the config
    does not name: it is no version of this model, as in Triton."""
    put(tmp_path / "m" / "1" / "net.onnx", scale_model(3))
    put(tmp_path / "m" / "2" / "model.onnx", scale_model(5))
    (tmp_path / "m" / "config.pbtxt").write_text(PBTXT.format("net.onnx"))

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 3
        listed = {e.get("version", ""): e["state"] for e in engine.repository_index()}
        assert listed == {"1": "READY"}

    run_on_engine(tmp_path, scenario)


def test_a_toml_config_names_the_file_too(tmp_path: Path) -> None:
    put(tmp_path / "m" / "1" / "net.onnx", scale_model(4))
    (tmp_path / "m" / "config.toml").write_text('default_model_filename = "net.onnx"\n')

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 4

    run_on_engine(tmp_path, scenario)


def test_a_named_folder_serves_the_model_onnx_in_it(tmp_path: Path) -> None:
    """Triton's onnxruntime backend: a model path that is a folder loads `<dir>/model.onnx`."""
    put(tmp_path / "m" / "1" / "net" / "model.onnx", scale_model(6))
    (tmp_path / "m" / "config.pbtxt").write_text(PBTXT.format("net"))

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 6

    run_on_engine(tmp_path, scenario)


def test_a_changed_named_file_is_reloaded_by_the_poll(tmp_path: Path) -> None:
    put(tmp_path / "m" / "1" / "net.onnx", scale_model(3))
    (tmp_path / "m" / "config.pbtxt").write_text(PBTXT.format("net.onnx"))

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 3
        put(tmp_path / "m" / "1" / "net.onnx.tmp", scale_model(7))
        (tmp_path / "m" / "1" / "net.onnx.tmp").rename(tmp_path / "m" / "1" / "net.onnx")
        await engine.load_model("m")
        assert await factor_of(engine) == 7

    run_on_engine(tmp_path, scenario, control_mode="explicit", startup_models=("m",))


def test_the_refusal_of_a_folder_lacking_the_named_file_names_the_field(tmp_path: Path) -> None:
    put(tmp_path / "m" / "1" / "model.onnx", scale_model(1))
    with pytest.raises(ConfigError) as caught:
        scan_model(tmp_path / "m", filename="net.onnx")
    assert caught.value.message == (
        f"{tmp_path / 'm'}: no version folder holds a net.onnx (1/model.onnx: the file must be "
        "named net.onnx (or named by the config's field 'default_model_filename')); expected "
        f"{tmp_path / 'm'}/<version>/net.onnx with an integer version such as 1 (its config's "
        "field 'default_model_filename' names 'net.onnx')"
    )


def test_the_unserved_model_says_why(tmp_path: Path) -> None:
    """Through the engine: the model's load error is the scan's, naming the field."""
    put(tmp_path / "m" / "1" / "model.onnx", scale_model(1))
    (tmp_path / "m" / "config.pbtxt").write_text(PBTXT.format("net.onnx"))

    async def scenario(engine: Engine) -> None:
        (row,) = [r for r in engine.repository_index() if r["name"] == "m"]
        assert "no version folder holds a net.onnx" in row.get("reason", "")
        assert "'default_model_filename' names 'net.onnx'" in row.get("reason", "")

    run_on_engine(tmp_path, scenario)


@pytest.mark.parametrize(
    ("files", "config", "said"),
    [
        (
            {},
            'platform: "ensemble"\nensemble_scheduling { }\n',
            "ensemble_scheduling: ensembles are not supported",
        ),
        ({"1/model.py": b""}, 'backend: "python"\n', "backend: 'python'"),
        (
            {"1/net.onnx": scale_model(1)},
            'default_model_filename: "net.onnx"\nmax_batch_sizee: 8\n',
            'no field named "max_batch_sizee"',
        ),
    ],
    ids=["ensemble", "python", "typo"],
)
def test_at_start_a_refused_config_is_the_reason_not_the_version_folders(
    tmp_path: Path, files: dict[str, bytes], config: str, said: str
) -> None:
    """The startup scan read a refused config as naming model.onnx, and blamed the version
    folders ("no version folder holds a model.onnx"): the load, which names the field, never
    ran (found by a tester)."""
    (tmp_path / "m" / "1").mkdir(parents=True)
    for name, data in files.items():
        put(tmp_path / "m" / name, data)
    (tmp_path / "m" / "config.pbtxt").write_text(config)

    async def scenario(engine: Engine) -> None:
        (row,) = [r for r in engine.repository_index() if r["name"] == "m"]
        assert said in row.get("reason", "")
        assert "no version folder" not in row.get("reason", "")

    for mode in ("none", "poll"):
        run_on_engine(tmp_path, scenario, control_mode=mode)


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"default_model_filename": "a/b.onnx"}, "default_model_filename"),
        ({"default_model_filename": ".."}, "default_model_filename"),
        ({"default_model_filename": ""}, "default_model_filename"),
        (
            {"default_model_filename": "net.onnx", "variants": [{"name": "v", "file": "net.onnx"}]},
            "variants: 'net.onnx' is the primary model, not a variant",
        ),
    ],
)
def test_a_file_name_that_is_no_name_is_refused(settings: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        parse_model_config(settings, source="c")


def test_the_default_is_model_onnx() -> None:
    assert ModelConfig().default_model_filename == "model.onnx"


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("repo")
    put(repo / "m" / "1" / "net.onnx", scale_model(2))
    (repo / "m" / "config.pbtxt").write_text(PBTXT.format("net.onnx"))
    with explicit_serving(repo, "m") as running:
        yield running


def test_the_config_endpoints_give_the_file_name(explicit_server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(explicit_server.http)
    grpc = grpcclient.InferenceServerClient(explicit_server.grpc)
    try:
        assert http.get_model_config("m")["default_model_filename"] == "net.onnx"
        assert grpc.get_model_config("m").config.default_model_filename == "net.onnx"
    finally:
        http.close()
        grpc.close()


def test_an_upload_with_a_config_naming_its_file_serves_it(explicit_server: RunningServer) -> None:
    """tritonclient's `load_model(config=..., files=...)`, as Triton takes it: the config's
    JSON names the uploaded file."""
    client = httpclient.InferenceServerClient(explicit_server.http)
    try:
        config = json.dumps({"backend": "onnxruntime", "default_model_filename": "up.onnx"})
        client.load_model("u", config=config, files={"file:1/up.onnx": scale_model(9)})
        x = httpclient.InferInput("x", [1, 4], "FP32")
        x.set_data_from_numpy(inputs()["x"])
        y = client.infer("u", [x]).as_numpy("y")
        np.testing.assert_array_equal(y, inputs()["x"] * 9)
        config = json.dumps({"backend": "onnxruntime", "default_model_filename": "ne.onnx"})
        with pytest.raises(InferenceServerException, match=r"no version folder holds a ne\.onnx"):
            client.load_model("w", config=config, files={"file:1/up.onnx": scale_model(9)})
    finally:
        client.close()
