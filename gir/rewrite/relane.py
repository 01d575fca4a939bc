"""Lane placement agreement: an Elementwise whose register result is read by one Move placed
on lanes differently (`vec`) takes the reader's placement, with the loads only it reads.

Templates place each operator's elements on lanes by their own rule (a product by `vec` 1, a
reduction with one lane per output by `vec` = group size). Merged, the copy between the two
placements is a cross-lane exchange per element (a transpose, or worse: often no shuffle
pattern at all). Computing the product where its reader wants it removes the exchange; a load
from registers that then reads another lane's value gets the unit sync that makes it legal
(the driver checks that every read stays covered).
"""
from __future__ import annotations

from dataclasses import replace

from gir.ir import LANE, REGISTER, UNIT, Elementwise, Move, Sync, required_scope

from .query import moves_from_sole_writers, readers, sole_writer, writers


def find(g) -> list[int]:
    return [n for n, op, w in moves_from_sole_writers(g)
            if not op.uniform and g.buffers[op.src.buffer].level == REGISTER
            and isinstance(g.op(w), Elementwise) and g.op(w).vec != op.vec]


def apply(g, reader: int) -> str | None:
    m = g.op(reader)
    node = writers(g, m.src.buffer)[0]
    e = g.op(node)
    if e.uniform or readers(g, m.src.buffer) != [reader]:
        return None
    loads = []
    for s in e.inputs:
        w = sole_writer(g, s.buffer)
        if g.buffers[s.buffer].level != REGISTER or w is None or readers(g, s.buffer) != [node]:
            return None
        load = g.op(w)
        if not isinstance(load, Move) or load.uniform or load.vec != e.vec:
            return None
        loads.append(w)
    for n in dict.fromkeys(loads):
        g.replace(n, replace(g.op(n), vec=m.vec))
    g.replace(node, replace(e, vec=m.vec))
    if required_scope(g, node, reader) > LANE:
        return None  # the placements differ by more than vec
    for n in dict.fromkeys(loads):
        load = g.op(n)
        if g.buffers[load.src.buffer].level != REGISTER:
            continue
        scope = max((required_scope(g, w, n) for w in writers(g, load.src.buffer)), default=LANE)
        if scope > UNIT:
            return None
        if scope == UNIT:
            g.insert_before(n, Sync(scope=UNIT, slice=load.src))
    return f"#{node} and its loads placed on lanes as #{reader} reads them (vec {e.vec} -> {m.vec})"
