"""The trace settings API: `TraceSettings` alone, then tritonclient on both protocols against a
server whose spans go to an in-memory exporter."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from test_tracing import traced
from tritonclient.utils import InferenceServerException

from duetime.errors import InvalidInput
from duetime.observability.tracesettings import TraceSettings
from duetime.observability.tracing import Tracing

__all__ = ["traced"]  # the traced server fixture of test_tracing


def count_traced(settings: TraceSettings, model: str, requests: int) -> int:
    return sum(settings.sample(model) for _ in range(requests))


def test_defaults_follow_whether_spans_have_an_exporter() -> None:
    assert TraceSettings(exporting=True).current() == {
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
        "log_frequency": "0", "trace_file": "", "trace_mode": "opentelemetry",
    }  # fmt: skip
    off = TraceSettings(exporting=False)
    assert off.current()["trace_level"] == ["OFF"]
    assert count_traced(off, "m", 5) == 0
    with pytest.raises(InvalidInput, match="tracing has no exporter"):
        off.update({"trace_level": ["TIMESTAMPS"]})


def test_rate_count_and_level_decide_which_requests_are_traced() -> None:
    settings = TraceSettings(exporting=True)
    assert count_traced(settings, "m", 10) == 10
    settings.update({"trace_rate": "4"})
    assert count_traced(settings, "m", 8) == 2
    settings.update({"trace_rate": 1, "trace_count": "3"})
    assert count_traced(settings, "m", 5) == 3
    assert settings.current()["trace_count"] == "0"  # counted down
    settings.update({"trace_count": "5"})  # a new count replaces what was left of the old
    assert count_traced(settings, "m", 7) == 5
    settings.update({"trace_count": "2"})
    assert settings.current()["trace_count"] == "2"
    settings.update({"trace_count": "-1"})
    assert count_traced(settings, "m", 7) == 7
    settings.update({"trace_count": "3"})
    settings.update({"trace_count": None})  # cleared: the default, no limit
    assert count_traced(settings, "m", 7) == 7
    settings.update({"trace_count": "-1", "trace_level": ["OFF"]})
    assert count_traced(settings, "m", 3) == 0


def test_a_models_settings_override_the_global_ones_until_cleared() -> None:
    settings = TraceSettings(exporting=True)
    settings.update({"trace_level": ["OFF"]})
    after = settings.update({"trace_level": ["TIMESTAMPS"], "trace_count": "2"}, "a")
    assert after["trace_level"] == ["TIMESTAMPS"]
    assert count_traced(settings, "a", 5) == 2
    assert count_traced(settings, "b", 5) == 0  # the global OFF
    assert settings.current("b")["trace_count"] == "-1"
    settings.update({"trace_count": "1"})  # (the global count)
    settings.update({"trace_count": "3"}, "a")
    assert count_traced(settings, "a", 5) == 3  # a's own count, restarted
    settings.update({"trace_level": None, "trace_count": []}, "a")  # cleared: the global ones
    assert settings.current("a")["trace_count"] == "1"  # (the global count left as it was)
    assert settings.current("a") == settings.current()
    settings.update({"trace_level": None})  # a global setting goes back to its default
    assert settings.current()["trace_level"] == ["TIMESTAMPS"]


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"trace_colour": "x"}, "unknown trace setting 'trace_colour'"),
        ({"trace_level": ["TENSORS"]}, "TENSORS is not supported"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, "expected TIMESTAMPS or OFF"),
        ({"trace_rate": "0"}, "'trace_rate': expected an integer >= 1"),
        ({"trace_count": "-2"}, "'trace_count': expected an integer >= -1"),
        ({"trace_count": "--1"}, "'trace_count': expected an integer >= -1"),
        ({"trace_rate": "1²"}, "'trace_rate': expected an integer >= 1"),
        ({"log_frequency": "²"}, "'log_frequency': expected an integer >= 0"),
        ({"trace_rate": ["1", "2"]}, "expected one value"),
        ({"trace_rate": True}, "expected a string or an integer"),
        ({"log_frequency": "5"}, "'log_frequency': only 0"),
        ({"trace_file": "/tmp/t.json"}, "'trace_file': only"),
        ({"trace_mode": "triton"}, "'trace_mode': only opentelemetry"),
    ],
    ids=str,
)
def test_bad_settings_are_refused(changes: dict[str, Any], needle: str) -> None:
    settings = TraceSettings(exporting=True)
    with pytest.raises(InvalidInput, match=re.escape(needle)):
        settings.update(changes)
    assert settings.current() == TraceSettings(exporting=True).current()


def roots(exporter: InMemorySpanExporter, tracing: Tracing) -> int:
    tracing.provider.force_flush()
    count = sum(1 for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER)
    exporter.clear()
    return count


def test_tritonclient_trace_settings_decide_the_spans(
    traced: tuple[RunningServer, InMemorySpanExporter, Tracing],
) -> None:
    running, exporter, tracing = traced
    http = httpclient.InferenceServerClient(running.http)
    grpc = grpcclient.InferenceServerClient(running.grpc)
    x = httpclient.InferInput("x", [1, 40], "FP32")
    x.set_data_from_numpy(np.zeros((1, 40), np.float32))

    def infer(times: int) -> int:
        for _ in range(times):
            http.infer("mlp", [x])
        return roots(exporter, tracing)

    try:
        assert http.get_trace_settings()["trace_level"] == ["TIMESTAMPS"]
        roots(exporter, tracing)
        assert infer(3) == 3
        assert http.update_trace_settings(settings={"trace_rate": "3"})["trace_rate"] == "3"
        assert infer(6) == 2
        updated = grpc.update_trace_settings(
            model_name="mlp", settings={"trace_level": ["OFF"]}, as_json=True
        )
        assert updated["settings"]["trace_level"] == {"value": ["OFF"]}
        assert infer(3) == 0
        assert grpc.get_trace_settings(as_json=True)["settings"]["trace_level"] == {
            "value": ["TIMESTAMPS"]
        }  # the global setting is unchanged
        http.update_trace_settings(model_name="mlp", settings={"trace_level": None})
        http.update_trace_settings(settings={"trace_rate": None})
        assert infer(2) == 2
        with pytest.raises(InferenceServerException, match="TENSORS is not supported"):
            grpc.update_trace_settings(settings={"trace_level": ["TENSORS"]})
        with pytest.raises(InferenceServerException, match="no-such-model"):
            http.get_trace_settings(model_name="no-such-model")
    finally:
        http.close()
        grpc.close()
