"""A well-behaved client's latency while other clients misbehave: slowloris, 100 MB bodies.

    python3 bench/abuse.py [--rate 1000] [--duration 8] [--repeats 3]
                           [--out bench/results/abuse.json]

Each scenario starts a fresh server (`duetime serve`, mlp only, its event loop on the first CPU)
and drives it open loop over HTTP binary at --rate requests/s (the load generator on the last
CPU), while abusers run in a process of their own:

- baseline: no one else;
- slowloris: --lorises connections that each send a request line, then one header line every
  second, never finishing the head (the server cuts them off after --request-read-timeout-s,
  2 s here, and they reconnect);
- 100 MB refused: --uploaders clients that each announce a 100 MB body and send all of it as
  fast as they can, then do it again; the server's 64 MiB limit refuses it from the head (413);
- 8 MB accepted: the same with 8 MB bodies under --max-body-bytes 9 MB: each body is read
  whole, then refused as invalid (a batch far over mlp's largest) without running;
- big answers: --downloaders clients that each ask a model of the repository (`big`, which
  repeats its input `x` `n` times) for a 4 MB answer in JSON (1M floats, ~10 MB of text) or a
  100 MB answer in the binary extension, read it whole, and ask again.

Rounds interleave the scenarios (each run first waits for other programs to go quiet, as this
machine is shared) and the table shows each one's median P50/P99 over the rounds, and the P99's
ratio to the baseline's (the target is at most 2). A last scenario repeats the 8 MB one with
glibc's malloc told to keep big buffers (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_): the
server then copies bodies into memory it already has instead of fresh pages.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import selectors
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).parent))
from common import print_table, server_process, wait_for_quiet

from duetime.demo import write_demo_repository
from duetime.execution.affinity import pin_current_thread
from duetime.tools.config import BenchConfig
from duetime.tools.loadgen import run_bench

ALL_CPUS = frozenset(os.sched_getaffinity(0))
SERVER_CPU = min(ALL_CPUS)
CLIENT_CPUS = frozenset({max(ALL_CPUS)})
READ_TIMEOUT_S = 2.0
MALLOC_TUNED = (
    ("MALLOC_MMAP_THRESHOLD_", str(64 << 20)),
    ("MALLOC_TRIM_THRESHOLD_", str(512 << 20)),
)
"""glibc: serve big allocations from the heap and keep freed memory, so each body's buffers are
not fresh pages that fault in (several times the cost of copying the bytes on this VM)."""
MB = 1_000_000


@dataclass(frozen=True)
class Scenario:
    name: str
    server_flags: tuple[str, ...] = ()
    lorises: int = 0
    uploaders: int = 0
    body_bytes: int = 0
    """Body size each uploader sends, again and again."""
    downloaders: int = 0
    answer_floats: int = 0
    """Floats in the answer each downloader asks for, again and again."""
    binary_answers: bool = False
    server_env: tuple[tuple[str, str], ...] = ()


@dataclass
class AbuseReport:
    """What the abusers managed: connections opened, answers seen, bytes sent."""

    connections: int = 0
    bytes_sent: int = 0
    statuses: dict[int, int] = field(default_factory=dict)

    def saw(self, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1


# -- abusers (a process of their own) --------------------------------------------------------------


def _connect(host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _status_of(data: bytes) -> int | None:
    return int(data[9:12]) if data.startswith(b"HTTP/1.1 ") and len(data) >= 12 else None


def run_lorises(
    host: str, port: int, count: int, stop: threading.Event, report: AbuseReport
) -> None:
    """`count` connections that never finish their head: one header line a second each."""
    selector = selectors.DefaultSelector()
    head = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: loris\r\n"

    def open_one() -> None:
        sock = _connect(host, port)
        sock.setblocking(False)
        sock.send(head)
        report.connections += 1
        report.bytes_sent += len(head)
        selector.register(sock, selectors.EVENT_READ)

    for _ in range(count):
        open_one()
    next_line = time.monotonic() + 1.0
    while not stop.is_set():
        for key, _ in selector.select(timeout=0.1):
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            status = _status_of(data)
            if status is not None:
                report.saw(status)
            if not data:
                selector.unregister(sock)
                sock.close()
                open_one()
        if time.monotonic() >= next_line:
            next_line += 1.0
            for key in list(selector.get_map().values()):
                try:
                    sent = key.fileobj.send(b"X-Loris: 1\r\n")  # type: ignore[union-attr]
                    report.bytes_sent += sent
                except OSError:
                    pass
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]


def upload_body(size: int) -> tuple[bytes, bytes]:
    """An mlp request of `size` bytes in the binary extension: its head and one chunk of body.
    The tensor's batch is far over mlp's max_batch_size, so a server that reads it all refuses it
    (400) without running it."""
    rows = size // 160
    header = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 40],
                     "parameters": {"binary_data_size": rows * 160}}]}
    ).encode()  # fmt: skip
    total = len(header) + rows * 160
    head = (
        f"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: uploader\r\nContent-Length: {total}\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode() + header
    return head, struct.pack("<f", 0.5) * 40 * (MB // 160)  # 1 MB of rows


def _connections(
    host: str, port: int, stop: threading.Event, report: AbuseReport
) -> Iterator[socket.socket]:
    """Connections to the server, a new one each time the last is done with, until `stop`."""
    while not stop.is_set():
        try:
            sock = _connect(host, port)
        except OSError:
            continue
        report.connections += 1
        yield sock


def run_uploader(
    host: str, port: int, size: int, stop: threading.Event, report: AbuseReport
) -> None:
    """Sends `size`-byte bodies back to back, as fast as it can, without waiting for answers."""
    head, chunk = upload_body(size)
    rows_bytes = (size // 160) * 160
    for sock in _connections(host, port, stop, report):
        try:
            with sock:
                sock.sendall(head)
                left = rows_bytes
                while left > 0 and not stop.is_set():
                    piece = chunk[: min(left, len(chunk))]
                    sock.sendall(piece)
                    left -= len(piece)
                    report.bytes_sent += len(piece)
                sock.settimeout(5)
                status = _status_of(sock.recv(65536))
                if status is not None:
                    report.saw(status)
        except OSError:
            pass  # refused mid-upload and reset: connect again


def big_answer_request(floats: int, binary: bool) -> bytes:
    """A JSON request to the `big` model for `floats` copies of 0.5."""
    body = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [0.5]},
                    {"name": "n", "datatype": "INT64", "shape": [1], "data": [floats]}],
         "outputs": [{"name": "y", "parameters": {"binary_data": binary}}]}
    ).encode()  # fmt: skip
    head = (
        "POST /v2/models/big/infer HTTP/1.1\r\nHost: downloader\r\n"
        f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n\r\n"
    ).encode()
    return head + body


def run_downloader(
    host: str, port: int, scenario: Scenario, stop: threading.Event, report: AbuseReport
) -> None:
    """Asks for big answers on one keep-alive connection, reading each whole, back to back."""
    request = big_answer_request(scenario.answer_floats, scenario.binary_answers)
    for sock in _connections(host, port, stop, report):
        sock.settimeout(30)
        try:
            with sock:
                while not stop.is_set():
                    sock.sendall(request)
                    report.bytes_sent += len(request)
                    data = b""
                    while b"\r\n\r\n" not in data:
                        piece = sock.recv(65536)
                        if not piece:
                            raise OSError("closed")
                        data += piece
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    left = length - len(body)
                    while left > 0:
                        piece = sock.recv(min(left, 1 << 20))
                        if not piece:
                            raise OSError("closed")
                        left -= len(piece)
                    status = _status_of(head)
                    if status is not None:
                        report.saw(status)
        except OSError:
            pass


def abuse(host: str, port: int, scenario: Scenario, stop: Any, out: Any) -> None:
    """The abusers' process: runs until `stop` is set, then sends its AbuseReport to `out`."""
    pin_current_thread(CLIENT_CPUS)
    # NOTE: abusers are other machines' clients; here they share the load generator's CPU, so
    # they run at the lowest priority to take only what the generator leaves.
    os.nice(19)
    report = AbuseReport()
    done = threading.Event()
    threads = []
    if scenario.lorises:
        threads.append(
            threading.Thread(target=run_lorises, args=(host, port, scenario.lorises, done, report))
        )
    for _ in range(scenario.uploaders):
        threads.append(
            threading.Thread(
                target=run_uploader, args=(host, port, scenario.body_bytes, done, report)
            )
        )
    for _ in range(scenario.downloaders):
        threads.append(
            threading.Thread(target=run_downloader, args=(host, port, scenario, done, report))
        )
    for thread in threads:
        thread.start()
    stop.wait()
    done.set()
    for thread in threads:
        thread.join(15)
    out.send(report)


# -- the well-behaved client -----------------------------------------------------------------------


def measure(repo: Path, scenario: Scenario, args: argparse.Namespace) -> dict[str, Any]:
    flags = ("--cpus", str(SERVER_CPU), "--no-metrics", "--request-read-timeout-s",
             str(READ_TIMEOUT_S), *scenario.server_flags)  # fmt: skip
    context = multiprocessing.get_context("spawn")
    others = wait_for_quiet([os.getpid()], limit_s=args.quiet_wait)
    with server_process(repo, *flags, env=dict(scenario.server_env)) as server:
        stop = context.Event()
        receive, send = context.Pipe(duplex=False)
        abusers = context.Process(
            target=abuse, args=(server.host, server.http_port, scenario, stop, send), daemon=True
        )
        abusers.start()
        time.sleep(0.5)  # the abusers are connected and at it before the measured window
        config = BenchConfig(
            model="mlp", protocol="http-binary", address=f"{server.host}:{server.http_port}",
            mode="open", rate=args.rate, duration_s=args.duration, warmup_s=1.0,
            connections=8, seed=1,
        )  # fmt: skip
        pin_current_thread(CLIENT_CPUS)
        try:
            result = run_bench(config)
        finally:
            pin_current_thread(ALL_CPUS)
            stop.set()
        report: AbuseReport = receive.recv() if receive.poll(30) else AbuseReport()
        abusers.join(10)
    overall = result.overall
    return {
        "scenario": scenario.name,
        "p50_ms": overall.latency.p50_ms,
        "p99_ms": overall.latency.p99_ms,
        "max_ms": overall.latency.max_ms,
        "ok": overall.ok,
        "errors": overall.errors + overall.rejected + overall.expired + overall.unanswered,
        "gen_late_sends_%": 100.0 * (result.generator.late_send_fraction or 0.0),
        "other_cores_before": others,
        "abuser_connections": report.connections,
        "abuser_mb_sent": report.bytes_sent / MB,
        "abuser_answers": dict(sorted(report.statuses.items())),
    }


def summarize(runs: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    rows = []
    for name in names:
        mine = [r for r in runs if r["scenario"] == name]
        answers: dict[int, int] = {}
        for run in mine:
            for status, count in run["abuser_answers"].items():
                answers[status] = answers.get(status, 0) + count
        rows.append({
            "scenario": name,
            "p50_ms": statistics.median(r["p50_ms"] for r in mine),
            "p99_ms": statistics.median(r["p99_ms"] for r in mine),
            "worst_p99_ms": max(r["p99_ms"] for r in mine),
            "errors": sum(r["errors"] for r in mine),
            "abuser_conns": sum(r["abuser_connections"] for r in mine),
            "abuser_MB": sum(r["abuser_mb_sent"] for r in mine),
            "abuser_answers": " ".join(f"{s}x{n}" for s, n in sorted(answers.items())),
        })  # fmt: skip
    base = rows[0]["p99_ms"]
    for row in rows:
        row["p99_ratio"] = row["p99_ms"] / base
    return rows


def write_big_answer_model(path: Path) -> None:
    """`big`: y = x (FP32 [1]) repeated n (INT64 [1]) times, an answer of any size."""
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "n"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["count"])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=1000.0, help="well-behaved requests/s")
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per run")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the scenarios")
    parser.add_argument("--lorises", type=int, default=500)
    parser.add_argument("--uploaders", type=int, default=4)
    parser.add_argument("--downloaders", type=int, default=2)
    parser.add_argument(
        "--only", default="",
        help="comma-separated words: run only the scenarios whose names hold one (baseline runs "
        "always), e.g. --only answers",
    )  # fmt: skip
    parser.add_argument(
        "--quiet-wait", type=float, default=30.0,
        help="before each run, wait up to this long for other programs to go quiet",
    )  # fmt: skip
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "abuse.json"
    )
    args = parser.parse_args()
    uploaders = args.uploaders
    scenarios = [
        Scenario("baseline"),
        Scenario(f"slowloris x{args.lorises}", lorises=args.lorises),
        Scenario(f"100 MB refused x{uploaders}", uploaders=uploaders, body_bytes=100 * MB),
        Scenario(
            f"8 MB accepted x{uploaders}", ("--max-body-bytes", str(9 * MB)),
            uploaders=uploaders, body_bytes=8 * MB,
        ),
        Scenario(
            f"8 MB accepted x{uploaders}, malloc tuned", ("--max-body-bytes", str(9 * MB)),
            uploaders=uploaders, body_bytes=8 * MB, server_env=MALLOC_TUNED,
        ),
        Scenario(
            f"4 MB JSON answers x{args.downloaders}", downloaders=args.downloaders,
            answer_floats=MB, binary_answers=False,
        ),
        Scenario(
            f"100 MB binary answers x{args.downloaders}", downloaders=args.downloaders,
            answer_floats=25 * MB, binary_answers=True,
        ),
    ]  # fmt: skip
    if args.only:
        words = [w.strip() for w in args.only.split(",") if w.strip()]
        scenarios = [
            s for s in scenarios if s.name == "baseline" or any(w in s.name for w in words)
        ]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        demo = write_demo_repository(Path(tmp) / "demo")
        repo = Path(tmp) / "mlp-only"
        shutil.copytree(demo / "mlp", repo / "mlp")
        write_big_answer_model(repo / "big" / "1" / "model.onnx")
        for round_ in range(args.repeats):
            for scenario in scenarios:
                run = measure(repo, scenario, args)
                run["round"] = round_
                runs.append(run)
                p50, p99, answers = run["p50_ms"], run["p99_ms"], run["abuser_answers"]
                print(
                    f"round {round_}: {scenario.name}: p50 {p50:.3f} ms, p99 {p99:.3f} ms, "
                    f"abusers {answers}",
                    flush=True,
                )
    rows = summarize(runs, [s.name for s in scenarios])
    columns = ["scenario", "p50_ms", "p99_ms", "p99_ratio", "worst_p99_ms", "errors",
               "abuser_conns", "abuser_MB", "abuser_answers"]  # fmt: skip
    print_table(
        f"mlp over HTTP binary, open loop {args.rate:g} req/s, median of {args.repeats} runs "
        f"of {args.duration:g} s (latency in ms)", rows, columns,
    )  # fmt: skip
    worst = max(row["p99_ratio"] for row in rows)
    print(f"\nworst P99 ratio to the baseline: {worst:.2f} (target <= 2)")
    result = {
        "machine": {"platform": platform.platform(), "cpus": sorted(ALL_CPUS)},
        "settings": {
            "rate": args.rate,
            "duration_s": args.duration,
            "repeats": args.repeats,
            "lorises": args.lorises,
            "uploaders": args.uploaders,
            "downloaders": args.downloaders,
            "request_read_timeout_s": READ_TIMEOUT_S,
        },
        "summary": rows,
        "worst_p99_ratio": worst,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
