"""A `[traffic]` table naming a version that is on disk but failed to load is said in the log and
in the index, as one naming a version with no folder is. Found by a tester
(repro_traffic_failed_version): `weights = {"3" = 1}` with a broken version 3 sent every request
to version 2 (weight 0), and neither the log nor the index said so: the warning was taken from
the versions the policy selects, before any loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_models import scale_model, served_with_traffic

pytestmark = pytest.mark.timeout(60)

BROKEN = b"not an onnx file"


def load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, traffic: str
) -> tuple[float, dict[str, str], list[str]]:
    """Versions 1 and 2 served, 3 broken, with `traffic`: which answered, the index's reasons,
    and the load's warnings about traffic."""
    models = {1: scale_model(1), 2: scale_model(2), 3: BROKEN}
    return served_with_traffic(tmp_path, models, traffic, caplog, "[traffic]")


def test_weights_naming_only_a_version_that_failed_say_where_requests_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    answered, reasons, [warning] = load(tmp_path, caplog, 'weights = { "3" = 1 }\n')
    assert answered == 2.0
    assert (
        "[traffic] weights names version(s) 3, not served (version(s) 3 did not load; " in warning
    )
    assert "every request naming no version goes to version 2, the highest served" in warning
    assert reasons["1"] == reasons["2"] == warning.removeprefix("model m: ")
    assert "ONNX Runtime cannot load it" in reasons["3"]  # (its own failure, as before)


def test_a_shadow_that_failed_gets_no_copies_and_the_index_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, reasons, [warning] = load(tmp_path, caplog, 'shadow = { "3" = 0.5 }\n')
    assert "[traffic] shadow names version(s) 3, not served" in warning
    assert warning.endswith("they get no copies.")
    assert reasons["2"] == warning.removeprefix("model m: ")
