"""The `duetime` command in a subprocess: serve, stop on SIGTERM, write the demo, refuse bad use."""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

pytestmark = pytest.mark.timeout(60)

STARTUP_GUARD_S = 45.0
MLP_ONLY = ("--model-control-mode", "explicit", "--load-model", "mlp")
"""Serve only the demo's mlp: a listener's error comes after the load, of ~1 s, not ~5 s."""
READY = re.compile(
    r"^duetime ready: http://(\S+) grpc://(\S+)(?: metrics://(\S+))?(?: \(not ready: .*\))?$"
)


def duetime_env(tmp_path: Path) -> dict[str, str]:
    """The environment minus DUETIME_* settings, with a private cache folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUETIME_")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    return env


def run_duetime(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duetime", *args], cwd=tmp_path, env=duetime_env(tmp_path),
        capture_output=True, text=True, timeout=STARTUP_GUARD_S,
    )  # fmt: skip


@dataclass
class Serving:
    process: subprocess.Popen[bytes]
    http: str
    grpc: str
    stderr_path: Path
    line: str = ""
    """The ready line as printed."""

    def stop(self) -> int:
        """SIGTERM, then the exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=STARTUP_GUARD_S)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()


def wait_for_ready_line(process: subprocess.Popen[bytes], stderr_path: Path) -> re.Match[str]:
    """Read stdout until the ready line; fail if it does not come within the guard."""
    assert process.stdout is not None
    deadline = time.monotonic() + STARTUP_GUARD_S
    pending = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                pytest.fail(f"no ready line within {STARTUP_GUARD_S} s: {stderr_path.read_text()}")
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                code = process.wait()
                pytest.fail(f"duetime exited with {code} before ready: {stderr_path.read_text()}")
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if match := READY.match(line.decode()):
                    return match


@contextmanager
def serving(tmp_path: Path, *args: str) -> Iterator[Serving]:
    """`duetime serve ARGS --http-port 0 --grpc-port 0`, killed at the end if still running."""
    stderr_path = tmp_path / "stderr.txt"
    command = [
        sys.executable,
        "-m",
        "duetime",
        "serve",
        *args,
        "--http-port",
        "0",
        "--grpc-port",
        "0",
    ]
    with (
        stderr_path.open("wb") as stderr,
        subprocess.Popen(
            command, cwd=tmp_path, env=duetime_env(tmp_path), stdout=subprocess.PIPE, stderr=stderr
        ) as process,
    ):
        try:
            match = wait_for_ready_line(process, stderr_path)
            yield Serving(process, match[1], match[2], stderr_path, match[0])
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def infer_mlp_both_ways(http: str, grpc: str) -> None:
    x = np.ones((2, 40), np.float32)
    client = httpclient.InferenceServerClient(http)
    try:
        tensor = httpclient.InferInput("x", [2, 40], "FP32")
        tensor.set_data_from_numpy(x)
        over_http = client.infer("mlp", [tensor]).as_numpy("y")
    finally:
        client.close()
    client = grpcclient.InferenceServerClient(grpc)
    try:
        tensor = grpcclient.InferInput("x", [2, 40], "FP32")
        tensor.set_data_from_numpy(x)
        over_grpc = client.infer("mlp", [tensor], client_timeout=30).as_numpy("y")
    finally:
        client.close()
    assert over_http.shape == (2, 3)
    np.testing.assert_array_equal(over_http, over_grpc)


def test_serve_demo_answers_both_protocols_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The signal is said at once, at the default log level: the drain after it takes up to
    the grace (it drained in silence: found by a tester)."""
    with serving(tmp_path, "--demo") as server:
        infer_mlp_both_ways(server.http, server.grpc)
        assert server.stop() == 0
        assert (
            "duetime: SIGTERM: stopping; no new requests are taken, and those queued or running "
            "get up to 5 s to finish (--shutdown-grace-s)"
        ) in server.stderr.splitlines()
    assert (tmp_path / "cache" / "duetime" / "demo" / "resnet" / "1" / "model.onnx").is_file()


def test_demo_writes_the_repository(tmp_path: Path, demo_repo: Path) -> None:
    result = run_duetime(tmp_path, "demo", str(tmp_path / "repo"))
    assert result.returncode == 0, result.stderr
    assert str(tmp_path / "repo") in result.stdout
    for model in ("mlp", "resnet"):
        for name in ("config.toml", "1/model.onnx"):
            written = (tmp_path / "repo" / model / name).read_bytes()
            assert written == (demo_repo / model / name).read_bytes(), f"{model}/{name}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve"], "give a model repository folder or --demo"),
        (["serve", "somewhere", "--demo"], "give a model repository folder or --demo"),
        (["serve", "no-such-folder"], "model repository no-such-folder does not exist"),
        (["serve", "--demo", "--http-port", "70000"], "http_port"),
        (["serve", "--demo", "--cpu-dma-latency-us", "-1"], "cpu_dma_latency_us"),
        (["serve", "a", "--model-repository", "b"], "give the model repository once"),
        (["serve", "--model-store", "b", "--demo"], "give a model repository folder or --demo"),
        (["serve", "--repository", "no-such"], "model repository no-such does not exist"),
        (
            ["serve", "--model-repository", "a", "--model-repository", "b"],
            "give the model "
            "repository once: as the argument or --model-repository (duetime serves one",
        ),
        (
            ["serve", "--demo", "--load-model", "*", "--load-model", "mlp"],
            "field 'load_model' (--load-model): Value error, '*' loads every model: give it alone",
        ),
        (["serve", "--demo", "--record-sample", "2"], "field 'record_sample' (--record-sample)"),
        (
            [
                "serve",
                "--demo",
                *MLP_ONLY,
                "--host",
                "999.1.1.1",
                "--http-port",
                "0",
                "--no-metrics",
            ],
            "field 'host' (--host): cannot listen on 999.1.1.1:0 (HTTP)",
        ),
        (["demo", ""], "demo: PATH is empty"),
        ([], "command"),
    ],
    ids=[
        "no-repository",
        "both",
        "missing-folder",
        "bad-port",
        "bad-cpu-latency",
        "twice",
        "flag-and-demo",
        "flag-as-itch-run-names-it",
        "two-repositories",
        "load-all-and-one",
        "flag-named",
        "bad-host",
        "demo-nowhere",
        "no-command",
    ],
)
def test_bad_use_exits_2_with_a_message(tmp_path: Path, args: list[str], message: str) -> None:
    result = run_duetime(tmp_path, *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_the_repository_can_come_from_its_variable(tmp_path: Path) -> None:
    """`DUETIME_MODEL_REPOSITORY` was refused: "give a model repository folder or --demo"."""
    env = duetime_env(tmp_path) | {"DUETIME_MODEL_REPOSITORY": str(tmp_path / "nowhere")}
    result = subprocess.run(
        [sys.executable, "-m", "duetime", "serve", "--model-control-mode", "EXPLICIT"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=STARTUP_GUARD_S,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "nowhere does not exist" in result.stderr  # (and Triton's capitals were taken)


def test_ctrl_c_while_the_command_loads_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    # The command's modules take a second to import on a slow machine: a Ctrl-C then (here, raised
    # by the import itself, as Python raises it wherever the signal lands) ends with exit code 130.
    interrupt_the_import = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'duetime.cli':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from duetime.__main__ import main\n"
        "raise SystemExit(main())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", interrupt_the_import, "serve", "--demo"], cwd=tmp_path,
        env=duetime_env(tmp_path), capture_output=True, text=True, timeout=STARTUP_GUARD_S,
    )  # fmt: skip
    assert result.returncode == 130, result.stderr
    assert result.stderr == "duetime: interrupted\n"


def test_sigterm_while_the_models_load_stops_at_once(tmp_path: Path, demo_repo: Path) -> None:
    """A stop asked for during the start-up load waited for every model to load, then said
    ready, then stopped (21 s with big models). Here a load takes 60 s (made slow in the
    child): the stop ends the command at once, exit code 0, never ready."""
    slow_loads = (
        "import sys, time\n"
        "import duetime.repository.manager as manager\n"
        "def load_version(*args, **kwargs):\n"
        "    print('loading', flush=True)\n"
        "    time.sleep(60)\n"
        "manager.load_version = load_version\n"
        "from duetime.__main__ import main\n"
        "raise SystemExit(main())\n"
    )
    command = [sys.executable, "-c", slow_loads, "serve", str(demo_repo), "--http-port", "0",
               "--grpc-port", "0", "--metrics-port", "0"]  # fmt: skip
    with subprocess.Popen(
        command, cwd=tmp_path, env=duetime_env(tmp_path), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    ) as process:  # fmt: skip
        try:
            assert process.stdout is not None
            assert process.stdout.readline() == "loading\n"
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            stdout, stderr = process.communicate(timeout=STARTUP_GUARD_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert time.monotonic() - started < 20, "it waited for the load"
    assert process.returncode == 0, stderr
    assert "duetime: stopped before it was ready" in stderr
    assert "ready" not in stdout
    assert "Traceback" not in stderr


@pytest.mark.parametrize("flag", ["--http-port", "--grpc-port"])
def test_a_taken_port_is_a_clear_error_not_a_traceback(tmp_path: Path, flag: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        others = {"--http-port": "0", "--grpc-port": "0", flag: port}
        args = [arg for pair in others.items() for arg in pair]
        result = run_duetime(tmp_path, "serve", "--demo", *MLP_ONLY, *args, "--metrics-port", "0")
    assert result.returncode == 2, result.stderr
    assert f"field '{flag[2:].replace('-', '_')}' ({flag}): cannot listen" in result.stderr
    assert f"127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_broken_models_are_reported_and_the_rest_served(tmp_path: Path, demo_repo: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(demo_repo / "mlp", repo / "mlp")
    (repo / "corrupt" / "1").mkdir(parents=True)
    (repo / "corrupt" / "1" / "model.onnx").write_bytes(b"\x08\x07 this is not a protobuf \xff" * 9)
    shutil.copytree(demo_repo / "mlp", repo / "negative")
    (repo / "negative" / "config.toml").write_text("max_batch_size = -3\n")
    with serving(tmp_path, f"--model-repository={repo}") as server:  # Triton's flag
        infer_mlp_both_ways(server.http, server.grpc)
        client = httpclient.InferenceServerClient(server.http)
        try:
            assert not client.is_model_ready("corrupt")
            assert not client.is_model_ready("negative")
        finally:
            client.close()
        assert server.stop() == 0
        stderr = server.stderr
    corrupt = next(line for line in stderr.splitlines() if "model 'corrupt' not loaded" in line)
    assert str(repo / "corrupt" / "1" / "model.onnx") in corrupt
    negative = next(line for line in stderr.splitlines() if "model 'negative' not loaded" in line)
    assert str(repo / "negative" / "config.toml") in negative
    assert "max_batch_size" in negative
    assert "-3" in negative


def test_serve_demo_with_a_cache_it_cannot_write_says_so_in_one_line(tmp_path: Path) -> None:
    """A HOME that is no folder, a read-only cache (a user like `nobody`, a container): a
    traceback, exit 1 (found by a tester)."""
    (tmp_path / "not-a-folder").write_text("")
    env = duetime_env(tmp_path)
    env["XDG_CACHE_HOME"] = str(tmp_path / "not-a-folder")
    result = subprocess.run(
        [sys.executable, "-m", "duetime", "serve", "--demo"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=STARTUP_GUARD_S,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "--demo: cannot write the demo repository to " in result.stderr
    assert "set XDG_CACHE_HOME" in result.stderr


def received_until_closed(sock: socket.socket) -> bytes:
    """What `sock` receives until its server closes it (up to a reset: what came before it)."""
    received = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_sigterm_while_a_request_body_is_coming_answers_it(tmp_path: Path) -> None:
    """The request whose body was still coming was cut off (the connection closed: no answer,
    a broken pipe), which its client could not tell from a crash (found by a tester). Its body
    is read, and it is run, as the models serve on while a request is half read (it was
    refused 503, another tester found), the connection closing after."""
    body = json.dumps({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 40], "data": [0.1] * 40}],
        "id": "x" * 100_000,  # (a body read in several pieces: one of 16 KiB stopped it)
    }).encode()  # fmt: skip
    with serving(tmp_path, "--demo", *MLP_ONLY) as server:
        host, port = server.http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=20) as client:
            client.sendall(
                b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body[:20]
            )  # fmt: skip
            time.sleep(0.3)  # (the head is read)
            server.process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            client.sendall(body[20:])
            answer = received_until_closed(client)
        assert server.process.wait(timeout=STARTUP_GUARD_S) == 0
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:200]
    assert b'"id":"xxx' in answer


def _allowed_cpus(pid: int) -> dict[str, str]:
    """Each thread of process `pid` (its name and id) -> the CPUs it may run on, as listed."""
    allowed = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # (a thread that ended meanwhile)
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            listed = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.MULTILINE)
            assert listed is not None
            allowed[f"{name} ({tid})"] = listed[1]
    return allowed


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two CPUs to tell one from all",
)
def test_cpus_confines_every_thread_of_the_server(tmp_path: Path) -> None:
    """Found by a tester: with `--cpus 0`, the metrics exporter's thread, uvloop's and native
    threads started before the loop was pinned could run on every CPU."""
    cpu = str(max(os.sched_getaffinity(0)))
    with serving(tmp_path, "--demo", *MLP_ONLY, "--cpus", cpu, "--metrics-port", "0") as server:
        infer_mlp_both_ways(server.http, server.grpc)
        allowed = _allowed_cpus(server.process.pid)
        assert server.stop() == 0
    assert len(allowed) > 3
    assert {thread: cpus for thread, cpus in allowed.items() if cpus != cpu} == {}
