"""What a newcomer meets first: the demo never overwrites their files, a misplaced model file or an
empty repository is said so, the ready line tells the truth, a bad variable is named, and an
`Engine.open` engine loads models without an event loop."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from repo_models import scale_model, write_version

from duetime import Engine
from duetime.cli import main
from duetime.config import server_settings
from duetime.demo import write_demo_repository
from duetime.errors import ConfigError, NotAllowed
from duetime.repository.layout import scan_repository
from duetime.repository.manager import RepositoryOptions
from tests.test_cli import serving


def _users_mlp(root: Path) -> tuple[bytes, str]:
    (root / "mlp" / "1").mkdir(parents=True)
    mine = b"my own model bytes"
    (root / "mlp" / "1" / "model.onnx").write_bytes(mine)
    (root / "mlp" / "config.toml").write_text("# mine\nmax_batch_size = 8\n")
    return mine, "# mine\nmax_batch_size = 8\n"


def test_demo_command_refuses_to_overwrite_a_users_files_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`duetime demo PATH` replaced a user's own PATH/mlp (model and config) and exited 0."""
    from duetime.demo import demo_files

    mine, config = _users_mlp(tmp_path)
    assert main(["demo", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "mlp" / "1" / "model.onnx") in err
    assert str(tmp_path / "mlp" / "config.toml") in err
    assert "--force" in err
    assert (tmp_path / "mlp" / "1" / "model.onnx").read_bytes() == mine
    assert (tmp_path / "mlp" / "config.toml").read_text() == config
    assert not (tmp_path / "resnet").exists()  # (nothing written)

    assert main(["demo", str(tmp_path), "--force"]) == 0
    files = demo_files()
    for relative, content in files.items():
        assert (tmp_path / relative).read_bytes() == content, relative


def test_demo_written_again_over_itself_is_fine(tmp_path: Path) -> None:
    from duetime.demo import DemoFilesChanged

    assert main(["demo", str(tmp_path)]) == 0
    assert main(["demo", str(tmp_path)]) == 0
    (tmp_path / "resnet" / "config.toml").write_text("max_batch_size = 2\n")
    with pytest.raises(DemoFilesChanged) as refused:
        write_demo_repository(tmp_path, on_change="refuse")
    assert refused.value.changed == [tmp_path / "resnet" / "config.toml"]


def test_serve_demo_keeps_changed_demo_files_and_writes_missing_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`serve --demo` rewrote the demo's configs at every start: the variants `duetime optimize`
    had added to them vanished."""
    from duetime.cli import _write_demo_cache
    from duetime.demo import write_demo_files

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = _write_demo_cache()
    assert capsys.readouterr().err == ""
    changed = root / "mlp" / "config.toml"
    changed.write_text(changed.read_text() + '\n[[variants]]\nfile = "1/model.fp16.onnx"\n')
    users = changed.read_text()
    (root / "resnet" / "1" / "model.onnx").unlink()
    assert _write_demo_cache() == root
    assert changed.read_text() == users
    assert (root / "resnet" / "1" / "model.onnx").is_file()
    err = capsys.readouterr().err
    assert err.count("\n") == 1  # (one warning)
    assert "kept mlp/config.toml" in err
    assert write_demo_files(root) == [changed]


def test_a_model_file_directly_in_the_repository_is_told_where_it_goes(tmp_path: Path) -> None:
    """`my_models/model.onnx` was told to serve the folder two levels up (/tmp, say)."""
    repo = tmp_path / "my_models"
    write_version(tmp_path, "my_models", 1, scale_model(2.0))
    (repo / "1" / "model.onnx").rename(repo / "model.onnx")
    with pytest.raises(ConfigError) as refused:
        scan_repository(repo)
    message = refused.value.message
    assert "two levels up" not in message
    assert f"{repo}/<model>/1/model.onnx" in message
    version = write_version(tmp_path / "repo", "m", 1, scale_model(2.0)).parent
    with pytest.raises(ConfigError, match="two levels up"):  # (a version folder: as before)
        scan_repository(version)


def test_a_repository_without_models_is_warned_of(tmp_path: Path) -> None:
    from duetime.repository.layout import no_models_warning

    assert no_models_warning(tmp_path, scan_repository(tmp_path)) == (
        f"model repository {tmp_path} holds no model (expected <model>/<version>/model.onnx, "
        f"such as {tmp_path}/mymodel/1/model.onnx)"
    )
    (tmp_path / "mymodel.onnx").write_bytes(scale_model(2.0))
    warning = no_models_warning(tmp_path, scan_repository(tmp_path))
    assert warning is not None
    assert "its file mymodel.onnx is not in a model folder" in warning
    write_version(tmp_path, "m", 1, scale_model(2.0))
    assert no_models_warning(tmp_path, scan_repository(tmp_path)) is None


def test_serving_an_empty_repository_warns_and_the_line_says_not_ready(tmp_path: Path) -> None:
    """An empty repository started with "duetime ready: ..." alone; every request then failed
    "served models: none"."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "mymodel.onnx").write_bytes(scale_model(2.0))
    with serving(tmp_path, str(repo), "--no-metrics") as server:
        assert server.line.endswith(" (not ready: no model is served)"), server.line
    assert f"model repository {repo} holds no model" in server.stderr
    assert "mymodel.onnx" in server.stderr


def test_the_ready_line_says_not_ready_while_a_model_failed_to_load(tmp_path: Path) -> None:
    """The line said "duetime ready" while /v2/health/ready said false."""
    repo = tmp_path / "repo"
    write_version(repo, "good", 1, scale_model(2.0))
    (repo / "bad" / "1").mkdir(parents=True)
    (repo / "bad" / "1" / "model.onnx").write_text("garbage")
    with (
        serving(tmp_path, str(repo), "--no-metrics") as server,
        pytest.raises(urllib.error.HTTPError),
    ):
        urllib.request.urlopen(f"http://{server.http}/v2/health/ready", timeout=10)
    line = server.line
    assert line.endswith(
        " (not ready: 1 model failed to load: bad; see the warnings above or the repository index)"
    ), line
    with serving(tmp_path, str(repo), "--strict-readiness", "false", "--no-metrics") as server:
        assert "not ready" not in server.line


def test_a_bad_environment_variable_is_named_not_a_flag() -> None:
    """DUETIME_HTTP_PORT=abc was reported as "(--http-port)", a flag never passed."""
    flags = {"http_port": "--http-port", "metrics": "--no-metrics"}
    for env, named in (
        ({"DUETIME_HTTP_PORT": "abc"}, "field 'http_port' (DUETIME_HTTP_PORT)"),
        ({"DUETIME_METRICS": "maybe"}, "field 'metrics' (DUETIME_METRICS)"),
    ):
        with pytest.raises(ConfigError) as refused:
            server_settings({}, env=env, flags=flags)
        assert named in refused.value.message
        assert "--" not in refused.value.message
    with pytest.raises(ConfigError, match=r"field 'http_port' \(--http-port\)"):
        server_settings({"http_port": "abc"}, env={"DUETIME_HTTP_PORT": "1"}, flags=flags)


def test_an_open_engine_loads_and_unloads_models_blocking(tmp_path: Path) -> None:
    """`engine.load_model("m")` on an `open()` engine returned a coroutine nobody awaited: nothing
    loaded, and a refusal was never raised."""
    write_version(tmp_path, "m", 1, scale_model(3.0))
    with Engine.open(tmp_path) as engine:
        with pytest.raises(NotAllowed):
            engine.load_model("m")  # (refused by the call itself: no coroutine left behind)
        with pytest.raises(NotAllowed):
            engine.unload_model("m")
        with pytest.raises(NotAllowed):
            engine.load_model_blocking("m")
    options = RepositoryOptions(control_mode="explicit")
    with Engine.open(tmp_path, options=options) as engine:
        engine.load_model_blocking("m")
        y = engine.infer("m", {"x": np.ones((1, 4), np.float32)})["y"]
        np.testing.assert_array_equal(y, np.full((1, 4), 3.0, np.float32))
        engine.unload_model_blocking("m")
        assert not engine.repository_index(ready_only=True)
        asyncio.run(engine.load_model("m"))  # (the awaited form still works from another loop)
        assert engine.repository_index(ready_only=True)


def test_the_blocking_load_is_refused_on_a_started_engine(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(3.0))

    async def scenario() -> None:
        engine = await Engine.start(tmp_path, options=RepositoryOptions(control_mode="explicit"))
        try:
            with pytest.raises(RuntimeError, match="await load_model"):
                engine.load_model_blocking("m")
            await engine.load_model("m")
        finally:
            await engine.aclose()

    asyncio.run(scenario())


def test_a_run_without_answers_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """`duetime itch run` printed "tick-to-prediction µs: p50 None p99 None" with no answer."""
    from duetime.feeds.itch.cli import _print_report

    none = {"p50": None, "p99": None, "p999": None, "max": None}
    report = {
        "tick_to_prediction_us": none, "pace_lag_us": none, "refused_unasked": 0,
        "model": "orderbook", "deadline_us": 500.0, "pace": "asap", "messages": 3,
        "book_events": 2, "triggers": 2, "messages_per_s": 10.0, "wall_s": 0.3, "on_time": 0,
        "late_dropped": 0, "refused": 2, "errors": 0, "unanswered": 0, "first_error": None,
        "engine": "python",
    }  # fmt: skip
    _print_report(report)
    out = capsys.readouterr().out
    assert "tick-to-prediction µs: no answers" in out
    assert "None" not in out


def test_capture_show_labels_requests_without_an_outcome() -> None:
    """`duetime capture show` printed "status: 0 5", 0 meaning no outcome recorded."""
    from collections import Counter

    from duetime.tools.capture.cli import _Summary

    summary = _Summary()
    summary.statuses = Counter({0: 5, 200: 1})
    assert summary.lines()[-1] == "status: no outcome 5, 200 1"
