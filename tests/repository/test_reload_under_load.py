"""Hot reload under traffic: clients keep calling a model over HTTP and gRPC while new versions
are copied (slowly, as a real copy is) into the polled repository, the old versions are retired,
and another model is removed. Not one request may fail."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import start_server, stop_server
from repo_models import inputs, scale_model, write_version

from duetime.config import ServerSettings


class Stream(threading.Thread):
    """One client calling model 'm' back to back until stopped; records answers and failures."""

    def __init__(self, client: Any, module: Any) -> None:
        super().__init__(daemon=True)
        self.client, self.module = client, module
        self.stop = threading.Event()
        self.factors: list[float] = []
        self.failures: list[str] = []

    def run(self) -> None:
        tensor = self.module.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(inputs()["x"])
        while not self.stop.is_set():
            try:
                result = self.client.infer("m", [tensor])
                self.factors.append(float(result.as_numpy("y")[0, 0]))
            except Exception as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")


def slow_copy(data: bytes, target: Path, pause_s: float) -> None:
    """Write `data` in two halves with a pause, as a copy over a slow disk or network would."""
    target.parent.mkdir(parents=True)
    with target.open("wb") as handle:
        handle.write(data[: len(data) // 2])
        handle.flush()
        time.sleep(pause_s)
        handle.write(data[len(data) // 2 :])


def wait_for(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_no_request_fails_while_versions_are_swapped(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    write_version(tmp_path, "k", 1, scale_model(9))
    settings = ServerSettings(
        model_repository=tmp_path, http_port=0, grpc_port=0, model_control_mode="poll",
        repository_poll_secs=0.1, repository_stable_secs=0.5, unload_drain_secs=5,
    )  # fmt: skip
    running, thread = start_server(settings)
    http = httpclient.InferenceServerClient(running.http)
    streams = [
        Stream(httpclient.InferenceServerClient(running.http), httpclient),
        Stream(httpclient.InferenceServerClient(running.http), httpclient),
        Stream(grpcclient.InferenceServerClient(running.grpc), grpcclient),
        Stream(grpcclient.InferenceServerClient(running.grpc), grpcclient),
    ]
    try:
        for stream in streams:
            stream.start()
        time.sleep(0.3)

        def states() -> dict[tuple[str, str], str]:
            return {
                (e["name"], e.get("version", "")): e.get("state", "")
                for e in http.get_model_repository_index()
            }

        for version in (2, 3):
            # a copy in progress: the first half sits on disk for longer than a poll period
            slow_copy(scale_model(version), tmp_path / "m" / str(version) / "model.onnx", 0.3)
            wait_for(lambda v=version: states().get(("m", str(v))) == "READY")
            wait_for(lambda v=version: states().get(("m", str(v - 1))) == "UNAVAILABLE")
        shutil.rmtree(tmp_path / "k")
        wait_for(lambda: states().get(("k", "1")) == "UNAVAILABLE")
        time.sleep(0.3)
        final = http.get_model_repository_index()
    finally:
        for stream in streams:
            stream.stop.set()
        for stream in streams:
            stream.join(timeout=30)
        stop_server(running, thread)

    failures = [f for stream in streams for f in stream.failures]
    assert failures == []
    factors = [f for stream in streams for f in stream.factors]
    assert set(factors) == {1.0, 2.0, 3.0}
    for stream in streams:
        assert stream.factors[-1] == 3.0
        assert len(stream.factors) > 20
        assert stream.factors == sorted(stream.factors)  # a client never sees an older version
    # the half-written copies were never tried: no load failed
    assert [e for e in final if "cannot load" in e.get("reason", "")] == []
