"""The words of a refusal for a due time the model's `default_timeout_ms` set (the request sent
no timeout, as a KServe V1 predict cannot): they told it to "send a larger timeout", which could
not help (found by a tester, T71). A request's own timeout, longer than the default, replaces
it (the default capped it: found by another tester, T90)."""

from __future__ import annotations

import numpy as np
import pytest
from factories import SHAPE
from test_scheduler import MS, US, Harness, harness, run

from duetime.errors import DeadlineExceeded, Overloaded


def submit(h: Harness, name: str, *, due_in: int | None = None, arrived_ago: int = 0) -> None:
    """Submit a one-row request that arrived `arrived_ago` ns before now."""
    now = h.clock.now_ns()
    h.scheduler.submit_nowait(
        {"name": np.array([name])},
        rows=1,
        shape_key=SHAPE,
        due_ns=None if due_in is None else now + due_in,
        priority=0,
        arrival_ns=now - arrived_ago,
    )


def test_a_default_shorter_than_a_run_is_named_as_what_to_raise() -> None:
    async def body() -> None:
        h = harness(default_timeout_ns=50 * US)  # (a run of one row: 100 µs)
        with pytest.raises(Overloaded) as refused:
            submit(h, "r")
        message = refused.value.message
        assert "predicted to finish in 100 µs but due in 50 µs (0 requests ahead)" in message
        assert message.endswith(
            ": its due time is its model's default_timeout_ms (0.05 ms after its arrival: it "
            "sent no timeout of its own), less than a run of the model takes; raise the model's "
            "default_timeout_ms"
        )
        submit(h, "long", due_in=10_000 * MS)  # (its own timeout, longer: taken)
        assert h.started() == ["long"]
        with pytest.raises(Overloaded) as refused:  # (its own timeout, shorter: as before)
            submit(h, "own", due_in=40 * US)
        assert refused.value.message.endswith("; retry with a larger timeout or later")

    run(body)


def test_a_default_missed_behind_others_says_retry_later() -> None:
    async def body() -> None:
        h = harness(default_timeout_ns=250 * US)
        submit(h, "running")  # (busy for 100 µs)
        submit(h, "queued")  # (done at 200 µs)
        with pytest.raises(Overloaded) as refused:  # (done at 300 µs: past its 250)
            submit(h, "late")
        message = refused.value.message
        assert "(1 requests ahead): its due time is its model's default_timeout_ms" in message
        assert message.endswith("; retry later, or raise the model's default_timeout_ms")
        assert "larger timeout" not in message

    run(body)


@pytest.mark.parametrize(
    ("default", "words"),
    [
        (
            50 * US,
            "(its due time is its model's default_timeout_ms (0.05 ms after its arrival: it sent "
            "no timeout of its own), less than a run of the model takes); raise the model's "
            "default_timeout_ms",
        ),
        (
            500 * US,
            "(its due time is its model's default_timeout_ms (0.5 ms after its arrival: it sent "
            "no timeout of its own), and it waited that long to be read: the server is "
            "overloaded); retry later, or raise the model's default_timeout_ms",
        ),
    ],
)  # fmt: skip
def test_a_request_due_by_default_before_it_is_queued_is_told_so(default: int, words: str) -> None:
    async def body() -> None:
        h = harness(default_timeout_ns=default)
        with pytest.raises(DeadlineExceeded) as refused:
            submit(h, "r", arrived_ago=1 * MS)
        message = refused.value.message
        assert message.startswith("Request timeout expired: ")  # (Triton's words first)
        assert "before it reached the scheduler " + words in message
        with pytest.raises(DeadlineExceeded) as refused:  # (its own, earlier: as before)
            submit(h, "own", due_in=-990 * US, arrived_ago=1 * MS)
        assert refused.value.message.endswith(
            "(its timeout is too short, or it waited that long to be read: the server is "
            "overloaded); send a larger timeout or retry later"
        )

    run(body)


def test_an_own_timeout_of_the_defaults_length_is_told_as_its_own() -> None:
    """Found by a tester: the scheduler told a due time the default set by its length, and a
    request's own timeout of exactly the default's was refused as one that "sent no timeout of
    its own", told to raise the default."""

    async def body() -> None:
        h = harness(default_timeout_ns=50 * US)  # (a run of one row: 100 µs)
        with pytest.raises(Overloaded) as refused:
            submit(h, "own", due_in=50 * US)
        message = refused.value.message
        assert message.endswith("; retry with a larger timeout or later"), message
        assert "default_timeout_ms" not in message

    run(body)


def test_a_request_without_an_arrival_time_due_by_default_is_told_so() -> None:
    """Found by a tester: an in-process call carries no arrival time, and one that sent no
    timeout, refused for the default due time, was told to send a larger timeout."""

    async def body() -> None:
        h = harness(default_timeout_ns=50 * US)
        for run_now in (False, True):
            with pytest.raises(Overloaded) as refused:
                h.scheduler.submit_nowait(
                    {"name": np.array(["r"])}, rows=1, shape_key=SHAPE, due_ns=None, priority=0,
                    run_now=run_now,
                )  # fmt: skip
            assert refused.value.message.endswith(
                ": its due time is its model's default_timeout_ms (0.05 ms after its arrival: it "
                "sent no timeout of its own), less than a run of the model takes; raise the "
                "model's default_timeout_ms"
            )
        with pytest.raises(Overloaded) as refused:  # (the router gave it the default's)
            h.scheduler.submit_nowait(
                {"name": np.array(["r"])}, rows=1, shape_key=SHAPE,
                due_ns=h.clock.now_ns() + 50 * US, priority=0, by_default=True,
            )  # fmt: skip
        assert "sent no timeout of its own" in refused.value.message

    run(body)
