"""The C prelude every dialect shares, written once: NaN-propagating GIR_MAX / GIR_MIN (numpy's
maximum and minimum), fp16 and bf16 storage converted in software (round to nearest even, NaN
kept quiet with its sign), the rounding macros GIR_RH / GIR_RB and gir_ipow.

Why generated: the dialects differ only in how their C spells a function qualifier, the
integer types and a float's bits, and four hand-kept copies of the same bit tricks drift.
A dialect supplies `gir_fbits(f)` / `gir_bitsf(u)` (a float's bits and back) before this text,
and its own includes, infinities and math names around it.
"""
from __future__ import annotations

from dataclasses import dataclass
from string import Template

# NaN-propagating, as numpy, in two spellings of the same function, because gcc compiles each
# well in one place only (gcc 12.2 -O3 -march=native, AVX-512; `scripts/cpu_math_probes.py`):
# GIR_MAX/GIR_MIN, for element loops and SIMD partials, vectorise to compare-and-blend; in a
# scalar chain (acc = max(acc, x) one element after another) they compile to a branch per
# element. GIR_MAXS/GIR_MINS (a NaN operand gives their sum) compile to selects there: a 9-tap
# max chain over 196,608 floats 408 -> 57 us. Vectorised, the S form is slower (BERT's
# softmax row max 25 -> 52 us with its input in cache), so each is used where it is fast.
MIN_MAX = """#define GIR_MAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define GIR_MIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define GIR_MAXS(a, b) (((a) != (a) || (b) != (b)) ? (a) + (b) : ((a) > (b) ? (a) : (b)))
#define GIR_MINS(a, b) (((a) != (a) || (b) != (b)) ? (a) + (b) : ((a) < (b) ? (a) : (b)))
"""

FP16 = Template("""#define GIR_RH(x) gir_h2f(gir_f2h(x))  /* round a float to fp16 precision */
$fn float gir_h2f($u16 h) {  /* fp16 storage -> float, exact */
  $u32 o = (($u32)h & 0x7fffu) << 13, e = o & (0x7c00u << 13);
  o += ($u32)(127 - 15) << 23;
  if (e == 0x7c00u << 13) o += ($u32)(128 - 16) << 23;
  else if (e == 0) o = gir_fbits(gir_bitsf(o + (1u << 23)) - gir_bitsf(113u << 23));
  return gir_bitsf(o | (($u32)h & 0x8000u) << 16);
}
$fn $u16 gir_f2h(float f) {  /* float -> fp16, round to nearest even */
  $u32 u = gir_fbits(f), sign = u & 0x80000000u, o;
  u ^= sign;
  if (u >= 0x47800000u) o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  else if (u < 0x38800000u) o = gir_fbits(gir_bitsf(u) + gir_bitsf(126u << 23)) - (126u << 23);
  else o = (u + (($u32)(15 - 127) << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
  return ($u16)(o | (sign >> 16));
}
""")

BF16_IPOW = Template("""$fn float gir_b2f($u16 h) { return gir_bitsf(($u32)h << 16); }  /* bf16 storage -> float */
$fn $u16 gir_f2b(float f) {  /* float -> bf16, round to nearest even, NaN kept quiet */
  const $u32 u = gir_fbits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return ($u16)((u >> 16) | 0x40u);
  return ($u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#define GIR_RB(x) gir_b2f(gir_f2b(x))  /* round a float to bf16 precision */
$fn $i64 gir_ipow($i64 a, $i64 e) {
  $i64 r = 1;
  for (; e > 0; --e) r *= a;
  return r;
}
""")


@dataclass(frozen=True)
class CSpelling:
    """How one dialect's C spells what the shared prelude needs."""
    fn: str                     # function qualifier: "static inline", "inline", "__device__ inline"
    u16: str                    # 16-bit unsigned: fp16 and bf16 storage
    u32: str
    i64: str
    software_fp16: bool = True  # False: the dialect's own GIR_RH (hardware fp16 conversions)


def shared_prelude(c: CSpelling) -> str:
    names = {"fn": c.fn, "u16": c.u16, "u32": c.u32, "i64": c.i64}
    return MIN_MAX + (FP16.substitute(names) if c.software_fp16 else "") + BF16_IPOW.substitute(names)


GPU_SPELLING = CSpelling("__device__ inline", "unsigned short", "unsigned", "long long", software_fp16=False)

GPU_PRELUDE = """#ifndef GIR_PRELUDE
#define GIR_PRELUDE
#define GIR_INF_F __int_as_float(0x7f800000)
#define GIR_NAN_F __int_as_float(0x7fc00000)
#define GIR_INF_D __longlong_as_double(0x7ff0000000000000LL)
#define GIR_NAN_D __longlong_as_double(0x7ff8000000000000LL)
#define gir_fbits(f) __float_as_uint(f)
#define gir_bitsf(u) __uint_as_float(u)
#define GIR_RH(x) __half2float(__float2half(x))  /* round a float to fp16 precision */
""" + shared_prelude(GPU_SPELLING) + "#endif\n"
