"""One thread's (and the pool's) DRAM rate on GIR's own GEMV kernel, a row at a time against
rows side by side (gir/fusion/spread.py, the emitter's interleaved loop), and the same loop
without its SIMD mark and with its rows written out one loop a line.

    PYTHONPATH=. python3 scripts/gemv_streams.py [--k 768] [--n 3072] [--matrices N] [--repeats 5]
        [--out results/gemv_streams]

The kernel is GPT-2 decode's c_fc GEMV (x[1, K] @ W[K, N], one output per unit) as the planner
builds it with no stream gain, and `spread_units` of it with 2, 4 and 8 rows a unit (rows an n/rows
apart), and with 4 and 8 adjacent rows (the form where rows do not divide n). Each form
is compiled as the CPU engine compiles kernels and run over `--matrices` separate weight
matrices in turn (by default twice the bytes the last-level cache holds, as a decode step
streams its layers: over 113 MB on a VM reporting a 480 MB L3 the gains measured 1.5x, from
DRAM 1.1-1.2x), best of `--repeats`, with one thread and with the pool's default. Every form's output
is checked bit-identical to the one-row form. Prints a table; --out writes OUT.md and OUT.json.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import sys
import time
from math import ceil
from pathlib import Path

import numpy as np

from gir.backends.cpu.calibration import one_row_gemv_target
from gir.backends.cpu.compiler import build
from gir.backends.cpu.emitter import CpuEmitter
from gir.backends.kernels import split_kernels
from gir.fusion.spread import gemv_forms, spread_units
from gir.ir import get_target
from gir.backends.cpu.target import last_level_cache_bytes

THREADS = r"""
#include <omp.h>
void gemv_threads(int n) { omp_set_num_threads(n); }
int gemv_max_threads(void) { return omp_get_max_threads(); }
"""


def forms(k: int, n: int) -> dict[str, tuple]:
    flat, graphs_by_rows = gemv_forms(one_row_gemv_target(), k, n, (2, 4, 8))
    graphs = {("1 row a unit" if rows == 1 else f"{rows} rows side by side"): g for rows, g in graphs_by_rows.items()}
    for rows in (4, 8):  # the form a grid that rows do not divide takes (GPT-2's lm_head)
        g = spread_units(graphs_by_rows[1], rows, adjacent=True)
        if g is not None:
            graphs[f"{rows} adjacent rows side by side"] = g
    out = {}
    for label, g in graphs.items():
        (kernel,) = split_kernels(g)
        source = CpuEmitter(flat).kernel_source(kernel)
        out[label] = (kernel, source)
        if label != "1 row a unit" and "adjacent" not in label:
            out[label + " (no SIMD mark)"] = (kernel, source.replace("      #pragma omp simd\n      for (int j = 0;", "      for (int j = 0;"))
            out[label + " (unrolled in the source)"] = (kernel, _unrolled(source, rows_of(label)))
    return out


def rows_of(label: str) -> int:
    return int(label.split()[0])


def _unrolled(source: str, rows: int) -> str:
    """The interleaved loop with its `for k` written out, row k's loop per line (the form the
    emitter had first)."""
    loop = re.compile(rf"( *)for \(int k = 0; k < {rows}; \+\+k\) \{{\n *#pragma omp simd\n *(for \(int j[^\n]*)\n *\}}\n")
    m = loop.search(source)
    row = re.compile(r"\bk\b")
    lines = "".join(m.group(1) + row.sub(str(k), m.group(2)) + "\n" for k in range(rows))
    return source[:m.start()] + lines + source[m.end():]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=768)
    ap.add_argument("--n", type=int, default=3072)
    ap.add_argument("--matrices", type=int, default=0,
                    help="weight matrices run in turn (default: twice the last-level cache's bytes)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    if not args.matrices:  # from DRAM: with 113 MB in a VM reporting a 480 MB L3, the gains doubled
        args.matrices = max(12, ceil(2 * last_level_cache_bytes() / (4 * args.k * args.n)))
    made = forms(args.k, args.n)
    emitter = CpuEmitter(get_target("cpu"))
    names = {label: f"gemv_{i}" for i, label in enumerate(made)}
    lib = build("\n".join([emitter.prelude(), THREADS] + [src.replace(kernel.name, names[label])
                                                          for label, (kernel, src) in made.items()]), "gemv_streams")
    lib.gemv_threads.argtypes = [ctypes.c_int]
    pool = lib.gemv_max_threads()
    rng = np.random.default_rng(0)
    first_kernel = next(iter(made.values()))[0]
    weights = [b for b in first_kernel.params if b.size == args.k * args.n]
    assert len(weights) == 1, "the GEMV kernel reads one weight matrix"
    mats = [rng.standard_normal(args.k * args.n).astype(np.float32) for _ in range(args.matrices)]
    x = rng.standard_normal(args.k).astype(np.float32)
    nbytes = args.matrices * mats[0].nbytes
    rows, reference = [], None
    for threads in (1, pool):
        lib.gemv_threads(threads)
        for label, (kernel, _) in made.items():
            fn = getattr(lib, names[label])
            fn.argtypes, fn.restype = [ctypes.c_void_p] * len(kernel.params), None
            y = np.zeros(args.n, np.float32)
            arg_sets = [[(m if b.size == args.k * args.n else x if b.size == args.k else y).ctypes.data
                         for b in kernel.params] for m in mats]
            best = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                for a in arg_sets:
                    fn(*a)
                best = min(best, time.perf_counter() - start)
            if reference is None:
                reference = y.copy()
            exact = bool(np.array_equal(y, reference))
            rows.append({"form": label, "threads": threads, "gbps": nbytes / best / 1e9, "bit_identical": exact})
    lib.gemv_threads(pool)
    base = {r["threads"]: r["gbps"] for r in rows if r["form"] == "1 row a unit"}
    lines = ["| form | threads | GB/s | over 1 row a unit | bit-identical |", "|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['form']} | {r['threads']} | {r['gbps']:.1f} | {r['gbps'] / base[r['threads']]:.2f}x | {r['bit_identical']} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        command = "PYTHONPATH=. python3 scripts/gemv_streams.py " + " ".join(sys.argv[1:])
        head = (f"# GEMV rows side by side on the CPU\n\n`{command}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                f"{os.cpu_count()} cores; x[1, {args.k}] @ W[{args.k}, {args.n}] over {args.matrices} weight matrices "
                f"({nbytes / 1e6:.0f} MB), best of {args.repeats}. See the script's docstring.\n\n")
        Path(args.out + ".md").write_text(head + table + "\n")
        Path(args.out + ".json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
