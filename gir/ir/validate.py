"""Static checks of a GIR-Graph: every problem is collected and reported at once, each naming
the gOperator and slice involved, so a template or rewrite bug is found where it is made."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .access import output_lanes
from .dtypes import accumulator, itemsize
from .expr import Call, postorder
from .gops import COMPUTE, Broadcast, Elementwise, Move, Reduce, Sync
from .slices import Slice
from .graph import GIRGraph
from .target import DEVICE, DRAM, REGISTER, SCOPE_NAMES, SHARED


class GraphError(ValueError):
    """A GIR-Graph that breaks an IR rule; the message lists every problem found."""


def register_bytes_per_lane(graph: GIRGraph, skip: frozenset = frozenset()) -> int:
    """Peak register bytes one lane holds, over the program order (buffers live from first
    write to last read). `skip`: buffers the emitter never materialises (the time model's
    spill term leaves out the product a reduction computes in its own loop)."""
    ops = graph.ops()
    first, last, per_lane = {}, {}, {}
    lanes = graph.target.lanes_per_unit
    for pos, (_, op) in enumerate(ops):
        if isinstance(op, Sync):
            continue
        for s in op.reads():
            last[s.buffer] = pos
        for s in op.writes():
            buf = graph.buffers[s.buffer]
            if buf.level != REGISTER or s.buffer in skip:
                continue
            first.setdefault(s.buffer, pos)
            last.setdefault(s.buffer, pos)
            held = s.size if op.uniform else _most_per_lane(op, lanes)
            word = max(itemsize(buf.dtype), 4)  # an fp16 or bool value still takes a 32-bit register
            per_lane[s.buffer] = max(per_lane.get(s.buffer, 0), held * word)
    change = [0] * (len(ops) + 1)  # live bytes change at first write and after last read
    for b, size in per_lane.items():
        if first[b] <= last[b]:
            change[first[b]] += size
            change[last[b] + 1] -= size
    live = peak = 0
    for step in change:  # a Python loop: the graphs are small and numpy's call costs more
        live += step
        peak = max(peak, live)
    return peak


# Calls the compilers do not sink into their consumers: an op over all of a lane's elements
# with one of these finishes every element before the next op starts, its inputs and results
# all held (the transcendental and division paths of gir/fusion/perf.py OP_COST).
HELD_CALLS = frozenset({"div", "recip", "sqrt", "rsqrt", "exp", "log", "tanh", "erf", "sigmoid", "pow",
                        "sin", "cos", "mod"})


def streamed_loads(graph: GIRGraph) -> frozenset:
    """Register buffers that only stream, which do not count against a block's register budget:
    NVCC folds each value into its consumer as it arrives instead of holding the array.
    - A load from DRAM that one Reduce alone reads (a 137-float block-reduction row compiles to
      32 registers on sm_90).
    - Where no elementwise op calls a transcendental or a division (HELD_CALLS), also a load or
      elementwise result read by at most one computing operation, a Reduce or another such
      value, besides copies out to DRAM or shared memory (relu of 4000 floats a warp, stored and
      summed, in a 512-thread block: 32 registers).
    EfficientNet-B0's x * sigmoid(x) with its channel sums held 780 bytes a lane and spilled at
    the 128 registers of a 512-thread block: every sigmoid is computed before the first product."""
    ops = [op for _, op in graph.ops() if not isinstance(op, Sync)]
    users, writers = {}, {}
    for op in ops:
        for s in op.reads():
            users.setdefault(s.buffer, []).append(op)
        for s in op.writes():
            writers[s.buffer] = writers.get(s.buffer, 0) + 1
    loads = {op.dst.buffer for op in ops if isinstance(op, Move) and graph.buffers[op.src.buffer].level == DRAM}
    single = {b for b, us in users.items() if writers.get(b) == 1 and graph.buffers[b].level == REGISTER}
    by_reduce = {b for b in loads & single if len(users[b]) == 1 and isinstance(users[b][0], Reduce)}
    if any(isinstance(op, Elementwise) and any(isinstance(e, Call) and e.op in HELD_CALLS for e in postorder(op.expr))
           for op in ops):
        return frozenset(by_reduce)

    def copy_out(op) -> bool:
        return isinstance(op, Move) and graph.buffers[op.dst.buffer].level != REGISTER
    streamed: set[str] = set()
    for op in reversed(ops):  # a reader comes after its producer: its own output is decided first
        for s in op.reads():
            b = s.buffer
            if b not in single or b in streamed:
                continue
            computing = [u for u in users[b] if not copy_out(u)]
            if not computing or len(computing) == 1 and (isinstance(computing[0], Reduce) or
                                                         isinstance(computing[0], (Elementwise, Move)) and
                                                         computing[0].writes()[0].buffer in streamed):
                streamed.add(b)
    producers = loads | {op.writes()[0].buffer for op in ops if isinstance(op, Elementwise) or
                         isinstance(op, Move) and graph.buffers[op.src.buffer].level == REGISTER}
    return frozenset(by_reduce | (streamed & producers))


@lru_cache(maxsize=8192)
def _most_per_lane(op, lanes: int) -> int:
    """Outputs the busiest lane of a non-uniform gOperator holds (cached: gOperators are
    immutable and re-validated after every rewrite)."""
    return int(np.bincount(output_lanes(op, lanes)).max())


def shared_bytes_per_block(graph: GIRGraph) -> int:
    return sum(b.nbytes for b in graph.buffers.values() if b.level == SHARED)


def affine_range(expr, prim) -> tuple[int, int]:
    """Exact min and max of an affine expression in block coordinates and w over the grid."""
    extent = {f"b{i}": n for i, n in enumerate(prim.grid)} | {"w": prim.units_per_block}
    lo = hi = expr.const
    for name, coef in expr.terms:
        top = coef * (extent[name] - 1)
        lo, hi = lo + min(0, top), hi + max(0, top)
    return lo, hi


def tidy_slice(s: Slice, prim) -> Slice:
    """s without the bounds that hold for every unit of `prim`, compared over the grid by their
    exact range (no per-unit evaluation); the rewriter's tidy pass, the time model and the
    CPU emitter's forms all ask it."""
    if not s.is_masked:
        return s
    limits = list(s.limits) or [None] * len(s.shape)
    starts = list(s.starts) or [None] * len(s.shape)
    for d, n in enumerate(s.shape):
        if limits[d] is not None and affine_range(prim.normalize(limits[d]), prim)[0] >= n:
            limits[d] = None
        if starts[d] is not None and affine_range(prim.normalize(starts[d]), prim)[1] <= 0:
            starts[d] = None
    return Slice(s.buffer, s.offset, s.shape, s.strides, tuple(limits), tuple(starts))


@lru_cache(maxsize=8192)
def _out_of_bounds(s, size: int, prim) -> tuple[int, int] | None:
    """First (unit, address) outside [0, size), or None; cached because rewrites re-validate
    mostly unchanged slices."""
    if not s.is_masked:
        lo, hi = affine_range(prim.normalize(s.offset), prim)
        if lo + int(s.pattern.min()) >= 0 and hi + int(s.pattern.max()) < size:
            return None
    env = prim.env()
    extent = s.address_range(env)
    if extent is None or (extent[0] >= 0 and extent[1] < size):
        return None
    addrs, valid = s.addresses(env), s.valid(env)
    oob = valid & ((addrs < 0) | (addrs >= size))
    if not oob.any():
        return None
    u, e = map(int, np.argwhere(oob)[0])
    return u, int(addrs[u, e])


def validate(graph: GIRGraph, bounds: bool = True, streams: bool = False) -> None:
    """Raise GraphError listing every problem. `bounds=False` skips the address-range check,
    the one check whose cost grows with the number of units: template admission uses it, since
    a candidate's bounds are checked where it is used (the rewrite driver validates its input).
    `streams`: the graph's product will stream into a reduction once fused (a lane-runs box,
    `pointwise.row_runs`): its per-thread register limit leaves streamed values out, as for a
    graph that reduces."""
    problems: list[str] = []
    tgt, prim = graph.target, graph.prim
    ops = graph.ops()
    undeclared = sorted({s.buffer for _, op in ops for s in ([op.slice] if isinstance(op, Sync) else
                         [*op.reads(), *op.writes()]) if s.buffer not in graph.buffers})
    if undeclared:
        raise GraphError(f"{graph.name}: invalid GIR-Graph:\n  uses undeclared buffers {undeclared}")
    if not graph.edges_follow_order():
        problems.append("the dataflow graph has an edge against program order (a cycle)")
    if prim.units_per_block > tgt.max_units_per_block:
        problems.append(f"{prim.units_per_block} units per block exceed {tgt.name}'s {tgt.max_units_per_block}")
    written = set()
    for node, op in ops:
        where = f"#{node} {op.kind}"
        if not isinstance(op, Sync):
            unwritten = sorted({s.buffer for s in op.reads() if graph.buffers[s.buffer].role == "temp"} - written)
            if unwritten:
                problems.append(f"{where}: reads {', '.join(unwritten)} before anything writes it")
            written |= {s.buffer for s in op.writes()}
        slices = [op.slice] if isinstance(op, Sync) else [*op.reads(), *op.writes()]
        for s in slices:
            buf = graph.buffers[s.buffer]
            if not tgt.has_level(buf.level):
                problems.append(f"{where}: {tgt.name} has no {buf.level} memory ({s.buffer})")
                continue
            bad = _out_of_bounds(s, buf.size, prim) if bounds else None
            if bad is not None:
                problems.append(f"{where}: {s} reaches address {bad[1]} outside {s.buffer}[0:{buf.size}] at unit {bad[0]}")
        if not isinstance(op, Sync):
            for s in op.writes():
                if graph.buffers[s.buffer].role in ("input", "const"):
                    problems.append(f"{where}: writes model {graph.buffers[s.buffer].role} {s.buffer!r}")
        problems += [f"{where}: {p}" for p in _op_rules(graph, op)]
    problems += _across_device_syncs(graph)
    if tgt.has_level(REGISTER):
        regs = register_bytes_per_lane(graph)
        budget = tgt.block_register_bytes_per_lane(upb := prim.units_per_block)
        reduces = tgt.has_level(SHARED) and (streams or any(isinstance(op, Reduce) for _, op in graph.ops()))
        if regs > tgt.register_bytes_per_lane and not reduces:
            problems.append(f"needs {regs} register bytes per lane, {tgt.name} has {tgt.register_bytes_per_lane}")
        elif regs > budget:
            # over the budget: what streams is left out; on a GPU, for a graph that reduces, for its
            # per-thread limit too (ShuffleNet's fused 1x1 conv over 24 channels, 3 x 96 floats a
            # lane by liveness: 124 registers and no spill in ptxas, sm_90). A pointwise box keeps
            # the limit on every value it holds.
            held = register_bytes_per_lane(graph, streamed_loads(graph))
            if held > tgt.register_bytes_per_lane:
                problems.append(f"needs {held} register bytes per lane, {tgt.name} has {tgt.register_bytes_per_lane}")
            elif held > budget:
                problems.append(f"holds {held} register bytes per lane, {tgt.name} has {budget} "
                                f"in a block of {upb * tgt.lanes_per_unit} lanes")
    smem = shared_bytes_per_block(graph)
    if smem > tgt.shared_bytes_per_block:
        problems.append(f"needs {smem} bytes of shared memory per block, {tgt.name} has {tgt.shared_bytes_per_block}")
    elif smem > tgt.extra.get("static_shared_bytes", smem):
        problems.append(f"needs {smem} bytes of shared memory per block, {tgt.name}'s kernels declare at most "
                        f"{tgt.extra['static_shared_bytes']} statically")
    if problems:
        raise GraphError(f"{graph.name}: invalid GIR-Graph:\n  " + "\n  ".join(problems))


def _across_device_syncs(graph: GIRGraph) -> list[str]:
    """A device sync ends a kernel: a later kernel can recompute a register value from DRAM,
    but not one that came through shared memory (the block that wrote it is gone)."""
    kernel, written, via_shared, out = 0, {}, set(), []
    for node, op in graph.ops():
        if isinstance(op, Sync):
            kernel += op.scope == DEVICE
            continue
        reads = [s.buffer for s in op.reads() if graph.buffers[s.buffer].level != DRAM]
        for name in reads:
            if name in via_shared and written.get(name, kernel) != kernel:
                out.append(f"#{node} {op.kind}: reads {name!r}, computed through shared memory before a device sync")
        shared = any(graph.buffers[n].level == SHARED or n in via_shared for n in reads)
        for s in op.writes():
            if graph.buffers[s.buffer].level != DRAM:
                written[s.buffer] = kernel
                if shared or graph.buffers[s.buffer].level == SHARED:
                    via_shared.add(s.buffer)
    return out


def _op_rules(graph: GIRGraph, op) -> list[str]:
    bufs, out = graph.buffers, []
    if isinstance(op, Sync):
        level = bufs[op.slice.buffer].level
        if graph.target.has_level(level) and op.scope > graph.target.level(level).scope:
            out.append(f"Sync({SCOPE_NAMES[op.scope]}) on {level} memory, which is shared only within a "
                       f"{SCOPE_NAMES[graph.target.level(level).scope]}")
        return out
    if isinstance(op, COMPUTE):
        for s in (*op.reads(), *op.writes()):
            if bufs[s.buffer].level != REGISTER:
                out.append(f"computes on {bufs[s.buffer].level} slice {s}; computation reads and writes registers")
    if isinstance(op, Move):
        if op.src.size != op.dst.size:
            out.append(f"moves {op.src.size} elements into a slice of {op.dst.size}")
        if bufs[op.src.buffer].dtype != bufs[op.dst.buffer].dtype:
            out.append(f"moves {bufs[op.src.buffer].dtype} into {bufs[op.dst.buffer].dtype}; conversions are Elementwise casts")
    elif isinstance(op, Elementwise):
        for i, s in enumerate(op.inputs):
            if s.size != op.out.size:
                out.append(f"input {i} has {s.size} elements, output {op.out.size}")
    elif isinstance(op, Reduce):
        if op.src.size % op.dst.size:
            out.append(f"reduces {op.src.size} elements into {op.dst.size}, not a whole group each")
        src_t, dst_t = bufs[op.src.buffer].dtype, bufs[op.dst.buffer].dtype
        if dst_t not in (src_t, accumulator(src_t)):
            out.append(f"reduces {src_t} into {dst_t}")
    elif isinstance(op, Broadcast):
        if op.dst.size % op.src.size:
            out.append(f"broadcasts {op.src.size} elements into {op.dst.size}")
        if bufs[op.src.buffer].dtype != bufs[op.dst.buffer].dtype:
            out.append("broadcast changes dtype")
    return out
