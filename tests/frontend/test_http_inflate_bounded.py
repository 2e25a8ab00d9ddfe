"""Compressed request bodies inflated off the loop are bounded: one at a time a connection, on
a few workers shared by the server, what they inflate reserved in the budget for big bodies;
and a compressed request waiting its turn is dated from its arrival, as any other.

NOTE: each body inflating past the inline part had a thread of its own and reserved nothing:
one connection pipelining 12 deflate bodies of 60 KB (735 KB sent) inflated 12 x 60 MB at once
on 12 threads, the server's RSS 191 -> 1170 MB; and a gzip request waiting behind answers its
client had not read was dated from when it started, never refused at its due time (found by a
reviewer)."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RunningServer, read_answers, serving, tight_tile_server
from repo_models import scale_model, write_version

from duetime.config import ServerSettings
from duetime.frontend import rest

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20


def binary_body(x: np.ndarray, pad: int = 0, timeout_us: int = 0) -> tuple[bytes, int]:
    """A binary request's body for `x` (its JSON head padded with `pad` spaces), its output in
    binary too, due `timeout_us` after it arrives (0: no due time); and its JSON head's length."""
    doc: dict[str, Any] = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }  # fmt: skip
    if timeout_us:
        doc["parameters"] = {"timeout": timeout_us}
    head = json.dumps(doc).encode() + b" " * pad
    return head + x.tobytes(), len(head)


def compressed(model: str, body: bytes, length: int, coding: str = "gzip") -> bytes:
    """A raw HTTP/1.1 request to `model` with `body` compressed (`coding`)."""
    packed = gzip.compress(body, 1) if coding == "gzip" else zlib.compress(body, 1)
    return (
        b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: %s\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
        % (model.encode(), coding.encode(), length, len(packed))
    ) + packed


def connect(server: RunningServer, receive_buffer: int = 0) -> socket.socket:
    sock = socket.socket()
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    host, port = server.http.rsplit(":", 1)
    sock.connect((host, int(port)))
    sock.settimeout(30)
    return sock


def y_of(body: bytes) -> np.ndarray:
    return np.frombuffer(body[body.index(b"}}]}") + 4 :], np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Model 'double' (y = 2x, FP32 [-1, 4]); bodies up to 8 MiB; big bodies held at 4 MiB."""
    repo: Path = tmp_path_factory.mktemp("repo")
    write_version(repo, "double", 1, scale_model(2.0))
    (repo / "double" / "config.toml").write_text("max_batch_size = 0\n")
    settings = ServerSettings(
        model_repository=repo,
        http_port=0,
        grpc_port=0,
        max_body_bytes=8 * MiB,
        max_inflight_bytes=4 * MiB,
    )
    with serving(settings) as running:
        yield running


class Watch:
    """A stand-in for zlib's decompressor that notes, for the steps run off the loop, the
    threads that run them and how many of one connection's run at once. A step off the loop
    waits (a while at most) for another to join it, so that overlapping ones overlap."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.running = 0
        self.most = 0
        self.joined = threading.Event()

    def wrap(self, inflater: Any) -> Any:
        watch = self

        class Watched:
            def decompress(self, data: bytes, most: int = 0) -> bytes:
                thread = threading.current_thread()
                if not thread.name.startswith("duetime-inflate"):
                    return inflater.decompress(data, most)  # type: ignore[no-any-return]
                with watch.lock:
                    if thread not in watch.threads:
                        watch.threads.append(thread)
                    watch.running += 1
                    watch.most = max(watch.most, watch.running)
                    if watch.running > 1:
                        watch.joined.set()
                try:
                    watch.joined.wait(0.3)  # (not a timing: the chance to overlap)
                    return inflater.decompress(data, most)  # type: ignore[no-any-return]
                finally:
                    with watch.lock:
                        watch.running -= 1

            def __getattr__(self, name: str) -> Any:
                return getattr(inflater, name)

        return Watched()


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Watch:
    watch = Watch()
    original = zlib.decompressobj

    def decompressobj(*args: Any, **kwargs: Any) -> Any:
        return watch.wrap(original(*args, **kwargs))

    monkeypatch.setattr(rest.zlib, "decompressobj", decompressobj)
    return watch


def test_one_connection_inflates_one_body_at_a_time_on_shared_workers(
    server: RunningServer, watch: Watch
) -> None:
    """Pipelined big compressed bodies: inflated one after the other, on the shared workers
    (each had a thread of its own, all inflating at once), and answered in order."""
    xs = [np.full((60_000, 4), i, np.float32) for i in range(6)]  # ~1 MB each inflated
    raw = b"".join(compressed("double", *binary_body(x), coding="deflate") for x in xs)
    with connect(server) as sock:
        sock.sendall(raw)
        got = read_answers(sock.makefile("rb"), len(xs))
    assert [status for status, _ in got] == [200] * len(xs)
    for x, (_, body) in zip(xs, got, strict=True):
        np.testing.assert_array_equal(y_of(body), 2 * x.ravel())
    assert watch.threads  # (inflated off the loop)
    assert watch.most == 1
    assert len(watch.threads) <= 2


def test_what_a_body_inflates_to_is_reserved_in_the_big_body_budget(
    server: RunningServer,
) -> None:
    """A body inflating to 3 MB while another connection holds 3 MiB of the 4 MiB for big
    bodies: refused (503, retry later), as a chunked body that does not fit is; alone, it
    is answered (it went through whatever it inflated to)."""
    x = np.ones((200_000, 4), np.float32)  # 3.2 MB inflated
    request = compressed("double", *binary_body(x))
    host = b"POST /v2/models/double/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    with connect(server) as holder, connect(server) as sock:
        holder.sendall(host % (3 * MiB) + b"{" * 1000)  # (its room is reserved, then it stalls)
        _wait_reserved(server, 3 * MiB)
        sock.sendall(request)
        [(status, body)] = read_answers(sock.makefile("rb"), 1)
        assert status == 503, body
        assert "big request bodies" in json.loads(body)["error"]
    with connect(server) as sock:
        sock.sendall(request)
        [(status, body)] = read_answers(sock.makefile("rb"), 1)
    assert status == 200
    np.testing.assert_array_equal(y_of(body), 2 * x.ravel())


def test_a_body_alone_fits_whatever_its_compressed_and_inflated_sizes_add_to(
    server: RunningServer,
) -> None:
    """Alone on the server, a body whose compressed bytes (reserved as it came) and inflated
    ones add to more than the 4 MiB for big bodies is answered. (Its own compressed bytes were
    counted as others': it was refused 503 "retry later" on an idle server, every time.)"""
    x = np.random.default_rng(0).random((200_000, 4), dtype=np.float32)  # (compresses little)
    request = compressed("double", *binary_body(x))
    assert len(request) > 2 * MiB  # (and 3.2 MB inflated: 4 MiB is passed only together)
    with connect(server) as sock:
        sock.sendall(request)
        [(status, body)] = read_answers(sock.makefile("rb"), 1)
    assert status == 200, body
    np.testing.assert_array_equal(y_of(body), 2 * x.ravel())


def _wait_reserved(server: RunningServer, size: int) -> None:
    """Until the server holds `size` bytes or more for big bodies."""
    deadline = time.monotonic() + 10
    while True:
        intakes = {connection._intake for connection in server.server._connections}
        if any(intake.reserved >= size for intake in intakes):
            return
        assert time.monotonic() < deadline, "the body's room was never reserved"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server of tile (400 KB of answer a row) whose big answers not yet read are bounded to
    1 MiB."""
    with tight_tile_server(tmp_path_factory.mktemp("unsent-http")) as running:
        yield running


@pytest.mark.parametrize("pad", [0, 400_000], ids=["inflated-ahead", "inflated-once-started"])
def test_a_pipelined_compressed_request_held_back_is_due_after_its_arrival(
    tight: RunningServer, pad: int
) -> None:
    """A gzip request due 200 ms after it came, behind answers its client had not read, was
    dated from when it started, and ran once they were read (500 ms later): 504 now. One that
    inflates to more than the loop inflates ahead is dated from its arrival too."""
    body, length = binary_body(np.ones((10, 4), np.float32))  # (4 MB answers)
    plain = (
        b"POST /v2/models/tile/infer HTTP/1.1\r\nHost: x\r\n"
        b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (length, len(body))
    ) + body
    late = compressed("tile", *binary_body(np.ones((1, 4), np.float32), pad, 200_000))
    with connect(tight, receive_buffer=4096) as sock:
        sock.sendall(plain * 2 + late)
        time.sleep(0.5)  # (its due time passes)
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        got = read_answers(sock.makefile("rb"), 4)
    assert [status for status, _ in got] == [200, 200, 504, 200]
    message = json.loads(got[2][1])["error"]
    assert message.startswith("Request timeout expired: model 'tile'"), message


def test_a_v1_predict_body_is_inflated_off_the_loop(server: RunningServer, watch: Watch) -> None:
    """It was inflated whole on the loop (only v2's went off it)."""
    rows = np.arange(4 * 60_000, dtype=np.float32).reshape(-1, 4)
    body = json.dumps({"instances": [rows.tolist()]}).encode()  # ~2 MB, one example
    packed = gzip.compress(body, 1)
    with connect(server) as sock:
        sock.sendall(
            b"POST /v1/models/double:predict HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
            b"Content-Length: %d\r\n\r\n" % len(packed) + packed
        )
        [(status, answer)] = read_answers(sock.makefile("rb"), 1)
    assert status == 200, answer[:300]
    np.testing.assert_array_equal(np.array(json.loads(answer)["predictions"][0]), 2 * rows)
    assert watch.threads


def test_a_body_the_workers_fail_to_inflate_is_answered_500_counted_and_kept_alive(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A MemoryError inflating: 500, counted in duetime_requests_refused_total (it was not),
    the connection kept open for the next request."""
    original = zlib.decompressobj

    class Failing:
        def __init__(self, inflater: Any) -> None:
            self.inflater = inflater

        def decompress(self, data: bytes, most: int = 0) -> bytes:
            if threading.current_thread().name.startswith("duetime-inflate"):
                raise MemoryError
            return self.inflater.decompress(data, most)  # type: ignore[no-any-return]

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inflater, name)

    monkeypatch.setattr(
        rest.zlib, "decompressobj", lambda *args, **kwargs: Failing(original(*args, **kwargs))
    )
    samples = "duetime_requests_refused_total"
    before = server.samples(samples, "status", "reason").get(("500", "InternalError"), 0)
    x = np.ones((60_000, 4), np.float32)
    with connect(server) as sock:
        sock.sendall(compressed("double", *binary_body(x)))
        [(status, body)] = read_answers(sock.makefile("rb"), 1)
        assert status == 500, body
        assert "MemoryError" in json.loads(body)["error"]
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        [(status, _)] = read_answers(sock.makefile("rb"), 1)
        assert status == 200
    after = server.samples(samples, "status", "reason")[("500", "InternalError")]
    assert after == before + 1
