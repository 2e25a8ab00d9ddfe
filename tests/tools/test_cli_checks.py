"""The tools refuse what they cannot do before they start, with one line naming the flag (exit
2): an output they could not write, a capture they would overwrite, numbers out of range; and a
write that still fails ends in one line (exit 1), not a traceback after the whole run."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import socket
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
from fake_v2 import fake_v2_server
from test_interrupt import write_capture

from duetime.cli import main as cli_main
from duetime.errors import ConfigError
from duetime.tools import transports
from duetime.tools.config import BenchConfig
from duetime.tools.http_client import ERROR_TEXT_CHARS, error_text, one_line
from duetime.tools.replay_plan import ReplayConfig
from duetime.tools.server_metrics import scrape
from duetime.tools.transports import BenchError, GrpcTransport, HttpTransport, _get_json

pytestmark = pytest.mark.timeout(60)

NOWHERE = "127.0.0.1:1"
"""Never connected to: every check here comes first."""


def bench(*args: str) -> list[str]:
    return ["bench", "--http", NOWHERE, "--model", "m", "--duration", "0.2", "--warmup", "0",
            "-q", *args]  # fmt: skip


def refused(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_bench_record_never_overwrites_a_capture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    existing = tmp_path / "live.cap"
    existing.write_bytes(b"a capture a server is writing")
    err = refused(bench("--record", str(existing)), "--record", capsys)
    assert "never overwritten" in err
    assert existing.read_bytes() == b"a capture a server is writing"


@pytest.mark.parametrize("flag", ["--json", "--record"])
def test_bench_refuses_a_dash_for_an_output_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    """Found by a tester: `--json -` wrote a file named '-' (no tool writes stdout there)."""
    monkeypatch.chdir(tmp_path)
    err = refused(bench(flag, "-"), flag, capsys)
    assert "standard output is not taken here" in err
    assert not (tmp_path / "-").exists()


def test_bench_refuses_one_file_for_its_result_and_its_capture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a tester: it wrote the capture, then the result over it, and said "wrote"
    twice."""
    out = tmp_path / "both"
    err = refused(bench("--json", str(out), "--record", str(out)), "--record", capsys)
    assert "is the --json file too" in err
    assert not out.exists()


@pytest.mark.parametrize("where", ["dir", "under-a-file", "record-dir"])
def test_bench_refuses_outputs_it_could_not_write_before_running(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    flag, path = {
        "dir": ("--json", tmp_path),
        "under-a-file": ("--json", tmp_path / "file" / "x.json"),
        "record-dir": ("--record", tmp_path),
    }[where]
    refused(bench(flag, str(path)), flag, capsys)


def test_replay_report_and_optimize_refuse_bad_outputs_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / "none.cap"  # never read: the outputs are checked first
    replay = ["replay", str(capture), "--target", f"http://{NOWHERE}", "-q"]
    refused([*replay, "--json", str(tmp_path)], "--json", capsys)
    refused([*replay, "--report", str(tmp_path / "out.txt")], "--report", capsys)
    result = tmp_path / "r.json"
    result.write_text("{}")
    refused(["report", str(result), "--out", str(result / "x.html")], "--out", capsys)
    (tmp_path / "d.html").mkdir()
    refused(["report", str(result), "--out", str(tmp_path / "d.html")], "--out", capsys)
    model = tmp_path / "repo" / "m"
    refused(["optimize", str(model), "-q", "--json", str(tmp_path)], "--json", capsys)


def test_a_write_that_fails_after_the_run_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    with fake_v2_server() as fake:
        argv = ["bench", "--http", fake.address, "--model", "m", "--duration", "0.2",
                "--warmup", "0", "--rate", "50", "-q", "--json", "/dev/full"]  # fmt: skip
        assert cli_main(argv) == 1
    captured = capsys.readouterr()
    assert "sent" in captured.out  # the report came first
    assert captured.err.strip().startswith("duetime bench: --json /dev/full: cannot write it")
    assert len(captured.err.strip().splitlines()) == 1


def test_bench_record_writes_into_a_new_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = tmp_path / "new" / "run.cap"
    out = tmp_path / "new" / "run.json"
    with fake_v2_server() as fake:
        argv = ["bench", "--http", fake.address, "--model", "m", "--duration", "0.2",
                "--warmup", "0", "--rate", "50", "-q", "--record", str(record),
                "--json", str(out)]  # fmt: skip
        assert cli_main(argv) == 0, capsys.readouterr().err
    assert record.stat().st_size > 0
    assert json.loads(out.read_text())["interrupted"] is False


@pytest.mark.parametrize(
    ("change", "flag"),
    [({"duration_s": math.inf}, "--duration"), ({"duration_s": math.nan}, "--duration"),
     ({"duration_s": 1e12}, "--duration"), ({"warmup_s": math.nan}, "--warmup"),
     ({"warmup_s": math.inf}, "--warmup"), ({"drain_s": math.nan}, "--drain"),
     ({"timeouts_ms": (10, 20), "mix": (math.nan, math.nan)}, "--mix"),
     ({"timeouts_ms": (1e300,)}, "--timeout-ms"), ({"priority": 10**20}, "--priority"),
     ({"seed": -1}, "--seed"), ({"rate": 1e12}, "--rate")],
)  # fmt: skip
def test_non_finite_and_huge_numbers_name_their_flag(change: dict[str, Any], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        BenchConfig(**{"model": "m", "address": NOWHERE, **change})


def test_huge_numbers_are_refused_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    refused(bench("--rate", "1e12"), "--rate", capsys)
    refused(bench("--priority", "99999999999999999999"), "--priority", capsys)


@pytest.mark.parametrize(
    ("change", "flag"),
    [({"drain_s": math.nan}, "--drain"), ({"drain_s": math.inf}, "--drain"),
     ({"rtol": math.nan}, "--rtol")],
)  # fmt: skip
def test_replay_refuses_nan_drain_and_tolerances(change: dict[str, Any], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        ReplayConfig(Path("x.cap"), f"http://{NOWHERE}", **change)


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "inf"])
def test_optimize_measure_s_must_be_finite_and_positive(
    seconds: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["optimize", str(tmp_path / "m"), f"--measure-s={seconds}"])
    assert exit_.value.code == 2
    assert "--measure-s" in capsys.readouterr().err


def test_compare_outputs_refuses_a_capture_without_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # (found by reading the capture, which comes after reaching the target: one that listens)
    capture = write_capture(tmp_path / "no-outputs.cap")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        host, port = listening.getsockname()
        argv = ["replay", str(capture), "--target", f"http://{host}:{port}", "-q",
                "--compare-outputs"]  # fmt: skip
        err = refused(argv, "--compare-outputs", capsys)
    assert "no recorded outputs" in err
    assert "--record-outputs" in err


@pytest.mark.parametrize(
    ("line", "field"),
    [('"t_ms": 1e300', "t_ms"), ('"t_ms": 1, "timeout_us": 1e30', "timeout_us"),
     ('"t_ms": 1, "priority": 99999999999999999999', "priority")],
)  # fmt: skip
def test_capture_convert_names_file_line_and_field_of_a_huge_number(
    line: str, field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "huge.jsonl"
    tensor = '"inputs": {"x": {"datatype": "FP32", "shape": [1], "data": [1]}}'
    source.write_text(f'{{{line}, "model": "m", {tensor}}}\n')
    target = tmp_path / "out.cap"
    assert cli_main(["capture", "convert", str(source), str(target)]) == 1
    err = capsys.readouterr().err
    assert f"{source}:1: field '{field}'" in err
    assert "Traceback" not in err
    assert not target.exists()


def test_error_text_of_an_html_page_is_one_short_line() -> None:
    page = b"<!DOCTYPE HTML>\n<html>\n  <head>\n    <title>Error response</title>\n" * 20
    text = error_text(501, page)
    assert "\n" not in text
    assert text.startswith("HTTP 501: <!DOCTYPE HTML> <html> <head> <title>Error response")
    assert len(text) <= len("HTTP 501: ") + ERROR_TEXT_CHARS


def test_metrics_that_are_not_prometheus_text_give_no_batch_sizes() -> None:
    with fake_v2_server() as fake:  # its model metadata: JSON, not Prometheus text
        assert scrape(f"http://{fake.address}/v2/models/m") is None


def test_a_port_that_does_not_speak_http_is_a_one_line_bench_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def answer_garbage() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.recv(4096)
                connection.sendall(b"\x00\x00\x18\x04\x00\x00\x00\x00\x00 not http\r\n\r\n")

        thread = threading.Thread(target=answer_garbage, daemon=True)
        thread.start()
        with pytest.raises(BenchError) as raised:
            _get_json(f"http://127.0.0.1:{port}/v2/models/m")
        thread.join(timeout=10)
    message = raised.value.message
    assert "not an HTTP/1.1 server (is it the gRPC port?)" in message
    assert message.isprintable()  # the frame's bytes escaped: no NUL reaches the terminal
    assert "\\x00\\x00\\x18\\x04" in message
    assert len(message) < 200


def test_a_grpc_port_given_to_bench_http_is_named_without_its_bytes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        argv = ["bench", "--http", f"127.0.0.1:{port}", "--model", "m", "--duration", "0.2", "-q"]
        assert cli_main(argv) == 1
    finally:
        server.stop(0)
    err = capsys.readouterr().err.strip()
    assert "not an HTTP/1.1 server (is it the gRPC port?)" in err
    assert err.isprintable()
    assert len(err.splitlines()) == 1


def test_error_text_escapes_what_does_not_print() -> None:
    assert error_text(502, b"bad\x00gate\x1b[31mway") == "HTTP 502: bad\\x00gate\\x1b[31mway"
    assert one_line("a\x00" * 50, 10) == "a\\x00a..."


@pytest.mark.parametrize("what", ["http", "nothing"])
def test_grpc_at_a_port_that_is_not_grpc_says_what_is_there(
    monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    monkeypatch.setattr(transports, "CONNECT_TIMEOUT_S", 0.5)

    def open_at(target: str) -> str:
        transport = GrpcTransport(target, lambda rid, outcome, message: None)
        with pytest.raises(BenchError) as raised:
            asyncio.run(transport.open(1))
        return raised.value.message

    if what == "http":
        with fake_v2_server() as fake:  # (an HTTP/1.1 server, as duetime's HTTP port)
            message = open_at(fake.address)
        assert f"--grpc: cannot connect to {fake.address} within 0.5 s" in message
        assert "is this the server's HTTP port?" in message
    else:
        assert "is the server running?" in open_at(NOWHERE)


def test_a_grpc_target_with_nothing_listening_fails_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The channel retried until CONNECT_TIMEOUT_S ran out: 11 s to report a refused port."""
    monkeypatch.setattr(transports, "CONNECT_TIMEOUT_S", 3600.0)
    transport = GrpcTransport(NOWHERE, lambda rid, outcome, message: None)

    async def opening() -> None:
        await asyncio.wait_for(transport.open(1), 30)  # (3600 s without the quick check)

    with pytest.raises(BenchError) as raised:
        asyncio.run(opening())
    assert raised.value.message == (
        f"--grpc: cannot connect to {NOWHERE} (Connection refused: is the server running?)"
    )


def test_answers_that_are_no_v2_response_are_errors_not_goodput(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server answering 200 "hello" to every POST was counted all ok, all on time."""
    out = tmp_path / "run.json"
    with fake_v2_server(answer=b"hello, not v2", content_type="text/plain") as fake:
        argv = ["bench", "--http", fake.address, "--model", "m", "--duration", "0.3",
                "--warmup", "0", "--rate", "40", "-q", "--json", str(out)]  # fmt: skip
        cli_main(argv)
    result = json.loads(out.read_text())
    assert result["sent"] > 0
    assert (result["ok"], result["errors"], result["goodput_rps"]) == (0, result["sent"], 0.0)
    assert "not a v2 inference response" in " ".join(result["error_messages"])
    with fake_v2_server() as fake:  # (a v2 answer still counts)
        argv = ["bench", "--http", fake.address, "--model", "m", "--duration", "0.3",
                "--warmup", "0", "--rate", "40", "-q", "--json", str(out)]  # fmt: skip
        assert cli_main(argv) == 0
    result = json.loads(out.read_text())
    assert result["ok"] == result["sent"] > 0


def test_report_and_replay_name_what_a_file_is_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = write_capture(tmp_path / "run.cap")
    refused(["report", str(capture), "--out", str(tmp_path / "r.html")], "run.cap: not JSON",
            capsys)  # fmt: skip
    future = tmp_path / "future.json"
    future.write_text('{"histogram": {"encoded": ""}, "timeline": {}, "report_format": 99}')
    refused(["report", str(future), "--out", str(tmp_path / "r.html")], "report_format 99: this "
            "duetime reads format 1", capsys)  # fmt: skip
    refused(["replay", str(tmp_path), "--target", NOWHERE], "a folder, not a capture file", capsys)


def test_capture_show_and_replay_say_alike_what_a_file_is_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`capture show` printed Python's own text ("[Errno 21] Is a directory: ..."), and replay
    called a link to /dev/null "no such capture file" (found by a tester)."""
    device = tmp_path / "null.cap"
    device.symlink_to("/dev/null")
    missing = tmp_path / "missing.cap"
    refused(["replay", str(device), "--target", NOWHERE], "null.cap: not a regular file, so no "
            "capture file", capsys)  # fmt: skip
    refused(["capture", "show", str(tmp_path)], f"{tmp_path}: a folder, not a capture file",
            capsys)  # fmt: skip
    refused(["capture", "show", str(missing)], "missing.cap: no such capture file", capsys)
    refused(["capture", "convert", str(tmp_path / "in.jsonl"), str(tmp_path / "out.cap")],
            "in.jsonl: no such JSON Lines file", capsys)  # fmt: skip


def test_a_v2_server_without_model_config_is_benched_from_its_metadata(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """MLServer and KServe runtimes have no /v2/models/<m>/config (Triton's extension)."""

    async def signature(port: int, batch: int) -> Any:
        transport = HttpTransport("127.0.0.1", port, lambda *end: None)
        return await transport.signature("m", batch)

    with fake_v2_server(has_config=False) as fake:
        alone = asyncio.run(signature(fake.port, 1))
        assert (alone.max_batch_size, alone.inputs[0].shape) == (0, (-1, 4))
        assert "no batch dimension is assumed" in capsys.readouterr().err
        batched = asyncio.run(signature(fake.port, 3))  # x: [-1, 4], its first dim free
        assert batched.max_batch_size == 3
        err = capsys.readouterr().err
        assert "the first dimension is taken as the batch dimension (--batch 3)" in err
        assert len(err.strip().splitlines()) == 1
        argv = ["bench", "--http", fake.address, "--model", "m", "--duration", "0.3",
                "--warmup", "0", "--rate", "40", "-q", "--batch", "2"]  # fmt: skip
        assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert "model m batch 2" in out
    assert "error:" not in out


@pytest.mark.parametrize(
    ("metadata", "config", "says"),
    [(b'{"name": "m", "inputs": [{"name": "x"}]}', None, "m: inputs[0] 'x' has no 'datatype'"),
     (b'{"name": "m", "inputs": [{"name": "x", "datatype": "FP99", "shape": [-1, 4]}]}', None,
      "m: inputs[0] 'x': 'datatype' 'FP99' is not a v2 datatype (BOOL, INT8"),
     (b"[1, 2]", None, "m: expected a JSON object, got a JSON array"),
     (b'{"inputs": {"x": 1}}', None, "m: 'inputs' is a JSON object, not a list of tensors"),
     (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": ["4"]}]}', None,
      "m: inputs[0] 'x' 'shape' ['4'] is not a list of dims"),
     (b'{"inputs": [{"name": "x", "datatype": "FP32"}]}', None, "m: inputs[0] 'x' has no 'shape'"),
     (b'{"inputs": [7]}', None, "m: inputs[0] is 7, not a tensor object"),
     (None, b"[]", "m/config: expected a JSON object, got a JSON array"),
     (None, b'{"max_batch_size": "8"}', "m/config: 'max_batch_size' '8' is not a whole number"),
     (None, b'{"input": [1]}', "m/config: 'input' is a JSON array, not a list of input objects")],
)  # fmt: skip
def test_malformed_model_metadata_is_a_one_line_bench_error(
    metadata: bytes | None, config: bytes | None, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Such metadata ended in a traceback: KeyError, or AttributeError of a JSON array (found by
    a tester)."""
    with fake_v2_server(metadata=metadata, config=config) as fake:
        argv = ["bench", "--http", fake.address, "--model", "m", "--duration", "0.2",
                "--warmup", "0", "-q"]  # fmt: skip
        assert cli_main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"duetime bench: GET http://{fake.address}/v2/models/{says}"), err
    assert len(err.splitlines()) == 1


def test_grpc_model_metadata_of_an_unknown_datatype_is_a_bench_error() -> None:
    doc = {"inputs": [{"name": "x", "datatype": "FP99", "shape": [-1, 4]}], "outputs": []}
    with pytest.raises(transports.BadMetadata, match="inputs\\[0\\] 'x': 'datatype' 'FP99'"):
        transports.signature_from_metadata(doc, 8)
    odd_output = {"outputs": [{"name": "y", "datatype": "FP99", "shape": [-1]}]}
    assert transports.signature_from_metadata(odd_output, 8).outputs[0].datatype == "FP99"


def test_grpc_without_the_model_config_rpc_falls_back_to_the_metadata() -> None:
    class Stub:
        async def ModelConfig(self, request: Any) -> Any:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNIMPLEMENTED, grpc.aio.Metadata(), grpc.aio.Metadata(), "no"
            )

    assert asyncio.run(GrpcTransport._config(Stub(), "m")) is None


@pytest.mark.parametrize("flag", ["--http", "--grpc"])
def test_a_host_name_that_does_not_resolve_is_one_line(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", flag, "no.such.host.invalid:8000", "--model", "m", "--duration", "0.2",
            "--warmup", "0", "-q"]  # fmt: skip
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"duetime bench: {flag}: cannot resolve the host name 'no.such.host.invalid': "
        + err.split("'no.such.host.invalid': ", 1)[1].strip()
    ]


def test_a_host_name_is_resolved_once_and_its_answering_address_kept() -> None:
    """localhost may resolve to ::1 first while the server listens on 127.0.0.1 only."""
    with fake_v2_server() as fake:
        looked_up: list[str] = []
        answers: list[int] = []

        async def scenario() -> None:
            loop = asyncio.get_running_loop()
            all_answered = asyncio.Event()

            def answered(rid: int, status: int, *rest: Any) -> None:
                answers.append(status)
                if len(answers) == 5:
                    all_answered.set()

            resolved = loop.getaddrinfo

            async def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
                looked_up.append(host)
                if host == "twice.test":
                    host = "127.0.0.1"
                infos = await resolved(host, *args, **kwargs)
                _, kind, proto, _, _ = infos[0]
                return [(socket.AF_INET6, kind, proto, "", ("::1", 0, 0, 0)), *infos]

            loop.getaddrinfo = getaddrinfo  # type: ignore[method-assign]
            pool = transports.HttpPool("twice.test", fake.port, answered, max_connections=8)
            await pool.open(3)  # ::1 refuses; 127.0.0.1 is kept
            for rid in range(5):  # 3 connections, then 2 more opened on demand
                pool.send(rid, b"GET /v2/models/m HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.wait_for(all_answered.wait(), 10)
            await pool.aclose()

        asyncio.run(scenario())
    assert looked_up == ["twice.test"]
    assert answers == [200] * 5


def test_a_server_dying_mid_run_counts_the_unsent_and_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Requests that found no connection were in no count, and bench exited 0."""
    out = tmp_path / "run.json"
    with fake_v2_server(dies_at_first_post=True) as fake:
        argv = ["bench", "--http", fake.address, "--model", "m", "--duration", "0.5",
                "--warmup", "0", "--rate", "100", "--timeout-ms", "500,900",
                "--connections", "2", "--drain", "1", "-q", "--json", str(out)]  # fmt: skip
        assert cli_main(argv) == 3
    doc = json.loads(out.read_text())
    unsent = doc["generator"]["unsent"]
    assert unsent > 0
    assert doc["overall"]["unsent"] == unsent
    # (at the top too, as a replay's result has them: found by a tester)
    assert (doc["unsent"], doc["unanswered"]) == (unsent, doc["overall"]["unanswered"])
    assert sum(c["unsent"] for c in doc["classes"]) == unsent
    printed = capsys.readouterr().out
    head = printed.splitlines()[1].split()
    assert head[head.index("errors") + 1] == "unsent"
    assert f"{unsent} requests were not sent" in printed


def test_bench_help_names_its_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["bench", "--help"])
    assert "3 some requests could not be sent" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("flags", [["--rate", "5"], ["--arrival", "constant"]])
def test_closed_loop_refuses_open_loop_flags(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Closed-loop clients send as their answers come: --rate and --arrival would be ignored
    (a tester's --mode closed --rate 5 ran at 1,674 requests/s), so they are refused."""
    assert cli_main(bench("--mode", "closed", *flags)) == 2
    err = capsys.readouterr().err
    assert f"{flags[0]} applies to --mode open only" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--rtol", "0.1"], "--rtol take effect only with --compare-outputs"),
        (["--rtol", "0.1", "--atol", "1"], "--rtol and --atol take effect only with"),
        (["--rtol", "0.1", "--compare-outputs"], None),
        ([], None),
    ],
)
def test_replay_warns_of_tolerances_given_without_compare_outputs(
    flags: list[str], said: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """They were taken in silence, comparing nothing (found by a tester)."""
    import argparse

    from duetime.tools import replay

    parser = argparse.ArgumentParser()
    replay.add_arguments(parser)
    config = replay.config_from_args(
        parser.parse_args(["x.cap", "--target", f"http://{NOWHERE}", *flags])
    )
    err = capsys.readouterr().err
    if said is None:
        assert err == ""
    else:
        assert said in err
    assert config.rtol == (0.1 if "--rtol" in flags else 1e-5)
    assert config.atol == (1.0 if "--atol" in flags else 1e-6)
