"""Element types GIR understands: one table maps each name to numpy and to its byte size,
so every stage (interpreter byte counts, capacity checks, emitters) agrees on sizes.

bfloat16 is numpy's through ml_dtypes (an onnx dependency), which also registers the name
"bfloat16" with numpy, so ``np.dtype("bfloat16")`` works wherever this module was imported."""
import ml_dtypes
import numpy as np

DTYPES = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float64": np.dtype(np.float64),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}


class DTypeError(ValueError):
    """An element type GIR has no mapping for."""


def np_dtype(name: str) -> np.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise DTypeError(f"unsupported dtype {name!r}; GIR supports {', '.join(DTYPES)}") from None



def itemsize(name: str) -> int:
    return np_dtype(name).itemsize


HALF = ("float16", "bfloat16")
"""16-bit float storage types: values are computed in fp32 registers and rounded once when stored."""


HALF_NP = (np.dtype(np.float16), DTYPES["bfloat16"])


def is_half(name: str) -> bool:
    return name in HALF


def is_float(name: str) -> bool:
    return name in HALF or np_dtype(name).kind == "f"


def np_is_float(dt) -> bool:
    """A numpy dtype holds floats (numpy gives ml_dtypes' bfloat16 kind 'V', not 'f')."""
    dt = np.dtype(dt)
    return dt.kind == "f" or dt == DTYPES["bfloat16"]


def accumulator(name: str) -> str:
    """Reductions and norms accumulate fp16 and bf16 in fp32 (DESIGN: half storage, fp32 accumulation)."""
    return "float32" if name in HALF else name


def compute(name: str) -> str:
    """The dtype a value of `name` is computed in: fp32 for the half types, itself otherwise."""
    return "float32" if name in HALF else name


def finfo(name: str):
    """np.finfo, which does not take ml_dtypes' bfloat16."""
    return ml_dtypes.finfo(np_dtype(name)) if name == "bfloat16" else np.finfo(np_dtype(name))
