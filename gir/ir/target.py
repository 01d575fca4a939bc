"""Hardware description as data: what the IR, the rewrites and the performance model may assume.

A backend port is mostly one of these plus an emitter dialect. Nothing here is code that
differs per vendor; the numbers are the vendor's published peak figures (nominal, not measured),
except the local CPU, whose figures are nominal estimates from its core count.
"""
from __future__ import annotations

import os
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
    source: str = ""


# Figures for a device nobody described: conservative, and said to be nominal.
NOMINAL_TIMING = Timing(clock_hz=1.5e9, issue_per_clock=4, alu_latency_cycles=4, dram_latency_s=600e-9,
                        copy_efficiency=0.85, cache_bandwidth=2e12, max_blocks_per_processor=16,
                        loads_in_flight_per_lane=8, barrier_s=40e-9, widest_access_bytes=4,
                        source="nominal defaults (gir/ir/target.py NOMINAL_TIMING), not a measured device")


@dataclass(frozen=True)
class Target:
    name: str
    backend: str                  # "cuda", "hip", "cpu", ...
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

    @property
    def shared_bytes_per_block(self) -> int:
        return self.level(SHARED).capacity_bytes if self.has_level(SHARED) else 0


def _gpu(name, backend, arch, unit, lanes, max_units, procs, regs, smem, dram_bw, smem_bw, fp32, matrix, notes,
         timing: Timing, launch_s: float):
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
    )


# Timing of each preset. Sources: clocks, SM/CU counts, schedulers and the resident-block limit
# from the vendors' documents (NVIDIA H100 and A100 datasheets and whitepapers, the CUDA C++
# Programming Guide's compute-capability table; AMD's CDNA1/CDNA2 whitepapers and ISA guides:
# a wave64 VALU instruction occupies a SIMD16 for 4 clocks, so a CU issues one per clock).
# Latencies and achievable bandwidths are public microbenchmark figures, rounded:
#   DRAM latency: pointer-chase latency to HBM of about 450-600 ns on A100/H100 (Chips and
#     Cheese, "Nvidia's H100: Funny L2, and Tons of Bandwidth", 2023; Luo et al., "Dissecting
#     the NVIDIA Hopper Architecture through Microbenchmarking", arXiv:2501.12084) and higher on
#     CDNA; 600 ns and 700 ns are taken, loaded latency being above the unloaded one.
#   copy efficiency: device-to-device copy / STREAM figures of 3.0-3.1 TB/s on H100 SXM5,
#     1.35-1.4 TB/s on A100-40GB, about 80% of nominal on MI100 and one MI250X GCD (BabelStream
#     results published by the vendors and HPC centres).
#   L2 bandwidth: about 5.5 TB/s measured on H100 (Chips and Cheese, same article), ~4.8 TB/s
#     A100; the CDNA figures are nominal (64 B/clk per channel).
# loads_in_flight_per_lane (8) and the barrier cost (40 ns) are modelling assumptions: what
# ptxas/LLVM typically batch before the first use, and a __syncthreads of a few dozen clocks.
H100_TIMING = Timing(clock_hz=1.98e9, issue_per_clock=4, alu_latency_cycles=4, dram_latency_s=600e-9,
                     copy_efficiency=0.92, cache_bandwidth=5.5e12, max_blocks_per_processor=32,
                     loads_in_flight_per_lane=8, barrier_s=40e-9,
                     source="H100 SXM5: vendor figures and public microbenchmarks (gir/ir/target.py)")
A100_TIMING = Timing(clock_hz=1.41e9, issue_per_clock=4, alu_latency_cycles=4, dram_latency_s=600e-9,
                     copy_efficiency=0.89, cache_bandwidth=4.8e12, max_blocks_per_processor=32,
                     loads_in_flight_per_lane=8, barrier_s=40e-9,
                     source="A100-SXM4-40GB: vendor figures and public microbenchmarks (gir/ir/target.py)")
MI100_TIMING = Timing(clock_hz=1.502e9, issue_per_clock=1, alu_latency_cycles=4, dram_latency_s=700e-9,
                      copy_efficiency=0.80, cache_bandwidth=3.0e12, max_blocks_per_processor=32,
                      loads_in_flight_per_lane=8, barrier_s=40e-9,
                      source="MI100: vendor figures, public microbenchmarks, nominal L2 (gir/ir/target.py)")
MI250X_TIMING = Timing(clock_hz=1.7e9, issue_per_clock=1, alu_latency_cycles=4, dram_latency_s=700e-9,
                       copy_efficiency=0.82, cache_bandwidth=3.5e12, max_blocks_per_processor=32,
                       loads_in_flight_per_lane=8, barrier_s=40e-9,
                       source="MI250X GCD: vendor figures, public microbenchmarks, nominal L2 (gir/ir/target.py)")
GPU_LAUNCH_S = 2e-6  # gap between back-to-back kernels in one stream: 1-3 us on CUDA and HIP (public launch-latency measurements)

# Registers: the per-thread ceiling we let a kernel use without forcing spills (NVIDIA 255;
# CDNA has 512 VGPRs per SIMD lane-slot, but a 512-thread block leaves 128 per lane on gfx908). Shared memory: the largest per-block allocation.
PRESETS: dict[str, Target] = {
    "a100": _gpu("A100", "cuda", "sm_80", "warp", 32, 32, 108, 255, 163 * 1024,
                 1.555e12, 19.5e12, 19.5e12, 312e12, "A100-SXM4-40GB; 48 KiB static shared, 163 KiB opt-in",
                 A100_TIMING, GPU_LAUNCH_S),
    "h100": _gpu("H100", "cuda", "sm_90", "warp", 32, 32, 132, 255, 227 * 1024,
                 3.35e12, 31e12, 67e12, 989e12, "H100-SXM5-80GB", H100_TIMING, GPU_LAUNCH_S),
    "mi100": _gpu("MI100", "hip", "gfx908", "wavefront", 64, 16, 120, 128, 64 * 1024,
                  1.2288e12, 23e12, 23.1e12, 184.6e12, "CDNA1, 64-lane wavefronts", MI100_TIMING, GPU_LAUNCH_S),
    "mi250x": _gpu("MI250X", "hip", "gfx90a", "wavefront", 64, 16, 110, 128, 64 * 1024,
                   1.6384e12, 24e12, 23.9e12, 191.5e12, "one GCD of the MI250X (the unit a kernel runs on)",
                   MI250X_TIMING, GPU_LAUNCH_S),
}
ALIASES = {"cuda:sm_80": "a100", "cuda:sm_90": "h100", "hip:gfx908": "mi100", "hip:gfx90a": "mi250x", "cpu": "cpu"}
DESCRIBED = ("opencl",)  # backends that describe the device they find: gir/backends/NAME describe()


# The local CPU before `gir calibrate` has measured it: nominal figures of a recent x86 core.
CPU_NOMINAL_TIMING = Timing(
    clock_hz=3e9, issue_per_clock=2,      # two SIMD arithmetic ports
    alu_latency_cycles=0.5,               # out-of-order: one thread fills the ports itself
    dram_latency_s=90e-9, copy_efficiency=1.0, cache_bandwidth=50e9,
    max_blocks_per_processor=1, loads_in_flight_per_lane=10,  # L1 line-fill buffers
    barrier_s=0.0, unit_bandwidth=10e9,   # one thread's streaming copy, read + write
    widest_access_bytes=4,                # lanes are SIMD lanes: the compiler vectorises, not `vec`
    spill_bytes_per_unit=32 * 1024,       # a thread's register arrays sit on its stack: L1d of 32 KiB
    dependent_cycles=4,                   # FMA/add latency of x86 cores (Agner Fog's tables); measured by gir calibrate
    simd_across_units=True,               # the C emitter's across-units form (gir/backends/cpu/across_units.py)
    source="nominal CPU figures (gir/ir/target.py); run `gir calibrate` to measure this machine")


def local_cpu() -> Target:
    """The machine we run on: thread = unit, SIMD lanes = lanes, block = one unit, no scratchpad.
    Bandwidths, launch cost and issue rate are those `gir calibrate` measured on this CPU when
    it has (stored with the compile cache), else nominal."""
    cores = os.cpu_count() or 1
    simd = 8  # fp32 lanes of AVX2; the emitted C is vectorised by the compiler, not by hand
    from gir.backends.cpu.calibration import stored  # the measurement lives with the CPU backend
    measured = stored()
    timing = measured.timing if measured else CPU_NOMINAL_TIMING
    dram = measured.copy_bandwidth if measured else 10e9 * min(cores, 4)
    launch = measured.launch_s if measured else 2e-6
    return Target(
        name="CPU", backend="cpu", arch="native", hierarchy=("threads", "thread", "simd lane"),
        lanes_per_unit=simd, max_units_per_block=1, processors=cores,
        memory=(
            MemoryLevel(REGISTER, UNIT, 64 * 1024, float("inf")),  # registers + L1 stand-in per thread
            MemoryLevel(DRAM, DEVICE, 1 << 40, dram),
        ),
        peak_flops=cores * 3e9 * simd * 2, peak_matrix_flops=cores * 3e9 * simd * 2,
        launch_latency_s=launch, max_units_per_processor=1, timing=timing,
        notes=f"measured by gir calibrate on {measured.cpu}" if measured else
              "nominal figures estimated from the core count, not measured",
    )


def get_target(name: str) -> Target:
    """Look a target up by preset name ("h100") or by the CLI's backend:arch form ("cuda:sm_90")."""
    key = ALIASES.get(name.lower(), name.lower())
    if key == "cpu":
        return local_cpu()
    if key in PRESETS:
        return PRESETS[key]
    if key in DESCRIBED:
        from importlib import import_module
        return import_module(f"gir.backends.{key}").describe()
    known = sorted(set(PRESETS) | set(ALIASES) | set(DESCRIBED))
    raise KeyError(f"unknown target {name!r}; known targets: {', '.join(known)}")
