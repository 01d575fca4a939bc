"""The OpenCL device GIR runs on, and its hardware description built from what it reports.

Why query instead of a preset: an OpenCL device can be anything (PoCL on a CPU in CI, a GPU
driver elsewhere), so work-group size, local memory, global memory, compute units and clock
come from the device itself. The unit is one work-item (PoCL 3.1 has no sub-groups, and a
sub-group unit needs a fixed sub-group size and shuffles, which few drivers offer: see
docs/PORTING.md). Bandwidths and launch latency cannot be queried: they are nominal.
"""
from __future__ import annotations

import os
from functools import lru_cache

from gir.ir.target import BLOCK, DEVICE, DRAM, REGISTER, SHARED, UNIT, MemoryLevel, Target

from ..errors import ToolchainMissingError

_INSTALL = "run scripts/setup.sh (installs pyopencl and Debian's pocl-opencl-icd)"
NOMINAL_DRAM_BYTES_PER_S = {"cpu": 20e9, "gpu": 500e9}  # not measured: an order of magnitude per device type
# Private memory a work-item may use: a GPU thread's register ceiling (as on the GPU presets); on
# a CPU device private arrays live in cache, budgeted as the local CPU target does. Nominal.
PRIVATE_BYTES = {"cpu": 64 * 1024, "gpu": 255 * 4}


def cl():
    try:
        import pyopencl
    except ImportError:
        raise ToolchainMissingError(f"pyopencl is not installed: {_INSTALL}") from None
    return pyopencl


@lru_cache(maxsize=None)
def device():
    """The first OpenCL device, or the first whose name contains $GIR_OPENCL_DEVICE."""
    pyopencl = cl()
    want = os.environ.get("GIR_OPENCL_DEVICE", "")
    try:
        found = [d for p in pyopencl.get_platforms() for d in p.get_devices()]
    except pyopencl.Error:  # the ICD loader finds no platform at all
        found = []
    chosen = [d for d in found if want.lower() in d.name.lower()]
    if not chosen:
        named = f" named like {want!r}" if want else ""
        raise ToolchainMissingError(f"no OpenCL device{named} ({len(found)} present): {_INSTALL}")
    return chosen[0]


@lru_cache(maxsize=None)
def context_and_queue():
    pyopencl = cl()
    ctx = pyopencl.Context([device()])
    return ctx, pyopencl.CommandQueue(ctx)


def describe() -> Target:
    """The Target of device(): hierarchy, local memory, work-group and clock as reported."""
    dev = device()
    kind = "cpu" if dev.type & cl().device_type.CPU else "gpu"
    dram_bw = NOMINAL_DRAM_BYTES_PER_S[kind]
    flops = dev.max_compute_units * dev.max_clock_frequency * 1e6 * 2 * dev.native_vector_width_float
    return Target(
        name=f"OpenCL {dev.name.split('-')[0]}", backend="opencl", arch=dev.name,
        hierarchy=("ndrange", "work-group", "work-item", "lane"),
        lanes_per_unit=1, max_units_per_block=dev.max_work_group_size,
        processors=dev.max_compute_units,
        memory=(
            MemoryLevel(REGISTER, UNIT, PRIVATE_BYTES[kind], float("inf")),
            MemoryLevel(SHARED, BLOCK, dev.local_mem_size, 2 * dram_bw),  # nominal, as DRAM's
            MemoryLevel(DRAM, DEVICE, dev.global_mem_size, dram_bw),
        ),
        peak_flops=flops, peak_matrix_flops=flops, launch_latency_s=10e-6,
        notes=f"{dev.platform.name.strip()} {dev.version.strip()}; unit = work-item; capacities queried, "
              f"bandwidths and launch latency nominal",
    )
