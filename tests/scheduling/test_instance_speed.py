"""Each instance's latency profile: the variant's at the instance's own pace (InstanceSpeed),
learnt from its runs, used where the instance is known and in admission."""

from __future__ import annotations

import pytest
from test_scheduler import ONE_ROW, US, Harness, harness, run

from duetime.errors import Overloaded
from duetime.scheduling.profile import SPEED_MAX, SPEED_MIN_RUNS, InstanceSpeed


def test_a_speed_is_1_until_runs_set_it_then_the_mean_of_its_first_runs() -> None:
    speed = InstanceSpeed()
    for _ in range(SPEED_MIN_RUNS - 1):
        speed.observe(1.5)
    assert speed.value == 1.0
    speed.observe(1.5)
    assert speed.value == pytest.approx(1.5)
    speed.observe(1.5 + SPEED_MIN_RUNS + 1)  # (at most twice the pace: 3.0)
    assert speed.value == pytest.approx((1.5 * SPEED_MIN_RUNS + 3.0) / (SPEED_MIN_RUNS + 1))


def test_one_stalled_run_moves_a_speed_little() -> None:
    speed = InstanceSpeed(min_runs=1)
    for _ in range(100):
        speed.observe(1.0)
    speed.observe(1000.0)  # counted as twice the current pace, at the EWMA's weight
    assert speed.value == pytest.approx(1.05)


def test_a_speed_stays_within_its_bounds() -> None:
    speed = InstanceSpeed(min_runs=1)
    for _ in range(200):
        speed.observe(1000.0)
    assert speed.value == SPEED_MAX


def teach(h: Harness, rounds: int, pace_ns: int) -> None:
    """`rounds` pairs of requests, one on each instance: instance 0's runs take the profile's
    100 µs, instance 1's `pace_ns`."""
    for index in range(rounds):
        h.submit(f"a{index}")
        h.submit(f"b{index}")
        jobs = [2 * index, 2 * index + 1]
        assert sorted(h.job(job)[0] for job in jobs) == [0, 1]
        took = {0: ONE_ROW, 1: pace_ns}
        elapsed = 0
        for job in sorted(jobs, key=lambda job: took[h.job(job)[0]]):
            compute = took[h.job(job)[0]]
            h.clock.advance(compute - elapsed)
            elapsed = compute
            h.executor.complete(job, compute_ns=compute)


def test_an_instance_slower_than_the_profile_learns_its_own_pace() -> None:
    async def body() -> None:
        h = harness(instances=2)
        teach(h, 40, 2 * ONE_ROW)
        stats = h.scheduler.statistics()
        assert stats.instance_speeds[0] == 1.0
        assert stats.instance_speeds[1] == pytest.approx(2.0, rel=0.01)
        # the variant's profile is instance 0's: the slow instance's runs did not drag it
        assert h.scheduler.profile.predict(1) == pytest.approx(ONE_ROW, rel=0.01)

    run(body)


def test_a_slowdown_every_instance_shares_is_no_instance_s_own() -> None:
    """The profile says 100 µs, and every instance's runs take 200 (a load measured on a quiet
    CPU): identical instances keep one pace; the profile learns the slowdown. Compared with
    the profile itself, instance 1's first runs read as its own slowness: identical instances
    were given paces of 1.5-2.4 (found by a tester)."""

    async def body() -> None:
        h = harness(instances=2)
        for index in range(40):
            h.submit(f"a{index}")
            h.submit(f"b{index}")
            h.clock.advance(2 * ONE_ROW)
            h.executor.complete(2 * index, compute_ns=2 * ONE_ROW)
            h.executor.complete(2 * index + 1, compute_ns=2 * ONE_ROW)
        assert h.scheduler.statistics().instance_speeds == (1.0, pytest.approx(1.0, rel=0.01))
        assert h.scheduler.profile.estimate_ns(1) > 1.5 * ONE_ROW

    run(body)


def test_admission_predicts_the_run_on_the_instance_that_will_take_it() -> None:
    async def body() -> None:
        h = harness(instances=2)
        teach(h, 40, 2 * ONE_ROW)
        h.submit("busy")  # instance 0 runs it: free in 100 µs; instance 1 idle, takes 200 µs
        assert h.job(80)[0] == 0
        with pytest.raises(Overloaded):  # 200 µs either way: instance 0's turn, or instance 1
            h.submit("tight", due_in=190 * US)
        h.submit("roomy", due_in=210 * US)

    run(body)


def test_an_instance_is_booked_for_its_own_pace() -> None:
    async def body() -> None:
        h = harness(instances=2, max_batch_size=4, max_queue_delay_us=0)
        teach(h, 40, 2 * ONE_ROW)
        h.submit("first")  # instance 0
        h.submit("second")  # instance 1, booked for 200 µs
        assert [h.job(80)[0], h.job(81)[0]] == [0, 1]
        h.clock.advance(ONE_ROW)
        h.executor.complete(80, compute_ns=ONE_ROW)
        # instance 0 free now, instance 1 until 100 µs from now: a request due in 250 µs runs
        # on instance 0 at once (batches planned against instance 1's booking would wait)
        done = h.submit("third", due_in=250 * US)
        assert h.job(82) == (0, ["third"])
        h.clock.advance(ONE_ROW)
        h.executor.complete(81, compute_ns=2 * ONE_ROW)
        h.executor.complete(82, compute_ns=ONE_ROW)
        assert done.done()
        assert done.exception() is None
        assert h.scheduler.statistics().late == 0

    run(body)


def test_a_batch_on_a_slow_instance_is_planned_for_its_pace() -> None:
    """Three requests queued behind both instances' runs, due 300 µs after the slow instance
    frees up: a batch of 3 takes 200 µs by the profile but about twice that there, so it takes
    2 (150 µs by the profile), and the third waits for instance 0."""

    async def body() -> None:
        h = harness(instances=2, max_batch_size=4, max_queue_delay_us=0)
        teach(h, 40, 2 * ONE_ROW)
        h.submit("p")
        h.submit("q")
        assert [h.job(80)[0], h.job(81)[0]] == [0, 1]
        for name in ("x", "y", "z"):
            h.submit(name, due_in=350 * US)
        h.clock.advance(50 * US)
        h.executor.complete(81, compute_ns=2 * ONE_ROW)  # instance 1 frees up first
        assert h.job(82) == (1, ["x", "y"])
        h.clock.advance(50 * US)
        h.executor.complete(80, compute_ns=ONE_ROW)
        assert h.job(83) == (0, ["z"])

    run(body)


def test_a_request_goes_to_the_fastest_idle_instance() -> None:
    """Instance 1 runs at half the profile's time: a request due in 80 µs is admitted (50 µs
    there) and run there, not on instance 0 (100 µs), though instance 0 is idle too."""

    async def body() -> None:
        h = harness(instances=2)
        teach(h, 40, ONE_ROW // 2)
        assert h.scheduler.statistics().instance_speeds[1] == pytest.approx(0.5, rel=0.02)
        done = h.submit("quick", due_in=80 * US)
        assert h.job(80) == (1, ["quick"])
        h.clock.advance(ONE_ROW // 2)
        h.executor.complete(80, compute_ns=ONE_ROW // 2)
        assert done.exception() is None
        assert h.scheduler.statistics().late == 0

    run(body)


def test_an_instance_with_no_runs_of_instance_0_to_compare_with_still_teaches_the_profile() -> None:
    """Instance 0 held by a long run: instance 1's runs, at twice the profile's time, keep the
    profile current (its pace, with nothing to compare with, stays 1)."""

    async def body() -> None:
        h = harness(instances=2)
        h.submit("long")
        assert h.job(0)[0] == 0
        for index in range(1, 41):
            h.submit(f"r{index}")
            assert h.job(index)[0] == 1
            h.clock.advance(2 * ONE_ROW)
            h.executor.complete(index, compute_ns=2 * ONE_ROW)
        assert h.scheduler.statistics().instance_speeds == (1.0, 1.0)
        assert h.scheduler.profile.estimate_ns(1) > 1.5 * ONE_ROW
        h.executor.complete(0)

    run(body)
