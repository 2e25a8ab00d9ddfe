"""A load request's `config` that fails leaves no reference cycle behind: the server's tuned
collector (`server.tune_gc`: gc.freeze, a gen-0 threshold of 50,000) hardly runs, and a 20 MB
config that failed validation held 118 MB a request for minutes (found by a tester): the
error was kept in a local of the frame its own traceback held."""

from __future__ import annotations

import gc
import types

import pytest
from conftest import collector_off

from duetime.errors import InvalidInput
from duetime.frontend.rest import parse_config_override


@pytest.mark.parametrize(
    "text",
    [
        '{"max_batch_size": "' + "a" * 1000 + '"}',  # (duetime's form, a bad value)
        '{"unknown_field": 1, "max_batch_size": 2}',  # (neither form)
        '{"input": 3}',  # (Triton's form, a bad value)
        '{"max_batch_size": 4, "dynamic_batching": {"x": 1}}',
    ],
)
def test_a_failed_config_override_leaves_no_cycle(text: str) -> None:
    """Judged by the frames of the parse left in cycles (not by a count of every object the
    collector finds: servers of other tests run beside this one, on threads of their own)."""
    with collector_off():
        gc.set_debug(gc.DEBUG_SAVEALL)  # (what the collector finds goes to gc.garbage)
        try:
            with pytest.raises(InvalidInput):
                parse_config_override(text, "orderbook")
            gc.collect()
            left = [
                item.f_code.co_name
                for item in gc.garbage
                if isinstance(item, types.FrameType) and item.f_code.co_name in PARSING
            ]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert left == []


PARSING = frozenset(
    ("parse_config_override", "read_json_config", "parse_model_config", "_parsed", "validated")
)
"""The functions a config override's parse runs through."""
