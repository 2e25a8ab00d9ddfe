"""An input's `format` (Triton's image layout): kept from each form of a model config, checked,
and reported back by the model config over HTTP and gRPC, where Triton's clients read it."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, start_server, stop_server
from tritonclient.grpc import model_config_pb2 as mc

from duetime.config import ServerSettings
from duetime.demo import write_demo_repository
from duetime.errors import ConfigError
from duetime.frontend.metadata import model_config_json
from duetime.repository.layout import scan_model
from duetime.repository.loader import LoadedModel, load_version
from duetime.repository.tritonconfig import load_model_config, read_json_config

pytestmark = pytest.mark.timeout(120)

# The demo resnet as Triton's quickstart writes densenet_onnx's config: an NCHW image input.
IMAGE_CONFIG = (
    'name: "image"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
    'input [ { name: "image" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 64, 64 ] } ]\n'
    'output [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ]\n'
)
LAYOUTS = "FORMAT_NONE, FORMAT_NHWC, FORMAT_NCHW"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_repository(tmp_path_factory.mktemp("demo"))


def image_model(root: Path, demo: Path, config_file: str, text: str) -> Path:
    """A model folder `root/image` holding the demo resnet and the config `text`."""
    folder = root / "image"
    shutil.copytree(demo / "resnet" / "1", folder / "1")
    (folder / config_file).write_text(text, encoding="utf-8")
    return folder


def load(folder: Path, loaded: list[LoadedModel]) -> LoadedModel:
    model = load_version(scan_model(folder), 1)
    loaded.append(model)
    return model


@pytest.fixture(scope="module")
def image_server(tmp_path_factory: pytest.TempPathFactory, demo: Path) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("repo")
    image_model(repo, demo, "config.pbtxt", IMAGE_CONFIG)
    running, thread = start_server(ServerSettings(model_repository=repo, http_port=0, grpc_port=0))
    yield running
    stop_server(running, thread)


def test_a_pbtxt_format_is_reported_over_http_as_triton_writes_it(
    image_server: RunningServer,
) -> None:
    """Triton's image_client (parse_model) refuses an image input whose format is neither
    NCHW nor NHWC: the config.pbtxt's was warned of as Triton-only and dropped."""
    client = httpclient.InferenceServerClient(image_server.http)
    try:
        (image,) = client.get_model_config("image")["input"]
    finally:
        client.close()
    assert image["format"] == "FORMAT_NCHW"
    assert list(image) == ["name", "data_type", "format", "dims"]  # (Triton's order)


def test_a_pbtxt_format_is_reported_over_grpc(image_server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(image_server.grpc)
    try:
        config = client.get_model_config("image").config
    finally:
        client.close()
    assert config.input[0].format == mc.ModelInput.FORMAT_NCHW


def test_the_reported_format_loads_back(
    tmp_path: Path, demo: Path, loaded: list[LoadedModel]
) -> None:
    """The config endpoint's answer, given back as a load request's config, is the same model."""
    model = load(image_model(tmp_path, demo, "config.pbtxt", IMAGE_CONFIG), loaded)
    reported = model_config_json(model)
    again = read_json_config(reported, source="load request", model_name="image")
    assert [(t.name, t.format) for t in again.inputs or ()] == [("image", "FORMAT_NCHW")]


@pytest.mark.parametrize("layout", ["FORMAT_NHWC", "FORMAT_NCHW"])
def test_a_config_toml_format_is_kept_and_reported(
    tmp_path: Path, demo: Path, loaded: list[LoadedModel], layout: str
) -> None:
    """Without `dims` the graph's ([3, 64, 64] besides the batch's) are checked."""
    text = f'[[inputs]]\nname = "image"\nformat = "{layout}"\n'
    model = load(image_model(tmp_path, demo, "config.toml", text), loaded)
    assert model_config_json(model)["input"][0]["format"] == layout


def test_an_input_without_a_format_reports_none(
    tmp_path: Path, demo: Path, loaded: list[LoadedModel]
) -> None:
    """FORMAT_NONE is left out, as protobuf's JSON leaves out a default (gRPC's answer)."""
    text = IMAGE_CONFIG.replace(" format: FORMAT_NCHW", "")
    model = load(image_model(tmp_path, demo, "config.pbtxt", text), loaded)
    assert "format" not in model_config_json(model)["input"][0]


@pytest.mark.parametrize(
    ("replacement", "message"),
    [
        pytest.param(
            "format: FORMAT_NCWH",
            'Enum type "inference.ModelInput.Format" has no value named FORMAT_NCWH. '
            f"('format' takes {LAYOUTS})",
            id="pbtxt-unknown-name",
        ),
        pytest.param(
            "format: 7",
            f"input[0].format: 7 is not a layout; expected one of {LAYOUTS}",
            id="pbtxt-unknown-number",
        ),
    ],
)
def test_a_bad_pbtxt_format_is_refused_naming_the_layouts(
    tmp_path: Path, demo: Path, replacement: str, message: str
) -> None:
    folder = image_model(
        tmp_path, demo, "config.pbtxt", IMAGE_CONFIG.replace("format: FORMAT_NCHW", replacement)
    )
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_model_config(folder)


def test_a_bad_config_toml_format_is_refused_naming_the_field_and_layouts(
    tmp_path: Path, demo: Path
) -> None:
    folder = image_model(tmp_path, demo, "config.toml", '[[inputs]]\nname = "image"\n'
                         'format = "NCHW"\n')  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        load_model_config(folder)
    assert "field 'inputs.0.format'" in caught.value.message
    assert all(layout in caught.value.message for layout in LAYOUTS.split(", "))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            '[[outputs]]\nname = "logits"\nformat = "FORMAT_NCHW"\n',
            "field 'outputs.0.format': only an input has a format",
            id="on-an-output",
        ),
        pytest.param(
            '[[inputs]]\nname = "image"\nformat = "FORMAT_NHWC"\ndims = [3, 4096]\n'
            "reshape = [3, 64, 64]\n",
            "field 'inputs.0.format': FORMAT_NHWC needs 3 dims (without the batch dim), but the "
            "input's are [3, 4096]",
            id="two-dims",
        ),
    ],
)
def test_a_format_the_tensor_cannot_have_is_refused_at_load(
    tmp_path: Path, demo: Path, text: str, message: str
) -> None:
    folder = image_model(tmp_path, demo, "config.toml", text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_version(scan_model(folder), 1)


def test_a_format_on_an_mlp_input_of_one_dim_is_refused(tmp_path: Path, demo: Path) -> None:
    """The graph's dims are checked where the config gives none (as Triton, after its
    auto-complete): the demo mlp takes [batch, 40]."""
    folder = tmp_path / "mlp"
    shutil.copytree(demo / "mlp" / "1", folder / "1")
    (folder / "config.toml").write_text('[[inputs]]\nname = "x"\nformat = "FORMAT_NCHW"\n')
    with pytest.raises(ConfigError, match=re.escape("but the input's are [40]")):
        load_version(scan_model(folder), 1)
