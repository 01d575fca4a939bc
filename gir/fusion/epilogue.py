"""Library-op epilogues: a bias add, activations and a residual add that directly follow a
library matmul or conv become part of the library call (oneDNN post-ops, the primitive's bias),
so their elementwise ops vanish from the GIR side and the library writes the final tensor.

Which kinds a target's library takes is data: `Target.extra["library_epilogues"]`, a mapping
{"kinds": KINDS it runs, "dtypes": output dtypes} (absent: none, so a target that says nothing
plans as before), optionally "ops" (the library op kinds that take one; default conv and
matmul) and "order": classes ("bias", "residual", "activation" for any activation kind) that
the library applies in that fixed order, each once (cuBLASLt: act(AB + C + bias)). With an
order, a chain is absorbed up to its first step that would break it (MatMul, Add(bias), Relu,
Add(residual): bias and ReLU; the residual add stays a GIR op); without one, as oneDNN: a bias
first only, then any steps in order.

How a chain is recognised: from the library op's output `cur`, a region of elementwise ops is
grown (the consumers of `cur`, then the consumers of the earliest tensor the region hands out)
until the region hands out exactly one tensor, every tensor it makes is read only inside it and
none is a graph output; its ops are composed into one expression of `cur`, canonicalised (sums
and products flattened and sorted, constants folded, x / c as x * (1 / c), x - y as
x + (-1) * y, pow(x, 2 or 3) as a product) and compared with the forms of the kinds below, with
their parameters read off the constants. A match becomes one step and the walk goes on from the
region's result; the first region that matches nothing (or grows past MAX_REGION ops, or meets
a non-elementwise reader) ends the epilogue. Two ONNX nodes of SiLU (Sigmoid, Mul) and the
Div/Erf/Add/Mul/Mul chain exporters write for GELU are found this way, as are the frontend's
one-node forms.

In the plan the library op keeps its name and kind; what it absorbed is in its attrs:
  conv: a per-output-channel bias add folds into its bias input (summed with its own, a new
        constant `<op>/bias`);
  matmul: a bias (a constant broadcast along the last axis) becomes a third input;
  attrs["epilogue"]: the steps after the bias, each (kind, alpha, beta) for an activation or
        ("residual", i, 0.0): add input i, a tensor of the output's shape;
  attrs["absorbed"]: (what, op names) per absorbed region, for `gir explain` and the report.
Bias first, then the steps in order: what oneDNN computes (bias, then post-ops), what
`gir.runtime.library.run_library_op` computes in numpy, and, for the chains its "order" lets
through, what cuBLASLt computes (act(AB + C + bias)).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from gir.frontend.basic import BasicGraph, BasicOp, Tensor
from gir.ir.dtypes import np_dtype
from gir.ir.expr import Call, Const, Expr, Input, call, postorder

# Every kind the planner can absorb. A library declares the subset it runs.
ACTIVATIONS = ("relu", "leaky_relu", "sigmoid", "tanh", "silu", "gelu_erf", "gelu_tanh", "clip",
               "hardsigmoid", "hardswish", "elu")
KINDS = ("bias", *ACTIVATIONS, "residual")
MAX_REGION = 12          # elementwise ops one recognised step may span (tanh GELU decomposed: 8)
FLT_MAX = float(np.finfo(np.float32).max)
_TOL = 1e-5              # relative tolerance on the constants of a form (exporters round them)


ORDER_CLASSES = ("bias", "residual", "activation")  # what a library's fixed "order" names


def supported(target) -> tuple[frozenset, tuple]:
    """(kinds, dtypes) the target's library takes as epilogues."""
    spec = _spec(target)
    return frozenset(spec.get("kinds", ())), tuple(spec.get("dtypes", ("float32",)))


def _spec(target) -> dict:
    spec = (getattr(target, "extra", None) or {}).get("library_epilogues") or {}
    unknown = set(spec.get("kinds", ())) - set(KINDS)
    if unknown:
        raise ValueError(f"target {target.name}: unknown library epilogue kinds {sorted(unknown)} (known: {KINDS})")
    order = spec.get("order")
    if order is not None and (set(order) - set(ORDER_CLASSES) or len(set(order)) != len(order)):
        raise ValueError(f"target {target.name}: library epilogue order {order} (each of {ORDER_CLASSES} at most once)")
    return spec


def activation_expr(kind: str, alpha: float, beta: float) -> Expr:
    """The step's formula in Input(0), as the frontend writes the ONNX op (the numpy path
    evaluates it; the tests compare oneDNN against it)."""
    x = Input(0)
    c = Const
    if kind == "relu":
        return call("relu", x)
    if kind == "leaky_relu":
        return call("where", call("lt", x, c(0.0)), call("mul", x, c(alpha)), x)
    if kind == "sigmoid":
        return call("sigmoid", x)
    if kind == "tanh":
        return call("tanh", x)
    if kind == "silu":
        return call("mul", x, call("sigmoid", x if alpha == 1 else call("mul", x, c(alpha))))
    if kind == "gelu_erf":
        return call("mul", call("mul", c(0.5), x), call("add", c(1.0), call("erf", call("mul", x, c(1 / math.sqrt(2))))))
    if kind == "gelu_tanh":
        inner = call("mul", c(math.sqrt(2 / math.pi)), call("add", x, call("mul", c(0.044715), call("mul", x, call("mul", x, x)))))
        return call("mul", call("mul", c(0.5), x), call("add", c(1.0), call("tanh", inner)))
    if kind == "clip":
        return call("min", call("max", x, c(alpha)), c(beta))
    if kind == "hardsigmoid":
        return call("max", c(0.0), call("min", c(1.0), call("add", call("mul", x, c(alpha)), c(beta))))
    if kind == "hardswish":
        return call("mul", x, call("max", c(0.0), call("min", c(1.0), call("add", call("mul", x, c(alpha)), c(beta)))))
    if kind == "elu":
        return call("where", call("lt", x, c(0.0)), call("mul", c(alpha), call("sub", call("exp", x), c(1.0))), x)
    raise ValueError(f"unknown epilogue activation {kind!r}")


def describe(op: BasicOp) -> str:
    """One line for `gir explain` and the report: what the library op absorbed ("" for nothing)."""
    parts = [f"{what} ({', '.join(names)})" for what, names in op.attrs.get("absorbed", ())]
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# canonical form

def _canon(e: Expr):
    if isinstance(e, Input):
        return ("x",) if e.index == 0 else ("in", e.index)
    if isinstance(e, Const):
        return ("c", float(e.value))
    a = e.args
    if e.op == "div" and isinstance(a[1], Const) and a[1].value != 0:
        return _canon(Call("mul", (a[0], Const(1 / float(a[1].value), a[1].dtype))))
    if e.op == "sub":
        return _canon(Call("add", (a[0], Call("mul", (Const(-1.0), a[1])))))
    if e.op == "neg":
        return _canon(Call("mul", (Const(-1.0), a[0])))
    if e.op == "pow" and isinstance(a[1], Const) and float(a[1].value) in (2.0, 3.0):
        return _canon(Call("mul", (a[0], Call("mul", (a[0], a[0])))) if a[1].value == 3 else Call("mul", (a[0], a[0])))
    if e.op in ("add", "mul"):
        const, items = (0.0 if e.op == "add" else 1.0), []
        for t in (_canon(x) for x in a):
            if t[0] == "c":
                const = const + t[1] if e.op == "add" else const * t[1]
            elif t[0] == e.op:
                const = const + t[1] if e.op == "add" else const * t[1]
                items.extend(t[2])
            else:
                items.append(t)
        if not items:
            return ("c", const)
        if len(items) == 1 and const == (0.0 if e.op == "add" else 1.0):
            return items[0]
        return (e.op, const, tuple(sorted(items, key=_key)))
    if e.op in ("max", "min"):
        items = []
        for t in (_canon(x) for x in a):
            items.extend(t[1] if t[0] == e.op else (t,))
        return (e.op, tuple(sorted(items, key=_key)))
    return (e.op, *(_canon(x) for x in a))


def _key(t) -> str:
    """Sort key of a canonical term: its structure without constant values (forms written with
    slightly different constants sort alike)."""
    if t[0] == "c":
        return "c"
    if t[0] in ("x", "in"):
        return repr(t)
    if t[0] in ("add", "mul"):
        return f"{t[0]}({','.join(_key(u) for u in t[2])})"
    if t[0] in ("max", "min"):
        return f"{t[0]}({','.join(_key(u) for u in t[1])})"
    return f"{t[0]}({','.join(_key(u) for u in t[1:])})"


X = ("x",)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _TOL * max(abs(a), abs(b), 1e-30)


def _const(t, value=None) -> bool:
    return t[0] == "c" and (value is None or _close(t[1], value) or (value == 0 and t[1] == 0))


def _linear(t):
    """(a, b) of a*x + b, or None."""
    if t == X:
        return 1.0, 0.0
    if t[0] == "mul" and t[2] == (X,):
        return t[1], 0.0
    if t[0] == "add" and len(t[2]) == 1:
        inner = _linear(t[2][0])
        if inner is not None and inner[1] == 0:
            return inner[0], t[1]
    return None


def _clip(t):
    """(inner, lo, hi) of min(max(inner, lo), hi) in any nesting, or None."""
    def split(u, op):
        if u[0] != op or len(u[1]) != 2:
            return None
        consts = [v for v in u[1] if v[0] == "c"]
        rest = [v for v in u[1] if v[0] != "c"]
        return (rest[0], consts[0][1]) if len(consts) == 1 and len(rest) == 1 else None
    outer = split(t, "min") or split(t, "max")
    if outer is None:
        return None
    inner, bound = outer
    lo, hi = (-FLT_MAX, bound) if t[0] == "min" else (bound, FLT_MAX)
    nested = split(inner, "max" if t[0] == "min" else "min")
    if nested is not None:
        inner, other = nested
        lo, hi = (other, hi) if t[0] == "min" else (lo, other)
    return inner, lo, hi


def _activation(t):
    """(kind, alpha, beta) of the canonical expression `t` of x, or None."""
    if t == ("relu", X):
        return "relu", 0.0, 0.0
    if t == ("sigmoid", X):
        return "sigmoid", 0.0, 0.0
    if t == ("tanh", X):
        return "tanh", 0.0, 0.0
    if t[0] == "where" and len(t) == 4:
        cond, a, b = t[1:]
        if cond[0] in ("lt", "gt") and cond[1] == X and _const(cond[2], 0):
            neg, pos = (a, b) if cond[0] == "lt" else (b, a)
            if pos == X and neg[0] == "mul" and neg[2] == (X,):
                return "leaky_relu", neg[1], 0.0
            if pos == X and neg[0] == "mul" and len(neg[2]) == 1 and neg[2][0][0] == "add" \
                    and _close(neg[2][0][1], -1.0) and neg[2][0][2] == (("exp", X),):
                return "elu", neg[1], 0.0
        return None
    clip = _clip(t)
    if clip is not None:
        inner, lo, hi = clip
        if inner == X:
            return ("relu", 0.0, 0.0) if lo == 0 and hi == FLT_MAX else ("clip", lo, hi) if lo <= hi else None
        lin = _linear(inner)
        if lin is not None and lo == 0 and hi > 0 and _close(hi, 1.0):
            return "hardsigmoid", lin[0], lin[1]
        return None
    if t[0] == "mul" and len(t[2]) == 2 and X in t[2]:
        k, other = t[1], next(u for u in t[2] if u != X) if t[2][0] != t[2][1] else X
        if other == ("sigmoid", X) and _close(k, 1.0):
            return "silu", 1.0, 0.0
        if other[0] == "sigmoid" and _close(k, 1.0) and other[1][0] == "mul" and other[1][2] == (X,):
            return "silu", other[1][1], 0.0
        if other[0] == "add" and _close(other[1], 1.0) and len(other[2]) == 1 and _close(k, 0.5):
            f = other[2][0]
            if f[0] == "erf" and f[1][0] == "mul" and f[1][2] == (X,) and _close(f[1][1], 1 / math.sqrt(2)):
                return "gelu_erf", 0.0, 0.0
            if f[0] == "tanh" and f[1][0] == "mul" and _close(f[1][1], math.sqrt(2 / math.pi)) and len(f[1][2]) == 1:
                s = f[1][2][0]
                cube = ("mul", None, (X, X, X))
                if s[0] == "add" and s[1] == 0 and len(s[2]) == 2 and X in s[2]:
                    c3 = next(u for u in s[2] if u != X)
                    if c3[0] == "mul" and c3[2] == cube[2] and _close(c3[1], 0.044715):
                        return "gelu_tanh", 0.0, 0.0
        clip = _clip(other)
        if clip is not None:  # k * x * clip(a x + b, 0, h) = x * hardsigmoid(a/h x + b/h) when k h = 1
            inner, lo, hi = clip
            lin = _linear(inner)
            if lin is not None and lo == 0 and 0 < hi < FLT_MAX and _close(k * hi, 1.0):
                return "hardswish", lin[0] / hi, lin[1] / hi
    return None


# ---------------------------------------------------------------------------------------------
# regions

class _Graph:
    """Readers, producers and positions of a BasicGraph, kept current as ops are absorbed."""

    def __init__(self, g: BasicGraph):
        self.g = g
        self.outputs = set(g.outputs)
        self.readers: dict[str, list[BasicOp]] = {}
        self.producer: dict[str, BasicOp] = {}
        self.pos: dict[int, int] = {}
        for i, op in enumerate(g.ops):
            self.pos[id(op)] = i
            for t in op.outputs:
                self.producer[t] = op
            for t in dict.fromkeys(op.inputs):
                self.readers.setdefault(t, []).append(op)


def _region(G: _Graph, cur: str, shape, dtype):
    """The smallest region of elementwise ops that reads `cur`, hands out one tensor and whose
    composed expression is one of the forms: (ops, result tensor, canonical expression,
    external inputs), or None. Growth stops at MAX_REGION ops."""
    if cur in G.outputs:
        return None
    region: list[BasicOp] = []
    members: set[int] = set()

    def add(op) -> bool:
        if id(op) in members:
            return True
        t = G.g.tensors[op.outputs[0]]
        if op.kind != "elementwise" or tuple(t.shape) != tuple(shape) or t.dtype not in (dtype, "bool"):  # bool: Elu's test
            return False
        region.append(op)
        members.add(id(op))
        return len(region) <= MAX_REGION

    if not G.readers.get(cur) or not all(add(op) for op in G.readers[cur]):
        return None
    while True:
        open_ = [op.outputs[0] for op in region
                 if op.outputs[0] in G.outputs or any(id(r) not in members for r in G.readers.get(op.outputs[0], ()))
                 or not G.readers.get(op.outputs[0])]
        if len(open_) == 1 and G.g.tensors[open_[0]].dtype == dtype:
            composed = _compose(G, region, cur, open_[0])
            if composed is not None:
                canon, externals = composed
                if _recognise(canon, externals) is not None:
                    return region, open_[0], canon, externals
        # grow by the readers of the earliest tensor the region hands out
        grow = min(open_, key=lambda t: G.pos[id(G.producer[t])])
        if grow in G.outputs or not G.readers.get(grow):
            return None
        if not all(add(op) for op in G.readers[grow]):
            return None


def _compose(G: _Graph, region: list[BasicOp], cur: str, result: str):
    """(canonical expression of `result` in x = `cur` and external inputs, [external tensor
    names]) or None. External operands: Input(1 + k) for the k-th."""
    exprs: dict[str, Expr] = {cur: Input(0)}
    externals: list[str] = []
    for op in sorted(region, key=lambda o: G.pos[id(o)]):
        args = []
        for t in op.inputs:
            if t in exprs:
                args.append(exprs[t])
                continue
            if G.producer.get(t) is not None and id(G.producer[t]) in {id(o) for o in region}:
                return None  # read before it is made: not a topological region
            if t not in externals:
                externals.append(t)
            args.append(Input(1 + externals.index(t)))
        expr = op.attrs["expr"]
        exprs[op.outputs[0]] = _substitute(expr, args)
    if len(postorder(exprs[result])) > 200:
        return None
    return _canon(exprs[result]), externals


def _substitute(expr: Expr, args: list[Expr]) -> Expr:
    def go(e):
        if isinstance(e, Input):
            return args[e.index]
        if isinstance(e, Call):
            return Call(e.op, tuple(go(a) for a in e.args), e.dtype)
        return e
    return go(expr)


def _recognise(canon, externals: list[str]):
    """("act", (kind, alpha, beta)) | ("add", external index) | ("scale", scale index, shift
    index or None) | None. A scale is x * a (+ b) with both external: an inference
    BatchNormalization's two constants, which a conv folds into its weights and bias."""
    if not externals:
        act = _activation(canon)
        return None if act is None else ("act", act)
    if len(externals) == 1 and canon[0] == "add" and canon[1] == 0 and sorted(canon[2], key=repr) == sorted([X, ("in", 1)], key=repr):
        return ("add", 0)
    scaled = ("mul", 1.0, tuple(sorted([X, ("in", 1)], key=_key)))
    if len(externals) == 1 and canon == scaled:
        return ("scale", 0, None)
    if len(externals) == 2 and canon[0] == "add" and canon[1] == 0 and \
            sorted(canon[2], key=repr) == sorted([scaled, ("in", 2)], key=repr):
        return ("scale", 0, 1)
    return None


# ---------------------------------------------------------------------------------------------
# absorbing

def absorb_epilogues(graph: BasicGraph, library: list[BasicOp], target) -> tuple[BasicGraph, list[BasicOp]]:
    """The graph with each library op's epilogue absorbed (see the module docstring), and the
    library ops as they now stand (same order). A target that declares no kinds: unchanged."""
    kinds, dtypes = supported(target)
    if not kinds or not library:
        return graph, library
    spec = _spec(target)
    ops, order = tuple(spec.get("ops", ("conv", "matmul"))), spec.get("order")
    graph = replace(graph, ops=list(graph.ops), tensors=dict(graph.tensors))
    out_library = []
    for op in library:
        new = _absorb(graph, op, kinds, dtypes, order) if op.kind in ops else op
        out_library.append(new)
    return graph, out_library


def _in_order(order, done: list[str], what: str) -> bool:
    """Whether a step of class `what` may follow the classes `done` under the library's fixed
    `order` (None: any order)."""
    if order is None:
        return True
    if what not in order:
        return False
    return all(order.index(d) < order.index(what) for d in done)


def _absorb(graph: BasicGraph, op: BasicOp, kinds, dtypes, order=None) -> BasicOp:
    y = graph.tensors[op.outputs[0]]
    if y.dtype not in dtypes or op.kind not in ("conv", "matmul"):
        return op
    G = _Graph(graph)
    classes: list[str] = []  # the order classes absorbed so far
    if op.kind == "matmul" and (len(graph.tensors[op.inputs[1]].shape) < 2 or len(y.shape) < 1):
        bias_ok = False
    else:
        bias_ok = "bias" in kinds
    inputs, steps, absorbed = list(op.inputs), [], []
    bias_value = None
    if op.kind == "conv" and len(inputs) > 2:
        b0 = graph.tensors[inputs[2]]
        bias_value = None if b0.value is None else b0.value.astype(np.float32).reshape(-1)
    cur = op.outputs[0]
    last, removed = op, set()
    while True:
        found = _region(G, cur, y.shape, y.dtype)
        if found is None:
            break
        region, result, canon, externals = found
        what = _recognise(canon, externals)
        label = None
        if what[0] == "scale":
            folded = _fold_scale(graph, op, inputs, y, [graph.tensors[externals[i]] if i is not None else None
                                                         for i in what[1:]], bias_value)
            if folded is None or steps or not bias_ok or not _in_order(order, classes, "bias"):
                break
            inputs, bias_value = folded
            classes.append("bias")
            label = "scale"
        elif what[0] == "act":
            kind, alpha, beta = what[1]
            if kind not in kinds or not _in_order(order, classes, "activation"):
                break
            classes.append("activation")
            steps.append((kind, float(alpha), float(beta)))
            label = kind
        else:
            r = graph.tensors[externals[0]]
            per = _per_channel(op, r, y)
            if per is not None and not steps and bias_ok and r.value is not None \
                    and (op.kind == "matmul" or len(op.inputs) < 3 or bias_value is not None) \
                    and _in_order(order, classes, "bias"):
                bias_value = per if bias_value is None else bias_value + per
                label = "bias"
                classes.append("bias")
            elif tuple(r.shape) == tuple(y.shape) and r.dtype == y.dtype and "residual" in kinds \
                    and _in_order(order, classes, "residual"):
                classes.append("residual")
                inputs.append(r.name)  # its own position, also where it is the op's input too (conv(x) + x)
                steps.append(("residual", len(inputs) - 1, 0.0))
                label = "residual"
            else:
                break
        absorbed.append((label, tuple(o.name for o in sorted(region, key=lambda o: G.pos[id(o)]))))
        last = G.producer[result]
        cur = result
        # the region's ops leave the graph; `cur` is now the library op's output
        removed |= {id(o) for o in region}
        graph.ops = [o for o in graph.ops if id(o) not in removed or o is last]
        G = _Graph(graph)
    if not absorbed:
        return op
    attrs = dict(op.attrs)
    if op.kind == "conv" and len(op.inputs) < 3 and bias_value is None and any(k == "residual" for k, *_ in steps):
        bias_value = np.zeros(y.shape[1], np.float32)  # a conv's third input is its bias: residuals come after it
    if bias_value is not None and (any(a[0] in ("bias", "scale") for a in absorbed) or len(op.inputs) < 3):
        name = f"{op.name}/bias"
        while name in graph.tensors:
            name += "_"
        bias_dtype = "float32" if op.kind == "conv" else y.dtype  # a matmul's bias in its output dtype (cuBLASLt's)
        graph.tensors[name] = Tensor(name, (len(bias_value),), bias_dtype, bias_value.astype(np_dtype(bias_dtype)))
        if op.kind == "conv":
            inputs = inputs[:2] + [name] + inputs[3 if len(op.inputs) > 2 else 2:]
            if len(op.inputs) < 3:  # residual indices after the new bias input move up by one
                steps = [(k, a + 1, b) if k == "residual" else (k, a, b) for k, a, b in steps]
        else:
            inputs = inputs[:2] + [name] + inputs[2:]
            steps = [(k, a + 1, b) if k == "residual" else (k, a, b) for k, a, b in steps]
            attrs["bias"] = True
    attrs["epilogue"] = tuple(steps)
    attrs["absorbed"] = tuple(absorbed)
    new = BasicOp(op.name, op.kind, inputs, [cur], attrs, op.origin)
    graph.ops = [new if o is last else o for o in graph.ops if o is not op]
    return new


def _fold_scale(graph: BasicGraph, op: BasicOp, inputs: list[str], y: Tensor, scale_shift, bias_value):
    """(inputs with the weight scaled per output channel, the bias scaled and shifted) for a
    conv or 2-D-weight matmul whose output is multiplied by a per-channel constant (plus one):
    conv(x, W) * a + b = conv(x, W * a) + b. None where it does not fold: a weight computed at
    run time, a scale that is not one constant per output channel. The scaled weight is a new
    constant (the original may be shared)."""
    scale, shift = scale_shift
    w = graph.tensors[inputs[1]]
    a = _per_channel(op, scale, y)
    b = None if shift is None else _per_channel(op, shift, y)
    runtime_bias = op.kind == "conv" and len(op.inputs) > 2 and bias_value is None  # computed at run time
    if w.value is None or a is None or (shift is not None and b is None) or runtime_bias or \
            (op.kind == "matmul" and len(w.shape) != 2) or op.kind not in ("conv", "matmul"):
        return None
    value = np.asarray(w.value, np.float64)
    value = value * (a.reshape((-1,) + (1,) * (value.ndim - 1)) if op.kind == "conv" else a.reshape(1, -1))
    name = f"{op.name}/weight"
    while name in graph.tensors:
        name += "_"
    graph.tensors[name] = Tensor(name, tuple(w.shape), w.dtype, value.astype(np_dtype(w.dtype)))
    bias = (np.zeros(len(a), np.float32) if bias_value is None else bias_value) * a
    return [inputs[0], name, *inputs[2:]], bias + (0 if b is None else b)


def _per_channel(op: BasicOp, r: Tensor, y: Tensor):
    """The values of `r` as a per-output-channel (conv: axis 1; matmul: last axis) vector, or None."""
    if len(r.shape) > len(y.shape):
        return None
    shape = (1,) * (len(y.shape) - len(r.shape)) + tuple(r.shape)
    axis = 1 if op.kind == "conv" else len(y.shape) - 1
    want = tuple(y.shape[axis] if i == axis else 1 for i in range(len(y.shape)))
    if shape != want or r.value is None:
        return None
    return np.asarray(r.value, np.float32).reshape(-1).copy()
