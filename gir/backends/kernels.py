"""Kernel formation: a GIR-Graph becomes one kernel per stretch of program order between
device syncs. A Sync(DEVICE) is a kernel boundary and nothing else, so every kernel of a graph
runs the graph's parallel primitive; its parameters are the DRAM buffers its gOperators touch.

Registers and shared memory do not survive a kernel boundary, while the interpreter keeps a
unit's registers across a device sync: register values that cross one are recomputed in the
kernel that uses them, and values that cannot be are rejected here rather than read as garbage.
"""
from __future__ import annotations

import hashlib
import re
import warnings
from dataclasses import dataclass, field, replace

import numpy as np

from gir.frontend.basic import BasicOp
from gir.ir import DRAM, SHARED, GIRGraph, Sync
from gir.ir.affine import ParallelPrimitive
from gir.ir.dtypes import np_dtype, np_is_float
from gir.ir.gops import Gather, GOp
from gir.ir.slices import Buffer
from gir.ir.stretches import kernel_dram_buffers, kernel_stretches, touched

from .errors import IndexOutOfRange, ResourceError, SpillWarning

GATHER_FLAG = "gir_oob"  # the GPU dialects' last parameter of a kernel that gathers (Kernel.gathers)


def gather_flags(kernels) -> dict[str, np.ndarray]:
    """A zeroed int32 flag per kernel that gathers, by kernel name (the extra argument)."""
    return {k.name: np.zeros(1, np.int32) for k in kernels if k.gathers}


def check_gather_flag(kernel_name: str, flag) -> None:
    """IndexOutOfRange where the kernel reported a clamped Gather index."""
    if int(np.asarray(flag).reshape(-1)[0]):
        raise IndexOutOfRange(f"{kernel_name}: a Gather index is outside [-n, n) of the axis it selects from")


class EmitError(ValueError):
    """The graph uses something an emitter cannot express (the message says what and where)."""


@dataclass
class Kernel:
    name: str
    ops: list[tuple[int, GOp]]            # (graph node, gOperator) in program order, no device syncs
    params: tuple[Buffer, ...]            # DRAM buffers read or written, in declaration order
    grid: tuple[int, ...]                 # the primitive's block grid (b0 outermost); launched as 1-D
    block_threads: int                    # units_per_block * lanes_per_unit
    shared_bytes: int                     # static shared memory of this kernel
    prim: ParallelPrimitive = None
    buffers: dict[str, Buffer] = field(default_factory=dict)  # every buffer the kernel touches
    written: frozenset = frozenset()      # names of the DRAM parameters this kernel writes
    graph: GIRGraph = field(default=None, repr=False)

    @property
    def num_blocks(self) -> int:
        return self.prim.num_blocks

    @property
    def gathers(self) -> bool:
        """Whether the kernel runs a Gather: in the GPU dialects it then takes one more
        parameter after `params`, GATHER_FLAG, an int the kernel sets to 1 where an index
        was out of range (a kernel cannot raise; the caller zeroes it and reads it back)."""
        return any(isinstance(op, Gather) for _, op in self.ops)

    def is_written(self, name: str) -> bool:
        return name in self.written


def c_identifier(text: str) -> str:
    ident = re.sub(r"\W", "_", text).strip("_") or "k"
    return ident if not ident[0].isdigit() else "k" + ident


def split_kernels(graph: GIRGraph) -> list[Kernel]:
    """Kernels in launch order. Empty stretches (two device syncs in a row) make no kernel."""
    stretches = kernel_stretches(graph)
    _recompute_crossing_values(graph, stretches)
    base = c_identifier(graph.name)
    if len(base) > 40:  # fused graphs are named after all their operators
        base = f"{base[:32]}_{hashlib.sha1(base.encode()).hexdigest()[:6]}"
    lanes = graph.target.lanes_per_unit
    kernels = []
    for i, ops in enumerate(stretches):
        names = {s.buffer for _, op in ops for s in touched(op)}
        written = {s.buffer for _, op in ops if not isinstance(op, Sync) for s in op.writes()}
        params = tuple(kernel_dram_buffers(graph, ops))
        shared = sum(b.nbytes for b in graph.buffers.values() if b.name in names and b.level == SHARED)
        kernels.append(Kernel(f"{base}_k{i}", ops, params, graph.prim.grid, graph.prim.units_per_block * lanes,
                              shared, graph.prim, {n: b for n, b in graph.buffers.items() if n in names},
                              frozenset(written & {b.name for b in params}), graph))
    return kernels


@dataclass(eq=False)
class _Write:
    """One execution of a gOperator writing a local buffer, with the writes it consumed."""
    kernel: int
    pos: int
    node: int
    op: GOp
    deps: list


def _recompute_crossing_values(graph: GIRGraph, stretches) -> None:
    """The interpreter keeps a unit's registers across a device sync; a kernel boundary does not.
    Fusion and rewriting leave register values live across device syncs (a later part's load
    placed before the sync, a merged intermediate kept in registers). Such a value is recomputed
    at the start of the kernel that reads it: its writer and, recursively, the writers of its
    register inputs are issued again, provided the DRAM they read is unchanged since. Values in
    shared memory, or from DRAM that changed, cannot be recomputed and are an error."""
    last: dict[str, _Write] = {}
    dram_writes: dict[str, list[int]] = {}
    pos = 0

    def reissue(w: _Write, i: int, start: int, holds: dict, out: list) -> None:
        for s in w.op.reads():
            if graph.buffers[s.buffer].level == DRAM and any(w.pos < q <= start for q in dram_writes.get(s.buffer, ())):
                raise EmitError(f"{graph.name}: cannot recompute #{w.node} {w.op.kind} in kernel {i}: "
                                f"{s.buffer!r} changed after it was read")
        for d in w.deps:
            if holds.get(d.op.writes()[0].buffer) is not d:
                reissue(d, i, start, holds, out)
        out.append((w.node, w.op))
        holds[w.op.writes()[0].buffer] = w

    for i, ops in enumerate(stretches):
        start, prefix, holds = pos, [], {}
        for node, op in ops:
            pos += 1
            if isinstance(op, Sync):
                continue
            deps = []
            for s in op.reads():
                level = graph.buffers[s.buffer].level
                w = last.get(s.buffer)
                if level == DRAM or w is None:
                    continue
                if w.kernel != i:
                    bad = [x for x in _chain(w) if graph.buffers[x.op.writes()[0].buffer].level == SHARED]
                    if bad:
                        raise EmitError(f"{graph.name}: gOperator #{node} {op.kind} reads {s.buffer!r}, which needs "
                                        f"shared memory written before a device sync (#{bad[0].node})")
                    reissue(w, i, start, holds, prefix)
                    w = last[s.buffer] = _Write(i, start, w.node, w.op, w.deps)
                deps.append(w)
            for s in op.writes():
                if graph.buffers[s.buffer].level == DRAM:
                    dram_writes.setdefault(s.buffer, []).append(pos)
                else:
                    last[s.buffer] = _Write(i, pos, node, op, deps)
        stretches[i] = prefix + ops


def _chain(w: _Write):
    """w and every write it transitively consumed, each once."""
    seen, todo = set(), [w]
    while todo:
        x = todo.pop()
        if id(x) not in seen:
            seen.add(id(x))
            yield x
            todo += x.deps


@dataclass
class CompiledGraph:
    """Emitted source, its kernels in launch order, and the compiler's binary."""
    source: str
    kernels: list[Kernel]
    binary: object


def check_shared(kernels: list[Kernel], target, static_limit: int | None = None) -> None:
    """Before compiling: one-line ResourceError for a kernel whose shared memory cannot fit."""
    for k in kernels:
        if k.shared_bytes > target.shared_bytes_per_block:
            raise ResourceError(f"kernel {k.name} needs {k.shared_bytes} bytes of shared memory per block; "
                                f"{target.name} allows {target.shared_bytes_per_block}")
        if static_limit is not None and k.shared_bytes > static_limit:
            raise ResourceError(f"kernel {k.name} needs {k.shared_bytes} bytes of static shared memory; "
                                f"the limit is {static_limit} (dynamic shared memory is not emitted)")


def check_resources(kernels: list[Kernel], resources: dict, target, spills: str = "error") -> None:
    """After compiling: a kernel that spills registers is a one-line ResourceError (`spills`
    "error", what the emitter tests ask), or a SpillWarning ("warn", what builds ask: the
    kernel still runs)."""
    for k in kernels:
        res = resources.get(k.name)
        if res is not None and res.spilled:
            what = (f"kernel {k.name} spills registers on {target.arch} "
                    f"({res.registers} registers, {res.stack_bytes} bytes of stack)")
            if spills == "error":
                raise ResourceError(what)
            warnings.warn(SpillWarning(f"{what}: it runs, slower"), stacklevel=2)


def unit_name(graph: GIRGraph, kernels: list[Kernel]) -> str:
    """The compiled unit's file name: its first kernel's, or the graph's where every op of the
    step was elided (an Identity, a one-input Sum: nothing to launch, the prelude alone)."""
    return kernels[0].name if kernels else "".join(c if c.isalnum() else "_" for c in graph.name)[:60] or "empty"


def emit_graph(emitter, graph: GIRGraph) -> tuple[str, list[Kernel]]:
    """One translation unit with every kernel of the graph (the prelude once)."""
    if emitter.L != graph.target.lanes_per_unit:
        raise EmitError(f"{graph.name} was built for {graph.target.lanes_per_unit} lanes per unit; "
                        f"{emitter.target.name} has {emitter.L}")
    kernels = split_kernels(graph)
    return emitter.prelude() + "".join("\n" + emitter.kernel_source(k) for k in kernels), kernels


def allocate_dram(graph: GIRGraph, feeds: dict) -> dict:
    """Flat numpy arrays for every DRAM buffer: inputs and constants from `feeds`, the rest
    poisoned (NaN, or the most negative integer) so an element no kernel writes shows up. An
    output given in `feeds` starts from that value instead (a graph that writes only part of a
    tensor another graph wrote before)."""
    arrays = {}
    for buf in graph.buffers.values():
        if buf.level != DRAM:
            continue
        dt = np_dtype(buf.dtype)
        if buf.role in ("input", "const") and buf.name not in feeds:
            raise KeyError(f"{graph.name}: no value fed for {buf.role} {buf.name!r}")
        if buf.name in feeds:
            value = np.asarray(feeds[buf.name])
            if value.size != buf.size:
                raise ValueError(f"{graph.name}: {buf.name!r} expects {buf.size} elements, got shape {value.shape}")
            arrays[buf.name] = np.ascontiguousarray(value.reshape(-1).astype(dt))
        else:
            poison = np.nan if np_is_float(dt) else np.iinfo(dt).min if dt.kind in "iu" else False
            arrays[buf.name] = np.full(buf.size, poison, dt)
    return arrays


GUARD = 4096  # bytes of 0xFF around each DRAM buffer a backend launches on (NaN or -1 when read)


class OutOfBoundsError(RuntimeError):
    """An emitted kernel wrote outside a DRAM buffer (seen in the guard bytes around it)."""


def with_guards(a: np.ndarray) -> np.ndarray:
    """The bytes of `a` between GUARD bytes of 0xFF on each side: a stray write shows up."""
    raw = np.full(a.nbytes + 2 * GUARD, 0xFF, np.uint8)
    raw[GUARD:GUARD + a.nbytes] = a.view(np.uint8)
    return raw


def check_guards(raw: np.ndarray, nbytes: int, kernel: str, buffer: str) -> None:
    if (raw[:GUARD] != 0xFF).any() or (raw[GUARD + nbytes:] != 0xFF).any():
        raise OutOfBoundsError(f"kernel {kernel} wrote outside DRAM buffer {buffer!r}")


def collect_outputs(graph: GIRGraph, arrays: dict) -> dict:
    return {b.name: arrays[b.name].reshape(b.shape or (b.size,)).copy() for b in graph.role_buffers("output")}


def plan_launches(plan) -> list:
    """The launches in plan order: library ops as BasicOps, kernels as (step index, Kernel)
    with names unique in the plan."""
    launches = []
    for i, step in enumerate(plan.steps):
        if isinstance(step, BasicOp):
            launches.append(step)
            continue
        launches += [(i, replace(k, name=f"s{i}_{k.name}")) for k in split_kernels(step.graph)]
    return launches


def emit_plan(emitter, plan, launches: list | None = None) -> tuple[str, list]:
    """One translation unit with every kernel of the plan, and its launches (`plan_launches`)."""
    launches = plan_launches(plan) if launches is None else launches
    sources = [emitter.prelude()] + [emitter.kernel_source(launch[1]) for launch in launches if not isinstance(launch, BasicOp)]
    return "\n".join(sources), launches
