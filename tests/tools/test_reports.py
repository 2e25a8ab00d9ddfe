"""`duetime report` and the progress line: bench and replay results plotted side by side (PNG
and self-contained HTML), files that are not results refused with a reason, the live line."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
from conftest import RunningServer

from duetime.cli import main as cli_main
from duetime.tools import hdr
from duetime.tools.compare import default_labels, load_reports
from duetime.tools.config import BenchConfig
from duetime.tools.drivers import Ledger
from duetime.tools.outcomes import Outcome
from duetime.tools.plots import bucket_spans, goodput_plot, html_page, table_rows, verdict, winner
from duetime.tools.progress import Progress, Snapshot
from duetime.tools.report import Records
from duetime.tools.report import result_of as bench_result_of

pytestmark = pytest.mark.timeout(120)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def result(path: Path, label: str, latency_ms: float, seed: int) -> Path:
    """A result file as `duetime replay --json` writes it: 3 s at ~300 req/s."""
    rng = np.random.default_rng(seed)
    sent = np.sort(rng.integers(0, 3_000_000_000, 900))
    latency = (rng.lognormal(0, 0.5, sent.size) * latency_ms * 1e6).astype(np.int64)
    outcome = np.where(rng.random(sent.size) < 0.03, Outcome.REJECTED, Outcome.OK)
    recorded = hdr.record_arrays(sent, latency, outcome.astype(np.int8))
    path.write_text(
        json.dumps(hdr.run_fields("replay", label, 3.0, recorded, unsent=0, unanswered=0))
    )
    return path


def test_report_png_and_html_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fast = result(tmp_path / "fast.json", "fast", 1.0, 0)
    slow = result(tmp_path / "slow.json", "slow", 4.0, 1)
    png = tmp_path / "out" / "cmp.png"
    argv = ["report", str(slow), str(fast), "--label", "before", "--label", "after"]
    assert cli_main([*argv, "--out", str(png)]) == 0
    assert png.read_bytes().startswith(PNG_MAGIC)
    page = tmp_path / "cmp.html"
    assert cli_main([*argv, "--out", str(page)]) == 0
    text = page.read_text()
    assert "Lowest P99: after" in text
    assert '<tr class="best"><td>after</td>' in text
    images = text.count("data:image/png;base64,")
    assert images == 4  # distributions, goodput, one timeline per run
    first = text.split("data:image/png;base64,")[1].split('"')[0]
    assert base64.b64decode(first).startswith(PNG_MAGIC)
    assert "wrote" in capsys.readouterr().out


def test_a_run_without_answers_is_plotted_without_warnings(tmp_path: Path) -> None:
    """Empty latency plots called `legend()` with nothing in them: matplotlib's UserWarnings
    (with file paths and source lines) leaked on stderr (an error under this suite's config)."""
    sent = np.arange(0, 1_000_000_000, 10_000_000, dtype=np.int64)
    errors = np.full(sent.size, Outcome.ERROR, dtype=np.int8)
    recorded = hdr.record_arrays(sent, np.zeros(sent.size, dtype=np.int64), errors)
    path = tmp_path / "errors.json"
    path.write_text(
        json.dumps(hdr.run_fields("bench", "all errors", 1.0, recorded, unsent=0, unanswered=0))
    )
    for out in (tmp_path / "r.png", tmp_path / "r.html"):
        assert cli_main(["report", str(path), "--out", str(out)]) == 0


def test_the_last_partial_second_is_plotted_at_its_real_rate(tmp_path: Path) -> None:
    """A steady 100 req/s for 2.5 s: the last half second plotted as 50/s looked like a
    collapse at the end of every run."""
    sent = np.arange(0, 2_500_000_000, 10_000_000, dtype=np.int64)
    latency = np.full(sent.size, 1_000_000, dtype=np.int64)
    ok = np.full(sent.size, Outcome.OK, dtype=np.int8)
    path = tmp_path / "steady.json"
    path.write_text(json.dumps(hdr.run_fields("bench", "steady", 2.5, hdr.record_arrays(
        sent, latency, ok), unsent=0, unanswered=0)))  # fmt: skip
    (report,) = load_reports([path], [])
    figure, ax = plt.subplots()
    try:
        goodput_plot(ax, [report])
        on_time = ax.lines[0].get_ydata()
    finally:
        plt.close(figure)
    assert list(on_time) == pytest.approx([100.0, 100.0, 100.0])


def test_bucket_spans_cut_the_last_second_to_the_run() -> None:
    assert bucket_spans(3, 1.0, 2.5) == [1.0, 1.0, 0.5]
    assert bucket_spans(3, 1.0, 2.2) == [1.0, 1.0, None]  # a sliver: left off
    assert bucket_spans(3, 1.0, 2.0) == [1.0, 1.0, None]  # the drain's answers only
    assert bucket_spans(1, 1.0, 0.3) == [0.3]  # a run shorter than a second
    assert bucket_spans(2, 1.0, 0.0) == [1.0, 1.0]  # duration unknown


def test_winner_is_the_lowest_p99(tmp_path: Path) -> None:
    paths = [result(tmp_path / f"{i}.json", f"run{i}", ms, i) for i, ms in enumerate([3, 1, 2])]
    reports = load_reports(paths, [])
    assert [r.label for r in reports] == ["0", "1", "2"]  # the files' names
    assert winner(reports) == 1
    assert reports[1].description == "run1"
    assert verdict(reports).startswith("Lowest P99: 1 at ")
    assert winner(reports[:1]) is None
    assert "<table>" in html_page(reports[:1], "one run")


def test_bench_results_are_reports_too(
    server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = tmp_path / "bench.json"
    argv = ["bench", "--http", server.http, "--model", "mlp", "--rate", "200", "--duration",
            "0.5", "--warmup", "0", "--timeout-ms", "200", "--json", str(bench)]  # fmt: skip
    assert cli_main(argv) == 0
    doc = json.loads(bench.read_text())
    assert doc["kind"] == "bench"
    assert doc["sent"] == doc["overall"]["sent"]
    assert doc["ok"] == doc["overall"]["ok"]
    assert sum(doc["timeline"]["sent"]) == doc["sent"]
    # NOTE: the median, not the p99: with ~100 samples the p99 falls between the two slowest,
    # where numpy interpolates and an HDR histogram takes one of them (2051 vs 2165 µs, once)
    assert doc["latency_us"]["p50"] == pytest.approx(doc["overall"]["latency"]["p50_ms"] * 1000,
                                                     rel=0.05)  # fmt: skip
    replay = result(tmp_path / "replay.json", "replayed", 2.0, 3)
    out = tmp_path / "mixed.png"
    assert cli_main(["report", str(bench), str(replay), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(PNG_MAGIC)
    capsys.readouterr()


def test_files_that_are_no_results_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = result(tmp_path / "good.json", "good", 1.0, 0)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"config": {}, "overall": {}}))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    out = str(tmp_path / "r.html")
    cases = [
        ([str(good), str(old)], "old.json: not a result of `duetime bench --json`"),
        ([str(broken)], "broken.json: not JSON"),
        ([str(tmp_path / "missing.json")], "missing.json: cannot read it"),
        ([str(good), "--label", "a", "--label", "b"], "2 --label for 1 results"),
    ]
    for args, message in cases:
        assert cli_main(["report", *args, "--out", out]) == 2
        assert message in capsys.readouterr().err
    assert cli_main(["report", str(good), "--out", str(tmp_path / "r.pdf")]) == 2
    assert "expected a .html or .png" in capsys.readouterr().err


def _edited(doc: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """`doc` with the field at dotted `path` set to `value` (`timeline.sent.0`: an item)."""
    edited: dict[str, Any] = json.loads(json.dumps(doc))
    *parents, last = path.split(".")
    target = edited
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return edited


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("timeline", None, "timeline: expected an object, got null"),
        ("timeline", [], "timeline: expected an object, got list"),
        ("timeline.sent.0", "x", "timeline.sent[0]: expected a whole number, 0 or more, got 'x'"),
        ("timeline.ok.1", -3, "timeline.ok[1]: expected a whole number, 0 or more, got -3"),
        ("timeline.late.0", 1.5, "timeline.late[0]: expected a whole number"),
        ("timeline.p99_us.0", "fast", "timeline.p99_us[0]: expected a number, got 'fast'"),
        ("timeline.p50_us.0", True, "timeline.p50_us[0]: expected a number, got bool"),
        ("timeline.interval_s", 0, "timeline.interval_s: expected a number above 0"),
        ("timeline.interval_s", "1", "timeline.interval_s: expected a number, got '1'"),
        ("timeline.max_us", [1], "timeline.max_us: expected a list of 3 values"),
        ("histogram", "x", "histogram: expected an object with an 'encoded' text, got 'x'"),
        ("histogram", {"encoded": 5}, "histogram: expected an object with an 'encoded' text"),
        ("histogram", {"encoded": "AAAA"}, "not an encoded HDR histogram"),
        ("sent", [1], "sent: expected a whole number, 0 or more, got list"),
        ("duration_s", "3", "duration_s: expected a number, got '3'"),
        ("goodput_rps", -1, "goodput_rps: expected a finite number, 0 or more, got -1"),
        ("batch_sizes", [1], "batch_sizes: expected an object, got list"),
        ("batch_sizes", {"m": 3}, "batch_sizes.m: expected an object, got int"),
        ("batch_sizes", {"m": {"x": 1}}, "batch_sizes.m.x: expected a batch size"),
        ("batch_sizes", {"m": {"2": "many"}}, "batch_sizes.m.2: expected a whole number"),
        ("interrupted", "yes", "interrupted: expected true or false, got 'yes'"),
        ("unsent", -1, "unsent: expected a whole number, 0 or more, got -1"),
        ("unanswered", "3", "unanswered: expected a whole number, 0 or more, got '3'"),
        ("skipped", 1.5, "skipped: expected a whole number, 0 or more, got 1.5"),
        ("overall", [], "overall: expected an object, got list"),
    ],
)
def test_a_result_with_a_field_of_the_wrong_kind_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str, value: object, message: str
) -> None:
    """Hand-edited results ended `duetime report` in a traceback (an AttributeError for a null
    timeline, a TypeError in matplotlib for a column of strings)."""
    doc = json.loads(result(tmp_path / "good.json", "good", 1.0, 0).read_text())
    doc["timeline"] = {**doc["timeline"], **{k: doc["timeline"][k][:3] for k in
                       ("sent", "ok", "late", "rejected", "expired", "errors", "p50_us",
                        "p99_us", "max_us")}}  # fmt: skip
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_edited(doc, path, value)))
    assert cli_main(["report", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert f"bad.json: {message}" in err, err
    assert "Traceback" not in err


def test_a_bench_result_of_before_its_counts_were_at_the_top_is_read_from_overall(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bench result kept `unsent` and `unanswered` in `overall` only (now at the top too): a
    result of then is read from there, and refused naming the field where neither holds one,
    which had read as 0, a complete run (found by a tester: 111 unanswered, ranked best)."""
    doc = json.loads(result(tmp_path / "good.json", "good", 1.0, 0).read_text())
    del doc["unsent"], doc["unanswered"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**doc, "overall": {"unsent": 0, "unanswered": 7}}))
    assert hdr.RunReport.from_json(json.loads(old.read_text()), "old.json").unanswered == 7
    for name, overall, message in (
        ("bad", {"unsent": None}, "overall.unsent: expected a whole number, 0 or"),
        ("none", {}, "unsent: missing"),
    ):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({**doc, "overall": overall}))
        assert cli_main(["report", str(path), "--out", str(tmp_path / "r.html")]) == 2
        err = capsys.readouterr().err
        assert f"{name}.json: {message}" in err, err


# -- incomplete runs, missing fields, names ------------------------------------------------------


def bench_result(
    path: Path, latency_ms: float, *, unsent: int = 0, unanswered: int = 0,
    interrupted: bool = False,
) -> Path:  # fmt: skip
    """A result as `duetime bench --json` writes it (its layout: the counts of what was never
    sent or answered are in `overall`): 3 s at 100 req/s, then `unsent` requests that found
    no connection and `unanswered` that had no answer by the end of --drain."""
    rng = np.random.default_rng(int(latency_ms * 10))
    size = 300 + unanswered
    outcome = np.full(size, Outcome.OK, dtype=np.int8)
    outcome[300:] = Outcome.NO_ANSWER
    latency = (rng.lognormal(0, 0.3, size) * latency_ms * 1e6).astype(np.int64)
    latency[300:] = 0
    records = Records(
        due_class=np.zeros(size, dtype=np.int64), outcome=outcome, latency_ns=latency,
        send_lag_ns=np.zeros(size, dtype=np.int64), duration_s=3.0, cpu_s=0.1,
        scheduled_ns=np.arange(size, dtype=np.int64) * 10_000_000, interrupted=interrupted,
        unsent=unsent, unsent_class=np.zeros(unsent, dtype=np.int64),
    )  # fmt: skip
    config = BenchConfig(model="mlp", address="127.0.0.1:9", duration_s=3.0)
    path.write_text(json.dumps(bench_result_of(config, records).to_json()))
    return path


def marked(path: Path, mark: str) -> Path:
    """A run with answers 4x faster than `result`'s 4 ms one, and `mark`."""
    if mark == "unsent":  # a bench run whose server died
        return bench_result(path, 1.0, unsent=58)
    if mark == "unanswered":  # answers that never came within --drain
        return bench_result(path, 1.0, unanswered=12)
    if mark == "interrupted":
        return bench_result(path, 1.0, interrupted=True)
    doc = json.loads(result(path, "skipping", 1.0, 5).read_text())
    doc["skipped"] = 3  # a replay of a damaged capture
    path.write_text(json.dumps(doc))
    return path


MARKS = {
    "unsent": "58 requests unsent, finding no connection to the server",
    "unanswered": "12 requests unanswered by the end of --drain",
    "interrupted": "interrupted by Ctrl-C after 3.00 s measured",
    "skipped": "3 capture records skipped, not decoding",
}


@pytest.mark.parametrize("mark", sorted(MARKS))
def test_an_incomplete_run_is_marked_and_never_ranked(tmp_path: Path, mark: str) -> None:
    """A run whose server died after 30 answers (58 unsent) was "Lowest P99" by the P99 of
    those 30, its row highlighted best, with nothing on the page saying so; likewise one
    interrupted, one whose answers never came, a replay of a damaged capture."""
    fast = marked(tmp_path / "fast.json", mark)
    slow = result(tmp_path / "slow.json", "slow", 4.0, 1)
    reports = load_reports([fast, slow], [])
    assert reports[0].problems == (MARKS[mark],)
    assert float(reports[0].latency_us["p99"] or 0) < float(reports[1].latency_us["p99"] or 0)
    assert winner(reports) is None
    said = verdict(reports)
    assert "Lowest P99" not in said
    assert said.startswith("No run ranked by P99: that takes two complete runs with answers, "
                           "and only slow is one.")  # fmt: skip
    assert said.endswith(f" Incomplete, not ranked: fast ({MARKS[mark]}).")
    page = html_page(reports, "t")
    assert '<tr class="incomplete"><td>fast</td>' in page
    assert MARKS[mark] in page.split("</table>")[0]  # in its row too
    assert '<tr class="best">' not in page
    slower = result(tmp_path / "slower.json", "slower", 8.0, 2)
    reports = load_reports([fast, slow, slower], [])
    assert winner(reports) == 1
    assert verdict(reports).startswith("Lowest P99: slow at ")
    compared, _, left_out = verdict(reports).partition(" Incomplete, not ranked: ")
    assert " (vs slower " in compared
    assert "fast" not in compared
    assert left_out.startswith("fast (")
    figure_out = tmp_path / "r.png"
    assert cli_main(["report", str(fast), str(slow), str(slower), "--out", str(figure_out)]) == 0


def test_the_unsent_column_shows_a_bench_runs_unsent(tmp_path: Path) -> None:
    (report,) = load_reports([bench_result(tmp_path / "b.json", 1.0, unsent=58)], [])
    (row,) = table_rows([report])
    assert row[2:9] == ["300", "300", "0", "0", "0", "0", "58"]  # sent ... errors, unsent
    assert "Incomplete: b (58 requests unsent" in verdict([report])  # one run: marked all the same


def test_runs_tied_at_the_lowest_p99_are_named_as_tied(tmp_path: Path) -> None:
    """The same file twice: one was "lowest" vs the other at the same value, and the two
    were both named by the file's name."""
    run = result(tmp_path / "run.json", "run", 2.0, 0)
    other = result(tmp_path / "other.json", "other", 4.0, 1)
    reports = load_reports([run, run, other], [])
    assert [r.label for r in reports] == ["run", "run (2)", "other"]
    assert winner(reports) is None
    assert verdict(reports).startswith("Lowest P99: run and run (2), tied at ")
    assert " (vs other " in verdict(reports)


def test_results_of_one_name_are_told_apart_by_their_paths(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = result(tmp_path / "a" / "run.json", "a", 2.0, 0)
    second = result(tmp_path / "b" / "run.json", "b", 4.0, 1)
    third = result(tmp_path / "c.json", "c", 3.0, 2)
    assert default_labels([first, second, third]) == [str(first), str(second), "c"]


@pytest.mark.parametrize(
    "field", ["sent", "ok", "late", "rejected", "expired", "errors", "goodput_rps", "duration_s"]
)
def test_a_result_without_a_count_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    """A missing count was read as 0: a result without its `sent` had a row of "sent 0"
    beside "ok 100", and one without its `goodput_rps`, "goodput 0.0"."""
    doc = json.loads(bench_result(tmp_path / "good.json", 1.0).read_text())
    del doc[field]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert cli_main(["report", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert f"bad.json: {field}: missing" in err, err
    assert not (tmp_path / "r.html").exists()


def test_a_result_written_before_the_marks_reads_as_complete(tmp_path: Path) -> None:
    """`unsent`, `unanswered`, `interrupted` and `skipped` came after report_format 1: a result
    without them is read, with none."""
    doc = json.loads(bench_result(tmp_path / "new.json", 1.0).read_text())
    for name in ("overall", "interrupted"):
        del doc[name]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    (report,) = load_reports([old], [])
    assert report.problems == ()


# -- the progress line ---------------------------------------------------------------------------


class FakeTerminal(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_line_names_the_ends_as_the_final_table_does() -> None:
    """Not 'errors' for every request that was no answer in time: the table says errors 0 for
    a run whose only misses were late, rejected or expired."""
    progress = Progress("duetime replay", lambda: Snapshot(0, None), FakeTerminal(False))
    snap = Snapshot(sent=3000, p99_us=1234.0, late=4, rejected=5, expired=6, errors=7)
    assert progress.line(2.0, snap) == (
        "duetime replay:   2.0 s, sent 3,000 (1,500/s), p99 1.23 ms, late 4, rejected 5, "
        "expired 6, errors 7"
    )
    assert "p99 -" in progress.line(0.5, Snapshot(0, None))


def test_progress_redraws_in_place_on_a_terminal_and_clears() -> None:
    terminal = FakeTerminal(True)
    snapshots = iter([Snapshot(10, 500.0), Snapshot(20, 600.0, errors=1)])
    progress = Progress("run", lambda: next(snapshots), terminal)

    async def scenario() -> None:
        progress.start(expected_s=10.0)
        progress._draw()  # what the timer does every REDRAW_S
        progress._draw()
        progress.stop()

    asyncio.run(scenario())
    written = terminal.getvalue()
    assert written.count("\r") == 4  # two redraws, then blanks between two returns
    assert "sent 20" in written
    assert written.endswith("\r")
    quiet = FakeTerminal(True)
    short = Progress("run", lambda: Snapshot(0, None), quiet)

    async def short_run() -> None:
        short.start(expected_s=1.0)  # under MIN_RUN_S: nothing at all
        short.stop()

    asyncio.run(short_run())
    assert quiet.getvalue() == ""


def test_bench_progress_reads_the_ledger() -> None:
    now = [0]
    ledger = Ledger(clock=lambda: now[0], timeouts_ns=[None, 500_000])
    ends = [Outcome.OK] * 80 + [Outcome.REJECTED] * 10 + [Outcome.EXPIRED] * 6 + [Outcome.ERROR] * 4
    for i in range(100):
        now[0] = i * 1_000_000
        ledger.add(now[0], i % 2)  # odd ones due in 0.5 ms
    for rid in range(100):
        now[0] = rid * 1_000_000 + (rid + 1) * 10_000  # latency (rid + 1) * 10 µs
        ledger.finish(rid, ends[rid], None)
    snap = ledger.snapshot()
    late = sum(1 for rid in range(80) if rid % 2 and (rid + 1) * 10 > 500)
    assert (snap.sent, snap.late, snap.rejected, snap.expired, snap.errors) == (
        100, late, 10, 6, 4
    )  # fmt: skip
    assert snap.p99_us == pytest.approx(np.percentile(np.arange(1, 81) * 10.0, 99))
    assert Ledger().snapshot() == Snapshot(0, None)
