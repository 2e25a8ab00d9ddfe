"""A load request's `config` that fails leaves no reference cycle behind: the server's tuned
collector (`server.tune_gc`: gc.freeze, a gen-0 threshold of 50,000) hardly runs, and a 20 MB
config that failed validation held 118 MB a request for minutes (found by a tester): the
error was kept in a local of the frame its own traceback held."""

from __future__ import annotations

import gc

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
    with collector_off():
        with pytest.raises(InvalidInput):
            parse_config_override(text, "orderbook")
        assert gc.collect() == 0
