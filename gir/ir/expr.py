"""Scalar expression trees: the body of an Elementwise gOperator.

One tree serves three readers: the numpy evaluator here (the oracle), the C-like emitters
(one line per node), and the frontend, which builds trees when it fuses nothing yet but
decomposes composite ONNX ops (SiLU -> Sigmoid, Mul). Trees are immutable and hashable so
structural hashing of graphs can include them.

Trees may be thousands of nodes deep (a chain of 10,000 ReLUs composed into one expression), so
no walk here recurses: each visits the distinct nodes in post-order from an explicit stack, a
Call caches its hash when built (its children's are cached already), equality compares pairs
from a stack, and pickling flattens the tree into a node list. A sub-tree shared by several
parents is visited once.
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


@dataclass(frozen=True, eq=False, repr=False)
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
        object.__setattr__(self, "_hash", hash((Call, self.op, self.args, self.dtype)))  # children: cached
        object.__setattr__(self, "_inputs", frozenset().union(
            *(a._inputs if isinstance(a, Call) else (a.index,) if isinstance(a, Input) else () for a in self.args)))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, Call):
            return NotImplemented if not isinstance(other, Expr) else False
        stack, seen = [(self, other)], set()
        while stack:
            a, b = stack.pop()
            if a is b or (id(a), id(b)) in seen:
                continue
            seen.add((id(a), id(b)))
            if isinstance(a, Call) and isinstance(b, Call):
                if a._hash != b._hash or a.op != b.op or a.dtype != b.dtype or len(a.args) != len(b.args):
                    return False
                stack.extend(zip(a.args, b.args))
            elif isinstance(a, Call) or isinstance(b, Call) or a != b:
                return False
        return True

    def __str__(self):
        return _render(self, lambda n, xs: f"cast<{n.dtype}>({xs[0]})" if n.op == "cast" else f"{n.op}({', '.join(xs)})", str)

    def __repr__(self):
        return _render(self, lambda n, xs: f"Call(op={n.op!r}, args=({', '.join(xs)}{',' if len(xs) == 1 else ''}), "
                                           f"dtype={n.dtype!r})", repr)

    def __reduce__(self):
        """Pickled as a flat node list: the default would recurse once per level of the tree."""
        nodes = postorder(self)
        index = {id(n): i for i, n in enumerate(nodes)}
        flat = [(n.op, tuple(index[id(a)] for a in n.args), n.dtype) if isinstance(n, Call) else n for n in nodes]
        return _from_flat, (flat,)


def _from_flat(flat: list) -> Expr:
    built: list = []
    for item in flat:
        built.append(Call(item[0], tuple(built[i] for i in item[1]), item[2]) if isinstance(item, tuple) else item)
    return built[-1]


def postorder(expr: Expr) -> list[Expr]:
    """The distinct nodes of a tree (by identity), every node after its operands; no recursion."""
    order, seen, stack = [], set(), [(expr, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue  # a shared operand, already listed (trees are acyclic)
        seen.add(id(node))
        stack.append((node, True))
        if isinstance(node, Call):
            stack.extend((a, False) for a in reversed(node.args))
    return order


def fold(expr: Expr, leaf, node):
    """Bottom-up value of a tree: leaf(x) for Input/Const, node(call, operand values) for a Call.
    A value is dropped once its last reader has it (a long chain keeps a few arrays, not all)."""
    order = postorder(expr)
    uses: dict[int, int] = {}
    for n in order:
        for a in getattr(n, "args", ()):
            uses[id(a)] = uses.get(id(a), 0) + 1
    value = {}
    for n in order:
        if isinstance(n, Call):
            value[id(n)] = node(n, [value[id(a)] for a in n.args])
            for a in n.args:
                uses[id(a)] -= 1
                if not uses[id(a)]:
                    del value[id(a)]
        else:
            value[id(n)] = leaf(n)
    return value[id(expr)]


def _render(expr: Expr, node, leaf) -> str:
    """Text of the tree written left to right from a stack (a fold would keep every sub-tree's
    text: quadratic memory for a chain). `node(call, operand texts)` is called with "{}" markers
    and split around them."""
    out, stack = [], [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, Call):
            parts = node(item, ["\0"] * len(item.args)).split("\0")
            stack.append(parts[-1])
            for arg, text in reversed(list(zip(item.args, parts[:-1]))):
                stack.append(arg)
                stack.append(text)
        else:
            out.append(leaf(item))
    return "".join(out)


def depth(expr: Expr) -> int:
    """Calls on the longest path from the root to a leaf."""
    return fold(expr, lambda n: 0, lambda n, xs: 1 + max(xs))


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
    return set(expr._inputs) if isinstance(expr, Call) else {expr.index} if isinstance(expr, Input) else set()


def count_ops(expr: Expr) -> int:
    """Arithmetic operations in the tree: the FLOP count per element for the performance model
    (a shared sub-tree counts once per use, as written)."""
    return fold(expr, lambda n: 0, lambda n, xs: 1 + sum(xs))


def substitute(expr: Expr, replacement: dict[int, Expr]) -> Expr:
    """Replace inputs by sub-trees: how two Elementwise gOperators merge into one. Unchanged
    sub-trees are kept (not copied), so composing a chain costs the size of the outer tree."""
    def node(n, xs):
        return n if all(x is a for x, a in zip(xs, n.args)) else Call(n.op, tuple(xs), n.dtype)
    def leaf(n):
        r = replacement.get(n.index, n) if isinstance(n, Input) else n
        return n if r == n else r
    return fold(expr, leaf, node)


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
    def leaf(n):
        if isinstance(n, Input):
            return inputs[n.index]
        return np.asarray(n.value, dtype=np_dtype(n.dtype) if n.dtype == "bool" else cdt)

    def node(n, args):
        if n.op == "cast":
            return args[0].astype(np_dtype(n.dtype))
        if n.op == "div":
            return _div(*args)
        return _NUMPY[n.op](*args)
    return fold(expr, leaf, node)


MAX_OPS = 256
"""Operations one Elementwise gOperator carries at most. Each becomes one line of one basic
block, and C compilers are superlinear in a block's length: gcc -O2 on a 4,000-op ReLU chain
took 19.7 s as one loop body and 2.9 s as loops of 256 (the same work, values in registers)."""


def split(expr: Expr, input_dtypes: list[str], compute_dtype: str, max_ops: int = MAX_OPS) -> list[tuple[Expr, list[int]]]:
    """`expr` as a sequence of expressions of at most about `max_ops` operations each. Item i is
    (expression, operands): operand j < len(input_dtypes) is that input, j >= it the value of item
    j - len(input_dtypes). The last item is the result. A tree is only cut where its value has
    the compute dtype (a cut value lives in a register of that type)."""
    n = len(input_dtypes)
    if count_ops(expr) <= max_ops:
        return [(expr, list(range(n)))]
    cdt = np_dtype(compute_dtype)
    pieces: list[tuple[Expr, list[int]]] = []
    built: dict[int, tuple[Expr, int, np.dtype]] = {}  # node id -> (rebuilt node, ops since a cut, dtype)
    for node in postorder(expr):
        if isinstance(node, Input):
            built[id(node)] = (node, 0, np_dtype(input_dtypes[node.index]))
            continue
        if isinstance(node, Const):
            built[id(node)] = (node, 0, np_dtype(node.dtype) if node.dtype == "bool" else cdt)
            continue
        args = [built[id(a)] for a in node.args]
        probe = Call(node.op, tuple(Input(i) for i in range(len(args))), node.dtype)
        dt = np.asarray(evaluate(probe, [np.ones(1, d) for _, _, d in args], compute_dtype)).dtype
        rebuilt = Call(node.op, tuple(a for a, _, _ in args), node.dtype)
        ops = 1 + sum(k for _, k, _ in args)
        if ops >= max_ops and dt == cdt and node is not expr:
            pieces.append(_renumbered(rebuilt, n))
            rebuilt, ops = Input(n + len(pieces) - 1), 0
        built[id(node)] = (rebuilt, ops, dt)
    pieces.append(_renumbered(built[id(expr)][0], n))
    return pieces


def _renumbered(expr: Expr, n: int) -> tuple[Expr, list[int]]:
    """The expression over only the operands it reads (numbered in order), and which they are."""
    used = sorted(inputs_of(expr))
    return substitute(expr, {j: Input(i) for i, j in enumerate(used)}), used
