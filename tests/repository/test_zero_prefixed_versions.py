"""A version folder whose name has a leading zero (`003`, `01`) is no version, as in Triton
(VersionsToLoad; its QA test `test_parse_ignore_zero_prefixed_version`): it is not served, and is
warned of once, in the log and in the index's rows of the versions served. So is any folder
holding the model file whose name is no version (`v1`, `-2`).

Found by a tester (t77 repro_1.py): `m/1` beside `m/003` served `003` as version 3 (another
model than Triton serves, without a word), and `n/1` beside `n/01` refused the whole model
("both version 1"), which Triton serves as version 1.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from repo_models import factor_of, scale_model, write_version
from repo_models import run_on_engine as run

from duetime.engine import Engine
from duetime.errors import ConfigError
from duetime.repository.layout import folder_version, ignored_warning, scan_model, version_of

pytestmark = pytest.mark.timeout(60)


def put(repo: Path, relative: str, factor: float) -> None:
    path = repo / "m" / relative / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(scale_model(factor))


@pytest.mark.parametrize(
    ("name", "version"),
    [("0", 0), ("1", 1), ("10", 10), ("003", None), ("01", None), ("00", None), ("v1", None)],
)
def test_a_folder_name_with_a_leading_zero_is_no_version(name: str, version: int | None) -> None:
    assert folder_version(name) == version


def test_a_requests_version_string_with_a_leading_zero_still_names_its_version() -> None:
    """Triton parses a request's version as a number: "01" is version 1 (routing's words)."""
    assert version_of("01") == 1


def test_beside_their_canonical_folders_they_are_ignored_and_listed(tmp_path: Path) -> None:
    put(tmp_path, "1", 1)
    put(tmp_path, "003", 3)
    put(tmp_path, "01", 100)
    put(tmp_path, "v2", 2)
    (tmp_path / "m" / "02").mkdir()  # (holds no model: nothing to say of it)
    source = scan_model(tmp_path / "m")
    assert sorted(source.versions) == [1]
    assert source.ignored == (
        "folder 003/ holds a model.onnx but is not served: not a version: a version folder's "
        "name has no leading zeros (Triton ignores such a folder); name it '3'",
        "folder 01/ holds a model.onnx but is not served: not a version: a version folder's "
        "name has no leading zeros (Triton ignores such a folder); name it '1'",
        "folder v2/ holds a model.onnx but is not served: not a version: a version folder's "
        "name is an integer, such as 1",
    )
    assert ignored_warning(source) == f"{tmp_path / 'm'}: " + "; ".join(source.ignored)


def test_a_long_name_of_leading_zeros_is_said_to_have_them_and_many_are_cut_short(
    tmp_path: Path,
) -> None:
    """`000000000000000000000001` was said to be beyond the highest version, and 200 folders
    `01`..`0200` made each served version's index reason 31 KB (both found by a tester)."""
    put(tmp_path, "1", 1)
    put(tmp_path, "0" * 23 + "1", 1)
    source = scan_model(tmp_path / "m")
    assert source.ignored == (
        f"folder {'0' * 23}1/ holds a model.onnx but is not served: not a version: a version "
        "folder's name has no leading zeros (Triton ignores such a folder); name it '1'",
    )
    for number in range(2, 21):
        put(tmp_path, f"0{number}", number)
    warning = ignored_warning(scan_model(tmp_path / "m"))
    assert warning.count("holds a model.onnx") == 5
    assert warning.endswith("; and 15 more such folders")


def test_a_model_folder_of_such_folders_alone_is_refused_saying_why(tmp_path: Path) -> None:
    put(tmp_path, "007", 7)
    with pytest.raises(ConfigError) as caught:
        scan_model(tmp_path / "m")
    assert caught.value.message == (
        f"{tmp_path / 'm'}: no version folder holds a model.onnx (007/: not a version: a "
        "version folder's name has no leading zeros (Triton ignores such a folder); name it "
        f"'7'); expected {tmp_path / 'm'}/<version>/model.onnx with an integer version such as 1"
    )


def test_the_canonical_version_serves_and_the_log_and_index_say_why_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    put(tmp_path, "003", 3)
    write_version(tmp_path, "n", 1, scale_model(2))
    (tmp_path / "n" / "01").mkdir()
    (tmp_path / "n" / "01" / "model.onnx").write_bytes(scale_model(100))
    listed: list[str] = []

    async def scenario(engine: Engine) -> None:
        manager = engine.manager
        assert manager is not None
        assert await factor_of(engine) == 1.0  # (Triton's: not the 003 folder's 3)
        assert await factor_of(engine, "n") == 2.0  # (served, not refused)
        await manager.poll()
        rows = {(r["name"], r.get("version")): r for r in engine.repository_index()}
        assert set(rows) == {("m", "1"), ("n", "1")}
        assert rows["m", "1"]["state"] == "READY"
        assert rows["m", "1"]["reason"].startswith(f"{tmp_path / 'm'}: folder 003/ holds a ")
        assert "name it '1'" in rows["n", "1"]["reason"]
        listed.append(rows["m", "1"]["reason"])
        shutil.rmtree(tmp_path / "m" / "003")
        await manager.poll()  # (the folder gone: so is the reason)
        (row,) = [r for r in engine.repository_index() if r["name"] == "m"]
        assert (row["state"], row["reason"]) == ("READY", "")

    with caplog.at_level(logging.WARNING, logger="duetime.manager"):
        run(tmp_path, scenario, control_mode="poll", poll_s=3600)
    said = [r.getMessage() for r in caplog.records if "003/" in r.getMessage()]
    assert said == [f"model m: {listed[0]}"]  # (once, not at every poll)
