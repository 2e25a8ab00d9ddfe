"""KServe v2 tensor datatypes and their numpy and ONNX counterparts."""

from __future__ import annotations

from typing import Any, Final

import numpy as np

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
    "BYTES": np.dtype(np.object_),
}

#: v2 datatypes duetime does not serve (yet), and why: a request naming one is told so.
#: NOTE: BF16 (Triton's TYPE_BF16): onnxruntime 1.32's Python API refuses `ml_dtypes.bfloat16`
#: arrays as inputs ("Numpy_type 256 can't be converted to MLDataType") and gives no numpy array
#: of a bfloat16 output; only OrtValues over uint16 (`ortvalue_from_numpy_with_onnx_type`) and
#: raw output pointers would carry them, a separate run path in the executor.
UNSERVED: Final[dict[str, str]] = {
    "BF16": "ONNX Runtime's Python API takes and gives no bfloat16 numpy arrays, so a model with "
    "a bfloat16 input does not load (nor is a bfloat16 output served); send FP32 (or FP16) to a "
    "model exported with them",
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
    none, as bfloat16)."""
    return _V2_OF_DTYPE.get(dtype)


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
    if onnx_type == "tensor(bfloat16)":  # (v2 defines BF16: the limit is ORT's, see UNSERVED)
        return (
            "its type bfloat16 cannot be returned through ONNX Runtime's Python API (it gives no "
            "numpy array of one); have the graph Cast it to float or float16"
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
