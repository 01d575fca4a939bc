"""Hand-built GIR-Graphs that exercise every IR feature: ragged edges, shuffles, shared
memory, block barriers, 2-D tiles. They are fixtures for the IR tests, written the way a
template author would write them."""
from math import ceil

from gir.ir import (B, DRAM, REGISTER, SHARED, UNIT, BLOCK, U, W, Broadcast, Elementwise, GIRGraph, Input, Move,
                    ParallelPrimitive, Reduce, Slice, Sync, block_coord, call)


def relu(n: int, target, elems_per_lane: int = 4, units_per_block: int = 4) -> GIRGraph:
    """DRAM -> registers -> elementwise -> DRAM; the last unit's slice is cut at n."""
    chunk = target.lanes_per_unit * elems_per_lane
    units_per_block = min(units_per_block, target.max_units_per_block)
    blocks = ceil(ceil(n / chunk) / units_per_block)
    g = GIRGraph("relu", ParallelPrimitive((blocks,), units_per_block), target)
    g.buffer("x", DRAM, (n,), role="input")
    g.buffer("y", DRAM, (n,), role="output")
    g.buffer("r", REGISTER, chunk)
    g.buffer("s", REGISTER, chunk)
    reg = lambda name: Slice.flat(name, 0, chunk)
    g.add(Move(src=Slice.flat("x", chunk * U, chunk, limit=n - chunk * U), dst=reg("r")))
    g.add(Elementwise(expr=call("relu", Input(0)), inputs=(reg("r"),), out=reg("s")))
    g.add(Move(src=reg("s"), dst=Slice.flat("y", chunk * U, chunk, limit=n - chunk * U)))
    return g


def _unit_reduce(g, op, src, name, width):
    """Sync the lanes of a unit, then reduce cooperatively (a shuffle tree when emitted)."""
    g.buffer(name, REGISTER, 1)
    g.add(Sync(scope=UNIT, slice=Slice.flat(src, 0, width)))
    g.add(Reduce(op=op, src=Slice.flat(src, 0, width), dst=Slice.flat(name, 0, 1)))


def softmax_unit_per_row(rows: int, cols: int, target, units_per_block: int = 4, drop_unit_sync: bool = False) -> GIRGraph:
    """Row softmax, one unit (warp) per row: reductions are warp shuffles."""
    blocks = ceil(rows / units_per_block)
    g = GIRGraph("softmax_unit", ParallelPrimitive((blocks,), units_per_block), target)
    g.buffer("x", DRAM, (rows, cols), role="input")
    g.buffer("y", DRAM, (rows, cols), role="output")
    for name in ("rx", "bm", "e", "bs", "ry"):
        g.buffer(name, REGISTER, cols)
    reg = lambda name: Slice.flat(name, 0, cols)
    row = lambda buf: Slice.runs(buf, cols * U, 1, cols, num_limit=rows - U)
    g.add(Move(src=row("x"), dst=reg("rx"), fill=float("-inf")))
    if drop_unit_sync:
        g.buffer("m", REGISTER, 1)
        g.add(Reduce(op="max", src=reg("rx"), dst=Slice.flat("m", 0, 1)))
    else:
        _unit_reduce(g, "max", "rx", "m", cols)
    g.add(Broadcast(src=Slice.flat("m", 0, 1), dst=reg("bm")))
    g.add(Elementwise(expr=call("exp", Input(0) - Input(1)), inputs=(reg("rx"), reg("bm")), out=reg("e")))
    _unit_reduce(g, "sum", "e", "s", cols)
    g.add(Broadcast(src=Slice.flat("s", 0, 1), dst=reg("bs")))
    g.add(Elementwise(expr=Input(0) / Input(1), inputs=(reg("e"), reg("bs")), out=reg("ry")))
    g.add(Move(src=reg("ry"), dst=row("y")))
    return g


def softmax_block_per_row(rows: int, cols: int, target, units_per_block: int = 4, drop_block_sync: bool = False) -> GIRGraph:
    """Row softmax, one block per row: each unit reduces its chunk, partials meet in shared memory."""
    lanes = target.lanes_per_unit
    chunk = ceil(cols / (units_per_block * lanes)) * lanes
    g = GIRGraph("softmax_block", ParallelPrimitive((rows,), units_per_block), target)
    g.buffer("x", DRAM, (rows, cols), role="input")
    g.buffer("y", DRAM, (rows, cols), role="output")
    for name in ("rx", "bm", "e", "bs", "ry"):
        g.buffer(name, REGISTER, chunk)
    reg = lambda name, n=chunk: Slice.flat(name, 0, n)
    part = lambda buf: Slice.flat(buf, cols * B + chunk * W, chunk, limit=cols - chunk * W)
    g.add(Move(src=part("x"), dst=reg("rx"), fill=float("-inf")))

    def block_reduce(op, src, name):
        _unit_reduce(g, op, src, f"p{name}", chunk)
        g.buffer(f"sh_{name}", SHARED, units_per_block)
        g.buffer(f"all_{name}", REGISTER, units_per_block)
        g.add(Move(src=reg(f"p{name}", 1), dst=Slice.flat(f"sh_{name}", W, 1)))
        if not drop_block_sync:
            g.add(Sync(scope=BLOCK, slice=Slice.flat(f"sh_{name}", W, 1)))
        g.add(Move(src=Slice.flat(f"sh_{name}", 0, units_per_block), dst=reg(f"all_{name}", units_per_block)))
        _unit_reduce(g, op, f"all_{name}", name, units_per_block)

    block_reduce("max", "rx", "m")
    g.add(Broadcast(src=reg("m", 1), dst=reg("bm")))
    g.add(Elementwise(expr=call("exp", Input(0) - Input(1)), inputs=(reg("rx"), reg("bm")), out=reg("e")))
    block_reduce("sum", "e", "s")
    g.add(Broadcast(src=reg("s", 1), dst=reg("bs")))
    g.add(Elementwise(expr=Input(0) / Input(1), inputs=(reg("e"), reg("bs")), out=reg("ry")))
    g.add(Move(src=reg("ry"), dst=part("y")))
    return g


def transpose_shared(rows: int, cols: int, target, tile: int = 32, units_per_block: int = 8) -> GIRGraph:
    """2-D transpose through a padded shared tile: coalesced reads and writes, ragged edges masked."""
    per_unit = tile // units_per_block
    grid = (ceil(rows / tile), ceil(cols / tile))
    g = GIRGraph("transpose", ParallelPrimitive(grid, units_per_block), target)
    g.buffer("x", DRAM, (rows, cols), role="input")
    g.buffer("y", DRAM, (cols, rows), role="output")
    g.buffer("tile", SHARED, tile * (tile + 1))
    bi, bj = block_coord(0), block_coord(1)
    in_limits = (rows - tile * bi - per_unit * W, cols - tile * bj)
    out_limits = (cols - tile * bj - per_unit * W, rows - tile * bi)
    src = Slice("x", (tile * bi + per_unit * W) * cols + tile * bj, (per_unit, tile), (cols, 1), in_limits)
    stage = Slice("tile", per_unit * (tile + 1) * W, (per_unit, tile), (tile + 1, 1), in_limits)
    g.add(Move(src=src, dst=stage))
    g.add(Sync(scope=BLOCK, slice=stage))
    col = Slice("tile", per_unit * W, (per_unit, tile), (1, tile + 1), out_limits)
    dst = Slice("y", (tile * bj + per_unit * W) * rows + tile * bi, (per_unit, tile), (rows, 1), out_limits)
    g.add(Move(src=col, dst=dst))
    return g
