"""Pad template (constant, reflect, edge). Per dimension the output splits into up to three
regions (before, inside, after), in each of which the input index is affine in the output
index: inside `o - before`, reflect `before - o` and `2(n-1) + before - o`, edge a constant.
Each combination of regions is one masked Move; together they write every element once."""
from __future__ import annotations

import itertools
from math import ceil

from gir.frontend.basic import contiguous_strides
from gir.ir import REGISTER, Move, ParallelPrimitive, Slice, W, block_coord
from gir.ir.affine import Affine

from .common import admit, block_sizes, new_graph


def _regions(n: int, before: int, after: int, mode: str):
    """(lo, hi, alpha, beta): output indices [lo, hi) read input index alpha * o + beta."""
    regions = [(before, before + n, 1, -before)]
    if mode == "reflect":
        regions += [(0, before, -1, before), (before + n, before + n + after, -1, 2 * (n - 1) + before)]
    elif mode == "edge":
        regions += [(0, before, 0, 0), (before + n, before + n + after, 0, n - 1)]
    return [r for r in regions if r[1] > r[0]]


def generate(op, tensors, target, rejected):
    x, y = tensors[op.inputs[0]], tensors[op.outputs[0]]
    mode, value = op.attrs["mode"], op.attrs.get("value", 0.0)
    in_shape, pads = (1, *x.shape) if len(x.shape) == 1 else x.shape, list(op.attrs["pads"])
    if len(x.shape) == 1:
        pads = [(0, 0), *pads]
    out_shape = tuple(n + b + a for n, (b, a) in zip(in_shape, pads))
    if mode == "reflect" and any(b >= n or a >= n for n, (b, a) in zip(in_shape, pads) if b or a):
        rejected.append(("chunk", {}, f"reflect pads must be smaller than the padded dimension ({pads} on {in_shape})"))
        return []
    istr, ostr, k = contiguous_strides(in_shape), contiguous_strides(out_shape), len(in_shape)
    cands = []
    for ept in (1, 2, 4):
        chunk = min(target.lanes_per_unit * ept, out_shape[-1])
        for upb in block_sizes(target):
            grid = (*out_shape[:-1], ceil(out_shape[-1] / (chunk * upb)))
            g = new_graph(op, tensors, target, ParallelPrimitive(grid, upb), "chunk")
            q = block_coord(k - 1) * upb + W
            g.buffer("%row", REGISTER, chunk, y.dtype)
            per_dim = [_regions(n, b, a, mode) for n, (b, a) in zip(in_shape, pads)]
            for combo in itertools.product(*per_dim):
                offset, starts, limits = Affine(0), [], []
                for d, (lo, hi, alpha, beta) in enumerate(combo[:-1]):
                    coord = block_coord(d)
                    offset = offset + (coord * alpha + beta) * istr[d]
                    starts.append(lo - coord)
                    limits.append(hi - coord)
                lo, hi, alpha, beta = combo[-1]
                offset = offset + (q * (alpha * chunk) + beta) * istr[-1]
                starts.append(lo - q * chunk)
                limits.append(hi - q * chunk)
                shape, bounds = (*([1] * (k - 1)), chunk), {"limits": tuple(limits), "starts": tuple(starts)}
                src = Slice(x.name, offset, shape, (*([0] * (k - 1)), alpha * istr[-1]), **bounds)
                if mode == "constant":
                    dst = Slice("%row", 0, shape, (*([0] * (k - 1)), 1))
                    g.add(Move(src=src, dst=dst, fill=value))
                else:
                    g.add(Move(src=src, dst=Slice("%row", 0, shape, (*([0] * (k - 1)), 1), **bounds)))
            out_off = sum((block_coord(d) * ostr[d] for d in range(k - 1)), Affine(0)) + q * chunk
            g.add(Move(src=Slice.flat("%row", 0, chunk), dst=Slice.flat(y.name, out_off, chunk, limit=out_shape[-1] - q * chunk)))
            params = {"chunk": chunk, "units_per_block": upb}
            admit(cands, rejected, op.name, "chunk", params, g)
    return cands
