"""Plain data shared by every stage: tensor specs, model signatures, requests and responses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output of a model: its name, v2 datatype and shape (-1 for a free dim).

    For a model that batches (`max_batch_size > 0`) the first dim is the batch dim and is -1.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    any_rank: bool = False
    """The graph declares no shape at all (not even a rank): any shape is taken, and `shape`
    is () (a model config's `dims` can give it one)."""
    optional: bool = False
    """An input requests may leave out: a graph input with an initializer, which ONNX Runtime
    uses when the request gives none (Triton's `optional: true`)."""
    wire: tuple[int, ...] | None = None
    """The shape requests carry and answers are given in, where the config's `reshape` makes
    it differ from `shape` (then the graph's, what ONNX Runtime takes and gives), as Triton's
    `dims` with a `reshape`: dims [1] with reshape [] takes [batch, 1] from requests and runs
    the graph on [batch]. The same elements in the same order. None: `shape`."""

    @property
    def client_shape(self) -> tuple[int, ...]:
        """The shape requests carry and answers are given in (-1 for a free dim)."""
        return self.shape if self.wire is None else self.wire

    def describe(self) -> str:
        if self.any_rank:
            return f"{self.datatype}[any shape]"
        return f"{self.datatype}{list(self.client_shape)}"

    def shown(self) -> list[int]:
        """The shape as metadata gives it: [-1] for any shape (the v2 protocol has no way to
        say "any rank"; a free dim is the nearest)."""
        return [-1] if self.any_rank else list(self.client_shape)


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """What a model version accepts and returns, as clients see it."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int

    @property
    def required_inputs(self) -> tuple[TensorSpec, ...]:
        return tuple(spec for spec in self.inputs if not spec.optional)

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.outputs if spec.name == name), None)


@dataclass(slots=True, eq=False)
class InferRequest:
    """One inference request as every front end hands it to the Engine.

    `inputs` maps input names to numpy arrays (views over wire bytes where possible); `due_ns` is
    a `time.monotonic_ns()` instant or None for no deadline; `outputs` names the outputs wanted
    (None: all of them); `priority` follows Triton (1 highest, 0 the model's default level).
    """

    model: str
    inputs: dict[str, np.ndarray]
    version: str | None = None
    outputs: tuple[str, ...] | None = None
    classes: Mapping[str, int] | None = None
    """Outputs to return as their top classes, and how many (the classification extension: see
    duetime/classification.py)."""
    id: str = ""
    due_ns: int | None = None
    arrival_ns: int | None = None
    """When it reached the server, as far as its front end can tell (None: when it is routed);
    a model's `default_timeout_ms` counts from here (see frontend/arrival.py)."""
    priority: int = 0
    parameters: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    """HTTP headers or gRPC metadata, lower-case keys (the traffic policy's sticky key)."""
    timing: RequestTiming | None = None
    """Instants the stages fill in while tracing is on (None: not traced)."""
    protocol: str = "engine"
    """The front end it came through: `http`, `grpc`, `grpc-stream`, or `engine` (in-process);
    recorded by traffic capture."""
    template: object | None = None
    """Set by a front end on requests decoded from one template (the same names, datatypes and
    shapes of inputs, the same outputs asked for): an object compared by identity, which lets the
    validator skip checks it passed before (see `Validator.prepare`). None: checked in full."""
    wire: tuple[bytes, int | None] | None = None
    """The v2 REST body it was decoded from (after any Content-Encoding) and the length of its
    JSON header (None: all JSON), for traffic capture to store verbatim; a reference, not a copy
    (None: not decoded from an HTTP body)."""


@dataclass(slots=True, eq=False)
class InferResponse:
    """The answer to one InferRequest: output arrays keyed by name, in the model's order."""

    model: str
    version: str
    id: str
    outputs: dict[str, np.ndarray]
    variant: str = "default"
    """Which of the version's variants answered ("default": its own model.onnx)."""


@dataclass(slots=True, eq=False)
class RequestTiming:
    """Monotonic instants (ns) a traced request passes; 0 where a stage did not happen."""

    received_ns: int
    decoded_ns: int = 0
    queued_ns: int = 0
    """Admitted to its variant's scheduler."""
    dispatched_ns: int = 0
    """Taken into a batch."""
    started_ns: int = 0
    """When its batch was to start on the instance."""
    finished_ns: int = 0
    """Its batch's result back on the event loop."""
    compute_ns: int = 0
    batch_rows: int = 0
    instance: int = -1


def model_words(name: str, version: int | str, variant: str | None = None) -> str:
    """A model version (and its variant) as messages to clients and logs name it: `'m' version
    1`, `'m' version 1 variant fp16`."""
    words = f"'{name}' version {version}"
    return words if variant is None else f"{words} variant {variant}"
