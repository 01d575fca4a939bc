"""Reference interpreter: the oracle for templates, rewrites and emitters.

Runs a GIR-Graph for every parallel unit at once (numpy over units), with registers
simulated per unit, shared memory per block and DRAM per device. For every element it
records who wrote it (unit, lane, gOperator) and at which scope a Sync has made it visible,
so a read that needs a wider sync than it got is reported as a race naming both gOperators.
It also counts the bytes read and written at each memory level.

Undefined values (a masked load without a fill) propagate like poison through registers and
are an error only where they could matter: stored to shared memory or DRAM, or reduced.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from .access import ALL_LANES, HOST, UNWRITTEN, needed_scope, read_pairs, storage_index, output_lanes
from .dtypes import HALF_NP, accumulator, np_dtype
from .expr import evaluate
from .gops import Broadcast, Elementwise, Gather, Move, Reduce, Sync, reduce_identity
from .graph import GIRGraph
from .slices import Buffer, Slice
from .target import DRAM, REGISTER, SCOPE_NAMES


class InterpreterError(RuntimeError):
    """A GIR-Graph did something undefined: a race, an out-of-bounds access, a lost value."""


class GatherRangeError(InterpreterError, IndexError):
    """A Gather index outside [-extent, extent): the model's input is wrong, not GIR."""


class RaceError(InterpreterError):
    pass


@dataclass
class Stats:
    bytes: dict = field(default_factory=lambda: defaultdict(lambda: {"read": 0, "write": 0}))
    syncs: dict = field(default_factory=lambda: defaultdict(int))
    flops: int = 0

    def dram_bytes(self) -> int:
        return self.bytes[DRAM]["read"] + self.bytes[DRAM]["write"]

    def as_dict(self) -> dict:
        return {"bytes": {k: dict(v) for k, v in self.bytes.items()}, "syncs": dict(self.syncs), "flops": self.flops}


@dataclass
class Result:
    outputs: dict[str, np.ndarray]
    stats: Stats
    written: dict[str, np.ndarray] = field(default_factory=dict)  # per output: which elements were written


class _Storage:
    """Values plus, per element, its writer (unit, lane, gOperator) and its visible scope."""

    def __init__(self, buf: Buffer, rows: int | None):
        shape = (buf.size,) if rows is None else (rows, buf.size)
        self.buf = buf
        self.data = np.zeros(shape, dtype=np_dtype(buf.dtype))
        self.unit = np.full(shape, UNWRITTEN, dtype=np.int64)
        self.lane = np.zeros(shape, dtype=np.int64)
        self.op = np.full(shape, -1, dtype=np.int64)
        self.vis = np.zeros(shape, dtype=np.int8)


class Interpreter:
    def __init__(self, graph: GIRGraph, check_races: bool = True, complete: bool = True):
        self.g = graph
        self.check_races = check_races
        self.complete = complete
        self.env = graph.prim.env()
        self.lanes = graph.target.lanes_per_unit
        self.upb = graph.prim.units_per_block
        self.units = graph.prim.num_units
        self.stats = Stats()

    # -- public -----------------------------------------------------------------------
    def run(self, feeds: dict[str, np.ndarray]) -> Result:
        self.mem = {name: self._allocate(buf, feeds) for name, buf in self.g.buffers.items()}
        for node, op in self.g.ops():
            self._execute(node, op)
        outputs, written = {}, {}
        for buf in self.g.role_buffers("output"):
            st = self.mem[buf.name]
            missing = int((st.unit == UNWRITTEN).sum())
            written[buf.name] = (st.unit != UNWRITTEN).reshape(buf.shape or (buf.size,))
            if missing and self.complete:
                first = int(np.argmax(st.unit == UNWRITTEN))
                raise InterpreterError(f"{self.g.name}: output {buf.name!r} has {missing} of {buf.size} elements never written (first: {first})")
            outputs[buf.name] = st.data.reshape(buf.shape or (buf.size,)).copy()
        return Result(outputs, self.stats, written)

    # -- storage ----------------------------------------------------------------------
    def _allocate(self, buf: Buffer, feeds) -> _Storage:
        rows = None if buf.level == DRAM else self.units if buf.level == REGISTER else self.g.prim.num_blocks
        st = _Storage(buf, rows)
        if buf.role in ("input", "const"):
            if buf.name not in feeds:
                raise InterpreterError(f"{self.g.name}: no value fed for {buf.role} {buf.name!r}")
            value = np.asarray(feeds[buf.name])
            if value.size != buf.size:
                raise InterpreterError(f"{self.g.name}: {buf.name!r} expects {buf.size} elements ({buf.shape}), got shape {value.shape}")
            st.data[:] = value.reshape(-1).astype(st.data.dtype)
            st.unit[:] = HOST
        return st

    def _addresses(self, s: Slice, what: str, node: int, shift: np.ndarray | None = None):
        st = self.mem[s.buffer]
        addrs = s.addresses(self.env) if shift is None else s.addresses(self.env) + shift
        valid = s.valid(self.env)
        bad = valid & ((addrs < 0) | (addrs >= st.buf.size))
        if bad.any():
            u, e = map(int, np.argwhere(bad)[0])
            raise InterpreterError(f"{self.g.name}: gOperator #{node} {what} {s} out of bounds at unit {u}: "
                                   f"address {int(addrs[u, e])} not in [0, {st.buf.size})")
        return st, np.where(valid, addrs, 0), valid

    def _gather(self, node: int, op, i: int, s: Slice, shift: np.ndarray | None = None):
        st, addrs, valid = self._addresses(s, "reads", node, shift)
        idx = storage_index(st.buf, addrs, self.env)
        values = st.data[idx]
        defined = st.unit[idx] != UNWRITTEN
        self.stats.bytes[st.buf.level]["read"] += int(valid.sum()) * st.data.itemsize
        if self.check_races:
            self._check_visibility(node, op, i, s, st, idx, valid & defined)
        return values, valid, defined

    def _check_visibility(self, node, op, i, s, st, idx, checked):
        j, lanes, _ = read_pairs(op, i, self.lanes)
        wu, wl, vis = st.unit[idx][:, j], st.lane[idx][:, j], st.vis[idx][:, j]
        need = needed_scope(wu, wl, self.env["u"][:, None], lanes[None, :], self.upb)
        bad = checked[:, j] & (vis < need)
        if not bad.any():
            return
        u, m = map(int, np.argwhere(bad)[0])
        elem = int(j[m])
        writer = int(st.op[idx][u, elem])
        wlane = int(wl[u, m])
        raise RaceError(
            f"{self.g.name}: race on {st.buf.level} buffer {s.buffer!r}: gOperator #{node} {op.kind} "
            f"(unit {u}, lane {'all' if lanes[m] == ALL_LANES else int(lanes[m])}) reads element {elem} of {s} "
            f"written by gOperator #{writer} {self.g.op(writer).kind} (unit {int(wu[u, m])}, lane "
            f"{'all' if wlane == ALL_LANES else wlane}) without a covering Sync({SCOPE_NAMES[int(need[u, m])]})")

    def _scatter(self, node: int, op, values: np.ndarray, defined: np.ndarray):
        s = op.writes()[0]
        st, addrs, valid = self._addresses(s, "writes", node)
        lanes = np.broadcast_to(output_lanes(op, self.lanes)[None, :], addrs.shape)
        ok = valid & defined
        if st.buf.level != REGISTER and (valid & ~defined).any():
            u, e = map(int, np.argwhere(valid & ~defined)[0])
            raise InterpreterError(f"{self.g.name}: gOperator #{node} {op.kind} stores an undefined value "
                                   f"(a masked load without fill) to {s} at unit {u}, element {e}")
        if st.buf.level != REGISTER:
            self._check_single_writer(node, s, st, addrs, ok)
        idx = storage_index(st.buf, addrs, self.env)
        sel = tuple(ix[ok] for ix in idx)
        st.data[sel] = values[ok].astype(st.data.dtype)
        st.unit[sel] = np.broadcast_to(self.env["u"][:, None], addrs.shape)[ok]
        st.lane[sel] = lanes[ok]
        st.op[sel] = node
        st.vis[sel] = 0
        lost = tuple(ix[valid & ~defined] for ix in idx)
        st.unit[lost] = UNWRITTEN
        self.stats.bytes[st.buf.level]["write"] += int(valid.sum()) * st.data.itemsize

    def _check_single_writer(self, node, s, st, addrs, ok):
        rows = self.env["b"] if st.buf.level != DRAM else np.zeros(self.units, dtype=np.int64)
        keys = (np.broadcast_to(rows[:, None], addrs.shape)[ok] * st.buf.size + addrs[ok])
        uniq, counts = np.unique(keys, return_counts=True)
        if (counts > 1).any():
            addr = int(uniq[counts > 1][0] % st.buf.size)
            raise InterpreterError(f"{self.g.name}: gOperator #{node} writes element {addr} of {s.buffer!r} "
                                   f"more than once (two units or a repeating slice)")

    # -- gOperators ---------------------------------------------------------------------
    def _execute(self, node: int, op) -> None:
        if isinstance(op, Sync):
            return self._sync(node, op)
        if isinstance(op, Gather):
            return self._indirect(node, op)
        reads = [self._gather(node, op, i, s) for i, s in enumerate(op.reads())]
        if isinstance(op, Move):
            values, valid, defined = reads[0]
            if op.fill is not None:
                values = np.where(valid, values, np.asarray(op.fill).astype(values.dtype))
                defined = defined | ~valid
            else:
                defined = defined & valid
            return self._scatter(node, op, values, defined)
        if isinstance(op, Broadcast):
            values, valid, defined = reads[0]
            k = np.arange(op.dst.size)
            src = op.source_index(0, k)
            return self._scatter(node, op, values[:, src], (defined & valid)[:, src])
        if isinstance(op, Elementwise):
            arrays = [r[0].astype(np.float32) if r[0].dtype in HALF_NP else r[0] for r in reads]
            defined = np.logical_and.reduce([r[1] & r[2] for r in reads]) if reads else np.ones((self.units, op.out.size), bool)
            out = evaluate(op.expr, arrays, op.compute_dtype) if arrays else evaluate(op.expr, [], op.compute_dtype)
            out = np.broadcast_to(out, (self.units, op.out.size))
            self.stats.flops += op.flops_per_output() * int(defined.sum())
            return self._scatter(node, op, out, defined)
        if isinstance(op, Reduce):
            return self._reduce(node, op, *reads[0])
        raise InterpreterError(f"{self.g.name}: no interpreter rule for gOperator {op.kind}")

    def _indirect(self, node, op: Gather):
        index, ivalid, idefined = self._gather(node, op, 1, op.index)
        if not (ivalid & idefined).all():
            raise InterpreterError(f"{self.g.name}: gOperator #{node} Gather uses undefined indices from {op.index}")
        index = index.astype(np.int64)
        index = np.where(index < 0, index + op.extent, index)
        if ((index < 0) | (index >= op.extent)).any():
            bad = int(index[(index < 0) | (index >= op.extent)][0])
            raise GatherRangeError(f"{self.g.name}: gOperator #{node} Gather index {bad} outside [-{op.extent}, {op.extent})")
        shift = index[:, np.arange(op.dst.size) // op.group] * op.stride
        values, valid, defined = self._gather(node, op, 0, op.src, shift)
        return self._scatter(node, op, values, defined & valid)

    def _reduce(self, node, op: Reduce, values, valid, defined):
        acc = np_dtype(accumulator(self.g.buffers[op.dst.buffer].dtype))
        bad = valid & ~defined
        if bad.any():
            u, e = map(int, np.argwhere(bad)[0])
            raise InterpreterError(f"{self.g.name}: gOperator #{node} Reduce({op.op}) reads an undefined element {e} "
                                   f"of {op.src} at unit {u} (a masked load needs fill={reduce_identity(op.op, acc.name)})")
        x = np.where(valid, values.astype(acc), np.asarray(reduce_identity(op.op, acc.name)).astype(acc))
        x = x.reshape(self.units, op.dst.size, op.group)
        out = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[op.op](x, axis=2)
        self.stats.flops += op.src.size * self.units
        return self._scatter(node, op, out, np.ones_like(out, dtype=bool))

    def _sync(self, node: int, op: Sync) -> None:
        st, addrs, valid = self._addresses(op.slice, "syncs", node)
        carried = self.g.target.level(st.buf.level).scope
        if op.scope > carried:
            raise InterpreterError(f"{self.g.name}: gOperator #{node} Sync({SCOPE_NAMES[op.scope]}) on {st.buf.level} "
                                   f"buffer {op.slice.buffer!r}: {st.buf.level} memory is shared only within a "
                                   f"{SCOPE_NAMES[carried]}")
        idx = storage_index(st.buf, addrs, self.env)
        sel = tuple(ix[valid] for ix in idx)
        st.vis[sel] = np.maximum(st.vis[sel], op.scope)
        self.stats.syncs[SCOPE_NAMES[op.scope]] += 1


def run(graph: GIRGraph, feeds: dict[str, np.ndarray], check_races: bool = True, complete: bool = True) -> Result:
    """`complete=False` allows outputs that this graph writes only partly (several kernels
    writing disjoint parts of one tensor); `Result.written` tells which elements it wrote."""
    return Interpreter(graph, check_races, complete).run(feeds)
