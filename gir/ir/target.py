"""Hardware description as data: what the IR, the rewrites and the performance model may assume.

A backend port is mostly one of these plus an emitter dialect. Nothing here is code that
differs per vendor: each backend describes its own targets in its folder (gir/backends/NAME/)
and registers them (gir/backends/registry.py); `get_target` looks them up there.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Sync scopes, ordered: a sync of a wider scope covers every narrower one.
LANE, UNIT, BLOCK, DEVICE = 0, 1, 2, 3
SCOPE_NAMES = ("lane", "unit", "block", "device")

# Memory levels GIR places slices in. A target lists the ones it has.
REGISTER, SHARED, DRAM = "register", "shared", "dram"


def scope_name(scope: int) -> str:
    return SCOPE_NAMES[scope]


def scope_from_name(name: str) -> int:
    try:
        return SCOPE_NAMES.index(name)
    except ValueError:
        raise ValueError(f"unknown sync scope {name!r}; expected one of {', '.join(SCOPE_NAMES)}") from None


@dataclass(frozen=True)
class MemoryLevel:
    """One level of the memory hierarchy. `scope` is the widest sync scope whose exchange
    this level can carry: registers carry unit scope (shuffles), shared memory block scope,
    DRAM device scope (a kernel boundary)."""
    name: str
    scope: int
    capacity_bytes: int          # per lane (registers), per block (shared), per device (dram)
    bandwidth_bytes_per_s: float  # aggregate over the device


@dataclass(frozen=True)
class Timing:
    """Constants of the time model (gir/fusion/perf.py). Each preset says where its figures
    come from; `source` travels into reports so nobody mistakes a nominal figure for a
    measured one. A unit-instruction is one instruction issued for all lanes of a unit (a warp
    instruction on NVIDIA, a wavefront instruction on AMD, one SIMD instruction on a CPU)."""
    clock_hz: float                 # core clock while streaming (boost)
    issue_per_clock: float          # unit-instructions a processor issues per clock
    alu_latency_cycles: float       # dependent arithmetic latency: one unit issues at most once per this
    dram_latency_s: float           # a DRAM read's round trip, unloaded
    copy_efficiency: float          # achievable copy bandwidth / nominal DRAM bandwidth
    cache_bandwidth: float          # bytes/s of re-reads served by the last-level cache
    max_blocks_per_processor: int   # resident blocks per SM / CU / core
    loads_in_flight_per_lane: int   # independent loads one lane keeps outstanding (compiler batching)
    barrier_s: float                # one block barrier
    unit_bandwidth: float = 0.0     # CPU: bytes/s one thread streams (hardware prefetch); 0 on GPUs
    widest_access_bytes: int = 16   # one lane's widest load/store the emitter issues (4: scalar only)
    spill_bytes_per_unit: int = 0   # CPU: a unit's register arrays above this live in L1/L2 (0: none)
    dependent_cycles: float = 0.0   # CPU: latency of one dependent arithmetic step within a unit (GPUs
                                    # hide it with other warps: the alu_latency_cycles term)
    simd_across_units: bool = False  # CPU: small-unit kernels run their units in SIMD lanes (gir/ir/across_units.py)
    serial_below_bytes: int = 0      # CPU: a kernel moving fewer DRAM bytes runs on one thread (gir/ir/one_thread.py)
    wake_s: float = 0.0              # CPU: forking a team whose threads went to sleep (the first parallel kernel
                                     # after one-thread work); 0: every launch costs the target's launch latency
    unit_setup: float | None = None  # unit-instructions each unit spends on its indices; None: the model's
                                     # default (gir/fusion/perf.py UNIT_SETUP)
    op_cost: tuple = ()              # (op, unit-instructions per element) pairs that replace the model's
                                     # nominal table (gir/fusion/perf.py OP_COST) where measured
    block_dispatch_s: float = 0.0    # GPU: a processor starts at most one block per this (the block
                                     # scheduler's rate); 0: not modelled
    spin_s: float = 0.0              # CPU: how long an idle team's threads spin before they sleep (a fork
                                     # within it costs the launch latency, after it `wake_s`); 0: any
                                     # one-thread work before a fork lets them sleep
    cache_bytes: int = 0             # CPU: last-level cache bytes that still hold the buffers the kernels
                                     # just before touched (gir/fusion/perf.py Context); 0: not modelled
    warm_bandwidth: float = 0.0      # CPU: bytes/s, read + write, all threads, of buffers held in that cache
    warm_unit_bandwidth: float = 0.0  # CPU: the same for one thread
    hot_bytes: int = 0               # CPU: bytes of the most recently touched buffers one thread still holds
                                     # in its own core's cache (L2) for its next one-thread kernel; 0: not modelled
    hot_unit_bandwidth: float = 0.0  # CPU: bytes/s, read + write, one thread, of buffers held there
    stream_gain: float = 1.0         # CPU: one thread's GEMV rate with 8 rows side by side over a row at a
                                     # time (gir/ir/streams.py); 1: not modelled
    adjacent_stream_gain: float = 1.0  # CPU: the same with 8 adjacent rows (under a page apart), which
                                     # some CPUs' prefetchers take worse than one row (gir/ir/streams.py)
    sector_bytes: int = 0            # GPU: the granule one access moves between DRAM, L2 and L1 (a warp
                                     # access touching more granules than its bytes fill moves the rest
                                     # through the cache too); 0: not modelled
    streamed_registers: int = 0      # GPU: registers a thread the emitter holds a kernel whose runs
                                     # reductions stream to (`CStyle.launch_bounds`); 0: no such bound
    source: str = ""


# Figures for a device nobody described: conservative, and said to be nominal.
NOMINAL_TIMING = Timing(clock_hz=1.5e9, issue_per_clock=4, alu_latency_cycles=4, dram_latency_s=600e-9,
                        copy_efficiency=0.85, cache_bandwidth=2e12, max_blocks_per_processor=16,
                        loads_in_flight_per_lane=8, barrier_s=40e-9, widest_access_bytes=4,
                        source="nominal defaults (gir/ir/target.py NOMINAL_TIMING), not a measured device")


@dataclass(frozen=True)
class Target:
    name: str
    backend: str                  # the registered backend that emits and runs it (gir/backends/registry.py)
    arch: str                     # "sm_90", "gfx90a", "native"
    hierarchy: tuple[str, ...]    # outermost first, e.g. ("grid", "block", "warp", "lane")
    lanes_per_unit: int           # 32 (warp), 64 (CDNA wavefront), SIMD width (CPU)
    max_units_per_block: int
    processors: int               # SMs / CUs / cores: blocks that run at once, times occupancy
    memory: tuple[MemoryLevel, ...]
    peak_flops: float             # fp32 vector FLOP/s
    peak_matrix_flops: float      # what the vendor library reaches on GEMM (fp16/tf32 tensor cores)
    launch_latency_s: float
    max_units_per_processor: int = 64
    notes: str = ""
    timing: Timing = NOMINAL_TIMING
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    # Register bytes one processor gives the lanes of a block, which all run on it: a lane of
    # a larger block gets fewer (0: no such bound, a CPU thread's registers are its stack).
    register_file_bytes: int = 0

    def level(self, name: str) -> MemoryLevel:
        for level in self.memory:
            if level.name == name:
                return level
        raise KeyError(f"target {self.name} has no {name} memory")

    def has_level(self, name: str) -> bool:
        return any(level.name == name for level in self.memory)

    def level_for_scope(self, scope: int) -> str:
        """The fastest level that can carry an exchange of this scope (sync-insertion's lift)."""
        for level in self.memory:
            if level.scope >= scope:
                return level.name
        raise ValueError(f"target {self.name} has no memory level for scope {scope_name(scope)}")

    @property
    def dram_bandwidth(self) -> float:
        return self.level(DRAM).bandwidth_bytes_per_s

    def ridge_point(self, dtype: str = "float32") -> float:
        """FLOP per DRAM byte above which an op is compute-bound (the partition threshold).
        fp16 and bf16 GEMMs run on the matrix units; fp32 ones on the vector units (no silent TF32)."""
        peak = self.peak_matrix_flops if dtype in ("float16", "bfloat16") else self.peak_flops
        return peak / self.dram_bandwidth

    @property
    def register_bytes_per_lane(self) -> int:
        return self.level(REGISTER).capacity_bytes

    def block_register_bytes_per_lane(self, units_per_block: int) -> int:
        """Register bytes a lane may hold in a block of `units_per_block` units: a 512-thread
        CUDA block leaves 128 registers a thread of the 255 one thread may address."""
        per_lane = self.register_bytes_per_lane
        if self.register_file_bytes:
            per_lane = min(per_lane, self.register_file_bytes // (units_per_block * self.lanes_per_unit))
        return per_lane

    @property
    def shared_bytes_per_block(self) -> int:
        return self.level(SHARED).capacity_bytes if self.has_level(SHARED) else 0


GPU_LAUNCH_S = 2e-6  # gap between back-to-back kernels in one stream: 1-3 us on CUDA and HIP (public launch-latency measurements)
# Registers a block's lanes share on one SM / CU: 64K 32-bit registers per SM on sm_80 and sm_90
# (CUDA C++ Programming Guide, compute-capability table); on CDNA the compiler gives a 512-thread
# block 128 VGPRs a lane (gfx908, tests/test_emitters.py), the same 256 KiB.
GPU_REGISTER_FILE_BYTES = 256 * 1024


def gpu_target(name, backend, arch, unit, lanes, max_units, procs, regs, smem, dram_bw, smem_bw, fp32, matrix, notes,
               timing: Timing, launch_s: float) -> Target:
    """A GPU's Target from its datasheet figures (the GPU backends' presets are built with it)."""
    return Target(
        name=name, backend=backend, arch=arch,
        hierarchy=("grid", "block", unit, "lane"), lanes_per_unit=lanes, max_units_per_block=max_units,
        processors=procs,
        memory=(
            MemoryLevel(REGISTER, UNIT, regs * 4, float("inf")),
            MemoryLevel(SHARED, BLOCK, smem, smem_bw),
            MemoryLevel(DRAM, DEVICE, 1 << 40, dram_bw),
        ),
        peak_flops=fp32, peak_matrix_flops=matrix, launch_latency_s=launch_s,
        max_units_per_processor=2048 // lanes, notes=notes, timing=timing,
        register_file_bytes=GPU_REGISTER_FILE_BYTES,
    )


def get_target(name: str) -> Target:
    """Look a target up by any name `--target` takes (`gir targets` lists them). Each backend
    registers the targets it describes (gir/backends/registry.py); KeyError names the known ones."""
    from gir.backends.registry import get_target as registered
    return registered(name)


def __getattr__(name: str):
    """`PRESETS`: preset name -> Target of every registered target with fixed figures."""
    if name == "PRESETS":
        from gir.backends.registry import presets
        return presets()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
