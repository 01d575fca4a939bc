"""Split a flat element loop into rows where its indices divide the element number: the
looped-lanes form (gir/backends/cstyle.py) writes element k of a multi-dimensional slice as
`(k / D)` and `(k % n)` (`LoopedLanes.unravel`), which a C compiler turns into a gather per
vector: a row statistic broadcast over its row (`r_max[(k / 128)]`), a LayerNorm's gamma
repeated over rows (`gamma[(k % 768)]`). Written as a loop over rows around a SIMD loop over
one row, the statistic is a scalar of the outer loop and gamma a contiguous vector load.

Measured on a 2-core Cascade Lake guest (AVX-512), BERT's softmax max+exp kernel with 32 rows a
unit: 290-450 us flat, 124 us split (gcc 12, -O3 -march=native, 512-bit vectors).

With k = k_o*D + k_i (0 <= k_i < D): k / (m*D) = k_o / m and k % (m*D) = (k_o % m)*D + k_i, so
every rewritten index is exact; an index with another divisor keeps `k`, which the split loop
still defines. It works on the emitted lines in the form cstyle.py writes them (the SIMD pragma,
`for (int k = 0; k < N; ++k) {`, the body one indent deeper), found as loop_fusion.py finds
them (a loop whose indices are themselves accesses, a gather, is left alone).
"""
from __future__ import annotations

import re

from .loop_fusion import element_loop_at

MIN_ROW = 16  # shortest row worth a loop of its own: one 512-bit vector of floats

_DIV = re.compile(r"\(k / (\d+)\)")
_MOD = re.compile(r"\(k % (\d+)\)")


def split_row_loops(lines: list[str], pragma: str) -> list[str]:
    """`lines` with every SIMD element loop whose body indexes by `(k / D)` or `(k % D)`
    (D >= MIN_ROW, dividing the loop's count) written as rows of the smallest such D."""
    out, i = [], 0
    while i < len(lines):
        loop = element_loop_at(lines, i, pragma)
        if loop is None:
            out.append(lines[i])
            i += 1
            continue
        out += _split(loop.indent, loop.count, loop.body, pragma) or lines[i:loop.end + 1]
        i = loop.end + 1
    return out


def row_length(count: int, body: list[str]) -> int | None:
    """The row the loop splits into: the least divisor or modulus of k in the body that is at
    least MIN_ROW and divides the count; None where there is none (or the body loops itself)."""
    if any(re.search(r"\bfor \(", ln) for ln in body):
        return None
    text = "\n".join(body)
    found = {int(d) for d in _DIV.findall(text)} | {int(n) for n in _MOD.findall(text)}
    rows = [d for d in found if d >= MIN_ROW and count % d == 0 and d < count]
    return min(rows) if rows else None


def _split(indent: str, count: int, body: list[str], pragma: str) -> list[str] | None:
    row = row_length(count, body)
    if row is None:
        return None

    def div(m):
        q = int(m.group(1))
        return m.group(0) if q % row else "(k_o)" if q == row else f"(k_o / {q // row})"

    def mod(m):
        n = int(m.group(1))
        return m.group(0) if n % row else "(k_i)" if n == row else f"((k_o % {n // row})*{row} + k_i)"

    inner = [_MOD.sub(mod, _DIV.sub(div, ln)) for ln in body]
    return [f"{indent}for (int k_o = 0; k_o < {count // row}; ++k_o) {{",
            f"{indent}  {pragma}",
            f"{indent}  for (int k_i = 0; k_i < {row}; ++k_i) {{",
            f"{indent}    const int k = k_o*{row} + k_i;",
            *["  " + ln for ln in inner],
            f"{indent}  }}",
            f"{indent}}}"]
