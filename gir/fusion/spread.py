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
ops, reductions and unit syncs, with no bound that depends on the last block coordinate.

Where the last extent is not a multiple of `rows` (GPT-2's lm_head: 50257 outputs), rows a
fraction of the grid apart would leave a ragged last row valid on some units only, a bound no
affine limit states. There the units run `rows` adjacent old units instead (q*rows + k), the
last unit's surplus rows masked by the limit n - rows*q on the new dimension; adjacent rows of
a GEMV lie one row apart, and the time model counts the pages they span as their streams
(gir/ir/streams.py: 768-float rows from DRAM, 8 adjacent, 1.09x one thread and 1.19x two, against
1.16x and 1.27x for rows an eighth apart; results/gemv_streams.md, one run on a 2-core Intel VM).
An AMD EPYC VM ran the adjacent form at 0.64-0.72x one row's rate on one thread in four runs
(results/gemv_streams_epyc.md): its gain is measured apart (`adjacent_stream_gain`) and the form
offered only where it is over 1.
"""
from __future__ import annotations

from dataclasses import replace
from math import ceil
from typing import NamedTuple

from gir.ir import DRAM, REGISTER, UNIT, GIRGraph, ParallelPrimitive, Slice, Sync
from gir.ir.affine import Affine, var
from gir.ir.gops import Elementwise, Move, Reduce
from gir.ir.streams import MAX_INTERLEAVED_ROWS, inlined_products, unit_streams
from gir.ir.validate import GraphError, validate

SPREAD_ROWS = (4, 8)  # old units per new unit tried: streams a thread keeps in flight (gir/ir/streams.py)


def spread_units(graph: GIRGraph, rows: int, adjacent: bool = False) -> GIRGraph | None:
    """`graph` with `rows` of its units per unit (see the module doc), or None where the form
    does not apply: it leaves fewer units than threads, rows a fraction apart do not divide the
    grid's last extent, or the kernel holds another kind of gOperator or a bound on that
    coordinate. `adjacent`: unit q runs old units q*rows .. q*rows + rows - 1."""
    prim, t = graph.prim, graph.target
    n = prim.grid[-1]
    units = ceil(n / rows) if adjacent else n // rows
    if (not t.timing.unit_bandwidth or prim.units_per_block != 1 or not 2 <= rows <= MAX_INTERLEAVED_ROWS
            or not adjacent and n % rows or units < t.processors):
        return None
    last = f"b{len(prim.grid) - 1}"
    # the surplus rows of the last unit: masked by their index against what is left of the grid
    limit = Affine.of(n) - var(last) * rows if adjacent and n % rows else None
    out = GIRGraph(graph.name, ParallelPrimitive((*prim.grid[:-1], units), 1), t)
    for name, b in graph.buffers.items():
        if b.level not in (DRAM, REGISTER):
            return None
        out.buffers[name] = replace(b, size=b.size * rows) if b.level == REGISTER else b

    def widened(s: Slice) -> Slice | None:
        offset = prim.normalize(s.offset)
        if any(last in prim.normalize(bound).variables for bound in s.bounds):
            return None
        buf = graph.buffers[s.buffer]
        per_unit = dict(offset.terms).get(last, 0)
        if adjacent:
            offset = offset.substitute({last: var(last) * rows})
            step = buf.size if buf.level == REGISTER else per_unit
        else:
            step = buf.size if buf.level == REGISTER else per_unit * units
        masked = limit is not None or s.limits or s.starts
        return Slice(s.buffer, offset, (rows, *s.shape), (step, *s.strides),
                     (limit, *(s.limits or (None,) * len(s.shape))) if masked else (),
                     (None, *(s.starts or (None,) * len(s.shape))) if masked else ())

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


class Spread(NamedTuple):
    rows: int         # old units per new unit
    adjacent: bool    # consecutive old units (else a 1/rows of the grid apart)
    graph: GIRGraph

    @property
    def description(self) -> str:
        where = "consecutive units" if self.adjacent else f"units 1/{self.rows} of the grid apart"
        return f"a unit runs {self.rows} {where}, their rows streamed side by side"


def spread_choices(graph: GIRGraph) -> list[Spread]:
    """The spread forms of `graph` that walk more than one DRAM stream at a time: on CPU
    targets whose calibration says a thread gains from it. Rows a fraction of the grid apart
    where they divide it, else adjacent rows; each where its own measured gain is over 1
    (`stream_gain`, `adjacent_stream_gain`: an AMD EPYC VM ran adjacent rows slower)."""
    timing = graph.target.timing
    out = []
    for rows in SPREAD_ROWS:
        g = None
        for adjacent, gain in ((False, timing.stream_gain), (True, timing.adjacent_stream_gain)):
            g = spread_units(graph, rows, adjacent) if gain > 1 else None
            if g is not None:
                break
        if g is not None and unit_streams(inlined_products([op for _, op in g.ops()], g.buffers), g.buffers) > 1:
            out.append(Spread(rows, adjacent, g))
    return out


def gemv_forms(target, k: int, n: int, spreads: tuple, adjacent: bool = False) -> tuple:
    """(target, {rows: GIR graph}) of x[1, k] @ W[k, n] as the planner builds it for `target` a row
    at a time (rows 1: the templates' first structure, one output a unit) and `spread_units` of it
    with each of `spreads` rows a unit where that applies (`adjacent`: also the last of `spreads`
    as adjacent rows, key "adjacent"): the kernels the CPU calibration's stream-gain probes and
    scripts/gemv_streams.py time (give a target whose stream gains are 1)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from gir.frontend import load
    from gir.fusion.partition import without_library_model
    from gir.fusion.plan import plan
    target = without_library_model(target)  # GIR's own kernels: no time check may take the GEMV
    weight = numpy_helper.from_array(np.zeros((k, n), np.float32), "w")
    io = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    model = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemv",
                                                [io("x", [1, k])], [io("y", [1, n])], [weight]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    (step,) = [s for s in plan(load(model), target, limit=1).steps if hasattr(s, "graph")]
    forms = {1: step.graph}
    for rows in spreads:
        g = spread_units(step.graph, rows)
        if g is not None:
            forms[rows] = g
    if adjacent and spreads and (g := spread_units(step.graph, spreads[-1], adjacent=True)) is not None:
        forms["adjacent"] = g
    return target, forms
