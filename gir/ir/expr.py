"""Scalar expression trees: the body of an Elementwise gOperator.

One tree serves three readers: the numpy evaluator here (the oracle), the C-like emitters
(one line per node), and the frontend, which builds trees when it fuses nothing yet but
decomposes composite ONNX ops (SiLU -> Sigmoid, Mul). Trees are immutable and hashable so
structural hashing of graphs can include them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .dtypes import np_dtype

UNARY = {
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "recip", "tanh", "erf", "sigmoid", "relu",
    "not", "floor", "ceil", "sin", "cos", "isnan",
}
BINARY = {"add", "sub", "mul", "div", "pow", "max", "min", "eq", "lt", "gt", "le", "ge", "and", "or", "mod"}
TERNARY = {"where"}
COMPARISONS = {"eq", "lt", "gt", "le", "ge", "and", "or", "not", "isnan"}


class Expr:
    """Base of expression nodes. Operators build Calls so templates read like maths."""

    def __add__(self, o): return Call("add", (self, as_expr(o)))
    def __radd__(self, o): return Call("add", (as_expr(o), self))
    def __sub__(self, o): return Call("sub", (self, as_expr(o)))
    def __rsub__(self, o): return Call("sub", (as_expr(o), self))
    def __mul__(self, o): return Call("mul", (self, as_expr(o)))
    def __rmul__(self, o): return Call("mul", (as_expr(o), self))
    def __truediv__(self, o): return Call("div", (self, as_expr(o)))
    def __rtruediv__(self, o): return Call("div", (as_expr(o), self))
    def __neg__(self): return Call("neg", (self,))


@dataclass(frozen=True)
class Input(Expr):
    """The index-th input slice of the Elementwise gOperator."""
    index: int

    def __str__(self):
        return f"in{self.index}"


@dataclass(frozen=True)
class Const(Expr):
    value: float
    dtype: str = "float32"

    def __str__(self):
        return repr(self.value)


@dataclass(frozen=True)
class Call(Expr):
    op: str
    args: tuple
    dtype: str | None = None  # only for "cast": the target type

    def __post_init__(self):
        arity = 1 if self.op in UNARY or self.op == "cast" else 2 if self.op in BINARY else 3 if self.op in TERNARY else None
        if arity is None:
            raise ValueError(f"unknown elementwise operation {self.op!r}")
        if len(self.args) != arity:
            raise ValueError(f"{self.op} takes {arity} operands, got {len(self.args)}")
        if self.op == "cast" and self.dtype is None:
            raise ValueError("cast needs a target dtype")

    def __str__(self):
        inner = ", ".join(str(a) for a in self.args)
        return f"cast<{self.dtype}>({inner})" if self.op == "cast" else f"{self.op}({inner})"


def as_expr(value) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return Const(value, "bool")
    if isinstance(value, int):
        return Const(float(value))
    return Const(float(value))


def call(op: str, *args, dtype: str | None = None) -> Call:
    return Call(op, tuple(as_expr(a) for a in args), dtype)


def inputs_of(expr: Expr) -> set[int]:
    if isinstance(expr, Input):
        return {expr.index}
    if isinstance(expr, Call):
        return set().union(*(inputs_of(a) for a in expr.args))
    return set()


def count_ops(expr: Expr) -> int:
    """Arithmetic operations in the tree: the FLOP count per element for the performance model."""
    if isinstance(expr, Call):
        return 1 + sum(count_ops(a) for a in expr.args)
    return 0


def substitute(expr: Expr, replacement: dict[int, Expr]) -> Expr:
    """Replace inputs by sub-trees: how two Elementwise gOperators merge into one."""
    if isinstance(expr, Input):
        return replacement.get(expr.index, expr)
    if isinstance(expr, Call):
        return Call(expr.op, tuple(substitute(a, replacement) for a in expr.args), expr.dtype)
    return expr


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _float(x):
    return x if x.dtype.kind == "f" else x.astype(np.float32)


_NUMPY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x), "recip": lambda x: 1 / x, "tanh": np.tanh,
    "erf": lambda x: _erf(x).astype(_float(x).dtype), "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, np.zeros((), x.dtype)), "not": np.logical_not,
    "floor": np.floor, "ceil": np.ceil, "sin": np.sin, "cos": np.cos, "isnan": np.isnan,
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "pow": np.power,
    "max": np.maximum, "min": np.minimum, "eq": np.equal, "lt": np.less, "gt": np.greater,
    "le": np.less_equal, "ge": np.greater_equal, "and": np.logical_and, "or": np.logical_or,
    "mod": np.fmod, "where": np.where,
}


def _div(a, b):
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        # C semantics (as ONNX Div on ints): truncate toward zero, exactly (through float64 an
        # int64 above 2^53 rounds); a zero divisor gives 0 and MIN / -1 wraps, as the emitters do
        q = np.floor_divide(a, b)
        return np.where((np.remainder(a, b) != 0) & ((a < 0) != (b < 0)), q + 1, q).astype(np.result_type(a, b))
    return np.divide(a, b)


def evaluate(expr: Expr, inputs: list[np.ndarray], compute_dtype: str = "float32") -> np.ndarray:
    """Evaluate with numpy broadcasting. Constants take the compute dtype so fp32 stays fp32."""
    with np.errstate(all="ignore"):
        return _eval(expr, inputs, np_dtype(compute_dtype))


def _eval(expr, inputs, cdt):
    if isinstance(expr, Input):
        return inputs[expr.index]
    if isinstance(expr, Const):
        dt = np_dtype(expr.dtype) if expr.dtype == "bool" else cdt
        return np.asarray(expr.value, dtype=dt)
    args = [_eval(a, inputs, cdt) for a in expr.args]
    if expr.op == "cast":
        return args[0].astype(np_dtype(expr.dtype))
    if expr.op == "div":
        return _div(*args)
    return _NUMPY[expr.op](*args)
