"""book_summary / write_summary / the `duetime itch book` entry: the JSON layout to the letter."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from directory import R_FIELDS

from duetime.feeds.itch.book_command import add_book_arguments, run_book
from duetime.feeds.itch.summary import book_summary, write_summary
from duetime.feeds.itch.writer import ItchWriter


def session(path: Path, *, gzip: bool = False, damaged: bool = False) -> Path:
    """Two stocks with a directory (one 1-char symbol, one 8-char) and one without."""
    with ItchWriter(path, gzip=gzip) as w:
        w.write("S", timestamp=1, event_code="O")
        w.write("R", stock_locate=1, timestamp=2, stock="A", **R_FIELDS)
        w.write("R", stock_locate=2, timestamp=2, stock="ABCDEFGH", **R_FIELDS)
        add = {"stock": "A", "buy_sell_indicator": "B"}
        w.write("A", stock_locate=1, timestamp=10, order_reference_number=1, shares=100,
                price=10_0000, **add)  # fmt: skip
        w.write("A", stock_locate=1, timestamp=11, order_reference_number=2, shares=50,
                price=10_0000, **add)  # fmt: skip
        w.write("F", stock_locate=1, timestamp=12, order_reference_number=3, shares=70,
                price=10_1000, stock="A", buy_sell_indicator="S", attribution="GSCO")  # fmt: skip
        w.write("E", stock_locate=1, timestamp=13, order_reference_number=1, executed_shares=100,
                match_number=1)  # fmt: skip
        w.write("P", stock_locate=1, timestamp=14, order_reference_number=0, buy_sell_indicator="B",
                shares=5, stock="A", price=10_0500, match_number=2)  # fmt: skip
        w.write("D", stock_locate=1, timestamp=15, order_reference_number=99)  # unknown: no change
        w.write("X", stock_locate=1, timestamp=16, order_reference_number=3, cancelled_shares=20)
        w.write("U", stock_locate=1, timestamp=17, original_order_reference_number=2,
                new_order_reference_number=4, shares=10, price=9_9000)  # fmt: skip
        w.write("A", stock_locate=2, timestamp=18, order_reference_number=5, shares=1,
                price=1, stock="ABCDEFGH", buy_sell_indicator="S")  # fmt: skip
        w.write("C", stock_locate=2, timestamp=19, order_reference_number=5, executed_shares=1,
                match_number=3, printable="N", execution_price=2)  # fmt: skip
        w.write("H", stock_locate=7, timestamp=20, stock="ZZZ", trading_state="T", reserved=" ",
                reason="")  # fmt: skip
        w.write("D", stock_locate=2, timestamp=21, order_reference_number=3)  # locate mismatch
        w.write("S", timestamp=30, event_code="C")
        if damaged:
            w.write_body(b"Z" + bytes(10))
    return path


EXPECTED_A = [
    [10, 10_0000, 100, None, 0],
    [11, 10_0000, 150, None, 0],
    [12, 10_0000, 150, 10_1000, 70],
    [13, 10_0000, 50, 10_1000, 70],
    [16, 10_0000, 50, 10_1000, 50],
    [17, 9_9000, 10, 10_1000, 50],
    [21, 9_9000, 10, None, 0],
]


def digest(rows: list[list[Any]]) -> str:
    text = "".join(",".join("-" if v is None else str(v) for v in row) + "\n" for row in rows)
    return hashlib.sha256(text.encode()).hexdigest()


def test_layout_to_the_letter(tmp_path: Path) -> None:
    summary = book_summary(session(tmp_path / "s.itch"))
    assert list(summary) == ["market", "stocks"]
    assert summary["market"] == {"counts": {"S": 2}}
    assert list(summary["stocks"]) == ["A", "ABCDEFGH", "#7"]
    a = summary["stocks"]["A"]
    assert list(a) == [
        "locate", "counts", "book", "book_depth", "live_orders", "changes_total", "changes",
        "changes_digest",
    ]  # fmt: skip
    assert a == {
        "locate": 1,
        "counts": {"A": 2, "D": 1, "E": 1, "F": 1, "P": 1, "R": 1, "U": 1, "X": 1},
        "book": {"bids": [[9_9000, 10, 1]], "asks": []},
        "book_depth": 5,
        "live_orders": 1,
        "changes_total": 7,
        "changes": EXPECTED_A,
        "changes_digest": digest(EXPECTED_A),
    }
    b = summary["stocks"]["ABCDEFGH"]
    assert b["changes"] == [[18, None, 0, 1, 1], [19, None, 0, None, 0]]
    assert b["counts"] == {"A": 1, "C": 1, "D": 1, "R": 1}
    assert b["live_orders"] == 0
    assert summary["stocks"]["#7"] == {
        "locate": 7,
        "counts": {"H": 1},
        "book": {"bids": [], "asks": []},
        "book_depth": 5,
        "live_orders": 0,
        "changes_total": 0,
        "changes": [],
        "changes_digest": hashlib.sha256(b"").hexdigest(),
    }


def test_depth_and_first_changes_limit_only_what_is_listed(tmp_path: Path) -> None:
    path = session(tmp_path / "s.itch")
    summary = book_summary(path, depth=1, first_changes=2)
    a = summary["stocks"]["A"]
    assert a["book_depth"] == 1
    assert a["changes"] == EXPECTED_A[:2]
    assert a["changes_total"] == 7
    assert a["changes_digest"] == digest(EXPECTED_A)


def test_gzip_bytes_and_written_file_agree(tmp_path: Path) -> None:
    plain = book_summary(session(tmp_path / "s.itch"))
    gz = session(tmp_path / "s.itch.gz", gzip=True)
    assert book_summary(gz) == plain
    assert book_summary((tmp_path / "s.itch").read_bytes()) == plain
    out = tmp_path / "out.json"
    assert write_summary(gz, out) == plain
    text = out.read_text()
    assert text.endswith("}\n")
    assert json.loads(text) == plain


def book_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_book_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_writes_the_summary_and_reports_anomalies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = session(tmp_path / "s.itch")
    out = tmp_path / "out.json"
    assert run_book(book_args(str(path), "--json", str(out), "--depth", "2")) == 0
    assert json.loads(out.read_text()) == book_summary(path, depth=2)
    err = capsys.readouterr().err
    assert "unknown_ref=1" in err
    assert "locate_mismatch=1" in err


def test_cli_strict_stops_at_the_first_policy_case(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = session(tmp_path / "s.itch")
    out = tmp_path / "out.json"
    assert run_book(book_args(str(path), "--json", str(out), "--strict")) == 1
    assert capsys.readouterr().err == (  # (it ended in the API's "use strict=False")
        f"duetime itch book: {path}: unknown_ref at message 8 (ts 15, locate 1, ref 99); drop "
        "--strict to count such cases and apply the documented policy\n"
    )
    assert not out.exists()


def test_cli_damaged_file_stops_or_skips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = session(tmp_path / "s.itch", damaged=True)
    out = tmp_path / "out.json"
    assert run_book(book_args(str(path), "--json", str(out))) == 1
    assert str(path) in capsys.readouterr().err
    assert run_book(book_args(str(path), "--json", str(out), "--on-error", "skip")) == 0
    assert json.loads(out.read_text()) == book_summary(session(tmp_path / "clean.itch"))


def test_cli_reports_a_damaged_gzip_file_and_a_missing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clean = session(tmp_path / "s.itch").read_bytes()
    damaged = tmp_path / "s.itch.gz"
    damaged.write_bytes(gzip.compress(clean)[:-12])  # cut short
    out = tmp_path / "out.json"
    assert run_book(book_args(str(damaged), "--json", str(out))) == 1
    assert "the gzip data is damaged or cut short" in capsys.readouterr().err
    assert run_book(book_args(str(damaged), "--json", str(out), "--on-error", "skip")) == 0
    # the gzip damage, then the frame it cut; the messages before it are all there
    assert "skipped 2 malformed part(s) of the stream" in capsys.readouterr().err
    assert json.loads(out.read_text())["stocks"]["A"]["changes_total"] == len(EXPECTED_A)
    assert run_book(book_args(str(tmp_path / "none.itch"), "--json", str(out))) == 2
    assert "none.itch: no such file" in capsys.readouterr().err


def test_cli_rejects_a_depth_below_one(tmp_path: Path) -> None:
    args = book_args(str(tmp_path / "x"), "--json", str(tmp_path / "o"), "--depth", "0")
    assert run_book(args) == 2


def test_cli_rejects_a_negative_first_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = session(tmp_path / "s.itch")
    out = tmp_path / "out.json"
    assert run_book(book_args(str(path), "--json", str(out), "--first-changes", "-1")) == 2
    assert "--first-changes must be 0 or more" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(ValueError, match="first_changes"):
        book_summary(path, first_changes=-1)
    assert run_book(book_args(str(path), "--json", str(out), "--first-changes", "0")) == 0
    assert all(entry["changes"] == [] for entry in json.loads(out.read_text())["stocks"].values())


def test_cli_keeps_and_reports_locates_that_share_a_symbol(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Keyed by symbol alone, the second locate's record overwrote the first's, silently."""
    path = tmp_path / "twice.itch"
    add = {"stock": "AAPL", "price": 100, "buy_sell_indicator": "B"}
    with ItchWriter(path) as w:
        w.write("R", stock_locate=2, timestamp=1, stock="AAPL", **R_FIELDS)
        w.write("A", stock_locate=2, timestamp=2, order_reference_number=1, shares=1, **add)
        w.write("R", stock_locate=1, timestamp=3, stock="AAPL", **R_FIELDS)
        w.write("A", stock_locate=1, timestamp=4, order_reference_number=2, shares=2, **add)
        w.write("A", stock_locate=1, timestamp=5, order_reference_number=3, shares=3, **add)
    out = tmp_path / "out.json"
    assert run_book(book_args(str(path), "--json", str(out))) == 0
    stocks = json.loads(out.read_text())["stocks"]
    assert {key: (v["locate"], v["live_orders"]) for key, v in stocks.items()} == {
        "AAPL": (1, 2),  # the lower locate, though its directory message came second
        "AAPL@2": (2, 1),
    }
    assert "1 locate(s) share their symbol with a lower locate" in capsys.readouterr().err
    assert run_book(book_args(str(session(tmp_path / "s.itch")), "--json", str(out))) == 0
    assert "share their symbol" not in capsys.readouterr().err


def test_first_changes_help_says_rows_are_every_book_change(tmp_path: Path) -> None:
    """`--first-changes` was said to list "top-of-book changes", but a row is listed for every
    book change, the top moved or not (as docs/itch_book.md says): the help now says so."""
    parser = argparse.ArgumentParser()
    add_book_arguments(parser)
    (flag,) = (a for a in parser._actions if "--first-changes" in a.option_strings)
    assert flag.help is not None
    assert "top-of-book changes" not in flag.help
    assert "every book change" in flag.help, flag.help
    path = tmp_path / "s.itch"
    with ItchWriter(path) as w:  # the second add is behind the best bid: the top stays
        w.write("A", stock_locate=1, timestamp=1, order_reference_number=1,
                buy_sell_indicator="B", shares=100, stock="X", price=1000)  # fmt: skip
        w.write("A", stock_locate=1, timestamp=2, order_reference_number=2,
                buy_sell_indicator="B", shares=100, stock="X", price=900)  # fmt: skip
    changes = book_summary(path)["stocks"]["#1"]["changes"]
    assert [row[1:] for row in changes] == [[1000, 100, None, 0]] * 2
