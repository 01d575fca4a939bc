"""Build emitted OpenCL C for the device with pyopencl, and run graphs on it.

Why pyopencl: a pip wheel with its own ICD loader, so any installed OpenCL driver (PoCL from
Debian in CI) is found through /etc/OpenCL/vendors with no build step. The driver caches
built programs (PoCL: ~/.cache/pocl), so tests rebuild little on a second run.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import CompileError
from ..kernels import (GUARD, CompiledGraph, allocate_dram, check_gather_flag, check_guards, check_shared, collect_outputs,
                       emit_graph, gather_flags, with_guards)
from .device import cl, context_and_queue, device
from .emitter import OpenCLEmitter

BUILD_OPTIONS = ["-cl-std=CL1.2", "-w"]  # warnings (constant conditions) are the emitter's business, not the log's


class BuildError(CompileError):
    """The driver rejected the source; the first line carries the log's first error."""

    def __init__(self, what: str, target: str, log: str):
        super().__init__(what, target, log)
        first = next((ln.strip() for ln in log.splitlines() if "error" in ln.lower()), "see the build log")
        self.args = (f"{what}: compilation for {target} failed: {first}\n{log.rstrip()}",)


def toolchain_version() -> str:
    """pyopencl, the driver and the device: part of the model cache's key."""
    dev = device()
    return f"pyopencl {cl().VERSION_TEXT}; {dev.platform.name.strip()} {dev.driver_version}; {dev.name}"


def build(source: str, name: str = "gir"):
    """A built pyopencl Program of the source (every kernel in it) for device()."""
    pyopencl = cl()
    ctx, _ = context_and_queue()
    try:
        return pyopencl.Program(ctx, source).build(options=BUILD_OPTIONS)
    except pyopencl.RuntimeError as err:  # its text holds the driver's build log
        raise BuildError(f"OpenCL source of {name!r}", device().name, str(err)) from None


def compile(graph, target=None) -> CompiledGraph:
    """Emit and build for the device; ResourceError when a work-group's local memory cannot fit."""
    target = target or graph.target
    source, kernels = emit_graph(OpenCLEmitter(target), graph)
    check_shared(kernels, target)
    return CompiledGraph(source, kernels, build(source, graph.name))


def run(graph, feeds: dict, edit: Callable[[str], str] | None = None) -> dict:
    """Outputs of `graph` from its kernels launched in order on the device (NDRange = blocks x
    work-group). Buffers sit between guard bytes, as on the CPU port, so a stray write is an
    OutOfBoundsError. `edit` rewrites the source before it is built (tests inject bugs with it)."""
    pyopencl = cl()
    ctx, queue = context_and_queue()
    source, kernels = emit_graph(OpenCLEmitter(graph.target), graph)
    check_shared(kernels, graph.target)
    program = build(edit(source) if edit else source, graph.name)
    arrays = allocate_dram(graph, feeds)
    raws = {name: with_guards(a) for name, a in arrays.items()}
    flags_rw = pyopencl.mem_flags.READ_WRITE | pyopencl.mem_flags.COPY_HOST_PTR
    whole = {name: pyopencl.Buffer(ctx, flags_rw, hostbuf=raw) for name, raw in raws.items()}
    views = {name: whole[name].get_sub_region(GUARD, max(a.nbytes, 1)) for name, a in arrays.items()}
    flags = gather_flags(kernels)
    flag_bufs = {name: pyopencl.Buffer(ctx, flags_rw, hostbuf=f) for name, f in flags.items()}
    for k in kernels:
        kernel = getattr(program, k.name)
        kernel.set_args(*[views[b.name] for b in k.params], *([flag_bufs[k.name]] if k.name in flags else []))
        pyopencl.enqueue_nd_range_kernel(queue, kernel, (k.prim.num_units,), (k.prim.units_per_block,))
    for name, buf in flag_bufs.items():
        pyopencl.enqueue_copy(queue, flags[name], buf)
    for name, raw in raws.items():
        pyopencl.enqueue_copy(queue, raw, whole[name])
    queue.finish()
    for name, a in arrays.items():
        users = " or ".join(k.name for k in kernels if any(b.name == name for b in k.params))
        check_guards(raws[name], a.nbytes, users, name)
        a.view(np.uint8)[:] = raws[name][GUARD:GUARD + a.nbytes]
    for name, flag in flags.items():
        check_gather_flag(name, flag)
    return collect_outputs(graph, arrays)
