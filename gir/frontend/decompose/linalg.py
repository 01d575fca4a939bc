"""MatMul, Gemm and Conv. MatMul and Conv stay whole (``matmul``/``conv``): the partition stage
decides by arithmetic intensity whether a vendor library or GIR runs them (gir.frontend.lower
decomposes them for GIR). Gemm is only a matmul between layout transposes and an elementwise
epilogue."""
from __future__ import annotations

from gir.ir.expr import Input, call

from .context import Builder, Node
from .registry import register
from .windows import resolve_pads


@register("MatMul")
def matmul(b: Builder, n: Node):
    a, w = n.inputs[0], n.inputs[1]
    try:
        b.emit("matmul", [a, w], {}, step="matmul", out=n.outputs[0])
    except ValueError as e:
        raise b.error(str(e)) from None


def _transpose2d(b: Builder, t: str, step: str) -> str:
    r, c = b.shape(t)
    return b.layout(t, 0, (c, r), (1, c), step=step)


@register("Gemm")
def gemm(b: Builder, n: Node):
    a, w, c = n.inputs[0], n.inputs[1], n.input(2)
    if b.rank(a) != 2 or b.rank(w) != 2:
        raise b.error(f"Gemm needs 2-D A and B, got {b.shape(a)} and {b.shape(w)}")
    if n.attr("transA", 0):
        a = _transpose2d(b, a, "transA")
    if n.attr("transB", 0):
        w = _transpose2d(b, w, "transB")
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    if beta == 0.0:
        c = None
    out = n.outputs[0]
    if alpha == 1.0 and c is None:
        b.emit("matmul", [a, w], {}, step="matmul", out=out)
        return
    y = b.emit("matmul", [a, w], {}, step="matmul")
    expr = Input(0) if alpha == 1.0 else call("mul", Input(0), b.c(alpha, y))
    ins = [y]
    if c is not None:
        cc = Input(1) if beta == 1.0 else call("mul", Input(1), b.c(beta, y))
        expr = call("add", expr, cc)
        ins.append(c)
    b.elementwise(expr, ins, step="epilogue", out=out, shape=b.shape(y))


def conv_attrs(b: Builder, n: Node, x_shape, w_shape) -> dict:
    nsp = len(x_shape) - 2
    kernel = list(n.attr("kernel_shape", w_shape[2:]))
    if list(kernel) != list(w_shape[2:]):
        raise b.error(f"kernel_shape {kernel} does not match W of shape {w_shape}")
    strides = tuple(n.attr("strides", [1] * nsp))
    dilations = tuple(n.attr("dilations", [1] * nsp))
    group = int(n.attr("group", 1))
    pads = resolve_pads(n.attr("auto_pad", "NOTSET"), x_shape[2:], kernel, strides, dilations, n.attr("pads"))
    if x_shape[1] != w_shape[1] * group or w_shape[0] % group:
        raise b.error(f"X {x_shape} and W {w_shape} do not agree with group={group}")
    if min(strides + dilations, default=1) < 1:
        raise b.error(f"strides {list(strides)} and dilations {list(dilations)} must be >= 1")
    for i, (size, k, d) in enumerate(zip(x_shape[2:], kernel, dilations)):
        padded, span = size + pads[i] + pads[nsp + i], (k - 1) * d + 1
        if span > padded:  # no window fits: ONNX has no output for it (onnxruntime refuses too)
            raise b.error(f"kernel spans {span} on spatial axis {i}, larger than the padded input ({padded}: "
                          f"X {list(x_shape)}, pads {list(pads)})")
    return {"strides": strides, "pads": tuple(pads), "dilations": dilations, "group": group}


@register("Conv")
def conv(b: Builder, n: Node):
    x, w, bias = n.inputs[0], n.inputs[1], n.input(2)
    xs, ws = b.shape(x), b.shape(w)
    if len(xs) < 3 or len(ws) != len(xs):
        raise b.error(f"X {xs} and W {ws} are not N-d conv operands")
    attrs = conv_attrs(b, n, xs, ws)
    ins = [x, w] + ([bias] if bias is not None else [])
    b.emit("conv", ins, attrs, step="conv", out=n.outputs[0])
