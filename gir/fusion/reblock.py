"""Reblock: the same units of a GPU kernel grouped into blocks of another size.

A template picks its units per block with the operators' tiling in mind, and the pick can leave
a kernel that moves megabytes with too few blocks to fill the device (BERT's pooler GEMV on the
H100: 96 blocks of 256 threads for 132 SMs) or with one-warp blocks that cap an SM's occupancy
at the 32-blocks limit (RedNet-50's ReLU + 2x2 average pool: 3584 blocks of 32 threads). Where the kernel's units never meet inside a block (no shared memory,
no block-scope sync), which units share a block changes nothing they compute, so the kernel
can be regrouped:

- split: blocks of `units_per_block / f` units, the old block's units spread over a new last
  grid axis of extent f (old w = new units_per_block * b_new + w);
- merge (one unit per block only): f neighbouring blocks along a grid axis become one block of
  f units (old b_k = f * b_k + w); blocks of a few units are split into one-unit blocks first.

Both keep every unit's coordinates affine, so each slice is rewritten exactly and the
interpreter, race check and byte counts speak for the new form as for the old. The planner
offers the forms that fall short of a full launch less often (`shortfalls`: blocks under 128
threads, fewer than two blocks per SM/CU), or as often with more blocks of 128 threads or more
(`missing_blocks`), and ranks them with the time model like any other structure
(`plan._ranked`: within its tolerance, the fuller launch).
"""
from __future__ import annotations

from typing import NamedTuple

from gir.ir import BLOCK, SHARED, GIRGraph, ParallelPrimitive, Slice, Sync
from gir.ir.affine import Affine, var
from gir.ir.validate import GraphError, validate

MIN_THREADS = 128       # a block under this many threads keeps too few warps on an SM
MERGE_FACTORS = (2, 4, 8, 16)


def shortfalls(prim: ParallelPrimitive, target) -> int:
    """How far a GPU launch shape falls short of filling the device: one for blocks under
    MIN_THREADS threads, one for fewer than two blocks per SM / CU (0: full)."""
    threads = prim.units_per_block * target.lanes_per_unit
    return int(threads < MIN_THREADS) + int(prim.num_blocks < 2 * target.processors)


def missing_blocks(prim: ParallelPrimitive, target) -> int:
    """Blocks short of two per SM / CU. Where no block size of a kernel gives that many (ViT's
    LayerNorm on MI250X: 200 units of 64 lanes for 110 CUs), more blocks still put more of the
    device's CUs, and their load units, to work."""
    return max(0, 2 * target.processors - prim.num_blocks)


def units_meet_in_blocks(graph: GIRGraph) -> bool:
    """Whether a kernel's units share anything a block gives them: shared memory or a barrier."""
    return (any(b.level == SHARED for b in graph.buffers.values())
            or any(isinstance(op, Sync) and op.scope == BLOCK for _, op in graph.ops()))


def split_blocks(graph: GIRGraph, f: int) -> GIRGraph | None:
    """`graph` with blocks of units_per_block / f units, or None where f does not divide it."""
    prim = graph.prim
    if f < 2 or prim.units_per_block % f:
        return None
    upb = prim.units_per_block // f
    axis = f"b{len(prim.grid)}"
    return _regrouped(graph, ParallelPrimitive((*prim.grid, f), upb),
                      [{"w": var(axis) * upb + var("w")}])


def merge_blocks(graph: GIRGraph, f: int, axis: int = -1) -> GIRGraph | None:
    """`graph` with f one-unit blocks along grid axis `axis` (the last by default) as one block
    of f units, or None where the kernel has more than one unit a block or f does not divide
    that axis. Units that never meet may be grouped along any axis: which units a block holds
    is all that changes."""
    prim = graph.prim
    axis %= len(prim.grid)
    if f < 2 or prim.units_per_block != 1 or prim.grid[axis] % f:
        return None
    coord = f"b{axis}"
    grid = (*prim.grid[:axis], prim.grid[axis] // f, *prim.grid[axis + 1:])
    # w is 0 in a one-unit block: pinned first, so the new w the second step brings stays
    return _regrouped(graph, ParallelPrimitive(grid, f), [{"w": Affine(0)}, {coord: var(coord) * f + var("w")}])


def _regrouped(graph: GIRGraph, prim: ParallelPrimitive, steps: list[dict]) -> GIRGraph | None:
    """`graph` over `prim`, each slice's index expressions in the old block coordinates and w
    (`ParallelPrimitive.normalize`), then rewritten by `steps` in turn; None where the result
    does not validate (the registers a bigger block leaves each lane, say)."""
    old = graph.prim

    def moved(e: Affine | None) -> Affine | None:
        if e is None:
            return None
        e = old.normalize(e)
        for step in steps:
            e = e.substitute(step)
        return e

    def rewritten(s: Slice) -> Slice:
        return Slice(s.buffer, moved(s.offset), s.shape, s.strides,
                     tuple(moved(b) for b in s.limits), tuple(moved(b) for b in s.starts))

    out = GIRGraph(graph.name, prim, graph.target, dict(graph.buffers))
    for _, op in graph.ops():
        slices = [op.slice] if isinstance(op, Sync) else [*op.reads(), *op.writes()]
        out.add(op.with_slices({s: rewritten(s) for s in slices}))
    try:
        validate(out)
    except GraphError:
        return None
    return out


class Reblocked(NamedTuple):
    graph: GIRGraph
    description: str


def reblock_choices(graph: GIRGraph) -> list[Reblocked]:
    """The regroupings of a GPU kernel (a target with 16-byte accesses) whose launch falls
    short less often than its own, for the planner to rank beside it: none where its units
    meet inside a block, or where its launch is already full."""
    t, prim = graph.target, graph.prim
    if t.timing.widest_access_bytes < 16 or units_meet_in_blocks(graph):
        return []
    now = shortfalls(prim, t)
    if not now:
        return []
    out = []
    upb, lanes = prim.units_per_block, t.lanes_per_unit

    def better(new: ParallelPrimitive) -> bool:  # short less often, or as often with more blocks of enough threads
        less = shortfalls(new, t)
        return less < now or (less == now and new.num_blocks > prim.num_blocks and missing_blocks(prim, t)
                              and new.units_per_block * lanes >= MIN_THREADS)

    for f in range(2, upb + 1):
        if upb % f == 0 and better(ParallelPrimitive((*prim.grid, f), upb // f)):
            g = split_blocks(graph, f)
            if g is not None:
                out.append(Reblocked(g, f"blocks of {upb // f * lanes} threads instead of {upb * lanes}: "
                                        f"{g.prim.num_blocks} blocks"))
    # blocks of too few units: one-unit blocks merged along the last grid axis that f divides;
    # a block of several units split into one-unit blocks first, and merged along an axis
    # other than the one that split made (RedNet-50's stride-2 involution: 25088 blocks of two
    # 32-lane units)
    if upb * lanes >= MIN_THREADS:
        return out
    ones = graph if upb == 1 else split_blocks(graph, upb)
    if ones is None:
        return out
    axes = range(len(ones.prim.grid) - (upb > 1))
    for f in MERGE_FACTORS:
        axis = next((a for a in reversed(axes) if ones.prim.grid[a] % f == 0), None)
        if axis is None or f > t.max_units_per_block:
            continue
        grid = ones.prim.grid
        if better(ParallelPrimitive((*grid[:axis], grid[axis] // f, *grid[axis + 1:]), f)):
            g = merge_blocks(ones, f, axis)
            if g is not None:
                out.append(Reblocked(g, f"blocks of {f * lanes} threads instead of {upb * lanes}: {g.prim.num_blocks} blocks"))
    return out
