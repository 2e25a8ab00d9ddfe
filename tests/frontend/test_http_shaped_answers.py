"""HTTP: a model whose answers follow its requests' shapes is held at what their shapes make.

Such a model has no answer size known at load (free dims besides the batch's), and HTTP held the
most an answer may weigh (`max_connection_inflight_bytes`, 64 MiB) for each of its requests
until answered: under a 100 MB bound on answers unread, 2 of 16 requests for [1,256,256]
answers reached the scheduler at once, the rest waiting in arrival order (found by a tester;
gRPC sized them from their shapes already). Once a request is decoded, its graph's shapes give
its answer's size (`RestApi.answer_estimate`), and the connection holds that instead.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from repo_models import run_on_engine
from test_grpc_unsent_answers import shaped_models
from test_http_unsent_answers import REQUEST, Api, MiB, connect, run, turns

from duetime.config import ServerSettings
from duetime.engine import Engine
from duetime.frontend.http import Intake, _encode
from duetime.frontend.rest import ANSWER_WORDS_BYTES, BulkReply, PendingReply, Reply, RestApi
from duetime.repository.outputsizes import InputShape, OutputSize, OutputSizes


def body(
    shape: list[int], binary: bool, id_: str = "", **request: Any
) -> tuple[bytes, dict[str, str]]:
    """A v2 request for model input `x` (FP32 of `shape`, sent as binary data), its output `y`
    asked for as binary data or JSON."""
    data = np.linspace(-1e-5, 1e5, int(np.prod(shape)), dtype=np.float32).tobytes()
    header = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": shape,
             "parameters": {"binary_data_size": len(data)}},
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": binary}}],
        **request,
    }  # fmt: skip
    if id_:
        header["id"] = id_
    head = json.dumps(header).encode()
    return head + data, {"inference-header-content-length": str(len(head))}


async def answered(
    api: RestApi, model: str, payload: tuple[bytes, dict[str, str]]
) -> tuple[int | None, int]:
    """What `api` estimates of the answer to `payload` (None: nothing), and what it weighed."""
    data, headers = payload
    pending = api.handle("POST", f"/v2/models/{model}/infer".encode(), headers, data)
    assert isinstance(pending, PendingReply)
    estimate = api.answer_estimate(pending)
    await pending.ticket.future
    reply = pending.encode(pending.ticket)
    if isinstance(reply, BulkReply):  # (built off the loop, as the connection does)
        reply = reply.finish(reply.build())
    assert isinstance(reply, Reply), reply
    assert reply.status == 200, reply.body
    written = _encode(reply, keep_alive=True)
    size = len(written) if isinstance(written, bytes) else sum(map(len, written))
    return (None if estimate is None else estimate[0]), size


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_a_request_s_shapes_give_its_answer_s_size_as_written(tmp_path: Path, binary: bool) -> None:
    """Binary outputs weigh their bytes; JSON ones each value at its longest text (a float
    whose piece holds a NaN is written as a double); the id and names count escaped. The
    estimate is never below what is written, nor far above it for binary data."""

    async def scenario(engine: Engine) -> None:
        api = RestApi(engine, ServerSettings())
        for model, shape in (("same", [1000, 4]), ("outer", [100, 1]), ("outer", [1, 1])):
            for id_ in ("", "\x01" * 300, "é" * 50):
                estimate, size = await answered(api, model, body(shape, binary, id_))
                assert estimate is not None
                assert size <= estimate, (model, shape, id_)
                values = int(np.prod(shape)) if model == "same" else shape[0] ** 2
                if binary:
                    assert estimate - values * 4 <= ANSWER_WORDS_BYTES + 6 * (len(id_) + 200)
                else:
                    assert estimate >= values * 26
        # a NaN in a JSON answer writes each value of its piece as a double: still within
        nan = body([1000, 4], binary)
        nan_data = bytearray(nan[0])
        nan_data[-4:] = np.float32(np.nan).tobytes()
        estimate, size = await answered(api, "same", (bytes(nan_data), nan[1]))
        assert estimate is not None
        assert size <= estimate

    run_on_engine(shaped_models(tmp_path), scenario)


def test_a_compressed_answer_of_random_values_is_within_its_estimate(tmp_path: Path) -> None:
    """Deflate adds 5 bytes a stored block of 16 KB, and gzip 18: 16 MB of random binary
    outputs were written 3 KB over the estimate, and its model's sizes were believed no more
    (found by a tester)."""

    async def scenario(engine: Engine) -> None:
        api = RestApi(engine, ServerSettings())
        shape = [1_000_000, 4]
        data = np.random.default_rng(7).bytes(16_000_000)  # (values of random bits: no pattern)
        head = json.dumps({
            "inputs": [{"name": "x", "datatype": "FP32", "shape": shape,
                        "parameters": {"binary_data_size": len(data)}}],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }).encode()  # fmt: skip
        for coding in ("gzip", "deflate"):
            headers = {"inference-header-content-length": str(len(head)),
                       "accept-encoding": coding}  # fmt: skip
            estimate, size = await answered(api, "same", (head + data, headers))
            assert estimate is not None
            assert size <= estimate, coding

    run_on_engine(shaped_models(tmp_path), scenario)


def test_what_shapes_do_not_tell_is_not_estimated(tmp_path: Path) -> None:
    """Sizes that follow a request's values, outputs asked for as their top classes (texts
    whose labels set their length), and requests that are not v2 inferences: no estimate."""

    async def scenario(engine: Engine) -> None:
        api = RestApi(engine, ServerSettings())
        count = np.array([5], np.int64).tobytes()
        three = np.ones(3, np.float32).tobytes()
        header = json.dumps({
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [3],
                 "parameters": {"binary_data_size": 12}},
                {"name": "n", "datatype": "INT64", "shape": [1],
                 "parameters": {"binary_data_size": 8}},
            ],
        }).encode()  # fmt: skip
        pending = api.handle(
            "POST", b"/v2/models/big/infer",
            {"inference-header-content-length": str(len(header))}, header + three + count,
        )  # fmt: skip
        assert isinstance(pending, PendingReply)
        assert api.answer_estimate(pending) is None
        await pending.ticket.future
        classes = body([1000, 4], False)
        asked = json.loads(classes[0][: int(classes[1]["inference-header-content-length"])])
        asked["outputs"][0]["parameters"]["classification"] = 2
        head = json.dumps(asked).encode()
        data = head + classes[0][int(classes[1]["inference-header-content-length"]) :]
        pending = api.handle(
            "POST", b"/v2/models/same/infer",
            {"inference-header-content-length": str(len(head))}, data,
        )  # fmt: skip
        assert isinstance(pending, PendingReply)
        assert api.answer_estimate(pending) is None
        await pending.ticket.future
        assert api.answer_estimate(PendingReply(pending.ticket, lambda done: None)) is None

    run_on_engine(shaped_models(tmp_path), scenario)


class ShapedApi(Api):
    """Takes every request; says its answer weighs `estimate` from its shapes, by `sizes`."""

    def __init__(self, estimate: int | None, sizes: OutputSizes) -> None:
        super().__init__()
        self.estimate = estimate
        self.sizes = sizes

    def answer_estimate(  # type: ignore[override]
        self, pending: PendingReply
    ) -> tuple[int, tuple[OutputSizes, ...]] | None:
        return None if self.estimate is None else (self.estimate, (self.sizes,))


def sizes() -> OutputSizes:
    return OutputSizes([InputShape("x", 1, None)], {"y": OutputSize("y", 4, ((0, 0),), "FP32")})


async def sixteen_ask(settings: ServerSettings, estimate: int | None) -> tuple[ShapedApi, Intake]:
    """16 new connections each send an inference request of a model with no answer size known
    at load, whose shapes say its answer weighs `estimate` (None: nothing); after two turns."""
    intake = Intake(settings)
    intake.guess = lambda model: None
    api = ShapedApi(estimate, sizes())
    for _ in range(16):
        connection, _transport = connect(api, settings, intake)
        connection.data_received(REQUEST)
    await turns()
    return api, intake


def test_new_connections_of_a_shaped_model_start_as_their_shapes_allow() -> None:
    """16 new connections ask at once for answers of a model with no size known at load (each
    held 3 MiB, the unknown size, until decoded): under an 8 MiB bound 3 ran where their
    shapes said 1 MiB each; now 8 do (each holds its 1 MiB once decoded), and the rest wait
    for room."""
    settings = ServerSettings(
        max_unsent_answer_bytes=8 * MiB, max_connections=16,
        max_connection_inflight_bytes=3 * MiB,
    )  # fmt: skip

    async def body_() -> None:
        api, intake = await sixteen_ask(settings, MiB)  # (answers over 512 KiB count)
        assert len(api.tickets) == 8, "each held what its shapes said once decoded"
        assert intake.expected == 8 * MiB
        for ticket in api.tickets[:8]:
            ticket.answer(MiB // 2)  # (read at once: nothing stays held)
        await turns()
        assert len(api.tickets) == 16
        assert intake.expected == 8 * MiB

    run(body_)


def test_small_shaped_answers_hold_nothing_and_unknown_ones_hold_the_most() -> None:
    """An estimate under the small size holds nothing; no estimate keeps the unknown size."""
    settings = ServerSettings(
        max_unsent_answer_bytes=8 * MiB, max_connections=16,
        max_connection_inflight_bytes=3 * MiB,
    )  # fmt: skip

    async def body_() -> None:
        for estimate, started, held in ((1000, 16, 0), (None, 3, 9 * MiB)):
            api, intake = await sixteen_ask(settings, estimate)
            assert (len(api.tickets), intake.expected) == (started, held)

    run(body_)


def test_an_answer_bigger_than_its_shapes_said_ends_their_word(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Should ONNX Runtime make more than the graph's shape inference says, the model's HTTP
    answers count as the unknown size from then on (the sizes are the engine's: gRPC's too)."""
    settings = ServerSettings(
        max_unsent_answer_bytes=8 * MiB, max_connections=16,
        max_connection_inflight_bytes=3 * MiB,
    )  # fmt: skip
    shaped = sizes()

    async def body_() -> None:
        intake = Intake(settings)
        intake.guess = lambda model: None
        api = ShapedApi(MiB, shaped)
        connection, _transport = connect(api, settings, intake)
        connection.data_received(REQUEST)
        await turns()
        with caplog.at_level(logging.WARNING, logger="duetime.answers"):
            api.tickets[0].answer(MiB - 200)  # (within, with its headers: still believed)
            assert shaped.trusted
            connection.data_received(REQUEST)
            await turns()
            api.tickets[1].answer(2 * MiB)
        assert not shaped.trusted
        assert f"where its graph's shapes said {MiB}: its answers now count" in caplog.text

    run(body_)
