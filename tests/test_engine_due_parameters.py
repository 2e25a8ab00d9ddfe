"""The in-process Engine's due times and priorities, read as HTTP and gRPC read them: a priority
within a uint64, `parameters={"timeout": ..., "priority": ...}` honoured and checked, `timeout=0`
as no due time (Triton's `timeout: 0`), a timeout past the longest due time as none, and a lazy
model's `default_timeout_ms` counted from the request's arrival while the model loads."""

from __future__ import annotations

import asyncio
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from repo_models import age, inputs, run_on_engine, scale_model, write_version

from duetime import Engine
from duetime.clock import FakeClock
from duetime.engine import NO_DUE_BEYOND_NS
from duetime.errors import DeadlineExceeded, InvalidInput, ModelUnavailable
from duetime.frontend import parameters as wire_parameters
from duetime.frontend.parameters import due_from_timeout_us, priority_of
from duetime.types import InferRequest

pytestmark = pytest.mark.timeout(120)

NOW = 10**12
"""The fake clock's reading."""
MAX_DUE_US = 10**12
"""The longest `timeout` parameter that sets a due time (parameters.MAX_DUE_US)."""


class TickingClock(FakeClock):
    """A fake clock that moves 1 ms at every read: a due time 1 µs away has passed at the next."""

    def now_ns(self) -> int:
        self.advance(10**6)
        return super().now_ns()


def write_config(repo: Path, text: str) -> None:
    """Model m's config.toml, back-dated so the settle rule takes it as complete."""
    path = repo / "m" / "config.toml"
    path.write_text(text)
    age(path)


def made(
    timeout: float | None = None, priority: int = 0, parameters: dict[str, Any] | None = None
) -> InferRequest:
    """The request `infer("m", ...)` would submit, its clock reading NOW."""
    engine = Engine(clock=FakeClock(NOW))
    return engine._request("m", inputs(), None, timeout, priority, None, parameters)


# -- priority ----------------------------------------------------------------------------------


def test_a_priority_past_a_uint64_is_invalid_input(tmp_path: Path) -> None:
    """2**64 was taken, and the scheduler read it as a shadow copy's level (edf.SHADOW_LEVEL):
    the request expired as "shadow copy dropped unrun", uncounted."""
    write_version(tmp_path, "m", 1, scale_model(2))

    async def scenario(engine: Engine) -> None:
        with pytest.raises(InvalidInput, match=r"^priority: expected an integer >= 0, at most "):
            await engine.infer_async("m", inputs(), priority=2**64)
        with pytest.raises(InvalidInput, match="request parameter 'priority' must be"):
            await engine.infer_async("m", inputs(), parameters={"priority": 2**64})
        answer = await engine.infer_async("m", inputs(), priority=2**64 - 1, timeout=5.0)
        np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])

    run_on_engine(tmp_path, scenario)


# -- parameters ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "needle"),
    [
        ({"timeout": "x"}, "request parameter 'timeout' must be .* got \"x\""),
        ({"timeout": -1}, "request parameter 'timeout' must be .* got -1"),
        ({"timeout": 1.5}, "request parameter 'timeout' must be .* got 1.5"),
        ({"timeout": True}, "request parameter 'timeout' must be .* got true"),
        ({"timeout": 2**64}, "request parameter 'timeout' must be .* got 18446744073709551616"),
        ({"priority": "x"}, "request parameter 'priority' must be .* got \"x\""),
        ({"priority": -1}, "request parameter 'priority' must be .* got -1"),
    ],
    ids=str,
)
def test_bad_timeout_and_priority_parameters_are_refused_in_http_words(
    parameters: dict[str, Any], needle: str
) -> None:
    """They were ignored, whatever they held."""
    with pytest.raises(InvalidInput, match=needle):
        made(parameters=parameters)


@pytest.mark.parametrize(
    ("parameters", "needle"),
    [
        ({"sequence_start": 5}, "'sequence_start' must be true or false, got 5"),
        ({"sequence_end": "x"}, "'sequence_end' must be true or false, got \"x\""),
        ({"sequence_id": -1}, "'sequence_id' must be an unsigned integer or a string, got -1"),
        ({"sequence_id": [1]}, "'sequence_id' has invalid type: it is a list"),  # (as HTTP)
        ({"triton_x": 1}, "keys starting with 'triton_' are reserved"),
        ({f"p{i}": i for i in range(257)}, "request 'parameters' has 257 entries, over the limit"),
    ],
    ids=["start", "end", "id", "id-list", "reserved", "too-many"],
)
def test_other_parameters_are_checked_as_http_checks_them(
    parameters: dict[str, Any], needle: str
) -> None:
    """They were taken unchecked ({"sequence_start": 5} ran), where HTTP refuses them with 400
    (found by a tester)."""
    with pytest.raises(InvalidInput, match=re.escape(needle)):
        made(parameters=parameters)
    made(parameters={"sequence_id": "s", "sequence_start": True, "sticky": "k"})  # (all fine)


@pytest.mark.parametrize(
    ("parameters", "needle"),
    [
        ({1: 2}, "request parameter names must be strings, got 1 (int)"),
        ({None: 1}, "request parameter names must be strings, got None (NoneType)"),
        ({b"timeout": 1000}, "request parameter names must be strings, got b'timeout' (bytes)"),
        ({"foo": {"a": 1}}, "request parameter 'foo' has invalid type: it is an object"),
        ({"foo": [1, 2]}, "request parameter 'foo' has invalid type: it is a list"),
        ({"foo": None}, "request parameter 'foo' has invalid type: it is null"),
        ({"foo": object()}, "request parameter 'foo' has invalid type: it is a object"),
    ],
    ids=["int-key", "none-key", "bytes-key", "object", "list", "null", "other"],
)
def test_parameters_hold_what_the_protocol_s_parameters_hold(
    parameters: dict[Any, Any], needle: str
) -> None:
    """String names, and strings, numbers or true/false as values, as HTTP checks them: a name
    that was no string raised AttributeError from the check of reserved names, and values HTTP
    refuses with 400 were taken (found by a tester)."""
    with pytest.raises(InvalidInput, match=re.escape(needle)):
        made(parameters=parameters)
    made(parameters={"n": np.int64(3), "x": 1.5, "b": True, "s": "x", "timeout": None})
    request = made(parameters={"n": np.int64(3), "f": np.float32(0.5), "b": np.bool_(True)})
    assert request.parameters == {"n": 3, "f": 0.5, "b": True}
    assert [type(v) for v in request.parameters.values()] == [int, float, bool]
    numpy_typed = {"sequence_start": np.bool_(True), "priority": np.int64(2)}
    assert made(parameters=numpy_typed).priority == 2


def test_timeout_and_priority_parameters_set_the_due_time_and_level() -> None:
    """Microseconds, as over HTTP and gRPC; beside the keywords, the earlier due time applies,
    and two priorities must agree."""
    assert made(parameters={"timeout": 500}).due_ns == NOW + 500_000
    assert made(parameters={"timeout": np.int64(500)}).due_ns == NOW + 500_000
    assert made(parameters={"timeout": 0}).due_ns is None  # (Triton's "no timeout")
    assert made(parameters={"timeout": MAX_DUE_US + 1}).due_ns is None
    assert made(1.0, parameters={"timeout": 500}).due_ns == NOW + 500_000
    assert made(0.0001, parameters={"timeout": 10**6}).due_ns == NOW + 100_000
    assert made(0.0001, parameters={"timeout": 0}).due_ns == NOW + 100_000
    assert made(parameters={"priority": 3}).priority == 3
    assert made(priority=3, parameters={"priority": 3}).priority == 3
    assert made(priority=3, parameters={"priority": 0}).priority == 3
    assert made(parameters={"priority": 3, "sticky": "k"}).parameters == {
        "priority": 3,
        "sticky": "k",
    }  # (kept as they came: a traffic policy's sticky key, the capture's record)
    with pytest.raises(InvalidInput, match="the keyword says 2 and request parameter 'prio"):
        made(priority=2, parameters={"priority": 3})


def test_a_timeout_parameter_makes_the_request_due(tmp_path: Path) -> None:
    """`parameters={"timeout": 1}` ran as a request without a due time. (On a clock that moves
    1 ms a read, a due time 1 µs away has passed when the engine queues the request.)"""
    write_version(tmp_path, "m", 1, scale_model(2))

    async def main() -> None:
        engine = await Engine.start(tmp_path, clock=TickingClock())
        try:
            with pytest.raises(DeadlineExceeded):
                await engine.infer_async("m", inputs(), parameters={"timeout": 1})
            with pytest.raises(InvalidInput, match="request parameter 'timeout'"):
                await engine.infer_async("m", inputs(), parameters={"timeout": -1})
            answer = await engine.infer_async("m", inputs(), parameters={"timeout": 10**7})
            np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])
        finally:
            await engine.aclose()

    asyncio.run(main())


# -- timeout=0 and long timeouts -------------------------------------------------------------------


def test_a_zero_timeout_sets_no_due_time_as_over_the_wire(tmp_path: Path) -> None:
    """`timeout=0` failed at once (DeadlineExceeded), where `timeout: 0` over HTTP and gRPC is
    Triton's "no timeout": the request runs, within its model's default_timeout_ms if any."""
    assert made(0).due_ns is None
    assert made(0.0).due_ns is None
    write_version(tmp_path, "m", 1, scale_model(2))
    write_config(tmp_path, "default_timeout_ms = 5000\n")

    async def scenario(engine: Engine) -> None:
        answer = await engine.infer_async("m", inputs(), timeout=0)
        np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])

    run_on_engine(tmp_path, scenario)


def test_the_longest_due_time_is_the_same_in_process_and_over_the_wire() -> None:
    """A `timeout` parameter over 10**12 µs was refused (400, INVALID_ARGUMENT), though Triton
    takes any uint64: it now sets no due time, as a `timeout=` over 10**6 s does in process."""
    assert wire_parameters.MAX_DUE_US == MAX_DUE_US
    assert NO_DUE_BEYOND_NS == MAX_DUE_US * 1000
    assert due_from_timeout_us({"timeout": MAX_DUE_US}, NOW) == NOW + MAX_DUE_US * 1000
    for value in (MAX_DUE_US + 1, 2**63 - 1, 2**64 - 1):
        assert due_from_timeout_us({"timeout": value}, NOW) is None
    assert priority_of({"priority": 2**64 - 1}) == 2**64 - 1
    assert made(MAX_DUE_US / 10**6).due_ns == NOW + MAX_DUE_US * 1000
    assert made(MAX_DUE_US / 10**6 + 1).due_ns is None
    assert made(math.inf).due_ns is None


def test_timeouts_of_any_numeric_type_are_taken_as_seconds() -> None:
    """Found by a tester: numpy's float16 took `timeout * 1e9` in float16 (inf: OverflowError),
    and an int past a float's range raised OverflowError too."""
    assert made(np.float16(0.5)).due_ns == NOW + 500_000_000
    assert made(np.float32(0.25)).due_ns == NOW + 250_000_000
    assert made(np.int64(2)).due_ns == NOW + 2_000_000_000
    assert made(10**400).due_ns is None  # (beyond any due time: none, as 10**7 s)


def test_a_models_default_timeout_counts_from_arrival_and_an_own_due_replaces_it(
    tmp_path: Path,
) -> None:
    """The default due time counts from the request's arrival (it counted from the scheduler's
    admission, after decoding); a request's own due time replaces it, earlier or later (the
    default capped a later one: a timeout is honoured always, not only below a model default,
    found by a tester)."""
    write_version(tmp_path, "m", 1, scale_model(2))
    write_config(tmp_path, "default_timeout_ms = 3\n")

    async def scenario(engine: Engine) -> None:
        now = engine.clock.now_ns()
        arrival = now - 2_000_000
        plain = InferRequest("m", inputs(), arrival_ns=arrival)
        assert engine.router.route(plain).due_ns == arrival + 3_000_000
        assert engine.router.route(plain).by_default
        for own in (now + 10**9, arrival + 3_000_000, arrival + 1_000_000):
            request = InferRequest("m", inputs(), arrival_ns=arrival, due_ns=own)
            assert engine.router.route(request).due_ns == own
            assert not engine.router.route(request).by_default
        # (arrived 4 ms ago: its default due time passed; its own, a second on, has not)
        late = InferRequest("m", inputs(), arrival_ns=now - 4_000_000)
        with pytest.raises(DeadlineExceeded):
            await engine.submit(late).future
        own = InferRequest("m", inputs(), arrival_ns=now - 4_000_000, due_ns=now + 10**9)
        np.testing.assert_array_equal((await engine.submit(own).future)["y"], 2 * inputs()["x"])

    run_on_engine(tmp_path, scenario)


# -- a lazy model's default due time --------------------------------------------------------------


def test_a_lazy_models_default_timeout_counts_while_it_loads(tmp_path: Path) -> None:
    """A request without a timeout for a lazy model whose default_timeout_ms is 60 was answered
    504 after the whole load (994-1380 ms), where one with a 60 ms timeout was refused at once:
    the default applied only once the model served. Due in 50 ms, against a load estimated at
    a second (before any load), it is refused at once now, and the load starts."""
    write_version(tmp_path, "m", 1, scale_model(2))
    write_config(tmp_path, "default_timeout_ms = 50\n")

    async def scenario(engine: Engine) -> None:
        with pytest.raises(ModelUnavailable, match=r"due in \d+ ms \(its model's default_timeo"):
            await engine.infer_async("m", inputs())
        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while "m" not in engine.registry.snapshot.models:
            assert loop.time() < end, "the model never loaded"
            await asyncio.sleep(0.01)
        answer = await engine.infer_async("m", inputs())
        np.testing.assert_array_equal(answer["y"], 2 * inputs()["x"])

    run_on_engine(tmp_path, scenario, lazy=True)


def test_a_request_waiting_for_a_lazy_load_is_due_by_its_models_default(tmp_path: Path) -> None:
    """While it waits for the load, a request is due by its model's default_timeout_ms from its
    arrival (its own due time where it has one, earlier or later); one that arrives without a
    front end's arrival is dated when the engine takes it."""
    write_version(tmp_path, "m", 1, scale_model(2))
    write_config(tmp_path, "default_timeout_ms = 20000\n")

    async def scenario(engine: Engine) -> None:
        arrival = engine.clock.now_ns()
        plain = InferRequest("m", inputs(), arrival_ns=arrival)
        own = InferRequest("m", inputs(), arrival_ns=arrival, due_ns=arrival + 10**10)
        later = InferRequest("m", inputs(), arrival_ns=arrival, due_ns=arrival + 10**11)
        undated = InferRequest("m", inputs())
        tickets = [engine.submit(request) for request in (plain, own, later, undated)]
        # (the default is read as the load begins, at the first request)
        assert engine._due_by_default(plain, arrival) == arrival + 20 * 10**9
        assert engine._due_by_default(own, arrival) == arrival + 10**10
        assert engine._due_by_default(later, arrival) == arrival + 10**11
        # (their own due times as they were: the scheduler tells the default's by that)
        assert [r.due_ns for r in (plain, own, later)] == [None, arrival + 10**10, arrival + 10**11]
        assert undated.arrival_ns is not None
        assert undated.arrival_ns >= arrival
        assert undated.due_ns is None
        for ticket in tickets:
            np.testing.assert_array_equal((await ticket.future)["y"], 2 * inputs()["x"])

    run_on_engine(tmp_path, scenario, lazy=True)
