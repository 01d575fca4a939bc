"""ONNX reductions as reduce + elementwise basic ops (Mean = sum then multiply by 1/n,
L2 = square, sum, sqrt, ...). With ``noop_with_empty_axes`` and no axes only the reduce step
is dropped; the elementwise steps stay, as in the ONNX reference."""
from __future__ import annotations

import math

from gir.ir.expr import Input, call

from .context import Builder, Node, normalize_axes
from .registry import register

x0, x1 = Input(0), Input(1)

REDUCES = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")


def reduce_axes(b: Builder, n: Node) -> tuple[int, ...]:
    """Sorted non-negative axes to reduce; () means nothing is reduced."""
    x = n.inputs[0]
    rank = b.rank(x)
    from_input = n.opset >= (13 if n.op_type == "ReduceSum" else 18)
    if from_input:
        v = b.const_input(1, "axes")
        axes = None if v is None else [int(a) for a in v.reshape(-1)]
    else:
        axes = n.attr("axes")
    if not axes:
        return () if n.attr("noop_with_empty_axes", 0) else tuple(range(rank))
    return normalize_axes(axes, rank, n)


def _reduce(b: Builder, x: str, op: str, axes, keepdims: bool, *, step: str, out=None) -> str:
    if not axes:
        return b.copy(x, out) if out is not None else x
    return b.reduce(x, op, axes, keepdims, step=step, out=out)


@register(*REDUCES, static=(1,))
def reduction(b: Builder, n: Node):
    x, out = n.inputs[0], n.outputs[0]
    axes = reduce_axes(b, n)
    keep = bool(n.attr("keepdims", 1))
    op = n.op_type
    simple = {"ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min", "ReduceProd": "prod"}
    if op in simple:
        _reduce(b, x, simple[op], axes, keep, step=simple[op], out=out)
    elif op == "ReduceMean":
        count = math.prod(b.shape(x)[a] for a in axes)
        if not axes:
            b.copy(x, out)
            return
        s = b.reduce(x, "sum", axes, keep, step="sum")
        if count == 0:  # ONNX: "undefined" over an empty set; onnxruntime gives 0 (the empty sum), so do we
            expr = call("mul", x0, b.c(0, x))
        elif b.dtype(x).startswith("float"):
            expr = call("mul", x0, b.c(1 / count, x))
        else:
            expr = call("div", x0, b.c(count, x))
        b.elementwise(expr, [s], step="mean", out=out)
    elif op in ("ReduceL1", "ReduceL2", "ReduceSumSquare"):
        pre = call("abs", x0) if op == "ReduceL1" else call("mul", x0, x0)
        sq = b.elementwise(pre, [x], step="abs" if op == "ReduceL1" else "square",
                           out=out if op != "ReduceL2" and not axes else None)
        if op == "ReduceL2":
            s = _reduce(b, sq, "sum", axes, keep, step="sum")
            b.elementwise(call("sqrt", x0), [s], step="sqrt", out=out)
        elif axes:
            b.reduce(sq, "sum", axes, keep, step="sum", out=out)
    elif op == "ReduceLogSum":
        s = _reduce(b, x, "sum", axes, keep, step="sum")
        b.elementwise(call("log", x0), [s], step="log", out=out)
    elif op == "ReduceLogSumExp":
        if not axes:
            b.elementwise(call("log", call("exp", x0)), [x], step="logsumexp", out=out)
            return
        m = b.reduce(x, "max", axes, True, step="max")
        e = b.elementwise(call("exp", call("sub", x0, x1)), [x, m], step="exp")
        s = b.reduce(e, "sum", axes, True, step="sum")
        kshape = b.shape(s)
        if keep:
            b.elementwise(call("add", call("log", x0), x1), [s, m], step="log", out=out)
        else:
            r = b.elementwise(call("add", call("log", x0), x1), [s, m], step="log", shape=kshape)
            b.view(r, [d for i, d in enumerate(kshape) if i not in axes], out=out)
