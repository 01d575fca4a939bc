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
        fp16 GEMMs run on the matrix units; fp32 ones on the vector units (no silent TF32)."""
        peak = self.peak_matrix_flops if dtype == "float16" else self.peak_flops
        return peak / self.dram_bandwidth

    @property
    def register_bytes_per_lane(self) -> int:
        return self.level(REGISTER).capacity_bytes

    @property
    def shared_bytes_per_block(self) -> int:
        return self.level(SHARED).capacity_bytes if self.has_level(SHARED) else 0


def _gpu(name, backend, arch, unit, lanes, max_units, procs, regs, smem, dram_bw, smem_bw, fp32, matrix, notes):
    return Target(
        name=name, backend=backend, arch=arch,
        hierarchy=("grid", "block", unit, "lane"), lanes_per_unit=lanes, max_units_per_block=max_units,
        processors=procs,
        memory=(
            MemoryLevel(REGISTER, UNIT, regs * 4, float("inf")),
            MemoryLevel(SHARED, BLOCK, smem, smem_bw),
            MemoryLevel(DRAM, DEVICE, 1 << 40, dram_bw),
        ),
        peak_flops=fp32, peak_matrix_flops=matrix, launch_latency_s=4e-6,
        max_units_per_processor=2048 // lanes, notes=notes,
    )


# Registers: the per-thread ceiling we let a kernel use without forcing spills (NVIDIA 255;
# CDNA has 512 VGPRs per SIMD lane-slot, but a 512-thread block leaves 128 per lane on gfx908). Shared memory: the largest per-block allocation.
PRESETS: dict[str, Target] = {
    "a100": _gpu("A100", "cuda", "sm_80", "warp", 32, 32, 108, 255, 163 * 1024,
                 1.555e12, 19.5e12, 19.5e12, 312e12, "A100-SXM4-40GB; 48 KiB static shared, 163 KiB opt-in"),
    "h100": _gpu("H100", "cuda", "sm_90", "warp", 32, 32, 132, 255, 227 * 1024,
                 3.35e12, 31e12, 67e12, 989e12, "H100-SXM5-80GB"),
    "mi100": _gpu("MI100", "hip", "gfx908", "wavefront", 64, 16, 120, 128, 64 * 1024,
                  1.2288e12, 23e12, 23.1e12, 184.6e12, "CDNA1, 64-lane wavefronts"),
    "mi250x": _gpu("MI250X", "hip", "gfx90a", "wavefront", 64, 16, 110, 128, 64 * 1024,
                   1.6384e12, 24e12, 23.9e12, 191.5e12, "one GCD of the MI250X (the unit a kernel runs on)"),
}
ALIASES = {"cuda:sm_80": "a100", "cuda:sm_90": "h100", "hip:gfx908": "mi100", "hip:gfx90a": "mi250x", "cpu": "cpu"}
DESCRIBED = ("opencl",)  # backends that describe the device they find: gir/backends/NAME describe()


def local_cpu() -> Target:
    """The machine we run on: thread = unit, SIMD lanes = lanes, block = one unit, no scratchpad."""
    cores = os.cpu_count() or 1
    simd = 8  # fp32 lanes of AVX2; the emitted C is vectorised by the compiler, not by hand
    return Target(
        name="CPU", backend="cpu", arch="native", hierarchy=("threads", "thread", "simd lane"),
        lanes_per_unit=simd, max_units_per_block=1, processors=cores,
        memory=(
            MemoryLevel(REGISTER, UNIT, 64 * 1024, float("inf")),  # registers + L1 stand-in per thread
            MemoryLevel(DRAM, DEVICE, 1 << 40, 10e9 * min(cores, 4)),
        ),
        peak_flops=cores * 3e9 * simd * 2, peak_matrix_flops=cores * 3e9 * simd * 2,
        launch_latency_s=2e-6, max_units_per_processor=1,
        notes="nominal figures estimated from the core count, not measured",
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
