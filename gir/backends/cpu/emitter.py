"""CPU dialect of the C-like emitter: C11 + OpenMP. A unit is one iteration of an OpenMP
`parallel for`; its lanes are the iterations of each gOperator's element loop (LoopedLanes:
the compiler vectorises the loop over SIMD lanes), so Sync(UNIT) and Sync(BLOCK) (one unit per
block) are nothing."""
from __future__ import annotations

from gir.ir.one_thread import runs_on_one_thread

from ..cstyle import CStyle, LoopedLanes
from ..kernels import EmitError, Kernel
from ..prelude import CSpelling, shared_prelude
from ..across_units import AcrossUnits
from ..transpose_tiles import TransposeTiles

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
static inline uint32_t gir_fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float gir_bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
""" + shared_prelude(CSpelling("static inline", "uint16_t", "uint32_t", "long long")) + r"""#if defined(__FMA__) || defined(__AVX512F__) || defined(__ARM_FEATURE_FMA)
#define GIR_FMA(a, b, c) fmaf(a, b, c)  /* one instruction and one rounding where the ISA has it */
#else
#define GIR_FMA(a, b, c) ((a) * (b) + (c))  /* fmaf without the instruction is a libm call */
#endif
#if defined(__GNUC__) && !defined(__clang__)
#define GIR_ONE_VECTOR __attribute__((optimize("no-tree-loop-im", "no-tree-pre")))  /* see launch_bounds */
#else
#define GIR_ONE_VECTOR
#endif
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#define GIR_TILE16 1  /* the channel-lane form's staging copies 16x16 float tiles in registers */
typedef float gir_v16f __attribute__((vector_size(64)));
typedef int gir_v16i __attribute__((vector_size(64)));
static inline void gir_tile16(const float* src, long ss, float* dst, long ds) {
  /* dst[j * ds + l] = src[l * ss + j] for j, l < 16: at scales 1, 2, 4 and 8 the off-diagonal
     blocks swap, one two-source shuffle per row each (vpermt2ps); 4x the scalar copy's rate */
  gir_v16f m[16];
  for (int l = 0; l < 16; ++l) memcpy(&m[l], src + l * ss, 64);
#define GIR_SWAP(s, ...) for (int i = 0; i < 16; ++i) if (!(i & s)) { const gir_v16f a = m[i], b = m[i + s]; \
    const gir_v16i lo = {__VA_ARGS__}, hi = lo + s; m[i] = __builtin_shuffle(a, b, lo); m[i + s] = __builtin_shuffle(a, b, hi); }
  GIR_SWAP(1, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)
  GIR_SWAP(2, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
  GIR_SWAP(4, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
  GIR_SWAP(8, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
#undef GIR_SWAP
  for (int j = 0; j < 16; ++j) memcpy(dst + j * ds, &m[j], 64);
}
#endif
static inline float gir_expf(float x) {
  /* exp as 2^n * p(r), n = round(x / ln 2), r = x - n ln 2 in two parts, p Cephes' minimax
     polynomial; 2^n built from the exponent bits in two factors so that overflow gives inf and
     the subnormal range rounds once. Branch-free, so gcc vectorises it (libm's expf is a call
     per element): < 1 ulp from the exact result over the normal range, same inf/0/NaN. The
     polynomials are fused multiply-adds where the CPU has them (GIR_FMA): the kernels'
     own arithmetic keeps -ffp-contract=off, these approximations need no bit-exact rounding,
     and fused they ran 1.4x faster (results/cpu_math_probes.md). */
  float xc = x > 88.8f ? 88.8f : x;
  xc = xc < -104.0f ? -104.0f : xc;  /* NaN passes both */
  const float n = GIR_FMA(xc, 1.44269504088896341f, 12582912.0f) - 12582912.0f;  /* round: 1.5 * 2^23 */
  const float r = GIR_FMA(n, 2.12194440e-4f, GIR_FMA(n, -0.693359375f, xc));
  float p = 1.9875691500e-4f;
  p = GIR_FMA(p, r, 1.3981999507e-3f);
  p = GIR_FMA(p, r, 8.3334519073e-3f);
  p = GIR_FMA(p, r, 4.1665795894e-2f);
  p = GIR_FMA(p, r, 1.6666665459e-1f);
  p = GIR_FMA(p, r, 5.0000001201e-1f);
  p = GIR_FMA(p, r * r, r) + 1.0f;
  const int32_t e = (int32_t)n, e1 = e >> 1, e2 = e - e1;
  return p * gir_bitsf((uint32_t)(e1 + 127) << 23) * gir_bitsf((uint32_t)(e2 + 127) << 23);
}
static inline float gir_erff(float x) {
  /* erf, branch-free so gcc vectorises it (libm's erff is a call per element): |x| <= 1 as
     x * P(x^2), P a degree-6 Chebyshev fit of erf(x)/x; 1 < |x| < 4 as 1 - exp(-x^2) * Q(1/x), Q a
     degree-8 fit of erfc(x) exp(x^2); beyond 4 it is 1 in float32. Within 2.5 ulp of the exact
     result (libm: 0.8), same 0, inf and NaN. */
  const float a = fabsf(x), t = a * a;
  float ps = 7.882500444e-05f;
  ps = GIR_FMA(ps, t, -8.018859014e-04f);
  ps = GIR_FMA(ps, t, 5.189312812e-03f);
  ps = GIR_FMA(ps, t, -2.685432954e-02f);
  ps = GIR_FMA(ps, t, 1.128359749e-01f);
  ps = GIR_FMA(ps, t, -3.761262691e-01f);
  const float small = a * GIR_FMA(ps, t, 1.128379166e+00f);
  const float c = a > 4.0f ? 4.0f : (a < 1.0f ? 1.0f : a);  /* NaN passes */
  const float s = GIR_FMA(1.0f / c, 2.6666666666666667f, -1.6666666666666667f);
  float q = -2.779389269e-06f;
  q = GIR_FMA(q, s, -1.949032211e-05f);
  q = GIR_FMA(q, s, 1.242098306e-04f);
  q = GIR_FMA(q, s, -3.545566505e-04f);
  q = GIR_FMA(q, s, 4.599361996e-04f);
  q = GIR_FMA(q, s, 2.309810544e-03f);
  q = GIR_FMA(q, s, -2.424283487e-02f);
  q = GIR_FMA(q, s, 1.433562803e-01f);
  q = GIR_FMA(q, s, 3.059529887e-01f);
  const float big = 1.0f - gir_expf(-c * c) * q;
  const float y = a <= 1.0f ? small : big;
  return copysignf(y, x);
}
static inline float gir_tanhf(float x) {
  /* tanh, branch-free so gcc vectorises it (libm's tanhf is a call per element: gir calibrate
     measured it at ~840 unit-instructions an element here): |x| < 0.625 as x + x^3 P(x^2),
     Cephes' tanhf polynomial; above, 1 - 2 / (exp(2|x|) + 1), which is 1 once exp overflows.
     Same 0 (with its sign), +-inf and NaN as libm. */
  const float a = fabsf(x), t = a * a;
  float p = -5.70498872745e-3f;
  p = GIR_FMA(p, t, 2.06390887954e-2f);
  p = GIR_FMA(p, t, -5.37397155531e-2f);
  p = GIR_FMA(p, t, 1.33314422036e-1f);
  p = GIR_FMA(p, t, -3.33332819422e-1f);
  const float small = GIR_FMA(p * t, a, a);
  const float big = 1.0f - 2.0f / (gir_expf(2.0f * a) + 1.0f);
  return copysignf(a < 0.625f ? small : big, x);
}
int gir_gather_oob = 0;  /* set when a Gather index was out of range; the engine reads and clears it */
#endif
"""


class CpuEmitter(TransposeTiles, AcrossUnits, LoopedLanes, CStyle):
    kernel_prefix = "void"
    gather_flag_type = None  # the library's gir_gather_oob global instead (one process, one flag)
    simd_pragma = "#pragma omp simd"
    scalar_barrier = '__asm__ __volatile__("" ::: "memory");'  # an empty asm gcc cannot vectorise across
    restrict = "restrict"
    types = {"float32": "float", "float16": "uint16_t", "bfloat16": "uint16_t", "float64": "double", "int64": "int64_t",
             "int32": "int32_t", "int8": "int8_t", "uint8": "uint8_t", "bool": "bool"}

    def prelude(self) -> str:
        return CPU_PRELUDE

    def math_fn(self, op: str, dt: str) -> str:
        own = {"exp": "gir_expf", "erf": "gir_erff", "tanh": "gir_tanhf"}  # vectorisable float32 versions in the prelude
        return own[op] if op in own and dt == "float32" else super().math_fn(op, dt)

    def gather_out_of_range(self) -> str:
        return "__atomic_store_n(&gir_gather_oob, 1, __ATOMIC_RELAXED);"

    def launch_bounds(self, k: Kernel) -> str:
        """The channel-lane form's attribute (GIR_ONE_VECTOR in the prelude): its SIMD loop is
        one vector, so gcc's loop-invariant motion and partial redundancy elimination moving
        its uniform loads (a window's weights) out of it only lengthened their lives (49
        broadcasts live at once, spilled). RedNet-50's 7x7 involutions 1.11-1.30x faster with
        their products fused (ad-hoc harness of the emitted C, two threads;
        scripts/loop_forms_ab.py --baseline hoisting for the zoo)."""
        return "GIR_ONE_VECTOR " if self.staging else ""

    def half_to_float(self, x: str) -> str:
        return f"gir_h2f({x})"

    def float_to_half(self, x: str) -> str:
        return f"gir_f2h({x})"

    def bf16_to_float(self, x: str) -> str:
        return f"gir_b2f({x})"

    def float_to_bf16(self, x: str) -> str:
        return f"gir_f2b({x})"

    def kernel_frame(self, k: Kernel):
        head, _ = super().kernel_frame(k)
        return [*head, self.team_pragma(k), f"  for (int u = 0; u < {k.prim.num_units}; ++u) {{"], ["  }", "}"]

    woken: frozenset = frozenset()  # names of small kernels that fork to keep the team awake (awake.py)

    def forks_team(self, k: Kernel) -> bool:
        """False for a kernel that moves too little to pay for forking a team (gir/ir/one_thread.py)."""
        return k.name in self.woken or not runs_on_one_thread(k.params, self.target)

    def team_pragma(self, k: Kernel) -> str:
        """The OpenMP team over the outer loop, or none (`forks_team`)."""
        if not self.forks_team(k):
            return "  /* one thread: under the bytes a fork and join of the team costs (gir/ir/one_thread.py) */"
        if not runs_on_one_thread(k.params, self.target):
            return "  #pragma omp parallel for schedule(static)"
        return ("  /* small, but forks: the team stays awake for the next big kernel (gir/backends/cpu/awake.py) */\n"
                "  #pragma omp parallel for schedule(static)")

    def prologue(self, k: Kernel) -> list[str]:
        if k.prim.units_per_block != 1:
            raise EmitError(f"{k.name}: the CPU runs one unit per block, not {k.prim.units_per_block}")
        if self.across:
            return self.across_prologue(k)
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
