"""`duetime bench` keeps its setup out of the cyclic collector's sight while it runs (a full
collection scanning its payloads once paused it 12 ms, and answers sent on time were read
late), and leaves a freeze made before it (a server tuned in the same process) as it was."""

from __future__ import annotations

import gc

from duetime.tools.loadgen import _collector_spares_setup


def test_the_setup_is_frozen_for_the_run_and_thawed_after() -> None:
    gc.unfreeze()  # (another test's in-process server may have frozen its own)
    with _collector_spares_setup():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_a_freeze_made_before_the_run_is_left_frozen() -> None:
    gc.freeze()  # as `tune_gc` does for a server in this process
    before = gc.get_freeze_count()
    with _collector_spares_setup():
        assert gc.get_freeze_count() > before // 2
    # (frozen objects freed by their counts leave it meanwhile: thawed, it would be 0)
    assert gc.get_freeze_count() > before // 2, "the server's frozen objects were thawed"
