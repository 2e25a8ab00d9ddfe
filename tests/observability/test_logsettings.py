"""The log settings API: `LogSettings` on a private logger, then tritonclient on both protocols."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, start_server, stop_server
from repo_models import scale_model, write_version
from tritonclient.utils import InferenceServerException

from duetime.config import ServerSettings
from duetime.errors import InvalidInput, NotAllowed
from duetime.observability.logs import TEXT_LINE, JsonFormatter, TextFormatter
from duetime.observability.logsettings import FORMATS, LogSettings


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("duetime.test-log-settings")
    logger.setLevel(logging.INFO)
    yield logger
    logger.setLevel(logging.NOTSET)


def test_the_settings_start_from_the_loggers_level(logger: logging.Logger) -> None:
    assert LogSettings(logger).current() == {
        "log_file": "", "log_info": True, "log_warning": True, "log_error": True,
        "log_verbose_level": 0, "log_format": "default",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "level"),
    [
        ({"log_verbose_level": 1}, logging.DEBUG),
        ({"log_info": False}, logging.WARNING),
        ({"log_info": False, "log_warning": False}, logging.ERROR),
        ({"log_info": False, "log_warning": False, "log_error": False}, logging.CRITICAL + 10),
        ({"log_info": None}, logging.INFO),  # None leaves a setting as it is
    ],
    ids=str,
)
def test_the_switches_set_the_level(
    logger: logging.Logger, changes: dict[str, Any], level: int
) -> None:
    settings = LogSettings(logger)
    after = settings.update(changes)
    assert logger.level == level
    assert all(after[k] == v for k, v in changes.items() if v is not None)
    settings.close()
    assert logger.level == logging.INFO


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"log_colour": True}, "unknown log setting 'log_colour'"),
        ({"log_info": "yes"}, "'log_info': expected true or false"),
        ({"log_verbose_level": True}, "'log_verbose_level': expected an integer"),
        (
            {"log_verbose_level": -1},
            "'log_verbose_level': expected an integer from 0 to 4294967295",
        ),
        (
            {"log_verbose_level": 2**40},
            "expected an integer from 0 to 4294967295, got 1099511627776",
        ),
        (  # (2**70 in a JSON body: read as a float; "an integer >= 0" was no help)
            {"log_verbose_level": float(2**70)},
            "'log_verbose_level': expected an integer from 0 to 4294967295, got 1.18",
        ),
        ({"log_format": "json"}, "'log_format': expected one of default, ISO8601"),
        ({"log_warning": False}, "log_verbose_level is on but log_warning off"),
        ({"log_file": "/no/such/folder/x.log"}, "needs its control token"),
    ],
    ids=str,
)
def test_bad_settings_change_nothing(
    logger: logging.Logger, changes: dict[str, Any], needle: str
) -> None:
    settings = LogSettings(logger)
    before = settings.current()
    with pytest.raises((InvalidInput, NotAllowed), match=re.escape(needle)):
        settings.update({"log_verbose_level": 1, **changes})
    assert settings.current() == before
    assert logger.level == logging.INFO


def test_a_log_file_takes_the_place_of_stderr_in_its_format(
    logger: logging.Logger, tmp_path: Path
) -> None:
    settings = LogSettings(logger)
    path = tmp_path / "server.log"
    with pytest.raises(NotAllowed, match="needs its control token"):
        settings.update({"log_file": str(path)})  # a caller without the token
    with pytest.raises(InvalidInput, match="'log_file': cannot open"):
        settings.update({"log_file": str(tmp_path / "no" / "x.log")}, files=True)
    with pytest.raises(InvalidInput, match="'log_file': cannot open"):
        settings.update({"log_file": str(tmp_path / "x\0.log")}, files=True)
    settings.update({"log_file": str(path), "log_format": "ISO8601"}, files=True)
    assert not logger.propagate
    logger.warning("into the file")
    settings.update({"log_file": ""})
    assert logger.propagate
    logger.warning("not into the file")
    (line,) = path.read_text().splitlines()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ WARNING duetime.test-log-settings: into the file", line
    )


def test_iso8601_stamps_the_servers_stderr_lines_too(logger: logging.Logger) -> None:
    """Only a log file's lines took it, and a file needs the control token: on a server without
    one, "ISO8601" was accepted and changed nothing (found by a tester)."""
    root = logging.getLogger()
    stderr = logging.StreamHandler()
    plain = TextFormatter(TEXT_LINE)  # (as configure_logging does)
    stderr.setFormatter(plain)
    root.addHandler(stderr)
    settings = LogSettings(logger)
    record = logging.makeLogRecord({"name": "duetime.x", "levelname": "INFO", "msg": "hello"})
    iso = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ INFO duetime.x: hello"
    try:
        settings.update({"log_format": "ISO8601"})
        assert re.fullmatch(iso, stderr.format(record))
        settings.update({"log_format": "default"})
        assert stderr.formatter is plain
        settings.update({"log_format": "ISO8601"})
    finally:
        settings.close()
        root.removeHandler(stderr)
    assert stderr.formatter is plain  # (put back as the server stops)
    assert not re.fullmatch(iso, stderr.format(record))


def test_a_log_file_gets_json_lines_while_the_server_logs_json(
    logger: logging.Logger, tmp_path: Path
) -> None:
    """With --log-format json, a file set through the log settings got plain-text lines."""
    root = logging.getLogger()
    stderr = logging.StreamHandler()
    stderr.setFormatter(JsonFormatter())  # (as configure_logging does for --log-format json)
    root.addHandler(stderr)
    settings = LogSettings(logger)
    path = tmp_path / "server.log"
    try:
        for form in FORMATS:
            settings.update({"log_file": str(path), "log_format": form}, files=True)
            logger.warning("into the file as JSON", extra={"status": 503})
    finally:
        settings.close()
        root.removeHandler(stderr)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == len(FORMATS)
    for line in lines:
        assert line["message"] == "into the file as JSON"
        assert (line["level"], line["logger"], line["status"]) == ("warning", logger.name, 503)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("repo")
    write_version(repo, "m", 1, scale_model(2))
    running, thread = start_server(ServerSettings(model_repository=repo, http_port=0, grpc_port=0))
    yield running
    stop_server(running, thread)
    assert logging.getLogger("duetime").level == logging.NOTSET  # put back at stop


def test_tritonclient_reads_and_updates_the_log_settings(server: RunningServer) -> None:
    http = httpclient.InferenceServerClient(server.http)
    grpc = grpcclient.InferenceServerClient(server.grpc)
    try:
        assert http.get_log_settings()["log_format"] == "default"
        updated = http.update_log_settings({"log_info": True, "log_verbose_level": 2})
        assert updated["log_verbose_level"] == 2
        assert logging.getLogger("duetime").level == logging.DEBUG
        seen = grpc.get_log_settings(as_json=True)["settings"]
        assert seen["log_verbose_level"] == {"uint32_param": 2}
        assert seen["log_info"] == {"bool_param": True}
        after = grpc.update_log_settings({"log_verbose_level": 0}, as_json=True)["settings"]
        assert "uint32_param" not in after["log_verbose_level"] or (
            after["log_verbose_level"]["uint32_param"] == 0
        )
        assert logging.getLogger("duetime").level == logging.INFO
        with pytest.raises(InferenceServerException, match="unknown log setting 'x'"):
            http.update_log_settings({"x": 1})
        with pytest.raises(InferenceServerException, match="log_format"):
            grpc.update_log_settings({"log_format": "json"})
        # gRPC carries the level as a uint32: a larger one over HTTP is refused, not kept to
        # break the gRPC answer.
        with pytest.raises(InferenceServerException, match="from 0 to 4294967295"):
            http.update_log_settings({"log_verbose_level": 2**40})
        assert grpc.get_log_settings(as_json=True)["settings"]["log_info"] == {"bool_param": True}
    finally:
        http.close()
        grpc.close()


def test_a_pipe_is_refused_as_a_log_file_and_a_failing_one_is_let_go(
    logger: logging.Logger, tmp_path: Path
) -> None:
    """Found by a tester: a FIFO opened as the log file held the whole server until something
    read it; a log file whose flush failed (its reader gone) made the next change a 500."""
    import os

    settings = LogSettings(logger)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InvalidInput, match="'log_file': cannot open"):
        settings.update({"log_file": str(fifo)}, files=True)  # (returns: no reader waited for)
    settings.update({"log_file": str(tmp_path / "a.log")}, files=True)
    handler = settings._handler
    assert handler is not None

    def broken() -> None:
        raise BrokenPipeError(32, "Broken pipe")

    handler.flush = broken  # type: ignore[method-assign]
    settings.update({"log_file": str(tmp_path / "b.log")}, files=True)
    assert settings.current()["log_file"] == str(tmp_path / "b.log")
    settings.close()


def test_a_deeply_nested_value_is_refused_and_quoted_short(logger: logging.Logger) -> None:
    """Found by a tester: 1,000 nested lists raised RecursionError quoting them (a 500), and a
    20 MB list was quoted whole (a 30 MB error)."""
    nested: list[Any] = []
    for _ in range(1000):
        nested = [nested]
    settings = LogSettings(logger)
    for value in (nested, [0] * 1_000_000):
        with pytest.raises(InvalidInput) as raised:
            settings.update({"log_info": value})
        assert len(raised.value.message) < 300
