"""Models from scikit-learn and LightGBM converters (skl2onnx, onnxmltools), as the testers
served them, built here with onnx.helper: a config listing only some outputs serves those alone
(as Triton's ONNX Runtime backend), a config naming a ZipMap output says why it cannot be
served, and a text pipeline's StringNormalizer without stop words keeps its batching."""

from __future__ import annotations

import json
import logging
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import start_server, stop_server
from onnx import TensorProto, helper

from duetime.config import ServerSettings
from duetime.errors import ConfigError
from duetime.repository.graphs import graph_facts
from duetime.repository.layout import MODEL_FILENAME, scan_model
from duetime.repository.loader import LoadedModel, load_version

pytestmark = pytest.mark.timeout(120)

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def finished(graph: onnx.GraphProto, ml: bool = False) -> bytes:
    opsets = [helper.make_opsetid("", 17)]
    if ml:
        opsets.append(helper.make_opsetid("ai.onnx.ml", 3))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return bytes(model.SerializeToString())


def lightgbm_like() -> bytes:
    """A classifier as onnxmltools exports LightGBM's: `label` declared [1] (its rows are the
    batch's all the same), `probabilities` [N, 4]."""
    graph = helper.make_graph(
        [helper.make_node("ArgMax", ["x"], ["label"], axis=1, keepdims=0),
         helper.make_node("Softmax", ["x"], ["probabilities"], axis=1)], "lgbm",
        [helper.make_tensor_value_info("x", FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("label", INT64, [1]),
         helper.make_tensor_value_info("probabilities", FLOAT, ["N", 4])],
    )  # fmt: skip
    return finished(graph)


def zipmap_classifier() -> bytes:
    """A classifier as skl2onnx exports it by default: a label and a ZipMap of probabilities."""
    seq_of_maps = helper.make_sequence_type_proto(
        helper.make_map_type_proto(INT64, helper.make_tensor_type_proto(FLOAT, []))
    )
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["p"], axis=1),
         helper.make_node("ArgMax", ["p"], ["output_label"], axis=1, keepdims=0),
         helper.make_node("ZipMap", ["p"], ["output_probability"], domain="ai.onnx.ml",
                          classlabels_int64s=[0, 1, 2, 3])], "clf",
        [helper.make_tensor_value_info("x", FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("output_label", INT64, ["N"]),
         helper.make_value_info("output_probability", seq_of_maps)],
    )  # fmt: skip
    return finished(graph, ml=True)


def model_dir(root: Path, name: str, model: bytes, config: str, filename: str) -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / MODEL_FILENAME).write_bytes(model)
    (folder / filename).write_text(config, encoding="utf-8")
    return folder


BATCHED_PBTXT = """
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
UNBATCHED_PBTXT = """
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
"""


def test_a_config_listing_some_outputs_batches_on_those_alone(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    folder = model_dir(tmp_path, "lgbm", lightgbm_like(), BATCHED_PBTXT, "config.pbtxt")
    model = load_version(scan_model(folder), 1, profile_budget_s=0.02)
    loaded.append(model)
    assert model.signature.max_batch_size == 16
    assert [spec.name for spec in model.signature.outputs] == ["probabilities"]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (probabilities,) = model.executor.run_sync(model.validator.prepare({"x": x}, None).feeds)
    assert probabilities.shape == (3, 4)


def test_a_config_listing_some_outputs_serves_those_alone(tmp_path: Path) -> None:
    model_dir(tmp_path, "lgbm0", lightgbm_like(), UNBATCHED_PBTXT, "config.pbtxt")
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0)
    running, thread = start_server(settings)
    try:
        base = f"http://{running.http}/v2/models/lgbm0"
        with urllib.request.urlopen(base, timeout=30) as answer:
            metadata = json.load(answer)
        assert [output["name"] for output in metadata["outputs"]] == ["probabilities"]
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}]}
        request = urllib.request.Request(
            f"{base}/infer", data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as answer:
            outputs = json.load(answer)["outputs"]
        assert [output["name"] for output in outputs] == ["probabilities"]
    finally:
        stop_server(running, thread)


def test_a_config_naming_a_zipmap_output_says_why_it_cannot_be_served(tmp_path: Path) -> None:
    config = '[[outputs]]\nname = "output_label"\n[[outputs]]\nname = "output_probability"\n'
    folder = model_dir(tmp_path, "clf", zipmap_classifier(), config, "config.toml")
    with pytest.raises(ConfigError) as raised:
        load_version(scan_model(folder), 1, profile_budget_s=0.02)
    message = str(raised.value)
    assert "field 'outputs.1.name': 'output_probability' has type seq(map(" in message
    assert "not in the graph" not in message
    assert "options={'zipmap': False}" in message
    assert "zipmap=False" in message


def test_a_zipmap_output_left_out_is_warned_of_with_both_converters_switches(
    tmp_path: Path, loaded: list[LoadedModel], caplog: pytest.LogCaptureFixture
) -> None:
    folder = model_dir(tmp_path, "clf", zipmap_classifier(), "", "config.toml")
    with caplog.at_level(logging.WARNING, logger="duetime.ort"):
        model = load_version(scan_model(folder), 1, profile_budget_s=0.02)
    loaded.append(model)
    assert [spec.name for spec in model.signature.outputs] == ["output_label"]
    assert "options={'zipmap': False}" in caplog.text
    assert "onnxmltools convert_*(..., zipmap=False)" in caplog.text


def test_a_config_naming_an_output_the_graph_lacks_lists_the_graphs(tmp_path: Path) -> None:
    config = '[[outputs]]\nname = "scores"\n'
    folder = model_dir(tmp_path, "lgbm", lightgbm_like(), config, "config.toml")
    with pytest.raises(ConfigError, match="'scores' is not in the graph; it has 'label', 'prob"):
        load_version(scan_model(folder), 1, profile_budget_s=0.02)


def normalizer_model(stopwords: list[str] | None) -> bytes:
    """y = the lower-cased strings of x (N), as skl2onnx's TfidfVectorizer begins; `stopwords`
    removed where given. (locale C.UTF-8: ORT's default en_US may not be installed.)"""
    node = helper.make_node(
        "StringNormalizer", ["x"], ["y"], case_change_action="LOWER", locale="C.UTF-8"
    )
    if stopwords is not None:
        node.attribute.append(helper.make_attribute("stopwords", stopwords))
    graph = helper.make_graph(
        [node], "text",
        [helper.make_tensor_value_info("x", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, ["N"])],
    )  # fmt: skip
    return finished(graph)


def test_a_string_normalizer_without_stop_words_keeps_its_batching(
    tmp_path: Path, loaded: list[LoadedModel]
) -> None:
    folder = model_dir(tmp_path, "text", normalizer_model(None), "", "config.toml")
    model = load_version(scan_model(folder), 1, profile_budget_s=0.02)
    loaded.append(model)
    assert model.signature.max_batch_size == 32
    x = np.array([b"Urgent WIRE", b"", b"Coffee"], dtype=object)
    (y,) = model.executor.run_sync(model.validator.prepare({"x": x}, None).feeds)
    assert [str(text) for text in y] == ["urgent wire", "", "coffee"]


def test_a_string_normalizer_with_stop_words_sizes_by_the_values() -> None:
    assert graph_facts(onnx.load_from_string(normalizer_model(None))).value_sized_outputs == {}
    facts = graph_facts(onnx.load_from_string(normalizer_model(["wire"])))
    assert set(facts.value_sized_outputs) == {"y"}
