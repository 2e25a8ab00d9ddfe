"""A pipe as the ITCH file (`<(zcat day.gz)`, /dev/stdin): `itch book`, `itch run` and `itch send`
read it once, front to back, where they refused it as "not a regular file"; a directory, a
missing file and a socket keep their clear errors."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from duetime.cli import main
from duetime.feeds.itch import book_command
from duetime.feeds.itch.moldudp import decode_packet
from duetime.feeds.itch.parser import file_problem
from duetime.feeds.itch.synth import session_bytes

pytestmark = pytest.mark.timeout(120)  # (a command that opened the pipe twice would hang)

MESSAGES = 2000


@pytest.fixture(scope="module")
def day() -> bytes:
    return session_bytes(seed=5, messages=MESSAGES)


@contextlib.contextmanager
def pipe_of(folder: Path, data: bytes) -> Iterator[Path]:
    """A FIFO that a thread writes `data` into once, as `zcat day.gz` would: a second open
    for reading would wait for a writer that never comes."""
    path = folder / "feed.fifo"
    os.mkfifo(path)

    def write() -> None:
        with contextlib.suppress(BrokenPipeError), open(path, "wb") as pipe:
            pipe.write(data)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        yield path
    finally:
        if writer.is_alive():  # never opened (a refusal): open it, for the writer to go
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(10)


def test_a_pipe_or_character_device_is_a_stream_the_rest_keep_their_errors(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    plain = tmp_path / "day.itch"
    plain.write_bytes(b"")
    assert file_problem(fifo) is None
    assert file_problem(os.devnull) is None  # (a character device)
    assert file_problem(plain) is None
    assert file_problem(tmp_path) == "is a directory, not a file"
    assert file_problem(tmp_path / "none.itch") == "no such file"
    assert file_problem(plain / "x") == "no such file"  # (a path through a file)
    with socket.socket(socket.AF_UNIX) as unix:
        path = tmp_path / "s"
        if len(str(path)) > 100:  # (sun_path holds 108 bytes)
            pytest.skip("the temporary folder's path is too long for a unix socket")
        unix.bind(str(path))
        assert file_problem(path) == "is not a regular file, a pipe or a character device"


@pytest.mark.parametrize("engine", ["python", "auto", "numba"])
@pytest.mark.parametrize("compressed", [False, True], ids=["raw", "gzip"])
def test_book_reads_a_pipe_once_and_writes_the_file_s_summary(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    day: bytes,
    engine: str,
    compressed: bool,
) -> None:
    """auto streams a pipe (its size is unknown before it is read, and it reads once); numba
    reads it whole, once."""
    if engine == "numba":
        pytest.importorskip("numba")
    data = gzip.compress(day, mtime=0) if compressed else day
    plain = tmp_path / "day.itch"
    plain.write_bytes(data)
    want = tmp_path / "want.json"
    assert main(["itch", "book", str(plain), "--json", str(want), "--engine", "python"]) == 0
    if engine == "auto":  # (a regular file this size would take the compiled pass)
        monkeypatch.setattr(book_command, "FAST_MIN_BYTES", 0)

        def refused(*args: object, **kwargs: object) -> None:
            raise AssertionError("auto gave a pipe to the whole-file pass")

        monkeypatch.setattr("duetime.feeds.itch.parser.read_stream", refused)
        monkeypatch.setattr(book_command, "_has_numba", lambda: True)
    out = tmp_path / "out.json"
    with pipe_of(tmp_path, data) as fifo:
        code = main(["itch", "book", str(fifo), "--json", str(out), "--engine", engine])
    assert (code, capsys.readouterr().err) == (0, "")
    assert out.read_bytes() == want.read_bytes()


def test_run_reads_a_pipe_on_the_python_path_and_numba_says_why_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], demo_repo: Path, day: bytes
) -> None:
    """`itch run` falls back from the compiled path for a non-regular file (auto); only the
    file check stood in its way."""
    common = ["--model", "orderbook", "--repository", str(demo_repo), "--pace", "max",
              "--deadline-us", "200000", "-q"]  # fmt: skip
    for engine in ("python", "auto"):
        report = tmp_path / f"{engine}.json"
        with pipe_of(_mkdir(tmp_path / engine), day) as fifo:
            argv = ["itch", "run", str(fifo), *common, "--engine", engine, "--json", str(report)]
            assert main(argv) == 0, capsys.readouterr().err
        stats = json.loads(report.read_text(encoding="utf-8"))
        assert stats["messages"] == MESSAGES
        assert stats["triggers"] > 0
    pytest.importorskip("numba")
    with pipe_of(_mkdir(tmp_path / "numba"), day) as fifo:
        assert main(["itch", "run", str(fifo), *common, "--engine", "numba"]) == 1
    err = capsys.readouterr().err
    assert "--engine numba" in err
    assert "not a regular file" in err


def test_send_reads_a_pipe(tmp_path: Path, day: bytes) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver:
        receiver.bind(("127.0.0.1", 0))
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        host, port = receiver.getsockname()
        with pipe_of(tmp_path, day) as fifo:
            argv = ["itch", "send", str(fifo), "--udp", f"{host}:{port}", "--pace", "max"]
            assert main(argv) == 0
        receiver.settimeout(5)
        received = 0
        while not (packet := decode_packet(receiver.recv(2048))).is_end_of_session:
            received += len(packet.messages)
    assert received == MESSAGES


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path
