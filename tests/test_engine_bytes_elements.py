"""A BYTES input's elements are bytes or text: the in-process Engine refuses any other element
as every wire transport does, naming the input and the element, before the request is queued.

It made each such element its str(): None became the text "None", 1.5 became "1.5", and the
model ran on them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper
from repo_models import write_version

from duetime import Engine
from duetime.errors import InvalidInput
from duetime.repository.layout import scan_model
from duetime.repository.loader import load_version

pytestmark = pytest.mark.timeout(120)


def string_identity() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.STRING, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, ["N", 3])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("repo")
    write_version(path, "s", 1, string_identity())
    return path


@pytest.mark.parametrize(
    ("row", "index", "kind"),
    [
        ([None, 1.5, "ok"], 0, "NoneType"),
        (["ok", b"ok", 1.5], 2, "float"),
        (["ok", np.int64(3), b"ok"], 1, "int64"),
        ([b"ok", "ok", ["a"]], 2, "list"),
    ],
)
def test_an_element_neither_bytes_nor_text_is_refused(
    repo: Path, row: list[object], index: int, kind: str
) -> None:
    x = np.empty((1, 3), dtype=object)
    for i, item in enumerate(row):
        x[0, i] = item
    wanted = f"input 'x': BYTES element {index} must be bytes or a string, got {kind}"
    with Engine.open(repo) as engine, pytest.raises(InvalidInput, match=wanted):
        engine.infer("s", {"x": x}, timeout=10)
    model = load_version(scan_model(repo / "s"), 1)  # (refused by the validator: not queued)
    try:
        with pytest.raises(InvalidInput, match=wanted):
            model.validator.prepare({"x": x}, None)
    finally:
        model.executor.close()


def test_bytes_and_text_of_every_kind_are_taken(repo: Path) -> None:
    given = [
        np.array([[b"a", "\u00e9", bytearray(b"c")]], dtype=object),
        np.array([["a", "b", "\u2603"]]),  # (numpy's str_)
        np.array([[b"a", b"b", b"c"]]),  # (numpy's bytes_)
        np.array([[np.str_("a"), np.bytes_(b"b"), "c"]], dtype=object),
    ]
    with Engine.open(repo) as engine:
        for x in given:
            y = engine.infer("s", {"x": x}, timeout=10)["y"]
            expected = [[v if isinstance(v, str) else bytes(v).decode() for v in x[0]]]
            assert [[v.decode() for v in y[0]]] == expected


@pytest.mark.parametrize(
    "row",
    [
        np.array([["ok", "\ud800", "ok"]], dtype=object),
        np.array([["ok", "a\udfffb", "ok"]]),  # (numpy's str_)
    ],
    ids=["str", "numpy-str"],
)
def test_text_with_a_lone_surrogate_is_refused_naming_the_input_and_element(
    repo: Path, row: np.ndarray
) -> None:
    """It passed, and ORT's encoding of it failed the run: "ONNX Runtime could not run the model
    on these inputs: 'utf-8' codec can't encode character", naming neither."""
    wanted = r"^input 'x': BYTES element 1 is a string that is not valid Unicode text"
    with Engine.open(repo) as engine, pytest.raises(InvalidInput, match=wanted):
        engine.infer("s", {"x": row}, timeout=10)
