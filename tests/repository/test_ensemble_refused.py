"""A Triton ensemble is refused saying that ensembles are not supported, naming its field.

Found by a tester (t77 repro_4.py): every Triton ensemble has `platform: "ensemble"` beside its
`ensemble_scheduling`, and was refused as another platform ("duetime serves ONNX models with
ONNX Runtime (platform 'onnxruntime_onnx', ...)"), which reads as "change the platform"; the
ensemble's own refusal was only met by a config without the platform, which Triton refuses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_models import run_on_engine, scale_model, write_version

from duetime.engine import Engine
from duetime.errors import ConfigError
from duetime.repository.tritonconfig import translate

ENSEMBLE = """name: "pipeline"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling {
  step [ { model_name: "m" model_version: -1
           input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } } ]
}
"""
SAID = "ensembles are not supported; serve each model on its own"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (ENSEMBLE, "ensemble_scheduling: "),
        ('platform: "ensemble"\n', "platform: 'ensemble': "),
        ("ensemble_scheduling { }\n", "ensemble_scheduling: "),
    ],
    ids=["triton's", "platform alone", "scheduling alone"],
)
def test_an_ensemble_is_refused_as_one(text: str, field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        translate(text, source="c", model_name="pipeline")
    assert caught.value.message == f"c: {field}{SAID}"


def test_the_index_says_so_and_the_other_models_serve(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    (tmp_path / "pipeline" / "1").mkdir(parents=True)
    (tmp_path / "pipeline" / "config.pbtxt").write_text(ENSEMBLE)

    async def scenario(engine: Engine) -> None:
        rows = {r["name"]: r for r in engine.repository_index()}
        assert rows["m"]["state"] == "READY"
        assert rows["pipeline"]["reason"] == (
            f"{tmp_path / 'pipeline' / 'config.pbtxt'}: ensemble_scheduling: {SAID}"
        )

    run_on_engine(tmp_path, scenario)
