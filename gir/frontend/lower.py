"""Decompose the ops the frontend keeps whole (matmul, conv) into basic memory ops, for the
cases the partition stage sends to GIR instead of a vendor library: matrix-vector products and
depthwise/grouped convolutions, whose arithmetic intensity is below the ridge point.

Both return the replacement ops (the caller splices them in place of ``op``; ``splice`` does
it) and add their intermediate tensors to ``graph.tensors``. The last op writes op's output.
Nothing is constant-folded except free views and a constant B's transpose (same size, read
along K): folding a stride-0 expansion of a weight would materialise copies of it.
"""
from __future__ import annotations

import numpy as np

from gir.ir.expr import Input, call

from .basic import BasicGraph, BasicOp, contiguous_strides
from .decompose.context import Builder, Names
from .decompose.windows import pad_for_windows
from .errors import FrontendError

x0, x1 = Input(0), Input(1)


class _OpScope:
    """What Builder needs from a node, for an op being lowered: its name and origin."""

    def __init__(self, op: BasicOp, model: str):
        self.name = op.name
        self.origin = op.origin
        self.model = model

    def error(self, message: str) -> FrontendError:
        return FrontendError(f"{self.model}: {self.origin}: {message}")


def _builder(op: BasicOp, graph: BasicGraph) -> Builder:
    names = Names(set(graph.tensors))
    op_names = Names({o.name for o in graph.ops} | {op.name})
    return Builder(graph, _OpScope(op, graph.model_name), names, op_names, fold=False)


def _batch_strides(shape, batch) -> list[int]:
    """Strides of the batch axes of a contiguous tensor of ``shape`` (batch axes = all but the
    last two) broadcast over ``batch`` (numpy rules, right-aligned): 0 where broadcast."""
    st = contiguous_strides(shape)[:-2]
    own = shape[:-2]
    lead = len(batch) - len(own)
    return [0 if i < lead or own[i - lead] == 1 else st[i - lead] for i in range(len(batch))]


def lower_matmul(op: BasicOp, graph: BasicGraph) -> list[BasicOp]:
    """C = A @ B as layout(A to [..., M, N, K]) * layout(B to [..., M, N, K]), reduce sum over K."""
    if op.kind != "matmul":
        raise ValueError(f"{op.name} is a {op.kind}, not a matmul")
    b = _builder(op, graph)
    a, w = op.inputs
    out = op.outputs[0]
    sa, sb = b.shape(a), b.shape(w)
    va = b.view(a, (1,) + sa, step="a2d") if len(sa) == 1 else a
    vb = b.view(w, sb + (1,), step="b2d") if len(sb) == 1 else w
    sa2, sb2 = b.shape(va), b.shape(vb)
    m, k = sa2[-2:]
    n = sb2[-1]
    batch = tuple(int(d) for d in np.broadcast_shapes(sa2[:-2], sb2[:-2]))
    full = batch + (m, n, k)
    sa_full = _batch_strides(sa2, batch)
    sb_full = _batch_strides(sb2, batch)
    ka, kb = contiguous_strides(sa2), contiguous_strides(sb2)
    la = b.layout(va, 0, full, sa_full + [ka[-2], 0, ka[-1]], step="expand_a")
    weight = b.value(vb)
    if weight is not None and n > 1 and k > 1:
        # A constant B is stored transposed, so the reduction over K reads contiguous memory
        # (a matrix-vector product's weight otherwise is read down its columns).
        vb = b.constant(np.swapaxes(weight, -1, -2), b.dtype(vb), step="weight_T", shared=True)
        kt = contiguous_strides(b.shape(vb))
        lb = b.layout(vb, 0, full, sb_full + [0, kt[-2], kt[-1]], step="expand_b")
    else:
        lb = b.layout(vb, 0, full, sb_full + [0, kb[-1], kb[-2]], step="expand_b")
    prod = b.elementwise(call("mul", x0, x1), [la, lb], step="mul", shape=full)
    red_shape = batch + (m, n)
    if red_shape == tuple(graph.tensors[out].shape):
        b.reduce(prod, "sum", [len(full) - 1], False, step="sum", out=out)
    else:
        r = b.reduce(prod, "sum", [len(full) - 1], False, step="sum")
        b.view(r, graph.tensors[out].shape, step="view", out=out)
    return b.ops


def lower_conv(op: BasicOp, graph: BasicGraph) -> list[BasicOp]:
    """Grouped conv as pad + window-unfold layout [N, g, M/g, *out, C/g, *k] * W viewed
    [1, g, M/g, 1.., C/g, *k], reduce sum over (C/g, *k), then + bias."""
    if op.kind != "conv":
        raise ValueError(f"{op.name} is a {op.kind}, not a conv")
    b = _builder(op, graph)
    x, w = op.inputs[0], op.inputs[1]
    bias = op.inputs[2] if len(op.inputs) > 2 else None
    out = op.outputs[0]
    xs, ws = b.shape(x), b.shape(w)
    nsp = len(xs) - 2
    g = op.attrs["group"]
    m, cpg = ws[0], ws[1]
    mpg = m // g
    kernel = list(ws[2:])
    strides, dil, pads = op.attrs["strides"], op.attrs["dilations"], op.attrs["pads"]
    out_sp = list(graph.tensors[out].shape[2:])
    xp = pad_for_windows(b, x, kernel, strides, dil, pads, out_sp, 0.0, step="window")
    ps = contiguous_strides(b.shape(xp))
    grouped = [xs[0], g, mpg] + out_sp + [cpg] + kernel
    gstrides = [ps[0], cpg * ps[1], 0] + [ps[2 + i] * strides[i] for i in range(nsp)] + [ps[1]] + \
        [ps[2 + i] * dil[i] for i in range(nsp)]
    win = b.layout(xp, 0, grouped, gstrides, step="window")
    wv = b.view(w, [1, g, mpg] + [1] * nsp + [cpg] + kernel, step="weight")
    prod = b.elementwise(call("mul", x0, x1), [win, wv], step="mul", shape=grouped)
    red = b.reduce(prod, "sum", range(3 + nsp, 4 + 2 * nsp), False, step="sum")
    if bias is None:
        b.view(red, graph.tensors[out].shape, step="view", out=out)
    else:
        rv = b.view(red, graph.tensors[out].shape, step="view")
        bv = b.view(bias, [m] + [1] * nsp, step="bias_view")
        b.elementwise(call("add", x0, x1), [rv, bv], step="bias", out=out)
    return b.ops


def splice(graph: BasicGraph, op: BasicOp, new_ops: list[BasicOp]) -> None:
    """Replace ``op`` by ``new_ops`` at its position in graph.ops."""
    i = graph.ops.index(op)
    graph.ops[i:i + 1] = new_ops
