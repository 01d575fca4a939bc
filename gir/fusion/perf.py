"""Time model of one GIR-Graph (one or more kernels on one primitive): what the search ranks
candidates by.

Per kernel, the time of its memory-intensive core is the (smoothed) largest of
  - DRAM: distinct bytes over the achievable copy bandwidth, plus re-reads over the cache's;
  - latency (Little's law): the rounds of dependent DRAM reads each unit makes, times the waves
    of units the processors hold, times the DRAM latency. Equivalently, the bandwidth the bytes
    in flight sustain is resident units x lanes x bytes each lane has outstanding / latency.
    On a CPU, whose prefetchers stream for a thread, the bytes over what the threads stream;
  - issue: unit-instructions (load and store instructions, which vector accesses divide by
    their width; arithmetic weighted by what each operation compiles to; shuffle trees) over
    what the processors issue, no faster than each unit's dependent-latency allows;
  - shared memory traffic over its bandwidth;
then block barriers and kernel launches are added. On a CPU the kernels before a kernel matter
(`Context`, `sequence`): what they touched may still be in the last-level cache, and whether
the thread team still spins decides what a fork costs. Resident units come from the registers and
shared memory each unit needs and the target's resident-block limit. Every hardware constant
is data in the target (`Target.timing`, gir/ir/target.py, with its source); the CPU's are
measured by `gir calibrate`. The smoothing (a 4-norm instead of a max) models that the terms
overlap imperfectly: two near-equal limits each cost a little, so more bytes in flight or fewer
instructions always help a little, which is what a ranking needs.
"""
from __future__ import annotations

from copy import copy
from dataclasses import dataclass, field, replace
from functools import lru_cache
from math import ceil, log2

import numpy as np

from gir.ir import BLOCK, DEVICE, UNIT, GIRGraph, Sync
from gir.ir.across_units import vectorises_across_units
from gir.ir.transpose_tiles import transpose_copy
from gir.ir.one_thread import runs_on_one_thread
from gir.ir.stretches import kernel_dram_buffers, kernel_stretches
from gir.ir.streams import column_products, inlined_products, rows_adjacent, stream_factor, unit_streams
from gir.ir.cost import accesses as accesses_at
from gir.ir.cost import dram_footprint_by_buffer, level_bytes, valid_count
from gir.ir.dtypes import itemsize
from gir.ir.expr import Call, Input, postorder
from gir.ir.gops import Broadcast, Elementwise, Gather, Move, Reduce
from gir.ir.target import DRAM, REGISTER, SHARED
from gir.ir.validate import register_bytes_per_lane, shared_bytes_per_block, streamed_loads
from gir.ir.vector_access import vector_width
from gir.rewrite.tidy import tidy_slice

REGISTER_FILE_BYTES = 256 * 1024  # per processor, where the target names none (Target.register_file_bytes)
SMOOTHING = 4                     # the norm that combines the overlapped terms
UNIT_SETUP = 12                   # unit-instructions every unit spends on its indices (prologue)
ADDRESS = 1                       # unit-instructions of address arithmetic per memory instruction
# Unit-instructions per element of each operation, as the emitters' fp32 code compiles (fast
# paths of libdevice / ocml and GIR's C prelude): counted from typical SASS and x86 listings,
# not measured per target. Anything not listed costs 1.
OP_COST = {"div": 8, "recip": 4, "sqrt": 4, "rsqrt": 2, "exp": 8, "log": 10, "tanh": 16, "erf": 16,
           "sigmoid": 12, "pow": 24, "sin": 16, "cos": 16, "mod": 10}


@dataclass
class Estimate:
    seconds: float
    dram_bytes: int
    kernels: int
    occupancy: float    # resident units per processor / max
    bound: str          # what dominates: dram, latency, compute (issue), shared, launch
    parts: dict         # seconds per term: dram, latency, compute, shared, barrier, launch
    dram_by_buffer: dict  # dram_bytes per ("read" or "write", buffer)
    bytes_in_flight: int = 0       # DRAM read bytes outstanding over the device at once
    instructions: int = 0          # unit-instructions per unit
    notes: dict = field(default_factory=dict)

    def bandwidth_share(self, target) -> float:
        """Modelled DRAM bytes per modelled second, as a share of the nominal peak."""
        return self.dram_bytes / self.seconds / target.dram_bandwidth if self.seconds else 0.0

    def __str__(self):
        return f"{self.seconds * 1e6:.2f} us ({self.bound}-bound, {self.kernels} kernel(s), occupancy {self.occupancy:.0%})"


@dataclass(frozen=True)
class Context:
    """What the kernels that ran just before leave to the next one on a CPU: the buffers they
    touched that the last-level cache still holds (name, bytes; least recently touched first)
    and how long the team has had no work (one-thread kernels since its last fork: its threads
    sleep once that passes `Timing.spin_s`). A sequence of kernels is estimated in order
    (`sequence`); a kernel estimated alone has the default: nothing cached, the team just
    busy (in a run, another kernel or library call came just before it)."""
    recent: tuple = ()
    idle_s: float = 0.0

    def holds(self, name: str) -> bool:
        return any(n == name for n, _ in self.recent)

    def hot(self, limit: int) -> frozenset:
        """The most recently touched buffers, up to `limit` bytes together, where the kernel
        before ran on one thread (this one's): what that core's own cache (L2) still holds."""
        if not limit or self.idle_s <= 0:
            return frozenset()
        held, total = set(), 0
        for name, n in reversed(self.recent):
            total += n
            if total > limit:
                break
            held.add(name)
        return frozenset(held)

    def awake(self, timing) -> bool:
        return self.idle_s <= timing.spin_s

    def after(self, graph: GIRGraph, e: "Estimate") -> "Context":
        """The context the next kernel finds: `graph`'s DRAM buffers most recent, the oldest
        evicted beyond the cache, and the team's idle time grown by one-thread work."""
        tm = graph.target.timing
        idle = 0.0 if e.notes.get("team_last") else self.idle_s + e.seconds
        if not tm.cache_bytes:
            return Context((), idle)
        # what it wrote is the most recent: after what it read
        touched = list(dict.fromkeys(name for kind in ("read", "write") for k, name in e.dram_by_buffer if k == kind))
        recent = [(n, b) for n, b in self.recent if n not in touched]
        recent += [(n, min(graph.buffers[n].nbytes, tm.cache_bytes)) for n in touched]
        while recent and sum(b for _, b in recent) > tm.cache_bytes:
            recent.pop(0)
        return Context(tuple(recent), idle)


def sequence(graphs: list[GIRGraph], context: Context | None = None) -> list[Estimate]:
    """Estimates of graphs run one after another, each in the context the earlier ones leave."""
    context, out = context or Context(), []
    for graph in graphs:
        e = estimate(graph, context=context)
        out.append(e)
        context = context.after(graph, e)
    return out


def estimate(graph: GIRGraph, registers_per_lane: int | None = None, context: Context | None = None) -> Estimate:
    """`registers_per_lane`: 32-bit registers the compiled kernel uses (ptxas's report, the HIP
    code object's VGPRs): occupancy from those instead of the IR's register estimate.
    `context`: what the kernels before it left in the cache and the thread team (CPU)."""
    context = context or Context()
    by_buffer = dram_footprint_by_buffer(graph)
    return _estimate(graph, sum(by_buffer.values()), by_buffer, level_bytes(graph, DRAM), registers_per_lane,
                     _cache_rereads(graph, by_buffer), _warm(graph, by_buffer, context), context.awake(graph.target.timing))


def _warm(graph: GIRGraph, by_buffer: dict, context: Context) -> dict:
    """Distinct DRAM-level bytes the last-level cache serves (a CPU target with `cache_bytes`),
    by kind: reads and writes of what a kernel just before touched and the cache still holds,
    and reads of an intermediate this graph's own earlier kernel wrote; of a buffer larger than
    the cache, its cache-sized share. Everything else (the sequence's inputs and weights, a
    first write) is DRAM's. "hot": the part of those a core's own cache (`hot_bytes`) holds,
    which a one-thread kernel streams at `hot_unit_bandwidth`: an intermediate no larger than
    it, or one of the buffers a one-thread kernel just before touched last. LayerNorm's
    one-thread kernel sequences read their 393 KB intermediates back at 40-90 GB/s, where the
    last-level rate put them at 2x their measured time (results/perf_model_rank_intel_vm/)."""
    tm = graph.target.timing
    limit = tm.cache_bytes
    warm = {"read": 0, "write": 0, "hot": 0}
    if not limit:
        return warm
    written = {name for kind, name in by_buffer if kind == "write"}
    hot = context.hot(tm.hot_bytes)
    for (kind, name), n in by_buffer.items():
        own = kind == "read" and name in written
        if own or context.holds(name):
            # of a buffer larger than the cache, the part written or read last is still there
            share = int(n * min(1.0, limit / graph.buffers[name].nbytes))
            warm[kind] += share
            if name in hot or own and graph.buffers[name].nbytes <= tm.hot_bytes:
                warm["hot"] += share  # a one-thread kernel reads it from its core's own cache
    return warm


def _cache_rereads(graph: GIRGraph, by_buffer: dict) -> tuple[int, int]:
    """DRAM-level re-reads (accesses beyond each buffer's distinct bytes) that come from the
    cache: all of them on a GPU; on a CPU those of buffers larger than its L1 data cache (the
    `spill_bytes_per_unit` bound). A small buffer every unit re-reads (GEMV's x, a LayerNorm's
    gamma) stays in L1 while the streams pass: its loads are in the issue term already. A
    GEMV over a materialised product (x [768] re-read by all 8192 outputs) had its re-reads
    charged as 25 MB of cache traffic, ranking the forms that re-read it last (they measured
    first: results/perf_model_rank_gemv.md). On a CPU a unit loads an element it reads along a
    stride-0 axis once (a row's broadcast sum), so those repeats are no re-reads.

    Returns (re-read bytes, the share of them from buffers the last-level cache holds whole:
    the second kernel of a graph reading its first kernel's input again, say)."""
    per_buffer: dict[tuple[str, str], int] = {}
    tm = graph.target.timing
    for _, key, s, buf in accesses_at(graph, DRAM):
        n = valid_count(s, graph.prim) * itemsize(buf.dtype)
        if tm.unit_bandwidth and 0 in s.strides:  # a CPU thread
            n = int(n * _distinct_share(s))
        per_buffer[key, s.buffer] = per_buffer.get((key, s.buffer), 0) + n
    l1 = tm.spill_bytes_per_unit
    in_l1 = {k for k in per_buffer if l1 and graph.buffers[k[1]].role in ("input", "const") and by_buffer.get(k, 0) <= l1}
    rereads = {k: max(0, n - by_buffer.get(k, 0)) for k, n in per_buffer.items() if k not in in_l1}
    return sum(rereads.values()), sum(n for k, n in rereads.items() if graph.buffers[k[1]].nbytes <= tm.cache_bytes)


def _distinct_share(s) -> float:
    """Share of a slice's elements at distinct addresses within one unit (a stride-0 axis
    repeats one address)."""
    repeats = 1
    for extent, stride in zip(s.shape, s.strides):
        if stride == 0:
            repeats *= extent
    return 1 / repeats


def _lane_distinct(op, lanes: int) -> int:
    """Distinct DRAM addresses the busiest lane of a unit loads (a Move placed `vec` elements a
    lane, its source repeating along stride-0 axes: a 1x1 conv's weight read for the four
    pixels each lane owns). The emitters load them unguarded where the Move has no fill
    (`Slice.unbounded_where_still`) and NVRTC issues each once: a lane-runs 1x1 conv of 24
    input channels compiles to 24 weight loads for 96 register elements (PTX, sm_90)."""
    src = op.src if op.fill is not None else op.src.unbounded_where_still()
    if src.is_masked:
        return ceil(op.dst.size / lanes)
    owner = (np.arange(op.src.size) // op.vec) % lanes
    pattern = op.src.pattern
    return max(len(np.unique(pattern[owner == lane])) for lane in range(min(lanes, op.src.size)))


def _gathered(s) -> bool:
    """A CPU element loop reads this slice an element at a time: past its repeated (stride-0)
    axes its offsets are not one run of consecutive addresses, so the compiler gathers
    (AVX-512 vgatherdps, about an element a cycle) where a contiguous slice is one vector load
    per SIMD width. A stride-2 1x1 conv's unit reading 4 positions x 32 channels a plane
    apart (ResNet-50 exported, batch 2 at 64x64): 8.6 us measured where the model, counting
    vectors, said 3.4."""
    dims = [(n, st) for n, st in zip(s.shape, s.strides) if n > 1 and st != 0]
    expected = 1
    for n, st in reversed(dims):
        if st != expected:
            return True
        expected *= n
    return False


def quick_estimate(graph: GIRGraph) -> Estimate:
    """`estimate` with every DRAM access counted whole (no distinct-byte count, masks ignored),
    at a small fraction of its cost: what the search shortlists a group's structures by."""
    traffic = {"read": 0, "write": 0}
    for _, key, s, buf in accesses_at(graph, DRAM):
        traffic[key] += s.size * graph.prim.num_units * itemsize(buf.dtype)
    return _estimate(graph, traffic["read"] + traffic["write"], {}, traffic)


def _estimate(graph: GIRGraph, unique: int, by_buffer: dict, traffic: dict, registers_per_lane: int | None = None,
              cache_rereads: int | None = None, warm: dict | None = None, awake: bool = True) -> Estimate:
    """`cache_rereads`: re-read bytes the cache serves (`_cache_rereads`); None: every access
    beyond `unique`. `warm`: bytes of `unique` the last-level cache serves (`_warm`); `awake`:
    the team's threads spin when the graph starts."""
    t, prim = graph.target, graph.prim
    tm = t.timing
    accesses = traffic["read"] + traffic["write"]
    shared = sum(level_bytes(graph, SHARED).values()) if t.has_level(SHARED) else 0

    per_block, resident_units = _residency(graph, registers_per_lane)
    # a small CPU kernel runs on one thread, without forking a team (gir/ir/one_thread.py);
    # the emitter decides per kernel, and so does the launch term
    teams = [not runs_on_one_thread(kernel_dram_buffers(graph, k), t) for k in kernel_stretches(graph)]
    one_thread = not any(teams)
    processors = 1 if one_thread else t.processors
    concurrent_blocks = min(prim.num_blocks, per_block * processors)
    concurrent_units = concurrent_blocks * prim.units_per_block
    waves = ceil(prim.num_blocks / (per_block * processors))
    across = tm.simd_across_units and vectorises_across_units([op for _, op in graph.ops()], prim, graph.buffers)
    program = _program(graph, across)

    # re-reads come from the cache; across units they are a row's overlapping windows, vector
    # loads from L1 that the issue term already counts
    if cache_rereads is None:
        cache_rereads = (max(0, accesses - unique), 0)
    rereads, warm_rereads = (0, 0) if across else cache_rereads
    warm = warm or {"read": 0, "write": 0}
    cold = unique - warm["read"] - warm["write"]
    # what a one-thread kernel reads from its own core's cache, and the rest of the warm bytes
    hot = warm.get("hot", 0) if one_thread and tm.hot_unit_bandwidth else 0
    llc = warm["read"] + warm["write"] - hot
    dram_s = cold / (t.dram_bandwidth * tm.copy_efficiency) + rereads / tm.cache_bandwidth
    if program.sector_waste:  # GPU: the unused parts of partly used sectors cross the cache too
        dram_s += program.sector_waste * prim.num_units / tm.cache_bandwidth
    if llc:
        dram_s += llc / tm.warm_bandwidth
    if hot:
        dram_s += hot / tm.hot_unit_bandwidth
    if tm.unit_bandwidth:  # a CPU thread: the prefetchers keep its stream in flight
        # what the threads stream: the distinct bytes and the re-reads L1 does not hold (those
        # are loads in the issue term); across units, a row's neighbouring windows overlap in L1.
        # What the last-level cache holds streams at its own rate.
        # rows a unit streams side by side keep more misses in flight (gir/ir/streams.py)
        gain = tm.adjacent_stream_gain if program.adjacent else tm.stream_gain
        stream_bw = tm.unit_bandwidth * stream_factor(program.streams, gain)
        latency_s = (cold + rereads - warm_rereads) / (concurrent_units * stream_bw)
        if llc or warm_rereads:
            latency_s += (llc + warm_rereads) / (concurrent_units * tm.warm_unit_bandwidth)
        if hot:
            latency_s += hot / (concurrent_units * tm.hot_unit_bandwidth)
        in_flight = int(concurrent_units * tm.unit_bandwidth * tm.dram_latency_s)
    else:  # Little's law: read bytes / (bytes in flight / latency), and never under one unit's own chain
        in_flight = int(concurrent_units * program.read_bytes / max(program.rounds, 1))
        latency_s = max(program.rounds * tm.dram_latency_s,
                        traffic["read"] * tm.dram_latency_s / in_flight if in_flight else 0.0)
    per_processor = concurrent_units / processors
    issue_rate = processors * tm.clock_hz * min(tm.issue_per_clock, per_processor / tm.alu_latency_cycles)
    compute_s = program.instructions * prim.num_units / issue_rate
    if tm.dependent_cycles:  # one thread runs its units one after another: each op's chain is latency
        compute_s = max(compute_s, program.chain * tm.dependent_cycles * prim.num_units / (concurrent_units * tm.clock_hz))
    shared_s = shared / t.level(SHARED).bandwidth_bytes_per_s if shared else 0.0
    if tm.spill_bytes_per_unit and register_bytes_per_lane(graph, program.unstored) * t.lanes_per_unit > tm.spill_bytes_per_unit:
        # a CPU thread's register arrays beyond L1: every access to them goes to the cache
        spilled = sum(level_bytes(graph, REGISTER).values())
        shared_s += spilled / (tm.cache_bandwidth * min(concurrent_units, processors))
    # the block scheduler starts blocks at a bounded rate per processor: a grid of many tiny
    # blocks is bound by it however little each block does
    dispatch_s = ceil(prim.num_blocks / processors) * tm.block_dispatch_s
    parts = {"dram": dram_s, "latency": latency_s, "compute": compute_s, "shared": shared_s, "dispatch": dispatch_s}
    if tm.unit_bandwidth and not across and one_thread:
        # a CPU thread running its units one after another: where a unit reduces its rows one at a
        # time, the prefetcher streams the next row while it computes and the terms overlap
        # (LayerNorm's one-kernel form, modelled at 38 + 31 us, measures 41); where its lanes
        # each reduce a row of their own (lane(o8)/rows(c768,r8)) it waits for those loads
        # before their dependent chains, and the terms add (they measured 1.3-2.5x the larger);
        # so they do where it gathers an element an instruction (decode attention's P @ V a
        # unit per output, which measured slower than the column form: tests/test_column_loop.py).
        # Kendall tau-b against the terms always added, on two stored rank measurements
        # (scripts/perf_model_fit.py): LayerNorm 0.46 -> 0.60 and 0.45 -> 0.60, softmax
        # 0.52 -> 0.57 and 0.56 -> 0.56.
        stream = max(dram_s, latency_s)
        apart = program.rows_in_lanes or program.gathers
        core = (stream + compute_s if apart else max(stream, compute_s)) + shared_s + dispatch_s
    else:
        core = sum(v ** SMOOTHING for v in parts.values()) ** (1 / SMOOTHING)
    bound = max(parts, key=parts.get)
    barriers = sum(1 for _, op in graph.ops() if isinstance(op, Sync) and op.scope == BLOCK)
    kernels = 1 + sum(1 for _, op in graph.ops() if isinstance(op, Sync) and op.scope == DEVICE)
    launch = _launches(teams, t, awake)
    parts |= {"barrier": barriers * waves * tm.barrier_s, "launch": launch}
    if parts["launch"] > core:
        bound = "launch"
    return Estimate(core + parts["barrier"] + parts["launch"], unique, kernels,
                    resident_units / t.max_units_per_processor, bound, parts, by_buffer,
                    bytes_in_flight=in_flight, instructions=int(program.instructions),
                    notes={"waves": waves, "rounds": program.rounds, "blocks_per_processor": per_block,
                           "team_last": teams[-1] if teams else False})


def _scalarized(ops, buffers) -> frozenset:
    """Register buffers only whole-buffer element loops touch (Moves and Elementwise ops, each
    over all of the buffer in order, every slice of the op as long): the CPU emitter fuses
    those loops and turns the arrays into scalars (gir/backends/loop_fusion.py), so they take
    no stack memory and cannot spill. Charged as spills, a LayerNorm's 8-row tilings (24 KiB
    arrays) were modelled at 3-4x their measured time."""
    touched: dict[str, list] = {}
    for op in ops:
        for s in (*op.reads(), *op.writes()):
            if buffers[s.buffer].level == REGISTER:
                touched.setdefault(s.buffer, []).append((op, s))
    out = set()
    for name, uses in touched.items():
        size = buffers[name].size
        if all(isinstance(op, (Move, Elementwise)) and _whole(s, size)
               and all(x.size == size for x in (*op.reads(), *op.writes())) for op, s in uses):
            out.add(name)
    return frozenset(out)


def _whole(s, size: int) -> bool:
    """Slice s is all of a buffer of `size` elements, unmasked, in address order."""
    return (s.size == size and not s.is_masked and s.offset.is_const and s.offset.const == 0
            and bool((s.pattern == np.arange(size)).all()))


def _launches(teams: list[bool], t, awake: bool = True) -> float:
    """Launch cost of a kernel sequence (True: the kernel forks a team). A fork that finds the
    team spinning (`awake` for the first: the context says) costs the target's launch latency;
    one after a one-thread kernel wakes it where the target says its threads sleep by then
    (`wake_s`)."""
    total = 0.0
    for team in teams:
        if team:
            total += t.launch_latency_s if awake else (t.timing.wake_s or t.launch_latency_s)
        awake = team
    return total


def _residency(graph: GIRGraph, registers_per_lane: int | None = None) -> tuple[int, int]:
    """(resident blocks per processor, resident units per processor): the least of what the
    registers, the shared memory, the unit slots and the resident-block limit allow."""
    t, prim = graph.target, graph.prim
    upb = prim.units_per_block
    per_lane = 4 * registers_per_lane if registers_per_lane else register_bytes_per_lane(graph)
    if not registers_per_lane and t.has_level(SHARED) and per_lane > t.register_bytes_per_lane:
        # what the validator admits on a GPU only because loads stream (validate.streamed_loads:
        # a lane-runs 1x1 conv, 3 x 96 floats a lane by liveness, 124 registers in ptxas) counts
        # what it holds; below the per-thread limit every value counts, as before
        per_lane = register_bytes_per_lane(graph, streamed_loads(graph))
    per_unit_regs = max(per_lane, 4) * t.lanes_per_unit
    limits = [t.timing.max_blocks_per_processor, t.max_units_per_processor // upb]
    if t.has_level(SHARED) or t.lanes_per_unit > 1 and t.max_units_per_processor > 1:
        limits.append((t.register_file_bytes or REGISTER_FILE_BYTES) // (per_unit_regs * upb))
    smem = shared_bytes_per_block(graph)
    if smem:
        limits.append(t.shared_bytes_per_block // smem)
    blocks = max(1, min(limits))
    return blocks, blocks * upb


@dataclass
class _Program:
    instructions: float = UNIT_SETUP  # unit-instructions per unit
    rounds: int = 0                   # dependent DRAM read round trips per unit
    read_bytes: int = 0               # DRAM bytes one unit reads
    chain: float = 0.0                # dependent steps per unit, when its elements overlap each other
    sector_waste: int = 0             # bytes one unit's DRAM accesses move in granules they leave unused
    streams: int = 1                  # CPU: DRAM streams one unit reads side by side (gir/ir/streams.py)
    adjacent: bool = False            # CPU: those streams are adjacent rows, under a page apart (ditto)
    unstored: frozenset = frozenset()  # CPU: register buffers the emitter never materialises (ditto)
    rows_in_lanes: bool = False       # CPU: a Reduce whose lanes each reduce a row of their own
    gathers: bool = False             # CPU: a load that gathers an element an instruction (`_gathered`)


def _program(graph: GIRGraph, across: bool = False) -> _Program:
    """Walk one unit's program in order: count its unit-instructions, and group its DRAM reads
    into rounds (reads issued before any use of an earlier read share a round, up to
    `loads_in_flight_per_lane` instructions per lane). `across`: the kernel runs neighbouring
    units in the SIMD lanes (gir/ir/across_units.py): every element is its own instruction,
    shared by `lanes` units at once, and there is no dependent chain to wait on (each SIMD
    iteration is independent of the next, which the core overlaps)."""
    if across:
        p = _program(_one_lane(graph))
        p.instructions, p.chain = p.instructions / graph.target.lanes_per_unit, 0.0
        return p
    t, buffers = graph.target, graph.buffers
    lanes, cap = t.lanes_per_unit, t.timing.loads_in_flight_per_lane
    p = _Program(instructions=t.timing.unit_setup if t.timing.unit_setup is not None else UNIT_SETUP)
    pending, used = 0, True
    cpu = bool(t.timing.unit_bandwidth)
    # a CPU reduction computing a product of DRAM loads in its own loop (gir/ir/streams.py):
    # its loads are vector loads run by run, its arrays never stored, its rows maybe side by side
    ops = [op for _, op in graph.ops()]
    products = inlined_products(ops, buffers) if cpu and lanes > 1 else []
    # ... or with its outputs in the SIMD lanes, each load a vector per element of the group
    in_lanes = column_products(ops, buffers) if cpu and lanes > 1 else []
    streamed = {id(m) for _, _, loads in (*products, *in_lanes) for m in loads}
    if cpu and lanes > 1 and transpose_copy(ops, buffers, graph.prim):  # 16x16 tiles, no gather (gir/ir/transpose_tiles.py)
        streamed |= {id(op) for op in ops}
    p.unstored = frozenset(s.buffer for r, e, loads in (*products, *in_lanes) for s in (r.src, *(m.dst for m in loads)))
    if cpu:
        p.unstored |= _scalarized(ops, buffers)
    if t.timing.stream_gain != 1 or t.timing.adjacent_stream_gain != 1:
        p.streams, p.adjacent = unit_streams(products, buffers), rows_adjacent(products, buffers)

    def per_lane(op, s) -> int:
        return s.size if op.uniform else ceil(s.size / lanes)

    # CPU: register buffers filled with one value (a broadcast row statistic); what an expression
    # computes from those alone the compiler hoists out of the element loop (_expr_costs)
    uniform = {op.dst.buffer for op in ops if cpu and isinstance(op, Move) and buffers[op.dst.buffer].level == REGISTER
               and op.src.size * _distinct_share(op.src) <= 1}
    for _, op in graph.ops():
        if isinstance(op, Sync):
            if op.scope == UNIT:
                p.instructions += 1
            used = True
            continue
        reads_dram = any(buffers[s.buffer].level == DRAM for s in op.reads())
        if isinstance(op, Move):
            width = vector_width(_without_trivial_masks(op, graph.prim), buffers)
            if width * itemsize(buffers[op.dst.buffer].dtype) > t.timing.widest_access_bytes:
                width = 1
            accesses = ceil(per_lane(op, op.dst) / width)
            if cpu and 0 in op.src.strides:  # the compiler loads a repeated element once per unit
                accesses = ceil(accesses * _distinct_share(op.src))
            elif (0 in op.src.strides and op.fill is None and not op.uniform and buffers[op.src.buffer].level == DRAM
                  and (src := tidy_slice(op.src, graph.prim)).unbounded_where_still() != src):
                # repeats of one address bounded along their stride-0 axis (a ragged tile of a
                # 1x1 conv's pixels), which the emitters load unguarded: NVRTC issues them once.
                # Other repeats it shares too, but counting those once moves the shortlist of
                # GPT-2's decode LayerNorms (quick estimates, plan.shortlist) to structures 2.3x
                # slower after rewriting: left counted per element until the shortlist is fixed
                accesses = min(accesses, _lane_distinct(op, lanes))
            if cpu and lanes > 1 and id(op) not in streamed and _gathered(op.src):
                accesses = ceil(op.dst.size * _distinct_share(op.src))  # an element an instruction
                p.gathers = True
            masked = op.src.is_masked or op.dst.is_masked
            p.instructions += accesses * (1 + ADDRESS + masked)
            granule = t.timing.sector_bytes
            if granule and not op.uniform and DRAM in (buffers[op.src.buffer].level, buffers[op.dst.buffer].level):
                dram = op.src if buffers[op.src.buffer].level == DRAM else op.dst
                p.sector_waste += _unit_sector_waste(dram, op.vec, width, lanes, itemsize(buffers[dram.buffer].dtype), granule)
            if reads_dram:
                if used:
                    p.rounds, pending, used = p.rounds + 1, 0, False
                pending += accesses
                while pending > cap:
                    p.rounds, pending = p.rounds + 1, pending - cap
                p.read_bytes += op.dst.size * itemsize(buffers[op.src.buffer].dtype)
            elif buffers[op.src.buffer].level == REGISTER:
                used = True
            continue
        used = True
        if isinstance(op, Gather):  # its address needs the index: a round of its own
            p.rounds += 1
            p.read_bytes += op.dst.size * itemsize(buffers[op.src.buffer].dtype)
            p.instructions += per_lane(op, op.dst) * (2 + ADDRESS)
        elif isinstance(op, Elementwise):
            fixed = frozenset(i for i, x in enumerate(op.inputs) if x.buffer in uniform)
            cost, once = _expr_costs(op.expr, t.timing.op_cost, fixed)
            p.instructions += per_lane(op, op.out) * cost + once
            p.chain += max(cost, per_lane(op, op.out) * cost / lanes) + once
        elif isinstance(op, Reduce):
            p.instructions += per_lane(op, op.src) if not op.uniform else ceil(op.src.size / lanes)
            p.rows_in_lanes |= not op.uniform and op.dst.size > 1
            p.chain += ceil(log2(max(op.group, 2)))  # a tree over partial sums
            if op.uniform and op.group > 1 and lanes > 1:  # a shuffle tree per output
                p.instructions += op.dst.size * 2 * ceil(log2(min(lanes, op.group)))
        elif isinstance(op, Broadcast):
            p.instructions += per_lane(op, op.dst) / 2
    return p


@lru_cache(maxsize=1 << 14)
def _unit_sector_waste(s, vec: int, width: int, lanes: int, size: int, granule: int) -> int:
    """Bytes one unit's accesses to DRAM slice `s` move in `granule`-byte sectors beyond those
    they use: per unit-instruction (a lane's `width` consecutive elements at a time, the lanes
    side by side), the sectors its addresses touch times the granule, less its distinct bytes.
    A warp reading a column of 32 rows (a scalar transpose's read, a lowered 1x1 conv reading
    channels a plane apart) touches 32 sectors for 128 bytes of floats; a row read 16 bytes a
    lane touches exactly the sectors it fills. Addresses from the slice's constant offset (unit
    offsets are taken as aligned)."""
    address = (s.pattern + s.offset.const) * size
    k = np.arange(address.size)
    instruction = (k // (vec * lanes)) * max(vec // width, 1) + (k % vec) // width
    sectors = np.unique(np.stack([instruction, address // granule]), axis=1).shape[1]
    used = np.unique(np.stack([instruction, address]), axis=1).shape[1] * size
    return max(0, sectors * granule - used)


def _one_lane(graph: GIRGraph):
    """A view of the graph whose target has one lane per unit (what one SIMD lane of the
    across-units form runs)."""
    view = copy(graph)
    view.target = replace(graph.target, lanes_per_unit=1)
    return view


def _without_trivial_masks(op: Move, prim) -> Move:
    """The Move with masks that hold for every unit dropped (as the rewriter's tidy pass does),
    so that a structure not yet rewritten shows the vector width it will have."""
    if not (op.src.is_masked or op.dst.is_masked):
        return op
    return op.with_slices({s: tidy_slice(s, prim) for s in (op.src, op.dst)})


def _expr_cost(expr, measured: tuple = (), fixed: frozenset = frozenset()) -> float:
    """Unit-instructions per element of an expression: the target's measured op costs where it
    has them (`Timing.op_cost`, from `gir calibrate`), else the nominal table (see `_expr_costs`)."""
    return _expr_costs(expr, measured, fixed)[0]


def _expr_costs(expr, measured: tuple = (), fixed: frozenset = frozenset()) -> tuple[float, float]:
    """(unit-instructions per element, once per unit) of an expression. `fixed`: inputs that hold
    one value for all of the op's elements; a sub-expression of only those and constants is
    computed once, outside the element loop (C compilers hoist it, and fold constants)."""
    costs = _op_table(measured)
    hoisted: dict = {}
    per_element = once = 0
    for n in postorder(expr):
        if isinstance(n, Call):
            hoisted[n] = all(hoisted[a] for a in n.args)
            if hoisted[n]:
                once += costs.get(n.op, 1)
            else:
                per_element += costs.get(n.op, 1)
        else:
            hoisted[n] = not isinstance(n, Input) or n.index in fixed
    return per_element, once


@lru_cache(maxsize=8)
def _op_table(measured: tuple) -> dict:
    return OP_COST | dict(measured)

