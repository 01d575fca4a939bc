"""Softmax-like and normalisation ops as reduce + elementwise chains.

Softmax is reduce max, exp(x - max), reduce sum, divide: the four steps a fusing compiler must
rediscover, which is the point of decomposing. fp16 LayerNormalization computes in fp32
(stash_type=1) through explicit casts, so fp16 storage never holds the statistics.
"""
from __future__ import annotations

import math

import numpy as np

from gir.ir.dtypes import is_half
from gir.ir.expr import Call, Input, call

from .context import Builder, Node, normalize_axis
from .registry import register

x0, x1, x2, x3 = Input(0), Input(1), Input(2), Input(3)


def times_reciprocal(x, inverse: Call, dtype: str) -> Call:
    """x * inverse, where `inverse` is recip or rsqrt of a row statistic, in place of x / the
    statistic: a compiler hoists a reciprocal of a value its loop does not change, where it may
    not turn the division into a multiply (ViT's softmax kernel over rows of 197, one thread:
    13% faster with the reciprocal hoisted, in an ad-hoc timing of the emitted kernel in
    session 26); onnxruntime's softmax multiplies by it too. The
    result is within an ulp or so of the quotient. Only where the statistic is bounded away
    from 0 or exactly 0 (a subnormal divisor would make the reciprocal overflow where the
    quotient does not), and for fp32/fp64 statistics: fp16 and bf16 ones keep the division
    (not measured there)."""
    if dtype in ("float32", "float64"):
        return call("mul", x, inverse)
    plain = {"recip": lambda a: a, "rsqrt": lambda a: call("sqrt", a)}[inverse.op](inverse.args[0])
    return call("div", x, plain)


def _softmax_axes(b: Builder, n: Node) -> tuple[int, ...]:
    rank = b.rank(n.inputs[0])
    if n.opset >= 13:
        return (normalize_axis(n.attr("axis", -1), rank, n),) if rank else ()
    axis = normalize_axis(n.attr("axis", 1), rank, n) if rank else 0
    return tuple(range(axis, rank))  # opset < 13: input flattened to 2-D at axis


@register("Softmax", "LogSoftmax")
def softmax(b: Builder, n: Node):
    x, out = n.inputs[0], n.outputs[0]
    axes = _softmax_axes(b, n)
    m = b.reduce(x, "max", axes, True, step="max")
    e = b.elementwise(call("exp", call("sub", x0, x1)), [x, m], step="exp")
    s = b.reduce(e, "sum", axes, True, step="sum")
    if n.op_type == "Softmax":
        b.elementwise(times_reciprocal(x0, call("recip", x1), b.dtype(s)), [e, s], step="div", out=out)  # sum >= 1
    else:
        b.elementwise(call("sub", call("sub", x0, x1), call("log", x2)), [x, m, s], step="log", out=out)


def _normalize(b: Builder, x: str, axes, eps: float, scale: str | None, bias: str | None, out: str):
    """(x - mean) / sqrt(var + eps) * scale + bias over ``axes``, two-pass variance."""
    dt = b.dtype(x)
    stash = is_half(dt)
    if stash:
        x = b.elementwise(Call("cast", (x0,), "float32"), [x], step="stash", dtype="float32")
    count = math.prod(b.shape(x)[a] for a in axes)
    inv_n = b.c(1 / count if count else math.inf, x)
    s1 = b.reduce(x, "sum", axes, True, step="sum")
    d = b.elementwise(call("sub", x0, call("mul", x1, inv_n)), [x, s1], step="center")
    sq = b.elementwise(call("mul", x0, x0), [d], step="square")
    s2 = b.reduce(sq, "sum", axes, True, step="sumsq")
    # sqrt(var + eps) is normal for eps > 0, and where it is 0, x - mean is 0 too (NaN either way)
    normed = times_reciprocal(x0, call("rsqrt", call("add", call("mul", x1, inv_n), b.c(eps, x))), b.dtype(s2))
    ins = [d, s2]
    if stash:
        y = b.elementwise(normed, ins, step="norm")
        expr, ins = Call("cast", (x0,), dt), [y]
    else:
        expr = normed
    if scale is not None:
        expr = call("mul", expr, Input(len(ins)))
        ins.append(scale)
    if bias is not None:
        expr = call("add", expr, Input(len(ins)))
        ins.append(bias)
    b.elementwise(expr, ins, step="affine", out=out, dtype=dt, shape=b.shape(d))


def _layer_norm_check(n: Node):
    if any(o for o in n.outputs[1:]):
        return "only output 0 (Y) is supported; the Mean/InvStdDev outputs are not"
    return None


@register("LayerNormalization", check=_layer_norm_check)
def layer_norm(b: Builder, n: Node):
    x = n.inputs[0]
    rank = b.rank(x)
    axis = normalize_axis(n.attr("axis", -1), rank, n)
    _normalize(b, x, tuple(range(axis, rank)), n.attr("epsilon", 1e-5), n.input(1), n.input(2), n.outputs[0])


def _channel_view(b: Builder, t: str | None, rank: int, step: str) -> str | None:
    """A per-channel (C,) tensor viewed as (C, 1, ..., 1) to broadcast against (N, C, ...)."""
    if t is None:
        return None
    c = b.shape(t)[0] if b.shape(t) else 1
    return b.view(t, (c,) + (1,) * (rank - 2), step=step)


@register("InstanceNormalization")
def instance_norm(b: Builder, n: Node):
    x = n.inputs[0]
    rank = b.rank(x)
    if rank < 3:
        raise b.error(f"input rank {rank} < 3")
    scale = _channel_view(b, n.input(1), rank, "scale")
    bias = _channel_view(b, n.input(2), rank, "bias")
    _normalize(b, x, tuple(range(2, rank)), n.attr("epsilon", 1e-5), scale, bias, n.outputs[0])


def _batch_norm_check(n: Node):
    if n.attr("training_mode", 0):
        return "training_mode=1 is not supported (inference only)"
    if any(o for o in n.outputs[1:]):
        return "only output 0 (Y) is supported; running mean/var outputs are training-mode outputs"
    if n.opset < 9 and n.attr("spatial", 1) == 0:
        return "spatial=0 is not supported"
    return None


@register("BatchNormalization", static=(1, 2, 3, 4), check=_batch_norm_check)
def batch_norm(b: Builder, n: Node):
    """Inference mode: fold scale/(sqrt(var+eps)) and bias - mean*scale' into two constants."""
    x = n.inputs[0]
    rank = b.rank(x)
    dt = b.dtype(x)
    scale, bias, mean, var = (b.const_input(i, w).astype(np.float64)
                              for i, w in ((1, "scale"), (2, "bias"), (3, "mean"), (4, "var")))
    k = scale / np.sqrt(var + float(n.attr("epsilon", 1e-5)))
    shift = bias - mean * k
    c = b.shape(x)[1] if rank > 1 else 1
    shape = (c,) + (1,) * max(rank - 2, 0)
    kt = b.constant(k.reshape(shape), dt, step="scale")
    st = b.constant(shift.reshape(shape), dt, step="shift")
    b.elementwise(call("add", call("mul", x0, x1), x2), [x, kt, st], step="batchnorm",
                  out=n.outputs[0], shape=b.shape(x))
