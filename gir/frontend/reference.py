"""numpy executor of a BasicGraph: the oracle every later stage is compared against.

Each kind is executed by the most literal numpy rendering of its definition in basic.py, so a
disagreement with onnxruntime points at the decomposition, and a disagreement with GIR points
at GIR. The frontend also folds constants with ``execute_op``, so folding and running agree.
"""
from __future__ import annotations

import math

import numpy as np

from gir.ir.dtypes import HALF_NP, accumulator, np_dtype, np_is_float
from gir.ir.expr import evaluate

from .basic import BasicGraph, BasicOp, Tensor, compute_dtype, layout_bounds


def run_reference(graph: BasicGraph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute every op in order; returns the graph outputs by name. fp32 stays fp32."""
    unknown = set(feeds) - set(graph.inputs)
    if unknown:
        raise ValueError(f"{graph.model_name}: unknown feeds {sorted(unknown)}; inputs are {graph.inputs}")
    env: dict[str, np.ndarray] = {n: t.value for n, t in graph.tensors.items() if t.value is not None}
    for name in graph.inputs:
        if name not in feeds:
            raise ValueError(f"{graph.model_name}: missing feed for input {name!r}")
        t = graph.tensors[name]
        arr = np.asarray(feeds[name])
        if arr.dtype != np_dtype(t.dtype) or tuple(arr.shape) != tuple(t.shape):
            raise ValueError(f"{graph.model_name}: input {name!r} expects {t.dtype}{list(t.shape)}, "
                             f"got {arr.dtype}{list(arr.shape)}")
        env[name] = arr
    for op in graph.ops:
        args = [env[t] for t in op.inputs]
        env[op.outputs[0]] = execute_op(op, graph.tensors, args)
    return {name: env[name] for name in graph.outputs}


def execute_op(op: BasicOp, tensors: dict[str, Tensor], args: list[np.ndarray]) -> np.ndarray:
    out = tensors[op.outputs[0]]
    ins = [tensors[t] for t in op.inputs]
    result = _KIND[op.kind](op.attrs, args, ins, out)
    dt = np_dtype(out.dtype)
    result = np.asarray(result)
    if tuple(result.shape) != tuple(out.shape):
        raise AssertionError(f"{op.name}: {op.kind} produced {result.shape}, tensor says {out.shape}")
    return result.astype(dt, copy=False)


def _elementwise(a, args, ins, out):
    cdt = compute_dtype([t.dtype for t in ins], a["dtype"])
    r = np.asarray(evaluate(a["expr"], args, cdt))
    return np.broadcast_to(r, out.shape).astype(np_dtype(out.dtype), copy=True)


def _empty_identity(op: str, dtype: np.dtype):
    if op in ("sum", "prod"):
        return None
    if np_is_float(dtype):
        return -np.inf if op == "max" else np.inf
    if dtype.kind == "b":
        return op == "min"
    info = np.iinfo(dtype)
    return info.min if op == "max" else info.max


def _reduce(a, args, ins, out):
    result = _reduce_kept(a, args, ins)
    return result if a.get("order") is None else np.transpose(result, a["order"])


def _reduce_kept(a, args, ins):
    x = args[0]
    axes, keep = tuple(a["axes"]), bool(a["keepdims"])
    acc = np_dtype(accumulator(ins[0].dtype))
    if a["op"] == "sum":
        return np.sum(x, axis=axes, keepdims=keep, dtype=acc)
    if a["op"] == "prod":
        return np.prod(x, axis=axes, keepdims=keep, dtype=acc)
    fn = np.max if a["op"] == "max" else np.min
    if any(x.shape[i] == 0 for i in axes):
        return fn(x, axis=axes, keepdims=keep, initial=_empty_identity(a["op"], x.dtype))
    return fn(x, axis=axes, keepdims=keep)


def layout_indices(attrs: dict) -> np.ndarray:
    """Flat input index of every element of a layout, in the layout's own ``shape``."""
    shape, strides = tuple(attrs["shape"]), tuple(attrs["strides"])
    idx = np.full((1,) * len(shape), attrs["offset"], dtype=np.int64)
    for d, (n, s) in enumerate(zip(shape, strides)):
        r = np.arange(n, dtype=np.int64) * s
        idx = idx + r.reshape((1,) * d + (n,) + (1,) * (len(shape) - d - 1))
    return np.broadcast_to(idx, shape)


def _layout(a, args, ins, out):
    x = args[0].reshape(-1)
    if math.prod(a["shape"]) == 0:
        return np.zeros(out.shape, x.dtype)
    lo, hi = layout_bounds(a)
    if lo < 0 or hi >= x.size:
        raise IndexError(f"layout reads [{lo}, {hi}] outside an input of {x.size} elements")
    return x[layout_indices(a)].reshape(out.shape)


def _view(a, args, ins, out):
    return args[0].reshape(out.shape)


def _concat(a, args, ins, out):
    return np.concatenate(args, axis=a["axis"])


def _pad(a, args, ins, out):
    pads = [tuple(p) for p in a["pads"]]
    if a["mode"] == "constant":
        return np.pad(args[0], pads, mode="constant", constant_values=np.asarray(a["value"]).astype(args[0].dtype))
    return np.pad(args[0], pads, mode=a["mode"])


def _gather(a, args, ins, out):
    x, idx = args[0], args[1].astype(np.int64)
    axis = a["axis"]
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return np.take(x, idx, axis=axis)


def _matmul(a, args, ins, out):
    if args[0].dtype in HALF_NP or args[1].dtype in HALF_NP:  # fp16/bf16: fp32 products and sums (BLAS), rounded once
        return np.matmul(args[0].astype(np.float32), args[1].astype(np.float32))
    return np.matmul(args[0], args[1])


def conv_reference(x, w, b, strides, pads, dilations, group) -> np.ndarray:
    """Grouped N-d convolution (NCHW...), ONNX Conv semantics with explicit pads."""
    nsp = x.ndim - 2
    n, c = x.shape[:2]
    m, cpg = w.shape[:2]
    k = w.shape[2:]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[nsp + i]) for i in range(nsp)])
    osp = [(xp.shape[2 + i] - (k[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(nsp)]
    st = xp.strides
    win = np.lib.stride_tricks.as_strided(
        xp, shape=(n, c, *osp, *k),
        strides=(st[0], st[1], *[st[2 + i] * strides[i] for i in range(nsp)],
                 *[st[2 + i] * dilations[i] for i in range(nsp)]), writeable=False)
    win = win.reshape(n, group, cpg, *osp, *k)
    wg = w.reshape(group, m // group, cpg, *k)
    red = [1] + list(range(2 + nsp, 2 + 2 * nsp))  # win[:, g]: (n, cpg, *osp, *k)
    parts = [np.tensordot(win[:, g], wg[g], axes=(red, [1] + list(range(2, 2 + nsp))))
             for g in range(group)]  # each (n, *osp, m/g)
    y = np.concatenate(parts, axis=-1) if parts else np.zeros((n, *osp, 0), x.dtype)
    y = np.moveaxis(y, -1, 1)
    if b is not None:
        y = y + b.reshape((1, m) + (1,) * nsp)
    return y.astype(x.dtype, copy=False)


def _conv(a, args, ins, out):
    b = args[2] if len(args) > 2 else None
    return conv_reference(args[0], args[1], b, a["strides"], a["pads"], a["dilations"], a["group"])


_KIND = {
    "elementwise": _elementwise, "reduce": _reduce, "layout": _layout, "view": _view,
    "concat": _concat, "pad": _pad, "gather": _gather, "matmul": _matmul, "conv": _conv,
}
