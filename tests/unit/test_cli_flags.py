"""The `duetime` command's flags, parsed in process: every server setting has a `serve` flag."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from duetime import cli
from duetime.config import ServerSettings, server_settings
from duetime.errors import ConfigError
from duetime.observability.logs import configure_logging, console

NO_FLAG = {"model_repository": "the positional REPO (or --model-repository)"}


def _subparser(name: str) -> argparse.ArgumentParser:
    commands = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = commands.choices[name]
    return parser


def test_every_server_setting_has_a_serve_flag() -> None:
    dests = {action.dest for action in _subparser("serve")._actions}
    missing = sorted(set(ServerSettings.model_fields) - dests - set(NO_FLAG))
    assert not missing, f"settings with no `duetime serve` flag: {missing}"


@pytest.mark.parametrize(
    ("flags", "setting", "value"),
    [
        (["--max-json-bytes", "4096"], "max_json_bytes", 4096),
        (["--max-header-bytes", "2048"], "max_header_bytes", 2048),
        (["--shutdown-grace-s", "0.5"], "shutdown_grace_s", 0.5),
        (["--unload-drain-secs", "2"], "unload_drain_secs", 2.0),
        (["--unload-drain-s", "3"], "unload_drain_secs", 3.0),  # (the -s spelling of --*-s)
        (["--gc-threshold", "1000"], "gc_threshold", 1000),
        (["--switch-interval-us", "100"], "switch_interval_us", 100),
        (["--loop-slice-us", "0"], "loop_slice_us", 0),
        (["--record", "a.cap"], "record_path", Path("a.cap")),
        (["--load-model", "a", "--load-model", "b"], "load_model", ("a", "b")),
        (["--no-tune-runtime"], "tune_runtime", False),
    ],
)
def test_serve_flags_reach_the_settings(flags: list[str], setting: str, value: object) -> None:
    args = cli._parser().parse_args(["serve", "repo", *flags])
    settings = server_settings(cli._setting_flags(args, Path("repo")), env={})
    assert getattr(settings, setting) == value
    assert settings.model_repository == Path("repo")


def test_flags_not_given_leave_the_environment_in_charge() -> None:
    args = cli._parser().parse_args(["serve", "repo"])
    env = {"DUETIME_SHUTDOWN_GRACE_S": "7", "DUETIME_MAX_JSON_BYTES": "2048"}
    settings = server_settings(cli._setting_flags(args, Path("repo")), env=env)
    assert settings.shutdown_grace_s == 7.0
    assert settings.max_json_bytes == 2048


@pytest.mark.parametrize(
    "command",
    [
        ["serve", "repo"],
        ["bench", "--http", "127.0.0.1:8000", "--model", "mlp"],
        ["replay", "a.cap", "--target", "http://127.0.0.1:8000"],
        ["capture", "show", "a.cap"],
        ["itch", "run", "day.itch", "--model", "orderbook"],
    ],
    ids=["serve", "bench", "replay", "capture-show", "itch-run"],
)
def test_log_flags_go_before_or_after_the_command(command: list[str]) -> None:
    after = cli._parser().parse_args([*command, "--log-format", "json", "--log-level", "info"])
    assert (after.log_format, after.log_level) == ("json", "info")
    before = cli._parser().parse_args(["--log-format", "json", "--log-level", "info", *command])
    assert (before.log_format, before.log_level) == ("json", "info")  # (not reset by the command)
    neither = cli._parser().parse_args(command)
    assert (neither.log_format, neither.log_level) == ("text", "warning")


def test_log_flags_have_their_variables_and_a_flag_wins(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # (they were warned of as naming no server setting, and ignored)
    monkeypatch.setenv("DUETIME_LOG_LEVEL", "INFO")
    monkeypatch.setenv("DUETIME_LOG_FORMAT", "json")
    args = cli._parser().parse_args(["serve", "repo"])
    assert (args.log_level, args.log_format) == ("info", "json")
    flagged = cli._parser().parse_args(["serve", "repo", "--log-level", "error"])
    assert (flagged.log_level, flagged.log_format) == ("error", "json")
    with caplog.at_level(logging.WARNING):
        server_settings({}, env=dict(os.environ))
    assert "names no server setting" not in caplog.text


@pytest.mark.usefixtures("restore_logging")
def test_a_log_variable_of_no_level_fails_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DUETIME_LOG_LEVEL", "loud")
    assert cli.main(["serve", "repo"]) == 2
    assert "DUETIME_LOG_LEVEL: expected one of debug, info, warning, error, got 'loud'" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("value", "demo"), [("1", True), ("true", True), ("0", False), ("", False), (None, False)]
)
def test_demo_has_its_variable(
    monkeypatch: pytest.MonkeyPatch, value: str | None, demo: bool
) -> None:
    if value is None:
        monkeypatch.delenv("DUETIME_DEMO", raising=False)
    else:
        monkeypatch.setenv("DUETIME_DEMO", value)
    assert cli._demo_from_env() is demo


def test_a_demo_variable_of_no_truth_value_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUETIME_DEMO", "maybe")
    with pytest.raises(ConfigError, match="DUETIME_DEMO: expected true or false"):
        cli._demo_from_env()


@pytest.mark.usefixtures("restore_logging")
def test_messages_on_stderr_are_json_records_in_json_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "environ", {})  # (no DUETIME_* setting of this shell)
    assert cli.main(["serve", str(tmp_path / "nowhere"), "--log-format", "json"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines
    records = [json.loads(line) for line in lines]
    assert records[-1]["level"] == "error"
    assert records[-1]["logger"] == "duetime"
    assert str(tmp_path / "nowhere") in records[-1]["message"]


@pytest.mark.usefixtures("restore_logging")
def test_messages_stay_plain_text_in_text_mode(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("error", "text")
    console("duetime: model 'a' not loaded: why", logging.WARNING)  # (shown whatever the level)
    assert capsys.readouterr().err == "duetime: model 'a' not loaded: why\n"


README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_serve_flag_is_in_the_readme() -> None:
    text = README.read_text(encoding="utf-8")
    flags = [o for a in _subparser("serve")._actions for o in a.option_strings if o != "--help"]
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*(?![\w-])", text))
    missing = [flag for flag in flags if flag.startswith("--") and flag not in named]
    assert not missing, f"`duetime serve` flags the README never names: {missing}"


def _renderings(default: object) -> set[str]:
    """How a help text may write `default`: 8000, 0.85, 64 MiB, auto."""
    if isinstance(default, str):
        return {default}
    assert isinstance(default, int | float)
    shown = {f"{default:g}", str(default)}  # (7200000 is 7.2e+06 to :g)
    for power, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if isinstance(default, int) and default and default % 1024**power == 0:
            shown.add(f"{default // 1024**power} {unit}")
    return shown


def test_serve_help_gives_each_settings_default() -> None:
    without = []
    for action in _subparser("serve")._actions:
        field = ServerSettings.model_fields.get(action.dest)
        default = None if field is None else field.default
        if default is None or isinstance(default, bool | tuple):
            continue  # (none, an on/off switch, a list)
        if not any(shown in (action.help or "") for shown in _renderings(default)):
            without.append(f"{action.option_strings[0]} (default {default})")
    assert not without, f"serve flags whose help omits the default: {without}"


def test_no_tune_runtime_says_all_it_leaves_alone() -> None:
    (action,) = [a for a in _subparser("serve")._actions if "--no-tune-runtime" in a.option_strings]
    assert "garbage collector" in (action.help or "")
    assert "switch interval" in (action.help or "")
    assert "time slice" in (action.help or "")


def test_optimize_measure_s_help_says_it_bounds_rounds() -> None:
    from duetime.tools.optimize.measure import MAX_TIMING_ROUNDS, MIN_TIMING_ROUNDS

    (action,) = [a for a in _subparser("optimize")._actions if "--measure-s" in a.option_strings]
    assert f"at least {MIN_TIMING_ROUNDS} and at most {MAX_TIMING_ROUNDS} rounds" in (
        action.help or ""
    )


@pytest.mark.parametrize(
    ("settings", "warned"),
    [
        ({"record_sample": 0.5, "record_outputs": True}, ["--record-outputs", "--record-sample"]),
        ({"record_buffer": 64}, ["--record-buffer"]),
        ({"metrics": False, "metrics_port": 5}, ["--metrics-port"]),
        ({"metrics": False}, []),
        ({"record_path": Path("a.cap"), "record_sample": 0.5}, []),
    ],
)
def test_settings_that_others_turn_off_are_warned_of(
    caplog: pytest.LogCaptureFixture, settings: dict[str, object], warned: list[str]
) -> None:
    # (they were ignored without a word, as --load-model without explicit mode is not)
    from duetime.server import Server

    with caplog.at_level(logging.WARNING, logger="duetime.server"):
        Server(ServerSettings(model_repository=Path("repo"), cpus="none", **settings))
    ignored = sorted(m.split()[0] for m in caplog.messages if "is ignored" in m)
    assert ignored == warned


@pytest.mark.parametrize(
    ("env", "flags", "warned"),
    [
        ({"DUETIME_METRICS": "false"}, {"metrics_port": 5},
         "--metrics-port is ignored: it only takes effect with metrics on (DUETIME_METRICS=false "
         "turns them off)"),
        ({"DUETIME_METRICS_PORT": "5"}, {"metrics": False},
         "DUETIME_METRICS_PORT=5 is ignored: it only takes effect with metrics on (--no-metrics "
         "turns them off)"),
        ({"DUETIME_METRICS": "true"}, {"metrics": False, "metrics_port": 5},
         "--metrics-port is ignored: it only takes effect with metrics on (--no-metrics turns "
         "them off)"),
    ],
)  # fmt: skip
def test_the_metrics_port_warning_names_what_turned_metrics_off(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
    flags: dict[str, object], warned: str,
) -> None:  # fmt: skip
    """Found by a tester: with DUETIME_METRICS=false, the warning said --metrics-port "is given
    with --no-metrics", a flag never passed."""
    from duetime.server import Server

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = server_settings({"model_repository": Path("repo"), "cpus": "none", **flags})
    with caplog.at_level(logging.WARNING, logger="duetime.server"):
        Server(settings)
    assert [m for m in caplog.messages if "is ignored" in m] == [warned]


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["serve", "repo"], "serve"),
        (["--log-level", "info", "bench", "--http", "x"], "bench"),
        (["--log-format=json", "itch", "run"], "itch"),
        (["--help"], None),
        ([], None),
    ],
)
def test_the_command_is_the_first_word_that_is_no_flag(
    argv: list[str], command: str | None
) -> None:
    assert cli._command_in(argv) == command


def test_only_the_tool_named_has_its_module_imported_for_its_flags() -> None:
    """Each tool's module imports much of the server: built for every command, the parser took
    1.0 s of the 1.4 s `duetime serve` with a bad flag took to say so."""
    probe = (
        "import sys\n"
        "from duetime import cli\n"
        "cli._parser(tools={'serve'})\n"
        "assert not [m for m in cli.TOOLS.values() if m in sys.modules], sys.modules.keys()\n"
        "commands = next(a for a in cli._parser(tools={'bench'})._actions if a.dest == 'command')\n"
        "assert '--model' in commands.choices['bench'].format_help()\n"
        "assert 'duetime.tools.loadgen' in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "argv",
    [["serve", ""], ["serve", "--model-repository", " "], ["serve", "--demo", "--record", ""]],
    ids=["repository", "model-repository", "record"],
)
def test_an_empty_path_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`Path('')` is the current folder: `serve ''` served it (every folder there a model that
    failed), and `--record ''` said the capture file '.' exists."""
    with pytest.raises(SystemExit) as ended:
        cli.main(argv)
    assert ended.value.code == 2
    assert "expected a path, got an empty one" in capsys.readouterr().err


@pytest.mark.parametrize("variable", ["DUETIME_RECORD_PATH", "DUETIME_MODEL_REPOSITORY"])
def test_an_empty_path_variable_is_refused(variable: str) -> None:
    setting = variable.removeprefix("DUETIME_").lower()
    with pytest.raises(ConfigError, match=f"field '{setting}'.*expected a path, got an empty one"):
        server_settings({}, env={variable: ""})


@pytest.mark.parametrize(
    ("settings", "warned"),
    [
        ({"repository_poll_secs": 1.0}, ["--repository-poll-secs"]),
        ({"repository_poll_secs": 1.0, "model_control_mode": "poll"}, []),
        (
            {"tune_runtime": False, "switch_interval_us": 500, "gc_threshold": 1000,
             "loop_slice_us": 0},
            ["--gc-threshold", "--loop-slice-us", "--switch-interval-us"],
        ),
        ({"switch_interval_us": 500, "gc_threshold": 1000}, []),
    ],
)  # fmt: skip
def test_poll_and_runtime_tuning_settings_with_no_effect_are_warned_of(
    caplog: pytest.LogCaptureFixture, settings: dict[str, object], warned: list[str]
) -> None:
    """Found by a tester: these were ignored without a word, where --record-sample without
    --record is warned of."""
    from duetime.server import Server

    with caplog.at_level(logging.WARNING, logger="duetime.server"):
        Server(ServerSettings(model_repository=Path("repo"), cpus="none", **settings))
    ignored = sorted(m.split()[0] for m in caplog.messages if "is ignored" in m)
    assert ignored == warned


def test_a_runtime_setting_with_no_effect_is_named_as_it_was_given(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from duetime.server import Server

    monkeypatch.setenv("DUETIME_TUNE_RUNTIME", "false")
    monkeypatch.setenv("DUETIME_GC_THRESHOLD", "1000")
    settings = server_settings({"model_repository": Path("repo"), "cpus": "none"})
    with caplog.at_level(logging.WARNING, logger="duetime.server"):
        Server(settings)
    assert [m for m in caplog.messages if "is ignored" in m] == [
        "DUETIME_GC_THRESHOLD=1000 is ignored: it only takes effect with runtime tuning on "
        "(DUETIME_TUNE_RUNTIME=false turns it off)"
    ]


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize(
    ("env", "flags", "message"),
    [
        ({"DUETIME_CPUS": "abc"}, [],
         "field 'cpus' (DUETIME_CPUS): 'abc' is not a CPU list"),
        ({}, ["--cpus", "abc"], "field 'cpus' (--cpus): 'abc' is not a CPU list"),
        ({"DUETIME_HOST": "bad!host"}, ["--http-port", "0"],
         "field 'host' (DUETIME_HOST): cannot listen on bad!host:0 (HTTP): "),
        ({"DUETIME_MODEL_CONTROL_MODE": "explicit", "DUETIME_LOAD_MODEL": "nosuch"}, [],
         "field 'load_model' (DUETIME_LOAD_MODEL 'nosuch'): no model folder of that name"),
    ],
)  # fmt: skip
def test_a_check_at_start_names_the_variable_or_flag_its_value_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    env: dict[str, str], flags: list[str], message: str,
) -> None:  # fmt: skip
    """Found by a tester: DUETIME_LOAD_MODEL=nosuch was blamed on --load-model, and a bad
    DUETIME_HOST or DUETIME_CPUS named no source at all (the host with the metrics port)."""
    for name in [n for n in os.environ if n.startswith("DUETIME_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = ["serve", str(tmp_path), "--no-metrics", "--grpc-port", "0", "--no-tune-runtime"]
    assert cli.main([*argv, *flags]) == 2
    assert message in capsys.readouterr().err
