"""Analytical performance model of one GIR-Graph (one or more kernels on one primitive).

time = max(DRAM, on-chip shared traffic, arithmetic) + block barriers + kernel launches, with
DRAM bandwidth derated when too few units run to keep the memory system busy. Occupancy comes
from the registers and shared memory each unit needs. The constants below are modelling
assumptions, not measurements; the ranking they produce is what the search uses, and
`scripts/perf_model_rank.py` checks the ranking against measured times.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from gir.ir import DEVICE, BLOCK, GIRGraph, Sync
from gir.ir.cost import dram_footprint_by_buffer, level_bytes
from gir.ir.target import DRAM, SHARED
from gir.ir.validate import register_bytes_per_lane, shared_bytes_per_block

REGISTER_FILE_BYTES = 256 * 1024   # per SM / CU (64K 32-bit registers on NVIDIA and CDNA)
SATURATING_UNITS = 16              # resident units per processor that keep a GPU's DRAM busy
BARRIER_SECONDS = 40e-9            # one block barrier, per wave of blocks
CACHED_REREAD_SPEEDUP = 3.0        # repeated DRAM reads (broadcast operands) served by L2


@dataclass
class Estimate:
    seconds: float
    dram_bytes: int
    kernels: int
    occupancy: float    # resident units per processor / max
    bound: str          # what dominates: dram, shared, compute, launch
    parts: dict         # seconds per term: dram, shared, compute, barrier, launch
    dram_by_buffer: dict  # dram_bytes per ("read" or "write", buffer)

    def __str__(self):
        return f"{self.seconds * 1e6:.2f} us ({self.bound}-bound, {self.kernels} kernel(s), occupancy {self.occupancy:.0%})"


def estimate(graph: GIRGraph) -> Estimate:
    t, prim = graph.target, graph.prim
    by_buffer = dram_footprint_by_buffer(graph)
    unique = sum(by_buffer.values())
    accesses = sum(level_bytes(graph, DRAM).values())
    shared = sum(level_bytes(graph, SHARED).values()) if t.has_level(SHARED) else 0
    flops = _flops(graph)
    per_unit_regs = max(register_bytes_per_lane(graph), 4) * t.lanes_per_unit
    smem = shared_bytes_per_block(graph)
    resident = min(t.max_units_per_processor, REGISTER_FILE_BYTES // per_unit_regs)
    if smem:
        resident = min(resident, (t.shared_bytes_per_block // smem) * prim.units_per_block)
    resident = max(resident, 1)
    concurrent = min(prim.num_units, resident * t.processors)
    saturating = min(SATURATING_UNITS, t.max_units_per_processor)  # a CPU core: its one thread
    efficiency = min(1.0, concurrent / (saturating * t.processors))
    dram_s = unique / (t.dram_bandwidth * efficiency) + (accesses - unique) / (t.dram_bandwidth * CACHED_REREAD_SPEEDUP)
    shared_s = shared / t.level(SHARED).bandwidth_bytes_per_s if shared else 0.0
    compute_s = flops / t.peak_flops
    waves = ceil(prim.num_blocks / max(1, (resident // prim.units_per_block) * t.processors))
    barriers = sum(1 for _, op in graph.ops() if isinstance(op, Sync) and op.scope == BLOCK)
    kernels = 1 + sum(1 for _, op in graph.ops() if isinstance(op, Sync) and op.scope == DEVICE)
    parts = {"dram": dram_s, "shared": shared_s, "compute": compute_s}
    bound = max(parts, key=parts.get)
    overlapped = max(parts.values())
    parts |= {"barrier": barriers * waves * BARRIER_SECONDS, "launch": kernels * t.launch_latency_s}
    if parts["launch"] > overlapped:
        bound = "launch"
    return Estimate(overlapped + parts["barrier"] + parts["launch"], unique, kernels,
                    resident / t.max_units_per_processor, bound, parts, by_buffer)


def _flops(graph: GIRGraph) -> int:
    total = 0
    for _, op in graph.ops():
        if isinstance(op, Sync):
            continue
        total += op.flops_per_output() * op.writes()[0].size * graph.prim.num_units
    return total
