"""Who touches what: the element-level access maps shared by the interpreter, the sync-scope
analysis and the validator, so all three agree on one definition of "unit u, lane l reads
element e of buffer B"."""
from __future__ import annotations

import numpy as np

from .gops import GOp, Reduce
from .slices import Buffer
from .target import BLOCK, DEVICE, LANE, REGISTER, SHARED, UNIT

HOST = -3       # writer id of model inputs and constants: visible everywhere
UNWRITTEN = -2  # writer id of an element nobody wrote (or whose value is undefined)
ALL_LANES = -1  # lane id of uniform (replicated) values and of readers that are every lane


def output_lanes(op: GOp, lanes_per_unit: int) -> np.ndarray:
    out = op.writes()[0]
    return op.lane_of_output(np.arange(out.size, dtype=np.int64), lanes_per_unit)


def read_pairs(op: GOp, read_index: int, lanes_per_unit: int):
    """(source element j, reading lane, consuming output k) for every element the op reads
    through reads()[read_index]."""
    lanes = output_lanes(op, lanes_per_unit)
    if isinstance(op, Reduce):
        j = np.arange(op.src.size, dtype=np.int64)
        k = j // op.group
        return j, lanes[k], k
    k = np.arange(op.writes()[0].size, dtype=np.int64)
    return op.source_index(read_index, k), lanes, k


def storage_index(buf: Buffer, addrs: np.ndarray, env: dict) -> tuple:
    """Index into a buffer's simulated storage: one array per device (dram), one row per
    block (shared), one row per unit (register)."""
    if buf.level == REGISTER:
        return (np.broadcast_to(env["u"][:, None], addrs.shape), addrs)
    if buf.level == SHARED:
        return (np.broadcast_to(env["b"][:, None], addrs.shape), addrs)
    return (addrs,)


def needed_scope(writer_unit, writer_lane, reader_unit, reader_lane, units_per_block: int) -> np.ndarray:
    """The narrowest sync scope that makes a write visible to a read, element by element:
    same unit and lane (or a replicated value) -> lane; same unit -> unit; same block ->
    block; otherwise device. Host-written data is visible everywhere."""
    same_unit = writer_unit == reader_unit
    same_lane = same_unit & ((writer_lane == reader_lane) | (writer_lane == ALL_LANES))
    same_block = (writer_unit // units_per_block) == (reader_unit // units_per_block)
    need = np.where(same_lane, LANE, np.where(same_unit, UNIT, np.where(same_block, BLOCK, DEVICE)))
    return np.where(writer_unit == HOST, LANE, need)
