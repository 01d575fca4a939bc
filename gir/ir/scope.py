"""Sync-scope analysis: the narrowest sync that makes one gOperator's writes visible to
another's reads, computed by enumerating which unit and lane writes and reads every element
(static shapes make this exact and cheap), never guessed from op types.

lane   -> nothing to do, the value stays in the lane's registers
unit   -> warp/wavefront shuffle (registers) or syncwarp (shared)
block  -> shared memory + barrier
device -> DRAM and a kernel boundary
"""
from __future__ import annotations

import numpy as np

from .access import ALL_LANES, UNWRITTEN, needed_scope, output_lanes, read_pairs, storage_index
from .graph import GIRGraph
from .target import LANE, REGISTER, SHARED


def required_scope(graph: GIRGraph, writer: int, reader: int) -> int:
    """Widest scope needed over every element `reader` reads from what `writer` wrote."""
    wop, rop = graph.op(writer), graph.op(reader)
    env, lanes_per_unit = graph.prim.env(), graph.target.lanes_per_unit
    units, upb = graph.prim.num_units, graph.prim.units_per_block
    scope = LANE
    for ws in wop.writes():
        buf = graph.buffers[ws.buffer]
        rows = units if buf.level == REGISTER else graph.prim.num_blocks if buf.level == SHARED else None
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
