"""What a load says of a repository it serves only in part, and where: a version folder without
its model file is named (Triton counts it a version, whose load fails and says why; duetime
serves the others), and the config's fields the graph refuses or warns of are named in the
config file that holds them, as their writer wrote them (found by a tester, t111)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from repo_models import factor_of, scale_model, write_version
from repo_models import run_on_engine as run

from duetime.engine import Engine

pytestmark = pytest.mark.timeout(60)


def rows(engine: Engine, name: str = "m") -> dict[str | None, dict[str, str]]:
    return {r.get("version"): r for r in engine.repository_index() if r["name"] == name}


@pytest.mark.parametrize(
    ("held", "said"),
    [
        (None, "folder 2/ is not served: 2/: holds no model.onnx"),
        ("net.onnx", "folder 2/ is not served: 2/net.onnx: the file must be named model.onnx"),
        ("model.ONNX", "folder 2/ is not served: 2/model.ONNX: the file must be named"),
    ],
)
def test_a_version_folder_without_its_model_file_is_named_beside_the_version_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, held: str | None, said: str
) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    (tmp_path / "m" / "2").mkdir()
    if held is not None:
        (tmp_path / "m" / "2" / held).write_bytes(scale_model(2))

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 1.0  # (version 1 serves on)
        row = rows(engine)["1"]
        assert row["state"] == "READY"
        assert row["reason"].startswith(f"{tmp_path / 'm'}: {said}")

    with caplog.at_level(logging.WARNING, logger="duetime.manager"):
        run(tmp_path, scenario)
    assert said in caplog.text


def test_a_specific_version_whose_folder_holds_no_model_file_is_said_to_hold_none(
    tmp_path: Path,
) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    (tmp_path / "m" / "2").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(
        "version_policy: { specific: { versions: [1, 2, 3] } }\n"
    )

    async def scenario(engine: Engine) -> None:
        index = rows(engine)
        assert index["1"]["state"] == "READY"
        assert (index["2"]["state"], index["2"]["reason"]) == (
            "UNAVAILABLE",
            "version 2 is specified for model 'm', but the version directory 2/ holds no "
            "model.onnx",
        )
        assert index["3"]["reason"] == (
            "version 3 is specified for model 'm', but the version directory is not present"
        )

    run(tmp_path, scenario)


@pytest.mark.parametrize(
    ("file", "text", "field"),
    [
        ("config.toml", '[[inputs]]\nname = "x"\ndims = [5]\n', "inputs.0.dims"),
        ("config.yaml", "inputs:\n  - name: x\n    dims: [5]\n", "inputs.0.dims"),
        ("config.pbtxt", 'max_batch_size: 8\ninput [{ name: "x" dims: [5] }]\n', "input[0].dims"),
    ],
)
def test_dims_the_graph_refuses_are_named_in_the_config_file(
    tmp_path: Path, file: str, text: str, field: str
) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    (tmp_path / "m" / file).write_text(text)

    async def scenario(engine: Engine) -> None:
        assert rows(engine)["1"]["reason"].startswith(
            f"{tmp_path / 'm' / file}: field '{field}': [5] does not fit the graph's [4]"
        )

    run(tmp_path, scenario)


def test_a_warning_of_a_config_pbtxt_field_names_the_file_and_its_field(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An `optional` input without an initializer: requests must give it all the same."""
    write_version(tmp_path, "m", 1, scale_model(1))
    (tmp_path / "m" / "config.pbtxt").write_text(
        'max_batch_size: 8\ninput [{ name: "x" data_type: TYPE_FP32 dims: [4] optional: true }]\n'
    )

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 1.0

    with caplog.at_level(logging.WARNING, logger="duetime.loader"):
        run(tmp_path, scenario)
    assert (
        f"{tmp_path / 'm' / 'config.pbtxt'}: field 'input[0].optional': 'x' has no initializer"
        in caplog.text
    )


@pytest.mark.parametrize(
    ("file", "text", "field"),
    [
        ("config.toml", '[[inputs]]\nname = "x"\ndims = [-1]\n', "inputs.0.dims"),
        ("config.pbtxt", 'max_batch_size: 8\ninput [{ name: "x" dims: [-1] }]\n', "input[0].dims"),
    ],
)
def test_a_dim_the_config_leaves_free_but_the_graph_fixes_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, file: str, text: str, field: str
) -> None:
    """Served as the graph's (Triton refuses such a config): said, where it was silent."""
    write_version(tmp_path, "m", 1, scale_model(1))
    (tmp_path / "m" / file).write_text(text)

    async def scenario(engine: Engine) -> None:
        assert await factor_of(engine) == 1.0
        assert rows(engine)["1"]["state"] == "READY"

    with caplog.at_level(logging.WARNING, logger="duetime.loader"):
        run(tmp_path, scenario)
    assert (
        f"{tmp_path / 'm' / file}: field '{field}': [-1] leaves free a dim the graph fixes ([4]): "
        "served as [4]"
    ) in caplog.text
