"""The frontend's output: a graph of a handful of basic operator kinds with static shapes.

Everything downstream (partition, templates, the numpy oracle) reads only this module's
types, so the kinds below are the whole contract between ONNX and GIR. Shape rules live here
(``infer``) so that the decompositions, the validator and the reference executor agree on them.

Every op has exactly one output. Kinds and attrs (reference.py implements exactly these):
  elementwise  expr (gir.ir.expr.Expr, Input(i) = inputs[i]), dtype (output dtype). Inputs are
               numpy-broadcast to the output shape; Consts take ``compute_dtype``.
  reduce       op in REDUCE_OPS, axes (sorted non-negative tuple), keepdims (bool); fp16 sums
               accumulate in fp32. The planner may add order (a permutation of the kept
               dimensions, without keepdims): the result is written transposed by it.
  layout       offset, shape, strides (ints, may be 0 or negative), in elements of the input's
               flat row-major storage: out_flat[k] = in_flat[offset + sum_d idx_d(k) * strides[d]],
               idx(k) = k unravelled in ``shape``; the output's own shape has the same size.
  view         the input's storage under the output's shape (reshape; nothing moves).
  concat       axis.        pad  pads ((before, after) per axis, >= 0), mode in PAD_MODES, value.
  gather       axis; inputs data, indices (negative indices wrap).
  matmul       numpy matmul (batch broadcasting); inputs A, B.
  conv         strides, pads (begin..., end...), dilations, group; inputs X, W[, B].
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gir.ir.dtypes import np_dtype
from gir.ir.expr import Expr, inputs_of

KINDS = ("elementwise", "reduce", "layout", "view", "concat", "pad", "gather", "matmul", "conv")
REDUCE_OPS = ("sum", "max", "min", "prod")
PAD_MODES = ("constant", "reflect", "edge")


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str                       # a gir.ir.dtypes name
    value: np.ndarray | None = None  # set for constants (initializers, folded values)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def is_const(self) -> bool:
        return self.value is not None


@dataclass
class BasicOp:
    name: str          # unique: "<onnx node name>" or "<onnx node name>/<step>"
    kind: str          # one of KINDS
    inputs: list[str]  # tensor names
    outputs: list[str]
    attrs: dict
    origin: str        # e.g. "node '/enc/Softmax' (Softmax, ai.onnx opset 17)"

    def __str__(self):
        shown = {k: (str(v) if isinstance(v, Expr) else v) for k, v in self.attrs.items()}
        return f"{self.name}: {self.kind}({', '.join(self.inputs)}) -> {', '.join(self.outputs)} {shown}"


@dataclass
class BasicGraph:
    tensors: dict[str, Tensor]
    ops: list[BasicOp]            # topological order
    inputs: list[str]
    outputs: list[str]
    model_name: str
    notes: list[str] = field(default_factory=list)  # e.g. nodes folded by onnx.reference

    def producer(self) -> dict[str, BasicOp]:
        return {t: op for op in self.ops for t in op.outputs}

    def consumers(self) -> dict[str, list[BasicOp]]:
        users: dict[str, list[BasicOp]] = {}
        for op in self.ops:
            for t in op.inputs:
                users.setdefault(t, []).append(op)
        return users

    def summary(self) -> str:
        lines = [f"graph {self.model_name}: inputs {self.inputs} outputs {self.outputs}"]
        for op in self.ops:
            outs = ", ".join(f"{t}{list(self.tensors[t].shape)}:{self.tensors[t].dtype}" for t in op.outputs)
            lines.append(f"  {op} => {outs}")
        return "\n".join(lines)


class GraphError(ValueError):
    """A BasicGraph that breaks the contract above (a frontend bug, or a bad hand-built graph)."""


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(tuple(shape)):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def compute_dtype(input_dtypes: list[str], out_dtype: str) -> str:
    """The type an elementwise body computes in, and the type its non-bool Consts take.

    The output type, unless the output is a bool (comparisons, Not, IsNaN): then the type of the
    first non-bool input. The frontend only folds a constant into a Const when it has this type.
    """
    if out_dtype != "bool":
        return out_dtype
    for dt in input_dtypes:
        if dt != "bool":
            return dt
    return "bool"


def reduce_shape(shape, axes, keepdims, order=None) -> tuple[int, ...]:
    """`order` (planner-made, never with keepdims): result dimension i is kept dimension order[i]."""
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    kept = tuple(d for i, d in enumerate(shape) if i not in axes)
    return kept if order is None else tuple(kept[i] for i in order)


def conv_out_shape(x_shape, w_shape, strides, pads, dilations, group) -> tuple[int, ...]:
    nsp = len(x_shape) - 2
    out = [x_shape[0], w_shape[0]]
    for i in range(nsp):
        span = (w_shape[2 + i] - 1) * dilations[i] + 1
        out.append((x_shape[2 + i] + pads[i] + pads[nsp + i] - span) // strides[i] + 1)
    return tuple(out)


def infer(kind: str, attrs: dict, ins: list[Tensor]) -> tuple[tuple[int, ...], str] | None:
    """Output (shape, dtype) of a basic op, or None where the kind takes it from the caller
    (elementwise, layout and view outputs carry their shape in the output Tensor)."""
    if kind == "reduce":
        return reduce_shape(ins[0].shape, attrs["axes"], attrs["keepdims"], attrs.get("order")), ins[0].dtype
    if kind == "concat":
        ax = attrs["axis"]
        shape = list(ins[0].shape)
        shape[ax] = sum(t.shape[ax] for t in ins)
        return tuple(shape), ins[0].dtype
    if kind == "pad":
        return tuple(d + b + a for d, (b, a) in zip(ins[0].shape, attrs["pads"])), ins[0].dtype
    if kind == "gather":
        ax = attrs["axis"]
        s = ins[0].shape
        return tuple(s[:ax]) + tuple(ins[1].shape) + tuple(s[ax + 1:]), ins[0].dtype
    if kind == "matmul":
        a, b = ins[0].shape, ins[1].shape
        a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
        b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
        if a2[-1] != b2[-2]:
            raise GraphError(f"matmul: inner dims differ: {a} x {b}")
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
        out = tuple(batch) + (a2[-2], b2[-1])
        if len(a) == 1:
            out = out[:-2] + out[-1:]
        if len(b) == 1:
            out = out[:-1]
        return out, ins[0].dtype
    if kind == "conv":
        return conv_out_shape(ins[0].shape, ins[1].shape, attrs["strides"], attrs["pads"],
                              attrs["dilations"], attrs["group"]), ins[0].dtype
    return None


def layout_bounds(attrs: dict) -> tuple[int, int]:
    """Lowest and highest flat input index a layout reads (only meaningful when non-empty)."""
    lo = hi = attrs["offset"]
    for n, s in zip(attrs["shape"], attrs["strides"]):
        if n > 0:
            reach = (n - 1) * s
            lo += min(0, reach)
            hi += max(0, reach)
    return lo, hi


def check_graph(graph: BasicGraph) -> None:
    """Validate the contract: known kinds and attrs, one producer per tensor, topological order,
    shapes consistent with each kind's rule, layouts in bounds. Raises GraphError."""
    defined = {n for n, t in graph.tensors.items() if t.value is not None} | set(graph.inputs)
    for name, t in graph.tensors.items():
        np_dtype(t.dtype)
        if t.value is not None and (tuple(t.value.shape) != tuple(t.shape) or t.value.dtype != np_dtype(t.dtype)):
            raise GraphError(f"constant {name!r}: value {t.value.shape}/{t.value.dtype} != {t.shape}/{t.dtype}")
    names = set()
    for op in graph.ops:
        where = f"{op.name} ({op.origin})"
        if op.name in names:
            raise GraphError(f"duplicate op name {op.name!r}")
        names.add(op.name)
        if op.kind not in KINDS:
            raise GraphError(f"{where}: unknown kind {op.kind!r}")
        if len(op.outputs) != 1:
            raise GraphError(f"{where}: a basic op has exactly one output, not {len(op.outputs)}")
        for t in op.inputs:
            if t not in graph.tensors:
                raise GraphError(f"{where}: unknown input tensor {t!r}")
            if t not in defined:
                raise GraphError(f"{where}: input {t!r} is used before it is produced")
        for t in op.outputs:
            if t in defined:
                raise GraphError(f"{where}: output {t!r} is produced twice (or is an input/constant)")
            if t not in graph.tensors:
                raise GraphError(f"{where}: unknown output tensor {t!r}")
            defined.add(t)
        ins = [graph.tensors[t] for t in op.inputs]
        out = graph.tensors[op.outputs[0]]
        _check_op(op, ins, out, where)
    for t in graph.outputs:
        if t not in defined:
            raise GraphError(f"graph output {t!r} is never produced")


def _check_op(op: BasicOp, ins: list[Tensor], out: Tensor, where: str) -> None:
    a = op.attrs
    if op.kind == "elementwise":
        expr = a["expr"]
        if not isinstance(expr, Expr):
            raise GraphError(f"{where}: expr is not an Expr")
        used = inputs_of(expr)
        if used and max(used) >= len(ins):
            raise GraphError(f"{where}: expr reads input {max(used)} of {len(ins)}")
        if a["dtype"] != out.dtype:
            raise GraphError(f"{where}: dtype attr {a['dtype']} != output dtype {out.dtype}")
        try:
            full = np.broadcast_shapes(*[t.shape for t in ins], out.shape)
        except ValueError:
            full = None
        if full != tuple(out.shape):
            raise GraphError(f"{where}: inputs {[t.shape for t in ins]} do not broadcast to {out.shape}")
        return
    if op.kind == "layout":
        shape, strides = tuple(a["shape"]), tuple(a["strides"])
        if len(shape) != len(strides) or math.prod(shape) != out.size or out.dtype != ins[0].dtype:
            raise GraphError(f"{where}: layout shape {shape}/strides {strides} do not match output {out.shape}")
        if math.prod(shape) > 0:
            lo, hi = layout_bounds(a)
            if lo < 0 or hi >= ins[0].size:
                raise GraphError(f"{where}: layout reads [{lo}, {hi}] outside input of {ins[0].size} elements")
        return
    if op.kind == "view":
        if out.size != ins[0].size or out.dtype != ins[0].dtype:
            raise GraphError(f"{where}: view {ins[0].shape} -> {out.shape} changes the element count")
        return
    if op.kind == "reduce":
        if a["op"] not in REDUCE_OPS or tuple(sorted(set(a["axes"]))) != tuple(a["axes"]):
            raise GraphError(f"{where}: bad reduce attrs {a}")
        if any(x < 0 or x >= len(ins[0].shape) for x in a["axes"]):
            raise GraphError(f"{where}: reduce axes {a['axes']} out of range for {ins[0].shape}")
    if op.kind == "pad" and a["mode"] not in PAD_MODES:
        raise GraphError(f"{where}: bad pad mode {a['mode']!r}")
    shape, dtype = infer(op.kind, a, ins)
    if tuple(shape) != tuple(out.shape) or dtype != out.dtype:
        raise GraphError(f"{where}: output {out.shape}/{out.dtype}, expected {shape}/{dtype}")


__all__ = [
    "KINDS", "REDUCE_OPS", "PAD_MODES", "Tensor", "BasicOp", "BasicGraph", "GraphError",
    "contiguous_strides", "compute_dtype", "reduce_shape", "conv_out_shape", "infer",
    "layout_bounds", "check_graph",
]
