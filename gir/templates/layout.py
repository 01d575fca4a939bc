"""Layout template: a strided view copied out (Transpose, Slice, Expand, Tile, Split parts,
window unfolding). Straight copies, and for transposes a tile staged through shared memory so
both the DRAM reads and the DRAM writes are contiguous."""
from __future__ import annotations

from math import ceil

from gir.frontend.basic import contiguous_strides
from gir.ir import BLOCK, SHARED, Move, ParallelPrimitive, Slice, Sync, W, block_coord
from gir.ir.affine import Affine

from .common import admit, coalesce, new_graph, unique_views
from .pointwise import pointwise_candidates

TILE = 32


def generate(op, tensors, target, rejected):
    a = op.attrs
    out_strides = contiguous_strides(a["shape"])
    cands = []
    for dims, (ostr, istr) in unique_views(tuple(a["shape"]), [out_strides, tuple(a["strides"])]):
        cands += pointwise_candidates(op, tensors, target, dims, [(op.inputs[0], a["offset"], istr)], ostr, None, rejected)
    dims, (ostr, istr) = coalesce(tuple(a["shape"]), out_strides, tuple(a["strides"]))
    if target.shared_bytes_per_block and len(dims) >= 2 and istr[-1] != 1 and 1 in istr[:-1]:
        cands += _tiled(op, tensors, target, dims, a["offset"], istr, ostr, rejected)
    return cands


def _tiled(op, tensors, target, dims, offset, istr, ostr, rejected):
    """Transpose through a padded TILE x TILE shared tile: read along the input-contiguous
    dimension p, write along the output-contiguous last dimension j."""
    k, p, j = len(dims), istr.index(1), len(dims) - 1
    others = [d for d in range(k) if d not in (p, j)]
    out = []
    for upb in (u for u in (8, 4) if u <= target.max_units_per_block):
        per = TILE // upb
        grid = (*[dims[d] for d in others], ceil(dims[p] / TILE), ceil(dims[j] / TILE))
        g = new_graph(op, tensors, target, ParallelPrimitive(grid, upb), "tile")
        bp, bj = block_coord(len(others)), block_coord(len(others) + 1)
        base_in, base_out = Affine(offset), Affine(0)
        for c, d in enumerate(others):
            base_in, base_out = base_in + block_coord(c) * istr[d], base_out + block_coord(c) * ostr[d]
        dtype = tensors[op.inputs[0]].dtype
        g.buffer("%tile", SHARED, TILE * (TILE + 1), dtype)
        in_lim = (dims[j] - TILE * bj - per * W, dims[p] - TILE * bp)
        out_lim = (dims[p] - TILE * bp - per * W, dims[j] - TILE * bj)
        src = Slice(op.inputs[0], base_in + (TILE * bj + per * W) * istr[j] + TILE * bp, (per, TILE), (istr[j], 1), in_lim)
        staged = Slice("%tile", per * (TILE + 1) * W, (per, TILE), (TILE + 1, 1), in_lim)
        g.add(Move(src=src, dst=staged))
        g.add(Sync(scope=BLOCK, slice=staged))
        column = Slice("%tile", per * W, (per, TILE), (1, TILE + 1), out_lim)
        dst = Slice(op.outputs[0], base_out + (TILE * bp + per * W) * ostr[p] + TILE * bj, (per, TILE), (ostr[p], 1), out_lim)
        g.add(Move(src=column, dst=dst))
        params = {"tile": TILE, "units_per_block": upb}
        admit(out, rejected, op.name, "tile", params, g)
    return out
