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
