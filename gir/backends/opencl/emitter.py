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

CL_PRELUDE = r"""#ifndef GIR_PRELUDE
#define GIR_PRELUDE
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#define GIR_INF_F INFINITY
#define GIR_NAN_F NAN
#define GIR_INF_D as_double(0x7ff0000000000000L)
#define GIR_NAN_D as_double(0x7ff8000000000000L)
#define GIR_MAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define GIR_MIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define GIR_RH(x) gir_h2f(gir_f2h(x))
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
inline float gir_h2f(ushort h) {  /* fp16 storage -> float, exact */
  uint o = ((uint)h & 0x7fffu) << 13, e = o & (0x7c00u << 13);
  o += (uint)(127 - 15) << 23;
  if (e == 0x7c00u << 13) o += (uint)(128 - 16) << 23;
  else if (e == 0) o = as_uint(as_float(o + (1u << 23)) - as_float(113u << 23));
  return as_float(o | ((uint)h & 0x8000u) << 16);
}
inline ushort gir_f2h(float f) {  /* float -> fp16, round to nearest even */
  uint u = as_uint(f), sign = u & 0x80000000u, o;
  u ^= sign;
  if (u >= 0x47800000u) o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  else if (u < 0x38800000u) o = as_uint(as_float(u) + as_float(126u << 23)) - (126u << 23);
  else o = (u + ((uint)(15 - 127) << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
  return (ushort)(o | (sign >> 16));
}
inline float gir_b2f(ushort h) { return as_float((uint)h << 16); }  /* bf16 storage -> float */
inline ushort gir_f2b(float f) {  /* float -> bf16, round to nearest even, NaN kept quiet */
  const uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
  return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#define GIR_RB(x) gir_b2f(gir_f2b(x))
inline long gir_ipow(long a, long e) {
  long r = 1;
  for (; e > 0; --e) r *= a;
  return r;
}
#endif
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
