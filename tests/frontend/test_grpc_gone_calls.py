"""A ModelInfer call whose client has gone (cancelled, or past its deadline) before its handler
runs is not decoded, run or aborted: above capacity such calls wait in gRPC's own queue, and the
loop spent itself on them (15% of it in aborts, each logging ExecuteBatchError) while the
calls still worth answering waited behind."""

from __future__ import annotations

import asyncio
import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import RunningServer, start_server, stop_server
from grpc._cython import cygrpc
from grpc_contexts import CallContext

from duetime.config import ServerSettings
from duetime.frontend.grpc import _guarded, _method_handlers
from duetime.frontend.proto import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(120)


class GoneContext(CallContext):
    """A call's context whose client has gone: cancelled, or with no time left."""

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted a call that had ended: {code} {details}")


@pytest.fixture(scope="module")
def server(mlp_repo: Path) -> Iterator[RunningServer]:
    running, thread = start_server(
        ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0)
    )
    yield running
    stop_server(running, thread)


def served_model_infer(service: Any, request: Any, context: Any) -> Any:
    """A ModelInfer call as the server takes it: its bytes through the handler serve_grpc
    registers (the client's departure is checked there, before decoding)."""
    handler = _method_handlers(service)["inference.GRPCInferenceService"]["ModelInfer"]
    guarded = _guarded(handler, service.ended)
    return guarded.unary_unary(request.SerializeToString(), context)


def mlp_request(columns: int = 40) -> Any:
    request = pb.ModelInferRequest(model_name="mlp")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, columns])
    tensor.contents.fp32_contents.extend(np.ones(columns, np.float32).tolist())
    return request


def requests_seen(server: RunningServer) -> int:
    """Requests mlp's scheduler took in, whatever became of them."""
    deployment = server.server.engine.registry.snapshot.models["mlp"].versions["1"].primary
    stats = deployment.scheduler.statistics()
    return stats.succeeded + stats.failed + stats.rejected + stats.expired + stats.cancelled


@pytest.mark.parametrize(
    ("cancelled", "remaining"), [(True, None), (False, 0.0), (False, -1.0)], ids=str
)
@pytest.mark.parametrize("columns", [40, 41], ids=["valid", "invalid"])
def test_a_call_whose_client_has_gone_is_not_run_nor_aborted(
    server: RunningServer, cancelled: bool, remaining: float | None, columns: int
) -> None:
    service = server.server._grpc_service
    before, gone = requests_seen(server), service.gone_calls
    context = GoneContext(cancelled=cancelled, remaining=remaining)
    call = served_model_infer(service, mlp_request(columns), context)
    answer = asyncio.run_coroutine_threadsafe(call, server.loop).result(timeout=30)
    assert not answer.outputs
    expected = "CANCELLED" if cancelled else "DEADLINE_EXCEEDED"
    assert context.code.name == expected  # (an empty answer went out as OK)
    assert requests_seen(server) == before
    assert service.gone_calls == gone + 1


def test_grpc_s_error_for_an_answer_to_an_ended_call_is_not_logged(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    """grpc.aio logged each at ERROR with a traceback: noise in the episodes operators read."""
    logger = logging.getLogger("grpc._cython.cygrpc")
    with caplog.at_level(logging.ERROR, logger="grpc._cython.cygrpc"):
        for error in (cygrpc.ExecuteBatchError("Failed execute_batch"), RuntimeError("real")):
            try:
                raise error
            except Exception:
                logger.exception("raised in core by servicer method [ModelInfer]")
    assert [r.exc_info[1] for r in caplog.records if r.exc_info] == [error]


def test_calls_gone_before_their_handler_are_counted_on_metrics(server: RunningServer) -> None:
    service = server.server._grpc_service
    call = served_model_infer(service, mlp_request(), GoneContext(cancelled=True, remaining=None))
    asyncio.run_coroutine_threadsafe(call, server.loop).result(timeout=30)
    port = server.addresses.metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    (line,) = [x for x in text.splitlines() if x.startswith("duetime_grpc_calls_gone_total ")]
    assert float(line.split()[1]) == service.gone_calls >= 1


class SaidContext(GoneContext):
    def set_details(self, details: str) -> None:
        self.details = details


def test_a_call_failed_unrun_past_its_deadline_is_told_so_not_that_it_was_never_taken() -> None:
    """A call taken, queued, then failed unrun at its due time (its deadline gone meanwhile)
    was told 'the call's deadline passed before the server could take it' (found by a
    tester): it hears its error's own word; one never taken hears the old one."""
    import grpc

    from duetime.errors import DeadlineExceeded
    from duetime.frontend.grpc import _no_answer

    expired = DeadlineExceeded("Request timeout expired: ... waited in the queue; it was not run")
    taken = SaidContext(cancelled=False, remaining=0.0)
    _no_answer(taken, expired)
    assert taken.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert taken.details == expired.message
    untaken = SaidContext(cancelled=False, remaining=0.0)
    _no_answer(untaken)
    assert untaken.details == "the call's deadline passed before the server could take it"
