"""A compressed body the API inflates itself (a control request's) is inflated once the control
token is checked, and on the event loop only to `INFLATE_INLINE_BYTES` (413 past them); an
inference body, on whatever path the API routes as one, is inflated off the loop past them.

NOTE: control bodies were inflated on the loop before the token was checked, up to
--max-body-bytes: one client without the token held every other client 0.3-0.5 s with each
65 KB gzip body (64 MiB of spaces) it sent to /v2/logging; inference bodies on paths such as
'//v2/models/m/infer' were inflated whole on the loop too (found by a tester)."""

from __future__ import annotations

import gzip
import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RunningServer, serving
from repo_models import scale_model, write_version

from duetime.config import ServerSettings
from duetime.frontend import rest
from duetime.frontend.rest import INFLATE_INLINE_BYTES, Inflation

pytestmark = pytest.mark.timeout(120)

TOKEN = "t" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BOMB = gzip.compress(b" " * (16 << 20) + b"{}", 9)
"""16 KB of gzip inflating to 16 MiB of spaces, then an empty JSON object."""

CONTROL_PATHS = [
    "/v2/logging",
    "/v2/trace/setting",
    "/v2/models/m/trace/setting",
    "/v2/systemsharedmemory/region/r/register",
    "/v2/systemsharedmemory/unregister",
    "/v2/cudasharedmemory/region/r/register",
    "/v2/repository/models/m/unload",
    "/v2/repository/models/m/load",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Model 'm' (y = 2x, FP32 [-1, 4]); a control token; the default body limit (64 MiB)."""
    repo: Path = tmp_path_factory.mktemp("repo")
    write_version(repo, "m", 1, scale_model(2.0))
    (repo / "m" / "config.toml").write_text("max_batch_size = 0\n")  # (any rows at once)
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, model_control_mode="explicit",
        load_model=["m"], control_token=TOKEN,
    )  # fmt: skip
    with serving(settings) as running:
        yield running


@pytest.fixture
def inflated(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, int]]:
    """Each step of an inflation (`Inflation.more`): whether it ran on an inflation worker (off
    the loop), and the bytes inflated of its body after it."""
    steps: list[tuple[bool, int]] = []
    original = Inflation.more

    def recorded(self: Inflation, most: int) -> bool:
        worker = threading.current_thread().name.startswith("duetime-inflate")
        try:
            return original(self, most)
        finally:
            steps.append((worker, self.size))

    monkeypatch.setattr(rest.Inflation, "more", recorded)
    return steps


def post(server: RunningServer, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("POST", path, body, headers)
        answer = connection.getresponse()
        data = answer.read()
        return answer.status, json.loads(data) if data else None
    finally:
        connection.close()


def on_loop(steps: list[tuple[bool, int]]) -> int:
    """The most bytes inflated of a body on the loop."""
    return max((size for worker, size in steps if not worker), default=0)


@pytest.mark.parametrize("path", CONTROL_PATHS)
def test_a_control_request_without_the_token_is_refused_before_its_body_is_inflated(
    server: RunningServer, inflated: list[tuple[bool, int]], path: str
) -> None:
    status, doc = post(server, path, BOMB, {"Content-Encoding": "gzip"})
    assert status == 401, doc
    assert inflated == []


@pytest.mark.parametrize(
    "path",
    [
        "/v2/logging",
        "/v2/trace/setting",
        "/v2/models/m/trace/setting",
        "/v2/systemsharedmemory/region/r/register",
        "/v2/repository/models/m/unload",
        "/v2/repository/index",  # (needs no token)
    ],
)
def test_a_compressed_control_body_is_inflated_on_the_loop_within_the_inline_part(
    server: RunningServer, inflated: list[tuple[bool, int]], path: str
) -> None:
    status, doc = post(server, path, BOMB, {"Content-Encoding": "gzip", **AUTH})
    assert status == 413, doc
    assert f"{INFLATE_INLINE_BYTES}-byte limit" in doc["error"]
    assert "send it uncompressed" in doc["error"]
    assert 0 < on_loop(inflated) <= INFLATE_INLINE_BYTES + 1
    assert all(not worker for worker, _ in inflated)  # (the API's own: not a worker's)
    # a small one still is (see test_http_control_coding.py)
    small = gzip.compress(json.dumps({"log_verbose_level": 0}).encode())
    status, doc = post(server, "/v2/logging", small, {"Content-Encoding": "gzip", **AUTH})
    assert status == 200, doc


def binary_request(x: np.ndarray) -> tuple[bytes, int]:
    """A binary request for `x`, its output in binary too; and its JSON header's length."""
    head = json.dumps(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                        "parameters": {"binary_data_size": x.nbytes}}],
            "outputs": [{"name": "y", "parameters": {"binary_data": False}}],
        }
    ).encode()  # fmt: skip
    return head + x.tobytes(), len(head)


@pytest.mark.parametrize(
    "path",
    ["//v2/models/m/infer", "/v2//models/m/infer", "/v2/models/m/versions/1/infer"],
)
def test_an_inference_body_on_any_path_the_api_routes_is_inflated_off_the_loop(
    server: RunningServer, inflated: list[tuple[bool, int]], path: str
) -> None:
    x = np.arange(4 * 100_000, dtype=np.float32).reshape(-1, 4)  # 1.6 MB, over the inline part
    body, length = binary_request(x)
    headers = {"Content-Encoding": "gzip", "Inference-Header-Content-Length": str(length)}
    status, doc = post(server, path, gzip.compress(body, 1), headers)
    assert status == 200, doc
    np.testing.assert_array_equal(doc["outputs"][0]["data"], 2 * x.ravel())
    assert any(worker for worker, _ in inflated)
    assert on_loop(inflated) <= INFLATE_INLINE_BYTES + 1


@pytest.mark.parametrize("path", ["/v1/models/m%3Apredict", "//v1/models/m:predict"])
def test_a_v1_predict_body_on_an_escaped_path_is_inflated_off_the_loop(
    server: RunningServer, inflated: list[tuple[bool, int]], path: str
) -> None:
    rows = [[1.0, 2.0, 3.0, 4.0]] * 20_000  # (~400 KB of JSON: one example, as 'm' takes)
    body = gzip.compress(json.dumps({"instances": [rows]}).encode(), 1)
    status, doc = post(server, path, body, {"Content-Encoding": "gzip"})
    assert status == 200, doc
    assert doc["predictions"][0][-1] == [2.0, 4.0, 6.0, 8.0]
    assert any(worker for worker, _ in inflated)
    assert on_loop(inflated) <= INFLATE_INLINE_BYTES + 1


def test_a_bomb_on_an_escaped_inference_path_is_refused_off_the_loop(
    server: RunningServer, inflated: list[tuple[bool, int]]
) -> None:
    status, doc = post(server, "//v2/models/m/infer", BOMB, {"Content-Encoding": "gzip"})
    assert status == 413, doc
    assert on_loop(inflated) <= INFLATE_INLINE_BYTES + 1
