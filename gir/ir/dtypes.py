"""Element types GIR understands: one table maps each name to numpy and to its byte size,
so every stage (interpreter byte counts, capacity checks, emitters) agrees on sizes."""
import numpy as np

DTYPES = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
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


def is_float(name: str) -> bool:
    return np_dtype(name).kind == "f"


def accumulator(name: str) -> str:
    """Reductions and norms accumulate fp16 in fp32 (DESIGN: fp16 storage, fp32 accumulation)."""
    return "float32" if name == "float16" else name
