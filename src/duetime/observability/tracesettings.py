"""Triton's trace settings API (`/v2/[models/<m>/]trace/setting`, gRPC `TraceSetting`).

duetime traces with OpenTelemetry (observability/tracing.py: a span per request with a child
per stage, exported where the `OTEL_*` variables say). The settings decide which finished
requests get their spans, globally or per model (a model's setting overrides the global one
until it is cleared with null / an empty value):

- `trace_level`: `["TIMESTAMPS"]` (stage spans) or `["OFF"]`. `TENSORS` is refused: duetime does
  not copy tensors into traces. Without a configured exporter only `OFF` is possible.
- `trace_rate`: trace one request in N (each model counts its own).
- `trace_count`: how many more requests to trace (-1: no limit); it counts down as they are.
- `trace_mode` is `opentelemetry`; `trace_file` is "" and `log_frequency` 0: spans go to the
  exporter in its batches, not to a file; other values are refused.

Values come as Triton sends them: strings (numbers too), or lists of strings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from duetime.errors import InvalidInput, shown

if TYPE_CHECKING:
    from duetime.observability.tracing import Tracing

Value = list[str] | str
NAMES = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")
_INTEGER = re.compile(r"-?[0-9]{1,18}")
"""An integer setting as text (ASCII digits: str.isdigit() also takes "²", which int() refuses)."""


class TraceSettings:
    """The global trace settings, each model's overrides, and the counters they drive."""

    def __init__(self, exporting: bool) -> None:
        self._exporting = exporting
        """Whether an exporter is configured: without one, nothing can be traced."""
        self._global: dict[str, Value] = _defaults(exporting)
        self._models: dict[str, dict[str, Value]] = {}
        self._seen: dict[str | None, int] = {}
        """Requests counted for `trace_rate`, per model with its own rate (None: the rest)."""
        self._left: dict[str | None, int] = {}
        """Traces left per scope (None: global) where `trace_count` is not -1."""

    def current(self, model: str | None = None) -> dict[str, Value]:
        """The settings in force globally, or for `model` (its overrides on the global ones)."""
        settings = dict(self._global)
        if model is not None:
            settings.update(self._models.get(model, {}))
        scope = self._count_scope(model)
        if scope in self._left:
            settings["trace_count"] = str(self._left[scope])
        return settings

    def update(self, changes: Mapping[str, Any], model: str | None = None) -> dict[str, Value]:
        """Apply `changes` (None or an empty list clears a setting: a model's falls back to the
        global one, a global one to its default); the settings in force after."""
        target = dict(self._global if model is None else self._models.get(model, {}))
        defaults = _defaults(self._exporting)
        for name, raw in changes.items():
            if name not in NAMES:
                raise InvalidInput(
                    f"unknown trace setting '{name}'; the settings are {', '.join(NAMES)}"
                )
            if raw is None or raw == []:
                if model is None:
                    target[name] = defaults[name]
                else:
                    target.pop(name, None)
                continue
            target[name] = self._checked(name, raw)
        if model is None:
            self._global = target
        else:
            self._models[model] = target
        if "trace_count" in changes:
            # NOTE: the scope written restarts from its new count (the remaining count of the
            # old one must not shadow it); a model's count cleared leaves the global one as it is
            self._left.pop(model, None)
            if self._count_scope(model) == model:
                count = int(str(target["trace_count"]))
                if count >= 0:
                    self._left[model] = count
        return self.current(model)

    def sample(self, model: str) -> bool:
        """Whether this finished request of `model` gets its spans (counts it)."""
        overrides = self._models.get(model)
        level = overrides.get("trace_level") if overrides else None
        if (level or self._global["trace_level"]) == ["OFF"]:
            return False
        rate_value = overrides.get("trace_rate") if overrides else None
        rate = int(str(rate_value or self._global["trace_rate"]))
        # NOTE: counted per model only for a model with settings of its own (as Triton's
        # models share the global setting's counter): counted per name, each request for
        # another unknown model name grew the server for good (found by a tester)
        counter = model if rate_value is not None else None
        seen = self._seen.get(counter, 0)
        self._seen[counter] = seen + 1
        if seen % rate:
            return False
        scope = self._count_scope(model)
        left = self._left.get(scope)
        if left is None:
            return True
        if left <= 0:
            return False
        self._left[scope] = left - 1
        return True

    def unsampled(self, model: str) -> None:
        """A request `sample` chose got no spans after all (the tracer's sampler dropped it,
        as a parent sampled out): its trace is not counted against `trace_count`.

        NOTE: two requests under an unsampled `traceparent` used up `trace_count` 2, and no
        trace was ever exported (found by a tester)."""
        scope = self._count_scope(model)
        if scope in self._left:
            self._left[scope] += 1

    def _count_scope(self, model: str | None) -> str | None:
        if model is not None and "trace_count" in self._models.get(model, {}):
            return model
        return None

    def _checked(self, name: str, raw: Any) -> Value:
        values = raw if isinstance(raw, list) else [raw]
        if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in values):
            raise InvalidInput(
                f"trace setting '{name}': expected a string or an integer (or a list of them), "
                f"got {shown(raw)}"
            )
        texts = [str(v) for v in values]
        if name == "trace_level":
            levels = sorted(set(t.upper() for t in texts))
            if "TENSORS" in levels:
                raise InvalidInput(
                    "trace setting 'trace_level': TENSORS is not supported (duetime's spans "
                    "carry stage timestamps, not tensors); use TIMESTAMPS or OFF"
                )
            if levels not in (["OFF"], ["TIMESTAMPS"]):
                raise InvalidInput(
                    "trace setting 'trace_level': expected TIMESTAMPS or OFF, got " + repr(raw)
                )
            if levels == ["TIMESTAMPS"] and not self._exporting:
                raise InvalidInput(
                    "trace setting 'trace_level': tracing has no exporter; start the server "
                    "with OTEL_TRACES_EXPORTER=otlp (or console) to trace requests"
                )
            return levels
        if len(texts) != 1:
            raise InvalidInput(f"trace setting '{name}': expected one value, got {shown(raw)}")
        text = texts[0].strip()
        if name in ("trace_rate", "trace_count", "log_frequency"):
            lowest = {"trace_rate": 1, "trace_count": -1, "log_frequency": 0}[name]
            if _INTEGER.fullmatch(text) is None or int(text) < lowest:
                raise InvalidInput(
                    f"trace setting '{name}': expected an integer >= {lowest}, got {shown(raw)}"
                )
            if name == "log_frequency" and int(text) != 0:
                raise InvalidInput(
                    "trace setting 'log_frequency': only 0; spans go to the OpenTelemetry "
                    "exporter in its own batches, not to a trace file"
                )
            return str(int(text))
        if name == "trace_file" and text:
            raise InvalidInput(
                "trace setting 'trace_file': only \"\"; spans go to the OpenTelemetry exporter "
                "(OTEL_* variables), not to a file"
            )
        if name == "trace_mode" and text != "opentelemetry":
            raise InvalidInput(f"trace setting 'trace_mode': only opentelemetry, got {shown(raw)}")
        return text


def _defaults(exporting: bool) -> dict[str, Value]:
    return {
        "trace_level": ["TIMESTAMPS"] if exporting else ["OFF"],
        "trace_rate": "1",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": "",
        "trace_mode": "opentelemetry",
    }


def trace_settings_of(tracing: Tracing | None) -> TraceSettings:
    """The settings `tracing` samples by, or (no tracing) settings that keep it off."""
    return tracing.settings if tracing is not None else TraceSettings(exporting=False)
