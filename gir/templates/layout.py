"""Layout template: a strided view copied out (Transpose, Slice, Expand, Tile, Split parts,
window unfolding). Straight copies, and for transposes a tile staged through shared memory so
both the DRAM reads and the DRAM writes are contiguous."""
from __future__ import annotations

from math import ceil

from gir.frontend.basic import contiguous_strides
from gir.ir import BLOCK, REGISTER, SHARED, GIRGraph, Move, ParallelPrimitive, Slice, Sync, W, block_coord
from gir.ir.affine import Affine
from gir.ir.dtypes import itemsize
from gir.ir.vector_access import WIDE_DTYPES

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
        bp, bj, base_in, base_out = _tile_bases(others, istr, ostr, offset, 0)
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
    for g, params in wide_tiles(f"{op.name}:tile", op.inputs[0], offset, op.outputs[0], 0, dims, istr, ostr,
                                tensors, target):
        admit(out, rejected, op.name, "tile", params, g)
    return out


def wide_tiles(name, source, src_offset, dest, dst_offset, dims, istr, ostr, tensors, target):
    """(graph, params) of transposes staged through a shared tile with 16-byte accesses on both
    DRAM sides: each lane loads `vec` consecutive elements along the input-contiguous dimension p
    into registers and stores them into a T x (T + 1) tile (T = 8 vec: eight lanes a tile row),
    and after a barrier loads `vec` consecutive elements along the output-contiguous last
    dimension j from a tile column and stores them as one vector (BERT-fp16's K^T copy,
    (128, 12, 64) -> (12, 64, 128)). Empty where the target issues no 16-byte accesses, the
    dtype has no 16-byte vector, or either contiguous extent is not whole vectors (those keep
    the scalar tile)."""
    dtype = tensors[source].dtype
    k, p, j = len(dims), istr.index(1), len(dims) - 1
    vec = 16 // itemsize(dtype)
    if (target.timing.widest_access_bytes < 16 or not target.shared_bytes_per_block or vec not in WIDE_DTYPES.get(dtype, ())
            or dims[p] % vec or dims[j] % vec or ostr[j] != 1):
        return []
    t = 8 * vec  # a tile row: eight lanes of `vec`
    if t * (t + 1) * itemsize(dtype) > target.shared_bytes_per_block:
        return []
    others = [d for d in range(k) if d not in (p, j)]
    lanes = target.lanes_per_unit
    out = []
    for upb in (u for u in (8, 4, 2) if u <= target.max_units_per_block):
        per = t // upb  # tile rows a unit reads (and columns it writes)
        if per * t % (vec * lanes):
            continue
        grid = (*[dims[d] for d in others], ceil(dims[p] / t), ceil(dims[j] / t))
        g = GIRGraph(f"{name}:{upb}", ParallelPrimitive(grid, upb), target)
        for buf, role in ((source, "const" if tensors[source].is_const else "input"), (dest, "output")):
            g.buffer(buf, "dram", tensors[buf].shape or (1,), tensors[buf].dtype, role=role)
        bp, bj, base_in, base_out = _tile_bases(others, istr, ostr, src_offset, dst_offset)
        g.buffer("%tile", SHARED, t * (t + 1), dtype)
        g.buffer("%rows", REGISTER, per * t, dtype)
        g.buffer("%cols", REGISTER, per * t, dtype)
        in_lim = (dims[j] - t * bj - per * W, dims[p] - t * bp)
        out_lim = (dims[p] - t * bp - per * W, dims[j] - t * bj)
        src = Slice(source, base_in + (t * bj + per * W) * istr[j] + t * bp, (per, t), (istr[j], 1), in_lim)
        rows = Slice("%rows", 0, (per, t), (t, 1))
        g.add(Move(src=src, dst=rows, fill=0.0, vec=vec))
        staged = Slice("%tile", per * (t + 1) * W, (per, t), (t + 1, 1))
        g.add(Move(src=rows, dst=staged, vec=vec))
        g.add(Sync(scope=BLOCK, slice=staged))
        cols = Slice("%cols", 0, (per, t), (t, 1))
        g.add(Move(src=Slice("%tile", per * W, (per, t), (1, t + 1)), dst=cols, vec=vec))
        dst = Slice(dest, base_out + (t * bp + per * W) * ostr[p] + t * bj, (per, t), (ostr[p], 1), out_lim)
        g.add(Move(src=cols, dst=dst, vec=vec))
        out.append((g, {"tile": t, "units_per_block": upb, "vec": vec}))
    return out


def _tile_bases(others, istr, ostr, src_offset: int, dst_offset: int):
    """A tile's block coordinates along p and j (the last two grid axes) and its source and
    destination offsets over the other dimensions (the leading grid axes)."""
    base_in, base_out = Affine(src_offset), Affine(dst_offset)
    for c, d in enumerate(others):
        base_in, base_out = base_in + block_coord(c) * istr[d], base_out + block_coord(c) * ostr[d]
    return block_coord(len(others)), block_coord(len(others) + 1), base_in, base_out
