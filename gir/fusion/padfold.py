"""Folding a constant pad into the loads that read its output.

A lowered convolution or a pooling window reads `P = pad(X, value)` through a window view; a
pad kernel would write P to DRAM and the window kernel read it back. A load of P is a load of
X wherever the element lies inside X's box and `value` elsewhere: the same Move reading X with
per-dimension `starts`/`limits` and `fill=value` (store-then-load merging across the pad).

This works when each slice dimension walks one dimension of P with step 1 (or stays inside an
unpadded one) and the unit's base address splits into P coordinates affinely; the split is
verified by evaluating it for every unit, so a candidate that does not fit is left as it was.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from gir.frontend.basic import contiguous_strides
from gir.ir import GIRGraph, Move, Slice, Sync
from gir.ir.affine import Affine
from gir.ir.target import DRAM


@dataclass(frozen=True)
class ConstantPad:
    output: str
    source: str
    out_shape: tuple[int, ...]
    src_shape: tuple[int, ...]
    begin: tuple[int, ...]
    value: float
    role: str


def constant_pad(op, tensors) -> ConstantPad | None:
    """The fold-able description of a basic pad op (constant mode, no negative pads)."""
    if op.kind != "pad" or op.attrs["mode"] != "constant":
        return None
    x, p = tensors[op.inputs[0]], tensors[op.outputs[0]]
    pads = [tuple(p) for p in op.attrs["pads"]]  # (begin, end) per dimension
    if not x.shape or len(pads) != len(x.shape) or min(min(p) for p in pads) < 0 or x.size == 0:
        return None
    return ConstantPad(p.name, x.name, tuple(p.shape), tuple(x.shape), tuple(b for b, _ in pads),
                       float(op.attrs.get("value", 0.0)), "const" if x.is_const else "input")


def fold_pad(graph: GIRGraph, pad: ConstantPad) -> GIRGraph | None:
    """`graph` reading pad.source instead of pad.output, or None when some read does not fit."""
    if pad.output not in graph.buffers or graph.buffers[pad.output].role != "input":
        return None
    env = _corners(graph.prim)
    new_ops = []
    for _, op in graph.ops():
        slices = [op.slice] if isinstance(op, Sync) else [*op.reads(), *op.writes()]
        if not any(s.buffer == pad.output for s in slices):
            new_ops.append(op)
            continue
        if not isinstance(op, Move) or op.src.buffer != pad.output:
            return None
        folded = _through_pad(op.src, op.fill, pad, env)
        if folded is None:
            return None
        src, fill = folded
        new_ops.append(replace(op, src=src, fill=fill, vec=op.vec if src.is_masked == op.src.is_masked else 1))
    buffers = {n: b for n, b in graph.buffers.items() if n != pad.output}
    out = GIRGraph(graph.name, graph.prim, graph.target, buffers)
    if pad.source not in out.buffers:
        dtype = graph.buffers[pad.output].dtype
        out.buffer(pad.source, DRAM, pad.src_shape, dtype, role=pad.role)
    for op in new_ops:
        out.add(op)
    return out


def _unpadded_runs_merged(pad: ConstantPad) -> ConstantPad:
    """The pad with each run of neighbouring unpadded dimensions as one dimension: the same
    tensors, element for element. A grid axis that coalesced batch and channels (a max pool's
    2 x 8 planes as one axis of 16) steps one merged dimension, where over the separate ones
    its coordinate would carry from channel to batch and the fold would give up."""
    out, src, begin = [], [], []
    for n_out, n_src, b in zip(pad.out_shape, pad.src_shape, pad.begin):
        unpadded = n_out == n_src and b == 0
        if out and unpadded and begin[-1] is None:
            out[-1], src[-1] = out[-1] * n_out, src[-1] * n_src
            continue
        out.append(n_out)
        src.append(n_src)
        begin.append(None if unpadded else b)
    return replace(pad, out_shape=tuple(out), src_shape=tuple(src), begin=tuple(b or 0 for b in begin))


def _through_pad(s: Slice, fill, pad: ConstantPad, env):
    """(slice of the source, fill) reading what `s` reads from the padded tensor."""
    pad = _unpadded_runs_merged(pad)
    pstr, xstr = contiguous_strides(pad.out_shape), contiguous_strides(pad.src_shape)
    rank = len(pstr)
    terms: list[list] = [[] for _ in range(rank)]
    for name, coef in s.offset.terms:
        j = _dim_of(coef, pstr, pad.out_shape)
        if j is None:
            return None
        terms[j].append((name, coef // pstr[j]))
    slice_dim: dict[int, int] = {}
    for d, stride in enumerate(s.strides):
        if stride == 0 or s.shape[d] == 1:
            continue
        j = _dim_of(stride, pstr, pad.out_shape)
        if j is None or j in slice_dim or stride != pstr[j]:
            return None
        slice_dim[j] = d
    units = env["u"].shape[0]
    # Unmasked extents at the corners of the unit grid: affine values take their extremes
    # there, so the checks below hold for every unit (conservatively for masked slices).
    first = np.zeros((units, len(s.shape)), np.int64)
    last = np.broadcast_to(np.array(s.shape, np.int64) - 1, first.shape)
    live = np.ones(units, bool)
    ref = 0
    base = np.broadcast_to(np.asarray(s.offset.eval(env), np.int64), (units,))
    coords = []
    for j in range(rank):
        part = Affine(0, tuple(sorted(terms[j])))
        digit = (int(base[ref]) // pstr[j]) % pad.out_shape[j]
        coords.append(part + (digit - int(np.broadcast_to(np.asarray(part.eval(env)), (units,))[ref])))
    values = [np.broadcast_to(np.asarray(c.eval(env), np.int64), (units,)) for c in coords]
    if not np.array_equal(sum(v * p for v, p in zip(values, pstr))[live], base[live]):
        return None
    limits = list(s.limits or (None,) * len(s.shape))
    starts = list(s.starts or (None,) * len(s.shape))
    masked = False
    for j in range(rank):
        d = slice_dim.get(j)
        extent = (s.shape[d] - 1) if d is not None else 0
        lo_v, hi_v = values[j][live] + (first[live, d] if d is not None else 0), \
            values[j][live] + (last[live, d] if d is not None else 0)
        if lo_v.min() < 0 or hi_v.max() >= pad.out_shape[j]:
            return None  # the split into coordinates carries between dimensions
        lo, hi = pad.begin[j], pad.begin[j] + pad.src_shape[j]
        if lo_v.min() >= lo and hi_v.max() < hi:
            continue  # every valid element lies inside the source along this dimension
        if d is None or extent == 0:
            return None  # whole units inside or outside: not a per-element mask
        new_start, new_limit = lo - coords[j], hi - coords[j]
        starts[d] = _tighter(starts[d], new_start, env, live, np.maximum, lambda v: v <= 0)
        limits[d] = _tighter(limits[d], new_limit, env, live, np.minimum, lambda v: v >= s.shape[d])
        if starts[d] is False or limits[d] is False:
            return None
        masked = True
    if masked and s.is_masked and fill is not None and fill != pad.value:
        return None  # two masks that fill differently
    offset = Affine(0)
    for j in range(rank):
        offset = offset + (coords[j] - pad.begin[j]) * xstr[j]
    strides = tuple(0 if st == 0 or s.shape[d] == 1 else xstr[_dim_of(st, pstr, pad.out_shape)]
                    for d, st in enumerate(s.strides))
    folded = Slice(pad.source, offset, s.shape, strides, tuple(limits), tuple(starts))
    return folded, (pad.value if masked else fill)


def _corners(prim) -> dict[str, np.ndarray]:
    """The parallel indices at every corner of the grid x units-per-block box."""
    extents = [*prim.grid, prim.units_per_block]
    pts = np.array(np.meshgrid(*[sorted({0, n - 1}) for n in extents], indexing="ij"), np.int64)
    pts = pts.reshape(len(extents), -1)
    env = {f"b{i}": pts[i] for i in range(len(prim.grid))}
    b = sum(pts[i] * int(np.prod(prim.grid[i + 1:], dtype=np.int64)) for i in range(len(prim.grid)))
    env.update(b=b, w=pts[-1], u=b * prim.units_per_block + pts[-1])
    return env


def _dim_of(step: int, pstr, shape) -> int | None:
    """The padded tensor's dimension a flat step moves along (outermost that divides it)."""
    for j, p in enumerate(pstr):
        if step % p == 0 and abs(step // p) < shape[j]:
            return j
    return None


def _tighter(old, new: Affine, env, live, pick, vacuous):
    """The bound of `old` and `new` that holds for every live unit (False when neither does);
    a bound `vacuous` for every unit (outside the slice) gives way to the other."""
    units = live.shape[0]
    b = np.broadcast_to(np.asarray(new.eval(env), np.int64), (units,))[live]
    if old is None:
        return new
    a = np.broadcast_to(np.asarray(old.eval(env), np.int64), (units,))[live]
    if vacuous(a).all():
        return new
    if vacuous(b).all():
        return old
    both = pick(a, b)
    if np.array_equal(both, a):
        return old
    if np.array_equal(both, b):
        return new
    return False
