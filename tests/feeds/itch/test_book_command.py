"""`duetime itch book`: the compiled pass and the streaming books write the same summary and say
the same on stderr, byte for byte, on generated sessions clean and damaged; `--engine auto`
takes the compiled pass whenever it can and streams where it cannot."""

from __future__ import annotations

import gc
import gzip
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("numba")

from duetime.cli import main
from duetime.feeds.itch import book_command
from duetime.feeds.itch.parser import KEPT_ERRORS, read_messages
from duetime.feeds.itch.synth import session_bytes
from duetime.feeds.itch.writer import encode, frame

MESSAGES = 20_000


def policy_damage(data: bytes, seed: int) -> bytes:
    """The session after a bad day: lost adds and deletes, repeated references, over-sized and
    zero-share executions, a locate of 0 (each a book anomaly of its own kind)."""
    rng = random.Random(seed)
    refs: list[int] = []
    out = []
    for message in read_messages(data):
        fields = message._asdict()
        kind = fields.pop("type")
        roll = rng.random()
        if kind in "AF":
            if roll < 0.02:
                continue  # lost: its executions and deletes name an unknown reference
            if roll < 0.04 and refs:
                fields["order_reference_number"] = rng.choice(refs)
            elif roll < 0.05:
                fields["shares"] = 0
            refs.append(fields["order_reference_number"])
            del refs[:-300]
        elif kind == "D" and roll < 0.02:
            continue
        elif kind == "E" and roll < 0.05:
            fields["executed_shares"] += 1000
        elif kind == "X" and roll < 0.05:
            fields["stock_locate"] = 0
        out.append(frame(encode(kind, **fields)))
    return b"".join(out)


def frame_damage(data: bytes) -> bytes:
    """Bad frames among good ones (an unknown type, a wrong length, a zero length) and a frame
    cut off at the end."""
    pos = 0
    for _ in range(500):  # the 500th frame
        pos += 2 + int.from_bytes(data[pos : pos + 2], "big")
    bad = frame(b"Z" + bytes(10)) + frame(b"D" + bytes(10)) + b"\x00\x00"
    return data[:pos] + bad + data[pos:] + data[:20]


def sessions() -> Iterator[tuple[str, bytes]]:
    clean = session_bytes(seed=11, messages=MESSAGES)
    yield "clean.itch", clean
    yield "clean.itch.gz", gzip.compress(clean, mtime=0)
    damaged = policy_damage(clean, seed=3)
    yield "policy.itch", damaged
    yield "frames.itch", frame_damage(damaged)
    yield "cut.itch.gz", gzip.compress(frame_damage(damaged), mtime=0)[:-5000]  # then the damage


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("book")
    paths = {}
    for name, data in sessions():
        paths[name] = folder / name
        paths[name].write_bytes(data)
    return paths


def book(
    path: Path, out: Path, capsys: pytest.CaptureFixture[str], *options: str
) -> tuple[int, str, bytes | None]:
    out.unlink(missing_ok=True)
    gc.collect()  # (an earlier test's garbage logs nothing into this command's stderr)
    code = main(["itch", "book", str(path), "--json", str(out), *options])
    return code, capsys.readouterr().err, out.read_bytes() if out.exists() else None


@pytest.mark.parametrize("name", [name for name, _ in sessions()])
@pytest.mark.parametrize("on_error", ["stop", "skip"])
def test_both_engines_write_the_same_bytes_and_say_the_same(
    files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    on_error: str,
) -> None:
    options = ("--on-error", on_error, "--first-changes", "50")
    python = book(files[name], tmp_path / "o.json", capsys, *options, "--engine", "python")
    numba = book(files[name], tmp_path / "o.json", capsys, *options, "--engine", "numba")
    assert numba == python
    code, err, summary = python
    if name.startswith("clean"):
        assert (code, err) == (0, "")
    elif on_error == "skip" or name == "policy.itch":
        assert code == 0
        assert "book anomalies: unknown_ref=" in err
        assert ("skipped" in err) == (name != "policy.itch")
    else:
        assert (code, summary) == (1, None)
        assert "ITCH frame at byte offset" in err


def test_skip_counts_every_bad_frame_past_the_kept_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "zeros.itch"
    path.write_bytes(session_bytes(seed=3, messages=200) + bytes(2 * 3 * KEPT_ERRORS))
    python = book(path, tmp_path / "o.json", capsys, "--on-error", "skip", "--engine", "python")
    numba = book(path, tmp_path / "o.json", capsys, "--on-error", "skip", "--engine", "numba")
    assert numba == python
    assert f"skipped {3 * KEPT_ERRORS} malformed part(s)" in python[1]


def test_auto_takes_the_compiled_pass_whenever_it_can(
    files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = files["frames.itch"]
    want = book(path, tmp_path / "o.json", capsys, "--on-error", "skip", "--engine", "python")

    def streamed(args: object) -> None:
        raise AssertionError("auto streamed a file the compiled pass could take")

    monkeypatch.setattr(book_command, "FAST_MIN_BYTES", 0)
    with monkeypatch.context() as patch:
        patch.setattr(book_command, "_streamed", streamed)
        assert book(path, tmp_path / "o.json", capsys, "--on-error", "skip") == want


@pytest.mark.parametrize(
    "why", ["strict", "small file", "no memory for the file", "no memory for the gzip stream"]
)
def test_auto_streams_where_the_compiled_pass_cannot_go(
    files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    why: str,
) -> None:
    path = files["clean.itch.gz" if why.endswith("gzip stream") else "policy.itch"]
    options = ("--strict",) if why == "strict" else ()
    want = book(path, tmp_path / "o.json", capsys, *options, "--engine", "python")
    if why != "small file":
        monkeypatch.setattr(book_command, "FAST_MIN_BYTES", 0)
    if why.startswith("no memory"):  # room for the file on disk, not for its stream
        room = path.stat().st_size * book_command.FAST_BYTES_PER_BYTE / book_command.MEMORY_SHARE
        monkeypatch.setattr(book_command, "_memory_available", lambda: int(room) + 1)
        if why.endswith("file"):
            monkeypatch.setattr(book_command, "_memory_available", lambda: 1000)

    class Refused:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("auto took the compiled pass where it cannot go")

    monkeypatch.setattr("duetime.feeds.itch.fastbook.FastBook", Refused)
    assert book(path, tmp_path / "o.json", capsys, *options) == want
    if why == "strict":
        assert want[0] == 1
        assert "drop --strict" in want[1]


def test_numba_is_refused_with_strict(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err, _ = book(files["clean.itch"], tmp_path / "o.json", capsys, "--strict",
                        "--engine", "numba")  # fmt: skip
    assert code == 2
    assert err == (
        "duetime itch book: --strict needs the pure-Python books (--engine python or auto)\n"
    )
