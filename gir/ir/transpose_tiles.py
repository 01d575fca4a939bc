"""Which kernels a SIMD-lane target runs as a tiled transpose.

A copy kernel whose unit moves a block from DRAM to DRAM through registers, reading along one
axis and writing along the other (BERT's and ViT's K^T before QK^T: [seq, 768] -> [12, 64,
seq]), is one loop over the block in the per-unit form: a gather a column apart, its address
divided and reduced by the row length on every element. Run as 16x16 tiles instead, each tile
is 16 contiguous loads and 16 contiguous stores: ViT's K^T copies 0.16-0.17 -> 0.03 ms, BERT's
0.08 -> 0.01 ms, one thread, each alone (`scripts/loop_forms_ab.py --baseline tiles`,
results/transpose_tiles_ab.md). The rule lives
on the IR because the CPU emitter (gir/backends/cpu/emitter.py) and the time model
(gir/fusion/perf.py) must agree on it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .affine import ParallelPrimitive
from .gops import Move
from .slices import Slice
from .target import DRAM, REGISTER
from .validate import tidy_slice

TILE = 16  # elements a side: a 64-byte vector of floats


@dataclass(frozen=True)
class TransposeCopy:
    """dst[a * dst_row + c] = src[a + src_row * c] for a < rows, c < cols, from the slices' offsets."""
    src: Slice
    dst: Slice
    rows: int
    cols: int
    src_row: int   # the source's step between consecutive c (a steps by 1)
    dst_row: int   # the destination's step between consecutive a (c steps by 1)


def _two_dims(s: Slice) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(shape, strides) of s without its unit dimensions, if two remain."""
    dims = [(n, st) for n, st in zip(s.shape, s.strides) if n > 1]
    if len(dims) != 2:
        return None
    return (dims[0][0], dims[1][0]), (dims[0][1], dims[1][1])


def transpose_copy(ops, buffers: dict, prim: ParallelPrimitive) -> TransposeCopy | None:
    """The kernel's transpose, if its ops are exactly: a Move from DRAM into a register
    block, and a Move of that block, unchanged, to DRAM, unmasked in every unit of `prim`,
    reading contiguously along the block's first axis and writing contiguously along its
    last, both axes at least a tile long."""
    moves = [op for op in ops if isinstance(op, Move)]
    if len(moves) != 2 or len(ops) != 2:
        return None
    load, store = (op.with_slices({s: tidy_slice(s, prim) for s in (op.src, op.dst)}) for op in moves)
    levels = [buffers[s.buffer].level for s in (load.src, load.dst, store.src, store.dst)]
    if levels != [DRAM, REGISTER, REGISTER, DRAM] or load.dst != store.src:
        return None
    if any(s.is_masked for s in (load.src, load.dst, store.dst)) or load.fill is not None or store.fill is not None:
        return None
    if len({buffers[s.buffer].dtype for s in (load.src, load.dst, store.dst)}) != 1:
        return None
    src, dst = _two_dims(load.src), _two_dims(store.dst)
    if src is None or dst is None or src[0] != dst[0]:
        return None
    (rows, cols), (sa, sc) = src
    _, (da, dc) = dst
    if sa != 1 or dc != 1 or rows < TILE or cols < TILE:
        return None
    return TransposeCopy(load.src, store.dst, rows, cols, sc, da)
