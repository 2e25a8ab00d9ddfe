"""The classification extension (Triton's): an output returned as its top classes, not its values.

A request asks for it per output (HTTP: the output parameter `classification`; gRPC: the output
parameter `classification` as `int64_param`; tritonclient: `InferRequestedOutput(name,
class_count=N)`). The output then comes back as BYTES of shape [batch, N] (a model that does not
batch: [N]); each element is `"<value>:<index>"` for one of the N highest values of that batch
element's output (all its elements, flattened, are the classes), highest first; with labels
(the output's config `labels`, Triton's `label_filename`) `"<value>:<index>:<label>"`. Values
print as Triton prints them: floating point with six decimals (`%f`), integers as integers.
Equal values keep index order. A count above the number of classes gives all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from duetime.datatypes import BFLOAT16
from duetime.errors import InvalidInput
from duetime.types import TensorSpec

PARAMETER = "classification"


VALUE_CHARS = {"FP64": 317, "FP32": 47, "FP16": 47, "BF16": 47}
"""The longest value an element of these types prints as (`%f` of the most negative finite
value); integers print as at most 20 characters."""


def max_class_bytes(datatype: str, labels: Sequence[str] = ()) -> int:
    """The most bytes one class of an output of `datatype` takes in an answer: its text
    (value, index up to 20 digits, the longest of `labels`) and its 4-byte length."""
    label = max((len(text.encode()) for text in labels), default=0)
    return 4 + VALUE_CHARS.get(datatype, 20) + 1 + 20 + (1 + label if label else 0)


def class_count(value: Any, output: str) -> int:
    """The `classification` parameter of `output`, checked: a positive integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(
            f"output '{output}': parameter 'classification' must be a positive integer (the "
            f"number of classes to return), got {value!r}"
        )
    return value


def check_classifiable(
    classes: Mapping[str, int], outputs: Iterable[TensorSpec], returned: Iterable[str]
) -> None:
    """Refuse classification of an output that is not returned (`returned`: the outputs the
    request gets) or whose values are not numbers (`outputs`: the model's output specs), and a
    count that is not a positive integer."""
    answered = set(returned)
    for name, count in classes.items():
        class_count(count, name)
        if name not in answered:
            raise InvalidInput(
                f"output '{name}': asked for as classes, but it is not among the outputs "
                f"returned ({', '.join(sorted(answered)) or 'none'})"
            )
    for spec in outputs:
        if spec.name in classes and spec.datatype == "BYTES":
            raise InvalidInput(
                f"output '{spec.name}': classification needs numeric values, but the output is "
                "BYTES"
            )


def top_classes(
    array: np.ndarray, count: int, batched: bool, labels: Sequence[str] = ()
) -> np.ndarray:
    """`array`'s top `count` classes per batch element, as the extension returns them (with the
    class's label where `labels` has one)."""
    if array.dtype == BFLOAT16:  # (FP32 holds each value; numpy sorts no ml_dtypes array)
        array = array.astype(np.float32)
    if array.dtype.kind not in "biuf":
        raise InvalidInput(
            f"classification needs numeric values, but the output holds {array.dtype}"
        )
    rows = array.reshape(array.shape[0], -1) if batched and array.ndim else array.reshape(1, -1)
    classes = rows.shape[1]
    k = min(count, classes)
    # NOTE: a stable ascending sort of the reversed row, read backwards: highest value first,
    # and among equal values the lower index first. NaN ranks as -inf (numpy sorts it above
    # every number: a NaN score was the top class; found by a tester)
    ranked = np.where(np.isnan(rows), -np.inf, rows) if rows.dtype.kind == "f" else rows
    backwards = np.argsort(ranked[:, ::-1], axis=1, kind="stable")[:, ::-1][:, :k]
    order = classes - 1 - backwards
    values = np.take_along_axis(rows, order, axis=1)
    text = "%f:%d" if array.dtype.kind == "f" else "%d:%d"
    out = np.empty(order.shape, dtype=object)
    named = len(labels)
    for r in range(order.shape[0]):
        for c in range(k):
            index = order[r, c]
            entry = text % (values[r, c], index)
            if index < named and labels[index]:  # (as Triton: no label, no third field)
                entry = f"{entry}:{labels[index]}"
            out[r, c] = entry.encode()
    return out if batched and array.ndim else out.reshape(k)
