"""The load shedder over HTTP refuses the costliest model's requests, counts each refusal
against its model, and weighs no model a client invents (a real engine; connections fed in
memory; the shedder's clocks moved by the test, so what it refuses does not depend on timing).

A tester found one refused share applied to every model: orderbook's small requests lost
44-88% to 429s beside a resnet flood, counted only in duetime_requests_shed_total.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from memory_fakes import ShedderClocks, Transport, in_memory_server

from duetime.frontend.http import HttpConnection, _priority_one
from duetime.observability.metrics import MetricsCollector
from duetime.overload import LoadShedder
from duetime.scheduling.scheduler import ModelScheduler
from duetime.tools.payloads import PayloadSpec, http_request_bytes

LIGHT = http_request_bytes(
    PayloadSpec("http-binary", "mlp", 1, None, "127.0.0.1", 1),
    {"x": np.ones((1, 40), np.float32)},
    {},
    binary=True,
)
HEAVY = http_request_bytes(
    PayloadSpec("http-binary", "resnet", 1, None, "127.0.0.1", 1),
    {"not_an_input": np.ones((1, 150_000), np.float32)},  # (600 KB, refused 400 unrun)
    {},
    binary=True,
)


def invented(number: int) -> bytes:
    return http_request_bytes(
        PayloadSpec("http-binary", f"no-such-model-{number}", 1, None, "127.0.0.1", 1),
        {"x": np.ones((1, 40), np.float32)},
        {},
        binary=True,
    )


async def statuses(
    connection: HttpConnection, transport: Transport, requests: list[bytes]
) -> list[bytes]:
    """The status of each of `requests`, sent one at a time on `connection` and answered."""
    found = []
    for request in requests:
        before = len(transport.written)
        connection.data_received(request)
        for _ in range(2000):  # (a big body is joined off the loop; mlp runs on a thread)
            if len(transport.written) > before:
                break
            await asyncio.sleep(0.001)
        answer = b"".join(transport.written[before:])
        found.append(answer.split(b" ", 2)[1])
    return found


def watching_shedder() -> tuple[ShedderClocks, LoadShedder]:
    """A shedder on clocks the test moves, sampled once busy: it weighs requests."""
    clocks = ShedderClocks()
    shedder = LoadShedder(
        cpu_clock=lambda: clocks.cpu, wall_clock=lambda: clocks.wall, wait_clock=lambda: 0.0
    )
    clocks.run(busy=0.7)
    shedder.sample(clocks.failing)
    return clocks, shedder


def saturate(clocks: ShedderClocks, shedder: LoadShedder) -> None:
    """Ten samples of a saturated loop whose requests miss their due times."""
    for _ in range(10):
        clocks.run(busy=1.0)
        shedder.sample(clocks.failing)


def shed_by_model(engine: Any, shedder: LoadShedder) -> dict[str, float]:
    """duetime_requests_shed_by_model's samples, by model."""
    families = {f.name: f for f in MetricsCollector(engine, shedder).collect()}
    return {
        sample.labels["model"]: sample.value
        for sample in families["duetime_requests_shed_by_model"].samples
    }


def test_the_costly_model_is_shed_and_counted_and_the_light_one_is_not(
    mlp_resnet_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (every model busy: a model with capacity idle has none of its requests shed, see
    # test_http_shed_spare.py; resnet's requests here are refused unrun, it is always idle)
    monkeypatch.setattr(ModelScheduler, "idle", property(lambda self: False))
    monkeypatch.setattr(ModelScheduler, "backlogged", lambda self, now: True)

    async def body() -> dict[str, Any]:
        clocks, shedder = watching_shedder()
        async with in_memory_server(mlp_resnet_repo) as served:
            server = served.server
            connection, transport = served.connect(shedder=shedder)
            assert shedder.watching  # (busy: requests are weighed)
            weighed = await statuses(connection, transport, [HEAVY, LIGHT] * 6)
            assert set(weighed) == {b"400", b"200"}  # (nothing shed yet)
            await statuses(connection, transport, [invented(n) for n in range(20)])
            saturate(clocks, shedder)
            assert shedder.share > 0.4
            shed = await statuses(connection, transport, [HEAVY, LIGHT] * 10)
            snapshot = server.engine.registry.snapshot
            rejected = {
                name: snapshot.models[name].versions["1"].primary.scheduler.statistics().rejected
                for name in ("mlp", "resnet")
            }
            by_model = shed_by_model(server.engine, shedder)
            return {
                "heavy": shed[0::2],
                "light": shed[1::2],
                "rejected": rejected,
                "by_model": by_model,
                "classes": set(shedder.costs()),
            }

    found = asyncio.run(body())
    assert b"429" not in found["light"], "mlp's cheap requests free nothing of the loop"
    refused = found["heavy"].count(b"429")
    assert refused >= 4
    assert found["rejected"] == {"mlp": 0, "resnet": refused}
    assert found["by_model"] == {"resnet": refused}
    assert {model for model, _ in found["classes"]} <= {"mlp", "resnet", None}


def test_a_shed_request_of_a_version_not_served_counts_against_no_model(
    mlp_resnet_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tester's flood at versions of mlp not served: their refusals counted in
    duetime_requests_shed_by_model{model="mlp"} (3,197 against 1,635 rejected), in none of
    mlp's other counts. They are weighed and counted with the requests of no model."""
    monkeypatch.setattr(ModelScheduler, "idle", property(lambda self: False))
    monkeypatch.setattr(ModelScheduler, "backlogged", lambda self, now: True)
    unserved = HEAVY.replace(b"/v2/models/resnet/infer", b"/v2/models/resnet/versions/9/infer")
    assert unserved != HEAVY

    async def body() -> tuple[list[bytes], int, dict[str, float]]:
        clocks, shedder = watching_shedder()
        async with in_memory_server(mlp_resnet_repo) as served:
            server = served.server
            connection, transport = served.connect(shedder=shedder)
            await statuses(connection, transport, [unserved, LIGHT] * 6)
            saturate(clocks, shedder)
            shed = await statuses(connection, transport, [unserved] * 10)
            resnet = server.engine.registry.snapshot.models["resnet"].versions["1"].primary
            by_model = shed_by_model(server.engine, shedder)
            return shed, resnet.scheduler.statistics().rejected, by_model

    shed, rejected, by_model = asyncio.run(body())
    refused = shed.count(b"429")
    assert refused >= 4
    assert rejected == 0
    assert by_model == {"": refused}


def test_priority_one_is_found_in_the_json_of_a_request_not_decoded() -> None:
    binary = {"inference-header-content-length": "40"}
    assert _priority_one(binary, b'{"parameters": {"priority": 1}}        ' + b"\x01" * 100)
    assert not _priority_one(binary, b'{"parameters": {"priority": 10}}       ' + b"\x01" * 100)
    assert not _priority_one(binary, b'{"parameters": {"priority": 2}}        "priority": 1')
    json_body = b'{"inputs": [' + b"0, " * 10_000 + b'0], "parameters": {"priority":1}}'
    assert _priority_one({}, json_body)
    assert not _priority_one({"content-encoding": "gzip"}, b'{"parameters": {"priority": 1}}')
