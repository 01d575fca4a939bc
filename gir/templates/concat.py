"""Concat template: every unit copies the same chunk position of each input's rows into that
input's place in the output row; a unit past the end of a shorter input is masked for it."""
from __future__ import annotations

from math import ceil, prod

from gir.ir import Move, ParallelPrimitive, Slice, W, block_coord

from .common import admit, block_sizes, load, new_graph


def generate(op, tensors, target, rejected):
    out = tensors[op.outputs[0]]
    axis = op.attrs["axis"]
    outer, inner = prod(out.shape[:axis]), prod(out.shape[axis + 1:])
    rows = [tensors[n].shape[axis] * inner for n in op.inputs]
    offsets = [sum(rows[:i]) for i in range(len(rows))]
    total, longest, lanes = sum(rows), max(rows), target.lanes_per_unit
    cands = []
    for ept in (1, 2, 4, 8):
        span = lanes * ept
        chunk = min(span, longest)
        per_unit_rows = max(1, min(outer, span // longest)) if span > longest else 1
        for upb in block_sizes(target):
            grid = (ceil(outer / per_unit_rows), ceil(longest / (chunk * upb)))
            g = new_graph(op, tensors, target, ParallelPrimitive(grid, upb), "chunk")
            r0, q = block_coord(0) * per_unit_rows, block_coord(1) * upb + W
            for i, (name, row, off) in enumerate(zip(op.inputs, rows, offsets)):
                if row == 0:
                    continue
                limits = (outer - r0, row - q * chunk)
                src = Slice(name, r0 * row + q * chunk, (per_unit_rows, chunk), (row, 1), limits)
                reg = load(g, src, f"in{i}", src.size, out.dtype)
                dst = Slice(out.name, r0 * total + off + q * chunk, (per_unit_rows, chunk), (total, 1), limits)
                g.add(Move(src=reg, dst=dst))
            params = {"rows": per_unit_rows, "chunk": chunk, "units_per_block": upb}
            admit(cands, rejected, op.name, "chunk", params, g)
    return _unique(cands)


def _unique(cands):
    seen, out = set(), []
    for c in cands:
        key = tuple(sorted(c.params.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out
