"""CUDA dialect of the C-like emitter: 32-lane warps, *_sync shuffles, cuda_fp16.h and cuda_bf16.h; plus
`compile`, which emits a graph's kernels into one source and builds it with NVRTC."""
from __future__ import annotations

from ..cstyle import CStyle
from ..prelude import GPU_PRELUDE
from ..kernels import CompiledGraph, Kernel, check_resources, check_shared, emit_graph, unit_name
from .compiler import compile_cuda
from .target import STATIC_SHARED_BYTES as STATIC_SHARED  # per kernel without an opt-in


class CudaEmitter(CStyle):
    def prelude(self) -> str:
        return ("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n" + GPU_PRELUDE
                + f"#define GIR_SHFL(v, s) __shfl_sync(0xffffffffu, (v), (s), {self.L})\n"
                + f"#define GIR_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), {self.L})\n")


def emit(kernel: Kernel, target) -> str:
    return CudaEmitter(target).emit(kernel)


def compile(graph, target=None) -> CompiledGraph:
    """Emit and compile for target.arch (default: the graph's target); a SpillWarning for a
    kernel that spills, a ResourceError for shared memory that cannot fit."""
    target = target or graph.target
    source, kernels = emit_graph(CudaEmitter(target), graph)
    check_shared(kernels, target, STATIC_SHARED)
    binary = compile_cuda(source, target.arch, name=f"{unit_name(graph, kernels)}.cu")
    check_resources(kernels, binary.resources, target, spills="warn")
    return CompiledGraph(source, kernels, binary)
