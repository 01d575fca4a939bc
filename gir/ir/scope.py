"""Sync-scope analysis: the narrowest sync that makes one gOperator's writes visible to
another's reads, computed by enumerating which unit and lane writes and reads every element
(static shapes make this exact and cheap), never guessed from op types.

lane   -> nothing to do, the value stays in the lane's registers
unit   -> warp/wavefront shuffle (registers) or syncwarp (shared)
block  -> shared memory + barrier
device -> DRAM and a kernel boundary
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .affine import ParallelPrimitive
from .access import ALL_LANES, UNWRITTEN, needed_scope, output_lanes, read_pairs, storage_index
from .gops import Sync
from .graph import GIRGraph
from .target import DEVICE, LANE, REGISTER, SCOPE_NAMES, SHARED, UNIT


def required_scope(graph: GIRGraph, writer: int, reader: int) -> int:
    """Widest scope needed over every element `reader` reads from what `writer` wrote."""
    wop, rop = graph.op(writer), graph.op(reader)
    shared = {s.buffer for s in wop.writes()} & {s.buffer for s in rop.reads()}
    if not shared:
        return LANE
    buffers = tuple(sorted((name, graph.buffers[name]) for name in shared))
    return _required_scope(wop, rop, graph.prim, graph.target.lanes_per_unit, buffers)


@lru_cache(maxsize=4096)
def _required_scope(wop, rop, prim, lanes_per_unit: int, buffers: tuple) -> int:
    """Cached on the gOperators themselves (immutable): rewrites re-ask about unchanged pairs."""
    bufs = dict(buffers)
    same = _same_elements_same_unit(wop, rop, prim, lanes_per_unit, bufs)
    if same is not None:
        return same
    if all(b.level == REGISTER for b in bufs.values()):
        fast = _register_scope(wop, rop, lanes_per_unit, bufs)
        if fast is not None:
            return fast
    if all(b.level == SHARED for b in bufs.values()) and _same_in_every_block(wop, rop, prim, bufs):
        prim = ParallelPrimitive((1,), prim.units_per_block)  # one block stands for all
    env = prim.env()
    units, upb = prim.num_units, prim.units_per_block
    scope = LANE
    for ws in wop.writes():
        if ws.buffer not in bufs:
            continue
        buf = bufs[ws.buffer]
        rows = units if buf.level == REGISTER else prim.num_blocks if buf.level == SHARED else None
        shape = (buf.size,) if rows is None else (rows, buf.size)
        w_unit = np.full(shape, UNWRITTEN, dtype=np.int64)
        w_lane = np.full(shape, ALL_LANES, dtype=np.int64)
        addrs, valid = ws.addresses(env), ws.valid(env)
        idx = storage_index(buf, np.where(valid, addrs, 0), env)
        sel = tuple(ix[valid] for ix in idx)
        w_unit[sel] = np.broadcast_to(env["u"][:, None], addrs.shape)[valid]
        w_lane[sel] = np.broadcast_to(output_lanes(wop, lanes_per_unit)[None, :], addrs.shape)[valid]
        for i, rs in enumerate(rop.reads()):
            if rs.buffer != ws.buffer:
                continue
            raddrs, rvalid = rs.addresses(env), rs.valid(env)
            ridx = storage_index(buf, np.where(rvalid, raddrs, 0), env)
            j, lanes, _ = read_pairs(rop, i, lanes_per_unit)
            wu, wl = w_unit[ridx][:, j], w_lane[ridx][:, j]
            need = needed_scope(wu, wl, env["u"][:, None], lanes[None, :], upb)
            mask = rvalid[:, j] & (wu != UNWRITTEN)
            if mask.any():
                scope = max(scope, int(need[mask].max()))
    return scope


def _same_in_every_block(wop, rop, prim, bufs: dict) -> bool:
    """Shared memory never crosses blocks; where no address or mask of the buffers depends on
    the block, every block writes and reads alike (a per-block tile of attention's scores)."""
    slices = [s for s in (*wop.writes(), *rop.reads()) if s.buffer in bufs]
    bounds = [a for s in slices for a in (s.offset, *s.limits, *s.starts) if a is not None]
    return all(prim.normalize(a).variables <= {"w"} for a in bounds)


def _same_elements_same_unit(wop, rop, prim, lanes_per_unit: int, bufs: dict) -> int | None:
    """The common case after merging: the reader reads exactly the slice the writer wrote.
    Each element in the lane that wrote it: lane scope. In another lane: unit scope, where each
    unit reads only what it wrote itself (registers are the unit's own; in memory, where no two
    units write one address); the enumeration would list every element of the tensor (GPT-2's
    lm_head product, 38.6M elements: 8.5 s) to find the same."""
    writes = [ws for ws in wop.writes() if ws.buffer in bufs]
    reads = [(i, rs) for i, rs in enumerate(rop.reads()) if rs.buffer in bufs]
    if len(writes) != 1 or not reads:
        return None
    ws = writes[0]
    w_lanes = output_lanes(wop, lanes_per_unit)
    scope = LANE
    for i, rs in reads:
        if not rs.same_pattern(ws):
            return None
        j, lanes, _ = read_pairs(rop, i, lanes_per_unit)
        if not (np.array_equal(w_lanes[j], lanes) or (w_lanes[j] == ALL_LANES).all()):
            scope = UNIT
    if scope == UNIT and bufs[ws.buffer].level != REGISTER and not ws.units_apart(prim.env()):
        return None
    return scope


def _register_scope(wop, rop, lanes_per_unit: int, bufs: dict) -> int | None:
    """Registers never cross units, so only lanes matter; with unit-independent offsets one
    unit stands for all. Masks are ignored, which can only widen the answer (conservative)."""
    scope = LANE
    for ws in wop.writes():
        if ws.buffer not in bufs:
            continue
        reads = [(i, rs) for i, rs in enumerate(rop.reads()) if rs.buffer == ws.buffer]
        if not ws.offset.is_const or not all(rs.offset.is_const for _, rs in reads):
            return None
        w_lane = np.full(bufs[ws.buffer].size, UNWRITTEN, dtype=np.int64)
        addrs = ws.offset.const + ws.pattern
        if addrs.min() < 0 or addrs.max() >= w_lane.size:
            return None
        w_lane[addrs] = output_lanes(wop, lanes_per_unit)
        for i, rs in reads:
            raddrs = rs.offset.const + rs.pattern
            if raddrs.min() < 0 or raddrs.max() >= w_lane.size:
                return None
            j, lanes, _ = read_pairs(rop, i, lanes_per_unit)
            wl = w_lane[raddrs][j]
            written = wl != UNWRITTEN
            same = (wl == lanes) | (wl == ALL_LANES)
            if (written & ~same).any():
                scope = max(scope, UNIT)
    return scope


def uncovered_reads(graph: GIRGraph) -> list[str]:
    """Static race check: for every read, the widest Sync on its buffer between the writer and
    the reader must cover the scope the pair needs. Returns one line per violation."""
    events: dict[str, list] = {}  # per buffer, in program order: (node, op) of writers and syncs
    problems = []
    for r, rop in graph.ops():
        if isinstance(rop, Sync):
            events.setdefault(rop.slice.buffer, []).append((r, rop))
            continue
        for s in rop.reads():
            for w, wop, have in _writers_before(events.get(s.buffer, ())):
                need = required_scope(graph, w, r) if have < DEVICE else DEVICE  # nothing is wider
                if need > have:
                    problems.append(f"#{r} {rop.kind} reads {s.buffer} written by #{w} {wop.kind}: needs "
                                    f"{SCOPE_NAMES[need]} sync, has {SCOPE_NAMES[have]}")
        for name in dict.fromkeys(ws.buffer for ws in rop.writes()):
            events.setdefault(name, []).append((r, rop))
    return problems


def _writers_before(events: list) -> list[tuple]:
    """(node, op, widest sync scope after it) for each writer among the events of one buffer
    that precede a read, in program order; walking backwards gathers the syncs in between."""
    have, found = LANE, []
    for node, op in reversed(events):
        if isinstance(op, Sync):
            have = max(have, op.scope)
        else:
            found.append((node, op, have))
    return found[::-1]
