"""The load shedder's sampling period: every 10 ms while the loop works, every 50 ms while it
is idle (an idle server used 1.4% of a core on the timer's wake-ups alone)."""

from __future__ import annotations

from duetime.overload import LoadShedder
from duetime.server import IDLE_SAMPLE_S, SHED_PERIOD_S, sample_period


def test_an_idle_loop_samples_less_often_and_any_sign_of_work_brings_it_back() -> None:
    meter = LoadShedder(period=SHED_PERIOD_S)
    meter.utilization = 0.01
    assert sample_period(meter, 0) == IDLE_SAMPLE_S
    assert sample_period(meter, 3) == SHED_PERIOD_S  # (gRPC calls waiting in its core)
    meter.utilization = 0.2
    assert sample_period(meter, 0) == SHED_PERIOD_S
    meter.utilization = 0.0
    meter.share = 0.1  # (refusing: the share decays sample by sample)
    assert sample_period(meter, 0) == SHED_PERIOD_S
