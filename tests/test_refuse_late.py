"""`Engine.refuse_late`: a request a front end held back past its due time (its answer had no
room) is refused as due, whatever its front end's timer said."""

from __future__ import annotations

from pathlib import Path

from repo_models import heavy_model, inputs, run_on_engine, write_version

from duetime.engine import Engine
from duetime.errors import DeadlineExceeded
from duetime.types import InferRequest


def test_a_request_its_front_end_found_due_a_little_early_is_refused_as_due(
    tmp_path: Path,
) -> None:
    """uvloop's timers are whole milliseconds: a gRPC call whose wait for room ended 235 µs
    before its due time met admission, and was refused RESOURCE_EXHAUSTED "cannot finish in
    time" (a flaky CI failure), not DEADLINE_EXCEEDED as an instant later."""
    write_version(tmp_path, "m", 1, heavy_model(1))  # (milliseconds a run: 1 ms never fits)

    async def scenario(engine: Engine) -> None:
        before = engine.registry.resolve("m", None).scheduler.statistics()
        late = DeadlineExceeded("Request timeout expired: model 'm': no room for its answer")
        due = engine.clock.now_ns() + 1_000_000
        refused = engine.refuse_late(InferRequest("m", inputs(), due_ns=due), late)
        assert refused is late
        after = engine.registry.resolve("m", None).scheduler.statistics()
        assert (after.expired, after.rejected) == (before.expired + 1, before.rejected)

    run_on_engine(tmp_path, scenario)


def test_a_request_that_expired_waiting_to_be_read_is_a_miss_not_a_clients_short_timeout(
    tmp_path: Path,
) -> None:
    """Its arrival says which: a request due before it could run even from its arrival set
    itself an impossible timeout (no miss of the server's); one that arrived in time and
    waited (a gRPC call in the core's queue, dated by `CoreBacklog`) is one, and the load
    shedder counts it (`ModelScheduler.outcomes`)."""
    write_version(tmp_path, "m", 1, heavy_model(1))

    async def scenario(engine: Engine) -> None:
        scheduler = engine.registry.resolve("m", None).scheduler
        late = DeadlineExceeded("Request timeout expired: model 'm': waited in the core")
        now = engine.clock.now_ns()
        due = now - 10_000_000
        missed, seen = scheduler.outcomes()
        engine.refuse_late(InferRequest("m", inputs(), due_ns=due, arrival_ns=now), late)
        assert scheduler.outcomes() == (missed, seen + 1)
        waited = InferRequest("m", inputs(), due_ns=due, arrival_ns=now - 50_000_000)
        engine.refuse_late(waited, late)
        assert scheduler.outcomes() == (missed + 1, seen + 2)

    run_on_engine(tmp_path, scenario)
