"""`request_time_slice`: the event loop thread's EEVDF slice (Linux 6.12+), best effort."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

from duetime.config import ServerSettings
from duetime.execution.affinity import MIN_SLICE_NS, request_time_slice, time_slice

T = TypeVar("T")


def _in_thread(work: Callable[[], T]) -> T:
    """Run `work()` on a thread of its own (a slice, or a niceness, is per thread)."""
    result: list[T] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    thread.join()
    return result[0]


def test_a_slice_is_granted_as_asked_or_not_at_all() -> None:
    granted = _in_thread(lambda: request_time_slice(300_000))
    assert granted in (None, 300_000)


def test_a_slice_shorter_than_linux_grants_is_clamped() -> None:
    granted = _in_thread(lambda: request_time_slice(1_000))
    assert granted in (None, MIN_SLICE_NS)


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="niceness per thread is Linux's")
def test_the_threads_niceness_survives_the_request() -> None:
    def nice_then_slice() -> tuple[int, int]:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, 7)
        request_time_slice(MIN_SLICE_NS)
        policy = os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)
        return os.getpriority(os.PRIO_PROCESS, tid), policy

    niceness, policy = _in_thread(nice_then_slice)
    assert niceness == 7
    assert policy == os.SCHED_OTHER


def test_the_setting_bounds_are_linuxs() -> None:
    assert ServerSettings(loop_slice_us=0).loop_slice_us == 0
    with pytest.raises(ValueError, match="loop_slice_us"):
        ServerSettings(loop_slice_us=100_001)
    with pytest.raises(ValueError, match="loop_slice_us"):
        ServerSettings(loop_slice_us=-1)


def test_threads_started_afterwards_keep_the_kernels_slice() -> None:
    def slice_then_child() -> tuple[int | None, int | None, int | None]:
        before = time_slice()
        granted = request_time_slice(MIN_SLICE_NS)
        return before, granted, _in_thread(time_slice)

    before, granted, child = _in_thread(slice_then_child)
    if granted is None:
        pytest.skip("no slice request on this kernel (Linux 6.12+) or machine")
    assert child == before


def test_the_slice_read_back_is_the_one_granted() -> None:
    def ask_then_read() -> tuple[int | None, int | None]:
        return request_time_slice(400_000), time_slice()

    granted, read = _in_thread(ask_then_read)
    assert granted == read
