"""KServe v2 tensor datatypes and their numpy and ONNX counterparts."""

from __future__ import annotations

from typing import Any, Final

import ml_dtypes
import numpy as np

BFLOAT16: Final[np.dtype[Any]] = np.dtype(ml_dtypes.bfloat16)
"""BF16's numpy dtype (ml_dtypes'): numpy has none, and ml_dtypes' is no numpy float (its kind
is "V"): `is_float` says which dtypes are."""

#: v2 datatype name -> numpy dtype. BYTES tensors are numpy object arrays of `bytes`.
NUMPY_OF: Final[dict[str, np.dtype[np.generic]]] = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": BFLOAT16,
    "BYTES": np.dtype(np.object_),
}

#: Little-endian wire dtypes for the binary extension and gRPC raw contents.
WIRE_DTYPE_OF: Final[dict[str, np.dtype[np.generic]]] = {
    name: dt.newbyteorder("<") for name, dt in NUMPY_OF.items() if name != "BYTES"
}

#: ONNX Runtime's type strings (`NodeArg.type`) -> v2 datatype name.
V2_OF_ONNX: Final[dict[str, str]] = {
    "tensor(bool)": "BOOL",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16",
    "tensor(string)": "BYTES",
}

#: Triton's model-config enum names, used by the config endpoints.
TRITON_TYPE_OF: Final[dict[str, str]] = {
    name: "TYPE_STRING" if name == "BYTES" else f"TYPE_{name}" for name in NUMPY_OF
}

_V2_OF_DTYPE: Final[dict[np.dtype[np.generic], str]] = {
    dt: name for name, dt in NUMPY_OF.items() if name != "BYTES"
} | {dt: name for name, dt in WIRE_DTYPE_OF.items()}


def numeric_v2_datatype(dtype: np.dtype[Any]) -> str | None:
    """The v2 datatype name of a numeric numpy dtype, native or little-endian (None: it has
    none, as float8)."""
    return _V2_OF_DTYPE.get(dtype)


def is_float(dtype: np.dtype[Any]) -> bool:
    """Whether `dtype` holds floating-point numbers: numpy's floats, and BF16's."""
    return dtype.kind == "f" or dtype == BFLOAT16


def to_bfloat16(values: np.ndarray) -> np.ndarray:
    """Float64 `values` rounded to the nearest bfloat16, ties to even.

    NOTE: not `astype`: ml_dtypes rounds a double to float32 first, then to bfloat16, twice:
    257.0000001 became 256, and 3.3961775e38, below the midpoint past BF16's largest value, inf
    (found by a tester). Rounded to float32 to odd (toward zero, then its last bit set where it
    is inexact), the second rounding is exact: float32 has 16 more bits than bfloat16."""
    with np.errstate(over="ignore", invalid="ignore"):
        single = values.astype(np.float32)
        wide = single.astype(np.float64)
        over = np.abs(wide) > np.abs(values)
        single[over] = np.nextafter(single[over], np.float32(0))
        inexact = single.astype(np.float64) != values
    bits = single.view(np.uint32)
    bits[inexact] |= 1
    return single.astype(BFLOAT16)


def float_info(dtype: np.dtype[Any]) -> Any:
    """`np.finfo` of a float dtype (`is_float`), BF16's too (ml_dtypes': numpy's has none)."""
    return ml_dtypes.finfo(dtype)  # type: ignore[no-untyped-call]


def v2_datatype_of(array: np.ndarray) -> str:
    """The v2 datatype name of a numpy array; `bytes`/`str` arrays map to BYTES."""
    name = _V2_OF_DTYPE.get(array.dtype)
    if name is not None:
        return name
    if array.dtype.kind in "OSU":
        return "BYTES"
    name = _V2_OF_DTYPE.get(array.dtype.newbyteorder("="))
    if name is None:
        raise TypeError(f"numpy dtype {array.dtype} has no KServe v2 datatype")
    return name


def unserved_output_reason(onnx_type: str) -> str:
    """Why a graph output of ONNX Runtime type `onnx_type` (none of `V2_OF_ONNX`) is not served,
    as the load warning and a request asking for it say: each type has its own limit and fix."""
    if onnx_type == "tensor(bfloat16)":  # (see `ort.bfloat16_run`)
        return (
            "its type bfloat16 comes out of ONNX Runtime's Python API only beside inputs it can "
            "take as OrtValues, which strings are not, and this graph has a string input; have "
            "the graph Cast it to float or float16"
        )
    if onnx_type.startswith("seq(map("):
        return (
            f"it is a sequence of maps ({onnx_type}, a ZipMap's), which the v2 protocol cannot "
            "carry; export the classifier with zipmap=False to have its probabilities as a "
            "tensor (skl2onnx options={'zipmap': False}, onnxmltools convert_*(..., "
            "zipmap=False))"
        )
    return (
        f"its type {onnx_type} is none the v2 protocol carries; supported: "
        f"{', '.join(sorted(V2_OF_ONNX))}"
    )
