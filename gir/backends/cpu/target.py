"""The local CPU as a target: thread = unit, SIMD lanes = lanes, block = one unit, no scratchpad.

Why here and not in gir/ir: its figures come from this backend's calibration (`gir calibrate`,
calibration.py) when this CPU was measured, else from the nominal figures below.
"""
from __future__ import annotations

import os
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from gir.ir.target import DEVICE, DRAM, REGISTER, UNIT, MemoryLevel, Target, Timing
from gir.runtime.onednn import EPILOGUES

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
    simd_across_units=True,               # the C emitter's across-units form (gir/backends/across_units.py)
    serial_below_bytes=1 << 20,           # what one thread streams (~30 GB/s) while a team of sleeping threads
                                          # forks and joins (38 us measured, passive waits): see gir/ir/one_thread.py
    wake_s=38e-6,                         # a fork whose threads sleep (passive waits, session 13's calibration)
    spin_s=20e-6,                         # the engine's 1000 spins: 20-40 us measured on an AMD EPYC (session 19)
    warm_bandwidth=100e9, warm_unit_bandwidth=60e9,  # a copy of 2 MiB arrays: 110-130 and 65-77 GB/s
                                          # on that EPYC (session 19); measured by gir calibrate
    hot_unit_bandwidth=80e9,              # a copy of 256-512 KiB arrays, one thread: 64-81 GB/s on an Intel Xeon
                                          # VM (2026-11-27); measured by gir calibrate
    stream_gain=1.2,                      # eight GEMV rows side by side over one, one thread: 1.1-1.4 on an Intel
                                          # Xeon VM (session 24, results/gemv_streams.md); measured by gir calibrate
    adjacent_stream_gain=1.1,             # eight adjacent rows: 1.04-1.09 there, 0.64-0.72 on an AMD EPYC VM (session 36)
    unit_setup=3,                         # per-unit index arithmetic: the compiler hoists most of it out of the
                                          # loop over units (GPUs keep the model's 12; tau-b on the rank data)
    source="nominal CPU figures (gir/backends/cpu/target.py); run `gir calibrate` to measure this machine")


# What share of the last-level cache still holds the buffers the kernels just before touched:
# the other half holds the weights and whatever else the run streams past (a rule of thumb;
# AMD's L3 is a victim cache of the L2s, so it fills only as lines leave them).
CACHE_SHARE = 2


@lru_cache(maxsize=1)
def last_level_cache_bytes() -> int:
    """The largest cache level's data or unified caches over all cores together (each shared
    cache once), as Linux reports them; 0 where it does not (the model then has no cache term)."""
    found = _caches()
    return sum(found[max(found)].values()) if found else 0


@lru_cache(maxsize=1)
def core_cache_bytes() -> int:
    """The cache level just below the last (L2 where Linux reports L1, L2 and L3: a core's own
    on current x86 and Arm cores), one instance; 0 where there is no such level."""
    levels = sorted(_caches())
    return max(_caches()[levels[-2]].values()) if len(levels) >= 3 else 0


@lru_cache(maxsize=1)
def _caches() -> dict[int, dict[str, int]]:
    """level -> {shared_cpu_list: bytes} of the data and unified caches Linux reports."""
    found: dict[int, dict[str, int]] = {}
    for index in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
            size = (index / "size").read_text().strip()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            found.setdefault(level, {})[shared] = int(size.rstrip("KMG")) * scale
        except (OSError, ValueError):
            continue
    return found


def local_cpu() -> Target:
    """The machine we run on. Bandwidths, launch cost and issue rate are those `gir calibrate`
    measured on this CPU when it has (stored with the compile cache), else nominal."""
    cores = os.cpu_count() or 1
    simd = 8  # fp32 lanes of AVX2; the emitted C is vectorised by the compiler, not by hand
    from .calibration import stored
    measured = stored()
    timing = replace(measured.timing if measured else CPU_NOMINAL_TIMING,
                     cache_bytes=last_level_cache_bytes() // CACHE_SHARE,
                     hot_bytes=core_cache_bytes() // CACHE_SHARE)
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
        # what oneDNN (and the numpy fallback) run after a library op; how oneDNN runs a call, where
        # `gir calibrate` timed it (gir/runtime/library_calls.py): the partition's time check then applies here too
        extra={"library_epilogues": EPILOGUES,
               **({"library_calls": measured.library_calls} if measured and measured.library_calls else {})},
    )
