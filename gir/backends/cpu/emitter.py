"""CPU dialect of the C-like emitter: C11 + OpenMP. A unit is one iteration of an OpenMP
`parallel for`; its lanes are the iterations of each gOperator's element loop (LoopedLanes:
the compiler vectorises the loop over SIMD lanes), so Sync(UNIT) and Sync(BLOCK) (one unit per
block) are nothing."""
from __future__ import annotations

from ..cstyle import CStyle, LoopedLanes
from ..kernels import EmitError, Kernel

CPU_PRELUDE = r"""#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#ifndef GIR_PRELUDE
#define GIR_PRELUDE
#define GIR_INF_F INFINITY
#define GIR_NAN_F NAN
#define GIR_INF_D ((double)INFINITY)
#define GIR_NAN_D ((double)NAN)
#define GIR_MAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define GIR_MIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define GIR_RH(x) gir_h2f(gir_f2h(x))
static inline uint32_t gir_fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float gir_bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline float gir_h2f(uint16_t h) {  /* fp16 storage -> float, exact */
  uint32_t o = ((uint32_t)h & 0x7fffu) << 13, e = o & (0x7c00u << 13);
  o += (uint32_t)(127 - 15) << 23;
  if (e == 0x7c00u << 13) o += (uint32_t)(128 - 16) << 23;
  else if (e == 0) o = gir_fbits(gir_bitsf(o + (1u << 23)) - gir_bitsf(113u << 23));
  return gir_bitsf(o | ((uint32_t)h & 0x8000u) << 16);
}
static inline uint16_t gir_f2h(float f) {  /* float -> fp16, round to nearest even */
  uint32_t u = gir_fbits(f), sign = u & 0x80000000u, o;
  u ^= sign;
  if (u >= 0x47800000u) o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  else if (u < 0x38800000u) o = gir_fbits(gir_bitsf(u) + gir_bitsf(126u << 23)) - (126u << 23);
  else o = (u + ((uint32_t)(15 - 127) << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
  return (uint16_t)(o | (sign >> 16));
}
static inline long long gir_ipow(long long a, long long e) {
  long long r = 1;
  for (; e > 0; --e) r *= a;
  return r;
}
int gir_gather_oob = 0;  /* set when a Gather index was out of range; the engine reads and clears it */
#endif
"""


class CpuEmitter(LoopedLanes, CStyle):
    kernel_prefix = "void"
    gather_flag_type = None  # the library's gir_gather_oob global instead (one process, one flag)
    restrict = "restrict"
    types = {"float32": "float", "float16": "uint16_t", "float64": "double", "int64": "int64_t",
             "int32": "int32_t", "int8": "int8_t", "uint8": "uint8_t", "bool": "bool"}

    def prelude(self) -> str:
        return CPU_PRELUDE

    def gather_out_of_range(self) -> str:
        return "__atomic_store_n(&gir_gather_oob, 1, __ATOMIC_RELAXED);"

    def launch_bounds(self, k: Kernel) -> str:
        return ""

    def half_to_float(self, x: str) -> str:
        return f"gir_h2f({x})"

    def float_to_half(self, x: str) -> str:
        return f"gir_f2h({x})"

    def kernel_frame(self, k: Kernel):
        head, _ = super().kernel_frame(k)
        return [*head, "  #pragma omp parallel for schedule(static)",
                f"  for (int u = 0; u < {k.prim.num_units}; ++u) {{"], ["  }", "}"]

    def prologue(self, k: Kernel) -> list[str]:
        upb = k.prim.units_per_block
        if upb != 1:
            raise EmitError(f"{k.name}: the CPU runs one unit per block, not {upb}")
        return ["const int w = 0;", "const int b = u;", *self.block_coords(k)]

    def declarations(self, k: Kernel) -> list[str]:
        shared = [n for n, b in k.buffers.items() if b.level == "shared"]
        if shared:
            raise EmitError(f"{k.name}: the CPU has no shared memory ({', '.join(shared)})")
        return super().declarations(k)

    def op_Sync(self, op) -> list[str]:
        return []  # lanes are loop iterations of one thread, and a block is one unit


def emit(kernel: Kernel, target) -> str:
    return CpuEmitter(target).emit(kernel)
