"""Pooling as window unfold (pad + layout) + reduce (+ divide by the window count): pools are
memory-bound, so they go through GIR like any other reduce rather than as opaque ops."""
from __future__ import annotations

import numpy as np

from gir.ir.dtypes import np_dtype, np_is_float
from gir.ir.expr import Input, call

from .context import Builder, Node
from .registry import register
from .windows import pool_out_sizes, resolve_pads, unfold, window_counts

x0, x1 = Input(0), Input(1)


def pool_geometry(b: Builder, n: Node):
    x = n.inputs[0]
    shape = b.shape(x)
    if len(shape) < 3:
        raise b.error(f"input rank {len(shape)} < 3")
    nsp = len(shape) - 2
    kernel = list(n.attr("kernel_shape"))
    if len(kernel) != nsp:
        raise b.error(f"kernel_shape {kernel} does not match {nsp} spatial axes")
    strides = list(n.attr("strides", [1] * nsp))
    dilations = list(n.attr("dilations", [1] * nsp))
    pads = resolve_pads(n.attr("auto_pad", "NOTSET"), shape[2:], kernel, strides, dilations, n.attr("pads"))
    ceil_mode = bool(n.attr("ceil_mode", 0))
    out_sp = pool_out_sizes(shape[2:], kernel, strides, dilations, pads, ceil_mode)
    return x, shape, nsp, kernel, strides, dilations, pads, out_sp


def _maxpool_check(n: Node):
    if n.output(1):
        return "the Indices output is not supported (only Y)"
    return None


@register("MaxPool", check=_maxpool_check)
def max_pool(b: Builder, n: Node):
    x, shape, nsp, kernel, strides, dilations, pads, out_sp = pool_geometry(b, n)
    dt = np_dtype(b.dtype(x))
    low = -np.inf if np_is_float(dt) else float(np.iinfo(dt).min)
    win = unfold(b, x, kernel, strides, dilations, pads, out_sp, low, step="window")
    b.reduce(win, "max", range(2 + nsp, 2 + 2 * nsp), False, step="max", out=n.outputs[0])


@register("AveragePool")
def average_pool(b: Builder, n: Node):
    x, shape, nsp, kernel, strides, dilations, pads, out_sp = pool_geometry(b, n)
    win = unfold(b, x, kernel, strides, dilations, pads, out_sp, 0.0, step="window")
    s = b.reduce(win, "sum", range(2 + nsp, 2 + 2 * nsp), False, step="sum")
    per_axis = window_counts(shape[2:], kernel, strides, dilations, pads, out_sp,
                             bool(n.attr("count_include_pad", 0)))
    count = np.ones((), np.float64)
    for row in per_axis:
        count = np.multiply.outer(count, np.asarray(row, np.float64))
    ct = b.constant(count, b.dtype(x), step="count")
    b.elementwise(call("div", x0, x1), [s, ct], step="avg", out=n.outputs[0], shape=b.shape(s))


@register("GlobalAveragePool", "GlobalMaxPool")
def global_pool(b: Builder, n: Node):
    x = n.inputs[0]
    shape = b.shape(x)
    axes = range(2, len(shape))
    if n.op_type == "GlobalMaxPool":
        b.reduce(x, "max", axes, True, step="max", out=n.outputs[0])
        return
    count = int(np.prod(shape[2:]))
    s = b.reduce(x, "sum", axes, True, step="sum")
    b.elementwise(call("mul", x0, b.c(1 / count if count else np.inf, x)), [s], step="mean", out=n.outputs[0])
