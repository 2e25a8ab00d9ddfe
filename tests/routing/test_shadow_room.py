"""Shadow copies never take the room of real requests to their version: over HTTP, a version
that is the shadow of every request and also answers requests naming it.

Found by a tester (repro_shadow_queue_full): v1 answered the requests that name no version, v2
got a copy of each; the copies, without a due time, never expired and filled v2's queue, and 89
of 100 real requests to v2 were refused 429 "queue full" (max_queue_size 8; none with the
shadow off).
"""

from __future__ import annotations

import asyncio
import http.client
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from conftest import RunningServer, start_server, stop_server
from repo_models import inputs, scale_model, write_version

from duetime.config import ServerSettings
from duetime.execution.executor import BatchJob, BatchResult
from duetime.routing.router import ShadowStatistics

pytestmark = pytest.mark.timeout(60)

_T = TypeVar("_T")
QUEUE = 4


def repository(root: Path) -> Path:
    """Model `m`: v1 answers 2x and takes the requests that name no version; v2 answers 3x and
    gets a copy of each of them."""
    write_version(root, "m", 1, scale_model(2.0))
    write_version(root, "m", 2, scale_model(3.0))
    (root / "m" / "config.toml").write_text(
        'version_policy = { all = {} }\nmax_batch_size = 1\nexecution = "thread"\n'
        f"[scheduling]\nmax_queue_size = {QUEUE}\n"
        '[traffic]\nweights = { "1" = 100 }\nshadow = { "2" = 1.0 }\n'
    )
    return root


def infer(running: RunningServer, path: str, parameters: dict[str, Any]) -> tuple[int, Any]:
    x = inputs()["x"]
    tensor = {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    conn = http.client.HTTPConnection(running.addresses.host, running.addresses.http_port, 30)
    try:
        conn.request("POST", path, orjson.dumps({"inputs": [tensor], "parameters": parameters}))
        reply = conn.getresponse()
        return reply.status, orjson.loads(reply.read())
    finally:
        conn.close()


@pytest.mark.parametrize("parameters", [{}, {"timeout": 5_000_000}], ids=["no-due", "due"])
def test_a_real_request_finds_room_in_a_queue_full_of_shadow_copies(
    tmp_path: Path, parameters: dict[str, Any]
) -> None:
    settings = ServerSettings(
        model_repository=repository(tmp_path), http_port=0, grpc_port=0, cpus="none"
    )
    running, thread = start_server(settings)
    engine = running.server.engine
    v2 = engine.registry.snapshot.models["m"].versions["2"].primary
    held: list[tuple[int, BatchJob]] = []

    def on_loop(work: Callable[[], Awaitable[_T]]) -> _T:
        return asyncio.run_coroutine_threadsafe(work(), running.loop).result(timeout=30)

    async def hold() -> None:  # (v2's runs wait for `release`: its queue fills up)
        v2.model.executor.submit = lambda instance, job: held.append((instance, job))  # type: ignore[method-assign]

    async def release() -> None:
        del v2.model.executor.submit  # (its own again)
        for instance, job in held:
            outputs = [{"y": 3 * inputs(rows)["x"]} for rows in job.rows]
            job.on_done(BatchResult(job, instance, outputs=list(outputs), compute_ns=10_000))

    on_loop(hold)
    answered: list[tuple[int, Any]] = []
    try:
        for _ in range(QUEUE + 4):  # (one copy runs, QUEUE are queued, the rest are dropped)
            status, body = infer(running, "/v2/models/m/infer", parameters)
            assert (status, body["model_version"]) == (200, "1"), body
        shadow: ShadowStatistics = engine.router.shadows[("m", "2")]
        assert (shadow.mirrored, shadow.skipped, len(held)) == (QUEUE + 4, 3, 1)
        real = threading.Thread(
            target=lambda: answered.append(infer(running, "/v2/models/m/versions/2/infer", {})),
        )
        real.start()
        deadline = time.monotonic() + 10
        while shadow.skipped < 4 and real.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)  # (until the real request took a copy's place, or was refused)
        on_loop(release)
        real.join(timeout=30)
    finally:
        stop_server(running, thread)
    status, body = answered[0]
    assert status == 200, body  # (429 "queue full" before)
    assert body["model_version"] == "2"
    assert body["outputs"][0]["data"] == (3 * inputs()["x"]).ravel().tolist()
    assert (shadow.dropped, shadow.skipped, shadow.compared) == (4, 4, QUEUE)
    stats = v2.scheduler.statistics()
    assert (stats.rejected, stats.expired, stats.succeeded) == (0, 0, QUEUE + 1)
    assert v2.scheduler.outcomes() == (0, QUEUE + 1)
