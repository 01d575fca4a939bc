"""HIP dialect of the C-like emitter: lanes = the target's wavefront (64 on CDNA), mask-less
shuffles, hip_runtime.h only (hiprtc's built-ins define __half; hip_fp16.h would clash); plus
`compile`, which emits a graph's kernels into one source and builds it with hiprtc."""
from __future__ import annotations

from ..cstyle import CStyle
from ..prelude import GPU_PRELUDE
from ..kernels import CompiledGraph, Kernel, check_resources, check_shared, emit_graph, unit_name
from .compiler import compile_hip

# A wavefront executes in lockstep; a unit-scope sync on LDS only has to order memory. The CPU
# harness (no amdgcn builtins) gets __syncwarp, which it provides for both dialects.
SYNC_UNIT = """#if defined(__HIP_DEVICE_COMPILE__) || defined(__HIPCC_RTC__)
#define GIR_SYNC_UNIT() (__builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront"), __builtin_amdgcn_wave_barrier(), \\
                         __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront"))
#else
#define GIR_SYNC_UNIT() __syncwarp()
#endif
"""


class HipEmitter(CStyle):
    # bf16 as its 16 bits, converted by the prelude's gir_b2f/gir_f2b (round to nearest even):
    # hiprtc's built-in headers have no bf16 type to include without clashing
    types = {**CStyle.types, "bfloat16": "unsigned short"}

    def bf16_to_float(self, x: str) -> str:
        return f"gir_b2f({x})"

    def float_to_bf16(self, x: str) -> str:
        return f"gir_f2b({x})"

    def half_bits(self, x: str, dtype: str) -> str:
        return x if dtype == "bfloat16" else super().half_bits(x, dtype)

    def half_from_bits(self, u: str, dtype: str) -> str:
        return u if dtype == "bfloat16" else super().half_from_bits(u, dtype)

    def prelude(self) -> str:
        return ("#include <hip/hip_runtime.h>\n" + GPU_PRELUDE + SYNC_UNIT
                + f"#define GIR_SHFL(v, s) __shfl((v), (s), {self.L})\n"
                + f"#define GIR_SHFL_XOR(v, m) __shfl_xor((v), (m), {self.L})\n")

    def sync_unit(self) -> str:
        return "GIR_SYNC_UNIT();"


def emit(kernel: Kernel, target) -> str:
    return HipEmitter(target).emit(kernel)


def compile(graph, target=None) -> CompiledGraph:
    """Emit and compile for target.arch (default: the graph's target); a SpillWarning for a
    kernel that spills, a ResourceError for shared memory that cannot fit."""
    target = target or graph.target
    source, kernels = emit_graph(HipEmitter(target), graph)
    check_shared(kernels, target)
    binary = compile_hip(source, target.arch, name=f"{unit_name(graph, kernels)}.hip")
    check_resources(kernels, binary.resources, target, spills="warn")
    return CompiledGraph(source, kernels, binary)
