"""Ops whose result is known at compile time: Constant, Shape (shapes are static),
ConstantOfShape, Size. They produce constant tensors and no basic ops."""
from __future__ import annotations

import numpy as np

from ..limits import check_tensor
from .context import Builder, Node, ONNX_TO_GIR
from .registry import register


def _constant_check(n: Node):
    for name in ("sparse_value", "value_string", "value_strings"):
        if n.has_attr(name):
            return f"attribute {name} is not supported"
    return None


@register("Constant", check=_constant_check)
def constant(b: Builder, n: Node):
    if n.has_attr("value"):
        v = np.asarray(n.attr("value"))
    elif n.has_attr("value_float"):
        v = np.asarray(n.attr("value_float"), np.float32)
    elif n.has_attr("value_floats"):
        v = np.asarray(n.attr("value_floats"), np.float32)
    elif n.has_attr("value_int"):
        v = np.asarray(n.attr("value_int"), np.int64)
    elif n.has_attr("value_ints"):
        v = np.asarray(n.attr("value_ints"), np.int64)
    else:
        raise b.error("no value attribute")
    _put(b, n, v)


def _put(b: Builder, n: Node, v: np.ndarray):
    dtype = next((name for name in ONNX_TO_GIR.values() if np.dtype(v.dtype) == np.dtype(name)), None)
    if dtype is None:
        raise b.error(f"constant {n.outputs[0]!r} has numpy type {v.dtype}, not a GIR dtype")
    b.constant(v, dtype, out=n.outputs[0])


@register("Shape")
def shape(b: Builder, n: Node):
    s = b.shape(n.inputs[0])
    rank = len(s)
    start, end = n.attr("start", 0), n.attr("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    b.constant(np.asarray(s[start:end], np.int64), "int64", out=n.outputs[0])


@register("Size")
def size(b: Builder, n: Node):
    b.constant(np.asarray(int(np.prod(b.shape(n.inputs[0]))), np.int64), "int64", out=n.outputs[0])


@register("ConstantOfShape", static=(0,))
def constant_of_shape(b: Builder, n: Node):
    dims = [int(d) for d in b.const_input(0, "shape").reshape(-1)]
    if any(d < 0 for d in dims):
        raise b.error(f"negative dims {dims}")
    check_tensor(f"{n.model}: {n.origin}", n.outputs[0], dims, fold=True)  # before np.full allocates it
    v = n.attr("value")
    v = np.zeros(1, np.float32) if v is None else np.asarray(v).reshape(-1)
    _put(b, n, np.full(dims, v[0], dtype=v.dtype))
