"""A model folder whose name is not UTF-8 (`bad\\xffname`, as an archive made on another system
leaves it) is refused by a name that can be shown; the other models serve and the index answers.

Found by a tester (repro_nonutf8_name.py): Python reads such a name with a lone surrogate, which
no JSON encoder takes: POST /v2/repository/index answered 500 for the whole repository, and the
folder's load died with a TypeError in ONNX Runtime.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from repo_models import factor_of, run_on_engine, scale_model, write_version

from duetime.engine import Engine
from duetime.errors import InvalidInput
from duetime.repository.layout import model_folders, scan_repository
from duetime.repository.manager import check_model_name

pytestmark = pytest.mark.timeout(60)

SHOWN = "bad\\xffname"
"""How the folder `b'bad\\xffname'` is named in the index and the log."""


def with_misnamed_folder(repo: Path) -> None:
    """A good model `m`, and a model folder whose name is not UTF-8."""
    write_version(repo, "m", 1, scale_model(2))
    folder = os.fsencode(repo) + b"/bad\xffname"
    os.makedirs(folder + b"/1")
    with open(folder + b"/1/model.onnx", "wb") as file:
        file.write(scale_model(3))


def test_the_scan_refuses_the_folder_by_a_name_that_can_be_shown(tmp_path: Path) -> None:
    with_misnamed_folder(tmp_path)
    scan = scan_repository(tmp_path)
    assert [source.name for source in scan.models] == ["m"]
    assert list(scan.errors) == [SHOWN]
    assert "not valid UTF-8" in scan.errors[SHOWN]
    orjson.dumps(scan.errors)  # (a lone surrogate: "str is not valid UTF-8")
    assert [folder.name for folder in model_folders(tmp_path)] == ["m"]


def index_of(engine: Engine) -> dict[str, tuple[str, str]]:
    entries = engine.repository_index()
    orjson.dumps(entries)  # (what the endpoint does: it raised for the whole index)
    return {e["name"]: (e.get("state", ""), e.get("reason", "")) for e in entries}


@pytest.mark.parametrize("mode", ["none", "poll", "explicit"])
def test_the_index_lists_the_folder_refused_and_the_others_serve(tmp_path: Path, mode: str) -> None:
    with_misnamed_folder(tmp_path)

    async def scenario(engine: Engine) -> None:
        if mode == "poll":
            assert engine.manager is not None
            await engine.manager.poll()  # (the refusal is not forgotten at a poll)
        assert await factor_of(engine) == 2.0
        state, reason = index_of(engine)[SHOWN]
        assert state == "UNAVAILABLE"
        assert reason == f"{tmp_path / SHOWN}: " + (
            "the folder's name is not valid UTF-8, so it names no model (model names are "
            "Unicode, as requests give them); rename the folder"
        )

    extra = {"startup_models": ("m",)} if mode == "explicit" else {"poll_s": 3600.0}
    run_on_engine(tmp_path, scenario, limit_s=30, control_mode=mode, **extra)


def test_a_name_with_a_lone_surrogate_is_no_model_name() -> None:
    """JSON's `"bad\\udcffname"` reached the folder `b'bad\\xffname'` (os.fsencode's
    surrogateescape)."""
    with pytest.raises(InvalidInput, match="not valid Unicode"):
        check_model_name("bad\udcffname")
