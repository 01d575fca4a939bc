"""OpenCL C dialect of the C-like emitter: block = work-group, shared = __local memory with
barrier(), unit = one work-item whose lanes are loop iterations (LoopedLanes, as on the CPU
port: registers are private arrays, a unit-scope sync needs nothing).

OpenCL C 1.2 has no `half` values without cl_khr_fp16 and no `bool` in kernel arguments, so
fp16 is stored as ushort (converted exactly in software, as on the CPU port) and bool as uchar;
math builtins are overloaded (`exp`, not `expf`) and `long` is 64-bit.
"""
from __future__ import annotations

from gir.ir import BLOCK, DRAM, LANE, UNIT

from ..cstyle import CStyle, LoopedLanes
from ..kernels import Kernel
from ..prelude import CSpelling, shared_prelude

CL_PRELUDE = r"""#ifndef GIR_PRELUDE
#define GIR_PRELUDE
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#define GIR_INF_F INFINITY
#define GIR_NAN_F NAN
#define GIR_INF_D as_double(0x7ff0000000000000L)
#define GIR_NAN_D as_double(0x7ff8000000000000L)
#define gir_fbits(f) as_uint(f)
#define gir_bitsf(u) as_float(u)
#define expf exp
#define logf log
#define sqrtf sqrt
#define tanhf tanh
#define erff erf
#define floorf floor
#define ceilf ceil
#define sinf sin
#define cosf cos
#define fabsf fabs
#define powf pow
#define fmodf fmod
""" + shared_prelude(CSpelling("inline", "ushort", "uint", "long")) + r"""#endif
"""

class OpenCLEmitter(LoopedLanes, CStyle):
    kernel_prefix = "__kernel void"
    restrict = "restrict"
    shared_prefix = "__local "
    gather_flag_type = "__global int*"
    types = {"float32": "float", "float16": "ushort", "bfloat16": "ushort", "float64": "double", "int64": "long",
             "int32": "int", "int8": "char", "uint8": "uchar", "bool": "uchar"}

    def prelude(self) -> str:
        return CL_PRELUDE

    def launch_bounds(self, k: Kernel) -> str:
        return f"__attribute__((reqd_work_group_size({k.prim.units_per_block}, 1, 1))) "

    def param(self, buf, k: Kernel) -> str:
        return "__global " + super().param(buf, k)

    def prologue(self, k: Kernel) -> list[str]:
        upb = k.prim.units_per_block
        return ["const int w = get_local_id(0);", "const int b = get_group_id(0);",
                "const int u = b + w;" if upb == 1 else f"const int u = b * {upb} + w;", *self.block_coords(k)]

    def op_Sync(self, op) -> list[str]:
        """Lane and unit scope: nothing (one work-item). Block scope: a work-group barrier that
        fences the memory the synced slice lives in (global memory needs its own fence)."""
        if op.scope in (LANE, UNIT):
            return []
        if op.scope == BLOCK:
            return [f"barrier({'CLK_GLOBAL_MEM_FENCE' if self.level(op.slice) == DRAM else 'CLK_LOCAL_MEM_FENCE'});"]
        return super().op_Sync(op)  # a device sync inside a kernel: the base class reports it

    def half_to_float(self, x: str) -> str:
        return f"gir_h2f({x})"

    def float_to_half(self, x: str) -> str:
        return f"gir_f2h({x})"

    def bf16_to_float(self, x: str) -> str:
        return f"gir_b2f({x})"

    def float_to_bf16(self, x: str) -> str:
        return f"gir_f2b({x})"

    def ctype(self, dtype: str) -> str:
        return "bool" if dtype == "bool" else super().ctype(dtype)  # uchar only in memory

    def literal(self, value, dtype: str) -> str:
        text = super().literal(value, dtype)
        return text.replace("LL", "L") if dtype == "int64" else text  # `long long` is reserved in OpenCL C
