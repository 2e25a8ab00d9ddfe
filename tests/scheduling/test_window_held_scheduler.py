"""ModelScheduler's batching window and due times (FakeClock; a late timer is the test calling
`_on_timer` or `_sweep` later than the scheduler asked).

Probe repro_edf_window_late: an idle EDF model (max_queue_delay_us 300 ms) held a lone request
due in 50 ms until its last on-time instant less the wake slack, and a wake-up later than that
failed it unrun with its run still fitting: "(2215 µs left): a run needs 2676 µs (+1639 µs kept
for margins and delivery); it was not run", 3 of 40. Probe repro_fifo_window_past_due: a FIFO
model held one for its whole 300 ms window, past its 50 ms due time, and then told it "(-498 µs
left): a run needs 3692 µs".
"""

from __future__ import annotations

from test_scheduler import MS, US, failure, harness, run

from duetime.errors import DeadlineExceeded

WINDOW_US = 300_000


def test_a_request_held_for_batchmates_runs_though_its_wake_up_came_late() -> None:
    """1 row runs 100 µs, 500 µs kept for margins, 300 µs of wake slack: the wait ends 900 µs
    before the due time. Woken 600 µs late, 300 µs are left: the run fits, the margins not."""

    async def body() -> None:
        h = harness(
            max_batch_size=4, max_queue_delay_us=WINDOW_US, wake_slack_ns=300 * US,
            delivery_margin_us=500,
        )  # fmt: skip
        request = h.submit("a", due_in=50 * MS)
        due = h.clock.now_ns() + 50 * MS
        assert h.scheduler._timer_at == due - 900 * US
        h.clock.advance(50 * MS - 300 * US)
        h.scheduler._sweep()  # (the sweeper's timer may come first)
        assert not request.done(), "failed unrun by the sweeper"
        h.scheduler._on_timer()
        assert h.job(0)[1] == ["a"]
        h.executor.complete(0)
        assert failure(request) is None
        assert h.scheduler.statistics().expired == 0
        await h.scheduler.aclose(0)

    run(body)


def test_a_late_sweeper_ends_the_window_earlier_by_its_lateness() -> None:
    """The sweeper's timer (every ms while requests queue) comes 2 ms late: the wake slack
    follows (300 µs to 2 ms), and the window armed with the old slack ends 1.7 ms earlier,
    before its own wake-up could come that late."""

    async def body() -> None:
        h = harness(
            max_batch_size=4, max_queue_delay_us=WINDOW_US, wake_slack_ns=300 * US,
            delivery_margin_us=500,
        )  # fmt: skip
        request = h.submit("a", due_in=50 * MS)
        due = h.clock.now_ns() + 50 * MS
        assert h.scheduler._timer_at == due - 900 * US
        h.clock.advance(1 * MS + 2 * MS)  # asked for in 1 ms, it came 2 ms late
        h.scheduler._on_sweep_timer()
        assert h.scheduler._wake_slack_ns == 2 * MS
        assert h.scheduler._timer_at == due - 600 * US - 2 * MS
        assert not request.done()
        h.clock.advance(1 * MS)  # on time: no slack raised, the window stays
        h.scheduler._on_sweep_timer()
        assert h.scheduler._timer_at == due - 600 * US - 2 * MS
        await h.scheduler.aclose(0)

    run(body)


def test_a_held_request_whose_run_no_longer_fits_fails_saying_it_waited_for_its_batch() -> None:
    async def body() -> None:
        h = harness(max_batch_size=4, max_queue_delay_us=WINDOW_US, delivery_margin_us=500)
        request = h.submit("a", due_in=50 * MS)
        h.clock.advance(50 * MS - 50 * US)  # a timer later still: 50 µs left of a 100 µs run
        h.scheduler._on_timer()
        error = failure(request)
        assert isinstance(error, DeadlineExceeded)
        assert (
            "could not finish before the due time (50 µs left): a run needs 100 µs; the request "
            "waited for more requests to join its batch (max_queue_delay_us 300000), it was not "
            "run"
        ) in error.message
        assert "kept for margins" not in error.message, "its margins were not what failed it"
        assert h.executor.jobs == []

    run(body)


def test_fifo_s_window_ends_in_time_for_the_request_s_due_time() -> None:
    async def body() -> None:
        h = harness(
            policy="fifo", max_batch_size=4, max_queue_delay_us=WINDOW_US, delivery_margin_us=500
        )
        request = h.submit("a", due_in=50 * MS)
        due = h.clock.now_ns() + 50 * MS
        assert h.scheduler._timer_at == due - 600 * US, "the 1-row run and margin before it"
        h.clock.advance(50 * MS - 600 * US)
        h.scheduler._on_timer()
        assert h.job(0)[1] == ["a"]
        h.clock.advance(100 * US)
        h.executor.complete(0)
        assert failure(request) is None
        await h.scheduler.aclose(0)

    run(body)


def test_fifo_s_window_without_a_due_time_is_the_whole_max_queue_delay() -> None:
    async def body() -> None:
        h = harness(policy="fifo", max_batch_size=4, max_queue_delay_us=WINDOW_US)
        h.submit("a")
        assert h.scheduler._timer_at == h.clock.now_ns() + WINDOW_US * US
        await h.scheduler.aclose(0)

    run(body)


def test_a_fifo_request_whose_due_time_passed_in_its_window_is_told_so() -> None:
    async def body() -> None:
        h = harness(policy="fifo", max_batch_size=4, max_queue_delay_us=WINDOW_US)
        request = h.submit("a", due_in=50 * MS)
        h.clock.advance(50 * MS + 498 * US)  # the loop was held past the due time
        h.scheduler._sweep()
        error = failure(request)
        assert isinstance(error, DeadlineExceeded)
        assert error.message.startswith("Request timeout expired: ")  # (Triton's words)
        assert (
            "could not finish before the due time: it passed 498 µs ago while the request "
            "waited for more requests to join its batch (max_queue_delay_us 300000); "
            "it was not run"
        ) in error.message
        assert "a run needs" not in error.message

    run(body)


def test_a_request_that_passed_its_due_time_in_the_queue_is_told_so() -> None:
    async def body() -> None:
        h = harness(policy="fifo", max_batch_size=4)
        h.submit("running")
        request = h.submit("queued", due_in=1 * MS)
        h.clock.advance(1 * MS + 20 * US)
        h.scheduler._sweep()
        error = failure(request)
        assert isinstance(error, DeadlineExceeded)
        assert "it passed 20 µs ago while the request waited in the queue" in error.message

    run(body)
