"""Gather template: each unit looks up `rows` indices (loaded by every lane) and copies a
chunk of each selected row; the row offset comes from the index value (a Gather gOperator)."""
from __future__ import annotations

from math import ceil, prod

from gir.ir import Gather, Move, ParallelPrimitive, Slice, W, block_coord

from .common import admit, block_sizes, load, new_graph


def generate(op, tensors, target, rejected):
    data, idx, out = (tensors[n] for n in (*op.inputs, op.outputs[0]))
    axis = op.attrs["axis"]
    outer, extent, inner = prod(data.shape[:axis]), data.shape[axis], prod(data.shape[axis + 1:])
    count = max(1, prod(idx.shape))
    cands = []

    def offer(rows: int, chunk: int, upb: int) -> None:
        grid = (outer, ceil(count / rows), ceil(inner / (chunk * upb)))
        g = new_graph(op, tensors, target, ParallelPrimitive(grid, upb), "rows")
        b0, r0, q = block_coord(0), block_coord(1) * rows, block_coord(2) * upb + W
        index = load(g, Slice.flat(idx.name, r0, rows, limit=count - r0), "index", rows, idx.dtype, fill=0, uniform=True)
        g.buffer("%rows", "register", rows * chunk, data.dtype)
        picked = Slice.flat("%rows", 0, rows * chunk)
        src = Slice(data.name, b0 * (extent * inner) + q * chunk, (rows, chunk), (0, 1), (None, inner - q * chunk))
        g.add(Gather(src=src, index=index, dst=picked, stride=inner, extent=extent))
        limits = (count - r0, inner - q * chunk)
        dst = Slice(out.name, (b0 * count + r0) * inner + q * chunk, (rows, chunk), (inner, 1), limits)
        g.add(Move(src=Slice("%rows", 0, (rows, chunk), (chunk, 1)), dst=dst))
        admit(cands, rejected, op.name, "rows", {"rows": rows, "chunk": chunk, "units_per_block": upb}, g)

    for ept in (1, 2, 4, 8):
        span = target.lanes_per_unit * ept
        chunk, rows = min(span, inner), max(1, min(count, span // inner))
        for upb in block_sizes(target):
            offer(rows, chunk, upb)
    # Every lane holds all of a unit's indices: single elements (inner 1) a lane each on a
    # 64-lane wavefront need 64 indices + 64 values a lane, over MI250X's 512 register bytes
    # (a fuzzed Resize). Fewer rows a unit, some lanes idle, rather than no GIR-Graph at all.
    rows = max(1, min(count, target.lanes_per_unit // inner))
    while not cands and rows > 1:
        rows //= 2
        for upb in block_sizes(target):
            offer(rows, min(target.lanes_per_unit, inner), upb)
    return list({tuple(sorted(c.params.items())): c for c in cands}.values())
