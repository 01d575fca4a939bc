"""Run a whole GIR-Graph's emitted CUDA or HIP source on the CPU harness, kernel by kernel,
with numpy arrays for every DRAM tensor: how CI checks emitted kernels against the reference
interpreter without a GPU."""
from __future__ import annotations

from typing import Callable

from ..kernels import allocate_dram, check_gather_flag, collect_outputs, gather_flags, split_kernels
from .runner import WARP, run_kernel


def emitter_for(dialect: str, target):
    if dialect == "cuda":
        from ..cuda.emitter import CudaEmitter
        return CudaEmitter(target)
    if dialect == "hip":
        from ..hip.emitter import HipEmitter
        return HipEmitter(target)
    raise ValueError(f"dialect must be 'cuda' or 'hip', got {dialect!r}")


def run_on_cpu_harness(graph, feeds: dict, dialect: str | None = None,
                       edit: Callable[[str], str] | None = None) -> dict:
    """Outputs of `graph` computed by its emitted kernels (grid = blocks, block = units x lanes).
    `edit` rewrites each kernel's source before it is built (tests inject bugs with it)."""
    dialect = dialect or graph.target.backend
    lanes = graph.target.lanes_per_unit
    if WARP.get(dialect) != lanes:
        raise ValueError(f"{graph.name}: {lanes}-lane units cannot run as {dialect} on the harness "
                         f"(its warps have {WARP.get(dialect)} lanes)")
    emitter = emitter_for(dialect, graph.target)
    arrays = allocate_dram(graph, feeds)
    kernels = split_kernels(graph)
    flags = gather_flags(kernels)
    for k in kernels:
        source = emitter.emit(k)
        if edit is not None:
            source = edit(source)
        args = []
        for buf in k.params:
            a = arrays[buf.name]
            if not k.is_written(buf.name):
                a = a.view()
                a.flags.writeable = False  # the harness then checks the kernel left it alone
            args.append(a)
        if k.name in flags:
            args.append(flags[k.name])
        run_kernel(source, k.name, (k.num_blocks,), (k.block_threads,), args, dialect)
        if k.name in flags:
            check_gather_flag(k.name, flags[k.name])
    return collect_outputs(graph, arrays)
