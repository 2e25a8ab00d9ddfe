"""`duetime serve --load-model` with a name it cannot load: a usage error (exit 2, one line naming
the flag and the value), not a traceback (exit 1) nor a server started without the model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo_models import scale_model, write_version

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../a", "model name '../a' is not valid"),
        (".a", "model name '.a' is not valid"),
        ("typo", "no model folder of that name in the repository"),
    ],
)
def test_a_startup_model_it_cannot_load_is_a_usage_error(
    tmp_path: Path, name: str, why: str
) -> None:
    repo = tmp_path / "repo"
    write_version(repo, "a", 1, scale_model(1))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    done = subprocess.run(
        [
            sys.executable, "-m", "duetime", "serve", str(repo), "--http-port", "0",
            "--grpc-port", "0", "--no-metrics", "--model-control-mode", "explicit",
            "--load-model", "a", "--load-model", name,
        ],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=45,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(
        f"duetime: server settings: field 'load_model' (--load-model {name!r}): {why}"
    ), done.stderr
