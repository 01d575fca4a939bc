"""The CPU prelude's math against what it replaced, timed on this machine: gir_tanhf against
libm's tanhf (1M floats, and its largest error in ulps over 2.4M samples), and the
NaN-propagating GIR_MAX against its previous form in a scalar 9-tap max chain and in GIR's own
softmax row-max kernel (the `[max] unit(o1)` structure of BERT's softmax, 1,536 rows of 128,
cycled over 40 input copies so the input comes from DRAM). Prints a table; `--out` writes it.

    python scripts/cpu_math_probes.py [--out results/cpu_math_probes.md]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_model_rank as rank  # noqa: E402  (the softmax subgraph and its candidate space)

from gir.backends.cpu.compiler import build  # noqa: E402
from gir.backends.cpu.emitter import CpuEmitter  # noqa: E402
from gir.backends.kernels import split_kernels  # noqa: E402
from gir.frontend import load  # noqa: E402
from gir.ir import get_target  # noqa: E402

OLD_MAX = "(((a) > (b) || (a) != (a)) ? (a) : (b))"  # GIR_MAX, which every max chain used before session 15
CHAIN = """
void chain_{tag}(const float* restrict x, float* restrict y, long n) {{
  for (long u = 0; u < n / 9; ++u) {{ float acc = -GIR_INF_F; for (int g = 0; g < 9; ++g) acc = {mx}(acc, x[9 * u + g]); y[u] = acc; }}
}}
"""
TANH = """
void tanh_gir(const float* restrict x, float* restrict y, long n) {
  #pragma omp simd
  for (long i = 0; i < n; ++i) y[i] = gir_tanhf(x[i]);
}
void tanh_libm(const float* restrict x, float* restrict y, long n) { for (long i = 0; i < n; ++i) y[i] = tanhf(x[i]); }
"""


def _before_session_15(source: str) -> str:
    """The kernel as session 14 emitted it: GIR_MAX's old spelling everywhere, and no simd
    pragma on the steps of a max reduction's tree (`for (int j = 0; j < 8, 4, 2, 1; ...`)."""
    source = re.sub(r"#pragma omp simd\n(\s*)(for \(int j = 0; j < [8421]; \+\+j\) part)", r"\2", source)
    return source.replace("GIR_MAXS(", "OLD_MAX(").replace("GIR_MAX(", "OLD_MAX(")


def best_us(fn, inputs, out, calls=200, extra=()):
    """Median microseconds of a call, cycling through `inputs`."""
    times = []
    for i in range(calls):
        x = inputs[i % len(inputs)]
        start = time.perf_counter()
        fn(x.ctypes.data, out.ctypes.data, *extra)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    target = get_target("cpu")
    emitter = CpuEmitter(target)
    space = rank.Space(load(rank.subgraph_model("softmax", rank.SUBGRAPHS["softmax"][0])), target)
    option = next(o for o in space.options(0, 1) if space.describe(o) == "[max] unit(o1)")
    (kernel,) = split_kernels(space.graph_of(option))
    row_max = emitter.kernel_source(kernel)
    source = (emitter.prelude() + f"#define OLD_MAX(a, b) {OLD_MAX}\n" + TANH
              + CHAIN.format(tag="new", mx="GIR_MAXS") + CHAIN.format(tag="old", mx="OLD_MAX")
              + row_max.replace(kernel.name, "rowmax_new")
              + _before_session_15(row_max.replace(kernel.name, "rowmax_old")))
    lib = build(source, "cpu_math_probes")
    for name in ("tanh_gir", "tanh_libm", "chain_new", "chain_old"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    for name in ("rowmax_new", "rowmax_old"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p]

    rng = np.random.default_rng(0)
    n = 1 << 20
    x = [rng.normal(0, 3, n).astype(np.float32)]
    y = np.empty(n, np.float32)
    rows = [("tanh, 1M floats", best_us(lib.tanh_gir, x, y, 20, (n,)), best_us(lib.tanh_libm, x, y, 20, (n,)))]
    sample = np.concatenate([np.linspace(-20, 20, 2_000_001), np.geomspace(1e-30, 1, 200_000),
                             -np.geomspace(1e-30, 1, 200_000)]).astype(np.float32)
    got = np.empty_like(sample)
    lib.tanh_gir(sample.ctypes.data, got.ctypes.data, sample.size)
    exact = np.tanh(sample.astype(np.float64))
    nonzero = exact != 0
    ulps = np.abs(got[nonzero] - exact[nonzero]) / np.spacing(np.abs(exact[nonzero]).astype(np.float32)).astype(np.float64)
    taps = [rng.random(196_608).astype(np.float32)]
    rows.append(("9-tap max chain, 196,608 floats", best_us(lib.chain_new, taps, y, 200, (taps[0].size,)),
                 best_us(lib.chain_old, taps, y, 200, (taps[0].size,))))
    cold = [rng.random(kernel.params[0].size).astype(np.float32) for _ in range(40)]
    maxima = np.empty(kernel.params[1].size, np.float32)
    rows.append(("softmax row max kernel, input from DRAM", best_us(lib.rowmax_new, cold, maxima, 400),
                 best_us(lib.rowmax_old, cold, maxima, 400)))
    rows.append(("softmax row max kernel, input in cache", best_us(lib.rowmax_new, cold[:1], maxima, 400),
                 best_us(lib.rowmax_old, cold[:1], maxima, 400)))
    bytes_in = kernel.params[0].size * 4
    lines = [f"# CPU prelude math against what it replaced ({time.strftime('%Y-%m-%d %H:%M')}, "
             f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f})", "",
             "Command: `python scripts/cpu_math_probes.py`. Median microseconds of a call, one thread.", "",
             "| probe | now us | before us | before / now |", "|---|---|---|---|"]
    lines += [f"| {name} | {new:.1f} | {old:.1f} | {old / new:.1f}x |" for name, new, old in rows]
    lines += ["", f"gir_tanhf: largest error {ulps.max():.2f} ulp over {nonzero.sum():,} samples (libm tanhf is 'before').",
              f"Row max kernel from DRAM: {bytes_in / rows[2][1] / 1e3:.1f} GB/s now, {bytes_in / rows[2][2] / 1e3:.1f} "
              f"before ({bytes_in / 1e3:.0f} KB read per call)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
