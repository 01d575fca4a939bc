"""Elementwise ONNX ops: each becomes exactly one ``elementwise`` basic op whose expression is
the op's formula. Composite activations (Gelu, HardSwish, ...) are one expression each; two
ONNX nodes are never merged here (fusion is a later stage's job)."""
from __future__ import annotations

import math

import numpy as np

from gir.ir.expr import Call, Input, call

from .context import Builder, Node, gir_dtype
from .indexing import unsupported
from .registry import register

UNARY = {
    "Sqrt": "sqrt", "Reciprocal": "recip", "Neg": "neg", "Abs": "abs", "Exp": "exp", "Log": "log",
    "Erf": "erf", "Tanh": "tanh", "Sigmoid": "sigmoid", "Relu": "relu", "Not": "not",
    "Floor": "floor", "Ceil": "ceil", "Sin": "sin", "Cos": "cos", "IsNaN": "isnan",
}
BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Equal": "eq", "Less": "lt",
    "Greater": "gt", "LessOrEqual": "le", "GreaterOrEqual": "ge", "And": "and", "Or": "or",
}
BOOL_OUT = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Not", "Xor", "IsNaN"}

x0, x1, x2 = Input(0), Input(1), Input(2)


def _out_dtype(n: Node, b: Builder) -> str:
    return "bool" if n.op_type in BOOL_OUT else b.dtype(n.inputs[0])


@register(*UNARY)
def unary(b: Builder, n: Node):
    b.elementwise(call(UNARY[n.op_type], x0), [n.inputs[0]], step=UNARY[n.op_type],
                  out=n.outputs[0], dtype=_out_dtype(n, b))


@register(*BINARY)
def binary(b: Builder, n: Node):
    op = BINARY[n.op_type]
    b.elementwise(call(op, x0, x1), n.inputs[:2], step=op, out=n.outputs[0], dtype=_out_dtype(n, b))


@register("Xor")
def xor(b: Builder, n: Node):
    expr = call("and", call("or", x0, x1), call("not", call("and", x0, x1)))
    b.elementwise(expr, n.inputs[:2], step="xor", out=n.outputs[0], dtype="bool")


# x ** k for a constant small integer k, as products: exporters write LayerNorm's and RMSNorm's
# square and GELU's cube as Pow(x, 2.0) and Pow(x, 3.0), and a C pow is a libm call per element
# that no compiler vectorises (gir calibrate: about 300 unit-instructions an element against 1
# for a product). x * x is exactly pow(x, 2); the cube and fourth power round twice, within 1 ulp.
POWERS = {2: lambda x: call("mul", x, x), 3: lambda x: call("mul", call("mul", x, x), x),
          4: lambda x: call("mul", call("mul", x, x), call("mul", x, x))}


def _integer_power(b: Builder, base: str, expo: str) -> int | None:
    """k where the exponent is one constant value k in POWERS and dropping it keeps the shape."""
    value = b.value(expo)
    if value is None or value.size != 1 or b.rank(expo) > b.rank(base) or not b.dtype(base).startswith("float"):
        return None
    k = float(value.reshape(-1)[0])
    return int(k) if k in POWERS else None


@register("Pow")
def pow_(b: Builder, n: Node):
    base, expo = n.inputs[0], n.inputs[1]
    bt, et = b.dtype(base), b.dtype(expo)
    k = _integer_power(b, base, expo)
    if k is not None:
        b.elementwise(POWERS[k](x0), [base], step="pow", out=n.outputs[0], dtype=bt)
        return
    if bt == et:
        expr = call("pow", x0, x1)
    elif bt.startswith("float"):
        expr = call("pow", x0, Call("cast", (x1,), bt))           # float base, integer exponent
    elif et.startswith("float"):
        expr = Call("cast", (call("pow", Call("cast", (x0,), et), x1),), bt)   # int base, float exponent
    else:
        expr = Call("cast", (call("pow", Call("cast", (x0,), "int64"), Call("cast", (x1,), "int64")),), bt)
    b.elementwise(expr, [base, expo], step="pow", out=n.outputs[0], dtype=bt)


@register("Max", "Min", "Sum", "Mean")
def variadic(b: Builder, n: Node):
    ins = [t for t in n.inputs if t]
    if len(ins) == 1:
        b.copy(ins[0], n.outputs[0])
        return
    op = {"Max": "max", "Min": "min", "Sum": "add", "Mean": "add"}[n.op_type]
    expr = Input(0)
    for i in range(1, len(ins)):
        expr = call(op, expr, Input(i))
    if n.op_type == "Mean":
        expr = call("div", expr, b.c(len(ins), ins[0]))
    b.elementwise(expr, ins, step=n.op_type.lower(), out=n.outputs[0])


@register("LeakyRelu")
def leaky_relu(b: Builder, n: Node):
    x = n.inputs[0]
    alpha = b.c(n.attr("alpha", 0.01), x)
    b.elementwise(call("where", call("lt", x0, b.c(0, x)), call("mul", x0, alpha), x0), [x],
                  step="leakyrelu", out=n.outputs[0])


@register("PRelu")
def prelu(b: Builder, n: Node):
    """Before opset 7 a 1-D slope is per channel (axis 1: onnx's pytorch-converted
    ``test_PReLU_*_multiparam``, slope [3] on x [2, 3, 4, ...]); from opset 7 it broadcasts
    unidirectionally from the right, which ``Builder.elementwise`` checks."""
    x, slope = n.inputs[0], n.inputs[1]
    xs, ss = b.shape(x), b.shape(slope)
    if n.opset < 7 and len(ss) == 1 and len(xs) >= 2 and ss[0] == xs[1] != 1:
        slope = b.view(slope, (ss[0],) + (1,) * (len(xs) - 2), step="prelu_slope")
    b.elementwise(call("where", call("lt", x0, b.c(0, x)), call("mul", x0, x1), x0), [x, slope],
                  step="prelu", out=n.outputs[0], shape=xs)


@register("Clip")
def clip(b: Builder, n: Node):
    x = n.inputs[0]
    expr, ins = x0, [x]
    if n.opset < 11:
        if n.has_attr("min"):
            expr = call("max", expr, b.c(n.attr("min"), x))
        if n.has_attr("max"):
            expr = call("min", expr, b.c(n.attr("max"), x))
    else:
        for i, op in ((1, "max"), (2, "min")):
            t = n.input(i)
            if t is not None:
                expr = call(op, expr, Input(len(ins)))
                ins.append(t)
    if expr is x0:
        b.copy(x, n.outputs[0])
        return
    b.elementwise(expr, ins, step="clip", out=n.outputs[0], shape=b.shape(x))


def _hard_sigmoid(b: Builder, x: str, alpha: float, beta: float):
    return call("max", b.c(0, x), call("min", b.c(1, x), call("add", call("mul", x0, b.c(alpha, x)), b.c(beta, x))))


@register("HardSigmoid")
def hard_sigmoid(b: Builder, n: Node):
    x = n.inputs[0]
    b.elementwise(_hard_sigmoid(b, x, n.attr("alpha", 0.2), n.attr("beta", 0.5)), [x],
                  step="hardsigmoid", out=n.outputs[0])


@register("HardSwish")
def hard_swish(b: Builder, n: Node):
    x = n.inputs[0]
    b.elementwise(call("mul", x0, _hard_sigmoid(b, x, 1 / 6, 0.5)), [x], step="hardswish", out=n.outputs[0])


def _gelu_check(n: Node):
    approx = n.attr("approximate", "none")
    return None if approx in ("none", "tanh") else f"approximate={approx!r} is not 'none' or 'tanh'"


@register("Gelu", check=_gelu_check)
def gelu(b: Builder, n: Node):
    x = n.inputs[0]
    c = lambda v: b.c(v, x)  # noqa: E731
    if n.attr("approximate", "none") == "tanh":
        inner = call("mul", c(math.sqrt(2 / math.pi)),
                     call("add", x0, call("mul", c(0.044715), call("mul", x0, call("mul", x0, x0)))))
        expr = call("mul", call("mul", c(0.5), x0), call("add", c(1), call("tanh", inner)))
    else:
        expr = call("mul", call("mul", c(0.5), x0), call("add", c(1), call("erf", call("mul", x0, c(1 / math.sqrt(2))))))
    b.elementwise(expr, [x], step="gelu", out=n.outputs[0])


@register("Where")
def where(b: Builder, n: Node):
    b.elementwise(call("where", x0, x1, x2), n.inputs[:3], step="where", out=n.outputs[0],
                  dtype=b.dtype(n.inputs[1]))


def _cast_to(b: Builder, n: Node, x: str, to: str):
    if b.dtype(x) == to:
        b.copy(x, n.outputs[0])
    else:
        b.elementwise(Call("cast", (x0,), to), [x], step="cast", out=n.outputs[0], dtype=to)


@register("Cast")
def cast(b: Builder, n: Node):
    to = gir_dtype(n.attr("to"), f"{n.model}: output {n.outputs[0]!r} of {n.origin}")
    _cast_to(b, n, n.inputs[0], to)


@register("CastLike")
def cast_like(b: Builder, n: Node):
    _cast_to(b, n, n.inputs[0], b.dtype(n.inputs[1]))



def _mod_check(n: Node):
    return None if n.attr("fmod", 0) in (0, 1) else f"fmod={n.attr('fmod')!r} is not 0 or 1"


@register("Mod", check=_mod_check)
def mod(b: Builder, n: Node):
    """fmod=1: C fmod / truncated %, the sign of the dividend. fmod=0: Python's (numpy's) mod,
    the sign of the divisor: the truncated remainder plus the divisor where the signs differ,
    as numpy computes it (so inf and NaN cases agree too)."""
    r = call("mod", x0, x1)
    if not n.attr("fmod", 0):
        zero = b.c(0, n.inputs[0])
        differ = call("not", call("eq", call("lt", r, zero), call("lt", x1, zero)))
        r = call("where", call("and", call("not", call("eq", r, zero)), differ), call("add", r, x1), r)
    b.elementwise(r, n.inputs[:2], step="mod", out=n.outputs[0])


def _dropout_check(n: Node):
    if n.opset < 7 and not n.attr("is_test", 0):
        return "is_test=0 (training mode): GIR compiles inference only"
    return None


@register("Dropout", static=(2,), check=_dropout_check)
def dropout(b: Builder, n: Node):
    """Inference: the identity; the optional mask is all true (ones before opset 10)."""
    mode = n.input(2)
    if mode is not None:
        v = b.value(mode)
        if v is None or bool(v.reshape(-1)[0]):
            raise unsupported(n, "training_mode is true or not a constant: GIR compiles inference only")
    x = n.inputs[0]
    b.copy(x, n.outputs[0])
    mask = n.output(1)
    if mask is not None:
        dtype = "bool" if n.opset >= 10 else b.dtype(x)
        b.constant(np.ones(b.shape(x), np.bool_), dtype, out=mask)
