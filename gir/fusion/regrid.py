"""Parallel primitives that differ only in how their blocks are laid out as a grid.

A template tiles over the coordinates its operands need: an elementwise product over broadcast
operands keeps a (12, 128, 128) grid (a block coordinate per operand stride), the reduction
that consumes it reads a contiguous tensor and uses a flat (196608,) grid. Both enumerate the
same blocks in the same order, so they fuse: each coarse coordinate is an affine combination of
the coordinates of a common refinement (b_i of (1536, 128) is 128 * b0 + b1 of (12, 128, 128)).
Re-expressing every slice over that refinement gives the graphs one primitive to merge on.
"""
from __future__ import annotations

from math import prod

from gir.ir import GIRGraph, Slice, Sync
from gir.ir.affine import Affine, ParallelPrimitive, block_coord


def family(prim: ParallelPrimitive) -> tuple[int, int]:
    """What must agree for two primitives to fuse: blocks and units per block."""
    return prim.num_blocks, prim.units_per_block


def _prefixes(grid: tuple[int, ...]) -> set[int]:
    out, acc = set(), 1
    for n in grid:
        acc *= n
        out.add(acc)
    return out


def common_refinement(grids) -> tuple[int, ...] | None:
    """The coarsest grid every one of `grids` coarsens (same block count), or None."""
    cuts = sorted(set().union(*(_prefixes(g) for g in grids)))
    dims, last = [], 1
    for c in cuts:
        if c % last:
            return None
        dims.append(c // last)
        last = c
    return tuple(dims) or (1,)


def regrid(graph: GIRGraph, grid: tuple[int, ...]) -> GIRGraph:
    """`graph` over `grid`, a refinement of its own grid (same blocks, same order), with every
    index that has a single value (w of one unit per block, a grid axis of extent 1) pinned to
    0, so that slices of the merged parts compare equal where they address the same elements."""
    old = graph.prim.grid
    mapping, j = {}, 0
    for i, n in enumerate(old):
        group = []
        while prod(grid[k] for k in group) < n:
            group.append(j)
            j += 1
        expr = Affine(0)
        for k in group:
            expr = expr + block_coord(k) * prod(grid[k + 1:group[-1] + 1])
        mapping[f"b{i}"] = expr
    for k, n in enumerate(grid):
        if n == 1:
            mapping[f"b{k}"] = mapping.get(f"b{k}", block_coord(k)).substitute({f"b{k}": Affine(0)})
    for name, expr in list(mapping.items()):
        mapping[name] = expr.substitute({f"b{k}": Affine(0) for k, n in enumerate(grid) if n == 1})
    if graph.prim.units_per_block == 1:
        mapping["w"] = Affine(0)
    if prod(grid) == 1:
        mapping["b"] = Affine(0)
    out = GIRGraph(graph.name, ParallelPrimitive(grid, graph.prim.units_per_block), graph.target, dict(graph.buffers))
    for _, op in graph.ops():
        slices = [op.slice] if isinstance(op, Sync) else [*op.reads(), *op.writes()]
        out.add(op.with_slices({s: _substituted(s, mapping) for s in slices}))
    return out


def _substituted(s: Slice, mapping) -> Slice:
    def sub(b):
        return None if b is None else b.substitute(mapping)
    return Slice(s.buffer, s.offset.substitute(mapping), s.shape, s.strides,
                 tuple(sub(b) for b in s.limits), tuple(sub(b) for b in s.starts))
