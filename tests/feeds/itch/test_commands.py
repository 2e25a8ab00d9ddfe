"""`duetime itch ...` on bad paths: one line on stderr and an exit status, never a traceback,
and an output that cannot be written is found before the input is read. With `--log-format json`
that line, and the notes of a run that went on, are JSON records like the logs'."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from duetime.cli import main
from duetime.feeds.itch.synth import write_session
from duetime.feeds.itch.writer import ItchWriter

FULL = Path("/dev/full")
"""Writes fail there with ENOSPC: an output that passes the checks and still cannot be written."""
needs_full = pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full")


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("itch") / "session.itch"
    write_session(path, seed=5, messages=1500)
    return path


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file whose first frame is malformed: reading it at all ends the command with 1."""
    path = tmp_path_factory.mktemp("itch") / "damaged.itch"
    with ItchWriter(path) as writer:
        writer.write_body(b"Z" + bytes(10))
    return path


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        ("book", "--json"),
        ("run", "--json"),
        ("run", "--predictions"),
        ("listen", "--json"),
        ("listen", "--predictions"),
    ],
)
def test_an_output_that_is_a_folder_is_refused_before_anything_is_read(
    tmp_path: Path, damaged: Path, capsys: pytest.CaptureFixture[str], command: str, flag: str
) -> None:
    # the input is damaged (read, it would end the run with 1) and the repository missing (a
    # model load would fail): 2 and the output named show the check came first
    source = ["--udp", "127.0.0.1:0"] if command == "listen" else [str(damaged)]
    model = [] if command == "book" else ["--model", "orderbook", "--repository", "/nowhere"]
    assert main(["itch", command, *source, *model, flag, str(tmp_path)]) == 2
    assert one_line(capsys) == (
        f"duetime itch {command}: {flag} {tmp_path}: is a directory; give a file name\n"
    )


def test_an_output_in_a_folder_that_is_a_file_is_refused(
    tmp_path: Path, damaged: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = blocker / "o.json"
    assert main(["itch", "book", str(damaged), "--json", str(out)]) == 2
    assert one_line(capsys) == f"duetime itch book: --json {out}: {blocker} is not a folder\n"


def test_missing_folders_of_an_output_are_made(
    tmp_path: Path, session: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "folder" / "o.json"
    assert main(["itch", "book", str(session), "--json", str(out)]) == 0
    assert out.read_text().startswith('{"market"')


@needs_full
def test_book_says_in_one_line_that_the_summary_could_not_be_written(
    session: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["itch", "book", str(session), "--json", str(FULL)]) == 1
    assert one_line(capsys) == (
        "duetime itch book: --json /dev/full: cannot write it: No space left on device\n"
    )


@needs_full
def test_run_reports_outputs_it_could_not_write_and_exits_1(
    session: Path, demo_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["itch", "run", str(session), "--model", "orderbook", "--repository",
                 str(demo_repo), "--pace", "max", "--deadline-us", "1000000", "-q",
                 "--predictions", str(FULL), "--json", str(FULL)])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines() == [
        "duetime itch run: --predictions /dev/full: cannot write it: No space left on device",
        "duetime itch run: --json /dev/full: cannot write it: No space left on device",
    ]


def test_synth_checks_its_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["itch", "synth", str(tmp_path), "--messages", "100"]) == 2
    assert one_line(capsys) == (
        f"duetime itch synth: FILE {tmp_path}: is a directory; give a file name\n"
    )
    if FULL.exists():
        assert main(["itch", "synth", str(FULL), "--messages", "100000"]) == 1
        assert one_line(capsys) == (
            "duetime itch synth: FILE /dev/full: cannot write it: No space left on device\n"
        )


@pytest.mark.parametrize("command", ["book", "run", "send"])
def test_an_input_that_is_a_folder_is_named_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    options = {
        "book": ["--json", str(tmp_path / "o.json")],
        "run": ["--model", "orderbook"],
        "send": ["--udp", "127.0.0.1:9"],
    }[command]
    assert main(["itch", command, str(tmp_path), *options]) == 2
    assert one_line(capsys) == f"duetime itch {command}: {tmp_path}: is a directory, not a file\n"
    assert main(["itch", command, str(tmp_path / "none.itch"), *options]) == 2
    assert one_line(capsys) == f"duetime itch {command}: {tmp_path / 'none.itch'}: no such file\n"


@pytest.mark.parametrize(
    ("option", "error"),
    [
        (["--messages", "5"], "messages must be at least 68, got 5"),
        (["--rate", "0"], "rate must be a finite positive number of messages a second, got 0.0"),
        (["--rate", "nan"], "rate must be a finite positive number of messages a second, got nan"),
        (["--rate", "inf"], "rate must be a finite positive number of messages a second, got inf"),
    ],
)
def test_synth_refuses_bad_numbers_before_making_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str], error: str
) -> None:
    path = tmp_path / "s.itch"
    assert main(["itch", "synth", str(path), *option]) == 2
    assert one_line(capsys) == f"duetime itch synth: {error}\n"
    assert not path.exists()


@pytest.mark.parametrize(
    ("command", "flag"),
    [("book", "--json"), ("run", "--json"), ("run", "--predictions")],
)
def test_an_output_that_is_the_input_is_refused_and_the_input_kept(
    tmp_path: Path, session: Path, capsys: pytest.CaptureFixture[str], command: str, flag: str
) -> None:
    """Found by a tester: `run FILE --predictions FILE` emptied the ITCH file before reading
    it (and exited 0); `--json FILE` replaced it with the report. Also through a link."""
    copy = tmp_path / "copy.itch"
    copy.write_bytes(session.read_bytes())
    link = tmp_path / "link.itch"
    link.symlink_to(copy)
    model = [] if command == "book" else ["--model", "orderbook", "--repository", "/nowhere"]
    for output in (copy, link):
        assert main(["itch", command, str(copy), *model, flag, str(output)]) == 2
        assert one_line(capsys) == (
            f"duetime itch {command}: {flag} {output}: is the file read ({copy}), which "
            "writing it would destroy; give another file name\n"
        )
    assert copy.read_bytes() == session.read_bytes()
    both, model = tmp_path / "both", ["--model", "orderbook", "--repository", "/nowhere"]
    assert main(["itch", "run", str(copy), *model, "--json", str(both),
                 "--predictions", str(both)]) == 2  # fmt: skip
    assert one_line(capsys) == (
        f"duetime itch run: --predictions {both}: is the --json file too; give each its own "
        "file name\n"
    )


@pytest.mark.parametrize(
    ("command", "option", "value", "wanted"),
    [
        ("run", "--speed", "nan", "a finite number >= 0.001"),
        ("run", "--speed", "0", "a finite number >= 0.001"),
        ("run", "--deadline-us", "inf", "a finite number >= 0.001"),
        ("run", "--deadline-us", "1e-9", "a finite number >= 0.001"),
        ("run", "--max-gap-ms", "-1", "a finite number >= 0 and <= 86400000"),
        ("run", "--max-gap-ms", "nan", "a finite number >= 0 and <= 86400000"),
        ("run", "--delivery-margin-us", "-100", "a whole number >= 0 and <= 10000000"),
        ("listen", "--idle-s", "nan", "a finite number > 0"),
        ("listen", "--idle-s", "-1", "a finite number > 0"),
        ("listen", "--deadline-us", "nan", "a finite number >= 0.001"),
        ("listen", "--cpu-dma-latency-us", "-1", "a whole number >= 0 and <= 2147483647"),
        ("send", "--speed", "nan", "a finite number >= 0.001"),
        ("send", "--max-gap-ms", "inf", "a finite number >= 0 and <= 86400000"),
        # (T70: these passed and overflowed later, with a traceback: --max-gap-ms 1e308 in
        # int(), --every 2**63 in the compiled path's int64 tables, --speed 1e-300 in its
        # replay times; --per-packet 0 was refused only as sending began, as `per_packet`)
        ("run", "--max-gap-ms", "1e308", "a finite number >= 0 and <= 86400000"),
        ("send", "--max-gap-ms", "1e308", "a finite number >= 0 and <= 86400000"),
        ("run", "--max-gap-ms", "86400001", "a finite number >= 0 and <= 86400000"),
        ("run", "--speed", "1e-300", "a finite number >= 0.001"),
        ("send", "--speed", "1e-300", "a finite number >= 0.001"),
        ("run", "--every", str(2**63), "a whole number >= 1 and <= 9223372036854775807"),
        ("listen", "--every", str(2**63), "a whole number >= 1 and <= 9223372036854775807"),
        ("run", "--every", "0", "a whole number >= 1 and <= 9223372036854775807"),
        ("send", "--per-packet", "0", "a whole number >= 1 and <= 65534"),
        ("send", "--per-packet", "65535", "a whole number >= 1 and <= 65534"),
    ],
)
def test_numbers_out_of_range_nan_or_infinite_are_refused_naming_the_option(
    session: Path, capsys: pytest.CaptureFixture[str], command: str, option: str, value: str,
    wanted: str,
) -> None:  # fmt: skip
    """Found by a tester: `run --speed nan` refused every request and exited 0, and NaN or
    infinite deadlines, gaps and idle times ended in a traceback from int()."""
    options = {
        "run": [str(session), "--model", "orderbook", "--repository", "/nowhere"],
        "listen": ["--udp", "127.0.0.1:0", "--model", "orderbook", "--repository", "/nowhere"],
        "send": [str(session), "--udp", "127.0.0.1:9"],
    }[command]
    with pytest.raises(SystemExit) as exited:
        main(["itch", command, *options, option, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: expected {wanted}, got '{value}'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("option", "error"),
    [
        (["--symbols", ",,,"], "--symbols: expected comma-separated stock names, got ',,,'"),
        (["--target", ""], "--target: expected HOST:PORT, got an empty one"),
    ],
)
def test_empty_symbols_and_targets_are_refused(
    session: Path, capsys: pytest.CaptureFixture[str], option: list[str], error: str
) -> None:
    """An empty --target left grpc waiting for good after its error."""
    assert main(["itch", "run", str(session), "--model", "orderbook", *option]) == 2
    assert one_line(capsys) == f"duetime itch run: {error}\n"


@pytest.mark.parametrize("command", ["run", "listen", "send"])
def test_a_negative_limit_is_refused(
    session: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """run took no message at all and said nothing; send failed on islice's own wording."""
    options = {
        "run": [str(session), "--model", "orderbook", "--repository", "/nowhere"],
        "listen": ["--udp", "127.0.0.1:0", "--model", "orderbook", "--repository", "/nowhere"],
        "send": [str(session), "--udp", "127.0.0.1:9"],
    }[command]
    assert main(["itch", command, *options, "--limit", "-1"]) == 2
    assert one_line(capsys) == f"duetime itch {command}: --limit must be 0 or more, got -1\n"


@pytest.fixture
def root_logging() -> Iterator[None]:
    """The root logger as it was (`main` sets its handler as --log-format says)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def json_records(capsys: pytest.CaptureFixture[str]) -> list[dict[str, str]]:
    lines = capsys.readouterr().err.splitlines()
    assert lines
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
@pytest.mark.parametrize("command", ["synth", "run", "listen", "send", "book"])
@pytest.mark.usefixtures("root_logging")
def test_json_logs_take_the_commands_own_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, before: bool
) -> None:
    """They were printed as plain text whatever --log-format said."""
    argv = {
        "synth": [str(tmp_path)],
        "run": [str(tmp_path), "--model", "orderbook"],
        "listen": ["--udp", "nowhere", "--model", "orderbook"],
        "send": [str(tmp_path), "--udp", "127.0.0.1:9"],
        "book": [str(tmp_path), "--json", str(tmp_path / "o.json")],
    }[command]
    flag = ["--log-format", "json"]
    assert main([*flag, "itch", command, *argv] if before else ["itch", command, *argv, *flag]) == 2
    [record] = json_records(capsys)
    assert (record["level"], record["logger"]) == ("error", "duetime")
    assert record["message"].startswith(f"duetime itch {command}: ")


@pytest.mark.usefixtures("root_logging")
def test_json_logs_take_a_runs_notes_as_warnings(
    tmp_path: Path, damaged: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.json"
    argv = ["itch", "book", str(damaged), "--on-error", "skip", "--json", str(out)]
    assert main([*argv, "--log-format", "json"]) == 0
    records = json_records(capsys)
    assert {record["level"] for record in records} == {"warning"}
    assert all(record["message"].startswith("duetime itch book: ") for record in records)
