"""What a model's load says of a `[traffic]` table naming versions not served: in the log and in
the repository index (as of a missing `[[variants]]` file), and truthfully.

Found by a tester (repro_traffic_warning_index): `shadow = {"7" = 0.1}` and `weights = {"9" =
50}` beside versions 1 and 2 were only logged, the index's reasons empty (what tooling reads,
`get_model_repository_index`); and with every weighted version missing, every request went to
version 2 while the warning said the missing versions "get no requests", nothing more.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_models import scale_model, served_with_traffic

pytestmark = pytest.mark.timeout(60)


def load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, traffic: str
) -> tuple[float, dict[str, str], list[str]]:
    """Versions 1 and 2 served with `traffic`: which answered a request naming no version, the
    index's reason for each version, and the load's warnings about traffic."""
    models = {version: scale_model(version) for version in (1, 2)}
    return served_with_traffic(tmp_path, models, traffic, caplog, "[traffic]")


def test_a_shadow_not_served_is_in_the_index(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, reasons, [warning] = load(tmp_path, caplog, 'shadow = { "7" = 0.1 }\n')
    said = "[traffic] shadow names version(s) 7, not served (version_policy serves 1, 2)"
    assert said in warning
    assert warning.endswith("they get no copies.")  # (not "no requests": it gets none anyway)
    assert reasons == {"1": warning.removeprefix("model m: "), "2": reasons["1"]}


def test_weights_naming_only_versions_not_served_say_where_requests_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    answered, reasons, [warning] = load(tmp_path, caplog, 'weights = { "9" = 50 }\n')
    assert answered == 2.0
    assert "[traffic] weights names version(s) 9, not served" in warning
    assert "every request naming no version goes to version 2" in warning
    assert "they get no requests" not in warning
    assert "every request naming no version goes to version 2" in reasons["1"]
    assert reasons["2"] == reasons["1"]


def test_weights_naming_a_served_version_too_say_the_others_get_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    answered, reasons, [warning] = load(tmp_path, caplog, 'weights = { "1" = 1, "9" = 50 }\n')
    assert answered == 1.0
    assert warning.endswith("not served (version_policy serves 1, 2): they get no requests.")
    assert reasons["1"] == warning.removeprefix("model m: ")
