"""Spread units: each unit of a CPU kernel runs `rows` of the kernel's units side by side, units
a 1/rows of the grid's last axis apart, so that its reductions walk `rows` DRAM streams at once.

A CPU thread's DRAM rate depends on how its loads are laid out in time: a GEMV summing one
weight row after another (GPT-2 decode's, one output per unit) streamed 11.5 GB/s from DRAM on
one thread of an Intel Xeon VM, eight rows an eighth of the matrix apart side by side 13.2 GB/s,
and 21.1 against 24.6 GB/s on two threads (results/gemv_streams.md). The emitter walks a unit's
outputs side by side (gir/backends/cstyle.py `interleaved_reduce_loop`); the time model
charges such a unit's bytes at the faster rate (gir/ir/streams.py). This pass makes the
units: every slice gains a leading dimension of `rows` (a DRAM slice steps by its offset's
coefficient on the last block coordinate times the new grid's last extent; a register slice
by its buffer's old size, each unit of the group owning a copy), so unit q of the new grid
runs old units q, q + n/rows, ... in element order, and each gOperator's semantics hold
element by element. Only for kernels of one launch whose gOperators are moves, elementwise
ops, reductions and unit syncs, with no bound that depends on the last block coordinate (a
ragged unit would need a bound per row).
"""
from __future__ import annotations

from dataclasses import replace

from gir.ir import DRAM, REGISTER, UNIT, GIRGraph, ParallelPrimitive, Slice, Sync
from gir.ir.gops import Elementwise, Move, Reduce
from gir.ir.streams import MAX_INTERLEAVED_ROWS, inlined_products, unit_streams
from gir.ir.validate import GraphError, validate

SPREAD_ROWS = (4, 8)  # old units per new unit tried: streams a thread keeps in flight (gir/ir/streams.py)


def spread_units(graph: GIRGraph, rows: int) -> GIRGraph | None:
    """`graph` with `rows` of its units per unit (see the module doc), or None where the form
    does not apply: the grid's last extent is not a multiple of rows or leaves fewer units than
    threads, or the kernel holds another kind of gOperator or a bound on that coordinate."""
    prim, t = graph.prim, graph.target
    n = prim.grid[-1]
    if (not t.timing.unit_bandwidth or prim.units_per_block != 1 or not 2 <= rows <= MAX_INTERLEAVED_ROWS
            or n % rows or n // rows < t.processors):
        return None
    apart, last = n // rows, f"b{len(prim.grid) - 1}"
    out = GIRGraph(graph.name, ParallelPrimitive((*prim.grid[:-1], apart), 1), t)
    for name, b in graph.buffers.items():
        if b.level not in (DRAM, REGISTER):
            return None
        out.buffers[name] = replace(b, size=b.size * rows) if b.level == REGISTER else b

    def widened(s: Slice) -> Slice | None:
        offset = prim.normalize(s.offset)
        if any(last in prim.normalize(bound).variables for bound in s.bounds):
            return None
        buf = graph.buffers[s.buffer]
        step = buf.size if buf.level == REGISTER else dict(offset.terms).get(last, 0) * apart
        return Slice(s.buffer, offset, (rows, *s.shape), (step, *s.strides),
                     (None, *s.limits) if s.limits else (), (None, *s.starts) if s.starts else ())

    for _, op in graph.ops():
        if not isinstance(op, (Move, Elementwise, Reduce, Sync)) or isinstance(op, Sync) and op.scope != UNIT:
            return None
        slices = [op.slice] if isinstance(op, Sync) else [*op.reads(), *op.writes()]
        mapping = {}
        for s in slices:
            w = widened(s)
            if w is None:
                return None
            mapping[s] = w
        out.add(op.with_slices(mapping))
    try:
        validate(out)
    except GraphError:
        return None
    return out


def spread_choices(graph: GIRGraph) -> list[GIRGraph]:
    """The spread forms of `graph` that walk more than one DRAM stream at a time: on CPU
    targets whose calibration says a thread gains from it."""
    if graph.target.timing.stream_gain <= 1:
        return []
    out = []
    for rows in SPREAD_ROWS:
        g = spread_units(graph, rows)
        if g is not None and unit_streams(inlined_products([op for _, op in g.ops()], g.buffers), g.buffers) > 1:
            out.append(g)
    return out
